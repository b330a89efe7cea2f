package eval

import (
	"context"
	"fmt"
	"math/rand"
	"path/filepath"
	"testing"

	"github.com/mokopt/mokopt/graph"
)

func randF32(r *rand.Rand, shape ...int) *Tensor {
	t := New(1, shape)
	for i := range t.F32 {
		t.F32[i] = float32(r.NormFloat64())
	}
	return t
}

// BenchmarkMatMul measures the float32 MatMul kernel (all threads).
func BenchmarkMatMul(b *testing.B) {
	r := rand.New(rand.NewSource(1))
	for _, s := range [][3]int{{16, 64, 128}, {16, 64, 1024}, {256, 256, 256}, {512, 512, 512}} {
		M, K, N := s[0], s[1], s[2]
		x, y := randF32(r, M, K), randF32(r, K, N)
		b.Run(fmt.Sprintf("%dx%dx%d", M, K, N), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := matmul(nil, x, y); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(2*M*K*N)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOPS")
		})
	}
}

// BenchmarkFullFixtures times whole runs of the 2-layer decoder fixtures.
func BenchmarkFullFixtures(b *testing.B) {
	files, _ := filepath.Glob(filepath.Join(fixtureDir, "*_full_*.onnx"))
	if len(files) == 0 {
		b.Skip("no fixtures")
	}
	for _, f := range files {
		m, err := graph.Load(f)
		if err != nil {
			b.Fatal(err)
		}
		name := filepath.Base(f)
		ds, err := ReadDataSet(filepath.Join(fixtureDir, name[:len(name)-5]+"_data", "test_data_set_0"))
		if err != nil {
			b.Fatal(err)
		}
		feeds, _ := Feeds(m, ds.Inputs, nil)
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := Run(context.Background(), m, feeds, Options{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGemvMulti times gemvMultiF32 (rows in cache-sized blocks, every
// vector per block) against one gemvF32 pass over the matrix per vector, in
// the same run: a 512×512 expert matrix by 256 tokens, and the 256×64 one
// of a small block by 32.
func BenchmarkGemvMulti(b *testing.B) {
	r := rand.New(rand.NewSource(2))
	for _, s := range [][3]int{{512, 512, 256}, {256, 64, 32}} {
		rows, K, nv := s[0], s[1], s[2]
		a := randF32(r, rows, K).F32
		bs, cs := make([][]float32, nv), make([][]float32, nv)
		for v := range bs {
			bs[v], cs[v] = randF32(r, K).F32, make([]float32, rows)
		}
		b.Run(fmt.Sprintf("%dx%dx%d/blocked", rows, K, nv), func(b *testing.B) {
			for b.Loop() {
				gemvMultiF32(a, bs, cs, K)
			}
		})
		b.Run(fmt.Sprintf("%dx%dx%d/per-vector", rows, K, nv), func(b *testing.B) {
			for b.Loop() {
				for v := range bs {
					gemvF32(a, bs[v], cs[v], K)
				}
			}
		})
	}
}
