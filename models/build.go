package models

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/ortmoe"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// Graph-level names and versions of every generated model.
const (
	// InputName is the graph input, float [T, H].
	InputName = "hidden_states"
	// OutputName is the graph output, float [T, H].
	OutputName = "output"
	// TokensDim is the symbolic token dimension used when Config.Tokens is 0.
	TokensDim = "tokens"
	// IRVersion and Opset are the ONNX IR version and default-domain opset.
	IRVersion = 10
	Opset     = 18
	// ORTDomain is ONNX Runtime's contrib-op domain, imported at version 1
	// by ort models.
	ORTDomain = "com.microsoft"
	// MetadataKey is the metadata_props entry holding the Config as JSON.
	MetadataKey = "mokopt.gen.config"
)

// builder accumulates one model's graph.
type builder struct {
	cfg    Config
	m      *graph.Model
	g      *pb.GraphProto
	consts map[string]string // constant key -> initializer name
}

// residual adds layer l's block output y to its input h (h + MoE(h)) and
// returns the sum's name: the graph output after the last layer.
func (b *builder) residual(prefix string, l int, h, y string) string {
	out := prefix + "residual"
	if l == b.cfg.Layers-1 {
		out = OutputName
	}
	b.node("Add", out, []string{h, y})
	return out
}

// newBuilder starts an empty model (IR IRVersion, default opset Opset)
// with one graph named graphName.
func newBuilder(cfg Config, graphName string) *builder {
	b := &builder{cfg: cfg, consts: map[string]string{}}
	b.g = &pb.GraphProto{Name: proto.String(graphName)}
	mp := &pb.ModelProto{
		IrVersion:       proto.Int64(IRVersion),
		ProducerName:    proto.String("mokopt-gen"),
		ProducerVersion: proto.String("1"),
		Graph:           b.g,
		OpsetImport:     []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(Opset)}},
	}
	b.m = &graph.Model{Proto: mp, Path: "", Dir: "."}
	return b
}

// Build makes cfg's model: input hidden_states [T, H], output [T, H], and
// cfg.Layers MoE blocks chained as h = h + MoE(h). Weights are deferred
// (streamed at save time) when cfg.External, else generated into raw_data.
func Build(cfg Config) (*graph.Model, error) {
	cfg, err := cfg.normalized()
	if err != nil {
		return nil, err
	}
	b := newBuilder(cfg, "mokopt_synthetic_moe")
	if cfg.Shape == ShapeORT {
		b.m.SetOpset(ORTDomain, 1)
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	b.m.SetMetadata(MetadataKey, string(js))
	b.reserve()
	b.g.Input = []*pb.ValueInfoProto{b.valueInfo(InputName)}
	b.g.Output = []*pb.ValueInfoProto{b.valueInfo(OutputName)}
	h := InputName
	for l := 0; l < cfg.Layers; l++ {
		p := "layers." + strconv.Itoa(l) + "."
		var y string
		switch cfg.Shape {
		case ShapeBatched:
			y = b.batched(l, p, h)
		case ShapeUnrolled:
			y = b.unrolled(l, p, h)
		case ShapeDense:
			y = b.dense(l, p, h)
		case ShapeORT:
			y = b.ort(l, p, h)
		}
		h = b.residual(p, l, h, y)
	}
	return b.m, nil
}

// reserve sizes the node and initializer slices for the whole model.
func (b *builder) reserve() {
	c := b.cfg
	perLayer, inits := 40, 8
	switch c.Shape {
	case ShapeUnrolled:
		perLayer += 22 * c.Experts
		inits += 3 * c.Experts
	case ShapeORT:
		perLayer = 3
	}
	b.g.Node = make([]*pb.NodeProto, 0, perLayer*c.Layers)
	b.g.Initializer = make([]*pb.TensorProto, 0, inits*c.Layers+c.Experts+16)
}

// valueInfo declares a [T, H] value of the config's element type.
func (b *builder) valueInfo(name string) *pb.ValueInfoProto {
	tok := &pb.TensorShapeProto_Dimension{}
	if b.cfg.Tokens > 0 {
		tok.Value = &pb.TensorShapeProto_Dimension_DimValue{DimValue: int64(b.cfg.Tokens)}
	} else {
		tok.Value = &pb.TensorShapeProto_Dimension_DimParam{DimParam: TokensDim}
	}
	hid := &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: int64(b.cfg.Hidden)}}
	return &pb.ValueInfoProto{
		Name: proto.String(name),
		Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
			ElemType: proto.Int32(int32(b.cfg.elemType())),
			Shape:    &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{tok, hid}},
		}}},
	}
}

