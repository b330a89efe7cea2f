package passes

import (
	"context"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/models"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// toHalf turns a float32 model into the half-precision model an exporter
// writes for a float16 or bfloat16 module: every FLOAT initializer, Constant
// tensor, declared type and Cast target becomes dt.
func toHalf(t *testing.T, m *graph.Model, dt pb.TensorProto_DataType) {
	t.Helper()
	conv := func(tp *pb.TensorProto) *pb.TensorProto {
		if graph.DataType(tp) != pb.TensorProto_FLOAT {
			return tp
		}
		x, err := eval.FromProto(tp, m.TensorBytes)
		if err != nil {
			t.Fatal(err)
		}
		x.DType = dt
		out, err := eval.ToProto(x, tp.GetName())
		if err != nil {
			t.Fatal(err)
		}
		out.Dims = tp.GetDims()
		if tp.Name == nil {
			out.Name = nil
		}
		return out
	}
	g := m.Proto.Graph
	for i, tp := range g.Initializer {
		g.Initializer[i] = conv(tp)
	}
	for _, list := range [][]*pb.ValueInfoProto{g.Input, g.Output, g.ValueInfo} {
		for _, vi := range list {
			if tt := vi.GetType().GetTensorType(); tt != nil && tt.GetElemType() == int32(pb.TensorProto_FLOAT) {
				tt.ElemType = proto.Int32(int32(dt))
			}
		}
	}
	for _, n := range g.Node {
		for _, a := range n.Attribute {
			if a.T != nil {
				a.T = conv(a.T)
			}
			if n.GetOpType() == "Cast" && a.GetName() == "to" && a.GetI() == int64(pb.TensorProto_FLOAT) {
				a.I = proto.Int64(int64(dt))
			}
		}
	}
}

// TestHalfPrecisionExports: float16 and bfloat16 versions of exported blocks
// fuse (I/O type recorded in the spec and the overload), and the fused
// model — through the reference kernel and through its function body —
// matches the original half-precision model to the precision the type
// carries, with the output in the original's type.
func TestHalfPrecisionExports(t *testing.T) {
	for _, name := range []string{"mixtral_block_dynamo_batched_mm", "deepseek_v3_block_dynamo_batched_mm", "hf4_mixtral_block_torchscript", "gpt_oss_block_dynamo_batched_mm"} {
		f := filepath.Join(fixtureDir, name+".onnx")
		for _, dt := range []pb.TensorProto_DataType{pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16} {
			t.Run(name+"/"+dt.String(), func(t *testing.T) {
				orig, err := graph.Load(f)
				if err != nil {
					t.Skipf("fixture: %v", err)
				}
				toHalf(t, orig, dt)
				fused := &graph.Model{Proto: proto.Clone(orig.Proto).(*pb.ModelProto), Path: "fused", Dir: orig.Dir}
				rep, err := Rewrite(fused, Options{Check: true})
				if err != nil {
					t.Fatal(err)
				}
				io, _ := moe.IOTypeOf(dt)
				if len(rep.Fused) != 1 || rep.Fused[0].Block.Spec.IOType != io || rep.Fused[0].Block.Spec.WeightType != io ||
					!strings.HasSuffix(rep.Fused[0].Variant, map[string]string{moe.IOFloat16: "_f16io_f16w", moe.IOBFloat16: "_bf16io_bf16w"}[io]) {
					t.Fatalf("fused %d blocks, variant %q, io_type %q; want 1 with io_type and weight_type %q", len(rep.Fused), rep.Fused[0].Variant, rep.Fused[0].Block.Spec.IOType, io)
				}
				keptHalfWeights(t, fused, dt)
				matchesHalf(t, orig, fused, dt, rep.Fused[0].Block.Spec)
			})
		}
	}
}

// matchesHalf runs a half-precision model and its fused rewrite (through
// the reference kernel and through the function body) on 16 random tokens
// of type dt and requires the fused outputs, in the original's type, to
// match to the precision dt carries, skipping tokens whose routing is a
// near-tie at that precision (at most half of them).
func matchesHalf(t *testing.T, orig, fused *graph.Model, dt pb.TensorProto_DataType, spec moe.Spec) {
	t.Helper()
	var shape []int
	for _, d := range orig.Proto.Graph.Input[0].GetType().GetTensorType().GetShape().GetDim() {
		shape = append(shape, int(d.GetDimValue()))
	}
	H := shape[len(shape)-1]
	rng := rand.New(rand.NewPCG(7, uint64(dt)))
	n := 1
	for _, d := range shape {
		n *= d
	}
	vals := make([]float32, n)
	for i := range vals {
		vals[i] = float32(rng.NormFloat64())
	}
	x := eval.NewFloatAs(dt, shape, vals)
	feeds := map[string]*eval.Tensor{orig.Proto.Graph.Input[0].GetName(): x}
	want, err := eval.Run(context.Background(), orig, feeds, eval.Options{})
	if err != nil {
		t.Fatal(err)
	}
	out := orig.Proto.Graph.Output[0].GetName()
	w := want[out]
	peak := 0.0
	for _, v := range w.F32 {
		peak = max(peak, math.Abs(float64(v)))
	}
	rtol, atol, _ := checkTolerance(dt, peak)
	tokens := len(x.F32) / H
	gaps := moe.RouteGaps(&spec, routerWeights(t, fused), x.F32, tokens)
	skipped := 0
	skip := func(tok int) bool {
		if gaps[tok] < moe.NearTie(dt) {
			skipped++
			return true
		}
		return false
	}
	for _, body := range []bool{false, true} {
		got, err := eval.Run(context.Background(), fused, feeds, eval.Options{PreferFunctions: body})
		if err != nil {
			t.Fatalf("function body %v: %v", body, err)
		}
		g := got[out]
		if g.DType != dt {
			t.Fatalf("function body %v: output is %s, want %s", body, g.DType, dt)
		}
		if off, worst, at := tokensOff(g.F32, w.F32, H, rtol, atol, skip); off > 0 {
			t.Errorf("function body %v: %d of %d tokens off, worst %.3g at %d (peak %.3g)", body, off, tokens, worst, at, peak)
		}
	}
	// Some near-ties (tiny random routers have close scores), but most
	// tokens compared.
	if skipped > tokens {
		t.Errorf("%d of %d token comparisons skipped as near-ties", skipped, 2*tokens)
	}
	t.Logf("%d of %d token comparisons skipped as near-ties", skipped, 2*tokens)
}

// TestRealHalfPrecisionExports: blocks exported by torch.onnx (dynamo) from
// float16 and bfloat16 transformers models (testdata/exported_half), which
// route and combine in float32 between half-precision casts, fuse with the
// half-precision I/O type (the block extends through the cast back to it
// and, for DeepSeek-V3, through the shared expert's Add), pass the
// numerical check, and match the original to the type's precision.
func TestRealHalfPrecisionExports(t *testing.T) {
	cases := map[string]string{
		"mixtral_block_dynamo_float16":      "softmax_act_topk_norm_swiglu_f16io_f16w",
		"mixtral_block_dynamo_bfloat16":     "softmax_act_topk_norm_swiglu_bf16io_bf16w",
		"qwen3_moe_block_dynamo_float16":    "softmax_act_topk_norm_swiglu_f16io_f16w",
		"qwen3_moe_block_dynamo_bfloat16":   "softmax_act_topk_norm_swiglu_bf16io_bf16w",
		"deepseek_v3_block_dynamo_float16":  "sigmoid_act_topk_norm_scaled_g1of2_cbias_swiglu_shared_f16io_f16w",
		"deepseek_v3_block_dynamo_bfloat16": "sigmoid_act_topk_norm_scaled_g1of2_cbias_swiglu_shared_bf16io_bf16w",
	}
	forEachExpected(t, "../testdata/exported_half", cases, func(t *testing.T, f, variant string) {
		orig, err := graph.Load(f)
		if err != nil {
			t.Fatal(err)
		}
		dt := pb.TensorProto_DataType(orig.Proto.Graph.Input[0].GetType().GetTensorType().GetElemType())
		fused, err := graph.Load(f)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Rewrite(fused, Options{Check: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Fused) != 1 || rep.Fused[0].Variant != variant {
			t.Fatalf("fused %+v, want one block %s", rep.Fused, variant)
		}
		if n := len(fused.Proto.Graph.Node); n > 4 {
			t.Errorf("%d nodes left after fusion, want the fused node and shape ops only", n)
		}
		keptHalfWeights(t, fused, dt)
		matchesHalf(t, orig, fused, dt, rep.Fused[0].Block.Spec)
		bodyMatchesKernel(t, fused, dt)
	})
}

// routerWeights reads the router inputs of m's fused node.
func routerWeights(t *testing.T, m *graph.Model) *moe.Weights {
	t.Helper()
	g := m.Graph()
	read := func(n *pb.NodeProto, pos int) []float32 {
		if pos >= len(n.Input) || n.Input[pos] == "" {
			return nil
		}
		x, err := eval.FromProto(g.Initializer(n.Input[pos]), m.TensorBytes)
		if err != nil {
			t.Fatal(err)
		}
		return x.F32
	}
	for _, n := range m.Proto.Graph.Node {
		if n.GetDomain() == moe.Domain && n.GetOpType() == moe.OpType {
			return &moe.Weights{RouterW: read(n, moe.InRouterW), RouterB: read(n, moe.InRouterB), CorrectionBias: read(n, moe.InCorrectionBias)}
		}
	}
	t.Fatal("no fused node")
	return nil
}

// TestHalfPrecisionCheckCatches: the half-precision numerical check, with
// its wider tolerance and skipped near-ties, still refuses wrong semantics
// (the renormalisation flipped, or experts 0 and 1 swapped) and passes the
// right ones.
func TestHalfPrecisionCheckCatches(t *testing.T) {
	f := filepath.Join(fixtureDir, "mixtral_block_dynamo_batched_mm.onnx")
	for _, dt := range []pb.TensorProto_DataType{pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16} {
		for _, tc := range []struct {
			name   string
			break_ func(s *moe.Spec, w *moe.Weights)
			fail   bool
		}{
			{"right semantics", func(*moe.Spec, *moe.Weights) {}, false},
			{"renormalisation flipped", func(s *moe.Spec, _ *moe.Weights) { s.NormalizeTopK = !s.NormalizeTopK }, true},
			{"experts 0 and 1 swapped", func(s *moe.Spec, w *moe.Weights) {
				per := len(w.Down) / s.NumExperts
				for j := 0; j < per; j++ {
					w.Down[j], w.Down[per+j] = w.Down[per+j], w.Down[j]
				}
			}, true},
		} {
			t.Run(dt.String()+"/"+tc.name, func(t *testing.T) {
				m, err := graph.Load(f)
				if err != nil {
					t.Skipf("fixture: %v", err)
				}
				toHalf(t, m, dt)
				det, err := Detect(m)
				if err != nil || len(det.Blocks) != 1 {
					t.Fatalf("detect: %v, %d blocks", err, len(det.Blocks))
				}
				b := det.Blocks[0]
				w, err := b.W.Materialize(m, &b.Spec)
				if err != nil {
					t.Fatal(err)
				}
				tc.break_(&b.Spec, w)
				errs, err := numericCheck(context.Background(), m, []*Block{b}, []*moe.Weights{w}, nil, 0)
				if err != nil {
					t.Fatal(err)
				}
				if (errs[0] != nil) != tc.fail {
					t.Fatalf("check error %v, want failure %v", errs[0], tc.fail)
				}
			})
		}
	}
}

// TestWeightHalfType: the half type of a block's weights is the coarser one
// when they mix float16 and bfloat16, in whatever order they come.
func TestWeightHalfType(t *testing.T) {
	ti := func(dt pb.TensorProto_DataType) *pb.TensorProto {
		return &pb.TensorProto{DataType: proto.Int32(int32(dt))}
	}
	for _, c := range []struct {
		name         string
		router, down pb.TensorProto_DataType
		want         pb.TensorProto_DataType
		ok           bool
	}{
		{"float32", pb.TensorProto_FLOAT, pb.TensorProto_FLOAT, 0, false},
		{"float16", pb.TensorProto_FLOAT, pb.TensorProto_FLOAT16, pb.TensorProto_FLOAT16, true},
		{"float16 then bfloat16", pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16, pb.TensorProto_BFLOAT16, true},
		{"bfloat16 then float16", pb.TensorProto_BFLOAT16, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16, true},
	} {
		b := &Block{W: &WeightPlan{Router: Proj{Init: ti(c.router)}, Experts: []ExpertProj{{Down: &Proj{Init: ti(c.down)}}}}}
		if got, ok := weightHalfType(b); got != c.want || ok != c.ok {
			t.Errorf("%s: %v %v, want %v %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

// TestTokensOffNaN: a NaN or infinity in the fused result where the
// original is finite counts as off in both token comparisons (a NaN
// difference compared false against the tolerance and passed).
func TestTokensOffNaN(t *testing.T) {
	want := []float32{1, 2, 3, 4}
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1))} {
		got := []float32{1, 2, bad, 4}
		if off, _, at := tokensOff(got, want, 2, 1e-4, 1e-6, nil); off != 1 || at != 2 {
			t.Errorf("tokensOff with %v: off %d at %d, want 1 at 2", bad, off, at)
		}
		if off, _, at := tokensOffRows(got, []int{0, 1}, want, 2, 1e-4, 1e-6, 1e-5); off != 1 || at != 2 {
			t.Errorf("tokensOffRows with %v: off %d at %d, want 1 at 2", bad, off, at)
		}
	}
}

// keptHalfWeights checks that the fused node of m stores its expert
// matrices in the export's half type dt, as they were stored, and its
// router in float32.
func keptHalfWeights(t *testing.T, m *graph.Model, dt pb.TensorProto_DataType) {
	t.Helper()
	g := m.Graph()
	for _, n := range m.Proto.Graph.Node {
		if n.GetOpType() != moe.OpType {
			continue
		}
		for pos, want := range map[int]pb.TensorProto_DataType{moe.InGate: dt, moe.InUp: dt, moe.InDown: dt, moe.InSharedGate: dt, moe.InSharedDown: dt, moe.InRouterW: pb.TensorProto_FLOAT} {
			if pos >= len(n.Input) || n.Input[pos] == "" {
				continue
			}
			if init := g.Initializer(n.Input[pos]); init == nil || graph.DataType(init) != want {
				t.Errorf("fused input %s (%q): %v, want %s", moe.InputNames[pos], n.Input[pos], init.GetDataType(), want)
			}
		}
	}
}

// bodyMatchesKernel runs the fused model m on random half inputs through
// the fused node's function body (which widens the half weights with a
// Cast) and through the reference kernel: both compute in float32, so the
// outputs agree to a rounding of dt.
func bodyMatchesKernel(t *testing.T, m *graph.Model, dt pb.TensorProto_DataType) {
	t.Helper()
	in := m.Proto.Graph.Input[0]
	var shape []int
	for _, d := range in.GetType().GetTensorType().GetShape().GetDim() {
		shape = append(shape, max(int(d.GetDimValue()), 1))
	}
	n := 1
	for _, d := range shape {
		n *= d
	}
	rng := rand.New(rand.NewPCG(11, uint64(dt)))
	vals := make([]float32, n)
	for i := range vals {
		vals[i] = float32(rng.NormFloat64())
	}
	feeds := func() map[string]*eval.Tensor {
		return map[string]*eval.Tensor{in.GetName(): eval.NewFloatAs(dt, shape, vals)}
	}
	out := m.Proto.Graph.Output[0].GetName()
	k, err := eval.Run(context.Background(), m, feeds(), eval.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := eval.Run(context.Background(), m, feeds(), eval.Options{PreferFunctions: true})
	if err != nil {
		t.Fatalf("function body: %v", err)
	}
	rtol, _ := eval.HalfTolerance(dt)
	d, err := eval.Compare(b[out], k[out], rtol, 1e-3)
	if err != nil || !d.OK() {
		t.Errorf("function body and kernel disagree on the half-weight node: %+v %v", d, err)
	}
}

// TestUncheckedHalfBlockClaimsNoPrecision: a half-precision block fused
// with the check off reports no check precision (nothing was checked at
// any); with the check on it reports the type's.
func TestUncheckedHalfBlockClaimsNoPrecision(t *testing.T) {
	cfg := models.Config{Layers: 1, Experts: 4, TopK: 2, Hidden: 32, Inter: 64, Shape: models.ShapeBatched, DType: models.DTypeBFloat16, Router: "softmax", Normalize: true, Seed: 3}
	for _, check := range []bool{false, true} {
		m, err := models.Build(cfg)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Rewrite(m, Options{Check: check})
		if err != nil || len(rep.Fused) != 1 {
			t.Fatalf("check %v: %v, %v", check, rep, err)
		}
		want := map[bool]string{true: "bfloat16"}[check]
		if f := rep.Fused[0]; f.CheckPrecision != want || (f.CheckRTol != 0) != check || (f.CheckTolerance != "") != check {
			t.Errorf("check %v: precision %q rtol %g tolerance %q, want precision %q", check, f.CheckPrecision, f.CheckRTol, f.CheckTolerance, want)
		}
	}
}
