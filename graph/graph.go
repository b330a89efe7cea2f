package graph

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"math/bits"
	"slices"
	"sort"
	"strconv"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// Graph is a mutable index over a GraphProto: it maps each value name to the
// node producing it and the nodes consuming it, and initializer names to
// tensors. Nodes and tensors are the protobuf messages themselves, edited in
// place. Edits made through Graph's methods keep the index current; after
// editing the GraphProto directly, call Reindex.
type Graph struct {
	// P is the underlying graph message.
	P *pb.GraphProto

	// ids numbers every value name the graph knows (produced, read, or an
	// initializer); prod, cons and init are indexed by that number, so
	// that one map lookup answers Producer, Consumers and Initializer.
	ids     map[string]int32
	prod    []*pb.NodeProto
	cons    [][]*pb.NodeProto
	init    []*pb.TensorProto
	inputs  map[string]bool
	outputs map[string]bool
	// added lists the nodes AddNode added since the last Reindex.
	added []*pb.NodeProto
	// nameHashes, built on first use (see named), holds the hashes of the
	// names of the nodes indexed at the last Reindex (and indexedNames,
	// built when a name asked is among them, the names), nodeNames the
	// names of the nodes AddNode added since and reserved those UniqueName
	// handed out; with the values, initializers and inputs they are the
	// set of names in use.
	nameHashes   *hashSet
	indexedNames map[string]bool
	nodeNames    map[string]bool
	reserved     map[string]bool
	dupOut       []string
	// topo caches TopoSort's order until the index changes.
	topo []*pb.NodeProto
	// nodes is the node list as of the last Reindex; node i's NodeInputs
	// are the values edges[edgeOff[i]:edgeOff[i+1]] (see InputIDs), its
	// outputs outs[outOff[i]:outOff[i+1]] (see OutputIDs), and pos[j] is
	// the position in that list of value j's producer (or of the node
	// AddNode appended). rewired: ReplaceAllUses ran since, so that edges
	// are stale (outs are then not trusted either).
	nodes   []*pb.NodeProto
	edges   []int32
	edgeOff []int32
	outs    []int32
	outOff  []int32
	pos     []int32
	rewired bool
	// dupInit: two initializers share a name; sub: a node has a subgraph
	// (both as of the last Reindex).
	dupInit, sub bool
	// ordered: at the last Reindex every node came after the producers of
	// its inputs (then the file order is the topological order).
	ordered bool
}

// NewGraph indexes gp.
func NewGraph(gp *pb.GraphProto) *Graph {
	g := &Graph{P: gp}
	g.Reindex()
	return g
}

// id returns v's number, assigning the next one if v is new.
func (g *Graph) id(v string) int32 {
	if i, ok := g.ids[v]; ok {
		return i
	}
	i := int32(len(g.prod))
	g.ids[v] = i
	g.prod = append(g.prod, nil)
	g.cons = append(g.cons, nil)
	g.init = append(g.init, nil)
	g.pos = append(g.pos, -1)
	return i
}

