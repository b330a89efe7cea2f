package passes

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/models"
	"google.golang.org/protobuf/proto"
)

// TestRewriteDeadCodeAccounting rewrites a three-layer unrolled model into
// which a dangling dead chain was added: every node that disappears must be
// named in exactly one block's provenance, the dead chain in the first
// block's, and no dead node may be left behind.
func TestRewriteDeadCodeAccounting(t *testing.T) {
	cfg := models.Config{Shape: models.ShapeUnrolled, Layers: 3, Experts: 4, TopK: 2, Hidden: 8, Inter: 8, Router: "softmax", Normalize: true}
	m, err := models.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	gp := m.Proto.Graph
	in := gp.Input[0].GetName()
	gp.Node = append(gp.Node,
		graph.NewNode("Identity", "", "dead_a", []string{in}, []string{"dead_a_out"}),
		graph.NewNode("Neg", "", "dead_b", []string{"dead_a_out"}, []string{"dead_b_out"}))
	before := map[string]bool{}
	for _, n := range gp.Node {
		before[graph.NodeLabel(n)] = true
	}
	rep, err := Rewrite(m, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Fused) != cfg.Layers {
		t.Fatalf("%d blocks fused, want %d", len(rep.Fused), cfg.Layers)
	}
	after := map[string]bool{}
	for _, n := range m.Proto.Graph.Node {
		after[graph.NodeLabel(n)] = true
	}
	owner := map[string]string{}
	for i, f := range rep.Fused {
		v, ok := m.Metadata(ProvenanceKey + f.Node)
		if !ok {
			t.Fatalf("no provenance for %s", f.Node)
		}
		var p Provenance
		if err := json.Unmarshal([]byte(v), &p); err != nil {
			t.Fatal(err)
		}
		if len(p.Nodes) != f.NodesRemoved {
			t.Errorf("%s: provenance names %d nodes, report says %d", f.Node, len(p.Nodes), f.NodesRemoved)
		}
		for _, n := range p.Nodes {
			if o, dup := owner[n]; dup {
				t.Errorf("node %s removed by %s and %s", n, o, f.Node)
			}
			owner[n] = f.Node
			if after[n] {
				t.Errorf("node %s named as removed by %s is still in the graph", n, f.Node)
			}
		}
		if i == 0 && (owner["dead_a"] != f.Node || owner["dead_b"] != f.Node) {
			t.Errorf("the dead chain is attributed to %q and %q, want the first block %q", owner["dead_a"], owner["dead_b"], f.Node)
		}
	}
	for n := range before {
		if !after[n] && owner[n] == "" {
			t.Errorf("node %s disappeared without provenance", n)
		}
	}
	g := graph.NewGraph(m.Proto.Graph)
	if errs := g.Validate(); len(errs) > 0 {
		t.Fatalf("rewritten graph invalid: %v", errs)
	}
	if nodes, inits := g.RemoveDeadCode(); nodes != 0 || inits != 0 {
		t.Errorf("%d dead nodes and %d unused initializers left behind", nodes, inits)
	}
}

// TestSortStrings: sortStrings orders like sort.Strings, for strings with
// long shared prefixes, duplicates, empty strings and zero bytes.
func TestSortStrings(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	many := func(n int, gen func(i int) string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = gen(i)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		in   []string
	}{
		{"empty", nil},
		{"few", []string{"b", "a", "c"}},
		{"node names", many(3000, func(i int) string {
			return fmt.Sprintf("node_layers.3.e%d.%s", rnd.IntN(256), []string{"x_gather", "w1", "silu", "acc", ""}[rnd.IntN(5)])
		})},
		{"zero bytes and prefixes", many(500, func(i int) string {
			return "p" + strings.Repeat("\x00", rnd.IntN(9)) + strings.Repeat("a", rnd.IntN(3))
		})},
		{"random", many(2000, func(i int) string {
			b := make([]byte, rnd.IntN(20))
			for k := range b {
				b[k] = byte(rnd.IntN(4))
			}
			return string(b)
		})},
		{"duplicates", many(100, func(i int) string { return "same.name.for.every.node" })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := slices.Clone(tc.in)
			sort.Strings(want)
			got := slices.Clone(tc.in)
			sortStrings(got)
			if !slices.Equal(got, want) {
				t.Errorf("sortStrings differs from sort.Strings")
			}
		})
	}
}