// node appends a one-output node named "node_"+out (as the dynamo exporter
// names them) and returns out.
func (b *builder) node(op, out string, inputs []string, attrs ...*pb.AttributeProto) string {
	n := graph.NewNode(op, "", "node_"+out, inputs, []string{out}, attrs...)
	b.g.Node = append(b.g.Node, n)
	return out
}

// ints returns the name of a shared INT64 constant initializer with dims
// (nil for a scalar) and values v.
func (b *builder) ints(dims []int64, v ...int64) string {
	key := fmt.Sprint("i", dims, v)
	if name, ok := b.consts[key]; ok {
		return name
	}
	name := "const_" + strconv.Itoa(len(b.consts))
	b.g.Initializer = append(b.g.Initializer, moe.Int64Tensor(name, dims, v))
	b.consts[key] = name
	return name
}

// vec is a 1-D INT64 constant.
func (b *builder) vec(v ...int64) string { return b.ints([]int64{int64(len(v))}, v...) }

// scalarInt is a 0-D INT64 constant.
func (b *builder) scalarInt(v int64) string { return b.ints(nil, v) }

// zeroTensor is an all-zero tensor of the config's element type.
func (b *builder) zeroTensor(name string, dims ...int64) *pb.TensorProto {
	dt := b.cfg.elemType()
	if dt == pb.TensorProto_FLOAT {
		n := int64(1)
		for _, d := range dims {
			n *= d
		}
		return moe.Float32Tensor(name, dims, make([]float32, n))
	}
	size, _ := graph.ByteSize(dt, dims) // dims were validated by normalized()
	return &pb.TensorProto{Name: proto.String(name), Dims: dims, DataType: proto.Int32(int32(dt)), RawData: make([]byte, size)}
}

// zeros is a shared all-zero constant of the given dims and the config's
// element type.
func (b *builder) zeros(dims ...int64) string {
	key := fmt.Sprint("z", dims)
	if name, ok := b.consts[key]; ok {
		return name
	}
	name := "const_" + strconv.Itoa(len(b.consts))
	b.g.Initializer = append(b.g.Initializer, b.zeroTensor(name, dims...))
	b.consts[key] = name
	return name
}

// zerosLike returns a float zero tensor shaped like v: a baked-in constant
// of dims when the token count is static (as exporters write it), else
// ConstantOfShape(Shape(v)).
func (b *builder) zerosLike(p, v string, dims ...int64) string {
	if b.cfg.Tokens > 0 {
		return b.zeros(dims...)
	}
	sh := b.node("Shape", p+"zeros_shape", []string{v})
	return b.node("ConstantOfShape", p+"zeros", []string{sh},
		graph.TensorAttr("value", b.zeroTensor("", 1)))
}

// weight adds an initializer of the config's element type whose data comes
// from src: deferred (streamed at save time) when the config asks for
// external data, else generated now into raw_data.
func (b *builder) weight(name string, dims []int64, src *source) string {
	dt := b.cfg.elemType()
	src = src.in(dt)
	t := &pb.TensorProto{Name: proto.String(name), Dims: dims, DataType: proto.Int32(int32(dt))}
	if b.cfg.External {
		b.m.SetDeferred(t, graph.DeferredData{Size: src.elemBytes() * src.numel(), Write: src.writeTo})
	} else {
		t.RawData = src.bytes()
	}
	b.g.Initializer = append(b.g.Initializer, t)
	return name
}

