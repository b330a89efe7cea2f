package passes

import (
	"fmt"
	"slices"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// Dynamically quantized blocks (onnxruntime.quantization.quantize_dynamic
// and the like) compute their router and expert linears as
// DynamicQuantizeLinear + MatMulInteger (or a fused contrib form) and a
// scale Mul. mokopt fuses float blocks: the fused node's weights are float
// and the MoK kernel quantizes routed experts itself, so a quantized block
// is refused with a near-miss naming the quantized linear and saying so.

// quantizedLinearOps are the integer linears of quantized models.
var quantizedLinearOps = map[string]bool{"MatMulInteger": true, "QLinearMatMul": true, "MatMulIntegerToFloat": true,
	"DynamicQuantizeMatMul": true, "QGemm": true}

// quantFinding is what refuseQuantized found around one selection.
type quantFinding struct {
	router  *pb.NodeProto   // the quantized router linear, or nil
	experts []*pb.NodeProto // quantized linears the selection reaches
	linears []*pb.NodeProto // float weight linears the selection reaches
}

// quantizedLinears returns, by position, whether a node is an integer
// linear with a constant weight, or a float linear whose weight is an
// integer constant dequantized (the QDQ form static quantization writes);
// nil when the graph has none.
func (c *ctx) quantizedLinears() []bool {
	var at []bool
	for p, n := range c.topo {
		if op := n.GetOpType(); (op == "MatMul" || op == "Gemm") && c.dequantizedWeight(n) != nil {
			if at == nil {
				at = make([]bool, len(c.topo))
			}
			at[p] = true
			continue
		}
		if !quantizedLinearOps[n.GetOpType()] || len(n.Input) < 2 {
			continue
		}
		w := 1 // MatMulInteger(A, B, ...), MatMulIntegerToFloat(A, B, ...), DynamicQuantizeMatMul(A, B, ...)
		if n.GetOpType() == "QLinearMatMul" || n.GetOpType() == "QGemm" {
			w = 3 // (a, a_scale, a_zero, b, ...)
		}
		if w >= len(n.Input) || !c.isConst(n.Input[w]) && !c.isConst(n.Input[0]) {
			continue
		}
		if at == nil {
			at = make([]bool, len(c.topo))
		}
		at[p] = true
	}
	return at
}

// combineOps are where exporters combine the experts' outputs (scatter
// back to token rows, sum over experts): a selection's forward walk stops
// there, so that linears after the block are not taken for its experts.
var combineOps = map[string]bool{"ScatterND": true, "ScatterElements": true, "Scatter": true, "ReduceSum": true}

// quantWalkBudget bounds the nodes one selection's forward walk visits, so
// that a model of many quantized blocks stays linear in its size.
const quantWalkBudget = 4096

// quantizedAround finds the quantized linears of the block a TopK selects:
// its router (walking back over the score transforms) and the linears its
// indices and weights reach before any float weight linear.
//
// An ArgMax selection (through is true) is followed past combining ops too:
// top-1 routers such as the sparsemixer mask their scores with a scatter
// before any expert reads the choice.
func (c *ctx) quantizedAround(tk *pb.NodeProto, qat []bool, through bool) quantFinding {
	var f quantFinding
	f.router = c.quantizedRouter(tk, qat)
	seen := map[*pb.NodeProto]bool{}
	queue := slices.Clone(tk.Output)
	visited := 0
	for len(queue) > 0 && visited < quantWalkBudget {
		v := queue[0]
		queue = queue[1:]
		for _, n := range c.g.Consumers(v) {
			if seen[n] {
				continue
			}
			seen[n] = true
			visited++
			if p, ok := c.posOf(n); ok && qat[p] {
				f.experts = append(f.experts, n)
				continue // do not walk past an expert linear
			}
			op := n.GetOpType()
			if combineOps[op] && !through {
				continue // the experts' outputs are combined: the block ends here
			}
			if op == "TopK" {
				continue // another block's router
			}
			if op == "MatMul" || op == "Gemm" {
				// a float weight linear: the weight on either side (a
				// batched form multiplies gathered [.., I, H] slices by
				// the tokens)
				if slices.ContainsFunc(n.Input[:min(2, len(n.Input))], c.storedWeight) {
					f.linears = append(f.linears, n)
					continue
				}
				if len(n.Input) < 2 || c.isConst(n.Input[1]) || c.weightBehind(n.Input[1]) {
					continue
				}
			}
			queue = append(queue, n.Output...)
		}
	}
	return f
}

// dequantizedWeight returns the DequantizeLinear that gives float linear n
// one of its operands from an integer constant, or from a QuantizeLinear
// of a float value (through transposes, reshapes, casts, and the gathers
// of per-expert slices), or nil.
func (c *ctx) dequantizedWeight(n *pb.NodeProto) *pb.NodeProto {
	var pair *pb.NodeProto
	for _, v := range n.Input[:min(2, len(n.Input))] {
		dq := c.dequantizedAt(v)
		if dq == nil {
			continue
		}
		if t := c.g.Initializer(dq.Input[0]); t != nil {
			return dq // an integer weight: the operand to name
		}
		if pair == nil {
			pair = dq
		}
	}
	return pair
}

// dequantizedAt returns the DequantizeLinear behind v (see
// dequantizedWeight), or nil.
func (c *ctx) dequantizedAt(v string) *pb.NodeProto {
	for range 6 {
		p := c.g.Producer(v)
		if p == nil || len(p.Input) == 0 {
			return nil
		}
		switch p.GetOpType() {
		case "DequantizeLinear":
			if t := c.g.Initializer(p.Input[0]); t != nil && isIntegerType(graph.DataType(t)) {
				return p
			}
			if q := c.g.Producer(p.Input[0]); q != nil && q.GetOpType() == "QuantizeLinear" {
				return p // an operand rounded to integers and back
			}
			return nil
		default:
			if !weightViewOps[p.GetOpType()] {
				return nil
			}
			v = p.Input[0]
		}
	}
	return nil
}

// weightViewOps are the ops through which a linear reads a view of a
// stored weight: transposed, cast, reshaped, or one expert's (Gather) or
// each token's (GatherND) slice of stacked weights.
var weightViewOps = map[string]bool{"Transpose": true, "Cast": true, "Identity": true, "Reshape": true, "Squeeze": true,
	"Unsqueeze": true, "Gather": true, "GatherND": true}

// isIntegerType reports whether dt is an integer element type (what
// quantized weights are stored as).
func isIntegerType(dt pb.TensorProto_DataType) bool {
	switch dt {
	case pb.TensorProto_INT8, pb.TensorProto_UINT8, pb.TensorProto_INT16, pb.TensorProto_UINT16,
		pb.TensorProto_INT4, pb.TensorProto_UINT4, pb.TensorProto_INT32:
		return true
	}
	return false
}

// quantizedRouter returns the router linear of selection tk when it is
// quantized (qat marks it), or nil.
func (c *ctx) quantizedRouter(tk *pb.NodeProto, qat []bool) *pb.NodeProto {
	r := c.routerLinear(tk.Input[0])
	if r == nil {
		return nil
	}
	if p, ok := c.posOf(r); ok && qat[p] {
		return r
	}
	return nil
}

// storedWeight reports whether v is a linear's weight read from an
// initializer: through transposes, casts, reshapes, a dequantization, or a
// Gather of one expert's slice from stacked weights (by a computed index,
// as traces of loops over the hit experts write it), or a GatherND of
// per-token slices of them (the batched form).
func (c *ctx) storedWeight(v string) bool {
	for range 6 {
		if c.isConst(v) {
			return true
		}
		p := c.g.Producer(v)
		if p == nil || len(p.Input) == 0 {
			return false
		}
		if op := p.GetOpType(); op != "DequantizeLinear" && !weightViewOps[op] {
			return false
		}
		v = p.Input[0]
	}
	return false
}

// refuseQuantized reports every routed block with quantized router or
// expert linears as a near-miss (replacing what detection said of it). A
// block's selection is a TopK, or an ArgMax (sparsemixer and other top-1
// routers) whose choice reaches weight linears: an ArgMax that only yields
// the model's answer (a classifier head) is no MoE selection.
func (c *ctx) refuseQuantized(det *Detection) {
	qat := c.quantizedLinears()
	if qat == nil {
		return
	}
	found := map[*pb.NodeProto]*Block{}
	reported := map[*pb.NodeProto]bool{} // quantized expert linears named by a refusal
	for _, b := range det.Blocks {
		if b.TopK != nil {
			found[b.TopK] = b
		}
	}
	for _, tk := range c.topo {
		argMax := tk.GetOpType() == "ArgMax"
		if tk.GetDomain() != "" || len(tk.Input) < 1 || !argMax && (tk.GetOpType() != "TopK" || len(tk.Output) < 2) {
			continue
		}
		var f quantFinding
		if b := found[tk]; b != nil {
			// a float block was read: refuse it only if its own region
			// computes with integer linears (its router or experts)
			f.router = c.quantizedRouter(tk, qat)
			for _, n := range b.Region {
				if p, ok := c.posOf(n); ok && qat[p] && n != f.router {
					f.experts = append(f.experts, n)
				}
			}
		} else {
			f = c.quantizedAround(tk, qat, argMax)
			if argMax && len(f.experts) == 0 && len(f.linears) == 0 {
				continue // the choice feeds no linear: not an MoE selection
			}
		}
		if f.router == nil && len(f.experts) == 0 {
			continue
		}
		if f.router == nil && !slices.ContainsFunc(f.experts, func(n *pb.NodeProto) bool { return !reported[n] }) {
			continue // a second selection of a block reported already (sparsemixer's second ArgMax)
		}
		for _, n := range f.experts {
			reported[n] = true
		}
		// the float linears are the block's too: what was said of them
		// (no router found for them, say) gives way to this refusal
		nodes := append(slices.Clone(f.experts), f.linears...)
		if f.router != nil {
			nodes = append(nodes, f.router)
		}
		refuseClass(det, []*pb.NodeProto{tk}, nodes, NearMiss{Node: graph.NodeLabel(tk), Reason: c.quantReason(f), Class: ClassQuantized})
	}
}

// quantReason says which linears are quantized and why mokopt refuses.
func (c *ctx) quantReason(f quantFinding) string {
	var parts []string
	if f.router != nil {
		parts = append(parts, "its router linear is "+c.describeQuant(f.router))
	}
	if len(f.experts) > 0 {
		names := make([]string, len(f.experts))
		for i, n := range f.experts {
			names[i] = graph.NodeLabel(n)
		}
		slices.Sort(names)
		first := names[0]
		var firstNode *pb.NodeProto
		for _, n := range f.experts {
			if graph.NodeLabel(n) == first {
				firstNode = n
			}
		}
		parts = append(parts, fmt.Sprintf("%d linear(s) after its routing are integer too, e.g. %s", len(f.experts), c.describeQuant(firstNode)))
	}
	how := "quantization"
	for _, n := range append([]*pb.NodeProto{f.router}, f.experts...) {
		if n == nil || len(n.Input) == 0 {
			continue
		}
		if p := c.producerOp(n.Input[0]); n.GetOpType() == "DynamicQuantizeMatMul" || p != nil && p.GetOpType() == "DynamicQuantizeLinear" {
			how = "dynamic quantization"
		} else if !quantizedLinearOps[n.GetOpType()] && how == "quantization" {
			how = "QDQ quantization: integer weights and activations dequantized around float linears"
		}
	}
	return "int8-quantized MoE block (" + how + "): " + strings.Join(parts, "; ") +
		"; mokopt fuses float blocks only (the fused node takes float weights and the MoK kernel quantizes routed experts to MXFP8 itself): fuse the float model, then quantize what remains"
}

// describeQuant names an integer linear, its weight and the
// DynamicQuantizeLinear feeding it.
func (c *ctx) describeQuant(n *pb.NodeProto) string {
	s := fmt.Sprintf("%s %q", n.GetOpType(), graph.NodeLabel(n))
	if dq := c.dequantizedWeight(n); dq != nil && !quantizedLinearOps[n.GetOpType()] {
		if t := c.g.Initializer(dq.Input[0]); t != nil {
			return s + fmt.Sprintf(" (weight %q %s %v through DequantizeLinear %q)", t.GetName(), strings.ToLower(graph.DataType(t).String()), t.GetDims(), graph.NodeLabel(dq))
		}
		return s + fmt.Sprintf(" (an operand through QuantizeLinear and DequantizeLinear %q)", graph.NodeLabel(dq))
	}
	w := 1
	if n.GetOpType() == "QLinearMatMul" || n.GetOpType() == "QGemm" {
		w = 3
	}
	if w < len(n.Input) {
		if t := c.constTensor(n.Input[w]); t != nil {
			s += fmt.Sprintf(" (weight %q %s %v)", t.GetName(), strings.ToLower(graph.DataType(t).String()), t.GetDims())
		}
	}
	if len(n.Input) == 0 {
		return s
	}
	if p := c.producerOp(n.Input[0]); p != nil && p.GetOpType() == "DynamicQuantizeLinear" {
		s += fmt.Sprintf(" over DynamicQuantizeLinear %q", graph.NodeLabel(p))
	}
	return s
}