// TestRemoveDeadInRegionOrder: the nodes and initializers removeDeadIn
// removes do not depend on the order of the region's nodes (found by
// position, near the previous one, through their outputs, or, for a node
// without outputs, through the node map), nor on a node list edited since
// the index was built (nodes found through the map, or numbered anew).
func TestRemoveDeadInRegionOrder(t *testing.T) {
	build := func() (*graph.Graph, map[string]*pb.NodeProto) {
		w := &pb.TensorProto{Name: proto.String("w"), Dims: []int64{1}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), RawData: make([]byte, 4)}
		nodes := []*pb.NodeProto{
			graph.NewNode("Relu", "", "a", []string{"x"}, []string{"va"}),
			graph.NewNode("Mul", "", "c", []string{"x", "w"}, []string{"vc"}),
			graph.NewNode("Neg", "", "b", []string{"va"}, []string{"y"}),
			graph.NewNode("Neg", "", "d", []string{"vc"}, []string{"vd"}),
			graph.NewNode("Print", "", "e", []string{"vd"}, nil),
		}
		g := graph.NewGraph(&pb.GraphProto{Node: nodes, Initializer: []*pb.TensorProto{w},
			Input:  []*pb.ValueInfoProto{{Name: proto.String("x")}},
			Output: []*pb.ValueInfoProto{{Name: proto.String("y")}}})
		byName := map[string]*pb.NodeProto{}
		for _, n := range nodes {
			byName[n.GetName()] = n
		}
		return g, byName
	}
	for _, tc := range []struct {
		order []string
		edit  func(g *graph.Graph) // on the node list, without reindexing
	}{
		{order: []string{"c", "d", "e"}},
		{order: []string{"e", "d", "c"}},
		{order: []string{"d", "e", "c", "a"}},
		{order: []string{"c", "d", "e"}, edit: func(g *graph.Graph) { slices.Reverse(g.P.Node) }},
		{order: []string{"d", "e"}, edit: func(g *graph.Graph) { // c is numbered as d's producer
			g.P.Node = slices.DeleteFunc(g.P.Node, func(n *pb.NodeProto) bool { return n.GetName() == "c" })
		}},
	} {
		order := tc.order
		t.Run(strings.Join(order, ""), func(t *testing.T) {
			g, byName := build()
			if tc.edit != nil {
				tc.edit(g)
			}
			d := newDeadCode(g, 0)
			var region []*pb.NodeProto
			for _, name := range order {
				region = append(region, byName[name])
			}
			nodes, inits := d.removeDeadIn(region)
			if want := []string{"c", "d", "e"}; !slices.Equal(nodes, want) {
				t.Errorf("removed nodes %v, want %v", nodes, want)
			}
			if want := []string{"w"}; !slices.Equal(inits, want) {
				t.Errorf("removed initializers %v, want %v", inits, want)
			}
			d.apply()
			if got := labelsOf(g.P.Node); !slices.Equal(got, []string{"a", "b"}) && !slices.Equal(got, []string{"b", "a"}) {
				t.Errorf("nodes left: %v, want a and b", got)
			}
		})
	}
}

// labelsOf returns the nodes' labels.
func labelsOf(nodes []*pb.NodeProto) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = graph.NodeLabel(n)
	}
	return out
}

// sortStrings sorts a with a fresh sortScratch.
func sortStrings(a []string) {
	var s sortScratch
	s.sort(a)
}

