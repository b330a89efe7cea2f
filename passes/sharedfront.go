package passes

import "slices"

// Nodes two blocks only read. Two blocks on one hidden state may share the
// computations of that input that come before any weight: the exporter
// writes the common flatten of the tokens, x.view(-1, H), or a shape read
// for the final reshape, once for both. Such a node is in both regions
// (each depends on the input and leads to each output), but neither fused
// node stands for it: each reads the block input itself, and a node of the
// region is removed only once nothing reads it any more (deadCode), so a
// shared node stays while the other block, fused or not, still reads it,
// and goes with the last. Nodes computed after a weight, on the other hand,
// are the block's own: one that depends on a router (the router linear is a
// weight) or on an expert's or shared expert's output in two regions would
// be deleted under one fused node while the other still stands for it, or
// computed twice; those overlaps are refused (dropOverlaps).

// inputOnly returns the positions of the nodes of region (topological
// positions, sorted or not) computed from the block input by weightless
// ops alone: neither they nor any node of the region they depend on is a
// MatMul/Gemm with a constant weight.
func (c *ctx) inputOnly(region []int32) map[int32]bool {
	ps, in := sortedSet(region)
	d := c.d
	weighted := map[int32]bool{}
	only := map[int32]bool{}
	for _, p := range ps {
		w := c.weightMatMulAt(p)
		for _, q := range d.inPred[d.inOff[p]:d.inOff[p+1]] {
			if q >= 0 && in[q] && weighted[q] {
				w = true
			}
		}
		if w {
			weighted[p] = true
		} else {
			only[p] = true
		}
	}
	return only
}

// sortedSet returns the positions ps sorted (a copy) and as a set.
func sortedSet(ps []int32) ([]int32, map[int32]bool) {
	ps = slices.Clone(ps)
	slices.Sort(ps)
	in := make(map[int32]bool, len(ps))
	for _, p := range ps {
		in[p] = true
	}
	return ps, in
}
