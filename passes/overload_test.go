package passes

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/models"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// stackBlocks builds one model of the given one-block configs applied in
// turn (each block reads the previous one's output), every name of block i
// prefixed with "b<i>/".
func stackBlocks(t *testing.T, cfgs ...models.Config) *graph.Model {
	t.Helper()
	var gp *pb.GraphProto
	prev := ""
	for i, cfg := range cfgs {
		m, err := models.Build(cfg)
		if err != nil {
			t.Fatal(err)
		}
		g := m.Proto.Graph
		in, out := g.Input[0].GetName(), g.Output[0].GetName()
		pre := "b" + string(rune('0'+i)) + "/"
		ren := func(v string) string {
			switch {
			case v == "":
				return v
			case v == in && prev != "":
				return prev
			case v == in:
				return v
			}
			return pre + v
		}
		for _, n := range g.Node {
			n.Name = proto.String(pre + n.GetName())
			for j, v := range n.Input {
				n.Input[j] = ren(v)
			}
			for j, v := range n.Output {
				n.Output[j] = ren(v)
			}
		}
		for _, init := range g.Initializer {
			init.Name = proto.String(ren(init.GetName()))
		}
		for _, vi := range g.ValueInfo {
			vi.Name = proto.String(ren(vi.GetName()))
		}
		g.Output[0].Name = proto.String(ren(out))
		if gp == nil {
			gp = g
		} else {
			gp.Node = append(gp.Node, g.Node...)
			gp.Initializer = append(gp.Initializer, g.Initializer...)
			gp.ValueInfo = append(gp.ValueInfo, g.ValueInfo...)
			gp.Output = g.Output
		}
		prev = ren(out)
	}
	m, err := models.Build(cfgs[0])
	if err != nil {
		t.Fatal(err)
	}
	m.Proto.Graph = gp
	return m
}

// TestBodiesPerParameters: two blocks of one semantic variant whose body
// constants differ (top-k, expert count) get a function body each, and the
// rewritten model computes the original's numbers through the bodies (what
// a stock ONNX runtime runs), not only through mokopt's kernel.
func TestBodiesPerParameters(t *testing.T) {
	base := models.Config{Shape: models.ShapeBatched, Layers: 1, Experts: 4, TopK: 2, Hidden: 16, Inter: 32, Normalize: true, Tokens: 6}
	other := base
	other.TopK, other.Experts, other.Seed = 1, 8, 7
	m := stackBlocks(t, base, other)
	x := make([]float32, 6*16)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	feeds := map[string]*eval.Tensor{m.Proto.Graph.Input[0].GetName(): eval.NewFloat32([]int{6, 16}, x)}
	want, err := eval.Run(context.Background(), m, feeds, eval.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Rewrite(m, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Fused) != 2 {
		t.Fatalf("fused %d blocks, want 2", len(rep.Fused))
	}
	overloads := map[string]bool{}
	for _, f := range m.Proto.Functions {
		if f.GetDomain() == moe.Domain {
			overloads[f.GetOverload()] = true
		}
	}
	for _, n := range m.Proto.Graph.Node {
		if n.GetDomain() == moe.Domain && !overloads[n.GetOverload()] {
			t.Errorf("node %s: no body for overload %q", n.GetName(), n.GetOverload())
		}
	}
	if len(overloads) != 2 {
		t.Errorf("%d function bodies %v, want 2", len(overloads), overloads)
	}
	runBoth(t, m, feeds, want[m.Proto.Graph.Output[0].GetName()])
}
