package moe

import (
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/mokopt/mokopt/internal/f32"
)

// ExpertReader is a routed experts' stacked weight ([E, rows, cols]) that
// is read one expert's matrix at a time instead of being held whole: a
// weight streamed from a model's side file, say. Forward then holds one
// expert's matrices at a time.
type ExpertReader interface {
	// Len is the number of values of the whole weight.
	Len() int
	// ReadAt fills dst with the values from element offset off on.
	ReadAt(dst []float32, off int) error
}

// ExpertSet hands out the routed experts' matrices one expert at a time,
// in canonical layout: gate and up [I, H] (gate nil for an ungated
// activation), down [H, I]. It stands for Gate, Up and Down (and their
// readers) of Weights where those are nil: a block's weights read from
// the model expert by expert, say. What Expert returns may be overwritten
// by its next call; Forward holds one expert's matrices at a time and asks
// for each routed expert once per run of tokens (ForwardExperts).
type ExpertSet interface {
	Expert(e int) (gate, up, down []float32, err error)
}

// expertMats is one routed expert's matrices and biases (nil where absent).
type expertMats struct{ gate, up, down, gateB, upB, downB []float32 }

// expertSource hands out each routed expert's matrices: slices of the
// weights held in memory, or, for a part given as an ExpertReader, the
// expert's matrix read into a buffer that the next expert reuses.
type expertSource struct {
	w         *Weights
	I, H      int
	gated     bool
	gate, up  []float32 // read buffers
	down      []float32
	bytesRead int64
}

func newExpertSource(s *Spec, w *Weights) *expertSource {
	return &expertSource{w: w, I: s.Inter, H: s.Hidden, gated: w.Gate != nil || w.GateR != nil || w.Experts != nil && s.Gated()}
}

// part returns expert e's n values of one stacked weight: a slice of mem,
// or read from r into *buf.
func (x *expertSource) part(mem []float32, r ExpertReader, buf *[]float32, e, n int) ([]float32, error) {
	if mem != nil {
		return mem[e*n : (e+1)*n], nil
	}
	if r == nil {
		return nil, nil
	}
	if len(*buf) != n {
		*buf = make([]float32, n)
	}
	if err := r.ReadAt(*buf, e*n); err != nil {
		return nil, err
	}
	x.bytesRead += int64(4 * n)
	return *buf, nil
}

// get returns expert e's matrices, valid until the next get.
func (x *expertSource) get(e int) (expertMats, error) {
	w, I, H := x.w, x.I, x.H
	var m expertMats
	var err error
	if w.Experts != nil && w.Gate == nil && w.Up == nil && w.Down == nil {
		if m, err = x.fromSet(e); err != nil {
			return m, err
		}
		x.biases(&m, e)
		return m, nil
	}
	if x.gated {
		if m.gate, err = x.part(w.Gate, w.GateR, &x.gate, e, I*H); err != nil {
			return m, fmt.Errorf("MoE gate of expert %d: %w", e, err)
		}
	}
	if m.up, err = x.part(w.Up, w.UpR, &x.up, e, I*H); err != nil {
		return m, fmt.Errorf("MoE up of expert %d: %w", e, err)
	}
	if m.down, err = x.part(w.Down, w.DownR, &x.down, e, H*I); err != nil {
		return m, fmt.Errorf("MoE down of expert %d: %w", e, err)
	}
	x.biases(&m, e)
	return m, nil
}

// fromSet returns expert e's matrices from w.Experts, checking their
// lengths.
func (x *expertSource) fromSet(e int) (expertMats, error) {
	var m expertMats
	var err error
	if m.gate, m.up, m.down, err = x.w.Experts.Expert(e); err != nil {
		return m, fmt.Errorf("MoE expert %d: %w", e, err)
	}
	I, H := x.I, x.H
	switch {
	case x.gated && len(m.gate) != I*H:
		return m, fmt.Errorf("MoE gate of expert %d has %d values, want %d", e, len(m.gate), I*H)
	case !x.gated && m.gate != nil:
		return m, fmt.Errorf("MoE expert %d has a gate matrix, but its activation is ungated", e)
	case len(m.up) != I*H:
		return m, fmt.Errorf("MoE up of expert %d has %d values, want %d", e, len(m.up), I*H)
	case len(m.down) != H*I:
		return m, fmt.Errorf("MoE down of expert %d has %d values, want %d", e, len(m.down), H*I)
	}
	x.bytesRead += int64(4 * (len(m.gate) + len(m.up) + len(m.down)))
	return m, nil
}

