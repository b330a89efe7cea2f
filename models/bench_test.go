package models

import (
	"io"
	"testing"
	"time"
)

// BenchmarkBuildUnrolled builds an unrolled graph (external weights, so no
// weight bytes are generated) and reports nodes per second.
func BenchmarkBuildUnrolled(b *testing.B) {
	cfg := Config{Shape: ShapeUnrolled, Layers: 8, Experts: 256, TopK: 8, Hidden: 256, Inter: 256, Normalize: true, External: true}
	var nodes int
	for i := 0; i < b.N; i++ {
		m, err := Build(cfg)
		if err != nil {
			b.Fatal(err)
		}
		nodes = len(m.Proto.Graph.Node)
	}
	b.ReportMetric(float64(nodes), "nodes/op")
	b.ReportMetric(float64(nodes)*float64(b.N)/b.Elapsed().Seconds(), "nodes/s")
}

// BenchmarkStreamWeights measures how fast a deferred tensor's bytes are
// generated and streamed (a 16 MiB fused gate_up stack).
func BenchmarkStreamWeights(b *testing.B) {
	src := gateUp(streamKey(0, 0, roleGate), streamKey(0, 0, roleUp), 8, 256, 1024, false)
	b.SetBytes(4 * src.numel())
	for i := 0; i < b.N; i++ {
		if err := src.writeTo(io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}

// TestBuildLargeUnrolled builds a DeepSeek-V3-sized unrolled graph (58
// layers x 256 experts, ~330k nodes) without its weights and checks the
// node count; it is skipped with -short.
func TestBuildLargeUnrolled(t *testing.T) {
	if testing.Short() {
		t.Skip("large build")
	}
	cfg := Config{Shape: ShapeUnrolled, Layers: 58, Experts: 256, TopK: 8, Hidden: 256, Inter: 256, Normalize: true, External: true}
	start := time.Now()
	m, err := Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// per layer: router (view, Gemm, Softmax, TopK, ReduceSum, Div), mask and
	// input prep (Unsqueeze, Equal, Cast, Transpose, Unsqueeze, Transpose,
	// Unsqueeze, Shape, ConstantOfShape), 22 per expert, the residual Add
	want := cfg.Layers * (6 + 9 + 22*cfg.Experts + 1)
	if n := len(m.Proto.Graph.Node); n != want {
		t.Errorf("%d nodes, want %d", n, want)
	}
	if n := len(m.Proto.Graph.Initializer); n < 3*cfg.Experts*cfg.Layers {
		t.Errorf("%d initializers, want at least %d", n, 3*cfg.Experts*cfg.Layers)
	}
	t.Logf("%d nodes, %d initializers built in %v", len(m.Proto.Graph.Node), len(m.Proto.Graph.Initializer), time.Since(start))
}
