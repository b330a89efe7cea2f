package lowering

import (
	"context"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/kernel"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// blockCfg describes a synthetic fused MoE block.
type blockCfg struct {
	E, K, H, I, Is int
	Gated          bool   // sigmoid-gated shared expert
	Act            string // default moe.SwiGLU
	Limit          float32
	RouterAct      string // default softmax
	Order          string // default activation_then_topk
	Norm           bool
	Scale          float32 // routed_scaling_factor, default 1
	Alpha          float32 // swiglu_alpha, default 1
	NGroup, TopKG  int
	CBias, RBias   bool
	ExpertBias     bool
	WeightsOnInput bool
	ZeroRouted     bool    // routed weights all zero (only the shared expert contributes)
	SMThreshold    float32 // sparsemixer_threshold, with RouterAct moe.SparseMixer
	GroupMax       bool    // groups scored by their best expert
	IO             string  // io_type: moe.IOFloat16 or moe.IOBFloat16 ("" float32)
	Seed           int64
}

func (c blockCfg) spec() *moe.Spec {
	s := &moe.Spec{NumExperts: c.E, TopK: c.K, Hidden: c.H, Inter: c.I, SharedInter: c.Is, SharedGated: c.Gated,
		RouterActivation: c.RouterAct, RouterOrder: c.Order, NormalizeTopK: c.Norm, RoutedScalingFactor: c.Scale,
		NGroup: max(c.NGroup, 1), TopKGroup: max(c.TopKG, 1), CorrectionBias: c.CBias, RouterBias: c.RBias,
		Activation: c.Act, SwiGLULimit: c.Limit, SwiGLUAlpha: 1, ExpertBias: c.ExpertBias, WeightsOnInput: c.WeightsOnInput, EPSize: 1}
	if c.Alpha != 0 {
		s.SwiGLUAlpha = c.Alpha
	}
	if s.RouterActivation == "" {
		s.RouterActivation = moe.Softmax
	}
	s.SparseMixerThreshold, s.IOType = c.SMThreshold, c.IO
	if c.GroupMax {
		s.GroupScore = moe.GroupScoreMax
	}
	if s.RouterOrder == "" {
		s.RouterOrder = moe.ActivationThenTopK
	}
	if s.RoutedScalingFactor == 0 {
		s.RoutedScalingFactor = 1
	}
	if s.Activation == "" {
		s.Activation = moe.SwiGLU
	}
	return s
}

// buildFused returns a model with one ai.mok::MoE node (input hidden_states
// [T, H] with T symbolic, output y), its spec and its weights.
func buildFused(t testing.TB, c blockCfg) (*graph.Model, *moe.Spec, *moe.Weights) {
	t.Helper()
	s := c.spec()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(c.Seed + 1))
	randn := func(n int, std float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64() * std)
		}
		return v
	}
	E, H, I, Is := c.E, c.H, c.I, c.Is
	w := &moe.Weights{RouterW: randn(E*H, 1/math.Sqrt(float64(H)))}
	if c.RBias {
		w.RouterB = randn(E, 0.1)
	}
	if c.CBias {
		w.CorrectionBias = randn(E, 0.1)
	}
	routedStd := 1.0
	if c.ZeroRouted {
		routedStd = 0
	}
	if s.Activation != moe.GELU {
		w.Gate = randn(E*I*H, routedStd/math.Sqrt(float64(H)))
	}
	w.Up = randn(E*I*H, routedStd/math.Sqrt(float64(H)))
	w.Down = randn(E*H*I, routedStd/math.Sqrt(float64(I)))
	if c.ExpertBias {
		w.GateB, w.UpB, w.DownB = randn(E*I, 0.1), randn(E*I, 0.1), randn(E*H, 0.1)
	}
	if Is > 0 {
		w.SharedGate = randn(Is*H, 1/math.Sqrt(float64(H)))
		w.SharedUp = randn(Is*H, 1/math.Sqrt(float64(H)))
		w.SharedDown = randn(H*Is, 1/math.Sqrt(float64(Is)))
		if c.Gated {
			w.SharedGateW = randn(H, 1/math.Sqrt(float64(H)))
		}
	}
	g := &pb.GraphProto{Name: proto.String("moe_block")}
	in := make([]string, moe.NumInputs)
	in[moe.InHidden] = "hidden_states"
	add := func(pos int, dims []int64, v []float32) {
		if v == nil {
			return
		}
		name := "w/" + moe.InputNames[pos]
		g.Initializer = append(g.Initializer, moe.Float32Tensor(name, dims, v))
		in[pos] = name
	}
	e, h, i, is := int64(E), int64(H), int64(I), int64(Is)
	add(moe.InRouterW, []int64{e, h}, w.RouterW)
	add(moe.InRouterB, []int64{e}, w.RouterB)
	add(moe.InCorrectionBias, []int64{e}, w.CorrectionBias)
	add(moe.InGate, []int64{e, i, h}, w.Gate)
	add(moe.InUp, []int64{e, i, h}, w.Up)
	add(moe.InDown, []int64{e, h, i}, w.Down)
	add(moe.InGateBias, []int64{e, i}, w.GateB)
	add(moe.InUpBias, []int64{e, i}, w.UpB)
	add(moe.InDownBias, []int64{e, h}, w.DownB)
	add(moe.InSharedGate, []int64{is, h}, w.SharedGate)
	add(moe.InSharedUp, []int64{is, h}, w.SharedUp)
	add(moe.InSharedDown, []int64{h, is}, w.SharedDown)
	add(moe.InSharedGateW, []int64{1, h}, w.SharedGateW)
	for len(in) > 0 && in[len(in)-1] == "" {
		in = in[:len(in)-1]
	}
	n := graph.NewNode(moe.OpType, moe.Domain, "layer0/MoE", in, []string{"y"}, s.Attributes()...)
	n.Overload = proto.String(s.Overload())
	g.Node = []*pb.NodeProto{n}
	g.Input = []*pb.ValueInfoProto{typedValue("hidden_states", "T", H, s.IOElemType())}
	g.Output = []*pb.ValueInfoProto{typedValue("y", "T", H, s.IOElemType())}
	f, err := moe.Function(s, 18)
	if err != nil {
		t.Fatal(err)
	}
	mp := &pb.ModelProto{IrVersion: proto.Int64(10), ProducerName: proto.String("lowering_test"), Graph: g,
		Functions: []*pb.FunctionProto{f},
		OpsetImport: []*pb.OperatorSetIdProto{
			{Domain: proto.String(""), Version: proto.Int64(18)},
			{Domain: proto.String(moe.Domain), Version: proto.Int64(moe.Version)}}}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(mp)
	if err != nil {
		t.Fatal(err)
	}
	m, err := graph.Parse(b, "")
	if err != nil {
		t.Fatal(err)
	}
	return m, s, w
}

