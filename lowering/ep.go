package lowering

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/kernel"
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
			return 0, fmt.Errorf("%s: fused nodes %q (ep_size %d) and %q (ep_size %d) disagree; set the EP option (mokopt lower --ep)", m.Name(), from, ep, graph.NodeLabel(n), v)
		}
		ep, from = v, graph.NodeLabel(n)
	}
	return ep, nil
}

// EPSizes are the EP group sizes the MoK kernel runs (kernel rule EP_SIZE).
var EPSizes = []int{1, 4, 8, 16, 32, 64}

// PickEP chooses the EP size for lowering m onto target when the caller
// gives none: the fused nodes' common ep_size when they carry one (the
// layout the model was exported for), else the largest size MoK runs that
// fits the target's NVLink domain and divides every fused node's expert
// count. It returns the size and why it was chosen, or an error naming
// the nodes when no size fits.
func PickEP(m *graph.Model, target kernel.Target) (int, string, error) {
	ep, err := EPFromModel(m)
	if err != nil {
		return 0, "", err
	}
	if ep > 0 {
		return ep, fmt.Sprintf("ep_size %d of the fused nodes", ep), nil
	}
	var experts []int
	var names []string
	for _, n := range m.Proto.Graph.Node {
		if n.GetDomain() == moe.Domain && n.GetOpType() == moe.OpType {
			experts = append(experts, int(graph.AttrInt(n, "num_experts", 0)))
			names = append(names, graph.NodeLabel(n))
		}
	}
	if len(experts) == 0 {
		return 0, "", ErrNoFusedNode
	}
	for i := len(EPSizes) - 1; i >= 0; i-- {
		g := EPSizes[i]
		if target.DomainGPUs > 0 && g > target.DomainGPUs {
			continue
		}
		ok := true
		for _, e := range experts {
			if e <= 0 || e%g != 0 {
				ok = false
			}
		}
		if ok {
			return g, fmt.Sprintf("the largest EP size MoK runs (1, 4, 8, 16, 32, 64) that fits %s's %d-GPU NVLink domain and divides every node's experts %v", target.Name, target.DomainGPUs, experts), nil
		}
	}
	return 0, "", fmt.Errorf("no EP size MoK runs divides the experts %v of %v", experts, names)
}
