package eval

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/testtools"
)

// libonnxNode is where Debian's libonnx-testdata puts the ONNX node tests.
const libonnxNode = "/usr/share/libonnx-testdata/data/node"

// conformanceSkip lists node tests whose ops are all supported but which
// are not expected to pass, with the reason.
var conformanceSkip = map[string]string{
	"test_cast_BFLOAT16_to_FLOAT":              bf16AsUint16,
	"test_cast_FLOAT_to_BFLOAT16":              bf16AsUint16,
	"test_castlike_BFLOAT16_to_FLOAT":          bf16AsUint16,
	"test_castlike_BFLOAT16_to_FLOAT_expanded": bf16AsUint16,
	"test_castlike_FLOAT_to_BFLOAT16":          bf16AsUint16,
	"test_castlike_FLOAT_to_BFLOAT16_expanded": bf16AsUint16,
	"test_batchnorm_epsilon_training_mode":     "training mode (batch statistics); the evaluator is inference-only",
	"test_batchnorm_example_training_mode":     "training mode (batch statistics); the evaluator is inference-only",
	"test_training_dropout":                    trainingDropout,
	"test_training_dropout_default":            trainingDropout,
	"test_training_dropout_default_mask":       trainingDropout,
	"test_training_dropout_mask":               trainingDropout,
}

const (
	bf16AsUint16    = "the data set stores bfloat16 values as UINT16 tensors (numpy had no bfloat16), so feeds and outputs disagree with the model's declared type"
	trainingDropout = "training-mode Dropout draws a random mask; the evaluator is inference-only"
)

// conformanceResult is the outcome of one node test.
type conformanceResult struct {
	name, status, detail string
	ops                  []string
}

// runNodeTest runs one ONNX node test folder: "pass", "fail" or "skip".
func runNodeTest(dir string) conformanceResult {
	res := conformanceResult{name: filepath.Base(dir)}
	m, err := graph.Load(filepath.Join(dir, "model.onnx"))
	if err != nil {
		return conformanceResult{name: res.name, status: "skip", detail: "load: " + err.Error()}
	}
	ops := map[string]bool{}
	for _, n := range m.Proto.GetGraph().GetNode() {
		ops[graph.OpKey(n)] = true
	}
	for o := range ops {
		res.ops = append(res.ops, o)
	}
	sort.Strings(res.ops)
	if u := UnsupportedOps(m); len(u) > 0 {
		res.status, res.detail = "skip", "unsupported op "+strings.Join(u, ",")
		return res
	}
	g := m.Proto.GetGraph()
	for _, v := range append(append([]*pb.ValueInfoProto{}, g.GetInput()...), g.GetOutput()...) {
		tt := v.GetType().GetTensorType()
		if tt == nil {
			res.status, res.detail = "skip", fmt.Sprintf("non-tensor value %q", v.GetName())
			return res
		}
		if dt := pb.TensorProto_DataType(tt.GetElemType()); !SupportedDType(dt) {
			res.status, res.detail = "skip", "unsupported dtype "+dt.String()
			return res
		}
	}
	if why, ok := conformanceSkip[res.name]; ok {
		res.status, res.detail = "skip", "listed: "+why
		return res
	}
	sets, _ := filepath.Glob(filepath.Join(dir, "test_data_set_*"))
	if len(sets) == 0 {
		res.status, res.detail = "skip", "no data set"
		return res
	}
	for _, set := range sets {
		ds, err := ReadDataSet(set)
		if err != nil {
			res.status, res.detail = "fail", err.Error()
			return res
		}
		feeds, err := Feeds(m, ds.Inputs, ds.InputNames)
		if err != nil {
			res.status, res.detail = "fail", err.Error()
			return res
		}
		out, err := Run(context.Background(), m, feeds, Options{})
		if err != nil {
			res.status, res.detail = "fail", err.Error()
			return res
		}
		for i, v := range g.GetOutput() {
			if i >= len(ds.Outputs) {
				break
			}
			got := out[v.GetName()]
			want := ds.Outputs[i]
			if got == nil {
				res.status, res.detail = "fail", fmt.Sprintf("output %q not produced", v.GetName())
				return res
			}
			if got.DType != want.DType {
				res.status, res.detail = "fail", fmt.Sprintf("output %q: type %s, want %s", v.GetName(), got.DType, want.DType)
				return res
			}
			d, err := Compare(got, want, 1e-3, 1e-7)
			if err != nil {
				res.status, res.detail = "fail", fmt.Sprintf("output %q: %v", v.GetName(), err)
				return res
			}
			if !d.OK() {
				res.status = "fail"
				res.detail = fmt.Sprintf("output %q: %d/%d mismatches, max abs %.3g (worst %d: got %v want %v)",
					v.GetName(), d.Mismatches, want.Len(), d.MaxAbs, d.Worst, got.Float64At(d.Worst), want.Float64At(d.Worst))
				return res
			}
		}
	}
	res.status = "pass"
	return res
}

// TestConformance runs every ONNX node test of libonnx-testdata whose ops
// the evaluator supports.
func TestConformance(t *testing.T) {
	dirs, _ := filepath.Glob(filepath.Join(libonnxNode, "test_*"))
	testtools.NeedONNXTestdata(t, len(dirs))
	counts := map[string]int{}
	skipOps := map[string]int{}
	passedOps := map[string]bool{}
	for _, d := range dirs {
		r := runNodeTest(d)
		counts[r.status]++
		switch r.status {
		case "pass":
			for _, o := range r.ops {
				passedOps[o] = true
			}
		case "fail":
			t.Errorf("%s %v: %s", r.name, r.ops, r.detail)
		case "skip":
			skipOps[r.detail]++
			if os.Getenv("EVAL_CONFORMANCE_VERBOSE") != "" {
				t.Logf("skip %s: %s", r.name, r.detail)
			}
		}
	}
	var reasons []string
	for k, v := range skipOps {
		reasons = append(reasons, fmt.Sprintf("%d× %s", v, k))
	}
	sort.Strings(reasons)
	t.Logf("libonnx node tests: %d total, %d passed, %d failed, %d skipped", len(dirs), counts["pass"], counts["fail"], counts["skip"])
	var ops []string
	for o := range passedOps {
		ops = append(ops, o)
	}
	sort.Strings(ops)
	t.Logf("%d ops exercised by passing tests: %s", len(ops), strings.Join(ops, " "))
	if os.Getenv("EVAL_CONFORMANCE_VERBOSE") != "" {
		t.Logf("skip reasons:\n%s", strings.Join(reasons, "\n"))
	}
}