// typedValue declares a tensor [sym, h] of element type dt.
func typedValue(name, sym string, h int, dt pb.TensorProto_DataType) *pb.ValueInfoProto {
	dims := []*pb.TensorShapeProto_Dimension{
		{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: sym}},
		{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: int64(h)}},
	}
	return &pb.ValueInfoProto{Name: proto.String(name), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{
		TensorType: &pb.TypeProto_Tensor{ElemType: proto.Int32(int32(dt)), Shape: &pb.TensorShapeProto{Dim: dims}}}}}
}

// cloneModel returns an independent copy of an in-memory model.
func cloneModel(t testing.TB, m *graph.Model) *graph.Model {
	t.Helper()
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	c, err := graph.Parse(b, "")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// randInput returns T×H standard normal values.
func randInput(T, H int, seed int64) []float32 {
	r := rand.New(rand.NewSource(seed))
	x := make([]float32, T*H)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func defaultOpts() Options {
	return Options{Target: kernel.GB300NVL72, EP: 8}
}

// lowerAndSave lowers a copy of m and saves it to dir/name.onnx; it returns
// the report and the path.
func lowerAndSave(t testing.TB, m *graph.Model, opt Options, dir, name string) (*Report, string) {
	t.Helper()
	c := cloneModel(t, m)
	rep, err := Lower(c, opt)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".onnx")
	if err := c.Save(path, graph.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	return rep, path
}

// loadForEval loads a saved lowered model with its FP8 initializers decoded.
func loadForEval(t testing.TB, path string) *graph.Model {
	t.Helper()
	m, err := graph.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if n, err := DecodeFP8ForEval(m); err != nil || n == 0 {
		t.Fatalf("DecodeFP8ForEval: %d tensors, %v", n, err)
	}
	return m
}

// run evaluates m on x [T, H] and returns y plus the captured values.
func run(t testing.TB, m *graph.Model, x []float32, T, H int, opt eval.Options, capture ...string) (map[string]*eval.Tensor, []float32) {
	t.Helper()
	want := map[string]bool{}
	for _, c := range capture {
		want[c] = true
	}
	if len(capture) > 0 {
		opt.Capture = func(n string) bool { return want[n] }
	}
	out, err := eval.Run(context.Background(), m, map[string]*eval.Tensor{"hidden_states": eval.NewFloat32([]int{T, H}, append([]float32(nil), x...))}, opt)
	if err != nil {
		t.Fatal(err)
	}
	y := out["y"]
	if y == nil || y.F32 == nil || len(y.F32) != T*H {
		t.Fatalf("output y: %v", y)
	}
	return out, y.F32
}

// errStats compares got with want: the largest absolute error, the largest
// |want|, the relative L2 error and the mean relative error
// mean|got−want| / mean|want|.
type errStats struct {
	MaxAbs, MaxRef, RelL2, MeanRel float64
}

func compare(got, want []float32) errStats {
	var s errStats
	var d2, w2, dAbs, wAbs float64
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		w := math.Abs(float64(want[i]))
		s.MaxAbs = max(s.MaxAbs, d)
		s.MaxRef = max(s.MaxRef, w)
		d2 += d * d
		w2 += w * w
		dAbs += d
		wAbs += w
	}
	s.RelL2 = math.Sqrt(d2 / w2)
	s.MeanRel = dAbs / wAbs
	return s
}

func fileBytes(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mkdir(dir string) error { return os.MkdirAll(dir, 0o755) }
