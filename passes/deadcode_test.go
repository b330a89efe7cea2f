package passes

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
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
