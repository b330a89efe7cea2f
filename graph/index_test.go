package graph

import (
	"runtime/debug"
	"slices"
	"sync"
	"testing"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

func labels(ns []*pb.NodeProto) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.GetName())
	}
	return out
}

// TestTopoSortOrderAndEdits: the file order is kept when it is topological,
// an out-of-order graph is sorted, and edits through the index (AddNode,
// ReplaceAllUses) are seen by the next TopoSort.
func TestTopoSortOrderAndEdits(t *testing.T) {
	in := []*pb.ValueInfoProto{vinfo("x")}
	out := []*pb.ValueInfoProto{vinfo("y")}
	ordered := NewGraph(&pb.GraphProto{Input: in, Output: out, Node: []*pb.NodeProto{
		NewNode("Relu", "", "a", []string{"x"}, []string{"ra"}),
		NewNode("Neg", "", "b", []string{"x"}, []string{"rb"}),
		NewNode("Add", "", "c", []string{"ra", "rb"}, []string{"y"}),
	}})
	got, err := ordered.TopoSort()
	if err != nil || !slices.Equal(labels(got), []string{"a", "b", "c"}) {
		t.Fatalf("ordered graph: %v %v", labels(got), err)
	}
	shuffled := NewGraph(&pb.GraphProto{Input: in, Output: out, Node: []*pb.NodeProto{
		NewNode("Add", "", "c", []string{"ra", "rb"}, []string{"y"}),
		NewNode("Neg", "", "b", []string{"x"}, []string{"rb"}),
		NewNode("Relu", "", "a", []string{"x"}, []string{"ra"}),
	}})
	got, err = shuffled.TopoSort()
	if err != nil || !slices.Equal(labels(got), []string{"b", "a", "c"}) {
		t.Fatalf("shuffled graph: %v %v, want [b a c]", labels(got), err)
	}
	// A node appended after its consumer's producer changes the order.
	ordered.AddNode(NewNode("Sigmoid", "", "d", []string{"x"}, []string{"rd"}))
	ordered.ReplaceAllUses("rb", "rd")
	got, err = ordered.TopoSort()
	if err != nil || !slices.Equal(labels(got), []string{"a", "b", "d", "c"}) {
		t.Fatalf("after edits: %v %v, want [a b d c]", labels(got), err)
	}
	// A self-loop is a cycle, also when every other edge is in order.
	loop := NewGraph(&pb.GraphProto{Input: in, Output: out, Node: []*pb.NodeProto{
		NewNode("Add", "", "s", []string{"x", "y"}, []string{"y"}),
	}})
	if _, err := loop.TopoSort(); err == nil {
		t.Fatal("self-loop: no error")
	}
}

// TestIndexConsumersAndNames: consumer lists (one backing array) grow
// independently, and UniqueName avoids values, nodes, initializers, inputs
// and its own earlier answers.
func TestIndexConsumersAndNames(t *testing.T) {
	g := NewGraph(&pb.GraphProto{Input: []*pb.ValueInfoProto{vinfo("x")}, Output: []*pb.ValueInfoProto{vinfo("y")},
		Initializer: []*pb.TensorProto{f32Init("w", 1)},
		Node: []*pb.NodeProto{
			NewNode("Mul", "", "m", []string{"x", "w"}, []string{"p"}),
			NewNode("Relu", "", "r", []string{"x"}, []string{"q"}),
			NewNode("Add", "", "y_node", []string{"p", "q"}, []string{"y"}),
		}})
	if c := g.Consumers("x"); len(c) != 2 || c[0].GetName() != "m" || c[1].GetName() != "r" {
		t.Fatalf("consumers of x: %v", labels(c))
	}
	g.AddNode(NewNode("Neg", "", "n", []string{"x"}, []string{"z"}))
	if c := g.Consumers("x"); len(c) != 3 || c[2].GetName() != "n" {
		t.Fatalf("consumers of x after AddNode: %v", labels(c))
	}
	if c := g.Consumers("w"); len(c) != 1 || c[0].GetName() != "m" {
		t.Fatalf("consumers of w changed: %v", labels(c))
	}
	if g.Initializer("w") == nil || g.Producer("p").GetName() != "m" || g.Producer("x") != nil {
		t.Fatal("producer/initializer lookups")
	}
	for _, taken := range []string{"x", "w", "p", "m", "y_node", "z"} {
		if got := g.UniqueName(taken); got != taken+"_1" {
			t.Errorf("UniqueName(%q) = %q, want %q", taken, got, taken+"_1")
		}
	}
	if got := g.UniqueName("x"); got != "x_2" {
		t.Errorf("second UniqueName(x) = %q, want x_2", got)
	}
	if got := g.UniqueName("fresh"); got != "fresh" {
		t.Errorf("UniqueName(fresh) = %q", got)
	}
}

// TestCheckHandsOverIndex: the Graph call after Check returns Check's
// index, once, and only while the graph's lists are unchanged.
func TestCheckHandsOverIndex(t *testing.T) {
	m := &Model{Proto: modernModel(), Dir: "."}
	m.ext = newExternalStore(".", "mem")
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
	spare := m.spare
	if spare == nil {
		t.Fatal("Check kept no index")
	}
	if g := m.Graph(); g != spare {
		t.Fatal("Graph after Check built a new index")
	}
	if g := m.Graph(); g == spare {
		t.Fatal("the index was handed over twice")
	}
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
	m.Proto.Graph.Node = append(m.Proto.Graph.Node, NewNode("Identity", "", "extra", []string{m.Proto.Graph.Output[0].GetName()}, []string{"extra_out"}))
	if g := m.Graph(); g == m.spare || g.Producer("extra_out") == nil {
		t.Fatal("Graph after an edit returned the stale index")
	}
}

// TestParseRestoresGC: decoding a big model pauses the collector and
// restores the caller's setting, also when decodings overlap.
func TestParseRestoresGC(t *testing.T) {
	mp := modernModel()
	mp.Graph.Initializer = append(mp.Graph.Initializer, f32Init("big", 1<<19))
	b, err := proto.Marshal(mp)
	if err != nil {
		t.Fatal(err)
	}
	old := debug.SetGCPercent(137)
	defer debug.SetGCPercent(old)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := Parse(b, "mem"); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if got := debug.SetGCPercent(137); got != 137 {
		t.Fatalf("GC percent after Parse = %d, want 137", got)
	}
}