// router emits view = Reshape(h, [-1, H]), the router Gemm with weight
// [E, H] (transB=1), its activation, TopK and the optional renormalisation.
// It returns view, the routing weights [T, k], the expert indices [T, k]
// and the router logits. In a half-precision model the Gemm computes in
// the half type and its logits are cast to float32 for the routing, as
// transformers' softmax(router_logits, dtype=torch.float) exports: the
// routing weights are float32.
func (b *builder) router(l int, p, h string) (view, w, idx, logits string) {
	c := b.cfg
	E, H := int64(c.Experts), int64(c.Hidden)
	k := keysFor(c, l)
	view = b.node("Reshape", p+"view", []string{h, b.vec(-1, H)}, graph.IntAttr("allowzero", 1))
	wr := b.weight("model."+p+"mlp.gate.weight", []int64{E, H}, contiguous(k.router, 0, E*H, H, c.Hidden))
	logits = b.node("Gemm", p+"router_logits", []string{view, wr},
		graph.FloatAttr("alpha", 1), graph.FloatAttr("beta", 1), graph.IntAttr("transA", 0), graph.IntAttr("transB", 1))
	lf := logits
	if c.half() {
		lf = b.cast(p+"router_logits_float", logits, pb.TensorProto_FLOAT)
	}
	var scores string
	if c.Router == moe.Sigmoid {
		scores = b.node("Sigmoid", p+"router_scores", []string{lf})
	} else {
		scores = b.node("Softmax", p+"router_scores", []string{lf}, graph.IntAttr("axis", -1))
	}
	vals, ids := p+"topk_values", p+"topk_indices"
	b.g.Node = append(b.g.Node, graph.NewNode("TopK", "", "node_"+p+"topk", []string{scores, b.vec(int64(c.TopK))}, []string{vals, ids},
		graph.IntAttr("axis", -1), graph.IntAttr("largest", 1), graph.IntAttr("sorted", 1)))
	w = vals
	if c.Normalize {
		sum := b.node("ReduceSum", p+"topk_sum", []string{vals, b.vec(-1)}, graph.IntAttr("keepdims", 1), graph.IntAttr("noop_with_empty_axes", 0))
		w = b.node("Div", p+"routing_weights", []string{vals, sum})
	}
	return view, w, ids, logits
}

// cast emits Cast(x, to) named out.
func (b *builder) cast(out, x string, to pb.TensorProto_DataType) string {
	return b.node("Cast", out, []string{x}, graph.IntAttr("to", int64(to)))
}

// weightsInType casts the float32 routing weights w of a half-precision
// model to its type (transformers' routing_weights.to(hidden_states.dtype),
// before the experts' outputs are weighted in that type); w as is for
// float32.
func (b *builder) weightsInType(p, w string) string {
	if !b.cfg.half() {
		return w
	}
	return b.cast(p+"routing_weights_cast", w, b.cfg.elemType())
}

// swiglu emits silu(g) * u with SiLU written as Sigmoid + Mul.
func (b *builder) swiglu(p, g, u string) string {
	s := b.node("Sigmoid", p+"gate_sigmoid", []string{g})
	silu := b.node("Mul", p+"silu", []string{g, s})
	return b.node("Mul", p+"act", []string{silu, u})
}

// gemmT emits Gemm(x, w, transB=1).
func (b *builder) gemmT(out, x, w string) string {
	return b.node("Gemm", out, []string{x, w},
		graph.FloatAttr("alpha", 1), graph.FloatAttr("beta", 1), graph.IntAttr("transA", 0), graph.IntAttr("transB", 1))
}

