package moe

import (
	"fmt"
	"math"
	"sort"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/f32"
)

// Weights holds a block's weights in canonical layout, float32, row-major.
// Routed: Gate, Up [E, I, H]; Down [E, H, I]; biases GateB, UpB [E, I],
// DownB [E, H]. Router: RouterW [E, H], RouterB [E], CorrectionBias [E].
// Shared expert: SharedGate, SharedUp [Is, H], SharedDown [H, Is],
// SharedGateW [H] (the sigmoid gate's weight row). Absent parts are nil.
// For an ungated activation (GELU, ReLU, ...) Gate is nil.
type Weights struct {
	RouterW, RouterB, CorrectionBias []float32
	Gate, Up, Down                   []float32
	GateB, UpB, DownB                []float32
	SharedGate, SharedUp, SharedDown []float32
	SharedGateW                      []float32
	// GateR, UpR and DownR stand for Gate, Up and Down where those are
	// nil: the routed experts' weights read one expert at a time
	// (ExpertReader), in the same layout.
	GateR, UpR, DownR ExpertReader
	// Experts stands for Gate, Up and Down (and GateR, UpR, DownR) where
	// all of those are nil: the routed experts' matrices handed out one
	// expert at a time (ExpertSet).
	Experts ExpertSet
}

// Route computes, for each of T tokens, the selected experts and the weights
// applied to their outputs, exactly as the spec says.
func Route(s *Spec, w *Weights, x []float32, T int) (ids [][]int, weights [][]float32) {
	ids, weights, _ = route(s, w, x, T)
	return ids, weights
}

// RouteGaps returns, per token, how decisively the router chose: the gap
// between the k-th chosen expert's selection score and the best unchosen
// one's, relative to the largest selection score in magnitude (0: a tie;
// +Inf when every expert is chosen). Selection scores are what the top-k
// ranks (logits, activated scores, biased or group-masked ones). A graph
// that rounds its router to half precision can flip tokens whose gap is
// below that precision.
func RouteGaps(s *Spec, w *Weights, x []float32, T int) []float64 {
	_, _, gaps := route(s, w, x, T)
	return gaps
}

// NearTie is the relative selection gap (RouteGaps) below which a graph
// that rounds its router to half precision dt may choose other experts
// than the float32 semantics, or than another engine that rounds in
// another order: a few units of the type's precision (0 for other types).
func NearTie(dt pb.TensorProto_DataType) float64 {
	switch dt {
	case pb.TensorProto_FLOAT16:
		return 5e-3 // five float16 units (2^-10)
	case pb.TensorProto_BFLOAT16:
		return 2e-2 // under three bfloat16 units (2^-7)
	}
	return 0
}

// route is Route, with RouteGaps' gaps.
func route(s *Spec, w *Weights, x []float32, T int) (ids [][]int, weights [][]float32, gaps []float64) {
	E, H, k := s.NumExperts, s.Hidden, s.TopK
	ids = make([][]int, T)
	weights = make([][]float32, T)
	gaps = make([]float64, T)
	logits := make([]float32, E)
	for t := 0; t < T; t++ {
		xt := x[t*H : (t+1)*H]
		for e := 0; e < E; e++ {
			logits[e] = Dot(xt, w.RouterW[e*H:(e+1)*H])
			if w.RouterB != nil {
				logits[e] += w.RouterB[e]
			}
		}
		var sel []int
		var wt []float32
		choice := logits // what the top-k ranks
		groupGap := math.Inf(1)
		if s.RouterActivation == SparseMixer {
			sel, wt = sparseMixer(logits, k, s.SparseMixerThreshold)
		} else if s.RouterOrder == TopKThenActivation {
			sel = topk(logits, k)
			vals := make([]float32, k)
			for i, e := range sel {
				vals[i] = logits[e]
			}
			if s.RouterActivation == Softmax {
				softmax(vals)
			} else {
				for i := range vals {
					vals[i] = Logistic(vals[i])
				}
			}
			wt = vals
		} else {
			scores := append([]float32(nil), logits...)
			if s.RouterActivation == Softmax {
				softmax(scores)
			} else {
				for i := range scores {
					scores[i] = Logistic(scores[i])
				}
			}
			choice = append([]float32(nil), scores...)
			if w.CorrectionBias != nil {
				for e := range choice {
					choice[e] += w.CorrectionBias[e]
				}
			}
			if s.NGroup > 1 {
				groupGap = groupLimit(choice, s.NGroup, s.TopKGroup, s.GroupScoreTop())
			}
			sel = topk(choice, k)
			wt = make([]float32, k)
			for i, e := range sel {
				wt[i] = scores[e]
			}
		}
		if s.NormalizeTopK {
			var sum float32
			for _, v := range wt {
				sum += v
			}
			for i := range wt {
				wt[i] /= sum
			}
		}
		if s.RoutedScalingFactor != 1 && s.RoutedScalingFactor != 0 {
			for i := range wt {
				wt[i] *= s.RoutedScalingFactor
			}
		}
		ids[t], weights[t] = sel, wt
		gaps[t] = min(selectionGap(choice, sel), groupGap)
	}
	return ids, weights, gaps
}

