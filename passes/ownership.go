package passes

import (
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// Ownership by dataflow: which of the computations that read a block's
// input are the block's.
//
// A block owns what lies between its input and its combine and depends on
// its own router. Another branch that reads the same hidden state (another
// MoE block, a dense MLP) meets the block at most in an Add after the
// combine. Such a branch becomes the block's shared expert only when it
// is exactly a computation the fused node has, a SwiGLU MLP of the block
// input, optionally sigmoid-gated (rule sharedBranch below); otherwise the
// block ends before the Add, which stays in the graph with the branch, and
// the fused node's output feeds it.

// sharedBranch is the rule that decides whether v, the other operand of an
// Add that follows block input x0's routed sum, is absorbed as the
// block's shared expert.
//
// Pattern: v = [Mul(σ(x·g), ] down(silu(gate(x)) · up(x)) [)], through
// shape-only ops, every product in either operand order, x the block
// input through shape-only ops, each projection a MatMul/Gemm with a
// constant 2-D weight and no bias (g: one output).
//
// Condition: nothing v depends on is a selection (a TopK or ArgMax): a
// value that depends on another router's choice is another block's, never
// this one's shared expert.
//
// Replacement: none here; the block's output moves past the Add and
// sharedExpert reads the weights. A branch the pattern does not cover
// (another activation, biases, a scaled product) is left alone, which is
// always exact.
func (c *ctx) sharedBranch(v, x0 string) bool {
	for _, n := range c.backNodes(v, x0) {
		if op := n.GetOpType(); op == "TopK" || op == "ArgMax" {
			return false
		}
	}
	if m := c.dataProducer(v, "Mul"); m != nil {
		for _, o := range [][2]string{{m.Input[0], m.Input[1]}, {m.Input[1], m.Input[0]}} {
			if c.sigmoidGateOf(o[0], x0) && c.swigluMLPOf(o[1], x0) {
				return true
			}
		}
	}
	return c.swigluMLPOf(v, x0)
}

// dataProducer returns the node of type op that produces v through
// shape-only ops, or nil.
func (c *ctx) dataProducer(v, op string) *pb.NodeProto {
	p := c.producerOp(v)
	if p == nil || p.GetOpType() != op || len(p.Input) < 1 {
		return nil
	}
	if (op == "Mul" || op == "MatMul") && len(p.Input) != 2 {
		return nil
	}
	return p
}

// readsThrough reports whether v is x0 or computed from it by shape-only
// ops alone (each reading the previous value as its data input).
func (c *ctx) readsThrough(v, x0 string) bool {
	for steps := 0; steps < 32; steps++ {
		if v == x0 {
			return true
		}
		p := c.g.Producer(v)
		if p == nil || !noiseOps[p.GetOpType()] || len(p.Input) == 0 {
			return false
		}
		v = p.Input[0]
	}
	return false
}

// plainLinear returns the projection producing v (through shape-only ops):
// a MatMul/Gemm with a constant 2-D weight used whole and no bias, whose
// activation input reads x through shape-only ops; nil otherwise.
func (c *ctx) plainLinear(v, x string) *emm {
	p := c.producerOp(v)
	if p == nil || p.GetOpType() != "MatMul" && p.GetOpType() != "Gemm" || gemmBias(p) != "" {
		return nil
	}
	e := c.expertMatMul(p)
	if e == nil || e.w.sel != selNone || len(e.w.t.GetDims()) != 2 || !c.readsThrough(e.act, x) {
		return nil
	}
	return e
}

// sigmoidGateOf reports whether v is σ(x0 · g) for a weight g with one
// output (a shared expert's gate).
func (c *ctx) sigmoidGateOf(v, x0 string) bool {
	s := c.dataProducer(v, "Sigmoid")
	if s == nil {
		return false
	}
	e := c.plainLinear(s.Input[0], x0)
	if e == nil {
		return false
	}
	d := e.w.t.GetDims()
	return d[0] == 1 || d[1] == 1
}

// swigluMLPOf reports whether v is down(silu(gate(x0)) · up(x0)) with
// gate and up two different projections, or the two parts of one fused
// gate_up projection (see splitParts).
func (c *ctx) swigluMLPOf(v, x0 string) bool {
	down := c.dataProducer(v, "MatMul")
	if down == nil {
		down = c.dataProducer(v, "Gemm")
	}
	if down == nil || gemmBias(down) != "" {
		return false
	}
	e := c.expertMatMul(down)
	if e == nil || e.w.sel != selNone || len(e.w.t.GetDims()) != 2 {
		return false
	}
	m := c.dataProducer(e.act, "Mul")
	if m == nil {
		return c.evaluatedSwiGLU(e, x0)
	}
	for _, o := range [][2]string{{m.Input[0], m.Input[1]}, {m.Input[1], m.Input[0]}} {
		g, gp := c.siluOf(o[0], x0)
		u, up := c.projOf(o[1], x0)
		if g != nil && u != nil && (g.n != u.n || gp != up && gp != PartWhole && up != PartWhole) {
			return true
		}
	}
	return c.evaluatedSwiGLU(e, x0)
}

// evaluatedSwiGLU reports whether down's input is SwiGLU of one or two
// projections of x0 in any spelling: the projections are plain linears of
// x0 (plainLinear), nothing else between them and down is a matmul, and
// the activation identified by evaluation (roles) is SwiGLU without
// biases.
func (c *ctx) evaluatedSwiGLU(down *emm, x0 string) bool {
	var l1 []*emm
	for _, n := range c.backNodes(down.act, x0) {
		op := n.GetOpType()
		if op != "MatMul" && op != "Gemm" {
			continue
		}
		p := c.plainLinear(n.Output[0], x0)
		if p == nil {
			return false
		}
		l1 = append(l1, p)
	}
	if len(l1) != 1 && len(l1) != 2 {
		return false
	}
	var tmp moe.Spec
	rs, err := c.roles(l1, down, &tmp, true)
	return err == nil && tmp.Activation == moe.SwiGLU && rs.gateB == nil && rs.upB == nil && rs.downB == nil
}

// projOf returns the projection producing v and which part of its output
// v is: the whole output of a plainLinear of x0, or one of the two parts
// a fused gate_up output is split into (splitParts); nil otherwise.
func (c *ctx) projOf(v, x0 string) (*emm, int) {
	if e := c.plainLinear(v, x0); e != nil {
		return e, PartWhole
	}
	p := c.producerOp(v)
	if p == nil || p.GetOpType() != "Split" && p.GetOpType() != "Slice" {
		return nil, 0
	}
	e := c.plainLinear(p.Input[0], x0)
	if e == nil {
		return nil, 0
	}
	for _, pt := range c.splitParts(p.Input[0]) {
		if pt.v == c.through(v) || pt.v == v {
			return e, pt.part
		}
	}
	return nil, 0
}

// siluOf returns the projection p (and the part of its output, see
// projOf) when v is silu(p(x0)) = p · σ(p), the two factors in either
// order; nil otherwise.
func (c *ctx) siluOf(v, x0 string) (*emm, int) {
	m := c.dataProducer(v, "Mul")
	if m == nil {
		return nil, 0
	}
	for _, o := range [][2]string{{m.Input[0], m.Input[1]}, {m.Input[1], m.Input[0]}} {
		s := c.dataProducer(o[1], "Sigmoid")
		if s == nil || c.through(s.Input[0]) != c.through(o[0]) {
			continue
		}
		if e, part := c.projOf(o[0], x0); e != nil {
			return e, part
		}
	}
	return nil, 0
}
