package lowering

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// decomposition names the values of a fused node's canonical function body
// (moe.Function) that a lowering reuses: the router's outputs and the shared
// expert's output. Taking them from the body, instead of building the router
// again, keeps one definition of the routing semantics (moe/body.go).
type decomposition struct {
	body *pb.FunctionProto
	// x2 is the block input reshaped to [T, H].
	x2 string
	// ids and weights are the selected experts (int64 [T, k]) and their
	// weights (float [T, k]) with every routing rule folded in.
	ids, weights string
	// shared is the shared expert's output [T, H] (gate applied), "" if none.
	shared string
	// logits is the router Gemm's output [T, E], the fused node's
	// optional router_logits output.
	logits string
}

// decompose builds the fused node's body and locates the values a lowering
// needs in it. The body's routing matrix is ScatterElements(Mul(logits, 0),
// ids, weights), with logits the router Gemm; the shared expert's output is
// the second operand of the Add before the final Reshape (followed, with a
// half-precision io_type, by the Cast to it).
func decompose(s *moe.Spec, opset int64) (*decomposition, error) {
	f, err := moe.Function(s, opset)
	if err != nil {
		return nil, err
	}
	prod := map[string]*pb.NodeProto{}
	for _, n := range f.Node {
		for _, o := range n.Output {
			prod[o] = n
		}
	}
	d := &decomposition{body: f}
	var logits string
	for _, n := range f.Node {
		if n.GetOpType() == "Gemm" {
			logits, d.x2 = n.Output[0], n.Input[0]
			break
		}
	}
	d.logits = logits
	for _, n := range f.Node {
		if n.GetOpType() != "ScatterElements" || len(n.Input) != 3 {
			continue
		}
		if p := prod[n.Input[0]]; p != nil && p.GetOpType() == "Mul" && p.Input[0] == logits {
			d.ids, d.weights = n.Input[1], n.Input[2]
			break
		}
	}
	if s.SharedInter > 0 && len(f.Node) > 0 {
		last := f.Node[len(f.Node)-1]
		if last.GetOpType() == "Cast" && s.IOType != "" && len(f.Node) > 1 { // half-precision I/O: cast after the reshape
			last = f.Node[len(f.Node)-2]
		}
		if last.GetOpType() == "Reshape" {
			if add := prod[last.Input[0]]; add != nil && add.GetOpType() == "Add" {
				d.shared = add.Input[1]
			}
		}
	}
	if logits == "" || d.ids == "" || (s.SharedInter > 0 && d.shared == "") {
		return nil, fmt.Errorf("the ai.mok::MoE function body (%s) does not have the shape the lowering expects (router Gemm, routing ScatterElements, shared Add); lowering/extract.go must follow moe/body.go", s.Variant())
	}
	return d, nil
}

// extract copies the body nodes needed to compute outs into the main graph:
// formal inputs become the fused node's actual inputs (actual[i] for
// moe.InputNames[i]), every value the body defines is renamed with prefix
// (rename overrides that for chosen values), and nodes are named after
// prefix. It returns the new nodes in body order.
func (d *decomposition) extract(actual []string, prefix string, rename map[string]string, outs ...string) ([]*pb.NodeProto, error) {
	prod := map[string]int{}
	for i, n := range d.body.Node {
		for _, o := range n.Output {
			prod[o] = i
		}
	}
	formal := map[string]string{}
	for i, name := range moe.InputNames {
		a := ""
		if i < len(actual) {
			a = actual[i]
		}
		formal[name] = a
	}
	need := make([]bool, len(d.body.Node))
	stack := append([]string(nil), outs...)
	for len(stack) > 0 {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		i, ok := prod[v]
		if !ok || need[i] {
			continue
		}
		need[i] = true
		stack = append(stack, d.body.Node[i].Input...)
	}
	name := func(v string) (string, error) {
		if v == "" {
			return "", nil
		}
		if a, ok := formal[v]; ok {
			if a == "" {
				return "", fmt.Errorf("the fused node's %s input is absent but its body reads it", v)
			}
			return a, nil
		}
		if r, ok := rename[v]; ok {
			return r, nil
		}
		return prefix + "/" + v, nil
	}
	var nodes []*pb.NodeProto
	for i, n := range d.body.Node {
		if !need[i] {
			continue
		}
		c := proto.Clone(n).(*pb.NodeProto)
		var err error
		for j, in := range c.Input {
			if c.Input[j], err = name(in); err != nil {
				return nil, err
			}
		}
		for j, o := range c.Output {
			if c.Output[j], err = name(o); err != nil {
				return nil, err
			}
		}
		c.Name = proto.String(fmt.Sprintf("%s/%s_%d", prefix, c.GetOpType(), i))
		nodes = append(nodes, c)
	}
	return nodes, nil
}

// actualInputs returns the fused node's inputs padded to moe.NumInputs.
func actualInputs(n *pb.NodeProto) []string {
	a := make([]string, moe.NumInputs)
	copy(a, n.Input)
	return a
}

// nodeDims returns a function from fused-node input position to the dims of
// the initializer it reads (nil when absent or not an initializer).
func nodeDims(g *graph.Graph, n *pb.NodeProto) func(pos int) []int64 {
	return moe.InitializerDims(g, n)
}
