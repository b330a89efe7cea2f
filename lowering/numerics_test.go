package lowering

import (
	"context"
	"math"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/kernel/mxfp8"
	"github.com/mokopt/mokopt/moe"
)

const testTokens = 16

// TestLoweredMatchesFused: a kernel-sized block lowers, and the lowered model
// in the reference interpreter stays within MXFP8 error of the fused model
// (run through moe's reference kernel), through the registered kernel (with
// and without the kernel's MXFP8 activations) and through the function body.
//
// Expected sizes: one E4M3 rounding (3 mantissa bits, power-of-two block
// scale) has a relative error of about 2.6% rms. Weight-only quantization
// (gate, up, down) gives about 4-5% on the routed experts' output, the
// kernel's full MXFP8 (also the token rows and the SwiGLU hidden rows) about
// 6-7%; the BF16 shared expert dilutes both.
func TestLoweredMatchesFused(t *testing.T) {
	base := blockCfg{E: 8, K: 2, H: 256, I: 256, Is: 256, Norm: true}
	cases := []struct {
		name   string
		cfg    blockCfg
		shared string
		// Bounds on the mean relative error: weight-only MXFP8 (function
		// body, kernel without activation quantization) and full MXFP8.
		weightsOnly, full float64
	}{
		{"ungated shared", base, SharedInKernel, 0.05, 0.08},
		{"sigmoid-gated shared", func() blockCfg { c := base; c.Gated = true; c.Seed = 2; return c }(), SharedOutside, 0.05, 0.08},
		{"wider shared", func() blockCfg { c := base; c.Is = 512; c.Seed = 3; return c }(), SharedOutside, 0.05, 0.08},
		// Without a shared expert every output value comes from MXFP8 experts.
		{"no shared", func() blockCfg { c := base; c.Is = 0; c.Seed = 4; return c }(), SharedNone, 0.06, 0.08},
		{"clamped deepseek router", blockCfg{E: 8, K: 2, H: 256, I: 256, Is: 256, Act: moe.SwiGLUClamped, Limit: 0.5,
			RouterAct: moe.Sigmoid, Norm: true, Scale: 2.5, NGroup: 4, TopKG: 2, CBias: true, Seed: 5}, SharedInKernel, 0.05, 0.08},
	}
	dir := t.TempDir()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, _, _ := buildFused(t, tc.cfg)
			x := randInput(testTokens, tc.cfg.H, tc.cfg.Seed+100)
			_, want := run(t, m, x, testTokens, tc.cfg.H, eval.Options{})
			rep, path := lowerAndSave(t, m, defaultOpts(), dir, tc.name)
			if b := rep.Blocks[0]; !b.Lowered || b.SharedExpert != tc.shared {
				t.Fatalf("block %+v, want lowered with shared %q", b, tc.shared)
			}
			low := loadForEval(t, path)
			for _, via := range []struct {
				name     string
				opt      eval.Options
				actQuant bool
				bound    float64
			}{
				{"kernel, MXFP8 weights and activations", eval.Options{}, true, tc.full},
				{"kernel, MXFP8 weights only", eval.Options{}, false, tc.weightsOnly},
				{"function body", eval.Options{PreferFunctions: true}, true, tc.weightsOnly},
			} {
				setActQuant(low, via.actQuant)
				_, got := run(t, low, x, testTokens, tc.cfg.H, via.opt)
				s := compare(got, want)
				t.Logf("%s via %s: max|err| %.4g (%.2f%% of max|y| %.3g), rel L2 %.2f%%, mean rel %.2f%%",
					tc.name, via.name, s.MaxAbs, 100*s.MaxAbs/s.MaxRef, s.MaxRef, 100*s.RelL2, 100*s.MeanRel)
				if s.MaxAbs > 0.1*s.MaxRef || s.MeanRel > via.bound || math.IsNaN(s.RelL2) {
					t.Errorf("%s: error beyond MXFP8 (mean rel bound %.0f%%): %+v", via.name, 100*via.bound, s)
				}
			}
		})
	}
}

// setActQuant sets emulate_activation_quant on every kernel node of m.
func setActQuant(m *graph.Model, on bool) {
	v := int64(0)
	if on {
		v = 1
	}
	for _, n := range m.Proto.Graph.Node {
		if n.GetOpType() != OpType {
			continue
		}
		for _, a := range n.Attribute {
			if a.GetName() == AttrEmulateActQuant {
				a.I = &v
			}
		}
	}
}

