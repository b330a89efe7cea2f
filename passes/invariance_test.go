package passes

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// realExportDirs are the folders of testdata/ that hold real exports.
var realExportDirs = []string{"exported", "exported_half", "ep_export", "example", "producers"}

// realExports lists every real exported model in testdata/.
func realExports(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, d := range realExportDirs {
		fs, err := filepath.Glob(filepath.Join("..", "testdata", d, "*.onnx"))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, fs...)
	}
	if len(files) == 0 {
		t.Fatal("no real exports in testdata")
	}
	sort.Strings(files)
	return files
}

// shuffleOrder puts gp's nodes in a random valid topological order:
// Kahn's algorithm taking a random ready node at each step.
func shuffleOrder(gp *pb.GraphProto, rng *rand.Rand) {
	prod := map[string]int{}
	for i, n := range gp.Node {
		for _, o := range n.Output {
			if o != "" {
				prod[o] = i
			}
		}
	}
	indeg := make([]int, len(gp.Node))
	succ := make([][]int, len(gp.Node))
	for i, n := range gp.Node {
		seen := map[int]bool{}
		for _, in := range graph.NodeInputs(n) {
			if p, ok := prod[in]; ok && in != "" && !seen[p] {
				seen[p] = true
				succ[p] = append(succ[p], i)
				indeg[i]++
			}
		}
	}
	var ready []int
	for i := range gp.Node {
		if indeg[i] == 0 {
			ready = append(ready, i)
		}
	}
	out := make([]*pb.NodeProto, 0, len(gp.Node))
	for len(ready) > 0 {
		k := rng.IntN(len(ready))
		i := ready[k]
		ready[k] = ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		out = append(out, gp.Node[i])
		for _, j := range succ[i] {
			if indeg[j]--; indeg[j] == 0 {
				ready = append(ready, j)
			}
		}
	}
	gp.Node = out
}

// renameAll gives every node and every value of gp (inputs, outputs,
// initializers, value_info, node inputs and outputs, subgraphs) a fresh
// random name, and returns the map from new value names to old ones.
func renameAll(gp *pb.GraphProto, rng *rand.Rand) map[string]string {
	fwd := map[string]string{}
	var names []string
	note := func(v string) {
		if _, ok := fwd[v]; !ok && v != "" {
			fwd[v] = ""
			names = append(names, v)
		}
	}
	var collect func(g *pb.GraphProto)
	collect = func(g *pb.GraphProto) {
		for _, v := range g.Input {
			note(v.GetName())
		}
		for _, t := range g.Initializer {
			note(t.GetName())
		}
		for _, n := range g.Node {
			for _, v := range n.Input {
				note(v)
			}
			for _, v := range n.Output {
				note(v)
			}
			for _, a := range n.Attribute {
				if a.G != nil {
					collect(a.G)
				}
				for _, sg := range a.Graphs {
					collect(sg)
				}
			}
		}
		for _, v := range g.Output {
			note(v.GetName())
		}
	}
	collect(gp)
	perm := rng.Perm(len(names))
	back := make(map[string]string, len(names))
	for i, v := range names {
		nv := fmt.Sprintf("t%d_%x", perm[i], rng.Uint32())
		fwd[v], back[nv] = nv, v
	}
	re := func(v string) string {
		if nv, ok := fwd[v]; ok && nv != "" {
			return nv
		}
		return v
	}
	nodeNo := 0
	var apply func(g *pb.GraphProto)
	apply = func(g *pb.GraphProto) {
		for _, list := range [][]*pb.ValueInfoProto{g.Input, g.Output, g.ValueInfo} {
			for _, v := range list {
				v.Name = proto.String(re(v.GetName()))
			}
		}
		for _, t := range g.Initializer {
			t.Name = proto.String(re(t.GetName()))
		}
		for _, n := range g.Node {
			for i, v := range n.Input {
				n.Input[i] = re(v)
			}
			for i, v := range n.Output {
				n.Output[i] = re(v)
			}
			nodeNo++
			n.Name = proto.String(fmt.Sprintf("n%d_%x", rng.IntN(1<<20), nodeNo))
			for _, a := range n.Attribute {
				if a.G != nil {
					apply(a.G)
				}
				for _, sg := range a.Graphs {
					apply(sg)
				}
			}
		}
	}
	apply(gp)
	return back
}

