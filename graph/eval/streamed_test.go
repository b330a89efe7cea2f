package eval

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// TestStreamedGatherMatMul: a stacked weight in a side file, gathered by
// expert ids and multiplied (the batched-experts pattern), is read slab by
// slab, each distinct expert once, and gives exactly the products of the
// same weight held in memory (fed as an input, so never streamed); a
// consumer other than MatMul gets the gathered copy, read slab by slab, also exactly.
// Float32, float16 and bfloat16 weights.
func TestStreamedGatherMatMul(t *testing.T) {
	const E, M, K, n = 8, 128, 512, 12
	ids := []int64{1, 3, 3, 1, 5, 1, 3, 5, 5, 1, 3, 1} // experts 1, 3, 5
	x := make([]float32, n*K)
	for i := range x {
		x[i] = float32(math.Sin(float64(i) * 0.37))
	}
	w := make([]float32, E*M*K)
	for i := range w {
		w[i] = float32(math.Cos(float64(i)*0.011)) * 0.5
	}
	for _, dt := range []pb.TensorProto_DataType{pb.TensorProto_FLOAT, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16} {
		for _, consumer := range []string{"", "Identity"} {
			t.Run(dt.String()+"/"+consumer, func(t *testing.T) {
				wt := NewFloatAs(dt, []int{E, M, K}, slices.Clone(w))
				wt.normalize()
				m := gatheredMatMul("GatherND", consumer)
				g := m.Proto.Graph
				g.Input = []*pb.ValueInfoProto{valueInfo("w", wt), valueInfo("ids", i64([]int{n, 1})), valueInfo("x", f32([]int{n, K, 1}))}
				feeds := map[string]*Tensor{"w": wt, "ids": NewInt64([]int{n, 1}, ids), "x": NewFloat32([]int{n, K, 1}, x)}
				if consumer != "" {
					g.Input = g.Input[:2]
					delete(feeds, "x")
				}
				want, err := Run(context.Background(), m, feeds, Options{})
				if err != nil {
					t.Fatal(err)
				}
				// the same model with w an initializer in a side file
				init, err := ToProto(wt, "w")
				if err != nil {
					t.Fatal(err)
				}
				g.Initializer = []*pb.TensorProto{init}
				g.Input = g.Input[1:]
				delete(feeds, "w")
				path := filepath.Join(t.TempDir(), "m.onnx")
				if err := m.Save(path, graph.SaveOptions{External: graph.ExternalRepack}); err != nil {
					t.Fatal(err)
				}
				ms, err := graph.Load(path)
				if err != nil {
					t.Fatal(err)
				}
				defer ms.Close()
				if !graph.IsExternal(ms.Proto.Graph.Initializer[0]) {
					t.Fatal("the weight was not saved in a side file")
				}
				got, err := Run(context.Background(), ms, feeds, Options{})
				if err != nil {
					t.Fatal(err)
				}
				a, b := got["y"], want["y"]
				if !slices.Equal(a.Shape, b.Shape) || len(a.F32) != len(b.F32) {
					t.Fatalf("streamed run gives %v, in-memory %v", a.Shape, b.Shape)
				}
				for i := range a.F32 {
					if math.Float32bits(a.F32[i]) != math.Float32bits(b.F32[i]) {
						t.Fatalf("element %d: streamed %g, in memory %g", i, a.F32[i], b.F32[i])
					}
				}
				width := int64(4)
				if dt != pb.TensorProto_FLOAT {
					width = 2
				}
				read, slab := ms.ExternalBytesRead(), int64(M*K)*width
				switch {
				case consumer == "" && read != 3*slab:
					t.Fatalf("read %d bytes of external data, want the 3 distinct experts' slabs once each (%d)", read, 3*slab)
				case consumer != "" && read != int64(n)*slab:
					t.Fatalf("read %d bytes of external data, want each gathered slab of the copy (%d)", read, int64(n)*slab)
				}
			})
		}
	}
}

// TestStreamedWeightLoadedForOtherReaders: a weight in a side file that a
// kernel without streaming support reads (here Transpose, and MatMul
// directly) is loaded whole, once, and computes as in memory.
func TestStreamedWeightLoadedForOtherReaders(t *testing.T) {
	const E, M, K = 4, 128, 512
	w := make([]float32, E*M*K)
	for i := range w {
		w[i] = float32(i%97) * 0.01
	}
	wt := NewFloat32([]int{E, M, K}, w)
	init, err := ToProto(wt, "w")
	if err != nil {
		t.Fatal(err)
	}
	nodes := []*pb.NodeProto{
		graph.NewNode("Gather", "", "g", []string{"w", "ids"}, []string{"wg"}),
		graph.NewNode("Transpose", "", "t", []string{"w"}, []string{"wt"}),
		graph.NewNode("ReduceSum", "", "r", []string{"wt"}, []string{"s"}),
		graph.NewNode("ReduceSum", "", "r2", []string{"wg"}, []string{"s2"}),
	}
	m := modelOf(18, nodes, nil, nil, []string{"s", "s2"})
	m.Proto.Graph.Initializer = []*pb.TensorProto{init}
	m.Proto.Graph.Input = []*pb.ValueInfoProto{valueInfo("ids", i64([]int{2}))}
	path := filepath.Join(t.TempDir(), "m.onnx")
	if err := m.Save(path, graph.SaveOptions{External: graph.ExternalRepack}); err != nil {
		t.Fatal(err)
	}
	ms, err := graph.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	res, err := Run(context.Background(), ms, map[string]*Tensor{"ids": NewInt64([]int{2}, []int64{0, 2})}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var total, picked float64
	for i, v := range w {
		total += float64(v)
		if e := i / (M * K); e == 0 || e == 2 {
			picked += float64(v)
		}
	}
	if d := math.Abs(res["s"].Float64At(0) - total); d > 1e-3*total {
		t.Fatalf("sum of the transposed weight %g, want %g", res["s"].Float64At(0), total)
	}
	if d := math.Abs(res["s2"].Float64At(0) - picked); d > 1e-3*picked {
		t.Fatalf("sum of the gathered experts %g, want %g", res["s2"].Float64At(0), picked)
	}
}
