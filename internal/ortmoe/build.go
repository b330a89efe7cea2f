package ortmoe

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// Graph names of the models Case.Model builds.
const (
	InputName  = "input"
	OutputName = "output"
	TokensDim  = "tokens"
)

// Case describes a small model made of one router Gemm and one
// com.microsoft::MoE (or QMoE, when Attrs.Quantized) node, with random
// weights: the test vehicle for the kernels, the conversion and ONNX Runtime.
type Case struct {
	// Name names the case in test output.
	Name string
	// Attrs are the node's attributes.
	Attrs Attrs
	// E, H, I are the expert count, hidden and intermediate sizes.
	E, H, I int
	// FC3 adds fc3 (up) weights: the silu+fc3 Mixtral form, or SwiGLU with
	// swiglu_fusion 0.
	FC3 bool
	// Bias adds fc1/fc2 (and fc3) expert biases.
	Bias bool
	// Legacy writes the float weights in the legacy [E, in, out] layout.
	Legacy bool
	// WeightScale multiplies every expert weight (default 1): larger values
	// push SwiGLU inputs past swiglu_limit.
	WeightScale float32
	// Seed selects the weights.
	Seed uint64
}

// Built is a Case's model with the weights it computes with, in the
// current [E, out, in] layout (dequantized for QMoE).
type Built struct {
	Model   *graph.Model
	Router  []float32 // [E, H]
	Experts *Experts
}

// Model builds the case: input "input" [tokens, H] → Gemm (router weight
// [E, H], transB) → logits → MoE/QMoE → "output".
func (c *Case) Model() (*Built, error) {
	a := &c.Attrs
	if a.K < 1 || a.K > c.E {
		return nil, fmt.Errorf("case %s: k %d not in 1..%d", c.Name, a.K, c.E)
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x6f72746d6f65))
	scale := c.WeightScale
	if scale == 0 {
		scale = 1
	}
	gen := func(n, fanIn int, s float32) []float32 {
		v := make([]float32, n)
		b := s / float32(math.Sqrt(float64(fanIn)))
		for i := range v {
			v[i] = (rng.Float32()*2 - 1) * b
		}
		return v
	}
	E, H, I := c.E, c.H, c.I
	f := 1
	if a.fused() {
		f = 2
	}
	w := &Experts{E: E, H: H, I: I}
	router := gen(E*H, H, 4)
	w.FC1 = gen(E*f*I*H, H, scale)
	w.FC2 = gen(E*H*I, I, scale)
	if c.FC3 {
		w.FC3 = gen(E*I*H, H, scale)
	}
	if c.Bias {
		w.FC1B = gen(E*f*I, 1, 0.1)
		w.FC2B = gen(E*H, 1, 0.1)
		if c.FC3 {
			w.FC3B = gen(E*I, 1, 0.1)
		}
	}
	g := &pb.GraphProto{Name: proto.String("ortmoe_" + c.Name)}
	mp := &pb.ModelProto{IrVersion: proto.Int64(10), ProducerName: proto.String("mokopt-ortmoe"), Graph: g,
		OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}, {Domain: proto.String(Domain), Version: proto.Int64(1)}}}
	m := &graph.Model{Proto: mp, Dir: "."}
	g.Input = []*pb.ValueInfoProto{valueInfo(InputName, H)}
	g.Output = []*pb.ValueInfoProto{valueInfo(OutputName, H)}
	addF := func(name string, dims []int64, v []float32) string {
		if v == nil {
			return ""
		}
		g.Initializer = append(g.Initializer, float32Tensor(name, dims, v))
		return name
	}
	addF("router.weight", []int64{int64(E), int64(H)}, router)
	g.Node = append(g.Node, graph.NewNode("Gemm", "", "router", []string{InputName, "router.weight"}, []string{"router_logits"}, graph.IntAttr("transB", 1)))
	e64, h64, i64, f64 := int64(E), int64(H), int64(I), int64(f)
	var inputs []string
	op := OpMoE
	if !a.Quantized {
		lay := func(v []float32, r, cc int) ([]float32, []int64) {
			if v == nil {
				return nil, nil
			}
			if c.Legacy {
				return transposeStack(v, E, r, cc), []int64{e64, int64(cc), int64(r)}
			}
			return v, []int64{e64, int64(r), int64(cc)}
		}
		fc1, d1 := lay(w.FC1, f*I, H)
		fc2, d2 := lay(w.FC2, H, I)
		fc3, d3 := lay(w.FC3, I, H)
		inputs = []string{InputName, "router_logits",
			addF("fc1_experts_weights", d1, fc1), addF("fc1_experts_bias", []int64{e64, f64 * i64}, w.FC1B),
			addF("fc2_experts_weights", d2, fc2), addF("fc2_experts_bias", []int64{e64, h64}, w.FC2B),
			addF("fc3_experts_weights", d3, fc3), addF("fc3_experts_bias", []int64{e64, i64}, w.FC3B)}
	} else {
		if c.Legacy {
			return nil, fmt.Errorf("case %s: QMoE has no legacy layout", c.Name)
		}
		op = OpQMoE
		quant := func(name string, v []float32, N, K int) (string, string, []float32, error) {
			if v == nil {
				return "", "", nil, nil
			}
			q, s, err := Quantize(v, E, N, K, a.Bits, a.BlockSize)
			if err != nil {
				return "", "", nil, fmt.Errorf("case %s: %s: %w", c.Name, name, err)
			}
			t := &pb.TensorProto{Name: proto.String(name + "_experts_weights"), Dims: []int64{e64, int64(N), int64(K * a.Bits / 8)},
				DataType: proto.Int32(int32(pb.TensorProto_UINT8)), RawData: q}
			g.Initializer = append(g.Initializer, t)
			sd := []int64{e64, int64(N)}
			if a.BlockSize > 0 {
				sd = append(sd, int64(K/a.BlockSize))
			}
			return t.GetName(), addF(name+"_scales", sd, s), Dequantized(q, s, E, N, K, a.Bits, a.BlockSize), nil
		}
		var n1, s1, n2, s2, n3, s3 string
		var err error
		if n1, s1, w.FC1, err = quant("fc1", w.FC1, f*I, H); err != nil {
			return nil, err
		}
		if n2, s2, w.FC2, err = quant("fc2", w.FC2, H, I); err != nil {
			return nil, err
		}
		if n3, s3, w.FC3, err = quant("fc3", w.FC3, I, H); err != nil {
			return nil, err
		}
		inputs = []string{InputName, "router_logits",
			n1, s1, addF("fc1_experts_bias", []int64{e64, f64 * i64}, w.FC1B),
			n2, s2, addF("fc2_experts_bias", []int64{e64, h64}, w.FC2B),
			n3, s3, addF("fc3_experts_bias", []int64{e64, i64}, w.FC3B)}
	}
	for len(inputs) > 0 && inputs[len(inputs)-1] == "" {
		inputs = inputs[:len(inputs)-1]
	}
	g.Node = append(g.Node, graph.NewNode(op, Domain, "moe", inputs, []string{OutputName}, a.NodeAttrs()...))
	return &Built{Model: m, Router: router, Experts: w}, nil
}

