package passes

import (
	"sort"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// deadCode removes, block after block, the nodes a fused node made dead,
// without rescanning the model for each block: liveness (reaching a graph
// output) is kept as a count per node of its live consumer edges plus the
// graph outputs it produces, computed once and decremented as nodes die, and
// removals are recorded and applied to the graph once at the end (apply).
// The result is what recomputing liveness and removing the dead nodes after
// each block gives: the same nodes and initializers, attributed to the same
// block.
type deadCode struct {
	g       *graph.Graph
	count   map[*pb.NodeProto]int
	removed map[*pb.NodeProto]bool
	inits   map[string]bool // initializers removed
	last    map[string]bool // initializers removed by the latest removeDeadIn
	uses    map[string]int  // initializer -> consumer edges of nodes not removed
	first   bool
}

func newDeadCode(g *graph.Graph) *deadCode {
	n := len(g.P.Node)
	d := &deadCode{g: g, count: make(map[*pb.NodeProto]int, n), removed: make(map[*pb.NodeProto]bool, n), inits: map[string]bool{}, first: true}
	live := make(map[*pb.NodeProto]bool, n)
	used := make(map[string]bool, 2*n)
	var stack []string
	for _, v := range g.P.Output {
		stack = append(stack, v.GetName())
	}
	for len(stack) > 0 {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if used[v] {
			continue
		}
		used[v] = true
		if p := g.Producer(v); p != nil && !live[p] {
			live[p] = true
			stack = append(stack, graph.NodeInputs(p)...)
		}
	}
	d.uses = make(map[string]int, len(g.P.Initializer))
	for _, n := range g.P.Node {
		for _, in := range graph.NodeInputs(n) {
			if g.Initializer(in) != nil {
				d.uses[in]++
			}
		}
	}
	for _, n := range g.P.Node {
		if live[n] {
			d.count[n] += d.outputRefs(n)
			for _, in := range graph.NodeInputs(n) {
				if p := g.Producer(in); p != nil && in != "" {
					d.count[p]++
				}
			}
		}
	}
	return d
}

// outputRefs counts the graph outputs among n's outputs.
func (d *deadCode) outputRefs(n *pb.NodeProto) int {
	k := 0
	for _, o := range n.Output {
		if o != "" && d.g.IsOutput(o) {
			k++
		}
	}
	return k
}

func (d *deadCode) live(n *pb.NodeProto) bool { return d.count[n] > 0 }

// kill records that n lost its last live reference and releases its inputs.
func (d *deadCode) kill(n *pb.NodeProto) {
	stack := []*pb.NodeProto{n}
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, in := range graph.NodeInputs(x) {
			if p := d.g.Producer(in); p != nil && in != "" {
				d.count[p]--
				if d.count[p] == 0 {
					stack = append(stack, p)
				}
			}
		}
	}
}

// replaced moves value v from old's outputs (old now writes a fresh,
// unread name) to fused, which the index already lists as v's producer.
func (d *deadCode) replaced(old, fused *pb.NodeProto, v string) {
	refs := 0
	if d.g.IsOutput(v) {
		refs++
	}
	for _, c := range d.g.Consumers(v) {
		if c != fused && !d.removed[c] && d.live(c) {
			refs++
		}
	}
	wasLive := d.live(old)
	d.count[fused] = refs
	// The fused node reads initializers too (its new weights, and whatever
	// else it takes, such as a block input that is a constant): they are
	// used as long as it is.
	for _, in := range graph.NodeInputs(fused) {
		if d.g.Initializer(in) != nil {
			d.uses[in]++
		}
	}
	if refs > 0 {
		for _, in := range graph.NodeInputs(fused) {
			if p := d.g.Producer(in); p != nil && in != "" {
				d.count[p]++
			}
		}
	}
	d.count[old] -= refs
	if wasLive && d.count[old] == 0 {
		d.kill(old)
	}
}

// feedsOnly reports whether n has outputs, none a graph output, and every
// consumer still in the graph is in drop.
func (d *deadCode) feedsOnly(n *pb.NodeProto, drop map[*pb.NodeProto]bool) bool {
	if len(n.Output) == 0 {
		return false
	}
	for _, o := range n.Output {
		if d.g.IsOutput(o) {
			return false
		}
		for _, c := range d.g.Consumers(o) {
			if !drop[c] && !d.removed[c] {
				return false
			}
		}
	}
	return true
}

