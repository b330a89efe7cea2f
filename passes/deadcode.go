package passes

import (
	"slices"
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
	g *graph.Graph
	// Nodes are numbered, the graph's nodes by their position, which
	// finds most (at); ids, built on first need (id), finds the others.
	// Node i's NodeInputs are the edges off[i]..off[i+1]: vals holds their
	// value numbers (graph.InputIDs) and preds the numbers of their
	// producers (-1: none), kept current when a fused node takes over a
	// value (see valsOf and predsOf).
	ids     map[*pb.NodeProto]int32
	nodes   []*pb.NodeProto
	off     []int32
	vals    []int32
	preds   []int32
	count   []int32 // live consumer edges + graph outputs produced
	removed []bool
	// Indexed by value number (graph.ValueID), grown as the graph numbers
	// new values (grow): uses counts the consumer edges of nodes not
	// removed of the values counted holds a count for (initializers when
	// their readers were numbered), gone marks the initializers removed
	// and read (== epoch) the values the nodes removeDeadIn drops read.
	uses    []int32
	counted []bool
	gone    []bool
	read    []int32
	// readOff and readBy list, per value number, the numbers of the nodes
	// reading it, one per edge (the index's consumers, as numbers), and
	// readMore those of the fused nodes added since.
	readOff  []int32
	readBy   []int32
	readMore map[int32][]int32
	last     []string // initializers removed by the latest removeDeadIn
	first    bool
	// scratch for removeDeadIn, valid where mark[i] == epoch
	epoch     int32
	dropMark  []int32
	doneMark  []int32
	remMark   []int32
	rem       []int32
	consCache [][]int32
	// scratch slices removeDeadIn reuses from block to block
	dropBuf, workBuf, readBuf []int32
	sorter                    sortScratch
}

// newDeadCode numbers g's nodes and computes their liveness; room is made
// for the fused nodes the blocks add, one each.
func newDeadCode(g *graph.Graph, blocks int) *deadCode {
	n := len(g.P.Node)
	c := n + blocks
	d := &deadCode{g: g, readMore: map[int32][]int32{}, first: true}
	d.grow()
	// The graph's nodes, numbered by position (as add would, at once).
	d.nodes = append(make([]*pb.NodeProto, 0, c), g.P.Node...)
	d.off = make([]int32, n+1, c+1)
	d.count = make([]int32, n, c)
	d.removed = make([]bool, n, c)
	d.dropMark = make([]int32, n, c)
	d.doneMark = make([]int32, n, c)
	d.remMark = make([]int32, n, c)
	d.rem = make([]int32, n, c)
	d.consCache = make([][]int32, n, c)
	for i, nd := range g.P.Node {
		d.off[i+1] = d.off[i] + int32(len(g.InputIDs(nd, i)))
	}
	edges := d.off[n]
	d.vals = make([]int32, 0, edges+int32(16*blocks))
	for i, nd := range g.P.Node {
		d.vals = append(d.vals, g.InputIDs(nd, i)...)
	}
	d.preds = make([]int32, edges, cap(d.vals))
	for i := range g.P.Node {
		d.fillPreds(int32(i))
	}
	d.numberReaders()
	live := make([]bool, len(d.nodes))
	used := make(map[string]bool, len(g.P.Output))
	var stack []int32
	for _, v := range g.P.Output {
		name := v.GetName()
		if used[name] {
			continue
		}
		used[name] = true
		if i := d.producer(g.ValueID(name)); i >= 0 {
			if !live[i] {
				live[i] = true
				stack = append(stack, i)
			}
		}
	}
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, j := range d.predsOf(i) {
			if j >= 0 && !live[j] {
				live[j] = true
				stack = append(stack, j)
			}
		}
	}
	d.countUses(d.vals)
	isOut := make([]bool, g.NumValues())
	for _, v := range g.P.Output {
		if j := g.ValueID(v.GetName()); j >= 0 {
			isOut[j] = true
		}
	}
	for i, nd := range d.nodes {
		if live[i] {
			for _, j := range g.OutputIDs(nd, i) { // the graph outputs nd produces
				if j >= 0 && isOut[j] {
					d.count[i]++
				}
			}
			for _, j := range d.predsOf(int32(i)) {
				if j >= 0 {
					d.count[j]++
				}
			}
		}
	}
	return d
}

