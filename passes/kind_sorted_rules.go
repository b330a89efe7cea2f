package passes

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// sortedNode is one node of a sort-based block's expert pipeline, as a
// rule of sortedRules sees it: its tagged inputs' tags (t, the first; they
// agree but for the group of a Concat's parts) and the position of its first
// tagged input.
type sortedNode struct {
	n      *pb.NodeProto
	op     string
	in     []sortedTag
	t      sortedTag
	tagged int
}

// sortedRule is one recognition rule of the expert pipeline: the node it
// matches, and what reading it does (tag its outputs, record a projection,
// a group split or the combine, or refuse).
type sortedRule struct {
	name  string
	match func(r *sortedReader, x *sortedNode) bool
	apply func(r *sortedReader, x *sortedNode) error
}

// sortedRules are the expert pipeline's rules, first match wins; the last
// refuses every node the others do not explain.
var sortedRules = []sortedRule{
	{"in pair order", matchPairOrder, applyPairOrder},
	{"shape read", func(_ *sortedReader, x *sortedNode) bool { return x.op == "Shape" || x.op == "Size" }, func(*sortedReader, *sortedNode) error { return nil }},
	{"identity", func(_ *sortedReader, x *sortedNode) bool { return x.op == "Identity" || x.op == "Cast" }, applyKeepTag},
	{"unsort", matchUnsort, applyUnsort},
	{"group split", func(r *sortedReader, x *sortedNode) bool { return x.op == "Split" && r.c.splitAxis(x.n) == 0 }, applyGroupSplit},
	{"group slice", func(r *sortedReader, x *sortedNode) bool {
		return x.op == "Slice" && x.tagged == 0 && x.t.seg == -1 && r.c.rowSlice(x.n)
	}, applyGroupSlice},
	{"group concat", func(r *sortedReader, x *sortedNode) bool { return x.op == "Concat" && r.c.concatAxis(x.n) == 0 }, applyGroupConcat},
	{"projection", func(_ *sortedReader, x *sortedNode) bool { return x.op == "MatMul" || x.op == "Gemm" }, applyProjection},
	{"activation", func(_ *sortedReader, x *sortedNode) bool {
		return x.t.stage == 1 && (actElementwise[graph.OpKey(x.n)] || x.op == "Split" || x.op == "Slice")
	}, applyActivation},
	{"shared output bias", func(_ *sortedReader, x *sortedNode) bool {
		return x.t.stage == 2 && x.op == "Add" && x.t.seg == -1 && len(x.n.Input) == 2
	}, applyOutputBias},
	{"routing weights", func(_ *sortedReader, x *sortedNode) bool {
		return x.t.stage == 2 && x.op == "Mul" && len(x.n.Input) == 2
	}, applyGroupWeights},
	{"scatter back", func(_ *sortedReader, x *sortedNode) bool {
		return x.t.stage == 3 && x.t.seg == -1 && (x.op == "ScatterND" || x.op == "ScatterElements") && x.tagged == 2
	}, applyScatterBack},
	{"unexpected", func(*sortedReader, *sortedNode) bool { return true }, func(_ *sortedReader, x *sortedNode) error {
		return rejectf("unexpected %s %q in the expert pipeline of a sort-based block (stage %d)", x.op, graph.NodeLabel(x.n), x.t.stage)
	}},
}

// matchPairOrder: a value already put back in pair order, or a permutation
// of values before the down projection (refused by pairOrder).
func matchPairOrder(r *sortedReader, x *sortedNode) bool {
	return x.t.order > 0 || x.t.stage < 2 && r.c.permutes(x.n, r.sd.perm)
}

// applyPairOrder reads the node in pair order; the sum over each token's
// pairs is the combine.
func applyPairOrder(r *sortedReader, x *sortedNode) error {
	sum, err := r.c.pairOrder(x.n, x.t, x.tagged, &r.sd, r.tk, r.ri, r.s, r.set)
	if err != nil || !sum {
		return err
	}
	if r.combine != nil {
		return rejectf("the weighted expert outputs are summed over the pairs twice")
	}
	r.combine = x.n
	return nil
}

// applyKeepTag tags the outputs as the input.
func applyKeepTag(r *sortedReader, x *sortedNode) error {
	r.set(x.t, x.n.Output...)
	return nil
}

// matchUnsort: the outputs of every pair put back in pair order by the
// inverse of the sort (with top_k 1, a ScatterND of the weighted outputs
// by the permutation is the scatter back instead).
func matchUnsort(r *sortedReader, x *sortedNode) bool {
	return x.t.stage >= 2 && x.t.seg == -1 && r.c.permutes(x.n, r.sd.perm) && !(r.sd.tok == r.sd.perm && x.t.stage == 3 && x.op == "ScatterND")
}

func applyUnsort(r *sortedReader, x *sortedNode) error {
	if x.tagged != r.c.permutedInput(x.n) {
		return rejectf("%q uses the expert outputs as indices", graph.NodeLabel(x.n))
	}
	r.set(sortedTag{x.t.stage, -1, 1}, x.n.Output...)
	return nil
}

