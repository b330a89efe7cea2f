package passes

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// actElementwise are the ops an expert activation may be made of: each
// computes every output element from the same element of its inputs
// (broadcasting constants). The contrib-domain ones are what an optimizer
// fuses activations into; canonicalization usually decomposes them first.
var actElementwise = map[string]bool{
	"Add": true, "Sub": true, "Mul": true, "Div": true, "Pow": true, "Max": true, "Min": true, "Sum": true, "Mean": true,
	"Neg": true, "Abs": true, "Exp": true, "Log": true, "Sqrt": true, "Reciprocal": true, "Erf": true, "Tanh": true,
	"Relu": true, "Sigmoid": true, "Softplus": true, "Softsign": true, "Mish": true, "Elu": true, "Celu": true,
	"Selu": true, "LeakyRelu": true, "ThresholdedRelu": true, "HardSigmoid": true, "HardSwish": true, "Gelu": true,
	"Clip": true, "Where": true, "Equal": true, "Less": true, "Greater": true, "LessOrEqual": true,
	"GreaterOrEqual": true, "Not": true, "And": true, "Or": true, "Cast": true, "CastLike": true, "Sign": true,
	"Floor": true, "Ceil": true, "Round": true, "PRelu": true, "Identity": true,
	"Sin": true, "Cos": true, "Tan": true, "Asin": true, "Acos": true, "Atan": true, "Sinh": true, "Cosh": true,
	"Asinh": true, "Acosh": true, "Atanh": true,
	"com.microsoft::Gelu": true, "com.microsoft::FastGelu": true, "com.microsoft::QuickGelu": true,
	"com.microsoft::BiasGelu": true,
}

// actPassThrough only move elements around (or not at all); an activation
// is evaluated through them as through Identity, following their data
// input only.
var actPassThrough = map[string]bool{"Reshape": true, "Squeeze": true, "Unsqueeze": true, "Flatten": true, "Expand": true}

// maxActNodes bounds the size of an activation subgraph.
const maxActNodes = 256

// actGraph is the elementwise subgraph between an expert's first-layer
// output(s) and its down projection's input, ready to be evaluated.
type actGraph struct {
	ins    []string // the first-layer values it reads (one, or two)
	out    string   // the down projection's input
	nodes  []*pb.NodeProto
	consts map[string]*eval.Tensor // constant inputs, reduced to scalars
	ops    []string                // op types computing something, in topological order, each once
	// scalars are the distinct constant values it reads (candidate
	// parameters of a parametrised activation).
	scalars []float64
	dtype   pb.TensorProto_DataType // of the first-layer values in the graph
	// low is the lowest float precision among the constants.
	low pb.TensorProto_DataType
}

// opsList names the subgraph's ops for messages.
func (a *actGraph) opsList() string {
	if len(a.ops) == 0 {
		return "none"
	}
	return strings.Join(a.ops, ", ")
}

