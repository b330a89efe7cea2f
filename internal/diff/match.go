package diff

// matcher pairs the nodes of two sides.
//
// Matching runs in three stages:
//
//  1. Global signatures (Weisfeiler-Lehman style, see side.hashes). Nodes
//     whose forward and backward hashes are both equal are paired, then
//     nodes with equal forward hashes, then equal backward hashes — but only
//     where the hash names exactly one unpaired node on each side. Larger
//     groups (duplicated subexpressions) are ambiguous and left for stage 3.
//     The forward hash pairs everything upstream of a change, the backward
//     hash everything downstream of it.
//  2. Propagation by position in structure. From the anchors (graph inputs
//     and outputs by position, initializers by content) and from every
//     pair, unpaired producers feeding the same input slot and unpaired
//     consumers reading the same value are compared by a local key: op,
//     attributes, and per input the identity of what feeds it (the pair it
//     comes from, the graph input position, the initializer content, or
//     "unpaired"). Strict keys (attributes and initializer contents
//     included) are tried first for the whole graph; loose keys (op and
//     paired inputs only, so that a node whose attribute or weight changed
//     still pairs and shows up as "changed") only when no strict step is
//     left, and a loose match must be unique on both sides. Several
//     candidates with one strict key are paired in order only when the key
//     determines them completely (no unpaired input), that is when they are
//     interchangeable.
//  3. Ambiguous groups are settled last, one at a time, each followed by
//     propagation: first by a context key (strict key plus the pairs that
//     consume the node), then by strict key, backward hash, and finally op
//     and topological order.
//
// Every task is run a bounded number of times and costs the degree of the
// nodes it looks at, so matching is linear in the size of the graphs (plus
// hashing the initializers' bytes).
type matcher struct {
	a, b   *side
	ma, mb []int32

	strictQ, looseQ []task
	sh, lh          int
	ambig           []ambigGroup
	initUses        [][2][]use // readers of same-content initializers in A and B

	stampA, stampB []uint32
	gen            uint32
	pairs          int
}

type ambigGroup struct{ as, bs []int32 }

// task is a unit of propagation: a node pair, or an anchor (graph input or
// output position, or a group of same-content initializers) whose readers
// or producers are compared.
type task struct {
	kind taskKind
	idx  int32
}

type taskKind uint8

const (
	taskPair   taskKind = iota // idx: A node of a pair
	taskInput                  // idx: graph input position
	taskOutput                 // idx: graph output position
	taskInit                   // idx: into initUses
)

func newMatcher(a, b *side) *matcher {
	mt := &matcher{a: a, b: b,
		ma: filled(len(a.nodes)), mb: filled(len(b.nodes)),
		stampA: make([]uint32, len(a.nodes)), stampB: make([]uint32, len(b.nodes))}
	return mt
}

func (mt *matcher) pair(i, j int32) {
	mt.ma[i], mt.mb[j] = j, i
	mt.pairs++
	mt.strictQ = append(mt.strictQ, task{taskPair, i})
}

func (mt *matcher) run() {
	a, b := mt.a, mt.b
	mt.pairByKey(func(i int32) uint64 { return comb(a.fwd[i], a.bwd[i]) }, func(j int32) uint64 { return comb(b.fwd[j], b.bwd[j]) })
	mt.pairByKey(func(i int32) uint64 { return a.fwd[i] }, func(j int32) uint64 { return b.fwd[j] })
	mt.pairByKey(func(i int32) uint64 { return a.bwd[i] }, func(j int32) uint64 { return b.bwd[j] })
	mt.anchors()
	mt.propagate()
	for mt.resolveAmbiguous() {
	}
}

// pairByKey pairs unpaired nodes whose key is held by exactly one unpaired
// node on each side; keys held by more are recorded as ambiguous.
func (mt *matcher) pairByKey(ka, kb func(int32) uint64) {
	type group struct{ as, bs []int32 }
	groups := make(map[uint64]*group, len(mt.mb))
	for j := range mt.mb {
		if mt.mb[j] < 0 {
			k := kb(int32(j))
			g := groups[k]
			if g == nil {
				g = &group{}
				groups[k] = g
			}
			g.bs = append(g.bs, int32(j))
		}
	}
	if len(groups) == 0 {
		return
	}
	var order []*group
	for i := range mt.ma {
		if mt.ma[i] >= 0 {
			continue
		}
		if g := groups[ka(int32(i))]; g != nil {
			if len(g.as) == 0 {
				order = append(order, g)
			}
			g.as = append(g.as, int32(i))
		}
	}
	for _, g := range order {
		if len(g.as) == 1 && len(g.bs) == 1 {
			mt.pair(g.as[0], g.bs[0])
		} else {
			mt.ambig = append(mt.ambig, ambigGroup{g.as, g.bs})
		}
	}
}