// selectionGap is RouteGaps' gap for one token.
func selectionGap(choice []float32, sel []int) float64 {
	chosen := make(map[int]bool, len(sel))
	low, scale := math.Inf(1), 0.0
	for _, e := range sel {
		chosen[e] = true
		low = min(low, float64(choice[e]))
	}
	best := math.Inf(-1)
	for e, v := range choice {
		if !math.IsInf(float64(v), 0) {
			scale = max(scale, math.Abs(float64(v)))
		}
		if !chosen[e] {
			best = max(best, float64(v))
		}
	}
	if math.IsInf(best, -1) {
		return math.Inf(1)
	}
	if scale == 0 {
		return 0
	}
	return (low - best) / scale
}

// sparseMixer is the SparseMixer router on one token's logits: k picks,
// each the best remaining logit, weighted by a softmax over the logits not
// masked by the threshold test against that pick (see SparseMixer).
func sparseMixer(z []float32, k int, thr float32) ([]int, []float32) {
	cur := append([]float32(nil), z...)
	ninf := float32(math.Inf(-1))
	sel := make([]int, k)
	wt := make([]float32, k)
	g := make([]float32, len(z))
	for j := 0; j < k; j++ {
		i := topk(cur, 1)[0]
		m := cur[i]
		for e := range z {
			factor := max(float32(math.Abs(float64(z[e]))), m)
			if (m-z[e])/factor > thr {
				g[e] = ninf
			} else {
				g[e] = cur[e]
			}
		}
		softmax(g)
		sel[j], wt[j] = i, g[i]
		cur[i] = ninf
	}
	return sel, wt
}

// groupLimit keeps the experts of the topkGroup best groups (a group's score
// is the sum of its top best experts: two as DeepSeek-V3 does, one, the
// maximum, as DeepSeek-V2 does) and sets the others to -inf.
//
// It returns the relative gap between the weakest kept group's score and
// the best dropped one's (see RouteGaps).
func groupLimit(choice []float32, nGroup, topkGroup, top int) float64 {
	per := len(choice) / nGroup
	gs := make([]float32, nGroup)
	for g := 0; g < nGroup; g++ {
		grp := choice[g*per : (g+1)*per]
		best := topk(grp, min(top, per))
		for _, i := range best {
			gs[g] += grp[i]
		}
	}
	keep := map[int]bool{}
	kept := topk(gs, topkGroup)
	for _, g := range kept {
		keep[g] = true
	}
	gap := selectionGap(gs, kept)
	for g := 0; g < nGroup; g++ {
		if !keep[g] {
			for i := g * per; i < (g+1)*per; i++ {
				choice[i] = float32(math.Inf(-1))
			}
		}
	}
	return gap
}

// topk returns the indices of the k largest values, largest first, ties
// broken by the lower index (as ONNX TopK does).
func topk(v []float32, k int) []int {
	idx := make([]int, len(v))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return v[idx[a]] > v[idx[b]] })
	return idx[:k]
}

