package passes

import (
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/models"
	"github.com/mokopt/mokopt/moe"
)

// fixedDenseBlock builds a one-layer dense model whose routing FixRouting
// replaced by mix.
func fixedDenseBlock(t *testing.T, mix models.FixedMixture, seed int64) *graph.Model {
	t.Helper()
	m, err := models.Build(models.Config{Shape: models.ShapeDense, Layers: 1, Experts: 4, TopK: 2, Hidden: 16, Inter: 8, Normalize: true, Tokens: 6, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	if err := models.FixRouting(m, mix, 6); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestFixedDenseRoutingRefused: a dense block whose experts are all mixed
// by weights that do not depend on the hidden state (a constant [E, 1, 1],
// the softmax of a constant vector, a constant per-token table, a constant
// scale of each expert's input), with no TopK left, is refused: detection
// reports it as a near-miss saying the routing does not depend on the
// hidden state, naming the stacked weights, and Rewrite fails, where it
// would otherwise fuse nothing and say nothing.
func TestFixedDenseRoutingRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		mix  models.FixedMixture
		say  string
	}{
		{"constant", models.MixConstant, `their outputs are weighted by "fixed_mixture"`},
		{"softmax of a constant", models.MixSoftmax, "their outputs are weighted by"},
		{"per-token table", models.MixTable, `their outputs are weighted by "fixed_table"`},
		{"on the input", models.MixOnInput, `each expert's input is scaled by "fixed_mixture"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := fixedDenseBlock(t, tc.mix, 3)
			for _, n := range m.Proto.Graph.Node {
				if n.GetOpType() == "TopK" {
					t.Fatal("the fixed mixture still has a TopK")
				}
			}
			d, err := Detect(m)
			if err != nil {
				t.Fatal(err)
			}
			if len(d.Blocks) != 0 || len(d.NearMiss) != 1 {
				t.Fatalf("want one near-miss and no block, got %d blocks, near-misses %v", len(d.Blocks), d.NearMiss)
			}
			r := d.NearMiss[0].Reason
			for _, s := range []string{"routing does not depend on the hidden state: 4 dense experts (stacked weights ", "model.layers.0.mlp.w_", tc.say, "computed from constants alone"} {
				if !strings.Contains(r, s) {
					t.Fatalf("near-miss %q does not contain %q", r, s)
				}
			}
			if _, err := Rewrite(m, Options{Check: true}); err == nil || !strings.Contains(err.Error(), "routing does not depend on the hidden state") {
				t.Fatalf("Rewrite: want the refusal, got %v", err)
			}
		})
	}
}

// softDense builds a one-layer dense model whose experts are all mixed by
// the softmax of its router's logits over every expert (no TopK), in one
// of the forms of variant: "output" (the outputs weighted), "output-scaled"
// (and each expert's output also scaled by a constant [E, 1, 1] first),
// "output-scalar" (and the weighted outputs by a scalar 2.5), "input" (each
// expert's input weighted, outputs summed), "input-scaled" (the weighted
// input also scaled by a constant [E, 1, 1]).
func softDense(t *testing.T, variant string) *graph.Model {
	t.Helper()
	m, err := models.Build(models.Config{Shape: models.ShapeDense, Layers: 1, Experts: 4, TopK: 2, Hidden: 16, Inter: 8, Normalize: true, Tokens: 6, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	gp := m.Proto.Graph
	var weighted, expand *pb.NodeProto
	logits := ""
	for _, n := range gp.Node {
		switch o := n.Output[0]; {
		case strings.HasSuffix(o, "router_logits"):
			logits = o
		case strings.HasSuffix(o, "weighted"):
			weighted = n
		case strings.HasSuffix(o, "x_expand"):
			expand = n
		}
	}
	g := m.Graph()
	node := func(op, out string, in []string, attrs ...*pb.AttributeProto) string {
		gp.Node = append(gp.Node, graph.NewNode(op, "", "node_"+out, in, []string{out}, attrs...))
		return out
	}
	g.AddInitializer(moe.Int64Tensor("axes_last", []int64{1}, []int64{-1}))
	g.AddInitializer(moe.Float32Tensor("per_expert", []int64{4, 1, 1}, []float32{0.5, 1, 1.5, 2}))
	g.AddInitializer(moe.Float32Tensor("scaling", nil, []float32{2.5}))
	sm := node("Softmax", "soft", []string{logits}, graph.IntAttr("axis", -1))
	r := node("Unsqueeze", "soft_col", []string{node("Transpose", "soft_t", []string{sm}, graph.IntsAttr("perm", 1, 0)), "axes_last"})
	switch variant {
	case "output":
		weighted.Input[1] = r
	case "output-scaled":
		weighted.Input[0] = node("Mul", "scaled_out", []string{weighted.Input[0], "per_expert"})
		weighted.Input[1] = r
	case "output-scalar":
		weighted.Input[1] = r
		s := node("Mul", "weighted_scaled", []string{weighted.Output[0], "scaling"})
		g.Reindex()
		for _, n := range g.Consumers(weighted.Output[0]) {
			if n.GetOpType() == "ReduceSum" {
				n.Input[0] = s
			}
		}
	case "input", "input-scaled":
		xs := node("Mul", "x_soft", []string{expand.Output[0], r})
		if variant == "input-scaled" {
			xs = node("Mul", "x_soft_scaled", []string{xs, "per_expert"})
		}
		g.Reindex()
		for _, n := range g.Consumers(expand.Output[0]) {
			if n.GetOpType() == "MatMul" {
				n.Input[0] = xs
			}
		}
		g.ReplaceAllUses(weighted.Output[0], weighted.Input[0])
	}
	g.Reindex()
	g.RemoveDeadCode()
	if err := g.Sort(); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestFixedDenseRoutingNotMisread: dense routing that depends on the hidden
// state is not taken for a fixed mixture: a dense block with its TopK
// router fuses; experts mixed by the softmax of the router's logits over
// all of them (no TopK), with or without a per-expert constant scale or a
// scalar one beside the router's weights, on the outputs or on the
// inputs, are not reported as routing that does not depend on the hidden
// state (nor, having no TopK, refused as anything else): they are named in
// a warning as soft routing left unfused.
func TestFixedDenseRoutingNotMisread(t *testing.T) {
	t.Run("dense with TopK", func(t *testing.T) {
		m, err := models.Build(models.Config{Shape: models.ShapeDense, Layers: 1, Experts: 4, TopK: 2, Hidden: 16, Inter: 8, Normalize: true, Tokens: 6, Seed: 2})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Rewrite(m, Options{Check: true})
		if err != nil || len(rep.Fused) != 1 {
			t.Fatalf("want one block fused, got %v", err)
		}
	})
	for _, v := range []string{"output", "output-scaled", "output-scalar", "input", "input-scaled"} {
		t.Run("soft/"+v, func(t *testing.T) {
			m := softDense(t, v)
			for _, n := range m.Proto.Graph.Node {
				if n.GetOpType() == "TopK" {
					t.Fatal("the soft mixture still has a TopK")
				}
			}
			feeds, err := RandomFeeds(m, 1, 6)
			if err != nil {
				t.Fatal(err)
			}
			if y := runOut(t, m, feeds, false); !allFinite(y) { // the model is whole and runs
				t.Fatal("the soft mixture does not compute finite outputs")
			}
			d, err := Detect(m)
			if err != nil {
				t.Fatal(err)
			}
			if len(d.NearMiss) != 0 {
				t.Fatalf("soft routing reported as a refusal: %v", d.NearMiss)
			}
			// It is named, in a warning: exit 0, nothing fused, not silent.
			if len(d.Warnings) != 1 || !strings.Contains(d.Warnings[0], "soft routing left unfused") || !strings.Contains(d.Warnings[0], "Softmax of a router over all 4 experts") {
				t.Fatalf("soft routing warnings %q, want one naming it", d.Warnings)
			}
			rep, err := Rewrite(m, Options{Check: true})
			if err != nil || len(rep.Fused) != 0 || len(rep.Warnings) != 1 {
				t.Fatalf("rewrite: %v, %d fused, warnings %q", err, len(rep.Fused), rep.Warnings)
			}
		})
	}
}
