package canon

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
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
