package passes

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
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
			fb := fuseOnly(t, m)
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

// chainCopies returns a model that runs n copies of m's graph one after
// the other, each copy's output the next one's input, every other value
// and initializer renamed per copy.
func chainCopies(m *graph.Model, n int) *graph.Model {
	g := m.Proto.GetGraph()
	in, out := g.Input[0].GetName(), g.Output[0].GetName()
	ng := &pb.GraphProto{Name: proto.String("chain"), Input: []*pb.ValueInfoProto{proto.Clone(g.Input[0]).(*pb.ValueInfoProto)}}
	for i := range n {
		rn := func(v string) string {
			switch {
			case v == "":
				return ""
			case v == in && i == 0:
				return in
			case v == in:
				return fmt.Sprintf("c%d/%s", i-1, out)
			}
			return fmt.Sprintf("c%d/%s", i, v)
		}
		for _, nd := range g.Node {
			c := proto.Clone(nd).(*pb.NodeProto)
			c.Name = proto.String(rn(nd.GetName()))
			for j := range c.Input {
				c.Input[j] = rn(c.Input[j])
			}
			for j := range c.Output {
				c.Output[j] = rn(c.Output[j])
			}
			ng.Node = append(ng.Node, c)
		}
		for _, t := range g.Initializer {
			c := proto.Clone(t).(*pb.TensorProto)
			c.Name = proto.String(rn(t.GetName()))
			ng.Initializer = append(ng.Initializer, c)
		}
		for _, vi := range g.ValueInfo {
			c := proto.Clone(vi).(*pb.ValueInfoProto)
			c.Name = proto.String(rn(vi.GetName()))
			ng.ValueInfo = append(ng.ValueInfo, c)
		}
		if i == n-1 {
			c := proto.Clone(g.Output[0]).(*pb.ValueInfoProto)
			c.Name = proto.String(rn(out))
			ng.Output = []*pb.ValueInfoProto{c}
		}
	}
	mp := proto.Clone(m.Proto).(*pb.ModelProto)
	mp.Graph = ng
	return &graph.Model{Proto: mp, Dir: m.Dir}
}

// TestSortedChained chains copies of each real sort-based export (the
// GraniteMoE ones directly: output to input, no bias between) and expects
// every copy fused, with the chain's output unchanged.
func TestSortedChained(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(producersDir, "sorted_*.onnx"))
	if len(files) == 0 {
		t.Fatal("no sort-based exports")
	}
	const n = 4
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".onnx")
		t.Run(name, func(t *testing.T) {
			m, err := graph.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			ch := chainCopies(m, n)
			ds, err := eval.ReadDataSet(filepath.Join(producersDir, name+"_data", "test_data_set_0"))
			if err != nil {
				t.Fatal(err)
			}
			feeds, err := eval.Feeds(ch, ds.Inputs, ds.InputNames)
			if err != nil {
				t.Fatal(err)
			}
			outName := ch.Proto.Graph.Output[0].GetName()
			ref, err := eval.Run(context.Background(), ch, feeds, eval.Options{})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := Rewrite(ch, Options{Check: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Fused) != n {
				t.Fatalf("fused %d of %d chained blocks", len(rep.Fused), n)
			}
			for _, fb := range rep.Fused {
				if fb.Block.Kind != KindSorted {
					t.Fatalf("block %s fused as %s", fb.Block.Name, fb.Block.Kind)
				}
			}
			if ref[outName] == nil {
				t.Fatal("the chain computed no output")
			}
			runBoth(t, ch, feeds, ref[outName])
		})
	}
}

// BenchmarkSortedChain rewrites 200 directly chained copies of the real
// GraniteMoE sort-based export (no numerical check): detection of the
// sort-based kind stays linear in the model's size.
func BenchmarkSortedChain(b *testing.B) {
	m, err := graph.Load(filepath.Join(producersDir, "sorted_granitemoe_dynamo.onnx"))
	if err != nil {
		b.Fatal(err)
	}
	const n = 200
	raw, err := chainCopies(m, n).Marshal()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		b.StopTimer()
		ch, err := graph.Parse(raw, "chain.onnx")
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		rep, err := Rewrite(ch, Options{})
		if err != nil || len(rep.Fused) != n {
			b.Fatalf("fused %d of %d: %v", len(rep.Fused), n, err)
		}
	}
}
