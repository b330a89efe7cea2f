package passes

import (
	"math"
	"slices"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// elemType returns v's element type: declared, an initializer's, or
// followed back through shape ops and ops whose result has their first
// input's type to a Cast or a declared value; UNDEFINED when it cannot be
// told.
func (c *ctx) elemType(v string) pb.TensorProto_DataType {
	c.declare()
	for steps := 0; steps < 64; steps++ {
		if t, ok := c.types[v]; ok {
			return t
		}
		if t := c.g.Initializer(v); t != nil {
			return graph.DataType(t)
		}
		p := c.g.Producer(v)
		if p == nil || len(p.Input) == 0 {
			break
		}
		switch p.GetOpType() {
		case "Cast":
			return pb.TensorProto_DataType(graph.AttrInt(p, "to", 0))
		case "Reshape", "Squeeze", "Unsqueeze", "Identity", "Flatten", "Expand", "Transpose":
			v = p.Input[0]
		case "TopK":
			if len(p.Output) > 1 && v == p.Output[1] {
				return pb.TensorProto_INT64
			}
			v = p.Input[0]
		case "ArgMax", "ArgMin":
			return pb.TensorProto_INT64
		case "ReduceSum", "Mul", "Add", "Sub", "Div", "MatMul", "Gemm", "Sigmoid", "Softmax", "Neg", "Concat", "GatherND", "ScatterND", "ScatterElements",
			"Gather", "GatherElements", "Slice", "Exp", "Reciprocal", "ReduceMax", "Max", "Min", "Clip", "LogSoftmax", "Tanh", "Abs":
			// the result has the type of the first input (ONNX's type
			// constraint T): an export without value_info (TorchScript, a
			// generated model) still tells a half-precision sum
			v = p.Input[0]
		default:
			return pb.TensorProto_UNDEFINED
		}
	}
	return pb.TensorProto_UNDEFINED
}

// castsBackTo reports whether Cast n turns a block's result back into the
// half-precision type of its input x0: an export of a float16 or bfloat16
// model that combines the experts' outputs in float32 and casts the sum
// back, which the fused node (cast in, float32 compute, cast out) does too.
func (c *ctx) castsBackTo(n *pb.NodeProto, x0 string) bool {
	in := c.elemType(x0)
	if in != pb.TensorProto_FLOAT16 && in != pb.TensorProto_BFLOAT16 {
		return false
	}
	return pb.TensorProto_DataType(graph.AttrInt(n, "to", 0)) == in && c.elemType(n.Input[0]) == pb.TensorProto_FLOAT
}

// upcasts reports whether Cast n turns a float16 or bfloat16 value into
// float32, which is exact (an export summing half-precision expert outputs
// in float32).
func (c *ctx) upcasts(n *pb.NodeProto) bool {
	in := c.elemType(n.Input[0])
	return (in == pb.TensorProto_FLOAT16 || in == pb.TensorProto_BFLOAT16) && pb.TensorProto_DataType(graph.AttrInt(n, "to", 0)) == pb.TensorProto_FLOAT
}

// setIOType records a block's I/O element type in its spec: the type the
// graph declares (or its casts and shape ops tell) for the block's input
// or output, else that of the router weight (a half-precision export
// stores half-precision weights). Types other than float32, float16 and
// bfloat16 refuse the block, and so does an input and output of two
// different types (the fused node's output has its input's type); the
// error says why.
func (c *ctx) setIOType(b *Block) error {
	c.outputBeforeReshape(b)
	in, out := c.elemType(b.Input), c.elemType(b.Output)
	if in != pb.TensorProto_UNDEFINED && out != pb.TensorProto_UNDEFINED && in != out && !c.outputBeforeCast(b, in) {
		return rejectf("block input %q is %s but its output %q is %s: the fused node's output has its input's type", b.Input, in, b.Output, out)
	}
	dt := in
	if dt == pb.TensorProto_UNDEFINED {
		dt = out
	}
	if dt == pb.TensorProto_UNDEFINED && b.W != nil && b.W.Router.Init != nil {
		dt = graph.DataType(b.W.Router.Init)
	}
	if dt == pb.TensorProto_UNDEFINED {
		dt = pb.TensorProto_FLOAT
	}
	io, ok := moe.IOTypeOf(dt)
	if !ok {
		return rejectf("block input %q has type %s; fused blocks take float32, float16 or bfloat16", b.Input, dt)
	}
	b.Spec.IOType = io
	return nil
}

// weightHalfType returns the half type (float16 or bfloat16) block b's
// weights are stored in, the coarser one (bfloat16) when they mix both
// (graph.CoarserHalf, as verify judges a model), or false when there is
// none.
func weightHalfType(b *Block) (pb.TensorProto_DataType, bool) {
	if b.W == nil {
		return 0, false
	}
	found := pb.TensorProto_UNDEFINED
	for _, t := range b.W.Inits() {
		found = graph.CoarserHalf(found, graph.DataType(t))
	}
	return found, found != pb.TensorProto_UNDEFINED
}

// computeType is the precision block b's original graph computes in: out
// (the output's element type) when that is a half type, else the half
// type its weights are stored in (a float16 conversion that keeps float32
// I/O casts inside the block), else out.
func computeType(b *Block, out pb.TensorProto_DataType) pb.TensorProto_DataType {
	if _, half := eval.HalfTolerance(out); !half {
		if dt, ok := weightHalfType(b); ok {
			return dt
		}
	}
	return out
}

// sourceType is Provenance.SourceType for block b: its weights' half
// type, or "".
func sourceType(b *Block) string {
	dt, ok := weightHalfType(b)
	if !ok {
		return ""
	}
	io, _ := moe.IOTypeOf(dt)
	return io
}

// outputBeforeCast ends block b before the Cast that produces its output
// when that Cast's input has the block input's type in (a float16
// conversion that casts the block's result back to float32), and reports
// whether it did: the fused node writes the Cast's input and the Cast
// stays, out of the region.
func (c *ctx) outputBeforeCast(b *Block, in pb.TensorProto_DataType) bool {
	p := c.g.Producer(b.Output)
	if p == nil || p.GetOpType() != "Cast" || len(p.Input) != 1 || c.elemType(p.Input[0]) != in {
		return false
	}
	if !b.dropFromRegion(p) {
		return false
	}
	b.Output = p.Input[0]
	return true
}

// dropFromRegion takes node p out of b's region (it stays in the graph,
// reading the fused node's output), and reports whether p was in it.
func (b *Block) dropFromRegion(p *pb.NodeProto) bool {
	i := slices.Index(b.Region, p)
	if i < 0 {
		return false
	}
	b.Region = slices.Delete(slices.Clone(b.Region), i, i+1)
	if len(b.regionPos) == len(b.Region)+1 {
		b.regionPos = slices.Delete(slices.Clone(b.regionPos), i, i+1)
	} else {
		b.regionPos = nil
	}
	b.Nodes = len(b.Region)
	return true
}

// outputBeforeReshape moves b's output back past the shape ops that end its
// region (Reshape, Flatten, Squeeze, Unsqueeze, Identity) when the block's
// input and output have different ranks and a value on that chain has the
// input's: the fused node, whose output has its input's shape, then writes
// that value and the shape ops stay, out of the region, restoring the
// output's shape (a block that flattens [B, S, H] to [B·S, H] and reshapes
// its result back, fed the flattened tokens of a previous block).
func (c *ctx) outputBeforeReshape(b *Block) {
	ri, ro := c.rankInfer(b.Input), c.rankInfer(b.Output)
	if ri < 0 || ro < 0 || ri == ro {
		return
	}
	var chain []*pb.NodeProto
	for v := b.Output; ; {
		p := c.g.Producer(v)
		switch {
		case p == nil || len(p.Input) == 0 || !slices.Contains(b.Region, p):
			return
		case !noiseOps[p.GetOpType()] || p.GetOpType() == "Cast": // shape ops only
			return
		}
		chain = append(chain, p)
		v = p.Input[0]
		if c.rankInfer(v) == ri {
			for _, n := range chain {
				b.dropFromRegion(n)
			}
			b.Output = v
			return
		}
	}
}

// checkTolerance is the numerical check's tolerance for a block whose
// output has element type dt: float32 uses CheckTolerance; half-precision
// outputs, which round every intermediate value of the original graph,
// compare with a tolerance scaled to the output's magnitude and skip the
// tokens whose routing is a near-tie at that precision (halfTokens, nearTie).
func checkTolerance(dt pb.TensorProto_DataType, peak float64) (rtol, atol float64, halfTokens bool) {
	if rel, ok := eval.HalfTolerance(dt); ok {
		return rel, rel * peak, true
	}
	return CheckTolerance.RTol, CheckTolerance.ATol, false
}

// tokensOff counts the tokens (rows of H values) with an element past the
// tolerance, skipping those skip says may differ, and returns the worst
// excess among the counted ones and its element.
func tokensOff(got, want []float32, H int, rtol, atol float64, skip func(token int) bool) (off int, worst float64, at int) {
	at = -1
	for t := 0; t*H < len(want); t++ {
		if skip != nil && skip(t) {
			continue
		}
		bad := false
		for j := t * H; j < (t+1)*H && j < len(want); j++ {
			d := math.Abs(float64(got[j]) - float64(want[j]))
			if !(d <= atol+rtol*math.Abs(float64(want[j]))) { // a NaN is off
				if math.IsNaN(d) {
					d = math.Inf(1)
				}
				bad = true
				if d > worst {
					worst, at = d, j
				}
			}
		}
		if bad {
			off++
		}
	}
	return off, worst, at
}

// rankOf returns the rank of v from the graph's declared types, or -1.
func (c *ctx) rankOf(v string) int {
	c.declare()
	if r, ok := c.ranks[v]; ok {
		return r
	}
	return -1
}

// declare reads, once, the ranks and element types the graph declares for
// its inputs, outputs and value_info.
func (c *ctx) declare() {
	if c.ranks != nil {
		return
	}
	gp := c.g.P
	n := len(gp.Input) + len(gp.Output) + len(gp.ValueInfo)
	c.ranks, c.types = make(map[string]int, n), make(map[string]pb.TensorProto_DataType, n)
	for _, list := range [][]*pb.ValueInfoProto{gp.Input, gp.Output, gp.ValueInfo} {
		for _, vi := range list {
			tt := vi.GetType().GetTensorType()
			if tt == nil {
				continue
			}
			if sh := tt.GetShape(); sh != nil {
				c.ranks[vi.GetName()] = len(sh.Dim)
			}
			if et := pb.TensorProto_DataType(tt.GetElemType()); et != pb.TensorProto_UNDEFINED {
				c.types[vi.GetName()] = et
			}
		}
	}
}
