package graph

import (
	"os"
	"path/filepath"
	"testing"
)

// benchModel loads the model named by MOKOPT_BENCH_MODEL, skipping the
// benchmark when the variable is unset, and returns it with its bytes.
func benchModel(b *testing.B) (*Model, []byte) {
	b.Helper()
	path := os.Getenv("MOKOPT_BENCH_MODEL")
	if path == "" {
		b.Skip("MOKOPT_BENCH_MODEL not set")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	m, err := Parse(raw, path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m, raw
}

// BenchmarkParse decodes the MOKOPT_BENCH_MODEL model's bytes.
func BenchmarkParse(b *testing.B) {
	_, raw := benchModel(b)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(raw, "bench.onnx"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReindex indexes the MOKOPT_BENCH_MODEL model's main graph.
func BenchmarkReindex(b *testing.B) {
	m, _ := benchModel(b)
	b.ReportAllocs()
	for b.Loop() {
		NewGraph(m.Proto.Graph)
	}
	b.ReportMetric(float64(len(m.Proto.Graph.Node)), "nodes/op")
}

// BenchmarkCheck vets the MOKOPT_BENCH_MODEL model as the command line does
// after loading it (Check, then the Graph call that takes its index).
func BenchmarkCheck(b *testing.B) {
	m, _ := benchModel(b)
	b.ReportAllocs()
	for b.Loop() {
		if err := m.Check(); err != nil {
			b.Fatal(err)
		}
		m.Graph()
	}
}

// BenchmarkSave saves the MOKOPT_BENCH_MODEL model unchanged (external
// data kept) into a temporary folder.
func BenchmarkSave(b *testing.B) {
	m, _ := benchModel(b)
	out := filepath.Join(b.TempDir(), "out.onnx")
	b.ReportAllocs()
	for b.Loop() {
		if err := m.Save(out, SaveOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}
