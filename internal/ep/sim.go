package ep

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// ErrNoGroup is returned by Exchange (and so by every collective kernel)
// when the interpreter runs a collective outside RunRanks.
var ErrNoGroup = eval.ErrNoGroup

// group is one simulated EP group: G ranks that meet at every collective.
type group struct {
	size   int
	mu     sync.Mutex
	rounds map[int]*round
	ctx    context.Context
}

type round struct {
	tags    []string
	vals    []any
	arrived int
	done    chan struct{}
}

type member struct {
	g    *group
	rank int
	seq  int // position in this rank's sequence of collective calls
}

// Rank returns the simulated rank and group size of a run's context, or
// ok=false outside RunRanks.
func Rank(ctx context.Context) (rank, size int, ok bool) {
	m, ok := eval.ExchangerOf(ctx).(*member)
	if !ok {
		return 0, 0, false
	}
	return m.rank, m.g.size, true
}

// Exchange is the one primitive every simulated collective uses: the
// calling rank contributes v and receives every rank's contribution, in
// rank order, once all ranks have made the same (tag-equal) call at the same
// position of their collective sequence. A mismatch of tags (the ranks'
// graphs diverge) is an error naming both.
func Exchange(ctx context.Context, tag string, v any) (rank int, all []any, err error) {
	return eval.Exchange(ctx, tag, v)
}

// Exchange is the group's primitive for this rank (eval.Exchanger).
func (m *member) Exchange(tag string, v any) (rank int, all []any, err error) {
	g := m.g
	seq := m.seq
	m.seq++
	g.mu.Lock()
	r := g.rounds[seq]
	if r == nil {
		r = &round{tags: make([]string, g.size), vals: make([]any, g.size), done: make(chan struct{})}
		g.rounds[seq] = r
	}
	r.tags[m.rank], r.vals[m.rank] = tag, v
	r.arrived++
	if r.arrived == g.size {
		close(r.done)
	}
	g.mu.Unlock()
	select {
	case <-r.done:
	case <-g.ctx.Done():
		return m.rank, nil, fmt.Errorf("collective %s (call %d) on rank %d: another rank stopped: %w", tag, seq, m.rank, context.Cause(g.ctx))
	}
	for s, t := range r.tags {
		if t != tag {
			return m.rank, nil, fmt.Errorf("collective call %d: rank %d runs %s but rank %d runs %s: the rank graphs diverge", seq, m.rank, tag, s, t)
		}
	}
	return m.rank, r.vals, nil
}

// RunRanks runs the rank models of one EP group (models[r] is rank r) in
// lockstep in the reference interpreter, each on its own feeds, with the
// collectives of table t (nil: DefaultTable) simulated. It returns each
// rank's outputs. Any rank's failure stops the others and is returned,
// naming the rank.
func RunRanks(ctx context.Context, t *Table, models []*graph.Model, feeds []map[string]*eval.Tensor, opt eval.Options) ([]map[string]*eval.Tensor, error) {
	if t == nil {
		t = DefaultTable()
	}
	if len(models) != len(feeds) {
		return nil, fmt.Errorf("%d rank models but %d feed sets", len(models), len(feeds))
	}
	Install(t)
	gctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	g := &group{size: len(models), rounds: map[int]*round{}, ctx: gctx}
	outs := make([]map[string]*eval.Tensor, len(models))
	errs := make([]error, len(models))
	var wg sync.WaitGroup
	for r := range models {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx := eval.WithExchanger(gctx, &member{g: g, rank: r})
			o, err := eval.Run(rctx, models[r], feeds[r], opt)
			if err != nil {
				errs[r] = fmt.Errorf("rank %d (%s): %w", r, models[r].Name(), err)
				cancel(errs[r])
				return
			}
			outs[r] = o
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			if c := context.Cause(gctx); c != nil {
				return nil, c // the first rank that failed
			}
			return nil, err
		}
	}
	return outs, nil
}

var (
	installMu sync.Mutex
	installed = map[string]Op{}
)

// Install registers the simulated kernels of t's ops with the interpreter
// (idempotent; a later table's entry for the same op replaces an earlier one).
func Install(t *Table) {
	installMu.Lock()
	defer installMu.Unlock()
	if _, ok := installed[ShardedMoEDomain+"::"+ShardedMoEOp]; !ok {
		installed[ShardedMoEDomain+"::"+ShardedMoEOp] = Op{}
		eval.Register(ShardedMoEDomain, ShardedMoEOp, shardedMoE)
	}
	for _, o := range t.Ops {
		key := o.Domain + "::" + o.Name
		if prev, ok := installed[key]; ok && prev == o {
			continue
		}
		installed[key] = o
		eval.Register(o.Domain, o.Name, kernel(o))
	}
}

func kernel(o Op) eval.KernelFunc {
	return func(c *eval.OpContext, n *pb.NodeProto, in []*eval.Tensor) ([]*eval.Tensor, error) {
		out, err := runOp(c, o, n, in)
		if err != nil {
			return nil, fmt.Errorf("%s::%s %q: %w", o.Domain, o.Name, graph.NodeLabel(n), err)
		}
		return out, nil
	}
}

