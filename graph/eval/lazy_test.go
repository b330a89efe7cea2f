package eval

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// gatheredMatMul builds the batched-experts pattern: stacked weights w [E,
// M, K] gathered per row by ids (GatherND or Gather), times x [n, K, 1];
// consumer, when set, is an op applied to the gathered weights instead
// (forcing them to be materialized).
func gatheredMatMul(op, consumer string) *graph.Model {
	var nodes []*pb.NodeProto
	switch op {
	case "GatherND":
		nodes = append(nodes, graph.NewNode("GatherND", "", "g", []string{"w", "ids"}, []string{"wg"}))
	default:
		nodes = append(nodes, graph.NewNode("Gather", "", "g", []string{"w", "ids"}, []string{"wg"}))
	}
	if consumer != "" {
		nodes = append(nodes, graph.NewNode(consumer, "", "c", []string{"wg"}, []string{"y"}))
	} else {
		nodes = append(nodes, graph.NewNode("MatMul", "", "mm", []string{"wg", "x"}, []string{"y"}))
	}
	return modelOf(18, nodes, nil, nil, []string{"y"})
}

// TestLazyGatherMatMul: a gather of whole expert matrices feeding MatMul is
// kept lazy (no copy of the gathered weights) and gives the products
// computed independently in float64, with repeated (expert, token) pairs
// computed once; a consumer other than MatMul sees the materialized copy,
// and a memory limit that the copy exceeds but the lazy form fits holds.
func TestLazyGatherMatMul(t *testing.T) {
	const E, M, K, n = 4, 24, 32, 40
	rng := rand.New(rand.NewPCG(1, 2))
	w := make([]float32, E*M*K)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	ids := make([]int64, n)
	x := make([]float32, n*K)
	for i := range ids {
		ids[i] = int64(i % 3) // repeated experts
		src := i % 5          // repeated tokens: 15 distinct pairs
		for k := 0; k < K; k++ {
			x[i*K+k] = float32(math.Sin(float64(src*K + k)))
		}
	}
	want := make([]float64, n*M)
	for i := 0; i < n; i++ {
		for r := 0; r < M; r++ {
			s := 0.0
			for k := 0; k < K; k++ {
				s += float64(w[(int(ids[i])*M+r)*K+k]) * float64(x[i*K+k])
			}
			want[i*M+r] = s
		}
	}
	for _, tc := range []struct {
		name     string
		op       string
		idsShape []int
		consumer string
		limit    int64
		wantErr  bool
	}{
		{"GatherND", "GatherND", []int{n, 1}, "", 0, false},
		{"Gather axis 0", "Gather", []int{n}, "", 0, false},
		// The gathered copy is n*M*K*4 = 122880 bytes; the source 12288.
		{"GatherND under a limit the copy exceeds", "GatherND", []int{n, 1}, "", 40000, false},
		{"materialized for Identity", "GatherND", []int{n, 1}, "Identity", 0, false},
		{"materialized copy over the limit", "GatherND", []int{n, 1}, "Identity", 40000, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := gatheredMatMul(tc.op, tc.consumer)
			g := m.Proto.Graph
			g.Input = []*pb.ValueInfoProto{valueInfo("w", f32([]int{E, M, K})), valueInfo("ids", i64(tc.idsShape)), valueInfo("x", f32([]int{n, K, 1}))}
			feeds := map[string]*Tensor{"w": NewFloat32([]int{E, M, K}, w), "ids": NewInt64(tc.idsShape, ids), "x": NewFloat32([]int{n, K, 1}, x)}
			if tc.consumer != "" {
				g.Input = g.Input[:2]
				delete(feeds, "x")
			}
			before := lazyGathers.Load()
			res, err := Run(context.Background(), m, feeds, Options{MemLimit: tc.limit})
			if tc.wantErr {
				if !errors.Is(err, ErrMemLimit) {
					t.Fatalf("want ErrMemLimit, got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if lazyGathers.Load() == before {
				t.Fatal("the gather was copied, not kept lazy")
			}
			y := res["y"]
			if y.lazy != nil || y.F32 == nil {
				t.Fatal("a lazy tensor left the run")
			}
			if tc.consumer != "" {
				for i := 0; i < n; i++ {
					e := int(ids[i])
					for j := 0; j < M*K; j++ {
						if y.F32[i*M*K+j] != w[e*M*K+j] {
							t.Fatalf("materialized gather differs at slab %d element %d", i, j)
						}
					}
				}
				return
			}
			if want := []int{n, M, 1}; len(y.Shape) != 3 || y.Shape[0] != n || y.Shape[1] != M || y.Shape[2] != 1 {
				t.Fatalf("shape %v, want %v", y.Shape, want)
			}
			for i, v := range want {
				if d := math.Abs(float64(y.F32[i]) - v); d > 1e-4*(1+math.Abs(v)) {
					t.Fatalf("element %d: %g, want %g", i, y.F32[i], v)
				}
			}
		})
	}
}

// TestMatMulDistinctRows: a product whose left operand repeats rows computes
// each distinct row once and equals the product computed row by row.
func TestMatMulDistinctRows(t *testing.T) {
	const rows, K, N = 64, 16, 24
	rng := rand.New(rand.NewPCG(3, 4))
	a := make([]float32, rows*K)
	for i := 0; i < rows; i++ {
		for k := 0; k < K; k++ {
			a[i*K+k] = float32(math.Cos(float64((i%7)*K + k))) // 7 distinct rows
		}
	}
	b := make([]float32, K*N)
	for i := range b {
		b[i] = float32(rng.NormFloat64())
	}
	for _, shape := range [][]int{{rows, K}, {4, rows / 4, K}} {
		out, err := matmul(nil, NewFloat32(shape, a), NewFloat32([]int{K, N}, b))
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Shape) != len(shape) || out.Shape[len(shape)-1] != N {
			t.Fatalf("shape %v for a %v", out.Shape, shape)
		}
		for i := 0; i < rows; i++ {
			one, err := matmul(nil, NewFloat32([]int{1, K}, a[i*K:(i+1)*K]), NewFloat32([]int{K, N}, b))
			if err != nil {
				t.Fatal(err)
			}
			for j := 0; j < N; j++ {
				if out.F32[i*N+j] != one.F32[j] {
					t.Fatalf("a %v: row %d col %d: %g, row alone gives %g", shape, i, j, out.F32[i*N+j], one.F32[j])
				}
			}
		}
	}
}

