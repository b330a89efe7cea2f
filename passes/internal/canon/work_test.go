package canon

import (
	"context"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// TestNewNamesAvoidOriginalNames: a value the working copy dropped (an
// Identity's output) keeps its meaning in the original, so no value created
// later may take its name, neither by a rule nor by a pass that runs on the
// working copy afterwards.
func TestNewNamesAvoidOriginalNames(t *testing.T) {
	// y = Relu(Identity(x)) + F(x) where F(a) = QuickGelu(a): inlined in
	// the first sweep, decomposed in the second, when the Identity's output
	// is gone from the working copy; its name is what the decomposition's
	// Sigmoid output would be called.
	fn := &pb.FunctionProto{Name: proto.String("F"), Domain: proto.String("local"), Input: []string{"a"}, Output: []string{"o"},
		Node:        []*pb.NodeProto{graph.NewNode("QuickGelu", msDomain, "q", []string{"a"}, []string{"o"}, graph.FloatAttr("alpha", 1))},
		OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(17)}, {Domain: proto.String(msDomain), Version: proto.Int64(1)}}}
	clash := "f/q/sigmoid"
	c := ruleCase{
		nodes: []*pb.NodeProto{
			graph.NewNode("Identity", "", "id", []string{"x"}, []string{clash}),
			graph.NewNode("Relu", "", "relu", []string{clash}, []string{"r"}),
			graph.NewNode("F", "local", "call", []string{"x"}, []string{"f"}),
			graph.NewNode("Add", "", "add", []string{"r", "f"}, []string{"y"}),
		},
		funcs:   []*pb.FunctionProto{fn},
		extra:   []*pb.OperatorSetIdProto{{Domain: proto.String("local"), Version: proto.Int64(1)}, {Domain: proto.String(msDomain), Version: proto.Int64(1)}},
		inputs:  map[string]*eval.Tensor{"x": eval.NewFloat32([]int{3}, []float32{-1, 0.5, 2})},
		outputs: []string{"y"},
	}
	m := c.model(t)
	wc, res, err := Canonicalize(context.Background(), m, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Applied["inline-function"] != 1 || res.Applied["contrib-quickgelu"] != 1 || res.Applied["drop-identity"] != 1 {
		t.Fatalf("rules applied: %s", res.Summary())
	}
	g := wc.Graph()
	if g.Producer(clash) != nil || g.Initializer(clash) != nil {
		t.Fatalf("the working copy reuses the dropped name %q", clash)
	}
	if got := g.UniqueName(clash); got == clash {
		t.Fatalf("the dropped name %q is handed out again after canonicalization", clash)
	}
}
