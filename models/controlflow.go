package models

import (
	"fmt"
	"slices"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// Ways WrapControlFlow puts a block inside control flow.
const (
	// WrapIfThen: y = If(cond, then: block(x), else: x).
	WrapIfThen = "if_then"
	// WrapIfElse: y = If(cond, then: x, else: block(x)).
	WrapIfElse = "if_else"
	// WrapIfBoth: y = If(cond, then: block(x), else: block(x)), the two
	// branches reading the same weights (two blocks, one per branch).
	WrapIfBoth = "if_both"
	// WrapLoop: a Loop of two iterations whose body applies the block to
	// the carried hidden state, the weights read from the main graph.
	WrapLoop = "loop"
	// WrapLoopComputed: WrapLoop whose body reads its matrix weights as
	// values the main graph computes from the initializers (each
	// transposed there twice), not as the initializers themselves.
	WrapLoopComputed = "loop_computed_weights"
	// WrapLoopIf: WrapLoop whose body runs the block inside an If on a
	// main-graph flag (a subgraph two levels down).
	WrapLoopIf = "loop_if"
	// WrapScan: a Scan over a leading axis of three steps whose body
	// applies the block to each step's slice.
	WrapScan = "scan"
	// WrapFunctionInIf: WrapIfThen where the then branch calls a
	// model-local function holding the block, its weights passed in.
	WrapFunctionInIf = "function_in_if"
	// WrapIfInFunction: the main graph calls a model-local function
	// whose body is WrapIfThen's If (on the condition and weights passed
	// in): a subgraph inside a function.
	WrapIfInFunction = "if_in_function"
)

// WrapKinds lists every WrapControlFlow kind.
var WrapKinds = []string{WrapIfThen, WrapIfElse, WrapIfBoth, WrapLoop, WrapLoopComputed, WrapLoopIf, WrapScan, WrapFunctionInIf, WrapIfInFunction}

// Names of the wrapped model's inputs besides the hidden states.
const (
	// CondInput is the If condition (bool [1]) of the If kinds and of
	// WrapLoopIf.
	CondInput = "cond"
	// WrappedInput is the hidden states input of the wrapped model.
	WrappedInput = "x"
	// WrappedOutput is its output.
	WrappedOutput = "y"
	// ScanSteps is the leading dim WrapScan adds to the input.
	ScanSteps = 3
)

// WrapControlFlow returns a model that runs block, a model of one MoE
// block (one input, the hidden states, and one output), inside control
// flow as how says (one of WrapKinds). The block's nodes, value infos and
// initializers are reused: its weights stay initializers of the main
// graph, read from the subgraph by name. block is not edited.
func WrapControlFlow(block *graph.Model, how string) (*graph.Model, error) {
	bg := block.Proto.GetGraph()
	if len(bg.GetInput()) != 1 || len(bg.GetOutput()) != 1 {
		return nil, fmt.Errorf("wrapping %s: the block model needs one input and one output, has %d and %d", block.Name(), len(bg.GetInput()), len(bg.GetOutput()))
	}
	in, out := bg.Input[0], bg.Output[0]
	mp := &pb.ModelProto{IrVersion: proto.Int64(max(block.Proto.GetIrVersion(), 8)), ProducerName: proto.String("mokopt models.WrapControlFlow"),
		OpsetImport: cloneOpsets(block.Proto.OpsetImport)}
	main := &pb.GraphProto{Name: proto.String("wrapped_" + how), Initializer: slices.Clone(bg.Initializer)}
	x := renamed(in, WrappedInput)
	y := renamed(out, WrappedOutput)
	cond := boolInput(CondInput)
	cond.Type.GetTensorType().Shape.Dim = []*pb.TensorShapeProto_Dimension{{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: 1}}}
	body := func(name string, inputs []*pb.ValueInfoProto) *pb.GraphProto {
		return &pb.GraphProto{Name: proto.String(name), Node: copyNodes(bg.Node), ValueInfo: slices.Clone(bg.ValueInfo), Input: inputs,
			Output: []*pb.ValueInfoProto{proto.Clone(out).(*pb.ValueInfoProto)}}
	}
	// identity is a branch that returns v (from an enclosing scope).
	identity := func(name, v string, like *pb.ValueInfoProto) *pb.GraphProto {
		o := renamed(like, name+"_out")
		return &pb.GraphProto{Name: proto.String(name), Node: []*pb.NodeProto{graph.NewNode("Identity", "", name+"_id", []string{v}, []string{o.GetName()})},
			Output: []*pb.ValueInfoProto{o}}
	}
	switch how {
	case WrapIfThen, WrapIfElse, WrapIfBoth, WrapFunctionInIf:
		// The branch reads the hidden states under the block's own name.
		main.Input = []*pb.ValueInfoProto{proto.Clone(in).(*pb.ValueInfoProto), cond}
		moe := body("moe_branch", nil)
		if how == WrapFunctionInIf {
			f, call := asFunction(bg, mp.OpsetImport)
			mp.Functions = []*pb.FunctionProto{f}
			mp.OpsetImport = append(mp.OpsetImport, &pb.OperatorSetIdProto{Domain: proto.String(f.GetDomain()), Version: proto.Int64(1)})
			moe.Node, moe.ValueInfo = []*pb.NodeProto{call}, nil
		}
		other := identity("plain_branch", in.GetName(), in)
		then, els := moe, other
		switch how {
		case WrapIfElse:
			then, els = other, moe
		case WrapIfBoth:
			els = body("moe_else_branch", nil)
		}
		main.Node = []*pb.NodeProto{graph.NewNode("If", "", "moe_if", []string{CondInput}, []string{WrappedOutput},
			graphAttr("then_branch", then), graphAttr("else_branch", els))}
		main.Output = []*pb.ValueInfoProto{y}
	case WrapIfInFunction:
		main.Input = []*pb.ValueInfoProto{proto.Clone(in).(*pb.ValueInfoProto), cond}
		f, call := asFunction(bg, mp.OpsetImport)
		f.Input = append([]string{CondInput}, f.Input...)
		f.Node = []*pb.NodeProto{graph.NewNode("If", "", "moe_if", []string{CondInput}, []string{out.GetName()},
			graphAttr("then_branch", body("moe_branch", nil)), graphAttr("else_branch", identity("plain_branch", in.GetName(), in)))}
		call.Input = f.Input
		call.Output = []string{WrappedOutput}
		mp.Functions = []*pb.FunctionProto{f}
		mp.OpsetImport = append(mp.OpsetImport, &pb.OperatorSetIdProto{Domain: proto.String(f.GetDomain()), Version: proto.Int64(1)})
		main.Node = []*pb.NodeProto{call}
		main.Output = []*pb.ValueInfoProto{y}
	case WrapLoop, WrapLoopComputed, WrapLoopIf:
		main.Input = []*pb.ValueInfoProto{x}
		if how == WrapLoopIf {
			main.Input = append(main.Input, cond)
		}
		main.Initializer = append(main.Initializer, scalarInt64("loop_trips", 2), boolScalar("loop_keep", true))
		formal := []*pb.ValueInfoProto{int64Input("iter"), boolInput("cond_in"), proto.Clone(in).(*pb.ValueInfoProto)}
		b := body("loop_body", formal)
		if how == WrapLoopIf {
			inner := body("moe_branch", nil)
			other := identity("plain_branch", in.GetName(), in)
			ifOut := out.GetName() + "_if"
			b = &pb.GraphProto{Name: proto.String("loop_body"), Input: formal, Output: []*pb.ValueInfoProto{renamed(out, ifOut)},
				Node: []*pb.NodeProto{graph.NewNode("If", "", "inner_if", []string{CondInput}, []string{ifOut},
					graphAttr("then_branch", inner), graphAttr("else_branch", other))}}
		}
		b.Node = append(b.Node, graph.NewNode("Identity", "", "keep_going", []string{"cond_in"}, []string{"cond_out"}))
		b.Output = append([]*pb.ValueInfoProto{boolInput("cond_out")}, b.Output...)
		main.Node = []*pb.NodeProto{graph.NewNode("Loop", "", "moe_loop", []string{"loop_trips", "loop_keep", WrappedInput}, []string{WrappedOutput}, graphAttr("body", b))}
		if how == WrapLoopComputed {
			main.Node = append(computedWeights(bg, b), main.Node...)
		}
		main.Output = []*pb.ValueInfoProto{y}
	case WrapScan:
		main.Input = []*pb.ValueInfoProto{stacked(in, WrappedInput, ScanSteps)}
		b := body("scan_body", []*pb.ValueInfoProto{proto.Clone(in).(*pb.ValueInfoProto)})
		main.Node = []*pb.NodeProto{graph.NewNode("Scan", "", "moe_scan", []string{WrappedInput}, []string{WrappedOutput},
			graphAttr("body", b), graph.IntAttr("num_scan_inputs", 1))}
		main.Output = []*pb.ValueInfoProto{stacked(out, WrappedOutput, ScanSteps)}
	default:
		return nil, fmt.Errorf("unknown control-flow wrapping %q (want one of %v)", how, WrapKinds)
	}
	mp.Graph = main
	wm := block.WithGraph(main)
	wm.Proto = mp
	b, err := wm.Marshal()
	if err != nil {
		return nil, fmt.Errorf("wrapping %s: %w", block.Name(), err)
	}
	return graph.Parse(b, block.Name()+"#"+how)
}

