package passes

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/fixtures"
	"github.com/mokopt/mokopt/models"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// controlFlowBlocks are the exported blocks the control-flow tests wrap.
var controlFlowBlocks = []string{
	"example/mixtral_block_dynamo_batched_mm.onnx",
	"exported/deepseek_v2_block_dynamo_batched_mm.onnx",
	"exported/olmoe_block_torchscript.onnx",
	// old opsets: the fused branch is rewritten at 13, the model raised to it
	"producers/m_opset12_phimoe.onnx",
	"producers/opset11_hf4_qwen2_shared.onnx",
}

// wrapFeeds returns inputs of a wrapped model that it runs on, and its
// outputs there: random hidden states of the block's shape (stacked for a
// Scan), the first seed of several that the model runs on (a TorchScript
// trace runs only on inputs that route as its trace input did), and the
// If condition.
func wrapFeeds(t *testing.T, m *graph.Model, cond bool) (map[string]*eval.Tensor, map[string]*eval.Tensor) {
	t.Helper()
	var err error
	for seed := uint64(1); seed <= 30; seed++ {
		feeds, ferr := RandomFeeds(m, seed, 8)
		if ferr != nil {
			t.Fatal(ferr)
		}
		for _, v := range m.Proto.Graph.Input {
			if v.GetName() == models.CondInput {
				feeds[v.GetName()] = eval.NewBool([]int{1}, []bool{cond})
			}
		}
		want, rerr := eval.Run(context.Background(), m, feeds, eval.Options{})
		if rerr == nil {
			return feeds, want
		}
		err = rerr
	}
	t.Fatalf("the original runs on none of the inputs: %v", err)
	return nil, nil
}

