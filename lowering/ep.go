package lowering

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/moe"
)

// CodeEPShard: the fused node is one EP rank's shard (it holds E/EP of the
// experts); the lowering takes the merged global model.
const CodeEPShard = "EP_SHARD"

// shardViolation refuses a shard node with the way out.
func shardViolation(s *moe.Spec) []Violation {
	if !s.Shard() {
		return nil
	}
	return []Violation{newViolation(CodeEPShard, "the fused node holds experts %d..%d of %d (one rank of an EP group of %d); merge the ranks first (mokopt rewrite --merge-ranks) and lower the global model",
		s.ExpertOffset, s.ExpertOffset+s.LocalExperts-1, s.NumExperts, s.EPSize)}
}

// EPFromModel returns the EP size the model's fused nodes were exported
// for: their common ep_size when some node has ep_size > 1, else 0 (the
// caller must choose). Nodes that disagree are an error naming them.
func EPFromModel(m *graph.Model) (int, error) {
	g := m.Graph()
	ep, from := 0, ""
	for _, n := range g.P.Node {
		if n.GetDomain() != moe.Domain || n.GetOpType() != moe.OpType {
			continue
		}
		v := int(graph.AttrInt(n, "ep_size", 1))
		if v <= 1 {
			continue
		}
		if ep != 0 && v != ep {
			return 0, fmt.Errorf("%s: fused nodes %q (ep_size %d) and %q (ep_size %d) disagree; pass --ep", m.Name(), from, ep, graph.NodeLabel(n), v)
		}
		ep, from = v, graph.NodeLabel(n)
	}
	return ep, nil
}