// fusedSummary describes what Rewrite made of a model, in terms that do not
// depend on node order or names: per fused node (sorted), its overload, its
// attributes, the original names of the values it reads and writes other
// than weights, and the bytes of every weight it reads; then the counts of
// near-misses and refusals, and whether Rewrite failed.
func fusedSummary(t *testing.T, m *graph.Model, rep *Report, err error, back map[string]string) string {
	t.Helper()
	orig := func(v string) string {
		if o, ok := back[v]; ok {
			return o
		}
		return v
	}
	var parts []string
	g := m.Graph()
	for _, n := range m.Proto.Graph.Node {
		if n.GetDomain() != "ai.mok" {
			continue
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%s::%s[%s]", n.GetDomain(), n.GetOpType(), n.GetOverload())
		for _, a := range n.Attribute {
			fmt.Fprintf(&b, " %s=%v%v%v%s", a.GetName(), a.GetI(), a.GetF(), a.GetInts(), a.GetS())
		}
		for i, in := range n.Input {
			if init := g.Initializer(in); init != nil {
				raw, terr := m.TensorBytes(init)
				if terr != nil {
					t.Fatal(terr)
				}
				fmt.Fprintf(&b, " in%d=init%v:%x", i, init.GetDims(), raw)
				continue
			}
			fmt.Fprintf(&b, " in%d=%s", i, orig(in))
		}
		for i, o := range n.Output {
			fmt.Fprintf(&b, " out%d=%s", i, orig(o))
		}
		parts = append(parts, b.String())
	}
	sort.Strings(parts)
	s := strings.Join(parts, "\n")
	if rep != nil {
		s += fmt.Sprintf("\nfused %d near-misses %d refused %d", len(rep.Fused), len(rep.NearMiss), len(rep.Refused))
	}
	return s + fmt.Sprintf("\nfailed %v", err != nil)
}

// invarianceOrders is how many random orders × renamings each real export
// is tried under (fewer with -short).
func invarianceOrders() int {
	if testing.Short() {
		return 4
	}
	return 20
}

// TestOrderAndRenameInvariance rewrites every real export in testdata/
// under random valid topological orders of its nodes and random renamings
// of every node and value: each gives the same fused nodes (overload,
// attributes, weight bytes, the original values they read and write), the
// same counts of near-misses and refusals, and the fused model reproduces
// ONNX Runtime's golden output where the export has one.
func TestOrderAndRenameInvariance(t *testing.T) {
	for _, f := range realExports(t) {
		name := strings.TrimSuffix(filepath.Base(f), ".onnx")
		t.Run(filepath.Base(filepath.Dir(f))+"/"+name, func(t *testing.T) {
			t.Parallel()
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			load := func() *graph.Model {
				m, err := graph.Parse(raw, f)
				if err != nil {
					t.Fatal(err)
				}
				m.Path, m.Dir = f, filepath.Dir(f)
				return m
			}
			ds, _ := eval.ReadDataSet(filepath.Join(filepath.Dir(f), name+"_data", "test_data_set_0"))
			base := load()
			brep, berr := Rewrite(base, Options{Check: true})
			want := fusedSummary(t, base, brep, berr, nil)
			if berr == nil && len(brep.Fused) == 0 {
				t.Logf("nothing fused: %+v", brep.NearMiss)
			}
			// Numbers: the golden set through the fused model, when
			// something fused and mokopt's evaluator runs what is left
			// (contrib ops outside a block may remain).
			golden := berr == nil && len(brep.Fused) > 0 && ds != nil && len(ds.Outputs) > 0
			if golden {
				if d, err := runGolden(base, ds); err != nil || !d.OK() {
					t.Logf("golden set not compared: the file order's fused model gives %+v, %v", d, err)
					golden = false
				}
			}
			rng := rand.New(rand.NewPCG(uint64(len(raw)), 7))
			for trial := range invarianceOrders() {
				m := load()
				shuffleOrder(m.Proto.Graph, rng)
				back := renameAll(m.Proto.Graph, rng)
				rep, err := Rewrite(m, Options{Check: true})
				if got := fusedSummary(t, m, rep, err, back); got != want {
					reason := ""
					if err != nil {
						reason = err.Error()
					} else if rep != nil && len(rep.NearMiss) > 0 {
						reason = fmt.Sprint(rep.NearMiss)
					}
					t.Fatalf("trial %d: fused result differs from the file order's:\n got %.600s\nwant %.600s\n(%s)", trial, got, want, reason)
				}
				if !golden {
					continue
				}
				d, err := runGolden(m, ds)
				if err != nil {
					t.Fatalf("trial %d: %v", trial, err)
				}
				if !d.OK() {
					t.Fatalf("trial %d: differs from ONNX Runtime's golden output: %+v", trial, d)
				}
			}
		})
	}
}

// runGolden runs m on a golden set's inputs (by position) and compares its
// first output with the golden one.
func runGolden(m *graph.Model, ds *eval.DataSet) (eval.Diff, error) {
	feeds, err := eval.Feeds(m, ds.Inputs, nil)
	if err != nil {
		return eval.Diff{}, err
	}
	out, err := eval.Run(context.Background(), m, feeds, eval.Options{})
	if err != nil {
		return eval.Diff{}, err
	}
	return eval.Compare(out[m.Proto.Graph.Output[0].GetName()], ds.Outputs[0], 1e-4, 1e-5)
}

// TestMovedNodeKeepsFusion moves each node of the PhiMoE exports, one at a
// time, as far as four places later as the order stays valid (a Concat of
// the sparsemixer's picks moved so once made the block be refused): every
// such order fuses to the same node as the file order.
func TestMovedNodeKeepsFusion(t *testing.T) {
	for _, name := range []string{"phimoe_block_dynamo_batched_mm", "phimoe_block_torchscript"} {
		t.Run(name, func(t *testing.T) {
			f := filepath.Join(exportedDir, name+".onnx")
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			load := func() *graph.Model {
				m, err := graph.Parse(raw, f)
				if err != nil {
					t.Fatal(err)
				}
				return m
			}
			base := load()
			brep, berr := Rewrite(base, Options{})
			if berr != nil || len(brep.Fused) != 1 {
				t.Fatalf("file order: %v", berr)
			}
			want := fusedSummary(t, base, brep, berr, nil)
			nodes := load().Proto.Graph.Node
			moved := 0
			for i, n := range nodes {
				if n.GetOpType() != "Concat" && i%7 != 0 {
					continue // every Concat, and a sample of the rest
				}
				j := i
				for j < len(nodes)-1 && j < i+4 && !readsAny(nodes[j+1], n.Output) {
					j++
				}
				if j == i {
					continue
				}
				m := load()
				gn := m.Proto.Graph.Node
				mv := gn[i]
				copy(gn[i:j], gn[i+1:j+1])
				gn[j] = mv
				rep, err := Rewrite(m, Options{})
				if got := fusedSummary(t, m, rep, err, nil); got != want {
					t.Fatalf("node %q moved %d places later: got\n%.400s\nwant\n%.400s\n(%v)", graph.NodeLabel(mv), j-i, got, want, err)
				}
				moved++
			}
			if moved == 0 {
				t.Fatal("no node could be moved")
			}
		})
	}
}

// readsAny reports whether n reads one of vals.
func readsAny(n *pb.NodeProto, vals []string) bool {
	for _, in := range graph.NodeInputs(n) {
		for _, v := range vals {
			if in != "" && in == v {
				return true
			}
		}
	}
	return false
}

// TestOverlappingBlocksRefused gives detection's last step two blocks
// whose regions share a node: both are refused with a reason naming the
// other, whichever was found first.
func TestOverlappingBlocksRefused(t *testing.T) {
	m, err := graph.Load(filepath.Join(exportedDir, "qwen3_moe_block_dynamo_batched_mm.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	c, det := detectView(t, m)
	if len(det.Blocks) != 1 {
		t.Fatalf("detect: %d blocks", len(det.Blocks))
	}
	b := det.Blocks[0]
	half := &Block{TopK: b.TopK, Output: "other", Region: b.Region[len(b.Region)/2:]}
	for _, order := range [][]*Block{{b, half}, {half, b}} {
		d := &Detection{Blocks: slices.Clone(order)}
		c.dropOverlaps(d)
		if len(d.Blocks) != 0 || len(d.NearMiss) != 2 || !strings.Contains(d.NearMiss[0].Reason, "overlap") {
			t.Fatalf("kept %d blocks, near-misses %v", len(d.Blocks), d.NearMiss)
		}
	}
	d := &Detection{Blocks: []*Block{b}}
	c.dropOverlaps(d)
	if len(d.Blocks) != 1 {
		t.Fatal("a lone block was dropped")
	}
}

// detectView runs detection on m and returns it with a context over the
// same graph. Blocks name the nodes of the graph detection searched: the
// canonical working copy when canonicalization changes the model (its
// nodes are messages of its own, new on each call), else the model
// itself. Detect's steps are run here over one such view, so that the
// blocks and the context share it.
func detectView(t *testing.T, m *graph.Model) (*ctx, *Detection) {
	t.Helper()
	view, _, _ := canonicalView(context.Background(), m)
	if view == nil {
		view = m
	}
	det, err := detectIn(view, view.Graph(), DetectOptions{})
	if err != nil {
		t.Fatalf("detect: %v", err)
	}
	c, err := newCtx(view, view.Graph())
	if err != nil {
		t.Fatal(err)
	}
	return c, det
}
