package passes

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/ortmoe"
	"github.com/mokopt/mokopt/moe"
)

// ortRefusals are the ortmoe.Cases that have no ai.mok::MoE form, with a
// word the refusal must name (relu, gelu, silu and identity without fc3
// are the ungated relu, gelu_tanh, silu and identity activations).
var ortRefusals = map[string]string{
	"swiglu_alpha2": "activation_alpha 2",
}

func ortFeeds(H int, seed uint64) map[string]*eval.Tensor {
	x := make([]float32, 11*H)
	r := uint64(seed*0x9E3779B97F4A7C15 + 1)
	for i := range x {
		r ^= r << 13
		r ^= r >> 7
		r ^= r << 17
		x[i] = float32(int64(r%2001)-1000) / 400
	}
	return map[string]*eval.Tensor{ortmoe.InputName: eval.NewFloat32([]int{11, H}, x)}
}

// TestORTConvert: every com.microsoft::MoE / QMoE case with an ai.mok::MoE
// form is fused, with a conclusive numerical check (the original node runs
// in package ortmoe's kernel), and the fused model (reference kernel and
// function body) reproduces the original's outputs; the others are refused
// with the unsupported semantics named.
func TestORTConvert(t *testing.T) {
	for _, c := range ortmoe.Cases() {
		t.Run(c.Name, func(t *testing.T) {
			b, err := c.Model()
			if err != nil {
				t.Fatal(err)
			}
			m := b.Model
			feeds := ortFeeds(c.H, c.Seed)
			orig, err := eval.Run(context.Background(), m, feeds, eval.Options{})
			if err != nil {
				t.Fatalf("original: %v", err)
			}
			rep, err := Rewrite(m, Options{Check: true})
			if want, refused := ortRefusals[c.Name]; refused {
				if err == nil || !errors.Is(err, ErrNotFused) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), `"moe"`) {
					t.Fatalf("want a refusal naming node \"moe\" and %q, got %v", want, err)
				}
				t.Logf("refused: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("Rewrite: %v", err)
			}
			for _, w := range rep.Warnings {
				if strings.Contains(w, "inconclusive") {
					t.Fatalf("numerical check inconclusive: %s", w)
				}
			}
			if len(rep.Fused) != 1 {
				t.Fatalf("%d blocks fused, want 1", len(rep.Fused))
			}
			for _, n := range m.Proto.Graph.Node {
				if n.GetDomain() == ortmoe.Domain {
					t.Fatalf("%s::%s left after rewrite", n.GetDomain(), n.GetOpType())
				}
			}
			for _, prefer := range []bool{false, true} {
				got, err := eval.Run(context.Background(), m, feeds, eval.Options{PreferFunctions: prefer})
				if err != nil {
					t.Fatalf("fused (function bodies %v): %v", prefer, err)
				}
				d, err := eval.Compare(got[ortmoe.OutputName], orig[ortmoe.OutputName], CheckTolerance.RTol, CheckTolerance.ATol)
				if err != nil || !d.OK() {
					t.Fatalf("fused (function bodies %v) vs original: %+v %v", prefer, d, err)
				}
				t.Logf("RESULT %s fused(function body %v)-vs-ortmoe maxabs=%.3g variant=%s", c.Name, prefer, d.MaxAbs, rep.Fused[0].Variant)
			}
		})
	}
}

// TestORTCheckCatchesWrongKernel: the rewrite's numerical check really runs
// the com.microsoft::MoE kernel: with a deliberately wrong kernel registered
// (routing weights not renormalised), the same fusion is refused.
func TestORTCheckCatchesWrongKernel(t *testing.T) {
	c := ortmoe.Cases()[0] // swiglu_interleaved_norm
	b, err := c.Model()
	if err != nil {
		t.Fatal(err)
	}
	wrong := func(ctx *eval.OpContext, n *pb.NodeProto, in []*eval.Tensor) ([]*eval.Tensor, error) {
		a, err := ortmoe.ParseAttrs(n)
		if err != nil {
			return nil, err
		}
		a.Normalize = false
		w, err := a.ReadExperts(ortmoe.TensorSource(in))
		if err != nil {
			return nil, err
		}
		y, err := a.Forward(w, in[0].F32, in[1].F32, in[0].Shape[0])
		return []*eval.Tensor{eval.NewFloat32(in[0].Shape, y)}, err
	}
	// The check evaluates with passes' own kernel set: swap in one whose
	// com.microsoft::MoE is the wrong kernel.
	saved := evalKernels
	evalKernels = func() *eval.Kernels {
		return moe.AddKernels(eval.NewKernels()).Add(ortmoe.Domain, ortmoe.OpMoE, wrong)
	}
	defer func() { evalKernels = saved }()
	_, err = Rewrite(b.Model, Options{Check: true})
	if err == nil || !strings.Contains(err.Error(), "numerical check failed") {
		t.Fatalf("want the numerical check to refuse, got %v", err)
	}
}