// TestBlockBroadcast: the index-free broadcasts give what the general
// path gives.
func TestBlockBroadcast(t *testing.T) {
	for _, c := range []struct{ in, out []int }{
		{[]int{4, 1}, []int{4, 3}}, {[]int{3}, []int{4, 3}}, {[]int{1, 3}, []int{4, 3}}, {[]int{2, 1, 1}, []int{2, 3, 4}},
		{[]int{3, 4}, []int{2, 3, 4}}, {[]int{2, 1, 4}, []int{2, 3, 4}}, {[]int{1}, []int{5}},
	} {
		a := make([]float32, numel(c.out))
		for i := range a {
			a[i] = float32(i)
		}
		b := make([]float32, numel(c.in))
		for i := range b {
			b[i] = float32(1000 * (i + 1))
		}
		got, _, err := broadcast2(a, c.out, b, c.in, func(x, y float32) float32 { return x + y })
		if err != nil {
			t.Fatal(err)
		}
		bi := bcastIndex(c.in, c.out)
		for i := range got {
			y := i
			if bi != nil {
				y = bi[i]
			}
			if got[i] != a[i]+b[y] {
				t.Fatalf("%v over %v: element %d is %g, want %g", c.in, c.out, i, got[i], a[i]+b[y])
			}
		}
		got2, _, _ := broadcast2(b, c.in, a, c.out, func(x, y float32) float32 { return x + y })
		for i := range got2 {
			if got2[i] != got[i] {
				t.Fatalf("%v over %v swapped: element %d differs", c.in, c.out, i)
			}
		}
	}
}

// TestUnaryDistinctRows: a transcendental op on a large tensor of repeated
// rows equals the op element by element.
func TestUnaryDistinctRows(t *testing.T) {
	const rows, H = 1 << 12, 64
	x := make([]float32, rows*H)
	for i := range x {
		x[i] = float32(math.Sin(float64((i/H)%5*H + i%H)))
	}
	res, err := runOp(t, 18, "Sigmoid", nil, 1, NewFloat32([]int{rows, H}, x))
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range x {
		if want := float32(1 / (1 + math.Exp(-float64(v)))); math.Abs(float64(res[0].F32[i]-want)) > 1e-7 {
			t.Fatalf("element %d: %g, want %g", i, res[0].F32[i], want)
		}
	}
}

// TestMatMulSharedLeftVectors: matrix-vector products whose batches share
// a left matrix (a broadcast [1, M, K], as gathered expert slabs chosen by
// several tokens are) are computed in one pass over its rows, bit for bit
// as each product alone, serially and over threads.
func TestMatMulSharedLeftVectors(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, tc := range []struct{ B, M, K int }{{5, 3, 7}, {9, 64, 33}, {4, 512, 300}} {
		a := make([]float32, tc.M*tc.K)
		for i := range a {
			a[i] = float32(rng.NormFloat64())
		}
		b := make([]float32, tc.B*tc.K)
		for i := range b {
			b[i] = float32(rng.NormFloat64())
		}
		got, err := matmul(nil, NewFloat32([]int{1, tc.M, tc.K}, a), NewFloat32([]int{tc.B, tc.K, 1}, b))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < tc.B; i++ {
			want := make([]float32, tc.M)
			gemvF32(a, b[i*tc.K:(i+1)*tc.K], want, tc.K)
			if !slices.Equal(got.F32[i*tc.M:(i+1)*tc.M], want) {
				t.Fatalf("%+v: batch %d differs from its own product", tc, i)
			}
		}
	}
}

// TestSlabClasses: slabs equal in every bit share a class, numbered in
// order of first appearance; -0 and 0 differ, equal NaN bits do not.
func TestSlabClasses(t *testing.T) {
	nan := float32(math.NaN())
	negZero := float32(math.Copysign(0, -1))
	buf := []float32{
		1, 2, 3,
		0, 0, 0,
		1, 2, 3,
		negZero, 0, 0,
		nan, 1, 1,
		nan, 1, 1,
		0, 0, 0,
	}
	cls, n := slabClasses(7, 3, func(i int) []float32 { return buf[3*i : 3*i+3] })
	if want := []int{0, 1, 0, 2, 3, 3, 1}; !slices.Equal(cls, want) || n != 4 {
		t.Fatalf("classes %v (%d), want %v (4)", cls, n, []int{0, 1, 0, 2, 3, 3, 1})
	}
}