// Reindex rebuilds every index from the GraphProto.
func (g *Graph) Reindex() {
	n := len(g.P.Node)
	edges, outs := 0, 0
	for _, nd := range g.P.Node {
		edges += len(nd.Input)
		outs += len(nd.Output)
	}
	vals := outs + len(g.P.Initializer) + len(g.P.Input)
	g.ids = make(map[string]int32, vals)
	room := vals + vals/64 + 64 // for values edits add, without copying
	g.prod = make([]*pb.NodeProto, 0, room)
	g.cons = make([][]*pb.NodeProto, 0, room)
	g.init = make([]*pb.TensorProto, 0, room)
	g.pos = make([]int32, 0, room)
	g.inputs = make(map[string]bool, len(g.P.Input))
	g.outputs = make(map[string]bool, len(g.P.Output))
	g.added = nil
	g.nameHashes, g.indexedNames = nil, nil
	g.nodeNames = map[string]bool{}
	g.reserved = map[string]bool{}
	g.dupOut = nil
	g.topo = nil
	g.nodes = append(g.nodes[:0:0], g.P.Node...)
	g.rewired, g.dupInit, g.sub = false, false, false
	for _, t := range g.P.Initializer {
		j := g.id(t.GetName())
		g.dupInit = g.dupInit || g.init[j] != nil
		g.init[j] = t
	}
	for _, v := range g.P.Input {
		g.inputs[v.GetName()] = true
	}
	for _, v := range g.P.Output {
		g.outputs[v.GetName()] = true
	}
	// Number the values read and produced, node by node, and count each
	// value's consumers, so that every consumer list can be a window of
	// one backing array (capped, so that appending to one copies it).
	empty := g.ValueID("") // an initializer may be named ""
	g.edges = make([]int32, 0, edges)
	g.edgeOff = make([]int32, n+1)
	outIDs := make([]int32, 0, outs)
	g.outOff = make([]int32, n+1)
	var caps [][]string
	count := make([]int32, len(g.prod), vals)
	reads := 0
	rc := &recent{}
	for i, nd := range g.P.Node {
		ins, sub := nodeInputs(nd)
		g.sub = g.sub || sub
		if len(ins) != len(nd.Input) {
			if caps == nil {
				caps = make([][]string, n)
			}
			caps[i] = ins
		}
		for _, in := range ins {
			if in == "" {
				g.edges = append(g.edges, empty)
				continue
			}
			j := rc.id(g, in)
			g.edges = append(g.edges, j)
			for int(j) >= len(count) {
				count = append(count, 0)
			}
			count[j]++
			reads++
		}
		g.edgeOff[i+1] = int32(len(g.edges))
		for _, out := range nd.Output {
			j := int32(-1)
			if out != "" {
				j = rc.put(g, out)
			}
			outIDs = append(outIDs, j)
		}
		g.outOff[i+1] = int32(len(outIDs))
	}
	g.outs = outIDs
	buf := make([]*pb.NodeProto, reads)
	off := 0
	for j, k := range count {
		if k > 0 {
			g.cons[j] = buf[off : off : off+int(k)]
			off += int(k)
		}
	}
	// Done with the counts: count[j] < 0 now marks value j as read before
	// (or without) being produced.
	o := 0
	for i, nd := range g.P.Node {
		ins := nd.Input
		if caps != nil && caps[i] != nil {
			ins = caps[i]
		}
		e := g.edgeOff[i]
		for k, in := range ins {
			if in != "" {
				j := g.edges[e+int32(k)]
				g.cons[j] = append(g.cons[j], nd)
				if g.prod[j] == nil {
					count[j] = -1
				}
			}
		}
		g.indexNode(nd, i, outIDs[o:o+len(nd.Output)])
		o += len(nd.Output)
	}
	g.ordered = len(g.dupOut) == 0
	for j, k := range count {
		if k < 0 && g.prod[j] != nil {
			g.ordered = false
			break
		}
	}
}

func (g *Graph) index(nd *pb.NodeProto) {
	g.topo, g.ordered = nil, false
	for _, in := range NodeInputs(nd) {
		if in != "" {
			j := g.id(in)
			g.cons[j] = append(g.cons[j], nd)
		}
	}
	if nd.GetName() != "" {
		g.nodeNames[nd.GetName()] = true
	}
	g.added = append(g.added, nd)
	g.indexNode(nd, len(g.P.Node)-1, nil)
}

// recent remembers the numbers of the values last looked up, by hash, so
// that numbering a graph's values node by node, where most inputs are
// values produced shortly before, seldom reaches the large map.
type recent struct{ slot [1 << 12]recentSlot }

// recentSlot holds a name and its number + 1 (0: an empty slot).
type recentSlot struct {
	name string
	id   int32
}

// recentSeed seeds the hashes recent places names by.
var recentSeed = maphash.MakeSeed()

// id is g.id(v), through the slots.
func (r *recent) id(g *Graph, v string) int32 {
	e := r.at(v)
	if e.id > 0 && e.name == v {
		return e.id - 1
	}
	j := g.id(v)
	e.name, e.id = v, j+1
	return j
}

// put is g.id(v) for a value just produced, which the slots seldom hold:
// it is remembered without looking there first.
func (r *recent) put(g *Graph, v string) int32 {
	j := g.id(v)
	e := r.at(v)
	e.name, e.id = v, j+1
	return j
}

// at returns v's slot.
func (r *recent) at(v string) *recentSlot {
	return &r.slot[maphash.String(recentSeed, v)&(uint64(len(r.slot))-1)]
}

