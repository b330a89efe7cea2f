package verify

import (
	"context"
	"fmt"
	"strings"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// tiedTokens finds, in a model of fused ai.mok::MoE nodes that computes at
// half precision dt, the tokens whose routing is a near tie in some block
// (moe.RouteGaps below moe.NearTie(dt)) on the run's inputs: where two
// experts score within a few units of dt, an engine (or the original
// graph) that rounds its router in another order may pick the other one,
// and that token's output differs by a whole expert's contribution without
// either being wrong. It returns a mask over the blocks' T tokens, the
// blocks that hold ties, and false when the model has no fused node, the
// blocks see different token counts, or their inputs cannot be read.
func tiedTokens(ctx context.Context, m *graph.Model, feeds map[string]*eval.Tensor, dt pb.TensorProto_DataType, opt Options) ([]bool, []string, bool) {
	tie := moe.NearTie(dt)
	if tie == 0 {
		return nil, nil, false
	}
	g := m.Graph()
	var nodes []*pb.NodeProto
	want := map[string]bool{}
	for _, n := range g.P.GetNode() {
		if n.GetDomain() != moe.Domain || n.GetOpType() != moe.OpType || len(n.Input) <= moe.InRouterW {
			continue
		}
		nodes = append(nodes, n)
		for _, pos := range []int{moe.InHidden, moe.InRouterW, moe.InRouterB, moe.InCorrectionBias} {
			if pos < len(n.Input) && n.Input[pos] != "" {
				want[n.Input[pos]] = true
			}
		}
	}
	if len(nodes) == 0 {
		return nil, nil, false
	}
	eo := opt.Eval
	eo.KeepAll, eo.OnCapture, eo.Replace = false, nil, nil
	eo.Capture = func(n string) bool { return want[n] }
	vals, err := eval.Run(ctx, m, feeds, eo)
	if err != nil {
		return nil, nil, false
	}
	get := func(n string) []float32 {
		if t := vals[n]; t != nil {
			return t.F32
		}
		if t := feeds[n]; t != nil {
			return t.F32
		}
		return nil
	}
	var mask []bool
	var where []string
	for _, n := range nodes {
		s, err := moe.SpecFromNode(n, moe.InitializerDims(g, n))
		if err != nil || s.Hidden <= 0 {
			return nil, nil, false
		}
		var w moe.Weights
		for j, dst := range []*[]float32{&w.RouterW, &w.RouterB, &w.CorrectionBias} {
			if pos := []int{moe.InRouterW, moe.InRouterB, moe.InCorrectionBias}[j]; pos < len(n.Input) && n.Input[pos] != "" {
				*dst = get(n.Input[pos])
			}
		}
		x := get(n.Input[moe.InHidden])
		if x == nil || len(x)%s.Hidden != 0 || len(w.RouterW) != s.NumExperts*s.Hidden {
			return nil, nil, false
		}
		T := len(x) / s.Hidden
		if mask == nil {
			mask = make([]bool, T)
		} else if len(mask) != T {
			return nil, nil, false
		}
		ties := 0
		for t, gap := range moe.RouteGaps(s, &w, x, T) {
			if gap < tie {
				mask[t] = true
				ties++
			}
		}
		if ties > 0 {
			where = append(where, fmt.Sprintf("%s (%d)", graph.NodeLabel(n), ties))
		}
	}
	return mask, where, true
}

// excuseNearTies compares again, leaving out the rows of near-tie tokens
// (tiedTokens), the outputs of a failed half-precision case whose elements
// are rows of the blocks' tokens (their count a multiple of the tokens). A
// case that then passes passes, and each such output says how many
// tokens' rows were left out (NearTieTokens), and the case's message why;
// one that still fails keeps its first comparison. fused is the model of
// fused nodes (a or b) and feeds its inputs.
func excuseNearTies(ctx context.Context, c *Case, fused *graph.Model, feeds map[string]*eval.Tensor, a, b []named, opt Options) {
	if c.Pass || opt.halfCompute == pb.TensorProto_UNDEFINED || opt.QuantBound > 0 || opt.Exact {
		return
	}
	mask, where, ok := tiedTokens(ctx, fused, feeds, opt.halfCompute, opt)
	if !ok || len(where) == 0 {
		return
	}
	n := 0
	for _, m := range mask {
		if m {
			n++
		}
	}
	redo := make([]OutputCheck, len(c.Outputs))
	for k, oc := range c.Outputs {
		redo[k] = oc
		if oc.Pass {
			continue
		}
		i := oc.Index
		at, bt := a[i].t, b[i].t
		if at == nil || bt == nil || at.F32 == nil || bt.F32 == nil || len(at.F32) != len(bt.F32) || len(bt.F32)%len(mask) != 0 {
			return
		}
		row := len(bt.F32) / len(mask)
		f := append([]float32(nil), at.F32...)
		for t, tied := range mask {
			if tied {
				copy(f[t*row:(t+1)*row], bt.F32[t*row:(t+1)*row])
			}
		}
		masked := &eval.Tensor{DType: at.DType, Shape: at.Shape, F32: f}
		again := compareOutput(i, named{a[i].name, masked}, b[i], opt)
		if !again.Pass {
			return
		}
		again.NearTieTokens = n
		redo[k] = again
	}
	c.Outputs, c.Pass = redo, true
	c.Message = fmt.Sprintf("%d of %d tokens left out: their routing is a near tie at %s precision (top-k gap under %.2g of the largest score) in %s, where an engine that rounds the router in another order may pick another expert", n, len(mask), strings.ToLower(opt.halfCompute.String()), moe.NearTie(opt.halfCompute), strings.Join(where, ", "))
}

// fusedOf returns the model of a and b that holds fused nodes (a first)
// with its feeds, or nil.
func fusedOf(a, b *graph.Model, feedA, feedB map[string]*eval.Tensor) (*graph.Model, map[string]*eval.Tensor) {
	for _, mf := range []struct {
		m *graph.Model
		f map[string]*eval.Tensor
	}{{a, feedA}, {b, feedB}} {
		for _, n := range mf.m.Proto.GetGraph().GetNode() {
			if n.GetDomain() == moe.Domain && n.GetOpType() == moe.OpType {
				return mf.m, mf.f
			}
		}
	}
	return nil, nil
}