// grow sizes the arrays indexed by value number for the values the graph
// numbers now.
func (d *deadCode) grow() {
	n := d.g.NumValues()
	if k := n - len(d.uses); k > 0 {
		d.uses = append(d.uses, make([]int32, k)...)
		d.counted = append(d.counted, make([]bool, k)...)
		d.gone = append(d.gone, make([]bool, k)...)
		d.read = append(d.read, make([]int32, k)...)
	}
}

// countUses counts, for the initializers among vals, one more reader.
func (d *deadCode) countUses(vals []int32) {
	for _, v := range vals {
		if v >= 0 && d.g.InitializerOf(v) != nil {
			d.uses[v]++
			d.counted[v] = true
		}
	}
}

// numberReaders lists the readers of each value (readOff, readBy) from the
// nodes' inputs, skipping empty names as the index does.
func (d *deadCode) numberReaders() {
	empty := d.g.ValueID("") // numbered when an initializer is named ""
	nv := d.g.NumValues()
	d.readOff = make([]int32, nv+1)
	for _, v := range d.vals {
		if v >= 0 && v != empty {
			d.readOff[v+1]++
		}
	}
	for j := 1; j <= nv; j++ {
		d.readOff[j] += d.readOff[j-1]
	}
	next := slices.Clone(d.readOff[:nv])
	d.readBy = make([]int32, d.readOff[nv])
	for i := range len(d.off) - 1 {
		for _, v := range d.valsOf(int32(i)) {
			if v >= 0 && v != empty {
				d.readBy[next[v]] = int32(i)
				next[v]++
			}
		}
	}
}

// readers returns the numbers of the nodes reading value j (-1: none), one
// per edge: those numbered by newDeadCode and the fused nodes added since.
func (d *deadCode) readers(j int32) (first, more []int32) {
	if j < 0 {
		return nil, nil
	}
	if int(j)+1 < len(d.readOff) {
		first = d.readBy[d.readOff[j]:d.readOff[j+1]]
	}
	return first, d.readMore[j]
}

// producer returns the number of the node producing value j, or -1.
func (d *deadCode) producer(j int32) int32 {
	if j < 0 {
		return -1
	}
	p := d.g.ProducerOf(j)
	if p == nil {
		return -1
	}
	return d.at(p, int(d.g.ProducerPos(j)))
}

// valsOf returns the value numbers of node i's inputs.
func (d *deadCode) valsOf(i int32) []int32 { return d.vals[d.off[i]:d.off[i+1]] }

// predsOf returns the producers of node i's inputs; numbering a node (add)
// may move them.
func (d *deadCode) predsOf(i int32) []int32 { return d.preds[d.off[i]:d.off[i+1]] }

// add numbers nd, at position pos of the graph's nodes (-1: unknown); its
// producers are set by fillPreds.
func (d *deadCode) add(nd *pb.NodeProto, pos int) int32 {
	i := int32(len(d.nodes))
	if d.ids != nil {
		d.ids[nd] = i
	}
	d.nodes = append(d.nodes, nd)
	ids := d.g.InputIDs(nd, pos)
	d.vals = append(d.vals, ids...)
	d.preds = append(d.preds, ids...) // overwritten by fillPreds
	d.off = append(d.off, int32(len(d.vals)))
	d.count = append(d.count, 0)
	d.removed = append(d.removed, false)
	d.dropMark = append(d.dropMark, 0)
	d.doneMark = append(d.doneMark, 0)
	d.remMark = append(d.remMark, 0)
	d.rem = append(d.rem, 0)
	d.consCache = append(d.consCache, nil)
	return i
}

