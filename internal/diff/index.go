package diff

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// vkind says where a value comes from.
type vkind uint8

const (
	vEmpty vkind = iota // an omitted optional input ("")
	vInput              // a graph input (idx: position among non-initializer inputs)
	vInit               // an initializer (idx: position in the initializer list)
	vNode               // a node output (idx: node, out: output index)
	vUndef              // a name nothing defines (idx: into side.undef)
)

// vref identifies a value without its name.
type vref struct {
	kind vkind
	out  int32
	idx  int32
}

// use is one read of a value: node and input slot.
type use struct{ node, slot int32 }

// side is one model indexed for comparison. Nodes are numbered in
// topological order.
type side struct {
	m       *graph.Model
	nodes   []*pb.NodeProto
	fileIdx []int
	opH     []uint64
	attrH   []uint64
	ins     [][]vref
	cons    [][][]use // per node, per output
	outAt   map[[2]int32][]int

	inputs []*pb.ValueInfoProto // graph inputs that are not initializers
	inCons [][]use

	outputs []*pb.ValueInfoProto
	outSrc  []vref

	inits   []*pb.TensorProto
	digest  []tensorDigest
	initKey []uint64
	initCon [][]use

	undef []string

	fwd, bwd []uint64
}

// newSide indexes m: topological order, value references, consumers, and
// initializer digests (hashed in parallel).
func newSide(m *graph.Model, warn func(string)) (*side, error) {
	if m == nil || m.Proto == nil || m.Proto.Graph == nil {
		return nil, fmt.Errorf("model has no graph")
	}
	gp := m.Proto.Graph
	order, file, err := topoOrder(gp.Node)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", m.Name(), err)
	}
	s := &side{m: m, nodes: order, outAt: map[[2]int32][]int{}}
	n := len(order)
	s.fileIdx = make([]int, n)
	s.opH = make([]uint64, n)
	s.attrH = make([]uint64, n)
	s.ins = make([][]vref, n)
	s.cons = make([][][]use, n)

	val := make(map[string]vref, 2*n+len(gp.Initializer)+len(gp.Input))
	s.inits = gp.Initializer
	for i, t := range gp.Initializer {
		val[t.GetName()] = vref{kind: vInit, idx: int32(i)}
	}
	for _, v := range gp.Input {
		if _, isInit := val[v.GetName()]; isInit {
			continue
		}
		val[v.GetName()] = vref{kind: vInput, idx: int32(len(s.inputs))}
		s.inputs = append(s.inputs, v)
	}
	for i, nd := range order {
		s.fileIdx[i] = file[i]
		s.cons[i] = make([][]use, len(nd.Output))
		for j, o := range nd.Output {
			if o != "" {
				val[o] = vref{kind: vNode, idx: int32(i), out: int32(j)}
			}
		}
	}
	s.inCons = make([][]use, len(s.inputs))
	s.initCon = make([][]use, len(s.inits))
	resolve := func(name string) vref {
		if name == "" {
			return vref{kind: vEmpty}
		}
		if r, ok := val[name]; ok {
			return r
		}
		r := vref{kind: vUndef, idx: int32(len(s.undef))}
		s.undef = append(s.undef, name)
		val[name] = r
		return r
	}
	ah := &attrHasher{m: m}
	for i, nd := range order {
		s.opH[i] = strHash(opID(nd))
		s.attrH[i] = ah.nodeAttrs(nd.Attribute)
		names := graph.NodeInputs(nd)
		refs := make([]vref, len(names))
		for k, name := range names {
			r := resolve(name)
			refs[k] = r
			u := use{node: int32(i), slot: int32(k)}
			switch r.kind {
			case vNode:
				s.cons[r.idx][r.out] = append(s.cons[r.idx][r.out], u)
			case vInput:
				s.inCons[r.idx] = append(s.inCons[r.idx], u)
			case vInit:
				s.initCon[r.idx] = append(s.initCon[r.idx], u)
			}
		}
		s.ins[i] = refs
	}
	s.outputs = gp.Output
	s.outSrc = make([]vref, len(gp.Output))
	for p, v := range gp.Output {
		r := resolve(v.GetName())
		s.outSrc[p] = r
		if r.kind == vNode {
			k := [2]int32{r.idx, r.out}
			s.outAt[k] = append(s.outAt[k], p)
		}
	}
	s.digestInits(warn)
	s.hashes()
	return s, nil
}