// biases sets m's biases to expert e's (nil where absent).
func (x *expertSource) biases(m *expertMats, e int) {
	w, I, H := x.w, x.I, x.H
	if x.gated && w.GateB != nil {
		m.gateB = w.GateB[e*I : (e+1)*I]
	}
	if w.UpB != nil {
		m.upB = w.UpB[e*I : (e+1)*I]
	}
	if w.DownB != nil {
		m.downB = w.DownB[e*H : (e+1)*H]
	}
}

// expertFFN computes one expert's output for one token into out (length H).
func expertFFN(s *Spec, m expertMats, xt, out []float32, act []float32) {
	H, I := s.Hidden, s.Inter
	g, u := act[I:2*I], act[2*I:3*I]
	clear(g)
	clear(u)
	if m.gate != nil {
		f32.DotRows(m.gate, H, xt, g)
	}
	f32.DotRows(m.up, H, xt, u)
	if m.gate != nil && m.gateB != nil {
		for i := range g {
			g[i] += m.gateB[i]
		}
	}
	if m.upB != nil {
		for i := range u {
			u[i] += m.upB[i]
		}
	}
	if s.Activation == SwiGLU && m.gate != nil {
		// Activate's g * Logistic(g) * u, the logistic eight at a time
		f32.SigmoidSlice(act[:I], g)
		for i := range I {
			act[i] = g[i] * act[i] * u[i]
		}
	} else if a := s.ActivationDef(); a != nil {
		p := s.ActParams()
		for i := range I {
			act[i] = float32(a.Eval(float64(g[i]), float64(u[i]), p))
		}
	} else {
		for i := range I {
			act[i] = float32(math.NaN())
		}
	}
	out = out[:H]
	clear(out)
	f32.DotRows(m.down, I, act[:I], out)
	if m.downB != nil {
		for h := range out {
			out[h] += m.downB[h]
		}
	}
}

// Forward computes the block's output for x, T tokens of H values, by the
// reference semantics: route, run each selected expert, weight and sum, add
// the (optionally sigmoid-gated) shared expert. It is written independently
// of the function body in body.go so the two can check each other.
func Forward(s *Spec, w *Weights, x []float32, T int) ([]float32, error) {
	return ForwardExperts(s, w, x, T, nil)
}

// pairBudget bounds the bytes of per-(token, slot) expert outputs that
// ForwardExperts holds at once; longer inputs are computed in runs of
// tokens that fit, each run reading every expert it uses again.
var pairBudget = 64 << 20

// ForwardExperts is Forward where only the routed experts for which keep
// returns true contribute (routing is unchanged: the others' weights are
// simply dropped, not renormalised away); nil keeps every expert. It
// describes graphs that compute a subset of the experts, such as a trace
// that unrolled its loop over the experts hit at trace time.
//
// The experts run one after another, each on all the tokens routed to it,
// so that weights given as ExpertReaders or an ExpertSet are read one
// expert at a time, each routed expert once per run of tokens (one run
// unless the tokens' expert outputs would take over 64 MiB); the outputs
// of each token's experts are then summed in the token's slot order, so
// the result does not depend on that schedule.
func ForwardExperts(s *Spec, w *Weights, x []float32, T int, keep func(expert int) bool) ([]float32, error) {
	H := s.Hidden
	if len(x) != T*H {
		return nil, fmt.Errorf("MoE input has %d values, want %d tokens x %d", len(x), T, H)
	}
	if err := CheckWeights(s, w); err != nil {
		return nil, err
	}
	if s.Shard() {
		return nil, fmt.Errorf("MoE node is EP rank shard (experts %d..%d of %d): it needs the other ranks' experts (run the rank models together, or merge them)", s.ExpertOffset, s.ExpertOffset+s.LocalExperts-1, s.NumExperts)
	}
	ids, rw := Route(s, w, x, T)
	out := make([]float32, T*H)
	src := newExpertSource(s, w)
	maxPairs := max(1, pairBudget/(4*H))
	for t0 := 0; t0 < T; {
		t1, pairs := t0, 0
		for t1 < T && (t1 == t0 || pairs+len(ids[t1]) <= maxPairs) {
			pairs += len(ids[t1])
			t1++
		}
		if err := forwardRun(s, w, src, x, ids, rw, keep, out, t0, t1, pairs); err != nil {
			return nil, err
		}
		t0 = t1
	}
	return out, nil
}

