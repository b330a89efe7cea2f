package diff

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/passes"
	"google.golang.org/protobuf/proto"
)

// assertOnlyRegions fails when r reports anything outside fused regions.
func assertOnlyRegions(t *testing.T, r *Result) {
	t.Helper()
	if r.Summary.OtherChanges != 0 {
		var b strings.Builder
		_ = Text(&b, r, false)
		t.Errorf("want no changes outside fused regions, got %d:\n%s", r.Summary.OtherChanges, b.String())
	}
	if len(r.Warnings) > 0 {
		t.Errorf("warnings: %v", r.Warnings)
	}
}

// TestRewriteRegions diffs every fixture that rewrites (wholly, or else
// partially) against its rewrite: exactly the fused regions, with the node and initializer counts
// of the rewrite's report and provenance, and nothing else. It repeats the
// diff without provenance records and with every name of the original
// changed, so that the regions must be inferred from structure alone.
func TestRewriteRegions(t *testing.T) {
	variants := []struct {
		name      string
		prepare   func(a, b *graph.Model)
		wantProvs bool
	}{
		{"provenance", func(a, b *graph.Model) {}, true},
		{"inferred", func(a, b *graph.Model) { stripProvenance(b) }, false},
		{"inferred-renamed", func(a, b *graph.Model) { stripProvenance(b); renameAll(a) }, false},
	}
	fused := 0
	for _, f := range fixtures(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			for _, v := range variants {
				t.Run(v.name, func(t *testing.T) {
					a := load(t, f)
					b, rep, ok := rewritten(t, f)
					if !ok {
						// a trace that lost experts fuses nothing: its
						// rewrite is itself, and the diff says so
						same := load(t, f)
						v.prepare(a, same)
						if r, err := Compare(a, same); err != nil || !r.Same() || len(r.Regions) != 0 {
							t.Fatalf("a fixture that fuses nothing against itself: %v", err)
						}
						return
					}
					fused++
					nA, nB := len(a.Proto.Graph.Node), len(b.Proto.Graph.Node)
					v.prepare(a, b)
					r, err := Compare(a, b)
					if err != nil {
						t.Fatal(err)
					}
					assertOnlyRegions(t, r)
					if len(r.Regions) != len(rep.Fused) {
						t.Fatalf("%d regions, want %d", len(r.Regions), len(rep.Fused))
					}
					if want := nA - nB + len(rep.Fused); r.Summary.RegionNodes != want {
						t.Errorf("regions hold %d nodes, want len(A)-len(B)+fused = %d", r.Summary.RegionNodes, want)
					}
					byNode := map[string]passes.Fused{}
					for _, fu := range rep.Fused {
						byNode[fu.Node] = fu
					}
					for _, g := range r.Regions {
						fu, ok := byNode[g.Fused.Name]
						if !ok {
							t.Fatalf("region of %q: no such fused node in the rewrite report", g.Fused.Name)
						}
						if len(g.Nodes) != fu.NodesRemoved || len(g.Initializers) != fu.InitsRemoved {
							t.Errorf("%s: %d nodes, %d initializers; rewrite removed %d, %d",
								g.Fused.Name, len(g.Nodes), len(g.Initializers), fu.NodesRemoved, fu.InitsRemoved)
						}
						if g.Fused.Op != "ai.mok::MoE" || g.Variant != fu.Overload {
							t.Errorf("%s: op %s variant %q, want ai.mok::MoE %q", g.Fused.Name, g.Fused.Op, g.Variant, fu.Overload)
						}
						if len(g.NewInitializers) == 0 {
							t.Errorf("%s: no new initializers attributed", g.Fused.Name)
						}
						if !v.wantProvs {
							if g.Provenance != nil {
								t.Errorf("%s: provenance reported without a record", g.Fused.Name)
							}
							continue
						}
						p := g.Provenance
						if p == nil || !p.Consistent || p.Nodes != len(g.Nodes) || p.Initializers != len(g.Initializers) {
							t.Errorf("%s: provenance check %+v for %d nodes, %d initializers", g.Fused.Name, p, len(g.Nodes), len(g.Initializers))
						}
						if len(g.Metadata) != 1 {
							t.Errorf("%s: provenance metadata not attributed to the region: %+v", g.Fused.Name, g.Metadata)
						}
					}
					// The function and the opset come with the first region.
					if len(r.Regions[0].Functions) == 0 || len(r.Regions[0].Opsets) != 1 {
						t.Errorf("first region: functions %+v, opsets %+v", r.Regions[0].Functions, r.Regions[0].Opsets)
					}
				})
			}
		})
	}
	if fused == 0 {
		t.Skip("no fixture rewrites")
	}
}