// actSubgraph extracts the subgraph computing out from ins and constants,
// refusing anything that is not elementwise, naming the ops.
func (c *ctx) actSubgraph(out string, ins []string, dtype pb.TensorProto_DataType) (*actGraph, error) {
	a := &actGraph{ins: ins, out: out, consts: map[string]*eval.Tensor{}, dtype: dtype, low: pb.TensorProto_FLOAT}
	var bad []string
	var nodes []*pb.NodeProto
	reached := map[string]bool{}
	seenV := map[string]bool{}
	seenN := map[*pb.NodeProto]bool{}
	stack := []string{out}
	for len(stack) > 0 {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if v == "" || seenV[v] {
			continue
		}
		seenV[v] = true
		if slices.Contains(ins, v) {
			reached[v] = true
			continue
		}
		if c.isConst(v) {
			if err := c.actConst(a, v); err != nil {
				return nil, err
			}
			continue
		}
		p := c.g.Producer(v)
		if p == nil {
			return nil, rejectf("the expert activation reads %q, which is neither a first-layer projection nor a constant", v)
		}
		if seenN[p] {
			continue
		}
		seenN[p] = true
		if len(seenN) > maxActNodes {
			return nil, rejectf("the expert activation between the projections has more than %d nodes", maxActNodes)
		}
		op := graph.OpKey(p)
		switch {
		case actPassThrough[op] && len(p.Input) > 0 && len(p.Output) == 1:
			nodes = append(nodes, p)
			stack = append(stack, p.Input[0])
		case actElementwise[op]:
			nodes = append(nodes, p)
			stack = append(stack, p.Input...)
		default:
			bad = append(bad, op)
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		return nil, rejectf("the expert activation is not elementwise (ops: %s)", strings.Join(slices.Compact(bad), ", "))
	}
	for _, v := range ins {
		if !reached[v] {
			return nil, rejectf("the down projection's input does not depend on first-layer value %q (an activation of %d projections reads them all)", v, len(ins))
		}
	}
	c.sortByOrder(nodes)
	for _, n := range nodes {
		cl := proto.Clone(n).(*pb.NodeProto)
		op := n.GetOpType()
		switch {
		case floatCast(n) && c.castsNonFloat(n):
			cl = graph.NewNode("Cast", "", n.GetName(), []string{n.Input[0]}, []string{n.Output[0]}, graph.IntAttr("to", int64(evalFloatType(n))))
		case actPassThrough[op] || floatCast(n):
			cl = graph.NewNode("Identity", "", n.GetName(), []string{n.Input[0]}, []string{n.Output[0]})
		}
		a.nodes = append(a.nodes, cl)
		a.scalars = append(a.scalars, attrScalars(n)...)
		if op != "Identity" && !actPassThrough[op] && !slices.Contains(a.ops, op) {
			a.ops = append(a.ops, op)
		}
	}
	slices.Sort(a.scalars)
	a.scalars = slices.Compact(a.scalars)
	return a, nil
}

// actConst records constant v of an activation subgraph as a scalar feed:
// a tensor whose elements are all equal (a broadcastable constant).
func (c *ctx) actConst(a *actGraph, v string) error {
	t, b := c.constBytes(v, 1<<16)
	if t == nil {
		return rejectf("the expert activation reads constant %q, which is too large to be a scalar", v)
	}
	dt := graph.DataType(t)
	if dt == pb.TensorProto_BOOL || dt == pb.TensorProto_INT64 || dt == pb.TensorProto_INT32 {
		ints := intsOf(t, b)
		if dt == pb.TensorProto_BOOL {
			return rejectf("the expert activation reads boolean constant %q", v)
		}
		if len(ints) == 0 || slices.Min(ints) != slices.Max(ints) {
			return rejectf("the expert activation reads constant %q, which is not one value broadcast (a per-element constant)", v)
		}
		a.consts[v] = &eval.Tensor{DType: dt, I64: []int64{ints[0]}}
		a.scalars = append(a.scalars, float64(ints[0]))
		return nil
	}
	f := c.floatsOf(t, b)
	if len(f) == 0 || slices.Min(f) != slices.Max(f) {
		return rejectf("the expert activation reads constant %q, which is not one value broadcast (a per-element constant)", v)
	}
	switch dt {
	case pb.TensorProto_DOUBLE:
		a.consts[v] = eval.NewFloat64(nil, []float64{float64(f[0])})
	case pb.TensorProto_FLOAT, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16:
		a.consts[v] = eval.NewFloat32(nil, []float32{f[0]}) // its value, rounded to dt as stored
		a.low = lowerPrecision(a.low, dt)
	default:
		return rejectf("the expert activation reads constant %q of type %s", v, dt)
	}
	if x := float64(f[0]); !math.IsNaN(x) && !math.IsInf(x, 0) {
		a.scalars = append(a.scalars, x)
	}
	return nil
}

// lowerPrecision returns the float type of the two with the larger epsilon.
func lowerPrecision(a, b pb.TensorProto_DataType) pb.TensorProto_DataType {
	if floatEps(b) > floatEps(a) {
		return b
	}
	return a
}

// floatEps is the machine epsilon of a float type (float32's for others).
func floatEps(dt pb.TensorProto_DataType) float64 {
	switch dt {
	case pb.TensorProto_FLOAT16:
		return 0x1p-10
	case pb.TensorProto_BFLOAT16:
		return 0x1p-7
	case pb.TensorProto_DOUBLE:
		return 0x1p-52
	}
	return 0x1p-23
}

// floatCast reports whether n casts between float types (Cast or
// CastLike), which the evaluation looks through.
func floatCast(n *pb.NodeProto) bool {
	switch n.GetOpType() {
	case "Cast":
		switch pb.TensorProto_DataType(graph.AttrInt(n, "to", 0)) {
		case pb.TensorProto_FLOAT, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16, pb.TensorProto_DOUBLE:
			return true
		}
	case "CastLike":
		return true // a like operand that is not a float would not be elementwise math on the probes
	}
	return false
}

// actBoolOps compute booleans (a mask that a Cast turns into 0 and 1).
var actBoolOps = map[string]bool{"Equal": true, "Less": true, "Greater": true, "LessOrEqual": true,
	"GreaterOrEqual": true, "Not": true, "And": true, "Or": true}

// castsNonFloat reports whether cast n reads a value that is no float (a
// comparison's mask): the evaluation cannot look through it as through a
// cast between float types.
func (c *ctx) castsNonFloat(n *pb.NodeProto) bool {
	if p := c.g.Producer(n.Input[0]); p != nil && actBoolOps[p.GetOpType()] {
		return true
	}
	switch c.elemType(n.Input[0]) {
	case pb.TensorProto_UNDEFINED, pb.TensorProto_FLOAT, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16, pb.TensorProto_DOUBLE:
		return false
	}
	return true
}

// evalFloatType is the type a cast to a float type computes in during the
// evaluation: float32 (which the probes are), double for a double.
func evalFloatType(n *pb.NodeProto) pb.TensorProto_DataType {
	if n.GetOpType() == "Cast" && pb.TensorProto_DataType(graph.AttrInt(n, "to", 0)) == pb.TensorProto_DOUBLE {
		return pb.TensorProto_DOUBLE
	}
	return pb.TensorProto_FLOAT
}

// run evaluates the subgraph on probe columns xs (one per input, all of one
// length) and returns the probes and the outputs. It evaluates what the
// subgraph means rather than its rounding: in float32, looking through
// casts between float types, with the constants' stored values, so that a
// float16 or bfloat16 activation is identified as precisely as a float32
// one (the fused node computes it in float32).
func (a *actGraph) run(c *ctx, xs [][]float32) ([][]float64, []float64, error) {
	n := len(xs[0])
	gp := &pb.GraphProto{Name: proto.String("activation"), Node: a.nodes,
		Output: []*pb.ValueInfoProto{{Name: proto.String(a.out)}}}
	feeds := make(map[string]*eval.Tensor, len(a.ins)+len(a.consts))
	ins := make([][]float64, len(a.ins))
	for i, v := range a.ins {
		gp.Input = append(gp.Input, &pb.ValueInfoProto{Name: proto.String(v)})
		t := eval.NewFloat32([]int{n}, slices.Clone(xs[i]))
		feeds[v] = t
		ins[i] = t.Float64s()
	}
	for v, t := range a.consts {
		gp.Input = append(gp.Input, &pb.ValueInfoProto{Name: proto.String(v)})
		feeds[v] = t
	}
	if slices.Contains(a.ins, a.out) { // no nodes: the identity
		return ins, ins[slices.Index(a.ins, a.out)], nil
	}
	res, err := eval.Run(context.Background(), c.m.WithGraph(gp), feeds, eval.Options{Threads: 1})
	if err != nil {
		return nil, nil, rejectf("the expert activation (ops: %s) could not be evaluated: %v", a.opsList(), err)
	}
	y := res[a.out]
	if y == nil || y.Len() != n {
		return nil, nil, rejectf("the expert activation (ops: %s) is not elementwise: %d probes did not give %d values", a.opsList(), n, n)
	}
	return ins, y.Float64s(), nil
}

// key describes the subgraph's computation independently of value and
// node names: ops, attributes, constants and wiring, in topological order,
// and the probe types. Two subgraphs with one key compute one function.
func (a *actGraph) key() string {
	var sb strings.Builder
	local := map[string]string{}
	for i, v := range a.ins {
		local[v] = fmt.Sprintf("i%d", i)
	}
	for v, t := range a.consts {
		local[v] = fmt.Sprintf("c%d:%v:%v", t.DType, t.Float64At(0), t.Shape)
	}
	fmt.Fprintf(&sb, "%d/%d;", a.dtype, a.low)
	for k, n := range a.nodes {
		fmt.Fprintf(&sb, "%s::%s(", n.GetDomain(), n.GetOpType())
		for _, in := range n.Input {
			sb.WriteString(local[in] + ",")
		}
		for _, at := range n.Attribute {
			b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(at)
			fmt.Fprintf(&sb, "%x,", b)
		}
		sb.WriteString(");")
		for j, o := range n.Output {
			local[o] = fmt.Sprintf("n%d.%d", k, j)
		}
	}
	sb.WriteString("->" + local[a.out])
	return sb.String()
}

// attrScalars returns the float attributes of an activation node (the
// slope of LeakyRelu, the α of Elu): candidate parameters, as constants
// are.
func attrScalars(n *pb.NodeProto) []float64 {
	var out []float64
	for _, a := range n.GetAttribute() {
		if a.GetType() == pb.AttributeProto_FLOAT {
			out = append(out, float64(a.GetF()))
		}
	}
	return out
}
