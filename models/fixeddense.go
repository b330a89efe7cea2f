package models

import (
	"fmt"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// FixedMixture is how FixRouting weights the experts of a dense model.
type FixedMixture int

// The fixed mixtures FixRouting writes; none reads the hidden state.
const (
	// MixConstant weights expert e's output by a constant [E, 1, 1].
	MixConstant FixedMixture = iota
	// MixSoftmax weights them by the softmax of a constant [E] vector,
	// reshaped to [E, 1, 1].
	MixSoftmax
	// MixTable weights them by a constant per-token table [E, T, 1] (a
	// routing a trace folded); it needs the model's static token count.
	MixTable
	// MixOnInput scales each expert's copy of the input by a constant
	// [E, 1, 1] before its projections (weights on the input) and sums the
	// outputs unweighted.
	MixOnInput
)

// FixRouting replaces the routing of a one-layer model Build wrote in the
// dense shape (tokens is its Config.Tokens) by a fixed mixture of all its
// experts: no TopK and no router is left, and the weights do not depend on
// the hidden state. Such a block is no MoE block ai.mok::MoE expresses; it
// is what the detector must refuse by name.
func FixRouting(m *graph.Model, mix FixedMixture, tokens int) error {
	gp := m.Proto.Graph
	var weighted, expand *pb.NodeProto
	E := int64(0)
	for _, n := range gp.Node {
		switch {
		case strings.HasSuffix(n.Output[0], "weighted") && n.GetOpType() == "Mul":
			weighted = n
		case strings.HasSuffix(n.Output[0], "x_expand"):
			expand = n
		}
	}
	for _, t := range gp.Initializer {
		if strings.HasSuffix(t.GetName(), "mlp.w_down") {
			E = t.GetDims()[0]
		}
	}
	if weighted == nil || expand == nil || E == 0 {
		return fmt.Errorf("not a dense model Build wrote")
	}
	g := m.Graph()
	vec := func(name string, dims []int64, n int64) string {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i%int(E)+1) / float32(E*(E+1)/2)
		}
		g.AddInitializer(moe.Float32Tensor(name, dims, v))
		return name
	}
	ints := func(name string, v ...int64) string {
		g.AddInitializer(moe.Int64Tensor(name, []int64{int64(len(v))}, v))
		return name
	}
	node := func(op, out string, in []string, attrs ...*pb.AttributeProto) string {
		gp.Node = append(gp.Node, graph.NewNode(op, "", "node_"+out, in, []string{out}, attrs...))
		return out
	}
	switch mix {
	case MixConstant:
		weighted.Input[1] = vec("fixed_mixture", []int64{E, 1, 1}, E)
	case MixSoftmax:
		sm := node("Softmax", "fixed_mixture_softmax", []string{vec("fixed_mixture_logits", []int64{E}, E)}, graph.IntAttr("axis", 0))
		weighted.Input[1] = node("Reshape", "fixed_mixture", []string{sm, ints("fixed_mixture_shape", E, 1, 1)})
	case MixTable:
		if tokens <= 0 {
			return fmt.Errorf("a fixed routing table needs a static token count")
		}
		weighted.Input[1] = vec("fixed_table", []int64{E, int64(tokens), 1}, E*int64(tokens))
	case MixOnInput:
		xs := node("Mul", "x_fixed_scaled", []string{expand.Output[0], vec("fixed_mixture", []int64{E, 1, 1}, E)})
		g.Reindex()
		for _, n := range g.Consumers(expand.Output[0]) {
			if n.GetOpType() == "MatMul" {
				n.Input[0] = xs
			}
		}
		g.ReplaceAllUses(weighted.Output[0], weighted.Input[0])
	default:
		return fmt.Errorf("unknown fixed mixture %d", mix)
	}
	g.Reindex()
	g.RemoveDeadCode()
	return g.Sort()
}
