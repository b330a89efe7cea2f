package passes

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/moe"
)

// producersDir holds real exports from graph producers beyond torch.onnx's
// defaults, with ONNX Runtime golden outputs and a manifest
// (testdata/producers/README.md).
const producersDir = "../testdata/producers"

// producerCase is the part of a manifest entry the tests read.
type producerCase struct {
	Name  string `json:"name"`
	Class string `json:"class"`
	OK    bool   `json:"ok"`
	Sizes struct {
		H, I, E, K int
		Bias       bool
	} `json:"sizes"`
}

// UnmarshalJSON reads the sizes' lower-case k.
func (s *producerCase) UnmarshalJSON(b []byte) error {
	type plain producerCase
	var aux struct {
		plain
		Sizes struct {
			H    int  `json:"H"`
			I    int  `json:"I"`
			E    int  `json:"E"`
			K    int  `json:"k"`
			Bias bool `json:"bias"`
		} `json:"sizes"`
	}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	*s = producerCase(aux.plain)
	s.Sizes.H, s.Sizes.I, s.Sizes.E, s.Sizes.K, s.Sizes.Bias = aux.Sizes.H, aux.Sizes.I, aux.Sizes.E, aux.Sizes.K, aux.Sizes.Bias
	return nil
}

// TestSortedExports fuses every real sort-based export in the manifest
// (JetMoE's and GraniteMoE's ParallelExperts design) and checks the fused
// node's spec against the sizes the export was made with and its output,
// through the reference kernel and the function body, against every
// ONNX Runtime golden set.
func TestSortedExports(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(producersDir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var man struct {
		Cases []producerCase `json:"cases"`
	}
	if err := json.Unmarshal(b, &man); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(producersDir, "sorted_*.onnx"))
	want := map[string]producerCase{}
	for _, pc := range man.Cases {
		if pc.Class == "sorted" && pc.OK {
			want[pc.Name] = pc
		}
	}
	if len(want) == 0 || len(files) != len(want) {
		t.Fatalf("%d sort-based models in %s, %d in its manifest", len(files), producersDir, len(want))
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".onnx")
		pc, ok := want[name]
		if !ok {
			t.Fatalf("%s is not in the manifest", name)
		}
		t.Run(name, func(t *testing.T) {
			m, err := graph.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			rep, err := Rewrite(m, Options{Check: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Fused) != 1 {
				t.Fatalf("fused %d blocks, want 1", len(rep.Fused))
			}
			fb := rep.Fused[0]
			sp := fb.Block.Spec
			z := pc.Sizes
			if fb.Block.Kind != KindSorted || sp.NumExperts != z.E || sp.TopK != z.K || sp.Hidden != z.H || sp.Inter != z.I ||
				sp.RouterActivation != moe.Softmax || sp.RouterOrder != moe.TopKThenActivation || sp.Activation != moe.SwiGLU || sp.ExpertBias || sp.NormalizeTopK {
				t.Fatalf("fused %s %s E=%d k=%d H=%d I=%d, want %s softmax_topk_act_swiglu E=%d k=%d H=%d I=%d", fb.Block.Kind, fb.Variant, sp.NumExperts, sp.TopK, sp.Hidden, sp.Inter, KindSorted, z.E, z.K, z.H, z.I)
			}
			adds := 0
			for _, n := range m.Proto.Graph.Node {
				switch n.GetOpType() {
				case "TopK", "ScatterND", "ScatterElements", "Split", "Gemm", "MatMul":
					t.Fatalf("%s %q left after fusion", n.GetOpType(), n.GetName())
				case "Add":
					adds++
				}
			}
			if z.Bias != (adds == 1) {
				t.Fatalf("output bias %v, but %d Adds are left after the fused node", z.Bias, adds)
			}
			sets, _ := filepath.Glob(filepath.Join(producersDir, name+"_data", "test_data_set_*"))
			if len(sets) == 0 {
				t.Fatal("no golden sets")
			}
			for _, dir := range sets {
				ds, err := eval.ReadDataSet(dir)
				if err != nil {
					t.Fatal(err)
				}
				feeds, err := eval.Feeds(m, ds.Inputs, ds.InputNames)
				if err != nil {
					t.Fatal(err)
				}
				for _, body := range []bool{false, true} {
					out, err := eval.Run(context.Background(), m, feeds, eval.Options{PreferFunctions: body})
					if err != nil {
						t.Fatal(err)
					}
					d, err := eval.Compare(out[m.Proto.Graph.Output[0].GetName()], ds.Outputs[0], 1e-4, 1e-5)
					if err != nil {
						t.Fatal(err)
					}
					if !d.OK() {
						t.Errorf("%s, function body %v: differs from ONNX Runtime's golden output: %+v", filepath.Base(dir), body, d)
					}
				}
			}
		})
	}
}
