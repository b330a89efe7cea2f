package passes

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

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
			b.Fatalf("%d blocks, want %d", len(det.Blocks), cfg.Layers)
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

// BenchmarkRewriteVsLoadSave writes a generated unrolled model with external
// weights (MOKOPT_BENCH_LAYERS layers of 256 experts, H = I = 16, so that
// the structure dominates), then times, alternately in the same run, what
// `mokopt rewrite --no-check` does (load, check, rewrite, save) and a plain
// load, check and save of the same file, and reports their ratio (the
// bench/scale.sh target: at most 1.5).
func BenchmarkRewriteVsLoadSave(b *testing.B) {
	cfg := models.Config{Shape: models.ShapeUnrolled, Layers: scaleLayers(), Experts: 256, TopK: 8, Hidden: 16, Inter: 16, Normalize: true, External: true}
	dir := b.TempDir()
	in := filepath.Join(dir, "in.onnx")
	if err := models.Write(cfg, in); err != nil {
		b.Fatal(err)
	}
	run := func(rewrite bool) time.Duration {
		start := time.Now()
		m, err := graph.Load(in)
		if err != nil {
			b.Fatal(err)
		}
		defer m.Close()
		if err := m.Check(); err != nil {
			b.Fatal(err)
		}
		if rewrite {
			if _, err := Rewrite(m, Options{}); err != nil {
				b.Fatal(err)
			}
		}
		if err := m.Save(filepath.Join(dir, "out.onnx"), graph.SaveOptions{External: graph.ExternalKeep}); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var rw, ls time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ls += run(false)
		rw += run(true)
	}
	b.ReportMetric(rw.Seconds()/float64(b.N), "rewrite-s/op")
	b.ReportMetric(ls.Seconds()/float64(b.N), "loadsave-s/op")
	b.ReportMetric(rw.Seconds()/ls.Seconds(), "rewrite/loadsave")
}
