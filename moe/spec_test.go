package moe

import (
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