// propagate drains the queues: strict steps first, a loose step only when
// no strict step is pending.
func (mt *matcher) propagate() {
	for {
		if mt.sh < len(mt.strictQ) {
			tk := mt.strictQ[mt.sh]
			mt.sh++
			mt.do(tk, true)
			mt.looseQ = append(mt.looseQ, tk)
			continue
		}
		if mt.lh < len(mt.looseQ) {
			tk := mt.looseQ[mt.lh]
			mt.lh++
			mt.do(tk, false)
			continue
		}
		break
	}
	// Drained: reuse the backing arrays.
	mt.strictQ, mt.sh = mt.strictQ[:0], 0
	mt.looseQ, mt.lh = mt.looseQ[:0], 0
}

// anchors queues the graph inputs and outputs (by position) and the
// initializers (by content) present in both models.
func (mt *matcher) anchors() {
	a, b := mt.a, mt.b
	for p := 0; p < len(a.inputs) && p < len(b.inputs); p++ {
		mt.strictQ = append(mt.strictQ, task{taskInput, int32(p)})
	}
	for p := 0; p < len(a.outputs) && p < len(b.outputs); p++ {
		mt.strictQ = append(mt.strictQ, task{taskOutput, int32(p)})
	}
	byKey := map[uint64]int{}
	for x, k := range a.initKey {
		g, ok := byKey[k]
		if !ok {
			g = len(mt.initUses)
			byKey[k] = g
			mt.initUses = append(mt.initUses, [2][]use{})
		}
		mt.initUses[g][0] = append(mt.initUses[g][0], a.initCon[x]...)
	}
	for y, k := range b.initKey {
		if g, ok := byKey[k]; ok {
			mt.initUses[g][1] = append(mt.initUses[g][1], b.initCon[y]...)
		}
	}
	for g, u := range mt.initUses {
		if len(u[0]) > 0 && len(u[1]) > 0 {
			mt.strictQ = append(mt.strictQ, task{taskInit, int32(g)})
		}
	}
}

// do runs one task.
func (mt *matcher) do(tk task, strict bool) {
	switch tk.kind {
	case taskPair:
		mt.step(tk.idx, strict)
	case taskInput:
		mt.matchConsumers(mt.a.inCons[tk.idx], mt.b.inCons[tk.idx], strict)
	case taskInit:
		u := mt.initUses[tk.idx]
		mt.matchConsumers(u[0], u[1], strict)
	case taskOutput:
		mt.matchProducers(mt.a.outSrc[tk.idx], mt.b.outSrc[tk.idx], strict)
	}
}

// matchProducers pairs the unpaired producers of two corresponding values
// when their ops (and, if strict, attributes and output counts) agree.
func (mt *matcher) matchProducers(ra, rb vref, strict bool) {
	a, b := mt.a, mt.b
	if ra.kind != vNode || rb.kind != vNode || ra.out != rb.out {
		return
	}
	pa, pb := ra.idx, rb.idx
	if mt.ma[pa] >= 0 || mt.mb[pb] >= 0 || a.opH[pa] != b.opH[pb] {
		return
	}
	if strict && (a.attrH[pa] != b.attrH[pb] || len(a.cons[pa]) != len(b.cons[pb])) {
		return
	}
	mt.pair(pa, pb)
}

// step looks at the unpaired neighbours of pair (i, ma[i]).
func (mt *matcher) step(i int32, strict bool) {
	a, b := mt.a, mt.b
	j := mt.ma[i]
	ia, ib := a.ins[i], b.ins[j]
	for s := 0; s < len(ia) && s < len(ib); s++ {
		mt.matchProducers(ia[s], ib[s], strict)
	}
	ca, cb := a.cons[i], b.cons[j]
	for o := 0; o < len(ca) && o < len(cb); o++ {
		if len(ca[o]) > 0 && len(cb[o]) > 0 {
			mt.matchConsumers(ca[o], cb[o], strict)
		}
	}
}

