package canon

import (
	"math"

	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// SpelledSigmoid turns an elementwise subgraph of one value that computes
// the logistic sigmoid into Sigmoid of that value, whatever its spelling:
// 1/(1+Exp(-x)), Exp(x)/(1+Exp(x)), 0.5·(1+Tanh(x/2)), a Sigmoid times one.
// What the subgraph computes is decided by evaluating it on probe values,
// not by its ops: the region is the node's backward closure through
// elementwise float ops whose other inputs are scalar constants, cut at
// one value (the widest region first, then each narrower one), and it is a
// sigmoid when its outputs agree with 1/(1+e^-x), within a few roundings of
// the value's float type (float32, float16, bfloat16), on
// every probe. Matchers that read a router's or a shared-expert gate's
// Sigmoid (a sigmoid router's correction bias, a gated shared expert) then
// read a spelled one too; the numerical check compares the fused block
// with the graph as it was written.
var SpelledSigmoid = Rule{
	Name: "spelled-sigmoid",
	Ops:  []string{"Div", "Reciprocal", "Mul", "Add", "Sub", "Exp"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if n.GetDomain() != "" || len(n.Output) != 1 {
			return false, nil
		}
		for _, leaf := range sigmoidLeaves(w, n) {
			nodes, ok := elementwiseRegion(w, n, leaf)
			if ok && isSigmoid(w, nodes, leaf, n.Output[0]) {
				w.Replace(n, w.Node("Sigmoid", "", n.GetName()+"/sigmoid", []string{leaf}, []string{n.Output[0]}))
				return true, nil
			}
		}
		return false, nil
	},
}

// sigmoidSpellOps are the ops a spelled sigmoid's region may hold.
var sigmoidSpellOps = map[string]bool{"Neg": true, "Exp": true, "Add": true, "Sub": true, "Mul": true, "Div": true,
	"Reciprocal": true, "Tanh": true, "Softplus": true, "Log": true, "Sigmoid": true, "Identity": true}

// maxSpellRegion bounds a spelled activation's region (nodes).
const maxSpellRegion = 12

// sigmoidLeaves lists the values a sigmoid region ending at n may start
// from: the single outside input of the widest region (when it has one),
// then the values inside it, farthest first; none when the widest region
// has no transcendental op (a rational function of x is no sigmoid).
func sigmoidLeaves(w *Work, n *pb.NodeProto) []string {
	nodes, leaves := spellClosure(w, n, "")
	if len(nodes) < 2 {
		return nil
	}
	transcendental := false
	for _, p := range nodes {
		switch p.GetOpType() {
		case "Exp", "Tanh", "Softplus", "Sigmoid":
			transcendental = true
		}
	}
	if !transcendental {
		return nil
	}
	var out []string
	if len(leaves) == 1 {
		out = append(out, leaves[0])
	}
	for i := len(nodes) - 1; i > 0; i-- { // nodes[0] is n; later nodes lie farther back
		out = append(out, nodes[i].Output[0])
	}
	return out
}

// elementwiseRegion returns the nodes from leaf to n (n first) when every
// input outside them is leaf or a scalar constant.
func elementwiseRegion(w *Work, n *pb.NodeProto, leaf string) ([]*pb.NodeProto, bool) {
	nodes, leaves := spellClosure(w, n, leaf)
	return nodes, len(leaves) == 1 && leaves[0] == leaf
}

// spellClosure walks back from n through sigmoidSpellOps nodes of one
// output, stopping at stop, at scalar constants and at anything else (a
// leaf); it returns the nodes (n first, breadth first) and the distinct
// leaves.
func spellClosure(w *Work, n *pb.NodeProto, stop string) ([]*pb.NodeProto, []string) {
	nodes := []*pb.NodeProto{n}
	seen := map[*pb.NodeProto]bool{n: true}
	var leaves []string
	leaf := map[string]bool{}
	for i := 0; i < len(nodes); i++ {
		for _, in := range nodes[i].Input {
			if in == "" {
				continue
			}
			if _, ok := w.ConstScalar(in); ok && in != stop {
				continue
			}
			p := w.Producer(in)
			if in != stop && p != nil && !seen[p] && p.GetDomain() == "" && sigmoidSpellOps[p.GetOpType()] &&
				len(p.Output) == 1 && len(nodes) < maxSpellRegion {
				seen[p] = true
				nodes = append(nodes, p)
				continue
			}
			if p != nil && seen[p] && in != stop {
				continue
			}
			if !leaf[in] {
				leaf[in] = true
				leaves = append(leaves, in)
			}
		}
	}
	return nodes, leaves
}

// sigmoidProbes are the inputs a region is evaluated on: 0, both signs of
// magnitudes from tiny to saturating.
var sigmoidProbes = func() []float32 {
	out := []float32{0}
	for _, m := range []float32{1e-6, 1e-3, 0.1, 0.5, 1, 1.5, 2, 3, 4, 6, 8, 12, 17, 25, 40} {
		out = append(out, m, -m)
	}
	return out
}()

// isSigmoid evaluates nodes (leaf to out) on sigmoidProbes, as the leaf's
// float type holds them, and reports whether out is 1/(1+e^-x) within a
// few roundings of that type.
func isSigmoid(w *Work, nodes []*pb.NodeProto, leaf, out string) bool {
	dt := pb.TensorProto_DataType(w.ElemType(leaf))
	tol := 4e-6 // float32: a few roundings
	switch dt {
	case pb.TensorProto_FLOAT:
	case pb.TensorProto_FLOAT16:
		tol = 4.0 / 2048
	case pb.TensorProto_BFLOAT16:
		tol = 4.0 / 256
	default:
		return false
	}
	probe := eval.NewFloatAs(dt, []int{len(sigmoidProbes)}, sigmoidProbes)
	feeds := map[string]*eval.Tensor{leaf: probe}
	for _, n := range nodes {
		for _, in := range n.Input {
			if c, ok := w.Const(in); ok && in != leaf {
				feeds[in] = c
			}
		}
	}
	res, err := evalNodes(nodes, feeds, []string{out}, w.Opset())
	if err != nil || res[0].Len() != len(sigmoidProbes) {
		return false
	}
	y := res[0].Float64s()
	for i, x := range probe.Float64s() { // the probes as the leaf's type holds them
		want := 1 / (1 + math.Exp(-x))
		if d := math.Abs(y[i] - want); !(d <= tol/4+tol*want) {
			return false
		}
	}
	return true
}
