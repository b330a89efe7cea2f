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

// countingReader is an ExpertReader over a slice that records which
// element ranges were read.
type countingReader struct {
	v     []float32
	reads map[int]int // offset → times read
}

func (c *countingReader) Len() int { return len(c.v) }

func (c *countingReader) ReadAt(dst []float32, off int) error {
	c.reads[off]++
	copy(dst, c.v[off:off+len(dst)])
	return nil
}

// TestForwardStreamedExperts checks that weights given as readers give the
// same output bit for bit as weights held in memory, and that each expert
// a token is routed to is read exactly once and no other expert at all.
func TestForwardStreamedExperts(t *testing.T) {
	const E, k, H, I, T = 8, 2, 8, 4, 3
	r := rand.New(rand.NewPCG(3, 4))
	s := &Spec{NumExperts: E, TopK: k, Hidden: H, Inter: I, RouterActivation: Softmax, RouterOrder: ActivationThenTopK,
		NormalizeTopK: true, RoutedScalingFactor: 1, NGroup: 1, TopKGroup: 1, Activation: SwiGLU, EPSize: 1}
	w := &Weights{RouterW: randVec(r, E*H), Gate: randVec(r, E*I*H), Up: randVec(r, E*I*H), Down: randVec(r, E*H*I)}
	x := randVec(r, T*H)
	want, err := Forward(s, w, x, T)
	if err != nil {
		t.Fatal(err)
	}
	gate := &countingReader{v: w.Gate, reads: map[int]int{}}
	up := &countingReader{v: w.Up, reads: map[int]int{}}
	down := &countingReader{v: w.Down, reads: map[int]int{}}
	ws := &Weights{RouterW: w.RouterW, GateR: gate, UpR: up, DownR: down}
	got, err := Forward(s, ws, x, T)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("streamed output differs at %d: %g != %g", i, got[i], want[i])
		}
	}
	routed := routedExperts(t, s, w, x, T)
	for name, c := range map[string]*countingReader{"gate": gate, "up": up, "down": down} {
		for e := range E {
			n := c.reads[e*I*H]
			if routed[e] && n != 1 {
				t.Errorf("%s of routed expert %d read %d times, want 1", name, e, n)
			}
			if !routed[e] && n != 0 {
				t.Errorf("%s of expert %d read %d times though no token goes to it", name, e, n)
			}
		}
		if len(c.reads) != len(routed) {
			t.Errorf("%s read at offsets %v, want one read per routed expert", name, c.reads)
		}
	}
}

// countingSet is an ExpertSet over whole weights that hands out copies in
// buffers it reuses (as a reader from a model does) and counts the reads of
// each expert.
type countingSet struct {
	w              *Weights
	I, H           int
	gate, up, down []float32
	reads          map[int]int
	trim           int // values left off each down matrix
}

func (c *countingSet) Expert(e int) (gate, up, down []float32, err error) {
	c.reads[e]++
	n := c.I * c.H
	if c.w.Gate != nil {
		c.gate = append(c.gate[:0], c.w.Gate[e*n:(e+1)*n]...)
	}
	c.up = append(c.up[:0], c.w.Up[e*n:(e+1)*n]...)
	c.down = append(c.down[:0], c.w.Down[e*n:(e+1)*n-c.trim]...)
	if c.w.Gate == nil {
		return nil, c.up, c.down, nil
	}
	return c.gate, c.up, c.down, nil
}

// TestForwardExpertSet checks that routed experts given as an ExpertSet give
// the same output bit for bit as weights held in memory, with biases and a
// shared expert held whole, that each expert a token is routed to is asked
// for exactly once and no other expert at all, and that matrices of the
// wrong length are refused.
func TestForwardExpertSet(t *testing.T) {
	const E, k, H, I, Is, T = 8, 2, 8, 4, 3, 3
	r := rand.New(rand.NewPCG(5, 6))
	s := &Spec{NumExperts: E, TopK: k, Hidden: H, Inter: I, SharedInter: Is, RouterActivation: Softmax, RouterOrder: ActivationThenTopK,
		NormalizeTopK: true, RoutedScalingFactor: 1, NGroup: 1, TopKGroup: 1, Activation: SwiGLU, EPSize: 1}
	w := &Weights{RouterW: randVec(r, E*H), Gate: randVec(r, E*I*H), Up: randVec(r, E*I*H), Down: randVec(r, E*H*I),
		GateB: randVec(r, E*I), UpB: randVec(r, E*I), DownB: randVec(r, E*H),
		SharedGate: randVec(r, Is*H), SharedUp: randVec(r, Is*H), SharedDown: randVec(r, H*Is)}
	x := randVec(r, T*H)
	want, err := Forward(s, w, x, T)
	if err != nil {
		t.Fatal(err)
	}
	set := &countingSet{w: w, I: I, H: H, reads: map[int]int{}}
	ws := *w
	ws.Gate, ws.Up, ws.Down, ws.Experts = nil, nil, nil, set
	got, err := Forward(s, &ws, x, T)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("output from the expert set differs at %d: %g != %g", i, got[i], want[i])
		}
	}
	routed := routedExperts(t, s, w, x, T)
	for e := range E {
		if n, want := set.reads[e], map[bool]int{true: 1}[routed[e]]; n != want {
			t.Errorf("expert %d read %d times, want %d (routed %v)", e, n, want, routed[e])
		}
	}
	short := &countingSet{w: w, I: I, H: H, reads: map[int]int{}, trim: 1}
	ws.Experts = short
	if _, err := Forward(s, &ws, x, T); err == nil {
		t.Error("a down matrix one value short was not refused")
	}
}

// routedExperts returns the experts the T tokens of x are routed to (T·k
// picks, at most T·k experts); it fails the test when that is every
// expert, since a test counting reads could not then tell a skipped
// expert from a read one.
func routedExperts(t *testing.T, s *Spec, w *Weights, x []float32, T int) map[int]bool {
	t.Helper()
	routed := map[int]bool{}
	ids, _ := Route(s, w, x, T)
	for _, tok := range ids {
		for _, e := range tok {
			routed[e] = true
		}
	}
	if len(routed) == s.NumExperts {
		t.Fatal("every expert routed to: the test cannot tell a skipped expert from a read one")
	}
	return routed
}