// computedWeights makes the body b read each float initializer of bg of
// rank 2 or more as W_outer = Transpose(Transpose(W)), swapping the last
// two axes twice, and returns the main-graph nodes that compute them.
func computedWeights(bg, b *pb.GraphProto) []*pb.NodeProto {
	var ns []*pb.NodeProto
	rename := map[string]string{}
	for _, t := range bg.Initializer {
		r := len(t.GetDims())
		if r < 2 || t.GetDataType() != int32(pb.TensorProto_FLOAT) {
			continue
		}
		perm := make([]int64, r)
		for i := range perm {
			perm[i] = int64(i)
		}
		perm[r-2], perm[r-1] = perm[r-1], perm[r-2]
		v := t.GetName()
		rename[v] = v + "_outer"
		ns = append(ns, graph.NewNode("Transpose", "", v+"_t1", []string{v}, []string{v + "_t"}, graph.IntsAttr("perm", perm...)),
			graph.NewNode("Transpose", "", v+"_t2", []string{v + "_t"}, []string{v + "_outer"}, graph.IntsAttr("perm", perm...)))
	}
	for _, n := range b.Node {
		for i, v := range n.Input {
			if r, ok := rename[v]; ok {
				n.Input[i] = r
			}
		}
	}
	return ns
}

// asFunction returns a function local::MoEBlock whose body is bg's nodes,
// taking the hidden states and then every initializer of bg as inputs,
// and a call of it on bg's own names.
func asFunction(bg *pb.GraphProto, opsets []*pb.OperatorSetIdProto) (*pb.FunctionProto, *pb.NodeProto) {
	f := &pb.FunctionProto{Name: proto.String("MoEBlock"), Domain: proto.String("local"), OpsetImport: cloneOpsets(opsets),
		Node: copyNodes(bg.Node), Input: []string{bg.Input[0].GetName()}, Output: []string{bg.Output[0].GetName()}}
	for _, t := range bg.Initializer {
		f.Input = append(f.Input, t.GetName())
	}
	call := graph.NewNode("MoEBlock", "local", "moe_call", f.Input, f.Output)
	return f, call
}

