package moe

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// attrNames are the attributes the fused node may carry.
var attrNames = []string{"activation", "ep_size", "expert_offset", "gate_up_interleaved", "group_score", "io_type", "n_group", "normalize_topk",
	"num_experts", "router_activation", "router_order", "routed_scaling_factor", "shared_expert_gated",
	"sparsemixer_threshold", "swiglu_alpha", "swiglu_limit", "top_k", "topk_group", "weight_type", "weights_on_input"}

// Builder accumulates the nodes of a function body in the default domain,
// naming each intermediate value Prefix followed by a counter.
type Builder struct {
	Nodes  []*pb.NodeProto
	Prefix string
	n      int
}

func (b *Builder) tmp() string { b.n++; return fmt.Sprintf("%s%d", b.Prefix, b.n) }

// Op appends a one-output node and returns its output's name.
func (b *Builder) Op(op string, inputs []string, attrs ...*pb.AttributeProto) string {
	out := b.tmp()
	b.Nodes = append(b.Nodes, graph.NewNode(op, "", "", inputs, []string{out}, attrs...))
	return out
}

// Op2 appends a two-output node (TopK) and returns its outputs' names.
func (b *Builder) Op2(op string, inputs []string, attrs ...*pb.AttributeProto) (string, string) {
	o1, o2 := b.tmp(), b.tmp()
	b.Nodes = append(b.Nodes, graph.NewNode(op, "", "", inputs, []string{o1, o2}, attrs...))
	return o1, o2
}

// Ints appends a Constant 1-D INT64 tensor.
func (b *Builder) Ints(v ...int64) string {
	return b.Op("Constant", nil, graph.TensorAttr("value", Int64Tensor("", []int64{int64(len(v))}, v)))
}

