package passes

import (
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/composite"
	"github.com/mokopt/mokopt/moe"
)

// TestSharedBranchRule applies the rule sharedBranch alone to small
// branches of x [4, 8] ending in y: the SwiGLU forms the fused node
// computes as its shared expert are taken, in every operand order and
// spelling of the projections, and every other computation is left alone.
func TestSharedBranchRule(t *testing.T) {
	w := func(name string, r, c int64) *pb.TensorProto {
		return moe.Float32Tensor(name, []int64{r, c}, make([]float32, r*c))
	}
	n := func(op string, in []string, out string, attrs ...*pb.AttributeProto) *pb.NodeProto {
		return graph.NewNode(op, "", out, in, []string{out}, attrs...)
	}
	inits := []*pb.TensorProto{w("wg", 8, 16), w("wu", 8, 16), w("wd", 16, 8), w("wgt", 8, 1), w("wgu", 8, 32), w("wgT", 16, 8),
		moe.Float32Tensor("two", nil, []float32{2}), moe.Float32Tensor("one", nil, []float32{1}), moe.Float32Tensor("bias", []int64{8}, make([]float32, 8)), moe.Int64Tensor("halves", []int64{2}, []int64{16, 16})}
	swiglu := []*pb.NodeProto{n("MatMul", []string{"x", "wg"}, "g"), n("MatMul", []string{"x", "wu"}, "u"), n("Sigmoid", []string{"g"}, "sg"),
		n("Mul", []string{"g", "sg"}, "silu"), n("Mul", []string{"silu", "u"}, "a"), n("MatMul", []string{"a", "wd"}, "y")}
	with := func(base []*pb.NodeProto, extra ...*pb.NodeProto) []*pb.NodeProto {
		return append(append([]*pb.NodeProto(nil), base...), extra...)
	}
	renamed := func(base []*pb.NodeProto, to string) []*pb.NodeProto {
		c := with(base)
		last := graph.CopyNode(c[len(c)-1])
		last.Output[0] = to
		c[len(c)-1] = last
		return c
	}
	cases := []struct {
		name  string
		nodes []*pb.NodeProto
		want  bool
	}{
		{"swiglu", swiglu, true},
		{"operands swapped", []*pb.NodeProto{n("MatMul", []string{"x", "wg"}, "g"), n("MatMul", []string{"x", "wu"}, "u"), n("Sigmoid", []string{"g"}, "sg"),
			n("Mul", []string{"sg", "g"}, "silu"), n("Mul", []string{"u", "silu"}, "a"), n("MatMul", []string{"a", "wd"}, "y")}, true},
		{"Gemm transB projections", []*pb.NodeProto{n("Gemm", []string{"x", "wgT"}, "g", graph.IntAttr("transB", 1)), n("MatMul", []string{"x", "wu"}, "u"), n("Sigmoid", []string{"g"}, "sg"),
			n("Mul", []string{"g", "sg"}, "silu"), n("Mul", []string{"silu", "u"}, "a"), n("MatMul", []string{"a", "wd"}, "y")}, true},
		{"sigmoid-gated", with(renamed(swiglu, "d"), n("MatMul", []string{"x", "wgt"}, "gl"), n("Sigmoid", []string{"gl"}, "gs"), n("Mul", []string{"gs", "d"}, "y")), true},
		{"fused gate_up halves", []*pb.NodeProto{n("MatMul", []string{"x", "wgu"}, "gu"), graph.NewNode("Split", "", "split", []string{"gu", "halves"}, []string{"g", "u"}, graph.IntAttr("axis", -1)),
			n("Sigmoid", []string{"g"}, "sg"), n("Mul", []string{"g", "sg"}, "silu"), n("Mul", []string{"silu", "u"}, "a"), n("MatMul", []string{"a", "wd"}, "y")}, true},
		{"gate and up one projection", []*pb.NodeProto{n("MatMul", []string{"x", "wg"}, "g"), n("Sigmoid", []string{"g"}, "sg"),
			n("Mul", []string{"g", "sg"}, "silu"), n("Mul", []string{"silu", "g"}, "a"), n("MatMul", []string{"a", "wd"}, "y")}, false},
		{"scaled up projection", []*pb.NodeProto{n("MatMul", []string{"x", "wg"}, "g"), n("MatMul", []string{"x", "wu"}, "u0"), n("Mul", []string{"u0", "two"}, "u"),
			n("Sigmoid", []string{"g"}, "sg"), n("Mul", []string{"g", "sg"}, "silu"), n("Mul", []string{"silu", "u"}, "a"), n("MatMul", []string{"a", "wd"}, "y")}, false},
		{"down bias", with(renamed(swiglu, "d"), n("Add", []string{"d", "bias"}, "y")), false},
		{"scaled output", with(renamed(swiglu, "d"), n("Mul", []string{"d", "two"}, "y")), false},
		{"gelu MLP", []*pb.NodeProto{n("MatMul", []string{"x", "wg"}, "h"), n("Erf", []string{"h"}, "e"), n("Mul", []string{"h", "e"}, "a"), n("MatMul", []string{"a", "wd"}, "y")}, false},
		// g·σ(u)·u is silu(u)·g: SwiGLU with the projections' roles swapped,
		// as evaluation finds.
		{"sigmoid of the other projection", []*pb.NodeProto{n("MatMul", []string{"x", "wg"}, "g"), n("MatMul", []string{"x", "wu"}, "u"), n("Sigmoid", []string{"u"}, "sg"),
			n("Mul", []string{"g", "sg"}, "silu"), n("Mul", []string{"silu", "u"}, "a"), n("MatMul", []string{"a", "wd"}, "y")}, true},
		{"sigmoid of a third value", []*pb.NodeProto{n("MatMul", []string{"x", "wg"}, "g"), n("MatMul", []string{"x", "wu"}, "u"), n("MatMul", []string{"x", "wu"}, "v"), n("Sigmoid", []string{"v"}, "sg"),
			n("Mul", []string{"g", "sg"}, "silu"), n("Mul", []string{"silu", "u"}, "a"), n("MatMul", []string{"a", "wd"}, "y")}, false},
		{"silu written as a quotient", []*pb.NodeProto{n("MatMul", []string{"x", "wg"}, "g"), n("MatMul", []string{"x", "wu"}, "u"), n("Mul", []string{"g", "u"}, "gu"),
			n("Neg", []string{"g"}, "ng"), n("Exp", []string{"ng"}, "eg"), n("Add", []string{"eg", "one"}, "den"), n("Div", []string{"gu", "den"}, "a"), n("MatMul", []string{"a", "wd"}, "y")}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := tinyModel(tc.nodes, inits, "x", "y")
			c, err := newCtx(m, m.Graph())
			if err != nil {
				t.Fatal(err)
			}
			if got := c.sharedBranch("y", "x"); got != tc.want {
				t.Fatalf("sharedBranch = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestLogitsCheckFails: the numerical check compares the router_logits
// output too. Weights whose router logits are all shifted by one constant
// route, and so combine, exactly as before (a softmax does not see the
// shift), so only that comparison can refuse the block; it does, naming
// router_logits.
func TestLogitsCheckFails(t *testing.T) {
	var tc composite.Case
	for _, c := range composite.Cases() {
		if c.Name == "router logits as a model output" {
			tc = c
		}
	}
	m, err := tc.Build()
	if err != nil {
		t.Fatal(err)
	}
	corruptWeights = func(b *Block, w *moe.Weights) {
		w.RouterB = make([]float32, b.Spec.NumExperts)
		for i := range w.RouterB {
			w.RouterB[i] = 0.5
		}
	}
	defer func() { corruptWeights = nil }()
	_, err = Rewrite(m, Options{Check: true})
	if err == nil || !strings.Contains(err.Error(), "router_logits differ") {
		t.Fatalf("want the check to refuse the shifted logits, got %v", err)
	}
}