// indexNode indexes nd's outputs (not its inputs nor its name); pos is its
// position in g.P.Node, and outIDs, when not nil, holds the numbers of its
// outputs (-1 for an empty name).
func (g *Graph) indexNode(nd *pb.NodeProto, pos int, outIDs []int32) {
	for k, out := range nd.Output {
		if out == "" {
			continue
		}
		var j int32
		if outIDs != nil {
			j = outIDs[k]
		} else {
			j = g.id(out)
		}
		if g.prod[j] != nil {
			g.dupOut = append(g.dupOut, out)
		}
		g.prod[j] = nd
		g.pos[j] = int32(pos)
	}
}

// NodeInputs returns n's inputs followed by the outer-scope values its
// subgraph attributes (If/Loop/Scan bodies) refer to, so that def-use and
// dead-code removal see implicit captures.
func NodeInputs(n *pb.NodeProto) []string {
	ins, _ := nodeInputs(n)
	return ins
}

// nodeInputs is NodeInputs, also reporting whether n has subgraphs.
func nodeInputs(n *pb.NodeProto) (ins []string, sub bool) {
	var caps []string
	for _, a := range n.Attribute {
		if a.G != nil {
			sub = true
			caps = append(caps, freeVars(a.G)...)
		}
		for _, sg := range a.Graphs {
			sub = true
			caps = append(caps, freeVars(sg)...)
		}
	}
	if len(caps) == 0 {
		return n.Input, sub
	}
	return append(append([]string(nil), n.Input...), caps...), sub
}

// FreeVars lists the values subgraph g uses without defining them (its
// own and its nested subgraphs' reads of enclosing scopes), in order of
// first use.
func FreeVars(g *pb.GraphProto) []string { return freeVars(g) }

