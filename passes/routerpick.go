package passes

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// Which evaluated value holds the routing weights is decided from the
// dataflow, never from the order of the graph's nodes: every value that
// depends on the TopK and could hold weights (one per token and choice,
// or a [.., E] routing matrix) is compared with every candidate. A value
// that matches is the weights unless a value computed from it by
// arithmetic (not by moving values: a reshape, a transpose, a gather, a
// scatter) matches nothing: the graph then computes on the weights beyond
// what the contract expresses. Of the values accepted, the ones nothing
// accepted is derived from are the weights that reach the experts; they
// must agree.

// weightPick is the matched candidate and its fitted scale.
type weightPick struct {
	cand  int
	scale float32
	value string
}

// movesData lists ops that move or select values without computing on
// them.
var movesData = map[string]bool{"Reshape": true, "Squeeze": true, "Unsqueeze": true, "Flatten": true, "Identity": true,
	"Transpose": true, "Gather": true, "GatherElements": true, "GatherND": true, "ScatterElements": true, "ScatterND": true,
	"Expand": true, "Concat": true, "Slice": true, "Split": true, "Tile": true, "Cast": true}

// pickWeights returns the candidate the routing weights match (nil when
// none does, for run.explain), or a refusal naming what the graph computes
// instead.
func (c *ctx) pickWeights(run *routingRun, cands []routerCand, ref func(int) *refRouting) (*weightPick, error) {
	var fitting []string
	for _, v := range run.order {
		// A value nothing reads (a TopK's unused values) reaches no expert.
		if run.dep[v] && run.fits(run.vals[v]) && c.floatUse(v, 8) {
			fitting = append(fitting, v)
		}
	}
	match := map[string]*weightPick{}
	for _, v := range fitting {
		for i := range cands {
			if scale, ok := run.matches(ref(i), run.vals[v]); ok {
				match[v] = &weightPick{cand: i, scale: scale, value: v}
				break
			}
		}
	}
	desc := run.descendants(fitting)
	computed := func(v string) bool {
		p := c.g.Producer(v)
		return p == nil || !movesData[p.GetOpType()]
	}
	var finals []*weightPick
	var beyond string // a computed value past matched weights that matches nothing
	for _, v := range fitting {
		if match[v] == nil {
			continue
		}
		accepted, last := true, true
		for _, w := range desc[v] {
			if match[w] == nil && computed(w) {
				accepted = false
				beyond = w
			}
			if match[w] != nil {
				last = false
			}
		}
		if accepted && last {
			finals = append(finals, match[v])
		}
	}
	for _, f := range finals[min(1, len(finals)):] {
		if f.cand != finals[0].cand || f.scale != finals[0].scale {
			return nil, rejectf("the routing weights reach the experts in two forms (%q and %q) that differ", c.graphLabel(finals[0].value), c.graphLabel(f.value))
		}
	}
	if len(finals) > 0 {
		return finals[0], nil
	}
	if beyond == "" && len(fitting) > 0 {
		beyond = fitting[len(fitting)-1]
	}
	if beyond != "" {
		if n, ok := run.nullExperts(cands, ref, run.vals[beyond]); ok {
			return nil, rejectf("router outputs %d..%d are null experts: the TopK may select them but their routing weights are zeroed, so they contribute nothing, which ai.mok::MoE cannot express", n, run.E-1)
		}
	}
	return nil, nil
}

// floatUse reports whether some consumer of v (followed through ops that
// only move values, depth steps at most) reads it as a float: a value read
// only as integers (a selection one-hot cast for counting) or only for its
// shape weights nothing.
func (c *ctx) floatUse(v string, depth int) bool {
	for _, n := range c.g.Consumers(v) {
		switch op := n.GetOpType(); {
		case op == "Shape" || op == "Size":
		case op == "Cast":
			if isFloatType(pb.TensorProto_DataType(graph.AttrInt(n, "to", 0))) && (depth == 0 || c.floatUse(n.Output[0], depth-1)) {
				return true
			}
		case movesData[op] && depth > 0 && len(n.Output) > 0:
			for _, o := range n.Output {
				if c.floatUse(o, depth-1) {
					return true
				}
			}
		default:
			return true
		}
	}
	return false
}

// descendants maps each of the values vals to those of vals computed from
// it within the evaluated closure.
func (run *routingRun) descendants(vals []string) map[string][]string {
	cons := map[string][]*pb.NodeProto{}
	for _, n := range run.nodes {
		for _, in := range graph.NodeInputs(n) {
			cons[in] = append(cons[in], n)
		}
	}
	isVal := map[string]bool{}
	for _, v := range vals {
		isVal[v] = true
	}
	out := map[string][]string{}
	for _, v := range vals {
		seen := map[string]bool{v: true}
		stack := []string{v}
		for len(stack) > 0 {
			x := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for _, n := range cons[x] {
				for _, o := range n.Output {
					if o != "" && !seen[o] {
						seen[o] = true
						stack = append(stack, o)
						if isVal[o] {
							out[v] = append(out[v], o)
						}
					}
				}
			}
		}
	}
	return out
}
