package moe

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestSpecEPShard(t *testing.T) {
	base := Spec{NumExperts: 16, TopK: 2, Hidden: 8, Inter: 8, RouterActivation: Softmax, RouterOrder: ActivationThenTopK,
		RoutedScalingFactor: 1, NGroup: 1, TopKGroup: 1, Activation: SwiGLU, SwiGLUAlpha: 1, EPSize: 1}
	for _, tc := range []struct {
		name                 string
		ep, offset, local    int
		shard                bool
		stored               int
		wantErr, wantVariant string
	}{
		{"global", 1, 0, 0, false, 16, "", "softmax_act_topk_swiglu"},
		{"global with ep hint", 4, 0, 0, false, 16, "", "softmax_act_topk_swiglu"},
		{"shard rank 2 of 4", 4, 8, 4, true, 4, "", "softmax_act_topk_swiglu_epshard"},
		{"local equals all", 4, 0, 16, false, 16, "", "softmax_act_topk_swiglu"},
		{"offset not a multiple", 4, 6, 4, true, 4, "an EP shard holds 4 experts from 6", ""},
		{"offset past the end", 4, 16, 4, true, 4, "an EP shard", ""},
		{"wrong local count", 4, 0, 8, true, 8, "want 4", ""},
		{"offset on a global node", 4, 4, 0, false, 16, "expert_offset 4 on a node holding all 16", ""},
		{"ep does not divide", 3, 0, 0, false, 16, "ep_size 3 does not divide", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := base
			s.EPSize, s.ExpertOffset, s.LocalExperts = tc.ep, tc.offset, tc.local
			if s.Shard() != tc.shard || s.StoredExperts() != tc.stored {
				t.Fatalf("Shard %v StoredExperts %d", s.Shard(), s.StoredExperts())
			}
			err := s.Validate()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if v := s.Variant(); v != tc.wantVariant {
				t.Fatalf("variant %s, want %s", v, tc.wantVariant)
			}
		})
	}
}

func TestForwardRefusesShard(t *testing.T) {
	s := Spec{NumExperts: 4, TopK: 1, Hidden: 1, Inter: 1, RouterActivation: Softmax, RouterOrder: ActivationThenTopK,
		RoutedScalingFactor: 1, NGroup: 1, TopKGroup: 1, Activation: SwiGLU, EPSize: 2, ExpertOffset: 2, LocalExperts: 2}
	w := &Weights{RouterW: make([]float32, 4), Gate: make([]float32, 2), Up: make([]float32, 2), Down: make([]float32, 2)}
	if _, err := Forward(&s, w, []float32{1}, 1); err == nil || !strings.Contains(err.Error(), "experts 2..3 of 4") {
		t.Fatalf("Forward on a shard: %v", err)
	}
}

// TestCanonicalRouting: a softmax over the top-k logits and its canonical
// form (softmax over all, top-k, renormalised) route every token to the
// same experts with the same weights; specs without an equal are kept.
func TestCanonicalRouting(t *testing.T) {
	base := Spec{NumExperts: 8, TopK: 3, Hidden: 6, Inter: 4, RouterActivation: Softmax, RouterOrder: TopKThenActivation,
		RoutedScalingFactor: 1, NGroup: 1, TopKGroup: 1, Activation: SwiGLU, SwiGLUAlpha: 1, EPSize: 1}
	r := rand.New(rand.NewPCG(3, 4))
	const T = 40
	x := randVec(r, T*base.Hidden)
	w := &Weights{RouterW: randVec(r, base.NumExperts*base.Hidden), RouterB: randVec(r, base.NumExperts)}
	for _, tc := range []struct {
		name    string
		edit    func(s *Spec)
		changed bool
	}{
		{"softmax over the top-k logits", func(*Spec) {}, true},
		{"scaled", func(s *Spec) { s.RoutedScalingFactor = 2.5 }, true},
		{"with a router bias", func(s *Spec) { s.RouterBias = true }, true},
		{"sigmoid of the top-k logits", func(s *Spec) { s.RouterActivation = Sigmoid }, true},
		{"sigmoid of the top-k logits, renormalised", func(s *Spec) { s.RouterActivation, s.NormalizeTopK = Sigmoid, true }, true},
		{"sparsemixer kept", func(s *Spec) { s.RouterActivation, s.TopK, s.SparseMixerThreshold = SparseMixer, 2, 0.01 }, false},
		{"softmax before the top-k kept", func(s *Spec) { s.RouterOrder = ActivationThenTopK }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := base
			tc.edit(&s)
			c := s.CanonicalRouting()
			if changed := c.Variant() != s.Variant(); changed != tc.changed {
				t.Fatalf("variant %s became %s, want changed %v", s.Variant(), c.Variant(), tc.changed)
			}
			ids, ws := Route(&s, w, x, T)
			cids, cws := Route(&c, w, x, T)
			for i := range ids {
				for j := range ids[i] {
					if ids[i][j] != cids[i][j] || math.Abs(float64(ws[i][j]-cws[i][j])) > 1e-6 {
						t.Fatalf("token %d slot %d: expert %d weight %g, canonical expert %d weight %g", i, j, ids[i][j], ws[i][j], cids[i][j], cws[i][j])
					}
				}
			}
		})
	}
}