func softmax(v []float32) {
	m := float32(math.Inf(-1))
	for _, x := range v {
		m = max(m, x)
	}
	var s float32
	for i, x := range v {
		v[i] = float32(math.Exp(float64(x - m)))
		s += v[i]
	}
	for i := range v {
		v[i] /= s
	}
}

// Logistic is the sigmoid function 1/(1+e^-x), in float32 within 2 ulps
// of the exact value (f32.Sigmoid).
func Logistic(x float32) float32 { return f32.Sigmoid(x) }

// Dot is the float32 dot product of a and b[:len(a)], summed in one fixed
// order on every machine: 32 interleaved partial sums (elements i mod 32),
// combined pairwise, then the elements past the last multiple of 32 one
// after another (vector instructions where the CPU has AVX).
func Dot(a, b []float32) float32 { return f32.Dot(a, b) }

// Activate applies the expert activation to a gate and an up projection
// (gate is ignored for an ungated activation) and returns the intermediate
// activation: the activation table's reference (see Activations), rounded
// to float32; SwiGLU in float32 as expertFFN's fast path computes it.
func Activate(s *Spec, g, u float32) float32 {
	if s.Activation == SwiGLU {
		return g * Logistic(g) * u
	}
	a := s.ActivationDef()
	if a == nil {
		return float32(math.NaN())
	}
	return float32(a.Eval(float64(g), float64(u), s.ActParams()))
}

// CheckWeights verifies that every weight has the length the spec implies,
// so that Forward never indexes out of range.
func CheckWeights(s *Spec, w *Weights) error {
	E, H, I, Is := s.StoredExperts(), s.Hidden, s.Inter, s.SharedInter
	type req struct {
		name     string
		v        []float32
		n        int
		required bool
	}
	readLen := func(r ExpertReader) int {
		if r == nil {
			return 0
		}
		return r.Len()
	}
	streamed := []struct {
		name string
		v    []float32
		r    ExpertReader
		n    int
	}{{"gate", w.Gate, w.GateR, E * I * H}, {"up", w.Up, w.UpR, E * I * H}, {"down", w.Down, w.DownR, E * H * I}}
	for _, p := range streamed {
		if p.v == nil && p.r != nil && readLen(p.r) != p.n {
			return fmt.Errorf("MoE weight %s has %d values, the spec (E=%d H=%d I=%d) needs %d", p.name, readLen(p.r), E, H, I, p.n)
		}
	}
	set := w.Experts != nil && w.Gate == nil && w.Up == nil && w.Down == nil
	has := func(v []float32, r ExpertReader) bool { return v != nil || r != nil || set }
	reqs := []req{
		{"router_weight", w.RouterW, s.NumExperts * H, true},
		{"router_bias", w.RouterB, s.NumExperts, false},
		{"router_correction_bias", w.CorrectionBias, s.NumExperts, false},
		{"gate", w.Gate, E * I * H, s.Gated() && !has(w.Gate, w.GateR)},
		{"up", w.Up, E * I * H, !has(w.Up, w.UpR)},
		{"down", w.Down, E * H * I, !has(w.Down, w.DownR)},
		{"gate_bias", w.GateB, E * I, false},
		{"up_bias", w.UpB, E * I, false},
		{"down_bias", w.DownB, E * H, false},
		{"shared_gate", w.SharedGate, Is * H, Is > 0},
		{"shared_up", w.SharedUp, Is * H, Is > 0},
		{"shared_down", w.SharedDown, H * Is, Is > 0},
		{"shared_gate_weight", w.SharedGateW, H, false},
	}
	for _, r := range reqs {
		if r.v == nil {
			if r.required {
				return fmt.Errorf("MoE weight %s is missing", r.name)
			}
			continue
		}
		if len(r.v) != r.n {
			return fmt.Errorf("MoE weight %s has %d values, the spec (E=%d H=%d I=%d shared I=%d) needs %d", r.name, len(r.v), E, H, I, Is, r.n)
		}
	}
	return nil
}