// fillPreds sets the producers of node i's inputs.
func (d *deadCode) fillPreds(i int32) {
	for e := d.off[i]; e < d.off[i+1]; e++ {
		p := d.producer(d.vals[e]) // may number a node, moving d.preds
		d.preds[e] = p
	}
}

// id returns nd's number, numbering it (and its producers) if it is new.
func (d *deadCode) id(nd *pb.NodeProto) int32 {
	if d.ids == nil {
		d.ids = make(map[*pb.NodeProto]int32, cap(d.nodes))
		for i, n := range d.nodes {
			d.ids[n] = int32(i)
		}
	}
	if i, ok := d.ids[nd]; ok {
		return i
	}
	i := d.add(nd, -1)
	d.fillPreds(i)
	return i
}

// at is id for a node that may be the one at position pos of the graph's
// nodes as newDeadCode found them, which then is its number.
func (d *deadCode) at(nd *pb.NodeProto, pos int) int32 {
	if pos >= 0 && pos < len(d.nodes) && d.nodes[pos] == nd {
		return int32(pos)
	}
	return d.id(nd)
}

// seek is id for a node probably at a position shortly after from: it
// looks there first, then at the position of the producer of its outputs.
func (d *deadCode) seek(nd *pb.NodeProto, from int) int32 {
	for p := max(from, 0); p < min(from+seekWindow, len(d.nodes)); p++ {
		if d.nodes[p] == nd {
			return int32(p)
		}
	}
	for _, o := range nd.Output {
		if j := d.g.ValueID(o); j >= 0 && d.g.ProducerOf(j) == nd {
			return d.at(nd, int(d.g.ProducerPos(j)))
		}
	}
	return d.id(nd)
}

// seekWindow is how many positions seek tries before looking nd up.
const seekWindow = 16

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

func (d *deadCode) live(i int32) bool { return d.count[i] > 0 }

// kill records that node i lost its last live reference and releases its inputs.
func (d *deadCode) kill(i int32) {
	stack := []int32{i}
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, p := range d.predsOf(x) {
			if p >= 0 {
				d.count[p]--
				if d.count[p] == 0 {
					stack = append(stack, p)
				}
			}
		}
	}
}

// consumers returns the numbers of the nodes reading n's outputs, one per
// edge as the index lists them.
func (d *deadCode) consumers(i int32) []int32 {
	if c := d.consCache[i]; c != nil {
		return c
	}
	c := []int32{}
	for _, o := range d.nodes[i].Output {
		first, more := d.readers(d.g.ValueID(o))
		c = append(append(c, first...), more...)
	}
	d.consCache[i] = c
	return c
}

// replaced moves value v from old's outputs (old, at position oldPos of
// the graph's nodes, now writes a fresh, unread name) to fused, which was
// just added and which the index already lists as v's producer.
func (d *deadCode) replaced(old *pb.NodeProto, oldPos int, fused *pb.NodeProto, v string) {
	d.grow()
	oi := d.at(old, oldPos)
	fi := d.add(fused, -1)
	d.fillPreds(fi)
	// The fused node reads its inputs: they gain a reader (as the index
	// lists it among their consumers), and their producers a consumer.
	empty := d.g.ValueID("")
	for _, x := range d.valsOf(fi) {
		if x >= 0 && x != empty {
			d.readMore[x] = append(d.readMore[x], fi)
		}
	}
	// v's readers now read fused's output.
	vid := d.g.ValueID(v)
	first, more := d.readers(vid)
	for _, rs := range [][]int32{first, more} {
		for _, ci := range rs {
			for k, x := range d.valsOf(ci) {
				if x == vid {
					d.predsOf(ci)[k] = fi
				}
			}
		}
	}
	for _, p := range d.predsOf(fi) {
		if p >= 0 {
			d.consCache[p] = nil
		}
	}
	d.consCache[oi] = nil
	refs := int32(0)
	if d.g.IsOutput(v) {
		refs++
	}
	for _, rs := range [][]int32{first, more} {
		for _, ci := range rs {
			if ci != fi && !d.removed[ci] && d.live(ci) {
				refs++
			}
		}
	}
	wasLive := d.live(oi)
	d.count[fi] = refs
	// The fused node reads initializers too (its new weights, and whatever
	// else it takes, such as a block input that is a constant): they are
	// used as long as it is.
	d.countUses(d.valsOf(fi))
	if refs > 0 {
		for _, p := range d.predsOf(fi) {
			if p >= 0 {
				d.count[p]++
			}
		}
	}
	d.count[oi] -= refs
	if wasLive && d.count[oi] == 0 {
		d.kill(oi)
	}
}

