package moe

import (
	"math"
	"math/rand/v2"
	"testing"
)

func randVec(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

// TestForwardExperts checks that restricting the experts splits the output
// linearly: experts kept in two disjoint halves add up to all experts, no
// expert leaves only the shared expert, and nil keeps all.
func TestForwardExperts(t *testing.T) {
	const E, k, H, I, Is, T = 6, 2, 8, 4, 3, 5
	r := rand.New(rand.NewPCG(1, 2))
	for _, shared := range []bool{false, true} {
		s := &Spec{NumExperts: E, TopK: k, Hidden: H, Inter: I, RouterActivation: Softmax, RouterOrder: ActivationThenTopK,
			NormalizeTopK: true, RoutedScalingFactor: 1, NGroup: 1, TopKGroup: 1, Activation: SwiGLU, EPSize: 1}
		w := &Weights{RouterW: randVec(r, E*H), Gate: randVec(r, E*I*H), Up: randVec(r, E*I*H), Down: randVec(r, E*H*I)}
		if shared {
			s.SharedInter = Is
			w.SharedGate, w.SharedUp, w.SharedDown = randVec(r, Is*H), randVec(r, Is*H), randVec(r, H*Is)
		}
		x := randVec(r, T*H)
		all, err := Forward(s, w, x, T)
		if err != nil {
			t.Fatal(err)
		}
		kept, _ := ForwardExperts(s, w, x, T, nil)
		low, _ := ForwardExperts(s, w, x, T, func(e int) bool { return e < E/2 })
		high, _ := ForwardExperts(s, w, x, T, func(e int) bool { return e >= E/2 })
		none, _ := ForwardExperts(s, w, x, T, func(int) bool { return false })
		routedAbs := 0.0
		for i := range all {
			if kept[i] != all[i] {
				t.Fatalf("shared=%v: nil keep differs from Forward at %d", shared, i)
			}
			// all + none = low + high (none is the shared part, counted twice on the right)
			if d := math.Abs(float64(all[i]+none[i]) - float64(low[i]+high[i])); d > 1e-5 {
				t.Fatalf("shared=%v: halves do not add up at %d: %g", shared, i, d)
			}
			if !shared && none[i] != 0 {
				t.Fatalf("no experts kept and no shared expert, yet output %g at %d", none[i], i)
			}
			routedAbs += math.Abs(float64(all[i] - none[i]))
		}
		if routedAbs == 0 {
			t.Fatalf("shared=%v: routed experts contribute nothing", shared)
		}
	}
}