func cloneOpsets(os []*pb.OperatorSetIdProto) []*pb.OperatorSetIdProto {
	var out []*pb.OperatorSetIdProto
	for _, o := range os {
		out = append(out, proto.Clone(o).(*pb.OperatorSetIdProto))
	}
	return out
}

func copyNodes(ns []*pb.NodeProto) []*pb.NodeProto {
	out := make([]*pb.NodeProto, len(ns))
	for i, n := range ns {
		out[i] = graph.CopyNode(n)
	}
	return out
}

func renamed(v *pb.ValueInfoProto, name string) *pb.ValueInfoProto {
	c := proto.Clone(v).(*pb.ValueInfoProto)
	c.Name = proto.String(name)
	return c
}

// stacked is v renamed, with a leading dim of n.
func stacked(v *pb.ValueInfoProto, name string, n int64) *pb.ValueInfoProto {
	c := renamed(v, name)
	if sh := c.GetType().GetTensorType().GetShape(); sh != nil {
		sh.Dim = append([]*pb.TensorShapeProto_Dimension{{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: n}}}, sh.Dim...)
	}
	return c
}

func scalarType(dt pb.TensorProto_DataType) *pb.TypeProto {
	return &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: proto.Int32(int32(dt)), Shape: &pb.TensorShapeProto{}}}}
}

func boolInput(name string) *pb.ValueInfoProto {
	return &pb.ValueInfoProto{Name: proto.String(name), Type: scalarType(pb.TensorProto_BOOL)}
}

func int64Input(name string) *pb.ValueInfoProto {
	return &pb.ValueInfoProto{Name: proto.String(name), Type: scalarType(pb.TensorProto_INT64)}
}

func scalarInt64(name string, v int64) *pb.TensorProto {
	return &pb.TensorProto{Name: proto.String(name), DataType: proto.Int32(int32(pb.TensorProto_INT64)), Int64Data: []int64{v}}
}

func boolScalar(name string, v bool) *pb.TensorProto {
	b := int32(0)
	if v {
		b = 1
	}
	return &pb.TensorProto{Name: proto.String(name), DataType: proto.Int32(int32(pb.TensorProto_BOOL)), Int32Data: []int32{b}}
}

func graphAttr(name string, g *pb.GraphProto) *pb.AttributeProto {
	return &pb.AttributeProto{Name: proto.String(name), Type: pb.AttributeProto_GRAPH.Enum(), G: g}
}
