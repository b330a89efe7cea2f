package passes

import (
	"context"
	"slices"
	"sort"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/composite"
	"github.com/mokopt/mokopt/moe"
)

// TestOwnership rewrites each composite case (internal/composite: two MoE
// blocks on one input, an MoE block beside a dense MLP, router values read
// elsewhere) with the numerical check: the fused blocks have the expected
// expert counts, shared experts and router_logits outputs, the dense
// branches that the fused node cannot compute stay in the graph, no
// router weight is read outside a fused node where the logits are
// exposed, and every output of the rewritten model, run through the fused
// nodes' reference kernel and through their function bodies, matches the
// reference interpreter on the original.
func TestOwnership(t *testing.T) {
	for _, tc := range composite.Cases() {
		t.Run(tc.Name, func(t *testing.T) {
			orig, err := tc.Build()
			if err != nil {
				t.Fatal(err)
			}
			m, err := tc.Build()
			if err != nil {
				t.Fatal(err)
			}
			rep, err := Rewrite(m, Options{Check: true})
			if err != nil {
				t.Fatal(err)
			}
			checkOwnership(t, tc, rep, m)
			feeds, err := RandomFeeds(orig, 3, 16)
			if err != nil {
				t.Fatal(err)
			}
			want, err := eval.Run(context.Background(), orig, feeds, eval.Options{})
			if err != nil {
				t.Fatal(err)
			}
			rtol, atol := tc.Tolerance()
			for _, body := range []bool{false, true} {
				got, err := eval.Run(context.Background(), m, feeds, eval.Options{Kernels: evalKernels(), PreferFunctions: body})
				if err != nil {
					t.Fatal(err)
				}
				for name, w := range want {
					d, err := eval.Compare(got[name], w, rtol, atol)
					if err != nil || !d.OK() {
						t.Errorf("function body %v: output %q differs from the original's: %+v %v", body, name, d, err)
					}
				}
			}
		})
	}
}

// checkOwnership compares what rep fused in m with what tc wants.
func checkOwnership(t *testing.T, tc composite.Case, rep *Report, m *graph.Model) {
	t.Helper()
	var es []int
	shared, logits := 0, 0
	for _, f := range rep.Fused {
		es = append(es, f.Block.Spec.NumExperts)
		if f.Block.Spec.SharedInter > 0 {
			shared++
		}
		if f.Block.Spec.RouterLogits {
			logits++
		}
	}
	sort.Ints(es)
	if !slices.Equal(es, tc.Experts) || shared != tc.Shared || logits != tc.Logits {
		t.Fatalf("fused experts %v, %d shared, %d with router_logits; want %v, %d, %d (near-misses %v)", es, shared, logits, tc.Experts, tc.Shared, tc.Logits, rep.NearMiss)
	}
	ops := map[string]int{}
	reads := map[string]int{}
	for _, n := range m.Proto.Graph.Node {
		ops[n.GetOpType()]++
		if n.GetDomain() == moe.Domain {
			if len(n.Output) > moe.OutRouterLogits && n.GetOverload() == "" {
				t.Errorf("fused node %q has no overload", n.GetName())
			}
			continue
		}
		for _, in := range n.Input {
			reads[in]++
		}
	}
	for _, op := range tc.Left {
		if ops[op] == 0 {
			t.Errorf("no %s left in the rewritten graph: the branch beside the block was taken in", op)
		}
	}
	for _, n := range m.Proto.Graph.Node {
		if n.GetDomain() == moe.Domain && len(n.Output) > moe.OutRouterLogits {
			if r := n.Input[moe.InRouterW]; reads[r] > 0 {
				t.Errorf("router weight %q is still read outside the fused node", r)
			}
		}
	}
}
