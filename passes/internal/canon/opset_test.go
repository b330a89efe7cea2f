package canon

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

func TestRaiseOpset(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	x := map[string]*eval.Tensor{"x": randF32(r, 2, 6)}
	cases := []struct {
		name   string
		opset  int64
		nodes  []*pb.NodeProto
		refuse string
	}{
		{name: "split squeeze unsqueeze reducesum softmax", opset: 11, nodes: []*pb.NodeProto{
			node("Split", []string{"x"}, []string{"a", "b"}, graph.IntAttr("axis", 1), graph.IntsAttr("split", 2, 4)),
			node("Unsqueeze", []string{"a"}, []string{"a3"}, graph.IntsAttr("axes", 0)),
			node("Squeeze", []string{"a3"}, []string{"a2"}, graph.IntsAttr("axes", 0)),
			node("ReduceSum", []string{"b"}, []string{"bs"}, graph.IntsAttr("axes", 1), graph.IntAttr("keepdims", 1)),
			node("Softmax", []string{"x"}, []string{"sm"}, graph.IntAttr("axis", 1)),
			node("Add", []string{"a2", "bs"}, []string{"t"}),
			node("Concat", []string{"sm", "t"}, []string{"y"}, graph.IntAttr("axis", 1)),
		}},
		{name: "topk clip slice from 9", opset: 9, nodes: []*pb.NodeProto{
			node("TopK", []string{"x"}, []string{"v", "i"}, graph.IntAttr("k", 2)),
			node("Clip", []string{"v"}, []string{"c"}, graph.FloatAttr("min", -0.5), graph.FloatAttr("max", 0.5)),
			node("Slice", []string{"c"}, []string{"y"}, graph.IntsAttr("starts", 1), graph.IntsAttr("ends", 2), graph.IntsAttr("axes", 1)),
		}},
		{name: "softmax on a middle axis refused", opset: 12, nodes: []*pb.NodeProto{
			node("Unsqueeze", []string{"x"}, []string{"x3"}, graph.IntsAttr("axes", 2)),
			node("Softmax", []string{"x"}, []string{"y"}, graph.IntAttr("axis", 0)),
		}, refuse: "Softmax"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rc := ruleCase{opset: c.opset, nodes: c.nodes, inputs: x, outputs: []string{"y"}}
			m := rc.model(t)
			wc, res, err := Canonicalize(context.Background(), m, Options{Rules: []Rule{}})
			if err != nil {
				t.Fatal(err)
			}
			if c.refuse != "" {
				if !strings.Contains(res.OpsetRefused, c.refuse) || res.OpsetTo != c.opset || (wc != nil && wc.Opset("") != c.opset) {
					t.Fatalf("want a refusal naming %s, got %q (opset %d)", c.refuse, res.OpsetRefused, res.OpsetTo)
				}
				return
			}
			if res.OpsetRefused != "" || wc.Opset("") != MinOpset {
				t.Fatalf("opset %d, refused %q", wc.Opset(""), res.OpsetRefused)
			}
			if errs := wc.Graph().Validate(); len(errs) > 0 {
				t.Fatal(errs)
			}
			want, err := eval.Run(context.Background(), m, x, eval.Options{})
			if err != nil {
				t.Fatalf("original: %v", err)
			}
			got, err := eval.Run(context.Background(), wc, x, eval.Options{})
			if err != nil {
				t.Fatalf("raised: %v", err)
			}
			d, err := eval.Compare(got["y"], want["y"], 1e-6, 1e-7)
			if err != nil || !d.OK() {
				t.Fatalf("raised model differs: %v %+v", err, d)
			}
			for _, n := range wc.Proto.Graph.Node {
				for _, a := range n.Attribute {
					switch a.GetName() {
					case "split", "axes", "k", "starts", "ends", "min", "max":
						t.Errorf("node %s keeps attribute %s at opset 13", n.GetName(), a.GetName())
					}
				}
			}
		})
	}
}