// shared adds the ungated shared SwiGLU expert on view to y, if configured.
func (b *builder) shared(l int, p, view, y string) string {
	c := b.cfg
	if c.SharedInter == 0 {
		return y
	}
	H, Is := int64(c.Hidden), int64(c.SharedInter)
	k := keysFor(c, l)
	q := "model." + p + "mlp.shared_expert."
	wg := b.weight(q+"gate_proj.weight", []int64{Is, H}, contiguous(k.sGate, 0, Is*H, H, c.Hidden))
	wu := b.weight(q+"up_proj.weight", []int64{Is, H}, contiguous(k.sUp, 0, Is*H, H, c.Hidden))
	wd := b.weight(q+"down_proj.weight", []int64{H, Is}, contiguous(k.sDown, 0, H*Is, Is, c.SharedInter))
	sp := p + "shared."
	g := b.gemmT(sp+"gate", view, wg)
	u := b.gemmT(sp+"up", view, wu)
	a := b.swiglu(sp, g, u)
	d := b.gemmT(sp+"down", a, wd)
	return b.node("Add", p+"moe_out", []string{y, d})
}

// batched writes transformers' batched_mm export: every token repeated k
// times, the stacked fused gate_up [E, 2I, H] and down [E, H, I] gathered by
// the flattened top-k indices, batched MatMuls, a Split into gate and up,
// and the weighted sum over the k slots.
func (b *builder) batched(l int, p, h string) string {
	c := b.cfg
	E, H, I, K := int64(c.Experts), int64(c.Hidden), int64(c.Inter), int64(c.TopK)
	k := keysFor(c, l)
	view, w, idx, _ := b.router(l, p, h)
	q := "model." + p + "mlp.experts."
	wgu := b.weight(q+"gate_up_proj", []int64{E, 2 * I, H}, gateUp(k.gate, k.up, E, I, H, false))
	wdn := b.weight(q+"down_proj", []int64{E, H, I}, contiguous(k.down, 0, E*H*I, I, c.Inter))
	xe := b.node("Unsqueeze", p+"x_unsq", []string{view, b.vec(1)})
	xk := b.node("Expand", p+"x_expand", []string{xe, b.vec(1, K, 1)})
	xr := b.node("Reshape", p+"x_repeat", []string{xk, b.vec(-1, H)})
	ids := b.node("Reshape", p+"ids_flat", []string{idx, b.vec(-1)}, graph.IntAttr("allowzero", 1))
	idc := b.node("Clip", p+"ids_clamp", []string{ids, b.scalarInt(0), b.scalarInt(E - 1)})
	idu := b.node("Unsqueeze", p+"ids_unsq", []string{idc, b.vec(-1)})
	wg := b.node("GatherND", p+"gate_up_w", []string{wgu, idu}, graph.IntAttr("batch_dims", 0))
	xu := b.node("Unsqueeze", p+"x_col", []string{xr, b.vec(-1)})
	gu := b.node("MatMul", p+"gate_up_bmm", []string{wg, xu})
	gus := b.node("Squeeze", p+"gate_up", []string{gu, b.vec(-1)})
	g, u := p+"gate", p+"up"
	b.g.Node = append(b.g.Node, graph.NewNode("Split", "", "node_"+p+"split", []string{gus}, []string{g, u},
		graph.IntAttr("axis", 1), graph.IntAttr("num_outputs", 2)))
	a := b.swiglu(p, g, u)
	wd := b.node("GatherND", p+"down_w", []string{wdn, idu}, graph.IntAttr("batch_dims", 0))
	au := b.node("Unsqueeze", p+"act_col", []string{a, b.vec(-1)})
	d := b.node("MatMul", p+"down_bmm", []string{wd, au})
	ds := b.node("Squeeze", p+"down", []string{d, b.vec(-1)})
	wf := b.node("Reshape", p+"weights_flat", []string{w, b.vec(-1)}, graph.IntAttr("allowzero", 1))
	wu := b.node("Unsqueeze", p+"weights_col", []string{wf, b.vec(-1)})
	if c.half() { // the expert outputs are weighted and summed in float32
		ds = b.cast(p+"down_float", ds, pb.TensorProto_FLOAT)
	}
	m := b.node("Mul", p+"weighted", []string{ds, wu})
	tk := int64(-1)
	if c.Tokens > 0 {
		tk = int64(c.Tokens)
	}
	m3 := b.node("Reshape", p+"per_slot", []string{m, b.vec(tk, K, H)}, graph.IntAttr("allowzero", 1))
	y := b.node("ReduceSum", p+"routed", []string{m3, b.vec(1)}, graph.IntAttr("keepdims", 0), graph.IntAttr("noop_with_empty_axes", 0))
	if c.half() {
		y = b.cast(p+"routed_cast", y, c.elemType())
	}
	return b.shared(l, p, view, y)
}

