package eval

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// orderKey names a node list: its first node and its length.
type orderKey struct {
	first *pb.NodeProto
	n     int
}

// inputsOf is graph.NodeInputs (a node's inputs and the values its
// subgraphs capture from outside), with each subgraph's captured values
// computed once per run: nested If/Loop bodies then cost linear time, not
// a walk of every deeper level at every level.
func (r *runner) inputsOf(n *pb.NodeProto) []string {
	var caps []string
	for _, a := range n.Attribute {
		if a.G != nil {
			caps = append(caps, r.freeVars(a.G)...)
		}
		for _, g := range a.Graphs {
			caps = append(caps, r.freeVars(g)...)
		}
	}
	if len(caps) == 0 {
		return n.Input
	}
	return append(append([]string(nil), n.Input...), caps...)
}

// freeVars lists the values g uses without defining them (memoized).
func (r *runner) freeVars(g *pb.GraphProto) []string {
	if v, ok := r.free[g]; ok {
		return v
	}
	defined := map[string]bool{}
	for _, v := range g.Input {
		defined[v.GetName()] = true
	}
	for _, t := range g.Initializer {
		defined[t.GetName()] = true
	}
	for _, n := range g.Node {
		for _, o := range n.Output {
			defined[o] = true
		}
	}
	seen := map[string]bool{}
	out := []string{}
	use := func(v string) {
		if v != "" && !defined[v] && !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	for _, n := range g.Node {
		for _, in := range r.inputsOf(n) {
			use(in)
		}
	}
	for _, v := range g.Output {
		use(v.GetName())
	}
	r.free[g] = out
	return out
}

// topoOrder returns nodes in a topological order, the given order where
// it is one, else Kahn's order stable on position; a cycle is an error
// naming a node on it. Orders are remembered per node list, so that a Loop
// body is sorted once, not once per iteration.
func (r *runner) topoOrder(nodes []*pb.NodeProto) ([]*pb.NodeProto, error) {
	if len(nodes) == 0 {
		return nil, nil
	}
	key := orderKey{nodes[0], len(nodes)}
	if o, ok := r.orders[key]; ok {
		return o, nil
	}
	prod := make(map[string]int, len(nodes))
	for i, n := range nodes {
		for _, o := range n.Output {
			if o != "" {
				prod[o] = i
			}
		}
	}
	ins := make([][]string, len(nodes))
	sorted := true
	for i, n := range nodes {
		ins[i] = r.inputsOf(n)
		for _, in := range ins[i] {
			if j, ok := prod[in]; ok && in != "" && j >= i {
				sorted = false
			}
		}
	}
	out := nodes
	if !sorted {
		indeg := make([]int, len(nodes))
		succ := make([][]int, len(nodes))
		seen := make([]int, len(nodes))
		for i := range nodes {
			for _, in := range ins[i] {
				if j, ok := prod[in]; ok && in != "" && seen[j] != i+1 {
					seen[j] = i + 1
					succ[j] = append(succ[j], i)
					indeg[i]++
				}
			}
		}
		h := &graph.MinHeap[int]{}
		for i := range nodes {
			if indeg[i] == 0 {
				h.Push(i)
			}
		}
		out = make([]*pb.NodeProto, 0, len(nodes))
		for h.Len() > 0 {
			i := h.Pop()
			out = append(out, nodes[i])
			for _, j := range succ[i] {
				if indeg[j]--; indeg[j] == 0 {
					h.Push(j)
				}
			}
		}
		if len(out) != len(nodes) {
			for i := range nodes {
				if indeg[i] > 0 {
					return nil, &graph.CycleError{Node: graph.NodeLabel(nodes[i])}
				}
			}
		}
	}
	r.orders[key] = out
	return out, nil
}