// TestSharedExpertBF16: with all routed weights zero the output is the shared
// expert alone, which the kernel runs in BF16: the error is within bf16's.
func TestSharedExpertBF16(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  blockCfg
		tol  float64 // relative L2 bound
	}{
		{"in kernel (bf16)", blockCfg{E: 8, K: 2, H: 256, I: 256, Is: 256, ZeroRouted: true, Seed: 7}, 1e-2},
		{"gated, kept outside (float32)", blockCfg{E: 8, K: 2, H: 256, I: 256, Is: 256, Gated: true, ZeroRouted: true, Seed: 8}, 1e-2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _, _ := buildFused(t, tc.cfg)
			x := randInput(testTokens, tc.cfg.H, 11)
			_, want := run(t, m, x, testTokens, tc.cfg.H, eval.Options{})
			_, path := lowerAndSave(t, m, defaultOpts(), t.TempDir(), "shared")
			_, got := run(t, loadForEval(t, path), x, testTokens, tc.cfg.H, eval.Options{})
			s := compare(got, want)
			t.Logf("%s: max|err| %.3g of max|y| %.3g (%.3f%%), rel L2 %.3f%%, mean rel %.3f%%", tc.name, s.MaxAbs, s.MaxRef, 100*s.MaxAbs/s.MaxRef, 100*s.RelL2, 100*s.MeanRel)
			// bf16 keeps 8 significant bits (relative rounding error <= 2^-9):
			// x, weights, hidden and output are rounded once each.
			if s.RelL2 > tc.tol || s.MaxAbs > 0.02*s.MaxRef {
				t.Errorf("shared expert beyond bf16 error: %+v", s)
			}
		})
	}
}

// TestRouterMatchesRoute: the router ops of the lowered model select exactly
// moe.Route's experts, with its weights (to float32 summation order: the
// interpreter's Gemm adds in a different order than moe.Route's dot).
func TestRouterMatchesRoute(t *testing.T) {
	base := blockCfg{E: 8, K: 2, H: 256, I: 256, Is: 256}
	cases := []struct {
		name string
		mod  func(*blockCfg)
	}{
		{"softmax then topk", func(c *blockCfg) {}},
		{"softmax then topk, normalized", func(c *blockCfg) { c.Norm = true }},
		{"topk then softmax", func(c *blockCfg) { c.Order = moe.TopKThenActivation }},
		{"router bias", func(c *blockCfg) { c.RBias = true; c.Order = moe.TopKThenActivation; c.K = 4 }},
		{"sigmoid, correction bias, scaled", func(c *blockCfg) { c.RouterAct = moe.Sigmoid; c.CBias = true; c.Norm = true; c.Scale = 2.5 }},
		{"deepseek group-limited", func(c *blockCfg) {
			c.RouterAct, c.CBias, c.Norm, c.Scale, c.NGroup, c.TopKG, c.K = moe.Sigmoid, true, true, 2.5, 4, 2, 3
		}},
		{"softmax group-limited, unnormalized", func(c *blockCfg) { c.NGroup, c.TopKG = 2, 1 }},
		{"deepseek-v2 group-limited greedy", func(c *blockCfg) { c.NGroup, c.TopKG, c.GroupMax, c.Scale, c.K = 4, 2, true, 1.5, 3 }},
		{"sparsemixer top-2", func(c *blockCfg) { c.RouterAct, c.Order, c.SMThreshold = moe.SparseMixer, moe.TopKThenActivation, 0.02 }},
		{"sparsemixer top-3, wide threshold", func(c *blockCfg) {
			c.RouterAct, c.Order, c.SMThreshold, c.K = moe.SparseMixer, moe.TopKThenActivation, 0.5, 3
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			tc.mod(&cfg)
			cfg.Seed = int64(20 + i)
			m, s, w := buildFused(t, cfg)
			x := randInput(testTokens, cfg.H, int64(30+i))
			rep, path := lowerAndSave(t, m, defaultOpts(), t.TempDir(), "router")
			b := rep.Blocks[0]
			out, _ := run(t, loadForEval(t, path), x, testTokens, cfg.H, eval.Options{}, b.TopKExperts, b.RouterWeights)
			ids, rw := out[b.TopKExperts], out[b.RouterWeights]
			if ids == nil || rw == nil || ids.DType != pb.TensorProto_INT64 || rw.DType != pb.TensorProto_FLOAT {
				t.Fatalf("router outputs %v %v", ids, rw)
			}
			if len(ids.Shape) != 2 || ids.Shape[0] != testTokens || ids.Shape[1] != cfg.K || len(rw.F32) != testTokens*cfg.K {
				t.Fatalf("router output shapes %v %v, want [%d %d]", ids.Shape, rw.Shape, testTokens, cfg.K)
			}
			wantIDs, wantW := moe.Route(s, w, x, testTokens)
			var maxRel float64
			for tok := 0; tok < testTokens; tok++ {
				for j := 0; j < cfg.K; j++ {
					if got := ids.I64[tok*cfg.K+j]; got != int64(wantIDs[tok][j]) {
						t.Fatalf("token %d slot %d: expert %d, moe.Route says %d", tok, j, got, wantIDs[tok][j])
					}
					g, r := float64(rw.F32[tok*cfg.K+j]), float64(wantW[tok][j])
					maxRel = max(maxRel, math.Abs(g-r)/math.Abs(r))
				}
			}
			t.Logf("%s: ids identical; weights max relative difference %.2g", tc.name, maxRel)
			if maxRel > 1e-5 {
				t.Errorf("router weights differ from moe.Route by %.3g relative", maxRel)
			}
		})
	}
}