func runOp(c *eval.OpContext, o Op, n *pb.NodeProto, in []*eval.Tensor) ([]*eval.Tensor, error) {
	if len(in) == 0 || in[0] == nil {
		return nil, errors.New("missing input 0")
	}
	_, size, ok := Rank(c.Context)
	if !ok {
		return nil, ErrNoGroup
	}
	if gs := graph.AttrInt(n, o.GroupAttr, int64(size)); int(gs) != size {
		return nil, fmt.Errorf("%s=%d but the simulated group has %d ranks", o.GroupAttr, gs, size)
	}
	tag := o.Kind + ":" + o.Domain + "::" + o.Name
	switch o.Kind {
	case AllToAll:
		return allToAll(c, tag, in[0])
	case AllGather:
		return allGather(c, tag, in[0], int(graph.AttrInt(n, "axis", 0)))
	case AllReduce:
		return allReduce(c, tag, in[0])
	case Dispatch:
		if len(in) < 3 || in[1] == nil || in[2] == nil {
			return nil, errors.New("dispatch needs x, topk_idx and topk_weights")
		}
		return dispatch(c, tag, in[0], in[1], in[2], int(graph.AttrInt(n, o.ExpertsAttr, 0)))
	case Combine:
		return combine(c, tag, in[0])
	}
	return nil, fmt.Errorf("unknown EP op kind %q", o.Kind)
}

func rows(t *eval.Tensor) (n, width int, err error) {
	if len(t.Shape) == 0 || t.Shape[0] == 0 {
		return 0, 0, fmt.Errorf("input of shape %v has no leading axis to split", t.Shape)
	}
	return t.Shape[0], t.Len() / t.Shape[0], nil
}

// sliceRows copies rows [a, b) of t into a new tensor.
func sliceRows(t *eval.Tensor, a, b, width int) *eval.Tensor {
	shape := append([]int{b - a}, t.Shape[1:]...)
	out := eval.New(t.DType, shape)
	switch {
	case t.F32 != nil:
		copy(out.F32, t.F32[a*width:b*width])
	case t.I64 != nil:
		copy(out.I64, t.I64[a*width:b*width])
	case t.F64 != nil:
		copy(out.F64, t.F64[a*width:b*width])
	case t.Bool != nil:
		copy(out.Bool, t.Bool[a*width:b*width])
	}
	return out
}

// concatRows concatenates tensors of equal trailing shape along axis 0.
func concatRows(ts []*eval.Tensor) (*eval.Tensor, error) {
	n := 0
	for i, t := range ts {
		if t.DType != ts[0].DType || len(t.Shape) != len(ts[0].Shape) || len(t.Shape) == 0 {
			return nil, fmt.Errorf("rank %d contributes %s%v, rank 0 %s%v", i, t.DType, t.Shape, ts[0].DType, ts[0].Shape)
		}
		for d := 1; d < len(t.Shape); d++ {
			if t.Shape[d] != ts[0].Shape[d] {
				return nil, fmt.Errorf("rank %d contributes shape %v, rank 0 %v", i, t.Shape, ts[0].Shape)
			}
		}
		n += t.Shape[0]
	}
	out := eval.New(ts[0].DType, append([]int{n}, ts[0].Shape[1:]...))
	off := 0
	for _, t := range ts {
		switch {
		case t.F32 != nil:
			off += copy(out.F32[off:], t.F32)
		case t.I64 != nil:
			off += copy(out.I64[off:], t.I64)
		case t.F64 != nil:
			off += copy(out.F64[off:], t.F64)
		case t.Bool != nil:
			off += copy(out.Bool[off:], t.Bool)
		}
	}
	return out, nil
}

func allToAll(c *eval.OpContext, tag string, x *eval.Tensor) ([]*eval.Tensor, error) {
	rank, all, err := Exchange(c.Context, tag, x)
	if err != nil {
		return nil, err
	}
	G := len(all)
	parts := make([]*eval.Tensor, G)
	for s, v := range all {
		t := v.(*eval.Tensor)
		n, w, err := rows(t)
		if err != nil {
			return nil, err
		}
		if n%G != 0 {
			return nil, fmt.Errorf("rank %d's input has %d rows, not a multiple of the group size %d", s, n, G)
		}
		ch := n / G
		parts[s] = sliceRows(t, rank*ch, (rank+1)*ch, w)
	}
	out, err := concatRows(parts)
	if err != nil {
		return nil, err
	}
	return []*eval.Tensor{out}, nil
}

func allGather(c *eval.OpContext, tag string, x *eval.Tensor, axis int) ([]*eval.Tensor, error) {
	if axis != 0 {
		return nil, fmt.Errorf("all_gather along axis %d is not simulated (only axis 0)", axis)
	}
	_, all, err := Exchange(c.Context, tag, x)
	if err != nil {
		return nil, err
	}
	ts := make([]*eval.Tensor, len(all))
	for i, v := range all {
		ts[i] = v.(*eval.Tensor)
	}
	out, err := concatRows(ts)
	if err != nil {
		return nil, err
	}
	return []*eval.Tensor{out}, nil
}