// AddZeroPoints gives the QMoE node of m, built from c, explicit fc1 zero
// points (one per scale group, packed like the codes, drawn from c's
// seed), which every kernel applies; Built.Experts does not.
func (c *Case) AddZeroPoints(m *graph.Model) {
	g := m.Proto.Graph
	n := g.Node[len(g.Node)-1]
	f := 1
	if c.Attrs.fused() {
		f = 2
	}
	groups := 1
	if c.Attrs.BlockSize > 0 {
		groups = c.H / c.Attrs.BlockSize
	}
	pack := 8 / c.Attrs.Bits
	zp := make([]byte, c.E*f*c.I*groups/pack)
	rng := rand.New(rand.NewPCG(uint64(c.Seed), 9))
	for i := range zp {
		zp[i] = byte(rng.IntN(256))
	}
	g.Initializer = append(g.Initializer, &pb.TensorProto{Name: proto.String("fc1_zero_points"),
		Dims: []int64{int64(c.E), int64(f * c.I * groups / pack)}, DataType: proto.Int32(int32(pb.TensorProto_UINT8)), RawData: zp})
	for len(n.Input) <= QFC1Zero {
		n.Input = append(n.Input, "")
	}
	n.Input[QFC1Zero] = "fc1_zero_points"
}

func valueInfo(name string, h int) *pb.ValueInfoProto {
	return &pb.ValueInfoProto{Name: proto.String(name), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
		ElemType: proto.Int32(int32(pb.TensorProto_FLOAT)),
		Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{
			{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: TokensDim}},
			{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: int64(h)}}}},
	}}}}
}

// Reference computes the built model's output for x [T, H] with the Go
// kernel directly (router Gemm, then Forward).
func (b *Built) Reference(a *Attrs, x []float32, T int) ([]float32, error) {
	E, H := b.Experts.E, b.Experts.H
	logits := make([]float32, T*E)
	for t := 0; t < T; t++ {
		for e := 0; e < E; e++ {
			logits[t*E+e] = dot(x[t*H:(t+1)*H], b.Router[e*H:(e+1)*H])
		}
	}
	return a.Forward(b.Experts, x, logits, T)
}