// unrolled writes the transformers 4.x loop over experts as the dynamo
// exporter unrolls it: a one-hot expert mask [E, k, T] from
// Equal(indices, arange(E)); per expert e, Gather(mask, e) -> NonZero picks
// its (slot, token) pairs, GatherND its tokens, three Gemms with its own
// w1/w3 [I, H] and w2 [H, I], the routing weight gathered per pair, and a
// ScatterND add into the output.
func (b *builder) unrolled(l int, p, h string) string {
	c := b.cfg
	E, H, I := int64(c.Experts), int64(c.Hidden), int64(c.Inter)
	k := keysFor(c, l)
	view, w, idx, _ := b.router(l, p, h)
	w = b.weightsInType(p, w)
	arange := make([]int64, E)
	for i := range arange {
		arange[i] = int64(i)
	}
	iu := b.node("Unsqueeze", p+"ids_unsq", []string{idx, b.vec(-1)})
	eq := b.node("Equal", p+"onehot_bool", []string{iu, b.vec(arange...)})
	oh := b.node("Cast", p+"onehot", []string{eq}, graph.IntAttr("to", int64(pb.TensorProto_INT64)))
	mask := b.node("Transpose", p+"expert_mask", []string{oh}, graph.IntsAttr("perm", 2, 1, 0))
	xu := b.node("Unsqueeze", p+"x_unsq", []string{view, b.vec(0)})
	xt := b.node("Transpose", p+"x_tok", []string{xu}, graph.IntsAttr("perm", 1, 0, 2))
	wu := b.node("Unsqueeze", p+"weights_unsq", []string{w, b.vec(2)})
	acc := b.zerosLike(p, view, int64(c.Tokens), H)
	c0, c1, c2 := b.vec(0), b.vec(1), b.vec(2)
	vm1 := b.vec(-1)
	shapeXH := b.vec(-1, H)
	q := "model." + p + "mlp.experts."
	for e := int64(0); e < E; e++ {
		es := strconv.FormatInt(e, 10)
		ep := p + "e" + es + "."
		w1 := b.weight(q+es+".w1.weight", []int64{I, H}, contiguous(k.gate, e*I*H, I*H, H, c.Hidden))
		w3 := b.weight(q+es+".w3.weight", []int64{I, H}, contiguous(k.up, e*I*H, I*H, H, c.Hidden))
		w2 := b.weight(q+es+".w2.weight", []int64{H, I}, contiguous(k.down, e*H*I, H*I, I, c.Inter))
		sel := b.node("Gather", ep+"select", []string{mask, b.scalarInt(e)}, graph.IntAttr("axis", 0))
		nz := b.node("NonZero", ep+"nonzero_raw", []string{sel})
		nzt := b.node("Transpose", ep+"nonzero", []string{nz}, graph.IntsAttr("perm", 1, 0))
		slot := b.node("Squeeze", ep+"slot", []string{b.node("Slice", ep+"slot_col", []string{nzt, c0, c1, c1}), c1})
		tok := b.node("Squeeze", ep+"token", []string{b.node("Slice", ep+"token_col", []string{nzt, c1, c2, c1}), c1})
		toku := b.node("Unsqueeze", ep+"token_idx", []string{tok, vm1})
		xs := b.node("GatherND", ep+"x_gather", []string{xt, toku}, graph.IntAttr("batch_dims", 0))
		xst := b.node("Transpose", ep+"x_index", []string{xs}, graph.IntsAttr("perm", 1, 0, 2))
		xs2 := b.node("Reshape", ep+"x", []string{xst, shapeXH}, graph.IntAttr("allowzero", 1))
		g := b.gemmT(ep+"w1", xs2, w1)
		s := b.node("Sigmoid", ep+"gate_sigmoid", []string{g})
		silu := b.node("Mul", ep+"silu", []string{g, s})
		u := b.gemmT(ep+"w3", xs2, w3)
		a := b.node("Mul", ep+"act", []string{silu, u})
		d := b.gemmT(ep+"w2", a, w2)
		slotu := b.node("Unsqueeze", ep+"slot_idx", []string{slot, vm1})
		ij := b.node("Concat", ep+"weight_idx", []string{toku, slotu}, graph.IntAttr("axis", -1))
		rw := b.node("GatherND", ep+"weight", []string{wu, ij}, graph.IntAttr("batch_dims", 0))
		m := b.node("Mul", ep+"weighted", []string{d, rw})
		acc = b.node("ScatterND", ep+"acc", []string{acc, toku, m}, graph.StringAttr("reduction", "add"))
	}
	return b.shared(l, p, view, acc)
}