// freeVars lists the values a subgraph uses without defining them.
func freeVars(g *pb.GraphProto) []string {
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
	var out []string
	use := func(v string) {
		if v != "" && !defined[v] && !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	for _, n := range g.Node {
		for _, in := range NodeInputs(n) {
			use(in)
		}
	}
	for _, v := range g.Output {
		use(v.GetName())
	}
	return out
}

// ProducerOf is Producer for value number id (see ValueID).
func (g *Graph) ProducerOf(id int32) *pb.NodeProto { return g.prod[id] }

// InitializerOf is Initializer for value number id (see ValueID).
func (g *Graph) InitializerOf(id int32) *pb.TensorProto { return g.init[id] }

// ConsumersOf is Consumers for value number id (see ValueID).
func (g *Graph) ConsumersOf(id int32) []*pb.NodeProto { return g.cons[id] }

// ProducerPos returns the position in g.P.Node of the node producing value
// number id, as of the last Reindex or of the AddNode call that added it,
// or -1 when no node produces it. Sorting or editing the node list since
// can make it stale: check the node found there against ProducerOf.
func (g *Graph) ProducerPos(id int32) int32 { return g.pos[id] }

// InputIDs returns the ValueID of each of n's NodeInputs, in order (-1 for
// a name the index does not know, such as an empty one). pos is n's
// position in g.P.Node, or -1: when n was at that position at the last
// Reindex and no edit through the index rewired inputs since, the numbers
// Reindex recorded are returned (without looking the names up). The result
// must not be modified.
func (g *Graph) InputIDs(n *pb.NodeProto, pos int) []int32 {
	if !g.rewired && pos >= 0 && pos < len(g.nodes) && g.nodes[pos] == n {
		return g.edges[g.edgeOff[pos]:g.edgeOff[pos+1]:g.edgeOff[pos+1]]
	}
	return g.lookUp(NodeInputs(n))
}

// OutputIDs is InputIDs for n's outputs: the ValueID of each (-1 for an
// empty name or one the index does not know).
func (g *Graph) OutputIDs(n *pb.NodeProto, pos int) []int32 {
	if !g.rewired && pos >= 0 && pos < len(g.nodes) && g.nodes[pos] == n {
		return g.outs[g.outOff[pos]:g.outOff[pos+1]:g.outOff[pos+1]]
	}
	ids := g.lookUp(n.Output)
	for k, out := range n.Output {
		if out == "" {
			ids[k] = -1
		}
	}
	return ids
}

// lookUp returns the ValueID of each name.
func (g *Graph) lookUp(names []string) []int32 {
	ids := make([]int32, len(names))
	for k, v := range names {
		ids[k] = g.ValueID(v)
	}
	return ids
}

// Producer returns the node that outputs v, or nil (graph input, initializer, or unknown).
func (g *Graph) Producer(v string) *pb.NodeProto {
	if j, ok := g.ids[v]; ok {
		return g.prod[j]
	}
	return nil
}

// Consumers returns the nodes that read v (including subgraph captures).
func (g *Graph) Consumers(v string) []*pb.NodeProto {
	if j, ok := g.ids[v]; ok {
		return g.cons[j]
	}
	return nil
}

// Initializer returns the initializer named v, or nil.
func (g *Graph) Initializer(v string) *pb.TensorProto {
	if j, ok := g.ids[v]; ok {
		return g.init[j]
	}
	return nil
}

// ValueID returns the number the index gave value v, or -1 when v is not
// in the graph. Numbers are dense (0 to NumValues()-1) and stay valid until
// the index changes; with them callers can keep per-value state in slices.
// The index numbers every value name that a node reads or produces and
// every initializer; edits through the index keep the numbers, numbering
// the names they introduce after the others, and Reindex renumbers.
func (g *Graph) ValueID(v string) int32 {
	if j, ok := g.ids[v]; ok {
		return j
	}
	return -1
}

// NumValues returns how many values the index has numbered (see ValueID).
func (g *Graph) NumValues() int { return len(g.prod) }

// IsInput reports whether v is a graph input.
func (g *Graph) IsInput(v string) bool { return g.inputs[v] }

// IsOutput reports whether v is a graph output.
func (g *Graph) IsOutput(v string) bool { return g.outputs[v] }

// NodesByOp returns the nodes with the given op type, in graph order.
// The index keeps no list per op: each call scans the nodes indexed.
func (g *Graph) NodesByOp(op string) []*pb.NodeProto {
	var out []*pb.NodeProto
	for _, nodes := range [][]*pb.NodeProto{g.nodes, g.added} {
		for _, n := range nodes {
			if n.GetOpType() == op {
				out = append(out, n)
			}
		}
	}
	return out
}

// UniqueName returns a name starting with prefix that no value, node or
// initializer in the graph uses yet, and reserves it.
func (g *Graph) UniqueName(prefix string) string {
	name := prefix
	for i := 1; g.used(name); i++ {
		name = prefix + "_" + strconv.Itoa(i)
	}
	g.reserved[name] = true
	return name
}

// Reserve marks name as used, so that UniqueName never hands it out (a
// name that lives in a subgraph, say, which the index does not hold).
func (g *Graph) Reserve(name string) { g.reserved[name] = true }

// used reports whether name is a value, node or initializer name of the
// graph, or was reserved by UniqueName or Reserve.
func (g *Graph) used(name string) bool {
	if j, ok := g.ids[name]; ok && (g.prod[j] != nil || g.init[j] != nil) {
		return true
	}
	return g.inputs[name] || g.reserved[name] || g.named(name)
}

// nameSeed seeds the hashes of node names (see named).
var nameSeed = maphash.MakeSeed()

// named reports whether a node indexed at the last Reindex, or added by
// AddNode since, is named name. The hashes of the names of the nodes
// indexed are computed on first use, so that indexing a graph does not
// build a set of names that only UniqueName asks.
func (g *Graph) named(name string) bool {
	if name == "" {
		return false
	}
	if g.nodeNames[name] {
		return true
	}
	if g.nameHashes == nil {
		hs := make([]uint64, 0, len(g.nodes))
		for _, n := range g.nodes {
			if n.GetName() != "" {
				hs = append(hs, maphash.String(nameSeed, n.GetName()))
			}
		}
		g.nameHashes = newHashSet(hs)
	}
	if !g.nameHashes.has(maphash.String(nameSeed, name)) {
		return false
	}
	// Probably a node's name: the first such question sets the names
	// themselves aside, to answer this one and the next exactly.
	if g.indexedNames == nil {
		g.indexedNames = make(map[string]bool, len(g.nodes))
		for _, n := range g.nodes {
			g.indexedNames[n.GetName()] = true
		}
	}
	return g.indexedNames[name]
}

// hashSet is a set of 64-bit hashes, bucketed by their top bits (a
// counting sort): two passes build it, and a short scan answers.
type hashSet struct {
	shift  uint
	off    []int32 // bucket k holds hashes[off[k]:off[k+1]]
	hashes []uint64
}

// newHashSet returns the set of hs, with one or two hashes per bucket.
func newHashSet(hs []uint64) *hashSet {
	b := max(bits.Len(uint(len(hs)))-1, 0)
	s := &hashSet{shift: uint(64 - b), off: make([]int32, 1<<b+1), hashes: make([]uint64, len(hs))}
	for _, h := range hs {
		s.off[h>>s.shift+1]++
	}
	for k := 1; k < len(s.off); k++ {
		s.off[k] += s.off[k-1]
	}
	// Fill each bucket from its start, which moves off[k] to the start of
	// bucket k+1; then move the starts back in place.
	for _, h := range hs {
		k := h >> s.shift
		s.hashes[s.off[k]] = h
		s.off[k]++
	}
	copy(s.off[1:], s.off[:len(s.off)-1])
	s.off[0] = 0
	return s
}

// has reports whether h is in the set.
func (s *hashSet) has(h uint64) bool {
	k := h >> s.shift
	return slices.Contains(s.hashes[s.off[k]:s.off[k+1]], h)
}

// AddNode appends n to the graph and indexes it.
func (g *Graph) AddNode(n *pb.NodeProto) {
	g.P.Node = append(g.P.Node, n)
	g.index(n)
}

// AddInitializer appends t to the graph's initializers.
func (g *Graph) AddInitializer(t *pb.TensorProto) {
	g.P.Initializer = append(g.P.Initializer, t)
	if t.GetName() == "" {
		g.rewired = true // empty inputs now name a value
	}
	g.init[g.id(t.GetName())] = t
}

// RemoveNodes deletes the given nodes and reindexes.
func (g *Graph) RemoveNodes(drop map[*pb.NodeProto]bool) {
	if len(drop) == 0 {
		return
	}
	g.RemoveNodesFunc(func(n *pb.NodeProto) bool { return drop[n] })
}

// RemoveNodesFunc deletes the nodes for which drop returns true and
// reindexes. drop is called once per node, in order.
func (g *Graph) RemoveNodesFunc(drop func(n *pb.NodeProto) bool) {
	kept := g.P.Node[:0]
	for _, n := range g.P.Node {
		if !drop(n) {
			kept = append(kept, n)
		}
	}
	for i := len(kept); i < len(g.P.Node); i++ {
		g.P.Node[i] = nil
	}
	g.P.Node = kept
	g.Reindex()
}

// ReplaceAllUses rewires every consumer of old (and graph outputs named old)
// to read repl instead.
func (g *Graph) ReplaceAllUses(old, repl string) {
	g.topo, g.ordered, g.rewired = nil, false, true
	for _, n := range g.Consumers(old) {
		for i, in := range n.Input {
			if in == old {
				n.Input[i] = repl
			}
		}
		j := g.id(repl)
		g.cons[j] = append(g.cons[j], n)
	}
	if j, ok := g.ids[old]; ok {
		g.cons[j] = nil
	}
	for _, v := range g.P.Output {
		if v.GetName() == old {
			v.Name = &repl
			delete(g.outputs, old)
			g.outputs[repl] = true
		}
	}
}

// defined reports whether v is produced by a node, an initializer or a
// graph input.
func (g *Graph) defined(v string) bool {
	if j, ok := g.ids[v]; ok && (g.prod[j] != nil || g.init[j] != nil) {
		return true
	}
	return g.inputs[v]
}

// CycleError reports a cycle through the named node.
type CycleError struct{ Node string }

func (e *CycleError) Error() string { return fmt.Sprintf("graph has a cycle through node %q", e.Node) }

// NodeLabel names a node for messages: its name, or op type and first output.
func NodeLabel(n *pb.NodeProto) string {
	if n.GetName() != "" {
		return n.GetName()
	}
	if len(n.Output) > 0 {
		return n.GetOpType() + "->" + n.Output[0]
	}
	return n.GetOpType()
}

// TopoSort returns the nodes in an order where every producer comes before
// its consumers, stable with respect to the file order, or a CycleError.
func (g *Graph) TopoSort() ([]*pb.NodeProto, error) {
	order, err := g.order()
	if err != nil {
		return nil, err
	}
	return append([]*pb.NodeProto(nil), order...), nil
}

// order is TopoSort without the copy: the order it returns is the index's
// cache, not to be modified.
func (g *Graph) order() ([]*pb.NodeProto, error) {
	if g.topo != nil && len(g.topo) == len(g.P.Node) {
		return g.topo, nil
	}
	if g.ordered {
		// Nothing changed since Reindex found the file order topological.
		g.topo = append([]*pb.NodeProto(nil), g.P.Node...)
		return g.topo, nil
	}
	out, err := g.topoSort()
	if err != nil {
		return nil, err
	}
	g.topo = out
	return out, nil
}

func (g *Graph) topoSort() ([]*pb.NodeProto, error) {
	nodes := g.P.Node
	pos := make(map[*pb.NodeProto]int, len(nodes))
	for i, n := range nodes {
		pos[n] = i
	}
	// Exported graphs are usually in order already: when every producer
	// comes before its consumers, the file order is the answer.
	sorted := true
check:
	for i, n := range nodes {
		for _, in := range NodeInputs(n) {
			if p := g.Producer(in); p != nil && in != "" && pos[p] >= i {
				sorted = false
				break check
			}
		}
	}
	if sorted {
		return append([]*pb.NodeProto(nil), nodes...), nil
	}
	indeg := make([]int, len(nodes))
	succ := make([][]int, len(nodes))
	seen := make([]int, len(nodes)) // seen[j] == i+1: edge j -> i recorded
	for i, n := range nodes {
		for _, in := range NodeInputs(n) {
			if p := g.Producer(in); p != nil && in != "" {
				j := pos[p]
				if seen[j] != i+1 {
					seen[j] = i + 1
					succ[j] = append(succ[j], i)
					indeg[i]++
				}
			}
		}
	}
	// Kahn's algorithm with a min-heap on file position keeps the order stable.
	h := &MinHeap[int]{}
	for i := range nodes {
		if indeg[i] == 0 {
			h.Push(i)
		}
	}
	out := make([]*pb.NodeProto, 0, len(nodes))
	for h.Len() > 0 {
		i := h.Pop()
		out = append(out, nodes[i])
		for _, j := range succ[i] {
			indeg[j]--
			if indeg[j] == 0 {
				h.Push(j)
			}
		}
	}
	if len(out) != len(nodes) {
		for i := range nodes {
			if indeg[i] > 0 {
				return nil, &CycleError{Node: NodeLabel(nodes[i])}
			}
		}
	}
	return out, nil
}

// Sort reorders the graph's nodes topologically (see TopoSort).
func (g *Graph) Sort() error {
	order, err := g.TopoSort()
	if err != nil {
		return err
	}
	copy(g.P.Node, order)
	return nil
}

// RemoveDeadCode deletes nodes whose outputs reach no graph output and
// initializers nothing reads. It returns how many nodes and initializers it
// removed. Nodes in unknown domains are treated like any other.
func (g *Graph) RemoveDeadCode() (nodes, inits int) {
	live := map[*pb.NodeProto]bool{}
	var stack []string
	for _, v := range g.P.Output {
		stack = append(stack, v.GetName())
	}
	usedVal := map[string]bool{}
	for len(stack) > 0 {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if usedVal[v] {
			continue
		}
		usedVal[v] = true
		if p := g.Producer(v); p != nil && !live[p] {
			live[p] = true
			stack = append(stack, NodeInputs(p)...)
		}
	}
	drop := map[*pb.NodeProto]bool{}
	for _, n := range g.P.Node {
		if !live[n] {
			drop[n] = true
		}
	}
	keptInit := g.P.Initializer[:0]
	for _, t := range g.P.Initializer {
		if usedVal[t.GetName()] || g.inputs[t.GetName()] {
			keptInit = append(keptInit, t)
		} else {
			inits++
		}
	}
	g.P.Initializer = keptInit
	// Drop value_info entries of values that no longer exist.
	nodes = len(drop)
	g.RemoveNodes(drop)
	if nodes == 0 && inits > 0 {
		g.Reindex()
	}
	vi := g.P.ValueInfo[:0]
	for _, v := range g.P.ValueInfo {
		if g.Producer(v.GetName()) != nil || g.inputs[v.GetName()] || g.Initializer(v.GetName()) != nil {
			vi = append(vi, v)
		}
	}
	g.P.ValueInfo = vi
	return nodes, inits
}

// Validate checks the graph and returns every problem found: values read but
// never defined (naming the node), values defined twice, and cycles.
func (g *Graph) Validate() []error {
	var errs []error
	for _, v := range g.dupOut {
		errs = append(errs, fmt.Errorf("value %q is produced by more than one node (second: %q)", v, NodeLabel(g.Producer(v))))
	}
	if g.initProduced() {
		for _, t := range g.P.Initializer {
			if p := g.Producer(t.GetName()); p != nil {
				errs = append(errs, fmt.Errorf("value %q is both an initializer and the output of node %q", t.GetName(), NodeLabel(p)))
			}
		}
	}
	for i, n := range g.P.Node {
		var ins []string // looked up only for a value not defined by a node or initializer
		for k, j := range g.InputIDs(n, i) {
			if j >= 0 && (g.prod[j] != nil || g.init[j] != nil) {
				continue
			}
			if ins == nil {
				ins = NodeInputs(n)
			}
			if in := ins[k]; in != "" && !g.defined(in) {
				errs = append(errs, fmt.Errorf("node %q (%s) reads %q, which no node, input or initializer defines", NodeLabel(n), n.GetOpType(), in))
			}
		}
	}
	for _, v := range g.P.Output {
		if n := v.GetName(); g.Producer(n) == nil && g.Initializer(n) == nil && !g.inputs[n] {
			errs = append(errs, fmt.Errorf("graph output %q is not defined", n))
		}
	}
	if _, err := g.order(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// initProduced reports whether a node produces a value the index knows as
// an initializer.
func (g *Graph) initProduced() bool {
	for j, t := range g.init {
		if t != nil && g.prod[j] != nil {
			return true
		}
	}
	return false
}

// OpCensus counts nodes per "domain::op" (default domain as plain op), sorted.
func (g *Graph) OpCensus() []OpCount {
	m := map[string]int{}
	for _, n := range g.P.Node {
		m[OpKey(n)]++
	}
	return SortCounts(m)
}

// SortCounts turns op counts into rows, most frequent first, then by name.
func SortCounts(m map[string]int) []OpCount {
	out := make([]OpCount, 0, len(m))
	for k, v := range m {
		out = append(out, OpCount{Op: k, Count: v})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Op < out[j].Op
	})
	return out
}

// OpCount is one row of an op census.
type OpCount struct {
	Op    string `json:"op"`
	Count int    `json:"count"`
}

// OpKey is "op" for the default domain and "domain::op" otherwise.
func OpKey(n *pb.NodeProto) string {
	if d := n.GetDomain(); d != "" && d != "ai.onnx" {
		return d + "::" + n.GetOpType()
	}
	return n.GetOpType()
}

// MinHeap is a binary min-heap, used for stable topological orders (pop
// the smallest file position first).
type MinHeap[T cmp.Ordered] struct{ a []T }

// Len returns the number of elements.
func (h *MinHeap[T]) Len() int { return len(h.a) }

// Push adds x.
func (h *MinHeap[T]) Push(x T) {
	h.a = append(h.a, x)
	i := len(h.a) - 1
	for i > 0 {
		p := (i - 1) / 2
		if h.a[p] <= h.a[i] {
			break
		}
		h.a[p], h.a[i] = h.a[i], h.a[p]
		i = p
	}
}

// Pop removes and returns the smallest element; the heap must not be empty.
func (h *MinHeap[T]) Pop() T {
	top := h.a[0]
	last := len(h.a) - 1
	h.a[0] = h.a[last]
	h.a = h.a[:last]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h.a) && h.a[l] < h.a[m] {
			m = l
		}
		if r < len(h.a) && h.a[r] < h.a[m] {
			m = r
		}
		if m == i {
			break
		}
		h.a[m], h.a[i] = h.a[i], h.a[m]
		i = m
	}
	return top
}
