package chain

import (
	"context"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// block is y = x·W + x for a 2×2 W (a block whose output has its input's
// shape), with an intermediate value t.
func block(t *testing.T) *graph.Model {
	t.Helper()
	vi := func(name string) *pb.ValueInfoProto {
		return &pb.ValueInfoProto{Name: proto.String(name), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
			ElemType: proto.Int32(int32(pb.TensorProto_FLOAT)),
			Shape:    &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: 1}}, {Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: 2}}}},
		}}}}
	}
	w := eval.NewFloat32([]int{2, 2}, []float32{1, 2, 3, 4})
	wt, err := eval.ToProto(w, "w")
	if err != nil {
		t.Fatal(err)
	}
	mp := &pb.ModelProto{IrVersion: proto.Int64(8), OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(17)}},
		Graph: &pb.GraphProto{Name: proto.String("g"),
			Node: []*pb.NodeProto{
				graph.NewNode("MatMul", "", "mm", []string{"x", "w"}, []string{"t"}),
				graph.NewNode("Add", "", "add", []string{"t", "x"}, []string{"y"}),
			},
			Initializer: []*pb.TensorProto{wt},
			Input:       []*pb.ValueInfoProto{vi("x")},
			Output:      []*pb.ValueInfoProto{vi("y")},
		}}
	b, err := proto.Marshal(mp)
	if err != nil {
		t.Fatal(err)
	}
	m, err := graph.Parse(b, "block")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestCompose chains the block 1 and 3 times, with and without perturbed
// weights: the chain reads x and writes y, has n copies of each node and
// initializer under their copy's prefix, and computes the block n times
// over (with the copies' own weights when perturbed).
func TestCompose(t *testing.T) {
	for _, tc := range []struct {
		n       int
		perturb bool
	}{{1, false}, {3, false}, {3, true}} {
		m := block(t)
		mp, err := Compose(m, tc.n, Options{Perturb: tc.perturb})
		if err != nil {
			t.Fatal(err)
		}
		g := mp.Graph
		if len(g.Node) != 2*tc.n || len(g.Initializer) != tc.n || g.Input[0].GetName() != "x" || g.Output[0].GetName() != "y" {
			t.Fatalf("n=%d: %d nodes, %d initializers, %s -> %s", tc.n, len(g.Node), len(g.Initializer), g.Input[0].GetName(), g.Output[0].GetName())
		}
		if !strings.HasPrefix(g.Node[2*tc.n-1].GetName(), "c") {
			t.Fatalf("node %q not renamed", g.Node[2*tc.n-1].GetName())
		}
		b, _ := proto.Marshal(mp)
		cm, err := graph.Parse(b, "chain")
		if err != nil {
			t.Fatal(err)
		}
		x := []float32{1, -1}
		out, err := eval.Run(context.Background(), cm, map[string]*eval.Tensor{"x": eval.NewFloat32([]int{1, 2}, x)}, eval.Options{})
		if err != nil {
			t.Fatal(err)
		}
		// The truth, computed here: each copy i maps x to x·W_i + x.
		for i := range tc.n {
			raw := g.Initializer[i].GetRawData()
			wi, err := graph.DecodeFloat32(pb.TensorProto_FLOAT, raw)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.perturb && (wi[0] != 1 || wi[3] != 4) {
				t.Fatalf("copy %d weights %v", i, wi)
			}
			x = []float32{x[0]*wi[0] + x[1]*wi[2] + x[0], x[0]*wi[1] + x[1]*wi[3] + x[1]}
		}
		got := out["y"].F32
		for k := range x {
			if d := got[k] - x[k]; d > 1e-5 || d < -1e-5 {
				t.Fatalf("n=%d perturb=%v: y %v, want %v", tc.n, tc.perturb, got, x)
			}
		}
	}
	if _, err := Compose(block(t), 0, Options{}); err == nil {
		t.Fatal("a chain of 0 copies was built")
	}
}

// TestParallelShareFront puts two copies of the block on one input, once
// with their common computations merged (ShareFront) and once without:
// the copies' equal MatMuls of the shared input (their weights equal by
// content, under two names) become one node read by both Adds, its weight
// one initializer, and both graphs compute x·W + x on each output.
func TestParallelShareFront(t *testing.T) {
	for _, share := range []bool{false, true} {
		mp, err := Parallel([]*graph.Model{block(t), block(t)}, ParallelOptions{ShareFront: share})
		if err != nil {
			t.Fatal(err)
		}
		g := mp.Graph
		nodes, inits := 4, 2
		if share {
			nodes, inits = 3, 1
		}
		if len(g.Node) != nodes || len(g.Initializer) != inits {
			t.Fatalf("share %v: %d nodes, %d initializers; want %d, %d", share, len(g.Node), len(g.Initializer), nodes, inits)
		}
		b, _ := proto.Marshal(mp)
		cm, err := graph.Parse(b, "parallel")
		if err != nil {
			t.Fatal(err)
		}
		out, err := eval.Run(context.Background(), cm, map[string]*eval.Tensor{"x": eval.NewFloat32([]int{1, 2}, []float32{1, -1})}, eval.Options{})
		if err != nil {
			t.Fatal(err)
		}
		want := []float32{1*1 - 1*3 + 1, 1*2 - 1*4 - 1} // x·W + x, W = [[1, 2], [3, 4]]
		for _, o := range g.Output {
			if got := out[o.GetName()].F32; got[0] != want[0] || got[1] != want[1] {
				t.Fatalf("share %v: %s = %v, want %v", share, o.GetName(), got, want)
			}
		}
	}
}