// applyGroupSplit reads the sorted pairs split into one group per expert
// by the per-expert counts.
func applyGroupSplit(r *sortedReader, x *sortedNode) error {
	n := x.n
	if x.t.seg != -1 || x.tagged != 0 || len(n.Input) < 2 || len(n.Output) != r.E {
		return rejectf("%q splits the sorted pairs into %d parts, not by the %d experts' counts", graph.NodeLabel(n), len(n.Output), r.E)
	}
	if err := r.setCounts(n.Input[1]); err != nil {
		return err
	}
	for e, o := range n.Output {
		r.set(sortedTag{x.t.stage, e, 0}, o)
		r.splitOf[o] = n.Input[0]
	}
	return nil
}

// applyGroupSlice reads one expert's rows, between the counts' running sums.
func applyGroupSlice(r *sortedReader, x *sortedNode) error {
	e, err := r.groupSliceCounts(x.n)
	if err != nil {
		return err
	}
	r.set(sortedTag{x.t.stage, e, 0}, x.n.Output...)
	r.splitOf[x.n.Output[0]] = x.n.Input[0]
	return nil
}

// applyGroupConcat reads the expert groups joined again, in expert order.
func applyGroupConcat(r *sortedReader, x *sortedNode) error {
	n := x.n
	if len(n.Input) != r.E || len(x.in) != r.E {
		return rejectf("%q joins %d parts, not the %d expert groups", graph.NodeLabel(n), len(n.Input), r.E)
	}
	for e, v := range n.Input {
		if r.tags[v].seg != e {
			return rejectf("%q joins the expert groups out of order", graph.NodeLabel(n))
		}
	}
	for _, v := range n.Input {
		r.concatOf[v] = n.Output[0]
	}
	r.set(sortedTag{x.t.stage, -1, 0}, n.Output...)
	return nil
}

// applyProjection records one expert group's first or down projection.
func applyProjection(r *sortedReader, x *sortedNode) error {
	c, n, t := r.c, x.n, x.t
	e := c.expertMatMul(n)
	if e == nil || e.act != n.Input[x.tagged] {
		return rejectf("%q multiplies expert activations by something other than a constant weight", graph.NodeLabel(n))
	}
	if t.seg < 0 {
		return rejectf("%q projects every sorted pair with one weight, not one expert's group", graph.NodeLabel(n))
	}
	if b := gemmBias(n); b != "" && (graph.AttrFloat(n, "beta", 1) != 1 || c.matmulWeight(b) == nil) {
		return rejectf("%q adds a scaled or non-constant bias inside an expert's projection", graph.NodeLabel(n))
	}
	switch t.stage {
	case 0:
		r.segs[t.seg].l1 = append(r.segs[t.seg].l1, e)
	case 1:
		r.segs[t.seg].l2 = append(r.segs[t.seg].l2, e)
	default:
		return rejectf("%q is a third projection after the expert's down projection", graph.NodeLabel(n))
	}
	r.set(sortedTag{t.stage + 1, t.seg, 0}, n.Output...)
	return nil
}

// applyActivation reads one node of the expert activation: elementwise
// with constants, or the halves of a fused gate_up cut along the last axis.
func applyActivation(r *sortedReader, x *sortedNode) error {
	c, n := r.c, x.n
	if x.op == "Split" || x.op == "Slice" {
		if x.tagged != 0 || !c.lastAxisOnly(n) {
			return rejectf("%q cuts expert activations along an axis other than the last", graph.NodeLabel(n))
		}
		if x.op == "Split" && len(n.Input) > 1 && n.Input[1] != "" {
			if sz := c.constInts(n.Input[1]); len(sz) != 2 || sz[0] != sz[1] {
				return rejectf("%q cuts expert activations into parts other than two equal halves", graph.NodeLabel(n))
			}
		}
	} else {
		for i, v := range n.Input {
			if _, ok := r.tags[v]; !ok && v != "" && !c.isConst(v) {
				return rejectf("%q combines expert activations with the non-constant %q", graph.NodeLabel(n), n.Input[i])
			}
		}
	}
	r.set(x.t, n.Output...)
	return nil
}

// applyOutputBias reads a constant bias shared by every expert (read by
// roles).
func applyOutputBias(r *sortedReader, x *sortedNode) error {
	other := x.n.Input[1-x.tagged]
	if !r.c.isConst(other) {
		return rejectf("%q adds the non-constant %q to the experts' outputs", graph.NodeLabel(x.n), other)
	}
	r.set(x.t, x.n.Output...)
	return nil
}

// applyGroupWeights reads the experts' outputs weighted by the sorted
// routing weights of their group.
func applyGroupWeights(r *sortedReader, x *sortedNode) error {
	other := r.c.through(x.n.Input[1-x.tagged])
	if g, ok := r.gateSeg[other]; !ok || g != x.t.seg {
		return rejectf("%q weights the experts' outputs by something other than the sorted routing weights", graph.NodeLabel(x.n))
	}
	r.set(sortedTag{3, x.t.seg, 0}, x.n.Output...)
	return nil
}

// applyScatterBack records the additive scatter of the weighted outputs
// back to token order (checked by checkCombine).
func applyScatterBack(r *sortedReader, x *sortedNode) error {
	if r.scatter != nil {
		return rejectf("the weighted expert outputs are scattered twice")
	}
	r.scatter = x.n
	return nil
}