// topoOrder orders nodes so that producers come before consumers, keeping
// the file order where it already is one (Kahn's algorithm with the
// smallest file position first). It returns the nodes, the file position
// of each, or a graph.CycleError.
func topoOrder(nodes []*pb.NodeProto) ([]*pb.NodeProto, []int, error) {
	n := len(nodes)
	prod := make(map[string]int32, 2*n)
	for i, nd := range nodes {
		for _, o := range nd.Output {
			if o != "" {
				prod[o] = int32(i)
			}
		}
	}
	// Predecessor lists in CSR form; sorted is true when the file order
	// is already topological.
	sorted := true
	indeg := make([]int32, n)
	var edges [][2]int32
	for i, nd := range nodes {
		for _, in := range graph.NodeInputs(nd) {
			if p, ok := prod[in]; ok && in != "" && p != int32(i) {
				edges = append(edges, [2]int32{p, int32(i)})
				indeg[i]++
				if p > int32(i) {
					sorted = false
				}
			} else if ok && p == int32(i) {
				return nil, nil, &graph.CycleError{Node: graph.NodeLabel(nd)}
			}
		}
	}
	file := make([]int, n)
	if sorted {
		for i := range file {
			file[i] = i
		}
		return nodes, file, nil
	}
	start := make([]int32, n+1)
	for _, e := range edges {
		start[e[0]+1]++
	}
	for i := 0; i < n; i++ {
		start[i+1] += start[i]
	}
	succ := make([]int32, len(edges))
	fill := append([]int32(nil), start[:n]...)
	for _, e := range edges {
		succ[fill[e[0]]] = e[1]
		fill[e[0]]++
	}
	h := &graph.MinHeap[int32]{}
	for i := 0; i < n; i++ {
		if indeg[i] == 0 {
			h.Push(int32(i))
		}
	}
	order := make([]*pb.NodeProto, 0, n)
	for h.Len() > 0 {
		i := h.Pop()
		order = append(order, nodes[i])
		file[len(order)-1] = int(i)
		for _, j := range succ[start[i]:start[i+1]] {
			if indeg[j]--; indeg[j] == 0 {
				h.Push(j)
			}
		}
	}
	if len(order) != n {
		for i := range nodes {
			if indeg[i] > 0 {
				return nil, nil, &graph.CycleError{Node: graph.NodeLabel(nodes[i])}
			}
		}
	}
	return order, file, nil
}

// digestInits hashes every initializer's contents, in parallel.
func (s *side) digestInits(warn func(string)) {
	s.digest = make([]tensorDigest, len(s.inits))
	s.initKey = make([]uint64, len(s.inits))
	errs := make([]error, len(s.inits))
	workers := min(runtime.GOMAXPROCS(0), 8, max(len(s.inits), 1))
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				d, err := digestTensor(s.m, s.inits[i])
				if err != nil {
					errs[i] = err
					d = fallbackDigest(s.inits[i])
				}
				s.digest[i] = d
				s.initKey[i] = d.key()
			}
		}()
	}
	for i := range s.inits {
		next <- i
	}
	close(next)
	wg.Wait()
	for i, err := range errs {
		if err != nil && warn != nil {
			warn(fmt.Sprintf("%s: initializer %q: %v (compared by its message instead)", s.m.Name(), s.inits[i].GetName(), err))
		}
	}
}

// valueHash is the name-free forward label of a value.
func (s *side) valueHash(r vref) uint64 {
	switch r.kind {
	case vInput:
		return comb(tagInput, uint64(r.idx))
	case vInit:
		return comb(tagInit, s.initKey[r.idx])
	case vNode:
		return comb(s.fwd[r.idx], uint64(r.out))
	case vUndef:
		return comb(tagUndef, strHash(s.undef[r.idx]))
	}
	return tagEmpty
}

// hashes computes the Weisfeiler-Lehman style signatures over the DAG. In a
// DAG one pass in topological order is the fixed point of the refinement:
// fwd(n) covers n's op, attributes and its whole ancestry (anchored on graph
// inputs by position and initializers by content); bwd(n) covers n's op,
// attributes and its whole descendance (anchored on graph outputs by
// position).
func (s *side) hashes() {
	n := len(s.nodes)
	s.fwd = make([]uint64, n)
	s.bwd = make([]uint64, n)
	for i := 0; i < n; i++ {
		h := comb(comb(s.opH[i], s.attrH[i]), uint64(len(s.ins[i])))
		for _, r := range s.ins[i] {
			h = comb(h, s.valueHash(r))
		}
		s.fwd[i] = comb(tagNode, h)
	}
	for i := n - 1; i >= 0; i-- {
		h := comb(comb(s.opH[i], s.attrH[i]), uint64(len(s.cons[i])))
		for j, us := range s.cons[i] {
			// Consumers form a multiset: sum their (bwd, slot) hashes.
			var sum uint64
			for _, u := range us {
				sum += fmix(comb(s.bwd[u.node], uint64(u.slot)))
			}
			h = comb(h, sum)
			for _, p := range s.outAt[[2]int32{int32(i), int32(j)}] {
				h = comb(h, comb(tagOutput, uint64(p)))
			}
		}
		s.bwd[i] = comb(tagConsumer, h)
	}
}

// label names a node for reports.
func (s *side) label(i int) string { return graph.NodeLabel(s.nodes[i]) }

// ref builds the NodeRef of node i.
func (s *side) ref(i int) NodeRef {
	nd := s.nodes[i]
	return NodeRef{Name: graph.NodeLabel(nd), Op: graph.OpKey(nd), Index: s.fileIdx[i]}
}

// valueName returns the name a value has in this model.
func (s *side) valueName(r vref) string {
	switch r.kind {
	case vInput:
		return s.inputs[r.idx].GetName()
	case vInit:
		return s.inits[r.idx].GetName()
	case vNode:
		return s.nodes[r.idx].Output[r.out]
	case vUndef:
		return s.undef[r.idx]
	}
	return ""
}

// consumersOf lists the reads of a value.
func (s *side) consumersOf(r vref) []use {
	switch r.kind {
	case vNode:
		return s.cons[r.idx][r.out]
	case vInput:
		return s.inCons[r.idx]
	case vInit:
		return s.initCon[r.idx]
	}
	return nil
}
