package graph

import (
	"errors"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
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

// TestValueNumbers: value numbers answer like the name lookups, InputIDs
// and OutputIDs return the numbers of a node's inputs (captures included)
// and outputs whether or not the index still holds them (after AddNode,
// Sort, ReplaceAllUses), ProducerPos names the producer's position, and
// RemoveNodesFunc deletes what it is told in order.
func TestValueNumbers(t *testing.T) {
	body := &pb.GraphProto{Node: []*pb.NodeProto{NewNode("Identity", "", "inner", []string{"q"}, []string{"o"})},
		Output: []*pb.ValueInfoProto{vinfo("o")}}
	ifNode := NewNode("If", "", "if", []string{"x"}, []string{"z"})
	ifNode.Attribute = []*pb.AttributeProto{{Name: proto.String("then_branch"), Type: pb.AttributeProto_GRAPH.Enum(), G: body}}
	g := NewGraph(&pb.GraphProto{Input: []*pb.ValueInfoProto{vinfo("x")}, Output: []*pb.ValueInfoProto{vinfo("y")},
		Initializer: []*pb.TensorProto{f32Init("w", 1)},
		Node: []*pb.NodeProto{
			NewNode("Mul", "", "m", []string{"x", "w", ""}, []string{"p", ""}),
			NewNode("Relu", "", "r", []string{"p"}, []string{"q"}),
			ifNode,
			NewNode("Add", "", "a", []string{"p", "q"}, []string{"y"}),
		}})
	// ids maps names to numbers, checking that they agree with the lookups by name.
	ids := func(names ...string) []int32 {
		out := make([]int32, len(names))
		for i, v := range names {
			out[i] = g.ValueID(v)
			if j := out[i]; j >= 0 && (g.ProducerOf(j) != g.Producer(v) || g.InitializerOf(j) != g.Initializer(v) || len(g.ConsumersOf(j)) != len(g.Consumers(v))) {
				t.Errorf("lookups of %q by number and by name differ", v)
			}
		}
		return out
	}
	check := func(when string) {
		t.Helper()
		for pos, n := range g.P.Node {
			for _, p := range []int{pos, -1} {
				if got, want := g.InputIDs(n, p), ids(NodeInputs(n)...); !slices.Equal(got, want) {
					t.Errorf("%s: InputIDs(%s, %d) = %v, want %v", when, n.GetName(), p, got, want)
				}
				if got, want := g.OutputIDs(n, p), ids(n.Output...); !slices.Equal(got, want) {
					t.Errorf("%s: OutputIDs(%s, %d) = %v, want %v", when, n.GetName(), p, got, want)
				}
			}
		}
	}
	for _, tc := range []struct {
		name string
		edit func()
	}{
		{"indexed", func() {}},
		{"node added", func() { g.AddNode(NewNode("Neg", "", "n", []string{"y", "w"}, []string{"u"})) }},
		{"sorted", func() {
			g.P.Node[0], g.P.Node[1] = g.P.Node[1], g.P.Node[0]
			if err := g.Sort(); err != nil {
				t.Fatal(err)
			}
		}},
		{"rewired", func() { g.ReplaceAllUses("q", "p") }},
		{"reindexed", func() { g.Reindex() }},
	} {
		tc.edit()
		check(tc.name)
	}
	if n := g.NumValues(); n != 7 { // x w p q z y u
		t.Errorf("NumValues = %d, want 7", n)
	}
	if g.ValueID("o") != -1 || g.ValueID("") != -1 || g.ValueID("nope") != -1 {
		t.Error("a value the graph does not number got a number")
	}
	for pos, n := range g.P.Node {
		for _, out := range n.Output {
			if out == "" {
				continue
			}
			if got := g.ProducerPos(g.ValueID(out)); got != int32(pos) {
				t.Errorf("ProducerPos(%s) = %d, want %d", out, got, pos)
			}
		}
	}
	if got := g.ProducerPos(g.ValueID("x")); got != -1 {
		t.Errorf("ProducerPos of a graph input = %d", got)
	}
	var seen []string
	g.RemoveNodesFunc(func(n *pb.NodeProto) bool {
		seen = append(seen, n.GetName())
		return n.GetName() == "n" || n.GetName() == "if"
	})
	if want := []string{"m", "r", "if", "a", "n"}; !slices.Equal(seen, want) {
		t.Errorf("RemoveNodesFunc asked about %v, want %v", seen, want)
	}
	if got := labels(g.P.Node); !slices.Equal(got, []string{"m", "r", "a"}) {
		t.Errorf("nodes left: %v", got)
	}
	if g.Producer("u") != nil || len(g.Consumers("x")) != 1 {
		t.Error("RemoveNodesFunc did not reindex")
	}
}

// TestUniqueNameAvoidsNodeNames: UniqueName avoids the names of the nodes
// indexed and of those added since, asked before or after the first call.
func TestUniqueNameAvoidsNodeNames(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first string // asked before the node is added
	}{
		{"added before the first call", ""},
		{"added after the first call", "warm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewGraph(&pb.GraphProto{Input: []*pb.ValueInfoProto{vinfo("x")}, Output: []*pb.ValueInfoProto{vinfo("y")},
				Node: []*pb.NodeProto{NewNode("Relu", "", "relu_node", []string{"x"}, []string{"y"}), NewNode("Neg", "", "", []string{"x"}, []string{"v"})}})
			if tc.first != "" {
				if got := g.UniqueName(tc.first); got != tc.first {
					t.Fatalf("UniqueName(%q) = %q", tc.first, got)
				}
			}
			g.AddNode(NewNode("Neg", "", "added_node", []string{"x"}, []string{"z"}))
			for _, c := range []struct{ prefix, want string }{
				{"relu_node", "relu_node_1"},
				{"added_node", "added_node_1"},
				{"Neg->v", "Neg->v"}, // labels of unnamed nodes are not names
			} {
				if got := g.UniqueName(c.prefix); got != c.want {
					t.Errorf("UniqueName(%q) = %q, want %q", c.prefix, got, c.want)
				}
			}
		})
	}
}

