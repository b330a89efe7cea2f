package passes

import (
	"math"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// sparseInfo describes a sparsemixer router (moe.SparseMixer) found around
// an ArgMax: the picks and the mask threshold.
type sparseInfo struct {
	k   int
	thr float32
}

// sparseMixerAt recognises PhiMoE's sparsemixer router starting at an
// ArgMax over router logits (a linear layer with a constant weight):
//
//	i_j = ArgMax(cur_j)
//	w_j = GatherElements(Softmax(Where(mask_j, -inf, cur_j)), i_j)
//	cur_j+1 = ScatterElements(cur_j, i_j, -inf)
//
// with mask_j = (max(cur_j) - z) / max(|z|, max(cur_j)) > threshold, and
// the picks concatenated into ids [T, k] and weights [T, k]. It returns a
// synthetic TopK node (not in the graph) from the logits to the weights and
// ids, so that the rest of detection treats it as any router's selection;
// nil when the ArgMax does not start one. The mask's exact arithmetic is
// proved by the numerical check like every other part of a block.
func (c *ctx) sparseMixerAt(am *pb.NodeProto) *pb.NodeProto {
	if am.GetOpType() != "ArgMax" || am.GetDomain() != "" || graph.AttrInt(am, "keepdims", 1) != 1 || graph.AttrInt(am, "select_last_index", 0) != 0 {
		return nil
	}
	z := am.Input[0]
	p := c.producerOp(z)
	if p == nil || (p.GetOpType() != "Gemm" && p.GetOpType() != "MatMul") || len(p.Input) < 2 || c.matmulWeight(p.Input[1]) == nil {
		return nil
	}
	info := &sparseInfo{thr: float32(math.NaN())}
	var ids, ws []string
	cur, pick := z, am
	last, _ := c.orderOf(am)
	for pick != nil {
		i := pick.Output[0]
		var w string
		for _, ge := range c.g.Consumers(i) {
			if ge.GetOpType() != "GatherElements" || ge.Input[1] != i {
				continue
			}
			// (a softmax computed in another float type is cast around)
			sm := c.producerOp(ge.Input[0])
			if sm == nil || sm.GetOpType() != "Softmax" {
				continue
			}
			wh := c.producerOp(sm.Input[0])
			if wh == nil || wh.GetOpType() != "Where" || c.through(wh.Input[2]) != c.through(cur) {
				continue
			}
			if f, ok := c.scalarFloat(wh.Input[1]); !ok || !masksOut(f) {
				continue
			}
			thr, ok := c.maskThreshold(c.producerOp(wh.Input[0])) // through a Cast to bool
			if !ok || (!math.IsNaN(float64(info.thr)) && thr != info.thr) {
				continue
			}
			if w != "" {
				return nil // two softmaxed picks: not one sparsemixer (and no first one to prefer)
			}
			info.thr, w = thr, ge.Output[0]
			p, _ := c.orderOf(ge)
			last = max(last, p)
		}
		if w == "" {
			return nil
		}
		ids, ws = append(ids, i), append(ws, w)
		// The next pick works on the logits with this pick set to -inf.
		var next *pb.NodeProto
		for _, sc := range c.g.Consumers(cur) {
			if sc.GetOpType() != "ScatterElements" || sc.Input[0] != cur || sc.Input[1] != i {
				continue
			}
			for _, a := range c.g.Consumers(sc.Output[0]) {
				if a.GetOpType() == "ArgMax" && graph.AttrInt(a, "keepdims", 1) == 1 {
					if next != nil {
						return nil // two next picks: none is preferred by the node order
					}
					next, cur = a, sc.Output[0]
				}
			}
		}
		pick = next
	}
	info.k = len(ids)
	idsV, wsV := ids[0], ws[0]
	if info.k > 1 {
		if idsV = c.concatOf(ids); idsV == "" {
			return nil
		}
		if wsV = c.concatOf(ws); wsV == "" {
			return nil
		}
		pi, _ := c.orderOf(c.g.Producer(idsV))
		pw, _ := c.orderOf(c.g.Producer(wsV))
		last = max(last, pi, pw)
	}
	syn := graph.NewNode("TopK", "", graph.NodeLabel(am)+"/sparsemixer", []string{z, ""}, []string{wsV, idsV})
	syn.Name = proto.String(graph.NodeLabel(am))
	if c.sparse == nil {
		c.sparse = map[*pb.NodeProto]*sparseInfo{}
	}
	c.sparse[syn] = info
	if c.synPos == nil {
		c.synPos = map[*pb.NodeProto]int32{}
	}
	c.synPos[syn] = last
	return syn
}

// maskThreshold returns the constant t of a mask written m > t or t < m.
func (c *ctx) maskThreshold(cmp *pb.NodeProto) (float32, bool) {
	switch {
	case cmp == nil || cmp.GetDomain() != "" || len(cmp.Input) != 2:
		return 0, false
	case cmp.GetOpType() == "Greater":
		return c.scalarFloat(cmp.Input[1])
	case cmp.GetOpType() == "Less":
		return c.scalarFloat(cmp.Input[0])
	}
	return 0, false
}

// concatOf returns the output of a Concat over the last axis whose inputs
// are exactly vals, in order, or "".
func (c *ctx) concatOf(vals []string) string {
	for _, n := range c.g.Consumers(vals[0]) {
		if n.GetOpType() != "Concat" || len(n.Input) != len(vals) {
			continue
		}
		same := true
		for i, v := range vals {
			same = same && n.Input[i] == v
		}
		if same {
			return n.Output[0]
		}
	}
	return ""
}
