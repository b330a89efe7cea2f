package moe

import (
	"fmt"
	"math"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// attrNames are the attributes the fused node may carry.
var attrNames = []string{"activation", "ep_size", "expert_offset", "gate_up_interleaved", "n_group", "normalize_topk",
	"num_experts", "router_activation", "router_order", "routed_scaling_factor", "shared_expert_gated",
	"swiglu_alpha", "swiglu_limit", "top_k", "topk_group", "weights_on_input"}

// bodyBuilder accumulates the nodes of a function body.
type bodyBuilder struct {
	nodes []*pb.NodeProto
	n     int
}

func (b *bodyBuilder) tmp() string { b.n++; return fmt.Sprintf("t%d", b.n) }

func (b *bodyBuilder) op(op string, inputs []string, attrs ...*pb.AttributeProto) string {
	out := b.tmp()
	b.nodes = append(b.nodes, graph.NewNode(op, "", "", inputs, []string{out}, attrs...))
	return out
}

func (b *bodyBuilder) op2(op string, inputs []string, attrs ...*pb.AttributeProto) (string, string) {
	o1, o2 := b.tmp(), b.tmp()
	b.nodes = append(b.nodes, graph.NewNode(op, "", "", inputs, []string{o1, o2}, attrs...))
	return o1, o2
}

func (b *bodyBuilder) ints(v ...int64) string {
	return b.op("Constant", nil, graph.TensorAttr("value", Int64Tensor("", []int64{int64(len(v))}, v)))
}

func (b *bodyBuilder) scalar(f float32) string {
	return b.op("Constant", nil, graph.TensorAttr("value", Float32Tensor("", nil, []float32{f})))
}

// Int64Tensor builds an INT64 tensor with raw data.
func Int64Tensor(name string, dims []int64, v []int64) *pb.TensorProto {
	raw := make([]byte, 8*len(v))
	for i, x := range v {
		for j := 0; j < 8; j++ {
			raw[8*i+j] = byte(uint64(x) >> (8 * j))
		}
	}
	t := &pb.TensorProto{Dims: dims, DataType: proto.Int32(int32(pb.TensorProto_INT64)), RawData: raw}
	if name != "" {
		t.Name = proto.String(name)
	}
	return t
}

// Float32Tensor builds a FLOAT tensor with raw data.
func Float32Tensor(name string, dims []int64, v []float32) *pb.TensorProto {
	raw := make([]byte, 4*len(v))
	for i, x := range v {
		u := math.Float32bits(x)
		raw[4*i], raw[4*i+1], raw[4*i+2], raw[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
	}
	t := &pb.TensorProto{Dims: dims, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), RawData: raw}
	if name != "" {
		t.Name = proto.String(name)
	}
	return t
}

// Function returns the model-local function implementing spec's variant
// in standard ONNX ops (default-domain opset version opset, at least 13).
// Every expert runs on every token in the body; it is a portable reference,
// not a fast path.
func Function(s *Spec, opset int64) (*pb.FunctionProto, error) {
	if opset < 13 {
		return nil, fmt.Errorf("the fused node's function body needs ONNX opset >= 13, model has %d", opset)
	}
	b := &bodyBuilder{}
	in := InputNames
	axisLast := graph.IntAttr("axis", -1)
	x2 := b.op("Reshape", []string{in[InHidden], b.ints(-1, int64(s.Hidden))})
	linIn := []string{x2, in[InRouterW]}
	if s.RouterBias {
		linIn = append(linIn, in[InRouterB])
	}
	logits := b.op("Gemm", linIn, graph.IntAttr("transB", 1))
	k := b.ints(int64(s.TopK))
	activate := func(v string) string {
		if s.RouterActivation == Softmax {
			return b.op("Softmax", []string{v}, axisLast)
		}
		return b.op("Sigmoid", []string{v})
	}
	var w, idx string
	if s.RouterOrder == TopKThenActivation {
		var vals string
		vals, idx = b.op2("TopK", []string{logits, k}, axisLast)
		w = activate(vals)
	} else {
		scores := activate(logits)
		choice := scores
		if s.CorrectionBias {
			choice = b.op("Add", []string{scores, in[InCorrectionBias]})
		}
		if s.NGroup > 1 {
			per := int64(s.NumExperts / s.NGroup)
			g3 := b.op("Reshape", []string{choice, b.ints(-1, int64(s.NGroup), per)})
			top2, _ := b.op2("TopK", []string{g3, b.ints(min(2, per))}, axisLast)
			gs := b.op("ReduceSum", []string{top2, b.ints(-1)}, graph.IntAttr("keepdims", 0))
			_, gi := b.op2("TopK", []string{gs, b.ints(int64(s.TopKGroup))}, axisLast)
			ones := b.op("Expand", []string{b.scalar(1), b.op("Shape", []string{gi})})
			zeros := b.op("Mul", []string{gs, b.scalar(0)})
			gmask := b.op("ScatterElements", []string{zeros, gi, ones}, graph.IntAttr("axis", 1))
			gm3 := b.op("Expand", []string{b.op("Unsqueeze", []string{gmask, b.ints(-1)}), b.op("Shape", []string{g3})})
			mask := b.op("Cast", []string{b.op("Reshape", []string{gm3, b.ints(-1, int64(s.NumExperts))})}, graph.IntAttr("to", int64(pb.TensorProto_BOOL)))
			choice = b.op("Where", []string{mask, choice, b.scalar(float32(math.Inf(-1)))})
		}
		_, idx = b.op2("TopK", []string{choice, k}, axisLast)
		w = b.op("GatherElements", []string{scores, idx}, graph.IntAttr("axis", 1))
	}
	if s.NormalizeTopK {
		w = b.op("Div", []string{w, b.op("ReduceSum", []string{w, b.ints(-1)}, graph.IntAttr("keepdims", 1))})
	}
	if s.RoutedScalingFactor != 1 && s.RoutedScalingFactor != 0 {
		w = b.op("Mul", []string{w, b.scalar(s.RoutedScalingFactor)})
	}
	zerosTE := b.op("Mul", []string{logits, b.scalar(0)})
	route := b.op("ScatterElements", []string{zerosTE, idx, w}, graph.IntAttr("axis", 1)) // [T, E]
	routeE := b.op("Unsqueeze", []string{b.op("Transpose", []string{route}, graph.IntsAttr("perm", 1, 0)), b.ints(-1)})
	xe := b.op("Unsqueeze", []string{x2, b.ints(0)}) // [1, T, H]
	combine := routeE
	if s.WeightsOnInput {
		xe = b.op("Mul", []string{xe, routeE}) // [E, T, H]
		ones := b.op("Expand", []string{b.scalar(1), b.op("Shape", []string{idx})})
		sel := b.op("ScatterElements", []string{zerosTE, idx, ones}, graph.IntAttr("axis", 1))
		combine = b.op("Unsqueeze", []string{b.op("Transpose", []string{sel}, graph.IntsAttr("perm", 1, 0)), b.ints(-1)})
	}
	tr := graph.IntsAttr("perm", 0, 2, 1)
	proj := func(wName, bias string) string {
		y := b.op("MatMul", []string{xe, b.op("Transpose", []string{wName}, tr)})
		if bias != "" {
			y = b.op("Add", []string{y, b.op("Unsqueeze", []string{bias, b.ints(1)})})
		}
		return y
	}
	opt := func(pos int, present bool) string {
		if present {
			return in[pos]
		}
		return ""
	}
	u := proj(in[InUp], opt(InUpBias, s.ExpertBias))
	var a string
	switch s.Activation {
	case GELU:
		inner := b.op("Erf", []string{b.op("Mul", []string{u, b.scalar(float32(1 / math.Sqrt2))})})
		a = b.op("Mul", []string{b.op("Mul", []string{u, b.scalar(0.5)}), b.op("Add", []string{inner, b.scalar(1)})})
	default:
		g := proj(in[InGate], opt(InGateBias, s.ExpertBias))
		if s.Activation == SwiGLUClamped || (s.Activation == SwiGLUOAI && s.SwiGLULimit > 0) {
			g = b.op("Min", []string{g, b.scalar(s.SwiGLULimit)})
			u = b.op("Clip", []string{u, b.scalar(-s.SwiGLULimit), b.scalar(s.SwiGLULimit)})
		}
		if s.Activation == SwiGLUOAI {
			glu := b.op("Mul", []string{g, b.op("Sigmoid", []string{b.op("Mul", []string{g, b.scalar(s.SwiGLUAlpha)})})})
			a = b.op("Mul", []string{b.op("Add", []string{u, b.scalar(1)}), glu})
		} else {
			a = b.op("Mul", []string{b.op("Mul", []string{g, b.op("Sigmoid", []string{g})}), u})
		}
	}
	d := b.op("MatMul", []string{a, b.op("Transpose", []string{in[InDown]}, tr)}) // [E, T, H]
	if s.ExpertBias {
		d = b.op("Add", []string{d, b.op("Unsqueeze", []string{in[InDownBias], b.ints(1)})})
	}
	y := b.op("ReduceSum", []string{b.op("Mul", []string{d, combine}), b.ints(0)}, graph.IntAttr("keepdims", 0)) // [T, H]
	if s.SharedInter > 0 {
		t2 := graph.IntsAttr("perm", 1, 0)
		sg := b.op("MatMul", []string{x2, b.op("Transpose", []string{in[InSharedGate]}, t2)})
		su := b.op("MatMul", []string{x2, b.op("Transpose", []string{in[InSharedUp]}, t2)})
		sa := b.op("Mul", []string{b.op("Mul", []string{sg, b.op("Sigmoid", []string{sg})}), su})
		sd := b.op("MatMul", []string{sa, b.op("Transpose", []string{in[InSharedDown]}, t2)})
		if s.SharedGated {
			gate := b.op("Sigmoid", []string{b.op("MatMul", []string{x2, b.op("Transpose", []string{in[InSharedGateW]}, t2)})})
			sd = b.op("Mul", []string{sd, gate})
		}
		y = b.op("Add", []string{y, sd})
	}
	b.nodes = append(b.nodes, graph.NewNode("Reshape", "", "", []string{y, b.op("Shape", []string{in[InHidden]})}, []string{"output"}))
	f := &pb.FunctionProto{
		Name:        proto.String(OpType),
		Domain:      proto.String(Domain),
		Overload:    proto.String(s.Variant()),
		Input:       append([]string(nil), in[:]...),
		Output:      []string{"output"},
		Attribute:   append([]string(nil), attrNames...),
		Node:        b.nodes,
		OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(opset)}},
		DocString:   proto.String("Canonical decomposition of ai.mok::MoE (" + s.Variant() + "): every expert runs on every token, weighted by the routing matrix. Generated by mokopt."),
	}
	return f, nil
}