// feedsOnly reports whether node i has outputs, none a graph output, and
// every consumer still in the graph is dropped now.
func (d *deadCode) feedsOnly(i int32) bool {
	n := d.nodes[i]
	if len(n.Output) == 0 {
		return false
	}
	for _, o := range n.Output {
		if d.g.IsOutput(o) {
			return false
		}
	}
	for _, c := range d.consumers(i) {
		if d.dropMark[c] != d.epoch && !d.removed[c] {
			return false
		}
	}
	return true
}

// removeDeadIn deletes nodes of region (plus constant-only feeders) whose
// outputs reach no graph output any more, and initializers nothing reads.
// It returns the names of what it removed, sorted.
func (d *deadCode) removeDeadIn(region []*pb.NodeProto) (nodes, inits []string) {
	d.grow()
	d.epoch++
	drop := d.markRegion(region, d.dropBuf[:0])
	work := append(d.workBuf[:0], drop...)
	if d.first {
		// Dead nodes that nothing reads go with the first block (and so
		// do, through the walk below, the dead nodes that only feed them).
		d.first = false
		drop, work = d.markUnread(drop, work)
	}
	drop, work = d.markFeeders(drop, work)
	nodes, read := d.removeNodes(drop, d.readBuf[:0])
	inits = d.unreadInits(read)
	if len(nodes) == 0 {
		nodes = nil
	}
	d.dropBuf, d.workBuf, d.readBuf = drop[:0], work[:0], read[:0]
	d.sorter.sort(nodes)
	d.sorter.sort(inits)
	d.last = inits
	return nodes, inits
}

// markRegion marks, in this epoch, the nodes of region that are neither
// removed nor live, and appends them to drop.
func (d *deadCode) markRegion(region []*pb.NodeProto, drop []int32) []int32 {
	ep := d.epoch
	i := int32(-1)
	for _, n := range region {
		i = d.seek(n, int(i)+1) // regions are mostly in graph order
		if !d.removed[i] && !d.live(i) && d.dropMark[i] != ep {
			d.dropMark[i] = ep
			drop = append(drop, i)
		}
	}
	return drop
}

// markUnread marks, in this epoch, the dead nodes of the graph that nothing
// reads (feedsOnly), and appends them to drop and to work.
func (d *deadCode) markUnread(drop, work []int32) ([]int32, []int32) {
	ep := d.epoch
	for k, n := range d.g.P.Node {
		i := d.at(n, k)
		if !d.live(i) && d.dropMark[i] != ep && d.feedsOnly(i) {
			d.dropMark[i] = ep
			drop = append(drop, i)
			work = append(work, i)
		}
	}
	return drop, work
}

// markFeeders marks, in this epoch, the nodes that feed only dropped
// nodes, and appends them to drop. A node becomes a feeder of dropped nodes
// only through a consumer dropped now: it walks up from the dropped nodes
// in work (which it empties), counting for each producer met the consumer
// edges not dropped yet.
func (d *deadCode) markFeeders(drop, work []int32) ([]int32, []int32) {
	ep := d.epoch
	var order, edges []int32
	for len(work) > 0 {
		n := work[len(work)-1]
		work = work[:len(work)-1]
		d.doneMark[n] = ep
		order, edges = d.undroppedPreds(n, order[:0], edges[:0])
		for k, p := range order {
			if d.feederEdgesLeft(p, edges[k]) == 0 {
				d.dropMark[p] = ep
				drop = append(drop, p)
				work = append(work, p)
			}
		}
	}
	return drop, work
}