// TestHashSet: the bucketed set answers like a map, for empty, tiny and
// larger sets, duplicates and hashes at both ends of the range.
func TestHashSet(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 2, 7, 1000} {
		hs := []uint64{}
		want := map[uint64]bool{}
		for range n {
			h := rnd.Uint64()
			hs = append(hs, h, h) // duplicates too
			want[h] = true
		}
		if n > 0 {
			hs = append(hs, 0, ^uint64(0))
			want[0], want[^uint64(0)] = true, true
		}
		s := newHashSet(hs)
		for h := range want {
			if !s.has(h) {
				t.Errorf("n=%d: %#x missing", n, h)
			}
		}
		for range 1000 {
			if h := rnd.Uint64(); s.has(h) != want[h] {
				t.Errorf("n=%d: has(%#x) = %v", n, h, !want[h])
			}
		}
	}
}

// TestNodesByOp: the nodes of an op, in graph order, those AddNode added
// since the last Reindex last.
func TestNodesByOp(t *testing.T) {
	g := NewGraph(&pb.GraphProto{Input: []*pb.ValueInfoProto{vinfo("x")}, Output: []*pb.ValueInfoProto{vinfo("y")},
		Node: []*pb.NodeProto{
			NewNode("Neg", "", "n1", []string{"x"}, []string{"a"}),
			NewNode("Relu", "", "r", []string{"a"}, []string{"b"}),
			NewNode("Neg", "", "n2", []string{"b"}, []string{"y"}),
		}})
	g.AddNode(NewNode("Neg", "", "n3", []string{"y"}, []string{"z"}))
	for _, tc := range []struct {
		op   string
		want []string
	}{
		{"Neg", []string{"n1", "n2", "n3"}},
		{"Relu", []string{"r"}},
		{"Add", nil},
	} {
		if got := labels(g.NodesByOp(tc.op)); !slices.Equal(got, tc.want) {
			t.Errorf("NodesByOp(%s) = %v, want %v", tc.op, got, tc.want)
		}
	}
}

