package passes

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/ep"
)

// topKResult is what detection made of one TopK (see speculate).
type topKResult struct {
	b   *Block
	err error
	// candidate: on failure, whether the TopK looked like a router or
	// selected expert compute (a near-miss), not an unrelated TopK.
	candidate bool
}

// speculate detects, on parallel workers, the block of every TopK that the
// sequential pass of detectIn may analyze: plain TopKs and the selections
// of sparsemixer routers (syn, by the ArgMax's position), except auxiliary
// TopKs and those behind EP collectives, which that pass handles itself.
// Analysing a TopK reads the graph only, so its result does not depend on
// which others were analyzed first; the sequential pass then applies the
// results in topological order, skipping TopKs inside a block found
// before, exactly as if it had analyzed them one by one.
func (c *ctx) speculate(cx context.Context, cols map[*pb.NodeProto]ep.Op) (map[int]*pb.NodeProto, map[*pb.NodeProto]*topKResult, error) {
	// Build the lazily made shared state before the workers read it.
	c.declare()
	c.selectors()
	syn := map[int]*pb.NodeProto{}
	var cands []*pb.NodeProto
	for i, n := range c.topo {
		if n.GetOpType() == "ArgMax" {
			if s := c.sparseMixerAt(n); s != nil {
				syn[i], n = s, s
			}
		}
		if n.GetOpType() != "TopK" || n.GetDomain() != "" || c.isAuxTopK(n) {
			continue
		}
		if len(cols) > 0 && len(c.reachCollectives(cols, n.Output...)) > 0 {
			continue
		}
		cands = append(cands, n)
	}
	res := make([]*topKResult, len(cands))
	workers := min(runtime.GOMAXPROCS(0), len(cands), 8)
	var next atomic.Int64
	run := func(w *ctx) error {
		for {
			i := int(next.Add(1) - 1)
			if i >= len(cands) {
				return nil
			}
			if err := cx.Err(); err != nil {
				return err
			}
			res[i] = w.detectTopK(cands[i])
		}
	}
	if workers <= 1 {
		if err := run(c); err != nil {
			return nil, nil, err
		}
	} else {
		errs := make([]error, workers)
		var wg sync.WaitGroup
		for k := range workers {
			w := c.worker()
			wg.Go(func() { errs[k] = run(w) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return nil, nil, cx.Err()
		}
	}
	found := make(map[*pb.NodeProto]*topKResult, len(cands))
	for i, n := range cands {
		found[n] = res[i]
	}
	return syn, found, nil
}

// worker returns a copy of c for another goroutine: the shared, read-only
// indexes and caches, with walk state of its own.
func (c *ctx) worker() *ctx {
	w := *c
	w.mk = &marks{at: make([]uint32, len(c.topo))}
	w.anc, w.ancRoot, w.lim, w.limBuf, w.limSet, w.idxDeps = nil, 0, nil, nil, nil, nil
	w.actMemo = nil
	w.after, w.wmm, w.ancAdded, w.ancStack = memo{}, memo{}, nil, nil
	w.rankMemo = nil
	return &w
}

// detectTopK analyzes the block a TopK selects for.
func (c *ctx) detectTopK(n *pb.NodeProto) *topKResult {
	b, err := c.detectAt(n)
	if err == nil {
		err = c.applySharding(b)
	}
	if err != nil {
		return &topKResult{err: err, candidate: c.routerFed(n) || c.feedsExpertCompute(n) || c.meetsStackedExperts(n)}
	}
	return &topKResult{b: b}
}

// routerFed reports whether a TopK is fed by a linear layer with a constant
// weight, i.e. it looks like a router and a failure is worth reporting.
func (c *ctx) routerFed(n *pb.NodeProto) bool {
	return attempt(func() error { _, err := c.router(n); return err }) == nil
}

// innerSelections returns the positions of the selections (TopKs, or the
// ArgMax of a sparsemixer router) whose speculated block succeeded but
// that lie inside the region of another successful block: they are part
// of that block's compute, not blocks of their own. Deciding this from all
// results at once, rather than skipping what a block found earlier in the
// node list covers, keeps the outcome independent of the node order.
func (c *ctx) innerSelections(syn map[int]*pb.NodeProto, found map[*pb.NodeProto]*topKResult) map[int32]bool {
	type success struct {
		pos int32
		b   *Block
	}
	var ok []success
	for i, n := range c.topo {
		if s := syn[i]; s != nil {
			n = s
		}
		if r := found[n]; r != nil && r.err == nil {
			ok = append(ok, success{int32(i), r.b})
		}
	}
	if len(ok) < 2 {
		return nil
	}
	in := map[int32][]int{} // position -> the successful blocks whose region holds it
	for k, s := range ok {
		for _, p := range c.blockPos(s.b) {
			in[p] = append(in[p], k)
		}
	}
	// A selection inside a larger block is inner; of two blocks that hold
	// each other's selection with regions of one size (two selections of
	// one block), the one listed first stands for both.
	inner := map[int32]bool{}
	for k, s := range ok {
		for _, o := range in[s.pos] {
			if o == k {
				continue
			}
			if no, ns := len(c.blockPos(ok[o].b)), len(c.blockPos(s.b)); no > ns || no == ns && o < k {
				inner[s.pos] = true
			}
		}
	}
	return inner
}
