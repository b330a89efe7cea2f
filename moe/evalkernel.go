package moe

import (
	"fmt"
	"slices"

	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// AddKernels adds the reference kernel of ai.mok::MoE (also EP shards,
// run in a simulated group) to k and returns k. Nothing is registered on
// import: a program evaluating fused nodes through this kernel rather than
// their function bodies passes the set in eval.Options.Kernels.
//
// The routed experts' stacked weights are read one expert at a time where
// the run streams them (eval.Kernels.Streams): a fused node whose weights
// lie in a side file is evaluated holding one expert's matrices, not the
// block's.
func AddKernels(k *eval.Kernels) *eval.Kernels {
	return k.Add(Domain, OpType, evalKernel).Streams(Domain, OpType, InGate, InUp, InDown)
}

// tensorReader is an ExpertReader over an interpreter tensor (a streamed
// weight is read by ranges from its file).
type tensorReader struct{ t *eval.Tensor }

func (r tensorReader) Len() int {
	n := 1
	for _, d := range r.t.Shape {
		n *= d
	}
	return n
}

func (r tensorReader) ReadAt(dst []float32, off int) error { return r.t.ReadFloat32(dst, off) }

// evalKernel runs ai.mok::MoE in the reference interpreter with the
// reference semantics of Forward (not the function body), so that the two
// can check each other (eval.Options.PreferFunctions runs the body).
func evalKernel(c *eval.OpContext, n *pb.NodeProto, in []*eval.Tensor) ([]*eval.Tensor, error) {
	get := func(pos int) *eval.Tensor {
		if pos < len(in) {
			return in[pos]
		}
		return nil
	}
	s, err := SpecFromNode(n, func(pos int) []int64 {
		t := get(pos)
		if t == nil {
			return nil
		}
		d := make([]int64, len(t.Shape))
		for i, v := range t.Shape {
			d[i] = int64(v)
		}
		return d
	})
	if err != nil {
		return nil, err
	}
	f32 := func(pos int) ([]float32, error) {
		t := get(pos)
		if t == nil {
			return nil, nil
		}
		if t.F32 == nil {
			return nil, fmt.Errorf("ai.mok::MoE input %s must be float", InputNames[pos])
		}
		return t.F32, nil
	}
	var w Weights
	targets := []struct {
		pos int
		dst *[]float32
	}{
		{InRouterW, &w.RouterW}, {InRouterB, &w.RouterB}, {InCorrectionBias, &w.CorrectionBias},
		{InGate, &w.Gate}, {InUp, &w.Up}, {InDown, &w.Down},
		{InGateBias, &w.GateB}, {InUpBias, &w.UpB}, {InDownBias, &w.DownB},
		{InSharedGate, &w.SharedGate}, {InSharedUp, &w.SharedUp}, {InSharedDown, &w.SharedDown}, {InSharedGateW, &w.SharedGateW},
	}
	readers := map[int]*ExpertReader{InGate: &w.GateR, InUp: &w.UpR, InDown: &w.DownR}
	for _, tg := range targets {
		if t := get(tg.pos); t.Streamed() {
			*readers[tg.pos] = tensorReader{t}
			continue
		}
		if *tg.dst, err = f32(tg.pos); err != nil {
			return nil, err
		}
	}
	x := get(InHidden)
	if x == nil || x.F32 == nil || len(x.Shape) == 0 || x.Shape[len(x.Shape)-1] != s.Hidden {
		return nil, fmt.Errorf("ai.mok::MoE hidden_states must be float [..., %d]", s.Hidden)
	}
	s.SharedGated = w.SharedGateW != nil
	T := len(x.F32) / s.Hidden
	if s.Shard() {
		if err := loadStreamed(&w); err != nil {
			return nil, err
		}
		if err := gatherShards(c, s, &w); err != nil {
			return nil, err
		}
	}
	y, err := Forward(s, &w, x.F32, T)
	if err != nil {
		return nil, err
	}
	dt := pb.TensorProto_FLOAT
	if x.DType == pb.TensorProto_FLOAT16 || x.DType == pb.TensorProto_BFLOAT16 {
		dt = x.DType // the output has the input's type (half-precision I/O)
	}
	outs := []*eval.Tensor{eval.NewFloatAs(dt, x.Shape, y)}
	if s.RouterLogits { // the optional second output (logits.go)
		z, err := RouterLogits(s, &w, x.F32, T)
		if err != nil {
			return nil, err
		}
		outs = append(outs, eval.NewFloat32([]int{T, s.NumExperts}, z))
	}
	return outs, nil
}

// loadStreamed reads streamed routed weights whole (an EP shard's
// simulated collectives exchange whole weights).
func loadStreamed(w *Weights) error {
	for _, p := range []struct {
		r   *ExpertReader
		dst *[]float32
	}{{&w.GateR, &w.Gate}, {&w.UpR, &w.Up}, {&w.DownR, &w.Down}} {
		if *p.r == nil {
			continue
		}
		v := make([]float32, (*p.r).Len())
		if err := (*p.r).ReadAt(v, 0); err != nil {
			return err
		}
		*p.dst, *p.r = v, nil
	}
	return nil
}

// shardPart is what one EP rank contributes to gatherShards.
type shardPart struct {
	offset int
	w      *Weights
}

// gatherShards simulates the collectives folded into an EP shard node
// (dispatch to the ranks owning the experts, combine back): inside
// a simulated group of ranks (eval.Exchanger; package ep's RunRanks) every rank contributes its local experts, and each rank then
// computes its own tokens with the assembled global weights, which is what
// dispatch, local compute and combine amount to. The router and shared
// expert must be the same on every rank. On return s and w describe the
// whole block.
func gatherShards(c *eval.OpContext, s *Spec, w *Weights) error {
	var ctx = c.Context
	mine := *w // a copy: this rank replaces *w below while others still read it
	_, all, err := eval.Exchange(ctx, "ai.mok::MoE shard", shardPart{s.ExpertOffset, &mine})
	if err != nil {
		return err
	}
	if len(all) != s.EPSize {
		return fmt.Errorf("ai.mok::MoE shard with ep_size %d run in a group of %d ranks", s.EPSize, len(all))
	}
	L, E := s.LocalExperts, s.NumExperts
	parts := make([]*Weights, s.EPSize)
	for r, v := range all {
		p := v.(shardPart)
		if p.offset%L != 0 || p.offset/L >= len(parts) || parts[p.offset/L] != nil {
			return fmt.Errorf("rank %d holds experts from %d: the ranks' expert ranges do not tile 0..%d in steps of %d", r, p.offset, E-1, L)
		}
		if !slices.Equal(p.w.RouterW, w.RouterW) || !slices.Equal(p.w.SharedDown, w.SharedDown) {
			return fmt.Errorf("rank %d has another router or shared expert than this rank (they must be replicated)", r)
		}
		parts[p.offset/L] = p.w
	}
	cat := func(get func(*Weights) []float32) []float32 {
		if get(w) == nil {
			return nil
		}
		var out []float32
		for _, p := range parts {
			out = append(out, get(p)...)
		}
		return out
	}
	g := *w
	g.Gate = cat(func(x *Weights) []float32 { return x.Gate })
	g.Up = cat(func(x *Weights) []float32 { return x.Up })
	g.Down = cat(func(x *Weights) []float32 { return x.Down })
	g.GateB = cat(func(x *Weights) []float32 { return x.GateB })
	g.UpB = cat(func(x *Weights) []float32 { return x.UpB })
	g.DownB = cat(func(x *Weights) []float32 { return x.DownB })
	*w = g
	s.LocalExperts, s.ExpertOffset = 0, 0
	return nil
}
