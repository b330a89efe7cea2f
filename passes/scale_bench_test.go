package passes

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/mokopt/mokopt/models"
)

// scaleLayers reads MOKOPT_BENCH_LAYERS (default 4).
func scaleLayers() int {
	if n, err := strconv.Atoi(os.Getenv("MOKOPT_BENCH_LAYERS")); err == nil && n > 0 {
		return n
	}
	return 4
}

// BenchmarkDetectUnrolled detects the blocks of a generated unrolled model
// (256 experts per layer, external weights that are never read) and reports
// nodes per second; MOKOPT_BENCH_LAYERS sets the number of layers.
func BenchmarkDetectUnrolled(b *testing.B) {
	cfg := models.Config{Shape: models.ShapeUnrolled, Layers: scaleLayers(), Experts: 256, TopK: 8, Hidden: 16, Inter: 16, Normalize: true, External: true}
	m, err := models.Build(cfg)
	if err != nil {
		b.Fatal(err)
	}
	nodes := len(m.Proto.Graph.Node)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		det, err := Detect(m)
		if err != nil {
			b.Fatal(err)
		}
		if len(det.Blocks) != cfg.Layers {
			b.Fatal(fmt.Sprintf("%d blocks, want %d", len(det.Blocks), cfg.Layers))
		}
	}
	b.ReportMetric(float64(nodes), "nodes/op")
	b.ReportMetric(float64(nodes)*float64(b.N)/b.Elapsed().Seconds(), "nodes/s")
}