// TestFunctionBodyDequantizesLikeMXFP8: with the kernel's activation
// quantization switched off, the function body (standard ops, scales
// expanded from the tcgen05 layout) and the registered kernel (kernel/mxfp8)
// compute the same thing.
func TestFunctionBodyDequantizesLikeMXFP8(t *testing.T) {
	cfg := blockCfg{E: 8, K: 2, H: 256, I: 512, Is: 512, Seed: 40}
	m, _, _ := buildFused(t, cfg)
	_, path := lowerAndSave(t, m, defaultOpts(), t.TempDir(), "body")
	low := loadForEval(t, path)
	setActQuant(low, false)
	x := randInput(testTokens, cfg.H, 41)
	_, viaKernel := run(t, low, x, testTokens, cfg.H, eval.Options{})
	_, viaBody := run(t, low, x, testTokens, cfg.H, eval.Options{PreferFunctions: true})
	s := compare(viaBody, viaKernel)
	t.Logf("body vs kernel: max|diff| %.3g of %.3g, rel L2 %.3g", s.MaxAbs, s.MaxRef, s.RelL2)
	// Only the float32 summation order differs, which can move a value across
	// a bfloat16 rounding boundary (one bf16 step, 2^-8 relative).
	if s.MaxAbs > s.MaxRef/64 || s.RelL2 > 1e-3 {
		t.Errorf("function body and kernel disagree: %+v", s)
	}
}