// TestInitializerInputsGoWithTheirBlock: weights that are graph inputs too
// (defaults a caller may override, as keep_initializers_as_inputs exports
// every weight) leave the interface with the nodes that read them, on the
// direct path and through the canonical working copy (a model-local
// function inlined first); inputs no fused node replaced stay, and the
// rewrite computes what the model computed.
func TestInitializerInputsGoWithTheirBlock(t *testing.T) {
	for _, canonical := range []bool{false, true} {
		t.Run(fmt.Sprintf("canonical=%v", canonical), func(t *testing.T) {
			m, err := models.Build(models.Config{Shape: models.ShapeUnrolled, Layers: 2, Experts: 4, TopK: 2, Hidden: 8, Inter: 8, Router: "softmax", Normalize: true})
			if err != nil {
				t.Fatal(err)
			}
			gp := m.Proto.Graph
			// every float weight becomes an input too, and one unused
			// initializer input that no block reads stays as it is
			var weights []string
			for _, t := range gp.Initializer {
				if graph.DataType(t) == pb.TensorProto_FLOAT && len(t.GetDims()) >= 2 {
					gp.Input = append(gp.Input, floatInfo(t.GetName(), t.GetDims()...))
					weights = append(weights, t.GetName())
				}
			}
			spare := &pb.TensorProto{Name: proto.String("spare"), Dims: []int64{2}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), FloatData: []float32{1, 2}}
			gp.Initializer = append(gp.Initializer, spare)
			gp.Input = append(gp.Input, floatInfo("spare", 2))
			if canonical { // an Identity the canonical stage drops: the splice path
				x := gp.Input[0].GetName()
				for _, n := range gp.Node {
					for i, in := range n.Input {
						if in == x {
							n.Input[i] = "x_id"
						}
					}
				}
				gp.Node = append([]*pb.NodeProto{graph.NewNode("Identity", "", "id", []string{x}, []string{"x_id"})}, gp.Node...)
			}
			orig := &graph.Model{Proto: proto.Clone(m.Proto).(*pb.ModelProto)}
			rep, err := Rewrite(m, Options{Check: true})
			if err != nil || len(rep.Fused) != 2 {
				t.Fatalf("rewrite: %v", err)
			}
			var ins []string
			for _, in := range m.Proto.Graph.Input {
				ins = append(ins, in.GetName())
			}
			if want := []string{orig.Proto.Graph.Input[0].GetName(), "spare"}; !slices.Equal(ins, want) {
				t.Fatalf("inputs %v, want %v (weights %v gone)", ins, want, weights)
			}
			if err := m.Check(); err != nil {
				t.Fatal(err)
			}
			x := eval.NewFloat32([]int{3, 8}, make([]float32, 24))
			for i := range x.F32 {
				x.F32[i] = float32(i%7) - 3
			}
			feeds := map[string]*eval.Tensor{ins[0]: x}
			a, err := eval.Run(context.Background(), orig, feeds, eval.Options{})
			if err != nil {
				t.Fatal(err)
			}
			b, err := eval.Run(context.Background(), m, feeds, eval.Options{Kernels: evalKernels()})
			if err != nil {
				t.Fatal(err)
			}
			out := m.Proto.Graph.Output[0].GetName()
			if d, err := eval.Compare(b[out], a[out], 1e-4, 1e-5); err != nil || !d.OK() {
				t.Fatalf("rewrite differs: %+v %v", d, err)
			}
		})
	}
}

// floatInfo declares a float tensor value of static dims.
func floatInfo(name string, dims ...int64) *pb.ValueInfoProto {
	sh := &pb.TensorShapeProto{}
	for _, d := range dims {
		sh.Dim = append(sh.Dim, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: d}})
	}
	return &pb.ValueInfoProto{Name: proto.String(name), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
		ElemType: proto.Int32(int32(pb.TensorProto_FLOAT)), Shape: sh}}}}
}