// TestSelfDiffEmpty diffs every fixture against a second load of itself.
func TestSelfDiffEmpty(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			a, b := load(t, f), load(t, f)
			r, err := Compare(a, b)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Same() || len(r.Regions) != 0 || r.Summary.OtherChanges != 0 || r.Summary.RenamedNodes != 0 {
				t.Errorf("self diff not empty: %s", r.Summary.Line)
			}
			if r.Summary.NodesMatched != len(a.Proto.Graph.Node) {
				t.Errorf("matched %d of %d nodes", r.Summary.NodesMatched, len(a.Proto.Graph.Node))
			}
			if r.Summary.Line != "no differences" {
				t.Errorf("summary %q", r.Summary.Line)
			}
		})
	}
}

// TestRenamedIsIdentical renames every node, value and initializer of each
// fixture (and reorders its nodes) and expects no difference.
func TestRenamedIsIdentical(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			a, b := load(t, f), load(t, f)
			renameAll(b)
			r, err := Compare(a, b)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Same() {
				var s strings.Builder
				_ = Text(&s, r, false)
				t.Fatalf("renamed copy differs:\n%s", s.String())
			}
			if r.Summary.RenamedNodes != len(a.Proto.Graph.Node) || r.Summary.RenamedInitializers != len(a.Proto.Graph.Initializer) {
				t.Errorf("renamed %d nodes, %d initializers; want %d, %d", r.Summary.RenamedNodes, r.Summary.RenamedInitializers,
					len(a.Proto.Graph.Node), len(a.Proto.Graph.Initializer))
			}
		})
	}
}

// TestFixtureAttributeChange edits one attribute of one node of a real
// model and expects exactly that node and attribute to be reported.
func TestFixtureAttributeChange(t *testing.T) {
	cases := []struct {
		file   string
		name   string
		op     string
		attr   string
		edit   func(n *pb.NodeProto, a *pb.AttributeProto) // a is nil to add
		change string
		old    string
		new    string
	}{
		{"", "int changed", "Softmax", "axis", func(n *pb.NodeProto, a *pb.AttributeProto) { a.I = proto.Int64(0) }, Changed, "-1", "0"},
		{"", "ints changed", "Transpose", "perm", func(n *pb.NodeProto, a *pb.AttributeProto) {
			a.Ints = []int64{a.Ints[1], a.Ints[0], a.Ints[2], a.Ints[3]}
		}, Changed, "", ""},
		{"", "attribute removed", "TopK", "largest", func(n *pb.NodeProto, a *pb.AttributeProto) {
			var keep []*pb.AttributeProto
			for _, x := range n.Attribute {
				if x != a {
					keep = append(keep, x)
				}
			}
			n.Attribute = keep
		}, Removed, "1", ""},
		{"", "attribute added", "Mul", "note", func(n *pb.NodeProto, a *pb.AttributeProto) {
			n.Attribute = append(n.Attribute, graph.StringAttr("note", "hello"))
		}, Added, "", `"hello"`},
		{"mixtral_block_torchscript.onnx", "constant tensor changed", "Constant", "value", func(n *pb.NodeProto, a *pb.AttributeProto) {
			a.T = proto.Clone(a.T).(*pb.TensorProto)
			a.T.RawData = nil
			a.T.Int64Data = nil
			a.T.DataType = proto.Int32(int32(pb.TensorProto_INT64))
			a.T.Dims = []int64{1}
			a.T.Int64Data = []int64{12345}
		}, Changed, "", "INT64[1] [12345]"},
		{"", "float changed", "Gemm", "alpha", func(n *pb.NodeProto, a *pb.AttributeProto) { a.F = proto.Float32(0.5) }, Changed, "1", "0.5"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.file == "" {
				tc.file = "mixtral_full_dynamo_batched_mm.onnx"
			}
			path := fixture(t, tc.file)
			a, b := load(t, path), load(t, path)
			var target *pb.NodeProto
			var attr *pb.AttributeProto
			for _, n := range b.Proto.Graph.Node {
				if n.GetOpType() != tc.op {
					continue
				}
				attr = graph.Attr(n, tc.attr)
				if tc.change == Added && attr == nil || tc.change != Added && attr != nil {
					target = n
					break
				}
			}
			if target == nil {
				t.Skipf("no %s node to edit", tc.op)
			}
			tc.edit(target, attr)
			r, err := Compare(a, b)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Nodes.Changed) != 1 || r.Summary.OtherChanges != 1 {
				var s strings.Builder
				_ = Text(&s, r, false)
				t.Fatalf("want exactly one changed node:\n%s", s.String())
			}
			ch := r.Nodes.Changed[0]
			if ch.B.Name != target.GetName() || ch.A.Name != target.GetName() {
				t.Errorf("changed node %q/%q, want %q", ch.A.Name, ch.B.Name, target.GetName())
			}
			if len(ch.Attributes) != 1 || ch.Attributes[0].Name != tc.attr || ch.Attributes[0].Change != tc.change || len(ch.Inputs) != 0 {
				t.Fatalf("attribute changes %+v, inputs %+v", ch.Attributes, ch.Inputs)
			}
			if tc.old != "" && ch.Attributes[0].Old != tc.old || tc.new != "" && ch.Attributes[0].New != tc.new {
				t.Errorf("values %q -> %q, want %q -> %q", ch.Attributes[0].Old, ch.Attributes[0].New, tc.old, tc.new)
			}
		})
	}
}