// Cases are the attribute combinations the tests run through the kernels,
// the conversion to ai.mok::MoE and ONNX Runtime: SwiGLU interleaved,
// concatenated and separate (fc3), GPT-OSS's clamped form with biases,
// silu with fc3 (Mixtral), relu, gelu, identity, k = 1..3, with and without
// renormalisation, the legacy layout, the sparse mixer, and QMoE int8/int4
// with per-row and block-wise scales.
func Cases() []Case {
	inf := float32(math.Inf(1))
	sw := func(fusion int, alpha, beta, limit float32, norm bool) Attrs {
		return Attrs{K: 2, Activation: SwiGLU, Fusion: fusion, Alpha: alpha, Beta: beta, Limit: limit, Normalize: norm}
	}
	q := func(bits, block int, a Attrs) Attrs {
		a.Quantized, a.Bits, a.BlockSize = true, bits, block
		return a
	}
	return []Case{
		{Name: "swiglu_interleaved_norm", Attrs: sw(1, 1, 0, inf, true), E: 8, H: 16, I: 24, Seed: 1},
		{Name: "swiglu_interleaved_nonorm", Attrs: sw(1, 1, 0, inf, false), E: 8, H: 16, I: 24, Seed: 2},
		{Name: "swiglu_oai_bias", Attrs: sw(1, 1.702, 1, 7, true), E: 8, H: 16, I: 24, Bias: true, WeightScale: 6, Seed: 3},
		{Name: "swiglu_clamped_k1", Attrs: Attrs{K: 1, Activation: SwiGLU, Fusion: 1, Alpha: 1, Limit: 0.5}, E: 4, H: 16, I: 16, WeightScale: 3, Seed: 17},
		{Name: "swiglu_alpha2", Attrs: sw(1, 2, 0, inf, true), E: 4, H: 16, I: 16, Seed: 18},
		{Name: "swiglu_concat", Attrs: sw(2, 1, 0, inf, true), E: 8, H: 16, I: 24, Seed: 4},
		{Name: "swiglu_fc3_bias", Attrs: sw(0, 1, 0, inf, true), E: 8, H: 16, I: 24, FC3: true, Bias: true, Seed: 5},
		{Name: "silu_fc3", Attrs: Attrs{K: 2, Activation: Silu, Normalize: true}, E: 8, H: 16, I: 24, FC3: true, Seed: 6},
		{Name: "silu_k3", Attrs: Attrs{K: 3, Activation: Silu, Normalize: true}, E: 6, H: 16, I: 32, Seed: 9},
		{Name: "relu_k1", Attrs: Attrs{K: 1, Activation: Relu}, E: 4, H: 16, I: 32, Seed: 7},
		{Name: "gelu_bias", Attrs: Attrs{K: 2, Activation: Gelu}, E: 4, H: 16, I: 32, Bias: true, Seed: 8},
		{Name: "identity", Attrs: Attrs{K: 2, Activation: Identity}, E: 4, H: 16, I: 32, Seed: 10},
		{Name: "swiglu_legacy", Attrs: sw(1, 1, 0, inf, true), E: 4, H: 16, I: 24, Legacy: true, Seed: 11},
		{Name: "sparse_mixer", Attrs: Attrs{K: 2, Activation: SwiGLU, Fusion: 1, Alpha: 1, Limit: inf, SparseMixer: true}, E: 8, H: 16, I: 24, Seed: 12},
		{Name: "qmoe_int8_swiglu", Attrs: q(8, 0, sw(1, 1, 0, inf, true)), E: 8, H: 32, I: 32, Seed: 13},
		{Name: "qmoe_int4_swiglu_nonorm", Attrs: q(4, 0, sw(1, 1, 0, inf, false)), E: 8, H: 32, I: 32, Seed: 14},
		{Name: "qmoe_int4_block16_oai_bias", Attrs: q(4, 16, sw(1, 1.702, 1, 7, true)), E: 8, H: 32, I: 32, Bias: true, WeightScale: 6, Seed: 15},
		{Name: "qmoe_int8_block32_swiglu", Attrs: q(8, 32, sw(1, 1, 0, inf, true)), E: 4, H: 64, I: 32, Seed: 19},
		{Name: "qmoe_int8_relu", Attrs: q(8, 0, Attrs{K: 2, Activation: Relu}), E: 4, H: 32, I: 32, Seed: 16},
	}
}

// float32Tensor is a FLOAT initializer (raw little-endian data) with dims
// and, when name is not "", a name.
func float32Tensor(name string, dims []int64, v []float32) *pb.TensorProto {
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