// dense writes every expert on every token: the input expanded to [E, T, H],
// stacked w_gate, w_up [E, H, I] and w_down [E, I, H] MatMuls, and a [T, E]
// routing matrix ScatterElements(zeros, indices, weights) that weights the
// [E, T, H] outputs before the sum over experts.
func (b *builder) dense(l int, p, h string) string {
	c := b.cfg
	E, H, I := int64(c.Experts), int64(c.Hidden), int64(c.Inter)
	k := keysFor(c, l)
	view, w, idx, logits := b.router(l, p, h)
	w = b.weightsInType(p, w)
	q := "model." + p + "mlp."
	wg := b.weight(q+"w_gate", []int64{E, H, I}, transposedStack(k.gate, E, I, H))
	wup := b.weight(q+"w_up", []int64{E, H, I}, transposedStack(k.up, E, I, H))
	wdn := b.weight(q+"w_down", []int64{E, I, H}, transposedStack(k.down, E, H, I))
	z := b.zerosLike(p, logits, int64(c.Tokens), E)
	route := b.node("ScatterElements", p+"routing", []string{z, idx, w}, graph.IntAttr("axis", 1), graph.StringAttr("reduction", "none"))
	xu := b.node("Unsqueeze", p+"x_unsq", []string{view, b.vec(0)})
	xx := b.node("Expand", p+"x_expand", []string{xu, b.vec(E, 1, 1)})
	g := b.node("MatMul", p+"gate", []string{xx, wg})
	u := b.node("MatMul", p+"up", []string{xx, wup})
	a := b.swiglu(p, g, u)
	d := b.node("MatMul", p+"down", []string{a, wdn})
	rt := b.node("Transpose", p+"routing_t", []string{route}, graph.IntsAttr("perm", 1, 0))
	ru := b.node("Unsqueeze", p+"routing_col", []string{rt, b.vec(-1)})
	m := b.node("Mul", p+"weighted", []string{d, ru})
	y := b.node("ReduceSum", p+"routed", []string{m, b.vec(0)}, graph.IntAttr("keepdims", 0), graph.IntAttr("noop_with_empty_axes", 0))
	return b.shared(l, p, view, y)
}