// TestSynthetic covers the kinds of change on a small hand-built graph.
func TestSynthetic(t *testing.T) {
	type want struct {
		same                   bool
		removed, added         []string
		changed                []string
		changedInits           []string
		io                     int
		regions                int
		regionNodes, regionIni []string
	}
	cases := []struct {
		name string
		edit func(g *pb.GraphProto) map[string]string // returns B's metadata
		want want
		// check runs extra assertions.
		check func(t *testing.T, r *Result)
	}{
		{name: "identical", edit: func(g *pb.GraphProto) map[string]string { return nil }, want: want{same: true}},
		{name: "nodes reordered", edit: func(g *pb.GraphProto) map[string]string {
			g.Node[0], g.Node[1], g.Node[2] = g.Node[2], g.Node[0], g.Node[1]
			return nil
		}, want: want{same: true}},
		{name: "attribute changed", edit: func(g *pb.GraphProto) map[string]string {
			graph.Attr(nodeNamed(g, "sm"), "axis").I = proto.Int64(1)
			return nil
		}, want: want{changed: []string{"sm"}}, check: func(t *testing.T, r *Result) {
			a := r.Nodes.Changed[0].Attributes
			if len(a) != 1 || a[0].Name != "axis" || a[0].Old != "-1" || a[0].New != "1" {
				t.Errorf("attributes %+v", a)
			}
		}},
		{name: "node removed", edit: func(g *pb.GraphProto) map[string]string {
			nodeNamed(g, "sm").Input[0] = "h2"
			g.Node = append(g.Node[:2], g.Node[3:]...)
			return nil
		}, want: want{removed: []string{"relu"}, changed: []string{"sm"}}, check: func(t *testing.T, r *Result) {
			in := r.Nodes.Changed[0].Inputs
			if len(in) != 1 || in[0].Slot != 0 || !strings.Contains(in[0].Old, "relu") || !strings.Contains(in[0].New, "add1") {
				t.Errorf("inputs %+v", in)
			}
		}},
		{name: "node inserted", edit: func(g *pb.GraphProto) map[string]string {
			nodeNamed(g, "sm").Input[0] = "h3b"
			g.Node = append(g.Node, graph.NewNode("Sigmoid", "", "sig", []string{"h3"}, []string{"h3b"}))
			return nil
		}, want: want{added: []string{"sig"}, changed: []string{"sm"}}},
		{name: "op replaced", edit: func(g *pb.GraphProto) map[string]string {
			nodeNamed(g, "relu").OpType = proto.String("Gelu")
			nodeNamed(g, "relu").Name = proto.String("gelu")
			return nil
		}, want: want{removed: []string{"relu"}, added: []string{"gelu"}}},
		{name: "initializer changed", edit: func(g *pb.GraphProto) map[string]string {
			g.Initializer[2] = floatTensor("W2", []int64{2, 2}, 5, 6, 7, 9)
			return nil
		}, want: want{changedInits: []string{"W2"}}},
		{name: "initializer renamed", edit: func(g *pb.GraphProto) map[string]string {
			g.Initializer[2].Name = proto.String("W2_new")
			nodeNamed(g, "mm2").Input[1] = "W2_new"
			return nil
		}, want: want{same: true}, check: func(t *testing.T, r *Result) {
			if r.Summary.RenamedInitializers != 1 {
				t.Errorf("renamed initializers %d", r.Summary.RenamedInitializers)
			}
		}},
		{name: "output type changed", edit: func(g *pb.GraphProto) map[string]string {
			g.Output[0] = tensorValue("y", pb.TensorProto_FLOAT16, 2, 2)
			return nil
		}, want: want{io: 1}},
		{name: "fused without provenance", edit: func(g *pb.GraphProto) map[string]string {
			fuse(g)
			return nil
		}, want: want{regions: 1, regionNodes: []string{"add1", "relu"}, regionIni: []string{"B1"}}, check: func(t *testing.T, r *Result) {
			g := r.Regions[0]
			if g.Provenance != nil || g.Fused.Name != "fused/MoE" || len(g.NewInitializers) != 1 {
				t.Errorf("region %+v", g)
			}
		}},
		{name: "fused with wrong provenance", edit: func(g *pb.GraphProto) map[string]string {
			fuse(g)
			js, _ := json.Marshal(passes.Provenance{Node: "fused/MoE", Kind: "dense", Nodes: []string{"add1", "mm1"}, Initializers: []string{"B1"}})
			return map[string]string{passes.ProvenanceKey + "fused/MoE": string(js)}
		}, want: want{regions: 1, regionNodes: []string{"add1", "relu"}, regionIni: []string{"B1"}}, check: func(t *testing.T, r *Result) {
			p := r.Regions[0].Provenance
			if p == nil || p.Consistent || !reflect.DeepEqual(p.MissingNodes, []string{"mm1"}) || !reflect.DeepEqual(p.ExtraNodes, []string{"relu"}) {
				t.Errorf("provenance check %+v", p)
			}
			if r.Regions[0].Kind != "dense" || len(r.Regions[0].Metadata) != 1 || len(r.Metadata) != 0 {
				t.Errorf("region %+v, metadata %+v", r.Regions[0], r.Metadata)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			gb := mlp()
			meta := tc.edit(gb)
			a, b := modelOf(t, mlp(), nil), modelOf(t, gb, meta)
			r, err := Compare(a, b)
			if err != nil {
				t.Fatal(err)
			}
			var changed []string
			for _, c := range r.Nodes.Changed {
				changed = append(changed, c.B.Name)
			}
			var changedInits []string
			for _, c := range r.Initializers.Changed {
				changedInits = append(changedInits, c.B.Name)
			}
			var regionNodes, regionInits []string
			for _, g := range r.Regions {
				regionNodes = append(regionNodes, names(g.Nodes)...)
				regionInits = append(regionInits, initNames(g.Initializers)...)
			}
			got := want{same: r.Same(), removed: names(r.Nodes.Removed), added: names(r.Nodes.Added), changed: changed,
				changedInits: changedInits, io: len(r.IO), regions: len(r.Regions), regionNodes: regionNodes, regionIni: regionInits}
			norm := func(w want) want {
				for _, s := range []*[]string{&w.removed, &w.added, &w.changed, &w.changedInits, &w.regionNodes, &w.regionIni} {
					if len(*s) == 0 {
						*s = nil
					}
				}
				return w
			}
			if !reflect.DeepEqual(norm(got), norm(tc.want)) {
				var s strings.Builder
				_ = Text(&s, r, false)
				t.Fatalf("got %+v\nwant %+v\n%s", norm(got), norm(tc.want), s.String())
			}
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

// fuse replaces add1 and relu of mlp() by one ai.mok::MoE node.
func fuse(g *pb.GraphProto) {
	var keep []*pb.NodeProto
	for _, n := range g.Node {
		if n.GetName() != "add1" && n.GetName() != "relu" {
			keep = append(keep, n)
		}
	}
	keep = append(keep, graph.NewNode("MoE", FusedDomain, "fused/MoE", []string{"h1", "fused/bias"}, []string{"h3"}))
	g.Node = keep
	g.Initializer = []*pb.TensorProto{g.Initializer[0], g.Initializer[2], floatTensor("fused/bias", []int64{2}, 0.5, -0.5)}
}

// TestStructuralEdits makes one edit at a time to sampled nodes of every
// fixture, renames and reorders the original, and expects the diff to name
// exactly the edit: an attribute change is one changed node; deleting a
// node (its readers rewired to its first input) is one removed node and
// one changed node per reader.
func TestStructuralEdits(t *testing.T) {
	const perFixture = 6
	kinds := []struct {
		name string
		// edit changes node k of b's graph and returns the names of the
		// nodes expected changed and removed, or ok=false to skip k.
		edit func(g *graph.Graph, k int) (changed, removed []string, ok bool)
	}{
		{"attribute", func(g *graph.Graph, k int) ([]string, []string, bool) {
			n := g.P.Node[k]
			for _, a := range n.Attribute {
				switch a.GetType() {
				case pb.AttributeProto_INT:
					a.I = proto.Int64(a.GetI() + 17)
				case pb.AttributeProto_FLOAT:
					a.F = proto.Float32(a.GetF() + 1.5)
				default:
					continue
				}
				return []string{n.GetName()}, nil, true
			}
			return nil, nil, false
		}},
		{"delete", func(g *graph.Graph, k int) ([]string, []string, bool) {
			n := g.P.Node[k]
			if len(n.Output) != 1 || len(n.Input) == 0 || g.Producer(n.Input[0]) == nil || g.IsOutput(n.Output[0]) {
				return nil, nil, false
			}
			readers := map[string]bool{}
			for _, c := range g.Consumers(n.Output[0]) {
				for i, in := range c.Input {
					if in == n.Output[0] {
						c.Input[i] = n.Input[0]
					}
				}
				readers[c.GetName()] = true
			}
			g.P.Node = append(g.P.Node[:k:k], g.P.Node[k+1:]...)
			var changed []string
			for r := range readers {
				changed = append(changed, r)
			}
			return changed, []string{n.GetName()}, true
		}},
	}
	for _, f := range fixtures(t) {
		for _, kind := range kinds {
			t.Run(filepath.Base(f)+"/"+kind.name, func(t *testing.T) {
				nodes := len(load(t, f).Proto.Graph.Node)
				done := 0
				for k := 0; k < nodes && done < perFixture; k += max(1, nodes/(3*perFixture)) {
					a, b := load(t, f), load(t, f)
					changed, removed, ok := kind.edit(b.Graph(), k)
					if !ok {
						continue
					}
					done++
					renameAll(a)
					r, err := Compare(a, b)
					if err != nil {
						t.Fatal(err)
					}
					var gotChanged []string
					for _, c := range r.Nodes.Changed {
						gotChanged = append(gotChanged, c.B.Name)
					}
					sort.Strings(gotChanged)
					sort.Strings(changed)
					if !reflect.DeepEqual(gotChanged, changed) || len(r.Nodes.Removed) != len(removed) ||
						r.Summary.OtherChanges != len(changed)+len(removed) {
						t.Errorf("node %d: want changed %v, removed %v; got %s", k, changed, removed, r.Summary.Line)
					}
				}
				if done == 0 {
					t.Skip("no node to edit")
				}
			})
		}
	}
}
