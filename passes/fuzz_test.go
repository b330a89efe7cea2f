package passes

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/models"
	"google.golang.org/protobuf/proto"
)

// fuzzOps are the op types a mutation may give a node: the ones the
// detector reasons about.
var fuzzOps = []string{"TopK", "MatMul", "Gemm", "Softmax", "Sigmoid", "Add", "Mul", "Gather", "GatherND", "Reshape",
	"Transpose", "Identity", "Div", "ReduceSum", "ScatterND", "ScatterElements", "NonZero", "Squeeze", "Unsqueeze", "Concat", "Slice", "Split"}

// mutate applies a small structural edit program to mp: each 3-byte
// instruction rewires an input, deletes a node, changes an op type,
// reshapes or truncates an initializer, swaps inputs or changes an int
// attribute.
func mutate(mp *pb.ModelProto, prog []byte) {
	g := mp.Graph
	var values []string
	for _, n := range g.Node {
		values = append(values, n.Output...)
	}
	for _, t := range g.Initializer {
		values = append(values, t.GetName())
	}
	for _, v := range g.Input {
		values = append(values, v.GetName())
	}
	values = append(values, "")
	for ; len(prog) >= 3; prog = prog[3:] {
		op, a, b := prog[0], int(prog[1]), int(prog[2])
		if len(g.Node) == 0 {
			return
		}
		n := g.Node[a%len(g.Node)]
		switch op % 8 {
		case 0: // rewire an input
			if len(n.Input) > 0 {
				n.Input[b%len(n.Input)] = values[(a*31+b)%len(values)]
			}
		case 1: // delete a node
			i := a % len(g.Node)
			g.Node = append(g.Node[:i], g.Node[i+1:]...)
		case 2: // change the op type
			n.OpType = proto.String(fuzzOps[b%len(fuzzOps)])
		case 3: // reshape an initializer (keeping or breaking its size)
			if len(g.Initializer) > 0 {
				t := g.Initializer[a%len(g.Initializer)]
				d := t.GetDims()
				switch {
				case len(d) > 1 && b&1 == 0:
					t.Dims = []int64{d[1], d[0]}
					t.Dims = append(t.Dims, d[2:]...)
				case len(d) > 0:
					t.Dims = append([]int64(nil), d...)
					t.Dims[b%len(d)] = int64(b%5) - 1
				default:
					t.Dims = []int64{1}
				}
			}
		case 4: // swap two inputs
			if len(n.Input) > 1 {
				i, j := a%len(n.Input), b%len(n.Input)
				n.Input[i], n.Input[j] = n.Input[j], n.Input[i]
			}
		case 5: // change an int attribute (k, axis, perm, activation ...)
			if len(n.Attribute) > 0 {
				at := n.Attribute[b%len(n.Attribute)]
				v := int64(int8(a))
				at.I = proto.Int64(v)
				for i := range at.Ints {
					at.Ints[i] = v + int64(i)
				}
				if at.F != nil {
					f := float32(v) / 4
					at.F = &f
				}
			}
		case 6: // change a scalar constant initializer (a k, an axis, a scale)
			for _, t := range g.Initializer {
				if len(t.GetDims()) <= 1 && len(t.RawData) > 0 && len(t.RawData) <= 8 {
					t.RawData = append([]byte(nil), t.RawData...)
					t.RawData[0] = byte(a)
					break
				}
			}
		case 7: // drop a node output or a graph output
			if len(n.Output) > 1 {
				n.Output = n.Output[:1+b%(len(n.Output)-1)]
			} else if len(g.Output) > 0 {
				g.Output[0].Name = proto.String(values[b%len(values)])
			}
		}
	}
}

