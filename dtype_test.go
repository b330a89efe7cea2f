package mokopt_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/kernel/mxfp8"
	"github.com/mokopt/mokopt/lowering"
	"github.com/mokopt/mokopt/models"
)

// genSave builds cfg's model with its weights inline and saves it in dir.
func genSave(t *testing.T, dir, name string, cfg models.Config) string {
	t.Helper()
	g, err := models.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := g.Save(p, graph.SaveOptions{External: graph.ExternalInline}); err != nil {
		t.Fatal(err)
	}
	return p
}

// saveLoad saves m in dir as name and loads it back (deferred weights, the
// lowered MXFP8 and BF16 tensors among them, are computed by the save).
func saveLoad(t *testing.T, m *mokopt.Model, dir, name string) (*mokopt.Model, string) {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := mokopt.Save(context.Background(), m, p, mokopt.SaveOptions{External: graph.ExternalInline}); err != nil {
		t.Fatalf("save %s: %v", name, err)
	}
	return load(t, p), p
}

// verifyPass runs Verify(a, b) with the CLI's defaults on 7 tokens and
// fails unless it passes with a note stating want.
func verifyPass(t *testing.T, what string, a, b *mokopt.Model, want string) {
	t.Helper()
	opt := mokopt.DefaultVerifyOptions()
	opt.Tokens = []int{7}
	rep, err := mokopt.Verify(context.Background(), a, b, opt)
	if err != nil || !rep.Pass {
		t.Fatalf("%s: verify: %v", what, err)
	}
	if notes := strings.Join(rep.Notes, "\n"); want != "" && !strings.Contains(notes, want) {
		t.Fatalf("%s: verify notes %q do not state %q", what, notes, want)
	}
}

// TestGenHalfPipeline: a model generated in float16 or bfloat16, in each
// exporter shape, goes through rewrite -> verify -> lower (ONNX Runtime and
// MoK) -> verify, at the type's stated tolerance. The MoK lowering takes
// its MXFP8 codes from the stored half weights converted exactly (the same
// bytes as kernel/mxfp8 makes from the generator's own rounded values), and
// keeps a bfloat16 shared expert's bits as stored.
func TestGenHalfPipeline(t *testing.T) {
	ctx := context.Background()
	for _, dt := range []string{models.DTypeFloat16, models.DTypeBFloat16} {
		for _, shape := range []string{models.ShapeBatched, models.ShapeUnrolled, models.ShapeDense} {
			t.Run(dt+"/"+shape, func(t *testing.T) {
				dir := t.TempDir()
				cfg := models.Config{Shape: shape, Layers: 1, Experts: 4, TopK: 2, Hidden: 256, Inter: 256, SharedInter: 256,
					Router: "softmax", Normalize: true, Seed: 3, DType: dt}
				src := genSave(t, dir, "gen.onnx", cfg)
				elem := pb.TensorProto_FLOAT16
				if dt == models.DTypeBFloat16 {
					elem = pb.TensorProto_BFLOAT16
				}
				tol := eval.HalfToleranceText(elem)
				fused := load(t, src)
				rep, err := mokopt.Rewrite(ctx, fused, mokopt.RewriteOptions{})
				if err != nil || len(rep.Fused) != 1 {
					t.Fatalf("rewrite: %v (%d fused)", err, len(rep.Fused))
				}
				f := rep.Fused[0]
				wantRel, _ := eval.HalfTolerance(elem)
				if f.CheckPrecision != dt || f.CheckRTol != wantRel || f.CheckTolerance != tol || f.Block.Spec.SharedInter != 256 {
					t.Fatalf("fused %+v: want check at %s, rtol %g (%q), shared expert 256", f, dt, wantRel, tol)
				}
				fused, fusedPath := saveLoad(t, fused, dir, "fused.onnx")
				verifyPass(t, "original vs fused", load(t, src), fused, tol)

				ortM := load(t, fusedPath)
				lrep, err := mokopt.Lower(ctx, ortM, mokopt.TargetORT, mokopt.LowerOptions{})
				if err != nil || lrep.ORT == nil {
					t.Fatalf("lower ort: %v, %+v", err, lrep)
				}
				orep := lrep.ORT
				if len(orep.Blocks) != 1 || !strings.Contains(orep.Blocks[0].Precision, "float32 MoE between Casts from "+dt) {
					t.Fatalf("lower ort: %v, %+v", err, orep)
				}
				ortM, _ = saveLoad(t, ortM, dir, "ort.onnx")
				verifyPass(t, "fused vs ort", load(t, fusedPath), ortM, tol)

				mok := load(t, fusedPath)
				if _, err := mokopt.Lower(ctx, mok, mokopt.TargetGB300NVL72, mokopt.LowerOptions{EP: 4}); err != nil {
					t.Fatalf("lower mok: %v", err)
				}
				mok, _ = saveLoad(t, mok, dir, "mok.onnx")
				verifyPass(t, "fused vs mok", load(t, fusedPath), mok, "MXFP8")
				checkLoweredBits(t, mok.Graph(), load(t, src).Graph(), cfg)
			})
		}
	}
}

// checkLoweredBits compares the lowered kernel node's gate codes with
// kernel/mxfp8's quantization of the generator's rounded gate weights, and
// its BF16 shared gate with the original's stored bits (bfloat16) or their
// one rounding to bfloat16 (float16).
func checkLoweredBits(t *testing.T, low, orig *graph.Model, cfg models.Config) {
	t.Helper()
	var kn *pb.NodeProto
	for _, n := range low.Proto.Graph.Node {
		if n.GetOpType() == lowering.OpType {
			kn = n
		}
	}
	if kn == nil {
		t.Fatal("no kernel node in the lowered model")
	}
	raw := func(m *graph.Model, name string) []byte {
		t.Helper()
		for _, ti := range m.Proto.Graph.Initializer {
			if ti.GetName() == name {
				b, err := m.TensorBytes(ti)
				if err != nil {
					t.Fatal(err)
				}
				return b
			}
		}
		t.Fatalf("no initializer %q", name)
		return nil
	}
	w, err := models.Weights(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	q, err := mxfp8.Quantize("gate", w.Gate, cfg.Experts, cfg.Inter, cfg.Hidden)
	if err != nil {
		t.Fatal(err)
	}
	if got := raw(low, kn.Input[lowering.InGate]); !bytes.Equal(got, q.Data) {
		t.Fatalf("lowered gate codes differ from MXFP8 of the stored %s weights", cfg.DType)
	}
	if got := raw(low, kn.Input[lowering.InGateScale]); !bytes.Equal(got, q.Scales) {
		t.Fatalf("lowered gate scales differ from MXFP8 of the stored %s weights", cfg.DType)
	}
	shared := raw(low, kn.Input[lowering.InSharedGate])
	want := raw(orig, "model.layers.0.mlp.shared_expert.gate_proj.weight")
	if cfg.DType == models.DTypeFloat16 { // float16 -> bfloat16 rounds once
		for i := 0; i < len(want); i += 2 {
			binary.LittleEndian.PutUint16(want[i:], graph.Float32ToBFloat16(graph.HalfToFloat32(binary.LittleEndian.Uint16(want[i:]))))
		}
	}
	if !bytes.Equal(shared, want) {
		t.Fatalf("lowered BF16 shared gate is not the stored %s weights' bits", cfg.DType)
	}
}