// undroppedPreds appends to order the producers of node n's inputs that are
// neither live, dropped nor removed, each once, and to edges how many of
// n's inputs each produces.
func (d *deadCode) undroppedPreds(n int32, order, edges []int32) ([]int32, []int32) {
	ep := d.epoch
	for _, p := range d.predsOf(n) {
		if p < 0 || d.live(p) || d.dropMark[p] == ep || d.removed[p] {
			continue
		}
		found := false
		for k, q := range order {
			if q == p {
				edges[k]++
				found = true
				break
			}
		}
		if !found {
			order = append(order, p)
			edges = append(edges, 1)
		}
	}
	return order, edges
}

// feederEdgesLeft takes edges consumer edges of node p off as dropped and
// returns how many are left (d.rem[p]); it is negative for a node that is
// never a feeder (no outputs, or one that is a graph output). The first time in an epoch, it counts p's consumers not
// removed and not walked yet instead.
func (d *deadCode) feederEdgesLeft(p, edges int32) int32 {
	ep := d.epoch
	var r int32
	if d.remMark[p] != ep {
		d.remMark[p] = ep
		if len(d.nodes[p].Output) == 0 || d.outputRefs(d.nodes[p]) > 0 {
			d.rem[p] = -1 // never a feeder
			return -1
		}
		for _, c := range d.consumers(p) {
			if !d.removed[c] && d.doneMark[c] != ep {
				r++
			}
		}
	} else if d.rem[p] < 0 {
		return -1
	} else {
		r = d.rem[p] - edges
	}
	d.rem[p] = r
	return r
}

// removeNodes removes the nodes of drop, takes their reads off the use counts of
// the values they read, and returns their labels, in drop's order, and the
// values they read, once each, appended to read.
func (d *deadCode) removeNodes(drop []int32, read []int32) (nodes []string, _ []int32) {
	ep := d.epoch
	nodes = make([]string, 0, len(drop))
	for _, i := range drop {
		nodes = append(nodes, graph.NodeLabel(d.nodes[i]))
		for _, v := range d.valsOf(i) {
			if v >= 0 && d.read[v] != ep {
				d.read[v] = ep
				read = append(read, v)
			}
		}
	}
	for _, i := range drop {
		d.removed[i] = true
		for _, v := range d.valsOf(i) {
			if v >= 0 && d.counted[v] {
				d.uses[v]--
			}
		}
	}
	return nodes, read
}

// unreadInits marks as gone the initializers among the values read that
// nothing reads any more and that are not graph outputs, and returns their
// names in read's order.
func (d *deadCode) unreadInits(read []int32) (inits []string) {
	g := d.g
	for _, v := range read {
		t := g.InitializerOf(v)
		if d.gone[v] || t == nil {
			continue
		}
		// An initializer that is also a graph input (a default value, as
		// keep_initializers_as_inputs exports every weight) goes with the
		// nodes that read it: the fused node holds its own copy, so
		// feeding the input would no longer change anything.
		if name := t.GetName(); d.uses[v] == 0 && !g.IsOutput(name) {
			inits = append(inits, name)
			d.gone[v] = true
		}
	}
	return inits
}