// TestCheckProblems: Check reports duplicate initializers, values both an
// initializer and a node's output, and bad initializers inside subgraphs
// (and nothing for a valid graph, with or without a subgraph).
func TestCheckProblems(t *testing.T) {
	model := func(edit func(gp *pb.GraphProto)) *Model {
		gp := &pb.GraphProto{Name: proto.String("g"),
			Node:        []*pb.NodeProto{NewNode("Add", "", "add", []string{"x", "w"}, []string{"y"})},
			Initializer: []*pb.TensorProto{f32Init("w", 4)},
			Input:       []*pb.ValueInfoProto{vinfo("x")}, Output: []*pb.ValueInfoProto{vinfo("y")}}
		edit(gp)
		m := &Model{Proto: &pb.ModelProto{IrVersion: proto.Int64(10), Graph: gp,
			OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}}}, Dir: "."}
		m.ext = newExternalStore(".", "mem")
		return m
	}
	ifNode := func(init *pb.TensorProto) *pb.NodeProto {
		body := &pb.GraphProto{Node: []*pb.NodeProto{NewNode("Identity", "", "id", []string{"k"}, []string{"o"})},
			Initializer: []*pb.TensorProto{init}, Output: []*pb.ValueInfoProto{vinfo("o")}}
		return NewNode("If", "", "if", []string{"x"}, []string{"z"}, &pb.AttributeProto{Name: proto.String("then_branch"), Type: pb.AttributeProto_GRAPH.Enum(), G: body})
	}
	bad := f32Init("k", 4)
	bad.RawData = bad.RawData[:3]
	for _, tc := range []struct {
		name string
		edit func(gp *pb.GraphProto)
		want string // "" for no error
	}{
		{"valid", func(gp *pb.GraphProto) {}, ""},
		{"valid subgraph", func(gp *pb.GraphProto) { gp.Node = append(gp.Node, ifNode(f32Init("k", 4))) }, ""},
		{"duplicate initializer", func(gp *pb.GraphProto) { gp.Initializer = append(gp.Initializer, f32Init("w", 4)) }, `initializer "w" is defined more than once`},
		{"initializer produced", func(gp *pb.GraphProto) {
			gp.Node = append(gp.Node, NewNode("Neg", "", "neg", []string{"x"}, []string{"w"}))
		}, `value "w" is both an initializer and the output of node "neg"`},
		{"bad subgraph initializer", func(gp *pb.GraphProto) { gp.Node = append(gp.Node, ifNode(bad)) }, `initializer "k": raw_data holds 3 bytes`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := model(tc.edit).Check()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Check: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Check: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestCheckRecursiveFunctions: Check refuses a model-local function that
// calls itself, directly, through another function or from a subgraph of its
// body, naming the cycle; nested calls without a cycle pass.
func TestCheckRecursiveFunctions(t *testing.T) {
	fn := func(name string, body ...*pb.NodeProto) *pb.FunctionProto {
		return &pb.FunctionProto{Name: proto.String(name), Domain: proto.String("local"), Input: []string{"a"}, Output: []string{"b"}, Node: body,
			OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}}}
	}
	call := func(f string) *pb.NodeProto { return NewNode(f, "local", "call_"+f, []string{"a"}, []string{"b"}) }
	inIf := func(f string) *pb.NodeProto {
		body := &pb.GraphProto{Node: []*pb.NodeProto{NewNode(f, "local", "inner", []string{"a"}, []string{"o"})}, Output: []*pb.ValueInfoProto{vinfo("o")}}
		return NewNode("If", "", "if", []string{"a"}, []string{"b"}, &pb.AttributeProto{Name: proto.String("then_branch"), Type: pb.AttributeProto_GRAPH.Enum(), G: body})
	}
	leaf := fn("leaf", NewNode("Neg", "", "neg", []string{"a"}, []string{"b"}))
	for _, tc := range []struct {
		name  string
		funcs []*pb.FunctionProto
		want  string
	}{
		{"nested, no cycle", []*pb.FunctionProto{fn("f", call("leaf")), leaf}, ""},
		{"self", []*pb.FunctionProto{fn("f", call("f"))}, "local::f -> local::f"},
		{"mutual", []*pb.FunctionProto{fn("f", call("g")), fn("g", call("f"))}, "local::f -> local::g -> local::f"},
		{"through a subgraph", []*pb.FunctionProto{fn("f", inIf("g")), fn("g", call("f"))}, "is recursive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gp := &pb.GraphProto{Name: proto.String("g"), Node: []*pb.NodeProto{NewNode("f", "local", "top", []string{"x"}, []string{"y"})},
				Input: []*pb.ValueInfoProto{vinfo("x")}, Output: []*pb.ValueInfoProto{vinfo("y")}}
			if tc.funcs[0].GetName() != "f" {
				t.Fatal("the first function must be f")
			}
			m := &Model{Proto: &pb.ModelProto{IrVersion: proto.Int64(10), Graph: gp, Functions: tc.funcs,
				OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}, {Domain: proto.String("local"), Version: proto.Int64(1)}}}, Dir: "."}
			m.ext = newExternalStore(".", "mem")
			err := m.Check()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Check: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrBadInput)):
				t.Errorf("Check: %v, want a bad-input error with %q", err, tc.want)
			}
		})
	}
}
