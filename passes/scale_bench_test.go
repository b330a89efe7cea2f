package passes

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/mokopt/mokopt/graph"
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

// BenchmarkRewriteUnrolled rewrites a generated unrolled model (no numerical
// check) and reports nodes per second; MOKOPT_BENCH_LAYERS sets the number
// of layers. The model is rebuilt, untimed, for every iteration.
func BenchmarkRewriteUnrolled(b *testing.B) {
	cfg := models.Config{Shape: models.ShapeUnrolled, Layers: scaleLayers(), Experts: 256, TopK: 8, Hidden: 16, Inter: 16, Normalize: true, External: true}
	var nodes int
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		m, err := models.Build(cfg)
		if err != nil {
			b.Fatal(err)
		}
		nodes = len(m.Proto.Graph.Node)
		b.StartTimer()
		rep, err := Rewrite(m, Options{})
		if err != nil {
			b.Fatal(err)
		}
		if len(rep.Fused) != cfg.Layers {
			b.Fatalf("%d blocks fused, want %d", len(rep.Fused), cfg.Layers)
		}
	}
	b.ReportMetric(float64(nodes), "nodes/op")
	b.ReportMetric(float64(nodes)*float64(b.N)/b.Elapsed().Seconds(), "nodes/s")
}

// BenchmarkRewriteFile loads, rewrites (no numerical check) and saves the
// model named by MOKOPT_BENCH_MODEL into a temporary folder; skipped when
// the variable is unset. It is the profiling entry point for big models:
// go test ./passes -run XXX -bench RewriteFile -benchtime 1x -cpuprofile cpu.prof
func BenchmarkRewriteFile(b *testing.B) {
	path := os.Getenv("MOKOPT_BENCH_MODEL")
	if path == "" {
		b.Skip("MOKOPT_BENCH_MODEL not set")
	}
	out := filepath.Join(b.TempDir(), "out.onnx")
	for i := 0; i < b.N; i++ {
		m, err := graph.Load(path)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Rewrite(m, Options{}); err != nil {
			b.Fatal(err)
		}
		if err := m.Save(out, graph.SaveOptions{}); err != nil {
			b.Fatal(err)
		}
		m.Close()
	}
}