// TestStreamedQuantization: the MXFP8 pairs the lowering streams expert by
// expert are exactly kernel/mxfp8's whole-tensor quantization, and the BF16
// shared weights are the float32 ones rounded to nearest even.
func TestStreamedQuantization(t *testing.T) {
	cfg := blockCfg{E: 4, K: 2, H: 256, I: 512, Is: 512, Seed: 50}
	m, _, w := buildFused(t, cfg)
	_, path := lowerAndSave(t, m, Options{Target: defaultOpts().Target, EP: 4, Workers: 3}, t.TempDir(), "q")
	low, err := graph.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	defer low.Close()
	inits := map[string][]byte{}
	for _, tp := range low.Proto.Graph.Initializer {
		b, err := low.TensorBytes(tp)
		if err != nil {
			t.Fatal(err)
		}
		inits[tp.GetName()] = b
	}
	prefix := "layer0/MoE/mok/"
	for _, tc := range []struct {
		name    string
		v       []float32
		e, n, k int
	}{
		{"w_routed_gate", w.Gate, cfg.E, cfg.I, cfg.H},
		{"w_routed_up", w.Up, cfg.E, cfg.I, cfg.H},
		{"w_routed_down", w.Down, cfg.E, cfg.H, cfg.I},
	} {
		q, err := mxfp8.Quantize(tc.name, tc.v, tc.e, tc.n, tc.k)
		if err != nil {
			t.Fatal(err)
		}
		if string(inits[prefix+tc.name]) != string(q.Data) {
			t.Errorf("%s: streamed codes differ from mxfp8.Quantize", tc.name)
		}
		if string(inits[prefix+tc.name+"_sc"]) != string(q.Scales) {
			t.Errorf("%s: streamed scales differ from mxfp8.Quantize", tc.name)
		}
	}
	for _, tc := range []struct {
		name string
		v    []float32
	}{{"w_shared_gate", w.SharedGate}, {"w_shared_up", w.SharedUp}, {"w_shared_down", w.SharedDown}} {
		b := inits[prefix+tc.name]
		if len(b) != 2*len(tc.v) {
			t.Fatalf("%s: %d bytes, want %d", tc.name, len(b), 2*len(tc.v))
		}
		for i, f := range tc.v {
			if got := uint16(b[2*i]) | uint16(b[2*i+1])<<8; got != graph.Float32ToBFloat16(f) {
				t.Fatalf("%s[%d] = %#04x, want %#04x", tc.name, i, got, graph.Float32ToBFloat16(f))
			}
		}
	}
	// The original float32 expert weights are gone from the lowered model.
	for _, pos := range []int{moe.InGate, moe.InUp, moe.InDown, moe.InSharedGate} {
		if _, ok := inits["w/"+moe.InputNames[pos]]; ok {
			t.Errorf("float weight %s is still in the lowered model", moe.InputNames[pos])
		}
	}
}

// TestLoweredHalfIO: a fused block with float16 or bfloat16 hidden states
// (a half-precision export) lowers to the kernel between casts: the router
// runs on the input cast to float32, the kernel on its bf16 cast, and the
// output returns in the block's type. Through the kernel and through its
// function body the lowered model matches the fused one within MXFP8's
// error, with the shared expert in the kernel and outside it.
func TestLoweredHalfIO(t *testing.T) {
	dir := t.TempDir()
	for _, io := range []string{moe.IOFloat16, moe.IOBFloat16} {
		for _, tc := range []struct {
			name   string
			gated  bool
			shared string
		}{{"shared in kernel", false, SharedInKernel}, {"gated shared outside", true, SharedOutside}} {
			t.Run(io+"/"+tc.name, func(t *testing.T) {
				cfg := blockCfg{E: 8, K: 2, H: 256, I: 256, Is: 256, Norm: true, Gated: tc.gated, IO: io, Seed: 11}
				m, s, _ := buildFused(t, cfg)
				dt := s.IOElemType()
				feeds := map[string]*eval.Tensor{"hidden_states": halfInput(dt, testTokens, cfg.H, 111)}
				want, err := eval.Run(context.Background(), m, feeds, eval.Options{})
				if err != nil {
					t.Fatal(err)
				}
				rep, path := lowerAndSave(t, m, defaultOpts(), dir, io+tc.name)
				if b := rep.Blocks[0]; !b.Lowered || b.SharedExpert != tc.shared {
					t.Fatalf("block %+v, want lowered with shared %q", b, tc.shared)
				}
				low := loadForEval(t, path)
				for _, body := range []bool{false, true} {
					got, err := eval.Run(context.Background(), low, feeds, eval.Options{PreferFunctions: body})
					if err != nil {
						t.Fatalf("function body %v: %v", body, err)
					}
					if got["y"].DType != dt {
						t.Fatalf("function body %v: output is %s, want %s", body, got["y"].DType, dt)
					}
					st := compare(got["y"].F32, want["y"].F32)
					t.Logf("function body %v: max|err| %.4g of max|y| %.3g, mean rel %.2f%%", body, st.MaxAbs, st.MaxRef, 100*st.MeanRel)
					if st.MaxAbs > 0.1*st.MaxRef || st.MeanRel > 0.08 || math.IsNaN(st.RelL2) {
						t.Errorf("function body %v: error beyond MXFP8: %+v", body, st)
					}
				}
			})
		}
	}
}

// halfInput returns random hidden states [T, H] of half-precision type dt
// (values already rounded to it).
func halfInput(dt pb.TensorProto_DataType, T, H int, seed int64) *eval.Tensor {
	return eval.NewFloatAs(dt, []int{T, H}, randInput(T, H, seed))
}
