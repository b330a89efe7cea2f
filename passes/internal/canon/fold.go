package canon

import (
	"context"
	"fmt"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// foldable lists the default-domain ops FoldConstants evaluates: shape
// arithmetic and the small index computations exporters leave around it.
var foldable = map[string]bool{
	"Shape": true, "Size": true, "Gather": true, "Concat": true, "Unsqueeze": true, "Squeeze": true,
	"Slice": true, "Add": true, "Sub": true, "Mul": true, "Div": true, "Mod": true, "Neg": true, "Abs": true,
	"Cast": true, "ConstantOfShape": true, "Range": true, "Reshape": true, "Equal": true, "Less": true,
	"Greater": true, "LessOrEqual": true, "GreaterOrEqual": true, "Not": true, "And": true, "Or": true,
	"Where": true, "Expand": true, "ReduceProd": true, "ReduceSum": true, "ReduceMax": true, "ReduceMin": true,
	"Max": true, "Min": true, "Identity": true, "Floor": true, "Ceil": true, "Sqrt": true, "Transpose": true, "Flatten": true,
}

// FoldConstants evaluates a node of a foldable op whose inputs are all small
// constants (a Shape or Size needs only its input's static shape) and turns
// each output into an initializer of the same name. Outputs larger than
// the constant limit, graph outputs and ops outside the list stay.
var FoldConstants = Rule{
	Name: "fold-constants",
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if n.GetDomain() != "" || !foldable[n.GetOpType()] || len(n.Output) == 0 {
			return false, nil
		}
		for _, a := range n.Attribute {
			if a.G != nil || len(a.Graphs) > 0 {
				return false, nil
			}
		}
		for _, o := range n.Output {
			if o == "" || w.G.IsOutput(o) {
				return false, nil
			}
		}
		feeds := map[string]*eval.Tensor{}
		if op := n.GetOpType(); op == "Shape" || op == "Size" {
			if len(n.Input) != 1 {
				return false, nil
			}
			s, ok := w.StaticShape(n.Input[0])
			if !ok {
				return false, nil
			}
			// A zero tensor of that shape stands in (its elements are
			// never read), unless that would be large.
			num := int64(1)
			for _, d := range s {
				num *= d
			}
			if num > maxConstElems {
				return w.foldShape(n, s)
			}
			dims := make([]int, len(s))
			for i, d := range s {
				dims[i] = int(d)
			}
			feeds[n.Input[0]] = eval.New(pb.TensorProto_FLOAT, dims)
		} else {
			for _, in := range n.Input {
				if in == "" {
					continue
				}
				c, ok := w.Const(in)
				if !ok {
					return false, nil
				}
				feeds[in] = c
			}
		}
		outs, err := evalNodes([]*pb.NodeProto{proto.Clone(n).(*pb.NodeProto)}, feeds, n.Output, w.Opset())
		if err != nil {
			return false, nil // left for the runtime to report
		}
		for _, t := range outs {
			if t == nil || t.Len() > maxConstElems {
				return false, nil
			}
		}
		w.Replace(n)
		for i, o := range n.Output {
			if _, err := w.AddConst(o, outs[i]); err != nil {
				return false, err
			}
		}
		return true, nil
	},
}

// foldShape folds Shape (start/end) or Size of a large static shape
// without materializing a stand-in.
func (w *Work) foldShape(n *pb.NodeProto, s []int64) (bool, error) {
	var t *eval.Tensor
	if n.GetOpType() == "Size" {
		num := int64(1)
		for _, d := range s {
			num *= d
		}
		t = eval.ScalarInt64(num)
	} else {
		r := int64(len(s))
		start, end := graph.AttrInt(n, "start", 0), graph.AttrInt(n, "end", r)
		norm := func(v int64) int64 {
			if v < 0 {
				v += r
			}
			return max(0, min(v, r))
		}
		start, end = norm(start), norm(end)
		vals := []int64{}
		if start < end {
			vals = append(vals, s[start:end]...)
		}
		t = eval.NewInt64([]int{len(vals)}, vals)
	}
	w.Replace(n)
	if _, err := w.AddConst(n.Output[0], t); err != nil {
		return false, err
	}
	return true, nil
}

// evalNodes runs nodes (in any order: the evaluator sorts them) on feeds,
// which give every value they read that they do not compute, at the given
// default-domain opset, and returns the values named outs.
func evalNodes(nodes []*pb.NodeProto, feeds map[string]*eval.Tensor, outs []string, opset int64) ([]*eval.Tensor, error) {
	gp := &pb.GraphProto{Name: proto.String("region"), Node: nodes}
	for name := range feeds {
		gp.Input = append(gp.Input, &pb.ValueInfoProto{Name: proto.String(name)})
	}
	for _, o := range outs {
		gp.Output = append(gp.Output, &pb.ValueInfoProto{Name: proto.String(o)})
	}
	m := &graph.Model{Proto: &pb.ModelProto{IrVersion: proto.Int64(10), Graph: gp,
		OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(opset)}}}}
	res, err := eval.Run(context.Background(), m, feeds, eval.Options{Threads: 1})
	if err != nil {
		return nil, err
	}
	vals := make([]*eval.Tensor, len(outs))
	for i, o := range outs {
		if vals[i] = res[o]; vals[i] == nil {
			return nil, fmt.Errorf("the nodes compute no %q", o)
		}
	}
	return vals, nil
}
