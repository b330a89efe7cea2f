//go:build ort

package ortrun

import (
	"context"
	"math"
	"math/rand"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	fx "github.com/mokopt/mokopt/internal/fixtures"
	"github.com/mokopt/mokopt/internal/testtools"
	"github.com/mokopt/mokopt/passes"
)

var fixtureDir = fx.Dir()

// refused are the fixtures whose traces baked in only some experts: Rewrite
// must refuse them.
var refused = map[string]bool{"qwen2_moe_block_torchscript": true, "gpt_oss_full_torchscript": true}

const rtol, atol = 1e-4, 1e-5

func needORT(t *testing.T) {
	t.Helper()
	if _, err := FindLibrary(); err != nil {
		testtools.Missing(t, "the ONNX Runtime library", "bash .ci/fetch-ort.sh, or set ONNXRUNTIME_LIB", err)
	}
	if err := Init(); err != nil {
		t.Fatal(err)
	}
}

type fixture struct {
	name, path string
	m          *graph.Model
	ds         *eval.DataSet
	feeds      map[string]*eval.Tensor
	outs       []string // graph output names, in order
}

func fixtures(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(fixtureDir, "*.onnx"))
	if len(files) == 0 {
		t.Fatalf("no fixtures in %s", fixtureDir)
	}
	return files
}

func loadFixture(t *testing.T, f string) *fixture {
	t.Helper()
	m, err := graph.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := eval.ReadDataSet(strings.TrimSuffix(f, ".onnx") + "_data/test_data_set_0")
	if err != nil {
		t.Fatal(err)
	}
	fx := &fixture{name: strings.TrimSuffix(filepath.Base(f), ".onnx"), path: f, m: m, ds: ds, feeds: map[string]*eval.Tensor{}}
	inits := map[string]bool{}
	for _, in := range m.Proto.Graph.Initializer {
		inits[in.GetName()] = true
	}
	var ins []string
	for _, v := range m.Proto.Graph.Input {
		if !inits[v.GetName()] {
			ins = append(ins, v.GetName())
		}
	}
	for i, x := range ds.Inputs {
		name := ""
		if i < len(ds.InputNames) {
			name = ds.InputNames[i]
		}
		if name == "" && i < len(ins) {
			name = ins[i]
		}
		fx.feeds[name] = x
	}
	for _, v := range m.Proto.Graph.Output {
		fx.outs = append(fx.outs, v.GetName())
	}
	if len(fx.outs) != len(ds.Outputs) {
		t.Fatalf("%d graph outputs, %d golden outputs", len(fx.outs), len(ds.Outputs))
	}
	return fx
}

// compareAll checks got[outs[i]] against want[i] for every output and
// returns the largest absolute error.
func compareAll(t *testing.T, what string, outs []string, got map[string]*eval.Tensor, want []*eval.Tensor) float64 {
	t.Helper()
	worst := 0.0
	for i, name := range outs {
		g, ok := got[name]
		if !ok {
			t.Errorf("%s: output %q missing", what, name)
			continue
		}
		d, err := eval.Compare(g, want[i], rtol, atol)
		if err != nil {
			t.Errorf("%s: output %q: %v", what, name, err)
			continue
		}
		if !d.OK() {
			t.Errorf("%s: output %q differs: %+v", what, name, d)
		}
		worst = math.Max(worst, d.MaxAbs)
	}
	return worst
}

// rewriteAndSave fuses the fixture's MoE blocks and saves the result under
// t.TempDir(). ok is false for the fixtures Rewrite must refuse.
func rewriteAndSave(t *testing.T, fx *fixture) (path string, ok bool) {
	t.Helper()
	_, err := passes.Rewrite(fx.m, passes.Options{})
	if refused[fx.name] {
		if err == nil {
			t.Fatalf("Rewrite fused %s, whose trace lost experts", fx.name)
		}
		t.Logf("refused as expected: %v", err)
		return "", false
	}
	if err != nil {
		t.Fatalf("Rewrite: %v", err)
	}
	fused := 0
	for _, n := range fx.m.Proto.Graph.Node {
		if n.GetDomain() == "ai.mok" && n.GetOpType() == "MoE" {
			fused++
		}
	}
	if fused == 0 {
		t.Fatalf("no ai.mok::MoE node after Rewrite")
	}
	path = filepath.Join(t.TempDir(), fx.name+".fused.onnx")
	if err := fx.m.Save(path, graph.SaveOptions{}); err != nil {
		t.Fatalf("Save: %v", err)
	}
	return path, true
}