// loadWrapped loads a testdata block and wraps it as how says.
func loadWrapped(t *testing.T, block, how string) *graph.Model {
	t.Helper()
	b, err := graph.Load(filepath.Join(fixtures.Testdata(), block))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	m, err := models.WrapControlFlow(b, how)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// maxRelDiffTensor is the largest |a-b| over the largest |b| of the output.
func maxRelDiffTensor(a, b *eval.Tensor) float64 {
	worst, peak := 0.0, 0.0
	for i := range b.F32 {
		worst = math.Max(worst, math.Abs(float64(a.F32[i]-b.F32[i])))
		peak = math.Max(peak, math.Abs(float64(b.F32[i])))
	}
	if len(a.F32) != len(b.F32) {
		return math.Inf(1)
	}
	return worst / math.Max(peak, 1e-30)
}

// TestRewriteControlFlow: an exported block wrapped in an If branch (then
// and else), a Loop body (the weights captured from the main graph, the
// block run once per iteration; or, transposed twice, computed from them
// in the main graph), an If inside a Loop body, a Scan body,
// and a model-local function called from an If branch, is fused in place,
// checked on the values the subgraph sees, and the rewritten model, run by
// the interpreter (through the fused node's kernel and through its
// function body), gives the original's outputs on both branches.
func TestRewriteControlFlow(t *testing.T) {
	for _, block := range controlFlowBlocks {
		for _, how := range models.WrapKinds {
			t.Run(filepath.Base(block)+"/"+how, func(t *testing.T) {
				m := loadWrapped(t, block, how)
				orig := loadWrapped(t, block, how)
				if how == models.WrapFunctionInIf && m.Opset("") < 13 {
					// refused: the function's body would need converting, and
					// its ranks are unknown there (TestControlFlowOldOpset)
					t.Skip("a model-local function at an old opset")
				}
				det, err := Detect(m)
				if err != nil {
					t.Fatal(err)
				}
				blocks := 1
				if how == models.WrapIfBoth {
					blocks = 2
				}
				if len(det.Blocks) != blocks || det.Blocks[0].Scope == "" || len(det.NearMiss) > 0 {
					t.Fatalf("detect: %d blocks (scope %q), near-misses %v", len(det.Blocks), scopeOf(det), det.NearMiss)
				}
				rep, err := Rewrite(m, Options{Check: true})
				if err != nil {
					t.Fatal(err)
				}
				if len(rep.Fused) != blocks || rep.Fused[0].Block.Scope == "" {
					t.Fatalf("fused %d, report %+v", len(rep.Fused), rep)
				}
				if strings.Contains(strings.Join(rep.Warnings, ";"), "inconclusive") {
					t.Errorf("check inconclusive: %v", rep.Warnings)
				}
				checkFusedInSubgraph(t, m, blocks)
				if err := moe.CheckBodies(m); err != nil {
					t.Fatalf("fused bodies: %v", err)
				}
				if errs := m.Graph().Validate(); len(errs) > 0 {
					t.Fatal(errs)
				}
				for _, cond := range []bool{true, false} {
					feeds, want := wrapFeeds(t, orig, cond)
					for _, fn := range []bool{false, true} {
						got, err := eval.Run(context.Background(), m, feeds, eval.Options{Kernels: evalKernels(), PreferFunctions: fn})
						if err != nil {
							t.Fatalf("rewritten model (function body %v): %v", fn, err)
						}
						if d := maxRelDiffTensor(got[models.WrappedOutput], want[models.WrappedOutput]); d > 1e-4 {
							t.Errorf("cond %v, function body %v: outputs differ by %.3g of their peak", cond, fn, d)
						}
					}
				}
			})
		}
	}
}

func scopeOf(det *Detection) string {
	if len(det.Blocks) == 0 {
		return ""
	}
	return det.Blocks[0].Scope
}

// checkFusedInSubgraph fails unless m's main graph holds no fused node and
// only the control-flow nodes (what computed weights for the block is
// gone with it), no graph holds a TopK, the subgraphs hold blocks fused nodes, and its function and
// provenance are at the model level.
func checkFusedInSubgraph(t *testing.T, m *graph.Model, blocks int) {
	t.Helper()
	var fused []*pb.NodeProto
	var walk func(gp *pb.GraphProto, depth int)
	walk = func(gp *pb.GraphProto, depth int) {
		for _, n := range gp.Node {
			if n.GetDomain() == moe.Domain && n.GetOpType() == moe.OpType {
				if depth == 0 {
					t.Errorf("fused node %s in the main graph", n.GetName())
				}
				fused = append(fused, n)
			}
			if n.GetOpType() == "TopK" {
				t.Errorf("TopK %s left at depth %d", graph.NodeLabel(n), depth)
			}
			for _, s := range scopeSites(&pb.GraphProto{Node: []*pb.NodeProto{n}}) {
				walk(s.g, depth+1)
			}
		}
	}
	walk(m.Proto.Graph, 0)
	for _, n := range m.Proto.Graph.Node {
		if len(scopeSites(&pb.GraphProto{Node: []*pb.NodeProto{n}})) == 0 {
			t.Errorf("node %s (%s) left in the main graph", graph.NodeLabel(n), n.GetOpType())
		}
	}
	if len(fused) != blocks {
		t.Fatalf("%d fused nodes, want %d", len(fused), blocks)
	}
	for _, f := range fused {
		if _, ok := m.Metadata(ProvenanceKey + f.GetName()); !ok {
			t.Errorf("no provenance for %s", f.GetName())
		}
	}
	c := m.WorkingCopy()
	c.Proto.Functions = nil
	if err := moe.CheckBodies(c); err == nil {
		t.Error("CheckBodies passes a fused node in a subgraph without its body")
	}
	fn := 0
	for _, f := range m.Proto.Functions {
		if f.GetDomain() == moe.Domain {
			fn++
		} else {
			t.Errorf("function %s::%s left", f.GetDomain(), f.GetName())
		}
	}
	if fn != 1 {
		t.Errorf("%d fused-op functions", fn)
	}
}

// TestControlFlowCheckCatches: the numerical check of a block inside a
// subgraph runs on the values the subgraph sees: a block whose fused
// semantics are wrong (renormalisation dropped) is refused, named with
// where it lives, and nothing is edited; with Partial the model is left
// as it was and the refusal reported.
func TestControlFlowCheckCatches(t *testing.T) {
	detectedHook = func(b *Block) { b.Spec.NormalizeTopK = !b.Spec.NormalizeTopK }
	defer func() { detectedHook = nil }()
	for _, how := range models.WrapKinds {
		t.Run(how, func(t *testing.T) {
			m := loadWrapped(t, controlFlowBlocks[0], how)
			before, _ := m.Marshal()
			_, err := Rewrite(m, Options{Check: true})
			if err == nil || !strings.Contains(err.Error(), "in ") || !strings.Contains(err.Error(), "differ") {
				t.Fatalf("err %v, want a refusal naming the scope", err)
			}
			if after, _ := m.Marshal(); string(after) != string(before) {
				t.Error("the model was edited")
			}
			rep, err := Rewrite(m, Options{Check: true, Partial: true})
			if err != nil {
				t.Fatal(err)
			}
			want := 1
			if how == models.WrapIfBoth {
				want = 2
			}
			if len(rep.Fused) != 0 || len(rep.Refused) != want || rep.Refused[0].Scope == "" {
				t.Fatalf("fused %d, refused %+v", len(rep.Fused), rep.Refused)
			}
		})
	}
}

// TestControlFlowNeverSilent: a router in a subgraph or function that
// does not fuse is named with where it lives and why; a model whose
// subgraphs hold no router rewrites to nothing without an error.
func TestControlFlowNeverSilent(t *testing.T) {
	for _, tc := range []struct {
		name, block, how string
		want             []string // in the error, all of them
	}{
		{"lost experts in an If branch", "exported/ernie4_5_moe_block_torchscript.onnx", models.WrapIfThen,
			[]string{`/m/gate/TopK in If node "moe_if"'s then_branch`, "unrolled its loop over hit experts"}},
		{"lost experts in a Loop body", "exported/ernie4_5_moe_block_torchscript.onnx", models.WrapLoop,
			[]string{`/m/gate/TopK in Loop node "moe_loop"'s body`, "hit experts"}},
		{"function not inlined", controlFlowBlocks[0], models.WrapFunctionInIf,
			[]string{"in function local::MoEBlock", "not inlined", "imports ai.onnx at version 17"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := loadWrapped(t, tc.block, tc.how)
			if tc.how == models.WrapFunctionInIf { // the function's ops at another version: not inlined
				m.Proto.Functions[0].OpsetImport[0].Version = proto.Int64(17)
			}
			det, err := Detect(m)
			if err != nil {
				t.Fatal(err)
			}
			if len(det.Blocks) != 0 || len(det.NearMiss) != 1 || det.NearMiss[0].Scope == "" {
				t.Fatalf("detect: %d blocks, near-misses %+v", len(det.Blocks), det.NearMiss)
			}
			_, err = Rewrite(m, Options{Check: true})
			if err == nil {
				t.Fatal("rewrite succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			rep, err := Rewrite(m, Options{Check: true, Partial: true})
			if err != nil || len(rep.Fused) != 0 || len(rep.NearMiss) != 1 {
				t.Fatalf("partial: err %v, report %+v", err, rep)
			}
		})
	}
	t.Run("no router", func(t *testing.T) {
		m := loadWrapped(t, controlFlowBlocks[0], models.WrapIfThen)
		branch := graph.Attr(m.Proto.Graph.Node[0], "then_branch").G
		for _, n := range branch.Node { // a dense MLP: the router's TopK gone
			if n.GetOpType() == "TopK" {
				n.OpType = new(string)
				*n.OpType = "Identity"
			}
		}
		rep, err := Rewrite(m, Options{Partial: true})
		if err != nil || len(rep.Fused) != 0 || len(rep.Refused) != 0 {
			t.Fatalf("err %v, report %+v", err, rep)
		}
		// The branch is searched as the main graph is: the same graph on
		// its own gives the same near-misses, named here with the scope.
		alone := proto.Clone(branch).(*pb.GraphProto)
		alone.Input = append(alone.Input, m.Proto.Graph.Input...)
		alone.Initializer = append(alone.Initializer, m.Proto.Graph.Initializer...) // captured from the outer scope
		main := &graph.Model{Proto: &pb.ModelProto{IrVersion: m.Proto.IrVersion, OpsetImport: m.Proto.OpsetImport, Graph: alone}, Dir: m.Dir}
		det, err := Detect(main)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.NearMiss) != len(det.NearMiss) {
			t.Fatalf("near-misses in the branch %v, of the branch alone %v", rep.NearMiss, det.NearMiss)
		}
		for _, nm := range rep.NearMiss {
			if !strings.Contains(nm.Node, `in If node "moe_if"'s then_branch`) {
				t.Errorf("near-miss %q does not name its scope", nm.Node)
			}
		}
	})
}

// TestControlFlowRecursiveFunction: a function that calls itself inside
// its body's If branch unfolds only so deep: the rewrite ends, refusing.
func TestControlFlowRecursiveFunction(t *testing.T) {
	m := loadWrapped(t, controlFlowBlocks[0], models.WrapIfInFunction)
	f := m.Proto.Functions[0]
	then := graph.Attr(f.Node[0], "then_branch").G
	out := then.Output[0].GetName()
	call := graph.NewNode(f.GetName(), f.GetDomain(), "again", append([]string{models.CondInput, out}, f.Input[2:]...), []string{"again_out"})
	then.Node = append(then.Node, call)
	then.Output[0].Name = proto.String("again_out")
	if _, err := Detect(m); err != nil {
		t.Fatal(err)
	}
	_, err := Rewrite(m, Options{})
	if err == nil || !strings.Contains(err.Error(), "nest deeper") {
		t.Fatalf("err %v, want a refusal for nesting", err)
	}
}

// TestControlFlowNoSelectionNamed: experts without a TopK (a fixed
// routing table, a fixed dense mixture, a soft mixture) inside an If
// branch or a Loop body are named as they are in the main graph: the
// fixed ones refused naming the scope, the soft one in a warning.
func TestControlFlowNoSelectionNamed(t *testing.T) {
	blocks := []struct {
		name  string
		build func(t *testing.T) *graph.Model
		say   string // in the refusal; "" for a warning
	}{
		{"fixed routing table", func(t *testing.T) *graph.Model {
			return fixedRoutingModel(t, nil, func(b *fixedBuilder, e int) string { return b.ints([]int64{2, 1}, int64(e), int64(e+4)) })
		}, "routing does not depend on the hidden state: 4 expert branches"},
		{"fixed dense mixture", func(t *testing.T) *graph.Model { return fixedDenseBlock(t, models.MixConstant, 3) },
			"routing does not depend on the hidden state: 4 dense experts"},
		{"soft mixture", func(t *testing.T) *graph.Model { return softDense(t, "output") }, ""},
	}
	for _, b := range blocks {
		for _, how := range []string{models.WrapIfThen, models.WrapLoop} {
			t.Run(b.name+"/"+how, func(t *testing.T) {
				m, err := models.WrapControlFlow(b.build(t), how)
				if err != nil {
					t.Fatal(err)
				}
				rep, err := Rewrite(m, Options{Check: true})
				if b.say == "" {
					if err != nil || len(rep.Fused) != 0 || len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "soft routing left unfused") || !strings.Contains(rep.Warnings[0], " node ") {
						t.Fatalf("want one warning naming the soft mixture and its scope, got %v, report %+v", err, rep)
					}
					return
				}
				if err == nil || !errors.Is(err, ErrNotFused) || !strings.Contains(err.Error(), b.say) || !strings.Contains(err.Error(), "node \"") {
					t.Fatalf("want a refusal naming the scope and %q, got %v", b.say, err)
				}
			})
		}
	}
}

// TestControlFlowOldOpset: a block in an If branch of an opset-12 model
// (PhiMoE's sparsemixer, by ArgMax) fuses there, at opset 13, and the rest of
// the model is raised to it: a Squeeze with axes as an attribute in the
// other branch is converted (TestRewriteControlFlow checks the numbers of
// every wrapping). A block in a model-local function called from the branch
// is refused naming the branch and the opset: the function's body would
// need converting.
func TestControlFlowOldOpset(t *testing.T) {
	m := loadWrapped(t, "producers/m_opset12_phimoe.onnx", models.WrapIfThen)
	if m.Opset("") != 12 {
		t.Fatalf("opset %d, want the source's 12", m.Opset(""))
	}
	orig := loadWrapped(t, "producers/m_opset12_phimoe.onnx", models.WrapIfThen)
	// the else branch (y = x) through an old-style Unsqueeze and Squeeze
	var els *pb.GraphProto
	for _, a := range m.Proto.Graph.Node[len(m.Proto.Graph.Node)-1].Attribute {
		if a.GetName() == "else_branch" {
			els = a.G
		}
	}
	if els == nil || len(els.Node) != 1 || els.Node[0].GetOpType() != "Identity" {
		t.Fatalf("unexpected else branch %v", els)
	}
	id := els.Node[0]
	els.Node = []*pb.NodeProto{graph.NewNode("Unsqueeze", "", "old_unsq", id.Input, []string{"else_u"}, graph.IntsAttr("axes", 0)),
		graph.NewNode("Squeeze", "", "old_sq", []string{"else_u"}, id.Output, graph.IntsAttr("axes", 0))}
	rep, err := Rewrite(m, Options{Check: true})
	if err != nil || len(rep.Fused) != 1 {
		t.Fatalf("want the branch's block fused, got %v, report %+v", err, rep)
	}
	if m.Opset("") != 13 {
		t.Fatalf("opset %d after fusing, want 13", m.Opset(""))
	}
	if errs := m.Graph().Validate(); len(errs) > 0 {
		t.Fatal(errs)
	}
	converted := 0
	for _, a := range m.Proto.Graph.Node[len(m.Proto.Graph.Node)-1].Attribute {
		for _, n := range a.GetG().GetNode() {
			if (n.GetOpType() == "Squeeze" || n.GetOpType() == "Unsqueeze") && graph.Attr(n, "axes") == nil && len(n.Input) == 2 {
				converted++
			}
		}
	}
	if converted != 2 {
		t.Fatalf("%d of the else branch's Squeeze/Unsqueeze take axes as an input, want 2", converted)
	}
	sameWrapped(t, m, orig)
	// In a model-local function called from the branch, the block fuses
	// too: the call is inlined in the branch before its opset is raised.
	f := loadWrapped(t, "producers/m_opset12_phimoe.onnx", models.WrapFunctionInIf)
	forig := loadWrapped(t, "producers/m_opset12_phimoe.onnx", models.WrapFunctionInIf)
	rep, err = Rewrite(f, Options{Check: true})
	if err != nil || len(rep.Fused) != 1 || f.Opset("") != 13 {
		t.Fatalf("want the function's block fused at opset 13, got %v, report %+v, opset %d", err, rep, f.Opset(""))
	}
	if errs := f.Graph().Validate(); len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, fn := range f.Proto.Functions {
		for _, o := range fn.OpsetImport {
			if o.GetDomain() == "" && o.GetVersion() != 13 {
				t.Errorf("function %s imports opset %d in a model at 13", fn.GetName(), o.GetVersion())
			}
		}
	}
	sameWrapped(t, f, forig)
}

// sameWrapped fails the test unless the rewritten wrapped model m computes
// what orig does on both branches.
func sameWrapped(t *testing.T, m, orig *graph.Model) {
	t.Helper()
	for _, cond := range []bool{true, false} {
		feeds, want := wrapFeeds(t, orig, cond)
		got, err := eval.Run(context.Background(), m, feeds, eval.Options{Kernels: evalKernels()})
		if err != nil {
			t.Fatal(err)
		}
		if d := maxRelDiffTensor(got[models.WrappedOutput], want[models.WrappedOutput]); d > 1e-4 {
			t.Errorf("cond %v: outputs differ by %.3g of their peak", cond, d)
		}
	}
}