// Scalar appends a Constant FLOAT scalar.
func (b *Builder) Scalar(f float32) string {
	return b.Op("Constant", nil, graph.TensorAttr("value", Float32Tensor("", nil, []float32{f})))
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

// Float32Tensor builds a FLOAT tensor with raw data (a copy of v).
func Float32Tensor(name string, dims []int64, v []float32) *pb.TensorProto {
	raw := make([]byte, 4*len(v))
	if littleEndian {
		copy(raw, f32Bytes(v))
	} else {
		for i, x := range v {
			u := math.Float32bits(x)
			raw[4*i], raw[4*i+1], raw[4*i+2], raw[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
		}
	}
	return float32Proto(name, dims, raw)
}

// FloatTensorAs builds a tensor of element type dt (FLOAT, FLOAT16 or
// BFLOAT16) holding v rounded to dt (exactly v when its values came from
// dt); for FLOAT it is Float32TensorOwned.
func FloatTensorAs(name string, dims []int64, v []float32, dt pb.TensorProto_DataType) *pb.TensorProto {
	if dt != pb.TensorProto_FLOAT16 && dt != pb.TensorProto_BFLOAT16 {
		return Float32TensorOwned(name, dims, v)
	}
	raw := make([]byte, 2*len(v))
	_ = graph.EncodeFloat32Into(dt, raw, v) // a half type and its size: no error
	t := float32Proto(name, dims, raw)
	t.DataType = proto.Int32(int32(dt))
	return t
}

// Float32TensorOwned is Float32Tensor taking ownership of v: where the host
// stores float32 as ONNX raw data does (little-endian), v's memory becomes
// the raw data without a copy, so v must not be written afterwards.
func Float32TensorOwned(name string, dims []int64, v []float32) *pb.TensorProto {
	if !littleEndian || len(v) == 0 {
		return Float32Tensor(name, dims, v)
	}
	return float32Proto(name, dims, f32Bytes(v))
}

func float32Proto(name string, dims []int64, raw []byte) *pb.TensorProto {
	t := &pb.TensorProto{Dims: dims, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), RawData: raw}
	if name != "" {
		t.Name = proto.String(name)
	}
	return t
}

// littleEndian reports whether the host stores float32 values in ONNX raw
// data's byte order.
var littleEndian = func() bool {
	v := uint16(1)
	return *(*byte)(unsafe.Pointer(&v)) == 1
}()

// f32Bytes views a float32 slice's memory as bytes.
func f32Bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

// Function returns the model-local function implementing spec's variant
// in standard ONNX ops (default-domain opset version opset, at least 13).
// Every expert runs on every token in the body; it is a portable reference,
// not a fast path.
func Function(s *Spec, opset int64) (*pb.FunctionProto, error) {
	if opset < 13 {
		return nil, fmt.Errorf("the fused node's function body needs ONNX opset >= 13, model has %d", opset)
	}
	b := &Builder{Prefix: "t"}
	in := InputNames
	if s.WeightType != "" { // half expert matrices: widened to float32, exactly
		gated := s.ActivationDef() != nil && s.ActivationDef().Gated
		for _, pos := range []int{InGate, InUp, InDown, InSharedGate, InSharedUp, InSharedDown} {
			if (pos != InGate || gated) && (pos < InSharedGate || s.SharedInter > 0) {
				in[pos] = b.Op("Cast", []string{in[pos]}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT)))
			}
		}
	}
	axisLast := graph.IntAttr("axis", -1)
	hidden := in[InHidden]
	if s.IOType != "" { // half-precision I/O: compute in float32
		hidden = b.Op("Cast", []string{hidden}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT)))
	}
	x2 := b.Op("Reshape", []string{hidden, b.Ints(-1, int64(s.Hidden))})
	linIn := []string{x2, in[InRouterW]}
	if s.RouterBias {
		linIn = append(linIn, in[InRouterB])
	}
	logits := b.Op("Gemm", linIn, graph.IntAttr("transB", 1))
	outs := []string{OutputNames[OutY]}
	if s.RouterLogits { // the optional second output (logits.go)
		outs = append(outs, logitsOutput(b, logits))
	}
	k := b.Ints(int64(s.TopK))
	activate := func(v string) string {
		if s.RouterActivation == Softmax {
			return b.Op("Softmax", []string{v}, axisLast)
		}
		return b.Op("Sigmoid", []string{v})
	}
	var w, idx string
	if s.RouterActivation == SparseMixer {
		w, idx = sparseMixerBody(b, s, logits)
	} else if s.RouterOrder == TopKThenActivation {
		var vals string
		vals, idx = b.Op2("TopK", []string{logits, k}, axisLast)
		w = activate(vals)
	} else {
		scores := activate(logits)
		choice := scores
		if s.CorrectionBias {
			choice = b.Op("Add", []string{scores, in[InCorrectionBias]})
		}
		if s.NGroup > 1 {
			per := int64(s.NumExperts / s.NGroup)
			g3 := b.Op("Reshape", []string{choice, b.Ints(-1, int64(s.NGroup), per)})
			top2, _ := b.Op2("TopK", []string{g3, b.Ints(min(int64(s.GroupScoreTop()), per))}, axisLast)
			gs := b.Op("ReduceSum", []string{top2, b.Ints(-1)}, graph.IntAttr("keepdims", 0))
			_, gi := b.Op2("TopK", []string{gs, b.Ints(int64(s.TopKGroup))}, axisLast)
			ones := b.Op("Expand", []string{b.Scalar(1), b.Op("Shape", []string{gi})})
			zeros := b.Op("Mul", []string{gs, b.Scalar(0)})
			gmask := b.Op("ScatterElements", []string{zeros, gi, ones}, graph.IntAttr("axis", 1))
			gm3 := b.Op("Expand", []string{b.Op("Unsqueeze", []string{gmask, b.Ints(-1)}), b.Op("Shape", []string{g3})})
			mask := b.Op("Cast", []string{b.Op("Reshape", []string{gm3, b.Ints(-1, int64(s.NumExperts))})}, graph.IntAttr("to", int64(pb.TensorProto_BOOL)))
			choice = b.Op("Where", []string{mask, choice, b.Scalar(float32(math.Inf(-1)))})
		}
		_, idx = b.Op2("TopK", []string{choice, k}, axisLast)
		w = b.Op("GatherElements", []string{scores, idx}, graph.IntAttr("axis", 1))
	}
	if s.NormalizeTopK {
		w = b.Op("Div", []string{w, b.Op("ReduceSum", []string{w, b.Ints(-1)}, graph.IntAttr("keepdims", 1))})
	}
	if s.RoutedScalingFactor != 1 && s.RoutedScalingFactor != 0 {
		w = b.Op("Mul", []string{w, b.Scalar(s.RoutedScalingFactor)})
	}
	zerosTE := b.Op("Mul", []string{logits, b.Scalar(0)})
	route := b.Op("ScatterElements", []string{zerosTE, idx, w}, graph.IntAttr("axis", 1)) // [T, E]
	routeE := b.Op("Unsqueeze", []string{b.Op("Transpose", []string{route}, graph.IntsAttr("perm", 1, 0)), b.Ints(-1)})
	xe := b.Op("Unsqueeze", []string{x2, b.Ints(0)}) // [1, T, H]
	combine := routeE
	if s.WeightsOnInput {
		xe = b.Op("Mul", []string{xe, routeE}) // [E, T, H]
		ones := b.Op("Expand", []string{b.Scalar(1), b.Op("Shape", []string{idx})})
		sel := b.Op("ScatterElements", []string{zerosTE, idx, ones}, graph.IntAttr("axis", 1))
		combine = b.Op("Unsqueeze", []string{b.Op("Transpose", []string{sel}, graph.IntsAttr("perm", 1, 0)), b.Ints(-1)})
	}
	tr := graph.IntsAttr("perm", 0, 2, 1)
	proj := func(wName, bias string) string {
		y := b.Op("MatMul", []string{xe, b.Op("Transpose", []string{wName}, tr)})
		if bias != "" {
			y = b.Op("Add", []string{y, b.Op("Unsqueeze", []string{bias, b.Ints(1)})})
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
	act := s.ActivationDef()
	if act == nil {
		return nil, fmt.Errorf("activation %q is not in the activation table", s.Activation)
	}
	g := ""
	if act.Gated {
		g = proj(in[InGate], opt(InGateBias, s.ExpertBias))
	}
	a := act.Body(b, g, u, s.ActParams())
	d := b.Op("MatMul", []string{a, b.Op("Transpose", []string{in[InDown]}, tr)}) // [E, T, H]
	if s.ExpertBias {
		d = b.Op("Add", []string{d, b.Op("Unsqueeze", []string{in[InDownBias], b.Ints(1)})})
	}
	y := b.Op("ReduceSum", []string{b.Op("Mul", []string{d, combine}), b.Ints(0)}, graph.IntAttr("keepdims", 0)) // [T, H]
	if s.SharedInter > 0 {
		t2 := graph.IntsAttr("perm", 1, 0)
		sg := b.Op("MatMul", []string{x2, b.Op("Transpose", []string{in[InSharedGate]}, t2)})
		su := b.Op("MatMul", []string{x2, b.Op("Transpose", []string{in[InSharedUp]}, t2)})
		sa := b.Op("Mul", []string{b.Op("Mul", []string{sg, b.Op("Sigmoid", []string{sg})}), su})
		sd := b.Op("MatMul", []string{sa, b.Op("Transpose", []string{in[InSharedDown]}, t2)})
		if s.SharedGated {
			gate := b.Op("Sigmoid", []string{b.Op("MatMul", []string{x2, b.Op("Transpose", []string{in[InSharedGateW]}, t2)})})
			sd = b.Op("Mul", []string{sd, gate})
		}
		y = b.Op("Add", []string{y, sd})
	}
	if s.IOType != "" {
		out := b.Op("Reshape", []string{y, b.Op("Shape", []string{in[InHidden]})})
		b.Nodes = append(b.Nodes, graph.NewNode("Cast", "", "", []string{out}, []string{"output"}, graph.IntAttr("to", int64(s.IOElemType()))))
	} else {
		b.Nodes = append(b.Nodes, graph.NewNode("Reshape", "", "", []string{y, b.Op("Shape", []string{in[InHidden]})}, []string{"output"}))
	}
	f := &pb.FunctionProto{
		Name:        proto.String(OpType),
		Domain:      proto.String(Domain),
		Overload:    proto.String(s.Overload()),
		Input:       append([]string(nil), InputNames[:]...),
		Output:      outs,
		Attribute:   append([]string(nil), attrNames...),
		Node:        b.Nodes,
		OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(opset)}},
		DocString:   proto.String("Canonical decomposition of ai.mok::MoE (" + s.Variant() + "): every expert runs on every token, weighted by the routing matrix. Generated by mokopt."),
	}
	return f, nil
}