// TestRaiseOpsetWithSubgraphs: an opset-12 model whose If branches use
// attribute-style Squeeze, Unsqueeze and Split. RaiseOpset refuses naming
// the node; RaiseOpsetWithSubgraphs converts both branches (or all but a
// kept one) into copies, leaving the original branch graphs as they were,
// and the raised model computes what the original did.
func TestRaiseOpsetWithSubgraphs(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	x := map[string]*eval.Tensor{"x": randF32(r, 2, 6)}
	out := func(name string) []*pb.ValueInfoProto {
		return []*pb.ValueInfoProto{vi(name, pb.TensorProto_FLOAT, []int{2, 6})}
	}
	then := &pb.GraphProto{Name: proto.String("then"), Output: out("t"), Node: []*pb.NodeProto{
		node("Unsqueeze", []string{"x"}, []string{"t3"}, graph.IntsAttr("axes", 0)),
		node("Squeeze", []string{"t3"}, []string{"t"}, graph.IntsAttr("axes", 0))}}
	els := &pb.GraphProto{Name: proto.String("else"), Output: out("e"), Node: []*pb.NodeProto{
		node("Split", []string{"x"}, []string{"e1", "e2"}, graph.IntAttr("axis", 1), graph.IntsAttr("split", 2, 4)),
		node("Concat", []string{"e2", "e1"}, []string{"e"}, graph.IntAttr("axis", 1))}}
	build := func(cond bool) *graph.Model {
		c := &pb.TensorProto{Name: proto.String("c"), DataType: proto.Int32(int32(pb.TensorProto_BOOL)), Int32Data: []int32{0}}
		if cond {
			c.Int32Data[0] = 1
		}
		iff := node("If", []string{"cond"}, []string{"y"},
			&pb.AttributeProto{Name: proto.String("then_branch"), Type: pb.AttributeProto_GRAPH.Enum(), G: then},
			&pb.AttributeProto{Name: proto.String("else_branch"), Type: pb.AttributeProto_GRAPH.Enum(), G: els})
		rc := ruleCase{opset: 12, nodes: []*pb.NodeProto{node("Constant", nil, []string{"cond"}, graph.TensorAttr("value", c)), iff},
			inputs: x, outputs: []string{"y"}}
		m := rc.model(t)
		// the branches themselves, not the clones the case builder made
		for _, n := range m.Proto.Graph.Node {
			if n.GetOpType() == "If" {
				n.Attribute = iff.Attribute
			}
		}
		return m
	}
	holdsAttr := func(g *pb.GraphProto) bool {
		for _, n := range g.Node {
			if graph.Attr(n, "axes") != nil || graph.Attr(n, "split") != nil {
				return true
			}
		}
		return false
	}
	if _, err := RaiseOpset(NewWork(build(true), Options{}), 13); err == nil || !strings.Contains(err.Error(), "inside a subgraph") {
		t.Fatalf("RaiseOpset: want a refusal naming the subgraph node, got %v", err)
	}
	for _, cond := range []bool{true, false} {
		m := build(cond)
		want, err := eval.Run(context.Background(), m, x, eval.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckRaiseOpset(m, 13, nil); err != nil {
			t.Fatal(err)
		}
		n, err := RaiseOpsetWithSubgraphs(NewWork(m, Options{}), 13, nil)
		if err != nil || n != 3 || m.Opset("") != 13 {
			t.Fatalf("converted %d (want 3), opset %d, err %v", n, m.Opset(""), err)
		}
		if !holdsAttr(then) || !holdsAttr(els) {
			t.Fatal("the original branch graphs were edited")
		}
		for _, nd := range m.Proto.Graph.Node {
			for _, a := range nd.Attribute {
				if a.G != nil && holdsAttr(a.G) {
					t.Errorf("branch %s keeps an attribute-style op", a.GetName())
				}
			}
		}
		if errs := m.Graph().Validate(); len(errs) > 0 {
			t.Fatal(errs)
		}
		got, err := eval.Run(context.Background(), m, x, eval.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if d, err := eval.Compare(got["y"], want["y"], 0, 0); err != nil || !d.OK() {
			t.Fatalf("cond %v: raised model differs: %v %+v", cond, err, d)
		}
	}
	m := build(true)
	if n, err := RaiseOpsetWithSubgraphs(NewWork(m, Options{}), 13, map[*pb.GraphProto]bool{els: true}); err != nil || n != 2 {
		t.Fatalf("keeping the else branch: converted %d (want 2), err %v", n, err)
	}
	for _, nd := range m.Proto.Graph.Node {
		if a := graph.Attr(nd, "else_branch"); a != nil && a.G != els {
			t.Error("the kept else branch was replaced")
		}
	}
}

// TestRaiseOpsetInlinesOlderFunctions: a call of a model-local function
// that imports the model's old opset is inlined by the raise, its nodes
// converted with the graph's, so the raised model computes what the
// original did; a function whose body cannot be inlined refuses the raise,
// named.
func TestRaiseOpsetInlinesOlderFunctions(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	x := map[string]*eval.Tensor{"x": randF32(r, 2, 6)}
	local := []*pb.OperatorSetIdProto{{Domain: proto.String("local"), Version: proto.Int64(1)}}
	body := fn("f", []string{"a"}, []string{"o"}, nil, 11,
		node("Unsqueeze", []string{"a"}, []string{"a3"}, graph.IntsAttr("axes", 0)),
		node("ReduceSum", []string{"a3"}, []string{"s"}, graph.IntsAttr("axes", 2), graph.IntAttr("keepdims", 0)),
		node("Squeeze", []string{"s"}, []string{"o"}, graph.IntsAttr("axes", 0)))
	rc := ruleCase{opset: 11, nodes: []*pb.NodeProto{graph.NewNode("f", "local", "call", []string{"x"}, []string{"y"})},
		funcs: []*pb.FunctionProto{body}, extra: local, inputs: x, outputs: []string{"y"}}
	m := rc.model(t)
	want, err := eval.Run(context.Background(), m, x, eval.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckRaiseOpset(m, MinOpset, nil); err != nil {
		t.Fatalf("dry run refuses: %v", err)
	}
	n, err := RaiseOpset(NewWork(m, Options{}), MinOpset)
	if err != nil || n != 3 {
		t.Fatalf("raise: %d nodes converted, %v; want 3", n, err)
	}
	for _, c := range m.Proto.Graph.Node {
		if c.GetDomain() == "local" {
			t.Fatalf("call %s not inlined", c.GetName())
		}
	}
	got, err := eval.Run(context.Background(), m, x, eval.Options{})
	if err != nil {
		t.Fatalf("raised: %v", err)
	}
	if d, err := eval.Compare(got["y"], want["y"], 1e-6, 1e-7); err != nil || !d.OK() {
		t.Fatalf("raised model differs: %v %+v", err, d)
	}
	// A body with a subgraph is not inlined: the raise is refused, naming it.
	sub := fn("g", []string{"a"}, []string{"o"}, nil, 11,
		node("If", []string{"a"}, []string{"o"}, &pb.AttributeProto{Name: proto.String("then_branch"), Type: pb.AttributeProto_GRAPH.Enum(), G: &pb.GraphProto{}}))
	rc = ruleCase{opset: 11, nodes: []*pb.NodeProto{graph.NewNode("g", "local", "call", []string{"x"}, []string{"y"})},
		funcs: []*pb.FunctionProto{sub}, extra: local, inputs: x, outputs: []string{"y"}}
	if _, err := RaiseOpset(NewWork(rc.model(t), Options{}), MinOpset); err == nil || !strings.Contains(err.Error(), "local::g") {
		t.Fatalf("want a refusal naming local::g, got %v", err)
	}
}