// candidates returns the distinct unpaired nodes among us.
func (mt *matcher) candidates(us []use, m []int32, stamp []uint32) []int32 {
	var out []int32
	for _, u := range us {
		if m[u.node] < 0 && stamp[u.node] != mt.gen {
			stamp[u.node] = mt.gen
			out = append(out, u.node)
		}
	}
	return out
}

// matchConsumers compares the unpaired readers of two corresponding values.
func (mt *matcher) matchConsumers(ua, ub []use, strict bool) {
	mt.gen++
	ca := mt.candidates(ua, mt.ma, mt.stampA)
	if len(ca) == 0 {
		return
	}
	cb := mt.candidates(ub, mt.mb, mt.stampB)
	if len(cb) == 0 {
		return
	}
	if len(ca) == 1 && len(cb) == 1 {
		ka, _ := mt.key(mt.a, ca[0], strict)
		kb, _ := mt.key(mt.b, cb[0], strict)
		if ka == kb {
			mt.pair(ca[0], cb[0])
		}
		return
	}
	kb := make(map[uint64][]int32, len(cb))
	for _, n := range cb {
		k, _ := mt.key(mt.b, n, strict)
		kb[k] = append(kb[k], n)
	}
	ga := make(map[uint64][]int32, len(ca))
	determined := map[uint64]bool{}
	var order []uint64
	for _, n := range ca {
		k, det := mt.key(mt.a, n, strict)
		if _, ok := kb[k]; !ok {
			continue
		}
		if _, seen := ga[k]; !seen {
			order = append(order, k)
		}
		ga[k] = append(ga[k], n)
		determined[k] = det
	}
	for _, k := range order {
		as, bs := ga[k], kb[k]
		switch {
		case len(as) == 1 && len(bs) == 1:
			mt.pair(as[0], bs[0])
		case !strict:
			mt.ambig = append(mt.ambig, ambigGroup{as, bs})
		default:
			as, bs = mt.pairByBwd(as, bs)
			as, bs = mt.pairByContext(as, bs)
			if len(as) > 0 && len(bs) > 0 {
				if determined[k] && len(as) == len(bs) {
					// Identical op, attributes and inputs: interchangeable.
					for x := range as {
						mt.pair(as[x], bs[x])
					}
				} else {
					mt.ambig = append(mt.ambig, ambigGroup{as, bs})
				}
			}
		}
	}
}

// pairByBwd pairs nodes of as and bs whose backward hashes are equal and
// unique within the group, and returns the rest.
func (mt *matcher) pairByBwd(as, bs []int32) (restA, restB []int32) {
	return mt.pairUnique(as, bs, func(n int32) uint64 { return mt.a.bwd[n] }, func(n int32) uint64 { return mt.b.bwd[n] })
}

// pairByContext pairs nodes whose context keys are equal and unique within
// the group, and returns the rest.
func (mt *matcher) pairByContext(as, bs []int32) (restA, restB []int32) {
	return mt.pairUnique(as, bs, func(n int32) uint64 { return mt.context(mt.a, n) }, func(n int32) uint64 { return mt.context(mt.b, n) })
}

// pairUnique pairs the unpaired nodes of as and bs whose keys occur once on
// each side, and returns the unpaired rest.
func (mt *matcher) pairUnique(as, bs []int32, ka, kb func(int32) uint64) (restA, restB []int32) {
	count := map[uint64][2]int{}
	keyB := map[uint64]int32{}
	for _, n := range bs {
		if mt.mb[n] < 0 {
			k := kb(n)
			c := count[k]
			c[1]++
			count[k] = c
			keyB[k] = n
		}
	}
	if len(keyB) == 0 {
		return unpaired(as, mt.ma), nil
	}
	keysA := make([]uint64, len(as))
	for x, n := range as {
		if mt.ma[n] < 0 {
			keysA[x] = ka(n)
			c := count[keysA[x]]
			c[0]++
			count[keysA[x]] = c
		}
	}
	for x, n := range as {
		if mt.ma[n] < 0 {
			if c := count[keysA[x]]; c[0] == 1 && c[1] == 1 {
				mt.pair(n, keyB[keysA[x]])
			}
		}
	}
	return unpaired(as, mt.ma), unpaired(bs, mt.mb)
}