func allReduce(c *eval.OpContext, tag string, x *eval.Tensor) ([]*eval.Tensor, error) {
	if x.F32 == nil {
		return nil, fmt.Errorf("all_reduce of %s is not simulated (float only)", x.DType)
	}
	_, all, err := Exchange(c.Context, tag, x)
	if err != nil {
		return nil, err
	}
	out := eval.New(x.DType, append([]int(nil), x.Shape...))
	acc := make([]float64, len(out.F32))
	for s, v := range all {
		t := v.(*eval.Tensor)
		if len(t.F32) != len(acc) {
			return nil, fmt.Errorf("rank %d contributes shape %v, this rank %v", s, t.Shape, x.Shape)
		}
		for i, f := range t.F32 {
			acc[i] += float64(f)
		}
	}
	for i, a := range acc {
		out.F32[i] = float32(a)
	}
	return []*eval.Tensor{out}, nil
}

type dispatchIn struct{ x, idx, w *eval.Tensor }

func dispatch(c *eval.OpContext, tag string, x, idx, w *eval.Tensor, E int) ([]*eval.Tensor, error) {
	if x.F32 == nil || len(x.Shape) != 2 || idx.I64 == nil || len(idx.Shape) != 2 || idx.Shape[0] != x.Shape[0] || w.F32 == nil || len(w.F32) != len(idx.I64) {
		return nil, fmt.Errorf("dispatch wants x [T, H] float, topk_idx [T, k] int and topk_weights [T, k] float; got %v, %v, %v", x.Shape, idx.Shape, w.Shape)
	}
	rank, all, err := Exchange(c.Context, tag, dispatchIn{x, idx, w})
	if err != nil {
		return nil, err
	}
	G := len(all)
	if E <= 0 || E%G != 0 {
		return nil, fmt.Errorf("num_experts %d is not a positive multiple of the group size %d", E, G)
	}
	L := E / G
	T, H, k := x.Shape[0], x.Shape[1], idx.Shape[1]
	R := G * T
	rx := eval.New(x.DType, []int{R, H})
	ri := eval.New(idx.DType, []int{R, k})
	rw := eval.New(w.DType, []int{R, k})
	hd := eval.New(pb.TensorProto_INT64, []int{R})
	for s, v := range all {
		d := v.(dispatchIn)
		if d.x.Shape[0] != T || d.idx.Shape[1] != k || d.x.Shape[1] != H {
			return nil, fmt.Errorf("rank %d dispatches x %v, topk_idx %v; rank %d x %v, topk_idx %v (every rank needs the same T, H and k)", s, d.x.Shape, d.idx.Shape, rank, x.Shape, idx.Shape)
		}
		for t := 0; t < T; t++ {
			row := s*T + t
			any := false
			for j := 0; j < k; j++ {
				e := d.idx.I64[t*k+j]
				if e < 0 || int(e) >= E {
					return nil, fmt.Errorf("rank %d token %d routes to expert %d, not in 0..%d", s, t, e, E-1)
				}
				if int(e)/L == rank {
					ri.I64[row*k+j] = e - int64(rank*L)
					rw.F32[row*k+j] = d.w.F32[t*k+j]
					any = true
				} else {
					ri.I64[row*k+j] = -1
				}
			}
			if any {
				copy(rx.F32[row*H:(row+1)*H], d.x.F32[t*H:(t+1)*H])
				hd.I64[row] = int64(t)
			} else {
				hd.I64[row] = -1
			}
		}
	}
	return []*eval.Tensor{rx, ri, rw, hd}, nil
}

func combine(c *eval.OpContext, tag string, y *eval.Tensor) ([]*eval.Tensor, error) {
	if y.F32 == nil {
		return nil, fmt.Errorf("combine of %s is not simulated (float only)", y.DType)
	}
	rank, all, err := Exchange(c.Context, tag, y)
	if err != nil {
		return nil, err
	}
	G := len(all)
	R, w, err := rows(y)
	if err != nil {
		return nil, err
	}
	if R%G != 0 {
		return nil, fmt.Errorf("combine input has %d rows, not a multiple of the group size %d", R, G)
	}
	T := R / G
	out := eval.New(y.DType, append([]int{T}, y.Shape[1:]...))
	acc := make([]float64, T*w)
	for s, v := range all {
		t := v.(*eval.Tensor)
		if len(t.F32) != len(y.F32) {
			return nil, fmt.Errorf("rank %d combines shape %v, rank %d %v", s, t.Shape, rank, y.Shape)
		}
		src := t.F32[rank*T*w : (rank+1)*T*w]
		for i, f := range src {
			acc[i] += float64(f)
		}
	}
	for i, a := range acc {
		out.F32[i] = float32(a)
	}
	return []*eval.Tensor{out}, nil
}