// sparseMixerBody appends the sparsemixer router (see SparseMixer) for the
// [T, E] logits and returns the weights and expert ids, both [T, k]. A TopK
// with k=1 stands for max and argmax (its tie order, lowest index first,
// is ArgMax's default), so the body needs no opset-specific reductions.
func sparseMixerBody(b *Builder, s *Spec, logits string) (w, idx string) {
	axisLast := graph.IntAttr("axis", -1)
	one := b.Ints(1)
	negInf := b.Scalar(float32(math.Inf(-1)))
	abs := b.Op("Abs", []string{logits})
	thr := b.Scalar(s.SparseMixerThreshold)
	cur := logits
	var ws, ids []string
	for j := 0; j < s.TopK; j++ {
		m, i := b.Op2("TopK", []string{cur, one}, axisLast)
		factor := b.Op("Max", []string{abs, m})
		mask := b.Op("Greater", []string{b.Op("Div", []string{b.Op("Sub", []string{m, logits}), factor}), thr})
		g := b.Op("Softmax", []string{b.Op("Where", []string{mask, negInf, cur})}, axisLast)
		ws = append(ws, b.Op("GatherElements", []string{g, i}, graph.IntAttr("axis", 1)))
		ids = append(ids, i)
		if j+1 < s.TopK {
			cur = b.Op("ScatterElements", []string{cur, i, b.Op("Expand", []string{negInf, b.Op("Shape", []string{i})})}, graph.IntAttr("axis", 1))
		}
	}
	if s.TopK == 1 {
		return ws[0], ids[0]
	}
	return b.Op("Concat", ws, axisLast), b.Op("Concat", ids, axisLast)
}