// forwardRun is ForwardExperts on tokens [t0, t1), which have pairs
// (token, slot) pairs between them, written into out.
func forwardRun(s *Spec, w *Weights, src *expertSource, x []float32, ids [][]int, rw [][]float32, keep func(expert int) bool, out []float32, t0, t1, pairs int) error {
	H, E := s.Hidden, s.StoredExperts()
	type pair struct{ t, slot, at int }
	byExpert := make([][]pair, E)
	at := 0
	for t := t0; t < t1; t++ {
		for i, e := range ids[t] {
			if e < 0 || e >= E {
				return fmt.Errorf("MoE routed token %d to expert %d of %d", t, e, E)
			}
			if keep == nil || keep(e) {
				byExpert[e] = append(byExpert[e], pair{t, i, at})
			}
			at++
		}
	}
	contrib := make([]float32, pairs*H)
	workers := runtime.GOMAXPROCS(0)
	perPair := 3 * H * max(s.Inter, 1)
	bufs := make([][]float32, workers)
	for i := range bufs {
		bufs[i] = make([]float32, max(3*s.Inter, s.SharedInter)+H) // expertFFN's activations, gate and up products; a scaled input
	}
	for e, ps := range byExpert {
		if len(ps) == 0 {
			continue
		}
		m, err := src.get(e)
		if err != nil {
			return err
		}
		parallel(len(ps), len(ps)*perPair, workers, func(wk, lo, hi int) {
			act := bufs[wk][:len(bufs[wk])-H]
			xin := bufs[wk][len(act):]
			for _, p := range ps[lo:hi] {
				xt := x[p.t*H : (p.t+1)*H]
				if s.WeightsOnInput {
					for h := range xin {
						xin[h] = xt[h] * rw[p.t][p.slot]
					}
					xt = xin
				}
				expertFFN(s, m, xt, contrib[p.at*H:(p.at+1)*H], act)
			}
		})
	}
	// Each token's sum, in its slot order, and the shared expert.
	starts := make([]int, t1-t0+1)
	for t := t0; t < t1; t++ {
		starts[t-t0+1] = starts[t-t0] + len(ids[t])
	}
	perToken := 3 * H * max(s.SharedInter, 1)
	parallel(t1-t0, (t1-t0)*perToken, workers, func(wk, lo, hi int) {
		act := bufs[wk]
		acc := make([]float64, H)
		for t := t0 + lo; t < t0+hi; t++ {
			xt := x[t*H : (t+1)*H]
			clear(acc)
			for i, e := range ids[t] {
				if keep != nil && !keep(e) {
					continue
				}
				c := contrib[(starts[t-t0]+i)*H : (starts[t-t0]+i+1)*H]
				if s.WeightsOnInput {
					for h := range c {
						acc[h] += float64(c[h])
					}
				} else {
					for h := range c {
						acc[h] += float64(rw[t][i]) * float64(c[h])
					}
				}
			}
			sharedExpert(s, w, xt, acc, act)
			for h := range acc {
				out[t*H+h] = float32(acc[h])
			}
		}
	})
	return nil
}

// sharedExpert adds the (optionally sigmoid-gated) shared expert's output
// for token xt to acc; act is scratch of at least SharedInter values.
func sharedExpert(s *Spec, w *Weights, xt []float32, acc []float64, act []float32) {
	if s.SharedInter == 0 {
		return
	}
	H, Is := s.Hidden, s.SharedInter
	for i := 0; i < Is; i++ {
		g := Dot(xt, w.SharedGate[i*H:(i+1)*H])
		u := Dot(xt, w.SharedUp[i*H:(i+1)*H])
		act[i] = g * Logistic(g) * u
	}
	gate := float32(1)
	if s.SharedGated {
		gate = Logistic(Dot(xt, w.SharedGateW))
	}
	for h := 0; h < H; h++ {
		acc[h] += float64(gate * Dot(act[:Is], w.SharedDown[h*Is:(h+1)*Is]))
	}
}

// parallel runs f over [0, n) in contiguous parts, one per worker, when
// the work (about one multiply-add per unit) is worth the goroutines;
// f gets its worker number and part.
func parallel(n, work, workers int, f func(wk, lo, hi int)) {
	parts := min(workers, n, max(work/(1<<20), 1))
	if parts <= 1 {
		f(0, 0, n)
		return
	}
	var wg sync.WaitGroup
	for p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(p, n*p/parts, n*(p+1)/parts)
		}()
	}
	wg.Wait()
}
