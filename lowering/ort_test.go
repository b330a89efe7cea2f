package lowering

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/ortmoe"
	"github.com/mokopt/mokopt/moe"
)

// TestLowerORTNumerics: LowerORT's output, run in the interpreter (package
// ortmoe's kernels for com.microsoft::MoE / QMoE), reproduces the fused
// node's reference semantics: within rtol 1e-4 / atol 1e-5 in float, within
// a relative L2 error bound with int8 / int4 weights; blocks the op cannot
// express are refused naming the node and the semantics.
func TestLowerORTNumerics(t *testing.T) {
	oai := func(c blockCfg) blockCfg { c.Act, c.Limit = moe.SwiGLUOAI, 7; return c }
	base := blockCfg{E: 8, K: 2, H: 32, I: 48, Norm: true, Seed: 3}
	with := func(f func(*blockCfg)) blockCfg { c := base; f(&c); return c }
	cases := []struct {
		name   string
		cfg    blockCfg
		opt    ORTOptions
		relL2  float64  // 0: float tolerance; else the bound on the relative L2 error
		ops    []string // ops the lowered model must hold
		refuse []string
	}{
		{name: "swiglu_norm", cfg: base, ops: []string{"MoE", "Gemm", "Where"}},
		{name: "swiglu_nonorm_k3", cfg: with(func(c *blockCfg) { c.Norm, c.K = false, 3 }), ops: []string{"MoE"}},
		{name: "topk_then_softmax_rbias", cfg: with(func(c *blockCfg) { c.Norm, c.Order, c.RBias = false, moe.TopKThenActivation, true }), ops: []string{"MoE"}},
		{name: "oai_expert_bias", cfg: with(func(c *blockCfg) { *c = oai(*c); c.ExpertBias = true }), ops: []string{"MoE"}},
		{name: "clamped_scaled", cfg: with(func(c *blockCfg) { c.Act, c.Limit, c.Scale = moe.SwiGLUClamped, 0.3, 2.5 }), ops: []string{"MoE"}},
		{name: "shared_gated", cfg: with(func(c *blockCfg) { c.Is, c.Gated = 64, true }), ops: []string{"MoE", "MatMul", "Sigmoid"}},
		{name: "shared_ungated_nonorm", cfg: with(func(c *blockCfg) { c.Is, c.Norm = 40, false }), ops: []string{"MoE", "MatMul"}},
		{name: "int8", cfg: base, opt: ORTOptions{Quant: "int8"}, relL2: 0.02, ops: []string{"QMoE"}},
		{name: "int4_block16_shared", cfg: with(func(c *blockCfg) { c.Is, c.Gated = 64, true }), opt: ORTOptions{Quant: "int4", BlockSize: 16}, relL2: 0.2, ops: []string{"QMoE", "MatMul"}},
		{name: "int4_oai_bias", cfg: with(func(c *blockCfg) { *c = oai(*c); c.ExpertBias = true }), opt: ORTOptions{Quant: "int4"}, relL2: 0.2, ops: []string{"QMoE"}},
		{name: "sigmoid_group_cbias", cfg: with(func(c *blockCfg) { c.RouterAct, c.NGroup, c.TopKG, c.CBias = moe.Sigmoid, 2, 1, true }),
			refuse: []string{"sigmoid routing", "group-limited", "score-correction bias"}},
		{name: "weights_on_input", cfg: with(func(c *blockCfg) {
			c.RouterAct, c.Order, c.K, c.WeightsOnInput = moe.Sigmoid, moe.TopKThenActivation, 1, true
		}),
			refuse: []string{"weights_on_input"}},
		{name: "gelu", cfg: with(func(c *blockCfg) { c.Act = moe.GELU }), refuse: []string{"tanh approximation"}},
		{name: "int8_nonorm", cfg: with(func(c *blockCfg) { c.Norm = false }), opt: ORTOptions{Quant: "int8"}, refuse: []string{"always renormalises"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, s, _ := buildFused(t, tc.cfg)
			const T = 9
			x := randInput(T, s.Hidden, tc.cfg.Seed+7)
			_, want := run(t, m, x, T, s.Hidden, eval.Options{})
			rep, err := LowerORT(m, tc.opt)
			if tc.refuse != nil {
				if err == nil || !errors.Is(err, ErrORTUnsupported) {
					t.Fatalf("want a refusal, got %v", err)
				}
				for _, w := range append(tc.refuse, rep.Blocks[0].Node) {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("refusal does not name %q: %v", w, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ops := map[string]bool{}
			for _, n := range m.Proto.Graph.Node {
				ops[n.GetOpType()] = true
				if n.GetDomain() == moe.Domain {
					t.Fatalf("ai.mok::%s left", n.GetOpType())
				}
			}
			for _, o := range tc.ops {
				if !ops[o] {
					t.Errorf("lowered model has no %s node", o)
				}
			}
			if m.Opset(ortmoe.Domain) != 1 {
				t.Errorf("com.microsoft opset %d, want 1", m.Opset(ortmoe.Domain))
			}
			_, got := run(t, m, x, T, s.Hidden, eval.Options{})
			st := compare(got, want)
			if tc.relL2 == 0 {
				d, _ := eval.Compare(eval.NewFloat32([]int{T, s.Hidden}, got), eval.NewFloat32([]int{T, s.Hidden}, want), 1e-4, 1e-5)
				if !d.OK() {
					t.Fatalf("lowered vs fused: %+v", d)
				}
			} else if st.RelL2 > tc.relL2 || st.RelL2 == 0 {
				t.Fatalf("quantized: relative L2 error %.3g, want in (0, %g]", st.RelL2, tc.relL2)
			}
			t.Logf("RESULT %s lowered-vs-fused maxabs=%.3g relL2=%.3g %s", tc.name, st.MaxAbs, st.RelL2, strings.TrimSpace(rep.Summary()))
		})
	}
}

// TestLowerORTHalfIO: a fused block with float16 or bfloat16 hidden states
// lowers to com.microsoft::MoE between casts (the op and the shared expert
// in float32), and the lowered model returns the block's type and matches
// the fused node to that type's precision.
func TestLowerORTHalfIO(t *testing.T) {
	for _, io := range []string{moe.IOFloat16, moe.IOBFloat16} {
		for _, is := range []int{0, 16} {
			cfg := blockCfg{E: 8, K: 2, H: 32, I: 48, Is: is, Norm: true, IO: io, Seed: 5}
			m, s, _ := buildFused(t, cfg)
			dt := s.IOElemType()
			feeds := map[string]*eval.Tensor{"hidden_states": halfInput(dt, testTokens, cfg.H, 55)}
			want, err := eval.Run(context.Background(), m, feeds, eval.Options{})
			if err != nil {
				t.Fatal(err)
			}
			low := cloneModel(t, m)
			rep, err := LowerORT(low, ORTOptions{})
			if err != nil || !rep.Blocks[0].Lowered {
				t.Fatalf("%s, shared %d: %v %+v", io, is, err, rep)
			}
			got, err := eval.Run(context.Background(), low, feeds, eval.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got["y"].DType != dt {
				t.Fatalf("%s, shared %d: output is %s", io, is, got["y"].DType)
			}
			st := compare(got["y"].F32, want["y"].F32)
			rel, _ := eval.HalfTolerance(dt)
			t.Logf("%s, shared %d: max|err| %.3g of max|y| %.3g", io, is, st.MaxAbs, st.MaxRef)
			if st.MaxAbs > rel*st.MaxRef || math.IsNaN(st.RelL2) {
				t.Errorf("%s, shared %d: beyond the type's precision: %+v", io, is, st)
			}
		}
	}
}