// FuzzDetect runs the MoE matcher over mutated models. The corpus models
// are the bundled example, the exported block fixtures when present, and
// small synthetic models of every exporter shape (softmax and sigmoid
// routing, with and without a shared expert); they are loaded once, and
// each fuzz input picks one (pick) and edits its structure (prog, see
// mutate), so the fuzzer mutates a few bytes instead of whole models. A
// non-empty raw replaces the picked model with arbitrary bytes (its seeds are
// the synthetic models' encodings). Models that pass graph.Model.Check
// (what the CLI requires) go through Detect and Rewrite (no numerical
// check). Either may refuse; neither may panic, a fused model must validate.
func FuzzDetect(f *testing.F) {
	var corpus [][]byte
	for _, shape := range models.Shapes {
		for _, shared := range []int{0, 8} {
			if shape == models.ShapeORT && shared > 0 {
				continue
			}
			cfg := models.Config{Shape: shape, Layers: 1, Experts: 4, TopK: 2, Hidden: 8, Inter: 8, SharedInter: shared, Normalize: true, Tokens: 3}
			if shared > 0 {
				cfg.Router = "sigmoid"
			}
			m, err := models.Build(cfg)
			if err != nil {
				f.Fatal(err)
			}
			b, err := m.Marshal()
			if err != nil {
				f.Fatal(err)
			}
			corpus = append(corpus, b)
			f.Add(uint8(0), []byte{}, b)
		}
	}
	seeds, _ := filepath.Glob("../testdata/example/*.onnx")
	fx, _ := filepath.Glob(filepath.Join(fixtureDir, "*_block_*.onnx"))
	more, _ := filepath.Glob(filepath.Join(exportedDir, "*_block_*.onnx"))
	fx = append(fx, more...)
	more, _ = filepath.Glob(filepath.Join(producersDir, "sorted_*.onnx"))
	fx = append(fx, more...)
	for _, p := range append(seeds, fx...) {
		if b, err := os.ReadFile(p); err == nil {
			corpus = append(corpus, b)
		}
	}
	for i := range corpus {
		f.Add(uint8(i), []byte{}, []byte{})
		f.Add(uint8(i), []byte{2, 3, 0, 0, 5, 9, 3, 1, 2}, []byte{})
		f.Add(uint8(i), []byte{5, 1, 0, 6, 2, 0}, []byte{})
	}
	f.Fuzz(func(t *testing.T, pick uint8, prog, raw []byte) {
		b := raw
		if len(b) == 0 {
			b = corpus[int(pick)%len(corpus)]
		}
		m, err := graph.Parse(b, "fuzz.onnx")
		if err != nil {
			return
		}
		mutate(m.Proto, prog)
		if err := m.Check(); err != nil {
			return
		}
		det, err := Detect(m)
		if err != nil {
			if !errors.Is(err, graph.ErrBadInput) {
				t.Fatalf("Detect: %v", err)
			}
			return
		}
		for _, nm := range det.NearMiss {
			if strings.Contains(nm.Reason, errMatcherFault) {
				t.Fatalf("near miss %s: %s", nm.Node, nm.Reason)
			}
		}
		for _, blk := range det.Blocks {
			if blk.Spec.NumExperts <= 0 || blk.Spec.TopK <= 0 || blk.Spec.TopK > blk.Spec.NumExperts {
				t.Fatalf("block %s accepted with E=%d k=%d", blk.Name, blk.Spec.NumExperts, blk.Spec.TopK)
			}
		}
		rep, err := Rewrite(m, Options{Partial: true})
		if err != nil {
			// A refusal is fine (it must say why); a panic fails the run.
			if err.Error() == "" || strings.Contains(err.Error(), errMatcherFault) {
				t.Fatalf("Rewrite: %q", err)
			}
			return
		}
		if errs := m.Graph().Validate(); len(errs) > 0 {
			t.Fatalf("Rewrite (%d fused) left an invalid graph: %v", len(rep.Fused), errs)
		}
	})
}

// TestMalformedTopK: a TopK without its k input (first found by FuzzDetect's
// seeds, which panicked indexing tk.Input[1]) is refused by Check with a
// message naming the node, and Detect, reached without Check, reports a
// matcher fault for the candidate instead of panicking.
func TestMalformedTopK(t *testing.T) {
	m, err := models.Build(models.Config{Shape: models.ShapeBatched, Layers: 1, Experts: 4, TopK: 2, Hidden: 8, Inter: 8, Normalize: true})
	if err != nil {
		t.Fatal(err)
	}
	var tk *pb.NodeProto
	for _, n := range m.Proto.Graph.Node {
		if n.GetOpType() == "TopK" {
			tk = n
		}
	}
	if tk == nil {
		t.Fatal("no TopK in the synthetic model")
	}
	tk.Input = tk.Input[:1]
	err = m.Check()
	if !errors.Is(err, graph.ErrBadInput) || !strings.Contains(err.Error(), fmt.Sprintf("node %q (TopK) has 1 inputs; TopK (opset", graph.NodeLabel(tk))) {
		t.Fatalf("Check: %v", err)
	}
	det, err := Detect(m)
	if err != nil {
		t.Fatal(err)
	}
	faulted := false
	for _, nm := range det.NearMiss {
		faulted = faulted || nm.Node == graph.NodeLabel(tk) && strings.Contains(nm.Reason, errMatcherFault)
	}
	if len(det.Blocks) != 0 || !faulted {
		t.Fatalf("Detect on a TopK without k: %d blocks, near misses %+v", len(det.Blocks), det.NearMiss)
	}
}
