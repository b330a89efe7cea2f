package passes

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// claim marks the nodes of b's region in claimed (by position).
func (c *ctx) claim(claimed []bool, b *Block) {
	if len(b.regionPos) == len(b.Region) {
		for _, p := range b.regionPos {
			claimed[p] = true
		}
		return
	}
	c.claimNodes(claimed, b.Region)
}

// claimNodes marks nodes in claimed.
func (c *ctx) claimNodes(claimed []bool, nodes []*pb.NodeProto) {
	for _, n := range nodes {
		if p, ok := c.posOf(n); ok {
			claimed[p] = true
		}
	}
}

// blockPos returns the positions of b's region.
func (c *ctx) blockPos(b *Block) []int32 {
	if len(b.regionPos) == len(b.Region) {
		return b.regionPos
	}
	ps := make([]int32, 0, len(b.Region))
	for _, n := range b.Region {
		if p, ok := c.posOf(n); ok {
			ps = append(ps, p)
		}
	}
	return ps
}

// dropOverlaps refuses every pair of blocks whose regions share a node
// that one of them computes after a weight (a node both only read, the
// input's common reshape, is shared: see sharedfront.go): fusing both
// would delete nodes the other's fused node stands for (the
// detector's boundaries keep blocks apart, chained ones included, so this
// only fails closed on a graph they misjudge). Both are refused, so that
// the outcome does not depend on which was found first.
func (c *ctx) dropOverlaps(det *Detection) {
	if len(det.Blocks) < 2 {
		return
	}
	owner := make(map[int32]int, 0)
	bad := make([]int, len(det.Blocks)) // 1 + the index of a block it overlaps
	only := make([]map[int32]bool, len(det.Blocks))
	for i, b := range det.Blocks {
		ps := c.blockPos(b)
		for _, p := range ps {
			j, ok := owner[p]
			if !ok || j == i {
				owner[p] = i
				continue
			}
			if only[i] == nil {
				only[i] = c.inputOnly(ps) // sharedfront.go
			}
			if only[j] == nil {
				only[j] = c.inputOnly(c.blockPos(det.Blocks[j]))
			}
			if !only[i][p] || !only[j][p] {
				bad[i], bad[j] = j+1, i+1
			}
		}
	}
	kept := det.Blocks[:0]
	for i, b := range det.Blocks {
		if bad[i] == 0 {
			kept = append(kept, b)
			continue
		}
		o := det.Blocks[bad[i]-1]
		det.NearMiss = append(det.NearMiss, NearMiss{Node: graph.NodeLabel(b.TopK), Reason: fmt.Sprintf(
			"the block's nodes overlap those of the block selected by %q (output %q): neither is fused", graph.NodeLabel(o.TopK), o.Output)})
	}
	det.Blocks = kept
}

// selectedPos returns the positions of the nodes a TopK's outputs reach
// without walking past a MatMul or Gemm with a constant weight (which are
// included): the expert
// compute it selects, not the blocks after it, so that the cost stays that
// of its own block.
func (c *ctx) selectedPos(tk *pb.NodeProto) []int32 {
	d := c.d
	mk := c.mk
	ep := mk.next()
	var out []int32
	stack := c.valueIDs(tk.Output...)
	for len(stack) > 0 {
		j := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, p := range d.consumers(j) {
			if mk.at[p] == ep {
				continue
			}
			mk.at[p] = ep
			out = append(out, p)
			if c.weightMatMulAt(p) {
				continue
			}
			for _, o := range d.outVal[d.outOff[p]:d.outOff[p+1]] {
				if o >= 0 {
					stack = append(stack, o)
				}
			}
		}
	}
	return out
}
