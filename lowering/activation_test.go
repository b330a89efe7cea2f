package lowering

import (
	"errors"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/kernel"
	"github.com/mokopt/mokopt/moe"
)

// TestActivationTargets: for every row of the activation table, the MoK
// check refuses the activation by name exactly when the row says MoK lacks
// it, and the ONNX Runtime lowering maps it (ORTUnsupported silent about
// it) exactly when the row has a mapping, else refuses with the row's
// reason.
func TestActivationTargets(t *testing.T) {
	for _, def := range moe.Activations {
		t.Run(def.Name, func(t *testing.T) {
			s := &moe.Spec{NumExperts: 256, TopK: 8, Hidden: 7168, Inter: 2048, RouterActivation: moe.Softmax, RouterOrder: moe.ActivationThenTopK,
				NormalizeTopK: true, RoutedScalingFactor: 1, NGroup: 1, TopKGroup: 1, EPSize: 1, Activation: def.Name, SwiGLUAlpha: 1}
			if def.Limit == moe.LimitRequired {
				s.SwiGLULimit = 7
			}
			var act []string
			for _, v := range kernel.Check(LayerSpec(s), kernel.GB300NVL72, 8, 0) {
				if v.Code == kernel.CodeActivation || v.Code == kernel.CodeActivationGPTOSS {
					act = append(act, v.Message)
				}
			}
			if def.MoK != (len(act) == 0) {
				t.Fatalf("MoK: row says %v, check says %v", def.MoK, act)
			}
			if !def.MoK && !strings.Contains(act[0], def.Name) {
				t.Fatalf("MoK refusal %q does not name %s", act[0], def.Name)
			}
			_, why := def.ORT(s.ActParams())
			refusal := strings.Join(ORTUnsupported(s, ""), "; ")
			if (why == "") != (refusal == "") || why != "" && !strings.Contains(refusal, why) {
				t.Fatalf("ORT: row's reason %q, ORTUnsupported %q", why, refusal)
			}
		})
	}
}

// TestActivationLowering: for every row of the activation table, a fused
// block with that activation (a parameter other than 1 where the row takes
// one) lowered with --target ort either maps onto com.microsoft::MoE and
// the lowered model, run in the interpreter (package ortmoe's kernel),
// computes the fused node's numbers, or is refused with an error that
// names the activation; the MoK lowering refuses, naming the activation,
// exactly the rows it does not compute.
func TestActivationLowering(t *testing.T) {
	for _, def := range moe.Activations {
		t.Run(def.Name, func(t *testing.T) {
			c := blockCfg{E: 8, K: 2, H: 256, I: 256, Norm: true, Seed: 4, Act: def.Name}
			if def.Alpha {
				c.Alpha = 1.25
			}
			if def.Limit != moe.LimitNone {
				c.Limit = 7
			}
			m, s, _ := buildFused(t, c)
			const T = 6
			x := randInput(T, s.Hidden, 9)
			for i := range x {
				x[i] *= 4 // reach the activations' tails
			}
			_, want := run(t, m, x, T, s.Hidden, eval.Options{})
			lo := cloneModel(t, m)
			_, err := LowerORT(lo, ORTOptions{})
			if _, why := def.ORT(s.ActParams()); why != "" {
				if !errors.Is(err, ErrORTUnsupported) || !strings.Contains(err.Error(), def.Name) {
					t.Fatalf("lower --target ort: want a refusal naming %s, got %v", def.Name, err)
				}
			} else {
				if err != nil {
					t.Fatalf("lower --target ort: %v", err)
				}
				_, got := run(t, lo, x, T, s.Hidden, eval.Options{})
				d, _ := eval.Compare(eval.NewFloat32([]int{T, s.Hidden}, got), eval.NewFloat32([]int{T, s.Hidden}, want), 1e-4, 1e-5)
				if !d.OK() {
					t.Fatalf("lowered to com.microsoft::MoE vs fused: %+v", d)
				}
			}
			opt := defaultOpts()
			opt.Strict = true
			rep, err := Lower(cloneModel(t, m), opt)
			var act []string
			for _, v := range rep.Blocks[0].Violations {
				if v.Code == kernel.CodeActivation || v.Code == kernel.CodeActivationGPTOSS {
					act = append(act, v.Message)
				}
			}
			switch {
			case def.MoK && len(act) > 0:
				t.Fatalf("MoK computes %s, but the lowering refuses it: %v", def.Name, act)
			case !def.MoK && (len(act) == 0 || !strings.Contains(act[0], def.Name) || !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), def.Name)):
				t.Fatalf("MoK lacks %s: want a refusal naming it, got violations %v, err %v", def.Name, act, err)
			}
		})
	}
}
