package passes

import (
	"slices"
	"sync"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// dense numbers the graph for the detector's walks: nodes by topological
// position, values by graph.Graph.ValueID, and the def-use edges in
// compressed rows, so that a walk indexes slices instead of hashing names
// and node pointers. It is built once per detection (the detector never
// edits the graph).
type dense struct {
	// inOff[p]..inOff[p+1] index node p's NodeInputs in inVal and inPred.
	inOff  []int32
	inVal  []int32 // value number of the input (-1: empty name)
	inPred []int32 // topological position of its producer (-1: none)
	// outOff[p]..outOff[p+1] index node p's outputs in outVal.
	outOff []int32
	outVal []int32 // value number of the output (-1: empty name)
	// consOff[v]..consOff[v+1] index value v's consumers in cons
	// (topological positions, once per reading input).
	consOff []int32
	cons    []int32
	isOut   []bool  // value is a graph output
	prod    []int32 // value number -> producer position (-1: none)
}

// marks gives walks a visited set over topological positions without
// clearing: a position is marked when at[p] == epoch. Each detector
// goroutine has its own.
type marks struct {
	at    []uint32
	epoch uint32
}

// newDense numbers g's nodes in the order topo.
func newDense(g *graph.Graph, topo []*pb.NodeProto) *dense {
	nv := g.NumValues()
	d := &dense{
		inOff:  make([]int32, len(topo)+1),
		outOff: make([]int32, len(topo)+1),
		prod:   make([]int32, nv),
		isOut:  make([]bool, nv),
	}
	for _, v := range g.P.Output {
		if j := g.ValueID(v.GetName()); j >= 0 {
			d.isOut[j] = true
		}
	}
	edges, outs := 0, 0
	for _, n := range topo {
		edges += len(n.Input)
		outs += len(n.Output)
	}
	d.inVal = make([]int32, 0, edges)
	d.outVal = make([]int32, 0, outs)
	// The index numbered every node's inputs and outputs when it was
	// built: in a graph already in topological order, positions are the
	// same and nothing is looked up by name.
	for p, n := range topo {
		d.inVal = append(d.inVal, g.InputIDs(n, p)...)
		d.inOff[p+1] = int32(len(d.inVal))
		d.outVal = append(d.outVal, g.OutputIDs(n, p)...)
		d.outOff[p+1] = int32(len(d.outVal))
	}
	for i := range d.prod {
		d.prod[i] = -1
	}
	for p := range topo {
		for _, j := range d.outVal[d.outOff[p]:d.outOff[p+1]] {
			if j >= 0 {
				d.prod[j] = int32(p)
			}
		}
	}
	count := make([]int32, nv+1)
	d.inPred = make([]int32, len(d.inVal))
	for e, j := range d.inVal {
		d.inPred[e] = -1
		if j >= 0 {
			d.inPred[e] = d.prod[j]
			count[j+1]++
		}
	}
	for j := 1; j <= nv; j++ {
		count[j] += count[j-1]
	}
	d.consOff = slices.Clone(count)
	d.cons = make([]int32, count[nv])
	for p := range topo {
		for e := d.inOff[p]; e < d.inOff[p+1]; e++ {
			if j := d.inVal[e]; j >= 0 {
				d.cons[count[j]] = int32(p)
				count[j]++
			}
		}
	}
	return d
}

// next starts a new visited set.
func (m *marks) next() uint32 {
	m.epoch++
	if m.epoch == 0 { // wrapped: forget every old mark
		clear(m.at)
		m.epoch = 1
	}
	return m.epoch
}

// memo remembers a yes/no answer per topological position for one query at
// a time without clearing between queries: at[p] == epoch means no (or
// being worked out), epoch+1 means yes, anything else unknown.
type memo struct {
	at    []uint32
	epoch uint32
}

// reset forgets every answer; n is the number of positions.
func (m *memo) reset(n int) {
	if m.at == nil {
		m.at = make([]uint32, n)
	}
	m.epoch += 2
	if m.epoch < 2 { // wrapped: forget every old answer
		clear(m.at)
		m.epoch = 2
	}
}

// get returns whether p's answer is known, and the answer.
func (m *memo) get(p int32) (known, yes bool) {
	v := m.at[p]
	return v == m.epoch || v == m.epoch+1, v == m.epoch+1
}

// set records p's answer.
func (m *memo) set(p int32, yes bool) {
	m.at[p] = m.epoch
	if yes {
		m.at[p]++
	}
}

// consumers returns the positions of the nodes reading value j.
func (d *dense) consumers(j int32) []int32 { return d.cons[d.consOff[j]:d.consOff[j+1]] }

// posOf returns n's topological position; ok is false for nodes outside
// the order (the synthetic selections standing for sparsemixer routers).
// A node is found through its first output's producer; other nodes
// (without outputs, or sharing an output in an invalid graph) through a map
// made the first time one is asked.
func (c *ctx) posOf(n *pb.NodeProto) (int32, bool) {
	if n == nil {
		return 0, false
	}
	if len(n.Output) > 0 && n.Output[0] != "" {
		if j := c.g.ValueID(n.Output[0]); j >= 0 {
			if p := c.d.prod[j]; p >= 0 && c.topo[p] == n {
				return p, true
			}
		}
	}
	c.byNode.once.Do(func() {
		c.byNode.pos = make(map[*pb.NodeProto]int32)
		for p, nd := range c.topo {
			if !c.viaOutput(nd, int32(p)) {
				c.byNode.pos[nd] = int32(p)
			}
		}
	})
	p, ok := c.byNode.pos[n]
	return p, ok
}

// viaOutput reports whether posOf finds the node at position p through
// its first output (not when it has none, or shares it with a later node).
func (c *ctx) viaOutput(n *pb.NodeProto, p int32) bool {
	if len(n.Output) == 0 || n.Output[0] == "" {
		return false
	}
	j := c.g.ValueID(n.Output[0])
	return j >= 0 && c.d.prod[j] == p
}

// orderOf returns n's topological position, or for a synthetic selection
// the position of the last node it stands for.
func (c *ctx) orderOf(n *pb.NodeProto) (int32, bool) {
	if p, ok := c.posOf(n); ok {
		return p, true
	}
	p, ok := c.synPos[n]
	return p, ok
}

// valueIDs returns the value numbers of the non-empty names among vals
// that the graph knows.
func (c *ctx) valueIDs(vals ...string) []int32 {
	ids := make([]int32, 0, len(vals))
	for _, v := range vals {
		if v == "" {
			continue
		}
		if j := c.g.ValueID(v); j >= 0 {
			ids = append(ids, j)
		}
	}
	return ids
}

// nodesAt returns the nodes at the given positions.
func (c *ctx) nodesAt(ps []int32) []*pb.NodeProto {
	out := make([]*pb.NodeProto, len(ps))
	for i, p := range ps {
		out[i] = c.topo[p]
	}
	return out
}

// backPos returns the positions of the nodes v depends on, v's producer
// first, not walking past the values in stop (value numbers).
func (c *ctx) backPos(v string, stop []int32) []int32 { return c.backPosInto(nil, v, stop) }

// backPosInto is backPos appending to out.
func (c *ctx) backPosInto(out []int32, v string, stop []int32) []int32 {
	j := c.g.ValueID(v)
	if j < 0 || slices.Contains(stop, j) || c.d.prod[j] < 0 {
		return out
	}
	d := c.d
	mk := c.mk
	ep := mk.next()
	root := d.prod[j]
	mk.at[root] = ep
	start := len(out)
	out = append(out, root)
	for i := start; i < len(out); i++ {
		p := out[i]
		for e := d.inOff[p]; e < d.inOff[p+1]; e++ {
			q := d.inPred[e]
			if q >= 0 && mk.at[q] != ep && !slices.Contains(stop, d.inVal[e]) {
				mk.at[q] = ep
				out = append(out, q)
			}
		}
	}
	return out
}

// backNodes returns the nodes v depends on, not walking past the values
// named in stop.
func (c *ctx) backNodes(v string, stop ...string) []*pb.NodeProto {
	return c.nodesAt(c.backPos(v, c.valueIDs(stop...)))
}

// fwdPos returns the positions of the nodes reachable from the given
// values (within the limit in force).
func (c *ctx) fwdPos(vals ...string) []int32 {
	d := c.d
	mk := c.mk
	ep := mk.next()
	var out []int32
	stack := c.valueIDs(vals...)
	for len(stack) > 0 {
		j := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, p := range d.consumers(j) {
			if mk.at[p] != ep && (c.lim == nil || c.lim[p]) {
				mk.at[p] = ep
				out = append(out, p)
				for _, o := range d.outVal[d.outOff[p]:d.outOff[p+1]] {
					if o >= 0 {
						stack = append(stack, o)
					}
				}
			}
		}
	}
	return out
}

// setLimit bounds forward walks to the given nodes (nil: no bound).
func (c *ctx) setLimit(region []*pb.NodeProto) {
	if region == nil {
		c.setLimitPos(nil)
		return
	}
	ps := make([]int32, 0, len(region))
	for _, n := range region {
		if p, ok := c.posOf(n); ok {
			ps = append(ps, p)
		}
	}
	c.setLimitPos(ps)
}

// setLimitPos is setLimit for nodes given by position (nil: no bound).
// The bound lives in a buffer of c's, reused by the next call: a reach
// made under a bound must not be asked after the bound changed.
func (c *ctx) setLimitPos(region []int32) {
	for _, p := range c.limSet {
		c.limBuf[p] = false
	}
	c.lim, c.limSet = nil, nil
	if region == nil {
		return
	}
	if c.limBuf == nil {
		c.limBuf = make([]bool, len(c.topo))
	}
	for _, p := range region {
		c.limBuf[p] = true
	}
	c.lim, c.limSet = c.limBuf, region
}

// inLimit reports whether forward walks may visit n.
func (c *ctx) inLimit(n *pb.NodeProto) bool {
	if c.lim == nil {
		return true
	}
	p, ok := c.posOf(n)
	return ok && c.lim[p]
}

// nodePositions is the map posOf falls back on, made once and shared by
// the detector's goroutines.
type nodePositions struct {
	once sync.Once
	pos  map[*pb.NodeProto]int32
}