// apply removes the recorded nodes and initializers, and the value_info of
// values that no longer exist, and reindexes the graph. As when each block
// was cleaned up on its own, the value_info of initializers the last block
// removed stays.
func (d *deadCode) apply() {
	g := d.g
	kept := g.P.Initializer[:0]
	for _, t := range g.P.Initializer {
		if v := g.ValueID(t.GetName()); v < 0 || int(v) >= len(d.gone) || !d.gone[v] {
			kept = append(kept, t)
		}
	}
	for i := len(kept); i < len(g.P.Initializer); i++ {
		g.P.Initializer[i] = nil
	}
	g.P.Initializer = kept
	// graph inputs that were removed initializers go with them
	g.P.Input = slices.DeleteFunc(g.P.Input, func(in *pb.ValueInfoProto) bool {
		v := g.ValueID(in.GetName())
		return v >= 0 && int(v) < len(d.gone) && d.gone[v]
	})
	pos := 0
	g.RemoveNodesFunc(func(n *pb.NodeProto) bool {
		i := d.at(n, pos)
		pos++
		return d.removed[i]
	})
	last := make(map[string]bool, len(d.last))
	for _, name := range d.last {
		last[name] = true
	}
	vi := g.P.ValueInfo[:0]
	for _, v := range g.P.ValueInfo {
		if g.Producer(v.GetName()) != nil || g.IsInput(v.GetName()) || g.Initializer(v.GetName()) != nil || last[v.GetName()] {
			vi = append(vi, v)
		}
	}
	g.P.ValueInfo = vi
}

// sortScratch sorts strings in increasing order, as sort.Strings does, faster
// for many strings that share long prefixes (the node names of a block):
// level by level, it sorts integers packing the next few bytes after the
// group's common prefix with the string's index, and compares whole strings
// only in small groups. It holds its scratch, reused from call to call.
type sortScratch struct {
	keys []uint64
	tmp  []string
}

// sort sorts a.
func (s *sortScratch) sort(a []string) {
	if len(a) < 16 || len(a) > 1<<chunkIndexBits {
		sort.Strings(a)
		return
	}
	if len(a) > len(s.keys) {
		s.keys, s.tmp = make([]uint64, len(a)), make([]string, len(a))
	}
	sortChunks(a, s.keys[:len(a)], s.tmp[:len(a)], 0)
	clear(s.tmp[:len(a)]) // hold no strings
}

// chunkBytes is how many bytes of each string a level of sortChunks sorts
// by; the index takes the other chunkIndexBits bits of the key.
const (
	chunkBytes     = 6
	chunkIndexBits = 64 - 8*chunkBytes
)

// sortChunks sorts a, whose strings agree on their first depth bytes;
// keys and tmp are scratch of a's length.
func sortChunks(a []string, keys []uint64, tmp []string, depth int) {
	if len(a) < 16 {
		sort.Strings(a)
		return
	}
	depth = commonPrefix(a, depth)
	more := false // a string goes on past this level's bytes
	for i, s := range a {
		keys[i] = chunk(s, depth)<<chunkIndexBits | uint64(i)
		more = more || len(s) > depth+chunkBytes
	}
	slices.Sort(keys)
	copy(tmp, a)
	for i, k := range keys {
		a[i] = tmp[k&(1<<chunkIndexBits-1)]
	}
	for i := 0; i < len(a); {
		j := i + 1
		for j < len(a) && keys[j]>>chunkIndexBits == keys[i]>>chunkIndexBits {
			j++
		}
		switch {
		case j-i < 2:
		case more:
			sortChunks(a[i:j], keys[i:j], tmp[i:j], depth+chunkBytes)
		default: // equal but for trailing zero bytes
			sort.Strings(a[i:j])
		}
		i = j
	}
}

// commonPrefix returns the length of the prefix all of a's strings share,
// knowing that they share their first depth bytes (or end within them).
func commonPrefix(a []string, depth int) int {
	first := a[0]
	n := len(first)
	for _, s := range a[1:] {
		n = min(n, len(s))
		for i := depth; i < n; i++ {
			if s[i] != first[i] {
				n = i
				break
			}
		}
	}
	return max(n, depth)
}

// chunk returns s's chunkBytes bytes from depth, big-endian, zero-padded.
func chunk(s string, depth int) uint64 {
	var k uint64
	for i := depth; i < depth+chunkBytes; i++ {
		k <<= 8
		if i < len(s) {
			k |= uint64(s[i])
		}
	}
	return k
}