// TestOriginalGolden: ONNX Runtime on each exported model reproduces the
// golden outputs the fixtures were made with.
func TestOriginalGolden(t *testing.T) {
	needORT(t)
	v, _ := Version()
	t.Logf("ONNX Runtime %s from %s", v, LibraryPath())
	for _, f := range fixtures(t) {
		name := strings.TrimSuffix(filepath.Base(f), ".onnx")
		t.Run(name, func(t *testing.T) {
			fx := loadFixture(t, f)
			got, err := Run(f, fx.feeds)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("RESULT %s original-vs-golden maxabs=%.3g", name, compareAll(t, "original", fx.outs, got, fx.ds.Outputs))
		})
	}
}

// TestRewrittenGolden: the rewritten model, whose ai.mok::MoE nodes ONNX
// Runtime can only run through their model-local function bodies, still
// reproduces the golden outputs.
func TestRewrittenGolden(t *testing.T) {
	needORT(t)
	for _, f := range fixtures(t) {
		name := strings.TrimSuffix(filepath.Base(f), ".onnx")
		t.Run(name, func(t *testing.T) {
			fx := loadFixture(t, f)
			path, ok := rewriteAndSave(t, fx)
			if !ok {
				return
			}
			got, err := Run(path, fx.feeds)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("RESULT %s rewritten-vs-golden maxabs=%.3g", name, compareAll(t, "rewritten", fx.outs, got, fx.ds.Outputs))
		})
	}
}

// randomFeeds draws float inputs from N(0,1) with the golden inputs' shapes;
// integer inputs (ids, masks) keep their golden values.
func randomFeeds(fx *fixture, seed int64) map[string]*eval.Tensor {
	r := rand.New(rand.NewSource(seed))
	out := map[string]*eval.Tensor{}
	for name, x := range fx.feeds {
		if x.DType != pb.TensorProto_FLOAT {
			out[name] = x
			continue
		}
		data := make([]float32, len(x.F32))
		for i := range data {
			data[i] = float32(r.NormFloat64())
		}
		out[name] = eval.NewFloat32(x.Shape, data)
	}
	return out
}

// TestRewrittenORTvsInterpreter: on random inputs, ONNX Runtime and mokopt's
// interpreter agree on the rewritten models. ONNX Runtime runs each fused
// node's function body; the interpreter, with default options, runs the
// moe package's registered reference kernel, so the two are independent.
func TestRewrittenORTvsInterpreter(t *testing.T) {
	needORT(t)
	for _, f := range fixtures(t) {
		name := strings.TrimSuffix(filepath.Base(f), ".onnx")
		t.Run(name, func(t *testing.T) {
			fx := loadFixture(t, f)
			path, ok := rewriteAndSave(t, fx)
			if !ok {
				return
			}
			worst := 0.0
			for seed := int64(1); seed <= 3; seed++ {
				feeds := randomFeeds(fx, seed)
				got, err := Run(path, feeds)
				if err != nil {
					t.Fatal(err)
				}
				ref, err := eval.Run(context.Background(), fx.m, feeds, eval.Options{})
				if err != nil {
					t.Fatalf("interpreter: %v", err)
				}
				want := make([]*eval.Tensor, len(fx.outs))
				for i, o := range fx.outs {
					want[i] = ref[o]
					if want[i] == nil {
						t.Fatalf("interpreter produced no %q", o)
					}
				}
				worst = math.Max(worst, compareAll(t, "ORT vs interpreter", fx.outs, got, want))
			}
			t.Logf("RESULT %s ort-vs-interpreter maxabs=%.3g", name, worst)
		})
	}
}
