package lowering

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// fp8Opset is the first default-domain opset whose Cast reads float8e4m3fn.
const fp8Opset = 19

// builder is moe.Builder plus the casts and dequantisation the kernel
// node's function body needs.
type builder struct{ moe.Builder }

func (b *builder) cast(v string, to pb.TensorProto_DataType) string {
	return b.Op("Cast", []string{v}, graph.IntAttr("to", int64(to)))
}

// bf16 rounds a float tensor to bfloat16 and back.
func (b *builder) bf16(v string) string {
	return b.cast(b.cast(v, pb.TensorProto_BFLOAT16), pb.TensorProto_FLOAT)
}

// dequant returns the float [E, N, K] weights of an MXFP8 pair: the E4M3
// codes cast to float, times 2^(scale−127) with each scale byte moved from
// the tcgen05 layout [E·N/128, K/128, 32, 16] (byte (r%32)·16 + (r/32)·4 +
// kb%4 of a tile) to its row and K-block, and repeated over the block's 32
// elements.
func (b *builder) dequant(q, s string) string {
	qf := b.cast(q, pb.TensorProto_FLOAT)
	scale := b.Op("Pow", []string{b.Scalar(2), b.Op("Sub", []string{b.cast(s, pb.TensorProto_FLOAT), b.Scalar(127)})})
	tiles := b.Op("Slice", []string{b.Op("Shape", []string{s}), b.Ints(0), b.Ints(2)}) // [E·N/128, K/128]
	s5 := b.Op("Reshape", []string{scale, b.Op("Concat", []string{tiles, b.Ints(32, 4, 4)}, graph.IntAttr("axis", 0))})
	// [tile row, tile col, r%32, r/32, kb%4] -> [tile row, r/32, r%32, tile col, kb%4] = [row, K-block]
	rowBlock := b.Op("Transpose", []string{s5}, graph.IntsAttr("perm", 0, 3, 2, 1, 4))
	perElem := b.Op("Expand", []string{b.Op("Reshape", []string{rowBlock, b.Ints(-1, 1)}), b.Ints(1, 32)})
	return b.Op("Mul", []string{qf, b.Op("Reshape", []string{perElem, b.Op("Shape", []string{q})})})
}

// kernelFunction returns the model-local function of MoKDispatchFFNCombine:
// its reference semantics in standard ONNX ops (default-domain opset
// version opset, at least 19 for the float8 Cast). Every expert runs on every
// token, weighted by the routing matrix scattered from topk_experts and
// router_weights; weights are dequantized exactly; activations stay float32
// (the registered interpreter kernel also models the kernel's MXFP8
// activations); the combine buffer, the shared expert's hidden and output,
// and the result are rounded to bfloat16 as the kernel stores them.
func kernelFunction(clamped bool, opset int64) *pb.FunctionProto {
	b := &builder{moe.Builder{Prefix: "k"}}
	in := InputNames
	xf := b.cast(in[InX], pb.TensorProto_FLOAT) // [T, H]
	wg := b.dequant(in[InGate], in[InGateScale])
	wu := b.dequant(in[InUp], in[InUpScale])
	wd := b.dequant(in[InDown], in[InDownScale])
	tr := graph.IntsAttr("perm", 0, 2, 1)
	xe := b.Op("Unsqueeze", []string{xf, b.Ints(0)}) // [1, T, H]
	g := b.Op("MatMul", []string{xe, b.Op("Transpose", []string{wg}, tr)})
	u := b.Op("MatMul", []string{xe, b.Op("Transpose", []string{wu}, tr)})
	if clamped {
		limit := b.Op("Constant", nil, &pb.AttributeProto{Name: proto.String("value_float"), Type: pb.AttributeProto_FLOAT.Enum(), RefAttrName: proto.String(AttrSwiGLULimit)})
		g = b.Op("Min", []string{g, limit})
		u = b.Op("Clip", []string{u, b.Op("Neg", []string{limit}), limit})
	}
	a := b.Op("Mul", []string{b.Op("Mul", []string{g, b.Op("Sigmoid", []string{g})}), u})
	d := b.bf16(b.Op("MatMul", []string{a, b.Op("Transpose", []string{wd}, tr)})) // [E, T, H], bf16 combine buffer
	te := b.Op("Concat", []string{
		b.Op("Slice", []string{b.Op("Shape", []string{xf}), b.Ints(0), b.Ints(1)}),
		b.Op("Slice", []string{b.Op("Shape", []string{in[InGate]}), b.Ints(0), b.Ints(1)}),
	}, graph.IntAttr("axis", 0))
	zeros := b.Op("ConstantOfShape", []string{te}, graph.TensorAttr("value", moe.Float32Tensor("", []int64{1}, []float32{0})))
	route := b.Op("ScatterElements", []string{zeros, in[InTopKExperts], in[InRouterWeights]}, graph.IntAttr("axis", 1)) // [T, E]
	routeE := b.Op("Unsqueeze", []string{b.Op("Transpose", []string{route}, graph.IntsAttr("perm", 1, 0)), b.Ints(-1)})
	y := b.Op("ReduceSum", []string{b.Op("Mul", []string{d, routeE}), b.Ints(0)}, graph.IntAttr("keepdims", 0)) // [T, H]
	t2 := graph.IntsAttr("perm", 1, 0)
	shared := func(w string) string {
		return b.Op("Transpose", []string{b.cast(w, pb.TensorProto_FLOAT)}, t2)
	}
	sg := b.Op("MatMul", []string{xf, shared(in[InSharedGate])})
	su := b.Op("MatMul", []string{xf, shared(in[InSharedUp])})
	sa := b.bf16(b.Op("Mul", []string{b.Op("Mul", []string{sg, b.Op("Sigmoid", []string{sg})}), su}))
	sd := b.bf16(b.Op("MatMul", []string{sa, shared(in[InSharedDown])}))
	y = b.Op("Add", []string{y, sd})
	b.Nodes = append(b.Nodes, graph.NewNode("Cast", "", "", []string{y}, []string{"output"}, graph.IntAttr("to", int64(pb.TensorProto_BFLOAT16))))
	overload := overloadSwiGLU
	if clamped {
		overload = overloadSwiGLUClamped
	}
	return &pb.FunctionProto{
		Name:        proto.String(OpType),
		Domain:      proto.String(Domain),
		Overload:    proto.String(overload),
		Input:       append([]string(nil), in[:]...),
		Output:      []string{"output"},
		Attribute:   append([]string(nil), attrNames...),
		Node:        b.Nodes,
		OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(opset)}},
		DocString: proto.String("Reference semantics of ai.mok::MoKDispatchFFNCombine (" + overload + "): MXFP8 routed SwiGLU experts " +
			"dequantized from E4M3 codes and tcgen05-layout UE8M0 scales, BF16 shared expert, out = shared + sum_k w[t,k]*routed[t,k]. " +
			"Every expert runs on every token. Generated by mokopt."),
	}
}