// removeDeadIn deletes nodes of region (plus constant-only feeders) whose
// outputs reach no graph output any more, and initializers nothing reads.
// It returns the names of what it removed, sorted.
func (d *deadCode) removeDeadIn(region map[*pb.NodeProto]bool) (nodes, inits []string) {
	g := d.g
	drop := make(map[*pb.NodeProto]bool, len(region))
	work := make([]*pb.NodeProto, 0, len(region))
	for n := range region {
		if !d.removed[n] && !d.live(n) {
			drop[n] = true
			work = append(work, n)
		}
	}
	if d.first {
		// Dead nodes that nothing reads go with the first block (and so
		// do, through the walk below, the dead nodes that only feed them).
		d.first = false
		for _, n := range g.P.Node {
			if !d.live(n) && !drop[n] && d.feedsOnly(n, drop) {
				drop[n] = true
				work = append(work, n)
			}
		}
	}
	{
		// A node becomes a feeder of dropped nodes only through a consumer
		// dropped now: walk up from the dropped nodes, counting for each
		// producer met the consumer edges not dropped yet.
		rem := make(map[*pb.NodeProto]int, len(region))
		done := make(map[*pb.NodeProto]bool, len(region))
		// order lists n's distinct dead producers in input order, edges
		// how many of n's inputs each feeds (nodes have few inputs: a
		// linear scan beats a map per node).
		var order []*pb.NodeProto
		var edges []int
		edgesOf := func(p *pb.NodeProto) int {
			for i, q := range order {
				if q == p {
					return edges[i]
				}
			}
			return 0
		}
		for len(work) > 0 {
			n := work[len(work)-1]
			work = work[:len(work)-1]
			done[n] = true
			order, edges = order[:0], edges[:0]
			for _, in := range graph.NodeInputs(n) {
				p := g.Producer(in)
				if p == nil || in == "" || d.live(p) || drop[p] || d.removed[p] {
					continue
				}
				found := false
				for i, q := range order {
					if q == p {
						edges[i]++
						found = true
						break
					}
				}
				if !found {
					order = append(order, p)
					edges = append(edges, 1)
				}
			}
			for _, p := range order {
				k, seen := rem[p]
				if !seen {
					if len(p.Output) == 0 || d.outputRefs(p) > 0 {
						rem[p] = -1 // never a feeder
						continue
					}
					k = 0
					for _, o := range p.Output {
						for _, c := range g.Consumers(o) {
							if !d.removed[c] && !done[c] {
								k++
							}
						}
					}
				} else if k < 0 {
					continue
				} else {
					k -= edgesOf(p)
				}
				rem[p] = k
				if k == 0 {
					drop[p] = true
					work = append(work, p)
				}
			}
		}
	}
	d.last = map[string]bool{}
	readByDropped := make(map[string]bool, 2*len(drop))
	for n := range drop {
		nodes = append(nodes, graph.NodeLabel(n))
		for _, in := range graph.NodeInputs(n) {
			readByDropped[in] = true
		}
	}
	for n := range drop {
		d.removed[n] = true
		for _, in := range graph.NodeInputs(n) {
			if _, ok := d.uses[in]; ok {
				d.uses[in]--
			}
		}
	}
	for name := range readByDropped {
		if d.inits[name] || g.Initializer(name) == nil {
			continue
		}
		if d.uses[name] == 0 && !g.IsOutput(name) && !g.IsInput(name) {
			inits = append(inits, name)
			d.inits[name] = true
			d.last[name] = true
		}
	}
	sort.Strings(nodes)
	sort.Strings(inits)
	return nodes, inits
}

// apply removes the recorded nodes and initializers, and the value_info of
// values that no longer exist, and reindexes the graph. As when each block
// was cleaned up on its own, the value_info of initializers the last block
// removed stays.
func (d *deadCode) apply() {
	g := d.g
	kept := g.P.Initializer[:0]
	for _, t := range g.P.Initializer {
		if !d.inits[t.GetName()] {
			kept = append(kept, t)
		}
	}
	for i := len(kept); i < len(g.P.Initializer); i++ {
		g.P.Initializer[i] = nil
	}
	g.P.Initializer = kept
	if len(d.removed) > 0 {
		g.RemoveNodes(d.removed) // reindexes
	} else {
		g.Reindex()
	}
	vi := g.P.ValueInfo[:0]
	for _, v := range g.P.ValueInfo {
		if g.Producer(v.GetName()) != nil || g.IsInput(v.GetName()) || g.Initializer(v.GetName()) != nil || d.last[v.GetName()] {
			vi = append(vi, v)
		}
	}
	g.P.ValueInfo = vi
}