// ort writes one com.microsoft::MoE node (QMoE with Config.Quant) fed by
// the router logits; see ORT_MOE.md for the input order, layouts and
// attributes.
func (b *builder) ort(l int, p, h string) string {
	c := b.cfg
	E, H, I := int64(c.Experts), int64(c.Hidden), int64(c.Inter)
	k := keysFor(c, l)
	wr := b.weight("model."+p+"mlp.gate.weight", []int64{E, H}, contiguous(k.router, 0, E*H, H, c.Hidden))
	logits := b.gemmT(p+"router_logits", h, wr)
	q := "model." + p + "mlp.moe."
	norm := int64(0)
	if c.Normalize {
		norm = 1
	}
	attrs := []*pb.AttributeProto{graph.IntAttr("k", int64(c.TopK)), graph.IntAttr("normalize_routing_weights", norm)}
	var inputs []string
	fc2 := func() string {
		return b.weight(q+"fc2_experts_weights", []int64{E, H, I}, contiguous(k.down, 0, E*H*I, I, c.Inter))
	}
	if c.Quant != "" {
		return b.qmoe(p, h, logits, k)
	}
	if c.ORTSwiGLU {
		fc1 := b.weight(q+"fc1_experts_weights", []int64{E, 2 * I, H}, gateUp(k.gate, k.up, E, I, H, true))
		inputs = []string{h, logits, fc1, "", fc2()}
		attrs = append(attrs, graph.StringAttr("activation_type", "swiglu"), graph.IntAttr("swiglu_fusion", 1),
			graph.FloatAttr("activation_alpha", 1), graph.FloatAttr("activation_beta", 0),
			graph.FloatAttr("swiglu_limit", math.MaxFloat32))
	} else {
		fc1 := b.weight(q+"fc1_experts_weights", []int64{E, I, H}, contiguous(k.gate, 0, E*I*H, H, c.Hidden))
		f2 := fc2()
		fc3 := b.weight(q+"fc3_experts_weights", []int64{E, I, H}, contiguous(k.up, 0, E*I*H, H, c.Hidden))
		inputs = []string{h, logits, fc1, "", f2, "", fc3}
		attrs = append(attrs, graph.StringAttr("activation_type", "silu"))
	}
	out := p + "moe_out"
	b.g.Node = append(b.g.Node, graph.NewNode("MoE", ORTDomain, "node_"+out, inputs, []string{out}, attrs...))
	return out
}

// qmoe writes one com.microsoft::QMoE node: fc1 = gate and up interleaved
// [E, 2I, H], fc2 = down [E, H, I], quantized by ortmoe.Quantize (symmetric,
// default zero point), with their float scales.
func (b *builder) qmoe(p, h, logits string, k layerKeys) string {
	c := b.cfg
	E, H, I := int64(c.Experts), int64(c.Hidden), int64(c.Inter)
	bits := c.quantBits()
	q := "model." + p + "mlp.moe."
	quant := func(role string, src *source, N, K int64) (string, string) {
		v := make([]float32, src.numel())
		src.fill(v, 0)
		qb, sc, err := ortmoe.Quantize(v, int(E), int(N), int(K), bits, c.QuantBlockSize)
		if err != nil {
			panic(err) // sizes were validated by normalized()
		}
		t := &pb.TensorProto{Name: proto.String(q + role + "_experts_weights"), Dims: []int64{E, N, K * int64(bits) / 8},
			DataType: proto.Int32(int32(pb.TensorProto_UINT8))}
		if c.External {
			b.m.SetDeferred(t, graph.DeferredData{Size: int64(len(qb)), Write: func(w io.Writer) error { _, err := w.Write(qb); return err }})
		} else {
			t.RawData = qb
		}
		b.g.Initializer = append(b.g.Initializer, t)
		sd := []int64{E, N}
		if c.QuantBlockSize > 0 {
			sd = append(sd, K/int64(c.QuantBlockSize))
		}
		scales := moe.Float32Tensor(q+role+"_scales", sd, sc)
		b.g.Initializer = append(b.g.Initializer, scales)
		return t.GetName(), scales.GetName()
	}
	fc1, s1 := quant("fc1", gateUp(k.gate, k.up, E, I, H, true), 2*I, H)
	fc2, s2 := quant("fc2", contiguous(k.down, 0, E*H*I, I, c.Inter), H, I)
	a := ortmoe.Attrs{Quantized: true, Bits: bits, BlockSize: c.QuantBlockSize, K: c.TopK, Activation: ortmoe.SwiGLU,
		Fusion: ortmoe.FusionInterleaved, Normalize: true, Alpha: 1, Limit: float32(math.Inf(1))}
	out := p + "moe_out"
	b.g.Node = append(b.g.Node, graph.NewNode(ortmoe.OpQMoE, ORTDomain, "node_"+out, []string{h, logits, fc1, s1, "", fc2, s2}, []string{out}, a.NodeAttrs()...))
	return out
}