// key is a node's local signature: op, (attributes,) and per input slot the
// identity of what feeds it. determined is false when some input comes from
// an unpaired node.
func (mt *matcher) key(s *side, n int32, strict bool) (h uint64, determined bool) {
	h = comb(s.opH[n], uint64(len(s.ins[n])))
	if strict {
		h = comb(h, s.attrH[n])
	}
	determined = true
	for _, r := range s.ins[n] {
		var l uint64
		switch r.kind {
		case vNode:
			if id := mt.pairID(s, r.idx); id < 0 {
				l = tagStar
				determined = false
			} else {
				l = comb(comb(tagMatched, uint64(id)), uint64(r.out))
			}
		case vInit:
			l = tagInit
			if strict {
				l = comb(tagInit, s.initKey[r.idx])
			}
		case vInput:
			l = comb(tagInput, uint64(r.idx))
		case vUndef:
			l = tagUndef
			if strict {
				l = comb(tagUndef, strHash(s.undef[r.idx]))
			}
		default:
			l = tagEmpty
		}
		h = comb(h, l)
	}
	return h, determined
}

// pairID is the A index of the pair node n of side s belongs to, or -1.
func (mt *matcher) pairID(s *side, n int32) int32 {
	if s == mt.a {
		if mt.ma[n] >= 0 {
			return n
		}
		return -1
	}
	return mt.mb[n]
}

// context is the strict key plus the multiset of paired consumers (pair,
// input slot, output index) of node n.
func (mt *matcher) context(s *side, n int32) uint64 {
	h, _ := mt.key(s, n, true)
	for o, us := range s.cons[n] {
		var sum uint64
		for _, u := range us {
			if id := mt.pairID(s, u.node); id >= 0 {
				sum += fmix(comb(comb(uint64(id), uint64(u.slot)), uint64(o)))
			}
		}
		h = comb(h, sum)
	}
	return h
}

// resolveAmbiguous settles the recorded ambiguous groups one at a time,
// propagating after each. It reports whether anything was paired.
func (mt *matcher) resolveAmbiguous() bool {
	groups := mt.ambig
	mt.ambig = nil
	progress := false
	for _, g := range groups {
		as := unpaired(g.as, mt.ma)
		bs := unpaired(g.bs, mt.mb)
		if len(as) == 0 || len(bs) == 0 {
			continue
		}
		before := mt.pairs
		as, bs = mt.pairByContext(as, bs)
		as, bs = mt.settle(as, bs, func(s *side, n int32) uint64 { return mt.context(s, n) })
		as, bs = mt.settle(as, bs, func(s *side, n int32) uint64 { k, _ := mt.key(s, n, true); return k })
		as, bs = mt.pairByBwd(as, bs)
		mt.settle(as, bs, func(s *side, n int32) uint64 { return s.opH[n] })
		if mt.pairs != before {
			progress = true
			mt.propagate()
		}
	}
	return progress
}

// settle pairs nodes with equal keys in order, preferring equal backward
// hashes, and returns the rest.
func (mt *matcher) settle(as, bs []int32, key func(*side, int32) uint64) (restA, restB []int32) {
	type queue struct {
		ns   []int32
		head int
	}
	byKey := map[uint64]*queue{}
	byKeyBwd := map[[2]uint64]*queue{}
	push := func(q *queue, n int32) *queue {
		if q == nil {
			q = &queue{}
		}
		q.ns = append(q.ns, n)
		return q
	}
	for _, n := range bs {
		k := key(mt.b, n)
		byKey[k] = push(byKey[k], n)
		kb := [2]uint64{k, mt.b.bwd[n]}
		byKeyBwd[kb] = push(byKeyBwd[kb], n)
	}
	next := func(q *queue) int32 {
		for q != nil && q.head < len(q.ns) {
			n := q.ns[q.head]
			q.head++
			if mt.mb[n] < 0 {
				return n
			}
		}
		return -1
	}
	for _, n := range as {
		k := key(mt.a, n)
		pick := next(byKeyBwd[[2]uint64{k, mt.a.bwd[n]}])
		if pick < 0 {
			pick = next(byKey[k])
		}
		if pick >= 0 {
			mt.pair(n, pick)
		}
	}
	return unpaired(as, mt.ma), unpaired(bs, mt.mb)
}

func unpaired(ns []int32, m []int32) []int32 {
	var out []int32
	for _, n := range ns {
		if m[n] < 0 {
			out = append(out, n)
		}
	}
	return out
}
