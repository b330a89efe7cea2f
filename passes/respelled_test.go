package passes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// TestRespelledExports: committed exports rewritten into other spellings
// of the same computation (testdata/respelled: a softmax written out, a
// top-k of negated scores, subtraction as addition of a negation, division
// by a constant as multiplication, transposed weights, a Mul by one, the
// whole graph in an If) fuse into the same block as their source, and the
// fused model reproduces the source's ONNX Runtime goldens.
func TestRespelledExports(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("..", "testdata", "respelled", "*.onnx"))
	if len(files) == 0 {
		t.Fatal("no respelled exports")
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".onnx")
		src, _, _ := strings.Cut(name, "__")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var srcPath string
			for _, dir := range []string{exportedDir, producersDir, filepath.Join("..", "testdata", "spelled")} {
				if srcPath = filepath.Join(dir, src+".onnx"); fileExists(srcPath) {
					break
				}
			}
			want := rewriteFile(t, srcPath)
			m, err := graph.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			opt := Options{Check: true}
			if strings.HasSuffix(name, "__dynin") {
				opt.CheckData = dyninData(t, m, name)
			}
			rep, err := Rewrite(m, opt)
			// The If form holds the graph twice, once per branch.
			copies := 1
			if strings.HasSuffix(name, "__if") {
				copies = 2
			}
			if err != nil || len(rep.Fused) != copies*len(want.Fused) {
				t.Fatalf("want %d fused blocks, %d× the source's, got report %v, err %v", copies*len(want.Fused), copies, rep, err)
			}
			for i, f := range rep.Fused {
				wf := want.Fused[i%len(want.Fused)]
				got, w := f.Block.Spec.CanonicalRouting(), wf.Block.Spec.CanonicalRouting()
				if got.Variant() != w.Variant() || got.NumExperts != w.NumExperts || got.TopK != w.TopK {
					t.Errorf("block %d fused as %s E=%d k=%d, the source as %s E=%d k=%d", i, f.Variant, got.NumExperts, got.TopK, wf.Variant, w.NumExperts, w.TopK)
				}
			}
			checkGoldens(t, m, filepath.Join("..", "testdata", "respelled", name+"_data"))
		})
	}
}

// dyninData is the check data for a dynin form (a trace whose declared
// dims were made symbolic): rewritten on random inputs, it must be refused
// with the advice to pass the export's inputs, which it then gets (a
// refusal edits nothing, so m is rewritten next as it was loaded).
func dyninData(t *testing.T, m *graph.Model, name string) []map[string]*eval.Tensor {
	t.Helper()
	if _, err := Rewrite(m, Options{Check: true}); err == nil || !strings.Contains(err.Error(), "pass inputs like the export's with --check-data") {
		t.Fatalf("on random inputs: want a refusal that asks for --check-data, got %v", err)
	}
	ds, err := eval.ReadDataSet(filepath.Join("..", "testdata", "respelled", name+"_data", "test_data_set_0"))
	if err != nil {
		t.Fatal(err)
	}
	feeds, err := eval.Feeds(m, ds.Inputs, ds.InputNames)
	if err != nil {
		t.Fatal(err)
	}
	return []map[string]*eval.Tensor{feeds}
}

// rewriteFile rewrites the model at path with the check on and returns the
// report; it fails the test on an error.
func rewriteFile(t *testing.T, path string) *Report {
	t.Helper()
	m, err := graph.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Rewrite(m, Options{Check: true})
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return rep
}

// fileExists reports whether path names a file that can be stat'ed.
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestUnevaluableRegionRefused: a block whose region holds an op mokopt
// has no kernel for (here the renormalisation of the respelled lpnorm
// export, moved to a private domain) is refused naming that node, not
// fused on a check that could not run (which, before the refusal, fused
// both blocks without their renormalisation).
func TestUnevaluableRegionRefused(t *testing.T) {
	m, err := graph.Load(filepath.Join("..", "testdata", "respelled", "chain_mixed2_qwen3_dynamo__lpnorm.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	var renorm []string
	for _, n := range m.Proto.Graph.Node {
		if n.GetOpType() == "LpNormalization" {
			n.OpType, n.Domain = proto.String("Renorm"), proto.String("com.example")
			renorm = append(renorm, n.GetName())
		}
	}
	if len(renorm) != 2 {
		t.Fatalf("want the two blocks' renormalisations, found %v", renorm)
	}
	m.Proto.OpsetImport = append(m.Proto.OpsetImport, &pb.OperatorSetIdProto{Domain: proto.String("com.example"), Version: proto.Int64(1)})
	rep, err := Rewrite(m, Options{Check: true, Partial: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Fused) != 0 || len(rep.Refused) != 2 {
		t.Fatalf("want both blocks refused, got %d fused, refused %v", len(rep.Fused), rep.Refused)
	}
	for i, r := range rep.Refused {
		if !strings.Contains(r.Reason, renorm[i]) || !strings.Contains(r.Reason, "com.example::Renorm") || !strings.Contains(r.Reason, "cannot evaluate") {
			t.Errorf("refusal %d does not name node %q and its op: %s", i, renorm[i], r.Reason)
		}
	}
}
