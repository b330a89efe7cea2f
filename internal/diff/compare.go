package diff

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// FusedDomain is the op domain of fused nodes: an added node in this domain
// (or one with a provenance record) starts a fused region.
const FusedDomain = moe.Domain

// compared is the matched state behind a Result, kept for the renderers.
type compared struct {
	a, b   *side
	mt     *matcher
	initA  []int32 // A initializer -> same-content B initializer, or -1
	initB  []int32
	chgA   []int32 // A initializer -> changed B initializer, or -1
	chgB   []int32
	region []int32 // A node -> region index, or -1
	fused  []int32 // region index -> B node
	// changed marks A nodes of matched pairs that differ.
	changed map[int32]bool
}

// Compare diffs model a (old) against model b (new). Nodes are matched by
// structure, not by name (see matcher), initializers by content; a fused
// node of b (domain ai.mok, or one with a provenance record in b's
// metadata_props) is reported with the region of a it replaced. Compare only
// reads the models.
func Compare(a, b *graph.Model) (*Result, error) {
	r := newResult(a, b)
	warn := func(s string) { r.Warnings = append(r.Warnings, s) }
	sa, err := newSide(a, warn)
	if err != nil {
		return nil, err
	}
	sb, err := newSide(b, warn)
	if err != nil {
		return nil, err
	}
	mt := newMatcher(sa, sb)
	mt.run()
	c := &compared{a: sa, b: sb, mt: mt, changed: map[int32]bool{}}
	r.cmp = c
	c.pairInits()
	c.nodeChanges(r)
	c.regions(r)
	c.modelChanges(r)
	r.summarize()
	return r, nil
}

func newResult(a, b *graph.Model) *Result {
	info := func(m *graph.Model) ModelInfo {
		return ModelInfo{File: m.Name(), Nodes: len(m.Proto.GetGraph().GetNode()),
			Initializers: len(m.Proto.GetGraph().GetInitializer()), IRVersion: m.Proto.GetIrVersion()}
	}
	return &Result{SchemaVersion: SchemaVersion, A: info(a), B: info(b),
		Regions:      []Region{},
		Nodes:        NodeChanges{Removed: []NodeRef{}, Added: []NodeRef{}, Changed: []NodeChange{}},
		Initializers: InitChanges{Removed: []Init{}, Added: []Init{}, Changed: []InitChange{}},
		IO:           []IOChange{}, Functions: []FunctionChange{}, Opsets: []OpsetChange{},
		Metadata: []MetadataChange{}, Model: []FieldChange{}, Warnings: []string{},
		Summary: Summary{FusedOps: []OpCount{}}}
}

func filled(n int) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = -1
	}
	return s
}

// pairInits pairs initializers: same content read by the same slot of a
// node pair, then same name and content, then same content (unless the A
// one is only read by removed nodes and the B one only by added nodes:
// those are a region's old and new weights that happen to be equal); then
// "changed" pairs: read by the same slot of a node pair, or same name.
func (c *compared) pairInits() {
	a, b, mt := c.a, c.b, c.mt
	c.initA, c.initB = filled(len(a.inits)), filled(len(b.inits))
	c.chgA, c.chgB = filled(len(a.inits)), filled(len(b.inits))
	link := func(x, y int32) { c.initA[x], c.initB[y] = y, x }
	slots := func(f func(x, y int32)) {
		for i, j := range mt.ma {
			if j < 0 {
				continue
			}
			ia, ib := a.ins[i], b.ins[j]
			for s := 0; s < len(ia) && s < len(ib); s++ {
				if ia[s].kind == vInit && ib[s].kind == vInit {
					f(ia[s].idx, ib[s].idx)
				}
			}
		}
	}
	slots(func(x, y int32) {
		if c.initA[x] < 0 && c.initB[y] < 0 && a.initKey[x] == b.initKey[y] {
			link(x, y)
		}
	})
	nameB := make(map[string]int32, len(b.inits))
	for y, t := range b.inits {
		nameB[t.GetName()] = int32(y)
	}
	for x, t := range a.inits {
		if y, ok := nameB[t.GetName()]; ok && c.initA[x] < 0 && c.initB[y] < 0 && a.initKey[x] == b.initKey[y] {
			link(int32(x), y)
		}
	}
	byKey := map[uint64][]int32{}
	for y := range b.inits {
		if c.initB[y] < 0 {
			byKey[b.initKey[y]] = append(byKey[b.initKey[y]], int32(y))
		}
	}
	onlyUnpaired := func(us []use, m []int32) bool {
		for _, u := range us {
			if m[u.node] >= 0 {
				return false
			}
		}
		return len(us) > 0
	}
	for x := range a.inits {
		if c.initA[x] >= 0 {
			continue
		}
		q := byKey[a.initKey[x]]
		replaced := onlyUnpaired(a.initCon[x], mt.ma)
		for k, y := range q {
			if c.initB[y] >= 0 || replaced && onlyUnpaired(b.initCon[y], mt.mb) {
				continue
			}
			link(int32(x), y)
			byKey[a.initKey[x]] = append(q[:k:k], q[k+1:]...)
			break
		}
	}
	free := func(x, y int32) bool {
		return c.initA[x] < 0 && c.chgA[x] < 0 && c.initB[y] < 0 && c.chgB[y] < 0
	}
	slots(func(x, y int32) {
		if free(x, y) {
			c.chgA[x], c.chgB[y] = y, x
		}
	})
	for x, t := range a.inits {
		if y, ok := nameB[t.GetName()]; ok && free(int32(x), y) {
			c.chgA[x], c.chgB[y] = y, int32(x)
		}
	}
}

func (c *compared) initRemoved(x int32) bool { return c.initA[x] < 0 && c.chgA[x] < 0 }
func (c *compared) initAdded(y int32) bool   { return c.initB[y] < 0 && c.chgB[y] < 0 }

// correspond reports whether value ra of A and rb of B are the same value.
func (c *compared) correspond(ra, rb vref) bool {
	if ra.kind != rb.kind {
		return false
	}
	switch ra.kind {
	case vEmpty:
		return true
	case vInput:
		return ra.idx == rb.idx
	case vInit:
		return c.a.initKey[ra.idx] == c.b.initKey[rb.idx] || c.initA[ra.idx] == rb.idx || c.chgA[ra.idx] == rb.idx
	case vNode:
		// Paired, or computing the same thing from the same sources (a
		// duplicate of the pair: equal forward hashes).
		return ra.out == rb.out && (c.mt.ma[ra.idx] == rb.idx || c.a.fwd[ra.idx] == c.b.fwd[rb.idx])
	case vUndef:
		return c.a.undef[ra.idx] == c.b.undef[rb.idx]
	}
	return false
}

// replacement reports whether ra is gone from B and rb is new in B, so that
// a slot fed by ra in A and rb in B is a consequence of that replacement,
// not a change of the reading node.
func (c *compared) replacement(ra, rb vref) bool {
	gone := ra.kind == vNode && c.mt.ma[ra.idx] < 0 || ra.kind == vInit && c.initRemoved(ra.idx)
	isNew := rb.kind == vNode && c.mt.mb[rb.idx] < 0 || rb.kind == vInit && c.initAdded(rb.idx)
	return gone && isNew
}

func describe(s *side, r vref) string {
	switch r.kind {
	case vInput:
		return fmt.Sprintf("graph input %d %q", r.idx, s.inputs[r.idx].GetName())
	case vInit:
		t := s.inits[r.idx]
		return fmt.Sprintf("initializer %q %s%s sha256:%s", t.GetName(), graph.DataType(t), formatDims(t.GetDims()), s.digest[r.idx].hex()[:12])
	case vNode:
		return fmt.Sprintf("output %d of %s %q (%s)", r.out, graph.OpKey(s.nodes[r.idx]), s.label(int(r.idx)), s.valueName(r))
	case vUndef:
		return fmt.Sprintf("undefined value %q", s.undef[r.idx])
	}
	return "(none)"
}

// nodeChanges lists removed, added and changed nodes (regions are carved
// out of removed and added later).
func (c *compared) nodeChanges(r *Result) {
	a, b, mt := c.a, c.b, c.mt
	for i, j := range mt.ma {
		if j < 0 {
			continue
		}
		r.Summary.NodesMatched++
		if a.nodes[i].GetName() != b.nodes[j].GetName() {
			r.Summary.RenamedNodes++
		}
		var attrs []AttrChange
		if a.attrH[i] != b.attrH[j] {
			attrs = c.attrChanges(a.nodes[i], b.nodes[j])
		}
		var ins []InputChange
		ia, ib := a.ins[i], b.ins[j]
		for s := 0; s < max(len(ia), len(ib)); s++ {
			switch {
			case s >= len(ia):
				ins = append(ins, InputChange{Slot: s, Old: "(absent)", New: describe(b, ib[s])})
			case s >= len(ib):
				ins = append(ins, InputChange{Slot: s, Old: describe(a, ia[s]), New: "(absent)"})
			case !c.correspond(ia[s], ib[s]) && !c.replacement(ia[s], ib[s]):
				ins = append(ins, InputChange{Slot: s, Old: describe(a, ia[s]), New: describe(b, ib[s])})
			}
		}
		if len(attrs) > 0 || len(ins) > 0 {
			c.changed[int32(i)] = true
			if attrs == nil {
				attrs = []AttrChange{}
			}
			if ins == nil {
				ins = []InputChange{}
			}
			r.Nodes.Changed = append(r.Nodes.Changed, NodeChange{A: a.ref(i), B: b.ref(int(j)), Attributes: attrs, Inputs: ins})
		}
	}
	sort.Slice(r.Nodes.Changed, func(x, y int) bool { return r.Nodes.Changed[x].A.Index < r.Nodes.Changed[y].A.Index })
	for x, y := range c.initA {
		if y >= 0 && a.inits[x].GetName() != b.inits[y].GetName() {
			r.Summary.RenamedInitializers++
		}
	}
}

func (c *compared) attrChanges(na, nb *pb.NodeProto) []AttrChange {
	ha := &attrHasher{m: c.a.m}
	hb := &attrHasher{m: c.b.m}
	am := map[string]*pb.AttributeProto{}
	for _, x := range na.Attribute {
		am[x.GetName()] = x
	}
	bm := map[string]*pb.AttributeProto{}
	for _, x := range nb.Attribute {
		bm[x.GetName()] = x
	}
	var names []string
	for k := range am {
		names = append(names, k)
	}
	for k := range bm {
		if am[k] == nil {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	var out []AttrChange
	for _, k := range names {
		x, y := am[k], bm[k]
		switch {
		case y == nil:
			out = append(out, AttrChange{Name: k, Change: Removed, Old: formatAttr(c.a.m, x)})
		case x == nil:
			out = append(out, AttrChange{Name: k, Change: Added, New: formatAttr(c.b.m, y)})
		case ha.attr(x) != hb.attr(y):
			out = append(out, AttrChange{Name: k, Change: Changed, Old: formatAttr(c.a.m, x), New: formatAttr(c.b.m, y)})
		}
	}
	return out
}

func (c *compared) initInfo(s *side, x int32) Init {
	t := s.inits[x]
	d := s.digest[x]
	dims := t.GetDims()
	if dims == nil {
		dims = []int64{}
	}
	return Init{Name: t.GetName(), DType: graph.DataType(t).String(), Shape: dims, SHA256: d.hex(), Bytes: d.bytes}
}

// provenance is the part of moe.Provenance the diff reads.
type provenance struct {
	Node         string   `json:"node"`
	Kind         string   `json:"kind"`
	Nodes        []string `json:"nodes"`
	Initializers []string `json:"initializers"`
}

// unfusedSuffix is what the rewrite appends to the detached output of a
// region's last node; a provenance label of an unnamed node may carry it.
var unfusedSuffix = regexp.MustCompile(`__unfused(_[0-9]+)?$`)

// regions finds the fused nodes of B and carves the region each replaced
// out of A's removed nodes and initializers: first by the provenance record
// (node labels), then by connectivity (a multi-source breadth-first search
// over removed nodes, seeded with the removed nodes that fed the values the
// fused node now reads or produces). Whatever stays unassigned is reported
// as an ordinary change.
func (c *compared) regions(r *Result) {
	a, b, mt := c.a, c.b, c.mt
	provs := map[string]*provenance{}
	for _, p := range b.m.Proto.MetadataProps {
		if k := p.GetKey(); strings.HasPrefix(k, moe.ProvenanceKey) {
			pr := &provenance{}
			if err := json.Unmarshal([]byte(p.GetValue()), pr); err != nil {
				r.Warnings = append(r.Warnings, fmt.Sprintf("%s: metadata %q is not a provenance record: %v", b.m.Name(), k, err))
				continue
			}
			provs[strings.TrimPrefix(k, moe.ProvenanceKey)] = pr
		}
	}
	for j := range b.nodes {
		if mt.mb[j] >= 0 {
			continue
		}
		nd := b.nodes[j]
		if nd.GetDomain() == FusedDomain || provs[nd.GetName()] != nil && nd.GetName() != "" {
			c.fused = append(c.fused, int32(j))
		}
	}
	c.region = filled(len(a.nodes))
	if len(c.fused) == 0 {
		c.otherNodesAndInits(r, nil)
		return
	}
	regs := make([]Region, len(c.fused))
	var queue []int32
	assign := func(i int32, g int) {
		if mt.ma[i] < 0 && c.region[i] < 0 {
			c.region[i] = int32(g)
			queue = append(queue, i)
		}
	}
	labelA := map[string]int32{}
	for i := range a.nodes {
		if mt.ma[i] < 0 {
			labelA[a.label(i)] = int32(i)
		}
	}
	for g, j := range c.fused {
		nd := b.nodes[j]
		regs[g].Fused = b.ref(int(j))
		regs[g].Variant = nd.GetOverload()
		if pr := provs[nd.GetName()]; pr != nil {
			regs[g].Kind = pr.Kind
			for _, l := range pr.Nodes {
				if i, ok := labelA[l]; ok {
					assign(i, g)
				} else if i, ok := labelA[unfusedSuffix.ReplaceAllString(l, "")]; ok {
					assign(i, g)
				}
			}
		}
	}
	for g, j := range c.fused {
		for o, us := range b.cons[j] {
			for _, u := range us {
				if ai := mt.mb[u.node]; ai >= 0 && int(u.slot) < len(a.ins[ai]) {
					if ra := a.ins[ai][u.slot]; ra.kind == vNode {
						assign(ra.idx, g)
					}
				}
			}
			for _, p := range b.outAt[[2]int32{j, int32(o)}] {
				if p < len(a.outSrc) && a.outSrc[p].kind == vNode {
					assign(a.outSrc[p].idx, g)
				}
			}
		}
		for _, rb := range b.ins[j] {
			if ra, ok := c.counterpart(rb); ok {
				for _, u := range a.consumersOf(ra) {
					assign(u.node, g)
				}
			}
		}
	}
	for h := 0; h < len(queue); h++ {
		i := queue[h]
		g := int(c.region[i])
		for _, ra := range a.ins[i] {
			if ra.kind == vNode {
				assign(ra.idx, g)
			}
		}
		for _, us := range a.cons[i] {
			for _, u := range us {
				assign(u.node, g)
			}
		}
	}
	for i := range a.nodes {
		if g := c.region[i]; g >= 0 {
			regs[g].Nodes = append(regs[g].Nodes, a.ref(i))
		}
	}
	// Initializers: by provenance name, else by the region of their readers.
	initRegion := filled(len(a.inits))
	nameA := map[string]int32{}
	for x, t := range a.inits {
		nameA[t.GetName()] = int32(x)
	}
	for g, j := range c.fused {
		if pr := provs[b.nodes[j].GetName()]; pr != nil {
			for _, n := range pr.Initializers {
				if x, ok := nameA[n]; ok && c.initRemoved(x) && initRegion[x] < 0 {
					initRegion[x] = int32(g)
				}
			}
		}
	}
	for x := range a.inits {
		if !c.initRemoved(int32(x)) || initRegion[x] >= 0 {
			continue
		}
		best := int32(-1)
		for _, u := range a.initCon[x] {
			if g := c.region[u.node]; g > best {
				best = g
			}
		}
		initRegion[x] = best
	}
	fusedIdx := map[int32]int{}
	for g, j := range c.fused {
		fusedIdx[j] = g
	}
	newInitRegion := filled(len(b.inits))
	for y := range b.inits {
		if !c.initAdded(int32(y)) {
			continue
		}
		for _, u := range b.initCon[y] {
			if g, ok := fusedIdx[u.node]; ok {
				newInitRegion[y] = int32(g)
				break
			}
		}
	}
	for x, g := range initRegion {
		if g >= 0 {
			regs[g].Initializers = append(regs[g].Initializers, c.initInfo(a, int32(x)))
		}
	}
	for y, g := range newInitRegion {
		if g >= 0 {
			regs[g].NewInitializers = append(regs[g].NewInitializers, c.initInfo(b, int32(y)))
		}
	}
	for g := range regs {
		rg := &regs[g]
		ops := map[string]int{}
		for _, n := range rg.Nodes {
			ops[n.Op]++
		}
		rg.Ops = graph.SortCounts(ops)
		sort.Slice(rg.Nodes, func(x, y int) bool { return rg.Nodes[x].Index < rg.Nodes[y].Index })
		if pr := provs[b.nodes[c.fused[g]].GetName()]; pr != nil {
			rg.Provenance = checkProvenance(pr, rg)
		}
		rg.Nodes = nonNil(rg.Nodes)
		rg.Initializers = nonNil(rg.Initializers)
		rg.NewInitializers = nonNil(rg.NewInitializers)
		rg.Functions, rg.Opsets, rg.Metadata, rg.Model = []FunctionChange{}, []OpsetChange{}, []MetadataChange{}, []FieldChange{}
	}
	r.Regions = regs
	c.otherNodesAndInits(r, func(side bool, x int32) bool {
		if side {
			return newInitRegion[x] >= 0
		}
		return initRegion[x] >= 0
	})
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// counterpart finds the value of A that corresponds to value rb of B.
func (c *compared) counterpart(rb vref) (vref, bool) {
	switch rb.kind {
	case vNode:
		if ai := c.mt.mb[rb.idx]; ai >= 0 {
			return vref{kind: vNode, idx: ai, out: rb.out}, true
		}
	case vInput:
		if int(rb.idx) < len(c.a.inputs) {
			return rb, true
		}
	case vInit:
		if x := c.initB[rb.idx]; x >= 0 {
			return vref{kind: vInit, idx: x}, true
		}
		if x := c.chgB[rb.idx]; x >= 0 {
			return vref{kind: vInit, idx: x}, true
		}
	}
	return vref{}, false
}

// otherNodesAndInits lists what no region claimed. inRegion(false, x) tells
// whether A initializer x belongs to a region, inRegion(true, y) B's y.
func (c *compared) otherNodesAndInits(r *Result, inRegion func(b bool, x int32) bool) {
	a, b, mt := c.a, c.b, c.mt
	isFused := map[int32]bool{}
	for _, j := range c.fused {
		isFused[j] = true
	}
	for i, j := range mt.ma {
		if j < 0 && c.region[i] < 0 {
			r.Nodes.Removed = append(r.Nodes.Removed, a.ref(i))
		}
	}
	for j, i := range mt.mb {
		if i < 0 && !isFused[int32(j)] {
			r.Nodes.Added = append(r.Nodes.Added, b.ref(j))
		}
	}
	byIndex := func(s []NodeRef) { sort.Slice(s, func(x, y int) bool { return s[x].Index < s[y].Index }) }
	byIndex(r.Nodes.Removed)
	byIndex(r.Nodes.Added)
	for x := range a.inits {
		if c.initRemoved(int32(x)) && (inRegion == nil || !inRegion(false, int32(x))) {
			r.Initializers.Removed = append(r.Initializers.Removed, c.initInfo(a, int32(x)))
		}
		if y := c.chgA[x]; y >= 0 {
			r.Initializers.Changed = append(r.Initializers.Changed, InitChange{A: c.initInfo(a, int32(x)), B: c.initInfo(b, y)})
		}
	}
	for y := range b.inits {
		if c.initAdded(int32(y)) && (inRegion == nil || !inRegion(true, int32(y))) {
			r.Initializers.Added = append(r.Initializers.Added, c.initInfo(b, int32(y)))
		}
	}
}

// checkProvenance compares a provenance record with the region found.
func checkProvenance(pr *provenance, rg *Region) *ProvenanceCheck {
	pc := &ProvenanceCheck{Nodes: len(pr.Nodes), Initializers: len(pr.Initializers)}
	found := map[string]bool{}
	for _, n := range rg.Nodes {
		found[n.Name] = true
	}
	rec := map[string]bool{}
	for _, l := range pr.Nodes {
		rec[l] = true
		rec[unfusedSuffix.ReplaceAllString(l, "")] = true
		if !found[l] && !found[unfusedSuffix.ReplaceAllString(l, "")] {
			pc.MissingNodes = append(pc.MissingNodes, l)
		}
	}
	for _, n := range rg.Nodes {
		if !rec[n.Name] {
			pc.ExtraNodes = append(pc.ExtraNodes, n.Name)
		}
	}
	foundI := map[string]bool{}
	for _, t := range rg.Initializers {
		foundI[t.Name] = true
	}
	recI := map[string]bool{}
	for _, n := range pr.Initializers {
		recI[n] = true
		if !foundI[n] {
			pc.MissingInitializers = append(pc.MissingInitializers, n)
		}
	}
	for _, t := range rg.Initializers {
		if !recI[t.Name] {
			pc.ExtraInitializers = append(pc.ExtraInitializers, t.Name)
		}
	}
	pc.Consistent = len(pc.MissingNodes)+len(pc.ExtraNodes)+len(pc.MissingInitializers)+len(pc.ExtraInitializers) == 0
	pc.MissingNodes, pc.ExtraNodes = nonNil(pc.MissingNodes), nonNil(pc.ExtraNodes)
	pc.MissingInitializers, pc.ExtraInitializers = nonNil(pc.MissingInitializers), nonNil(pc.ExtraInitializers)
	return pc
}

// modelChanges compares graph inputs and outputs, functions, opsets,
// metadata and model fields, attributing to the regions what the fusion
// brought in.
func (c *compared) modelChanges(r *Result) {
	a, b := c.a, c.b
	ma, mb := a.m.Proto, b.m.Proto
	// Graph inputs and outputs, by position.
	for p := 0; p < max(len(a.inputs), len(b.inputs)); p++ {
		switch {
		case p >= len(b.inputs):
			r.IO = append(r.IO, IOChange{Kind: "input", Index: p, Change: Removed, Old: valueDesc(a.inputs[p])})
		case p >= len(a.inputs):
			r.IO = append(r.IO, IOChange{Kind: "input", Index: p, Change: Added, New: valueDesc(b.inputs[p])})
		case typeString(a.inputs[p].GetType()) != typeString(b.inputs[p].GetType()):
			r.IO = append(r.IO, IOChange{Kind: "input", Index: p, Change: "type", Old: valueDesc(a.inputs[p]), New: valueDesc(b.inputs[p])})
		}
	}
	for p := 0; p < max(len(a.outputs), len(b.outputs)); p++ {
		switch {
		case p >= len(b.outputs):
			r.IO = append(r.IO, IOChange{Kind: "output", Index: p, Change: Removed, Old: valueDesc(a.outputs[p])})
		case p >= len(a.outputs):
			r.IO = append(r.IO, IOChange{Kind: "output", Index: p, Change: Added, New: valueDesc(b.outputs[p])})
		default:
			if typeString(a.outputs[p].GetType()) != typeString(b.outputs[p].GetType()) {
				r.IO = append(r.IO, IOChange{Kind: "output", Index: p, Change: "type", Old: valueDesc(a.outputs[p]), New: valueDesc(b.outputs[p])})
			}
			if ra, rb := a.outSrc[p], b.outSrc[p]; !c.correspond(ra, rb) && !c.replacement(ra, rb) {
				r.IO = append(r.IO, IOChange{Kind: "output", Index: p, Change: "source", Old: describe(a, ra), New: describe(b, rb)})
			}
		}
	}
	// What fused nodes use: function ids and domains, first region first.
	needFunc := map[string]int{}
	needDomain := map[string]int{}
	for g := len(c.fused) - 1; g >= 0; g-- {
		nd := b.nodes[c.fused[g]]
		needFunc[funcID(nd.GetDomain(), nd.GetOpType(), nd.GetOverload())] = g
		needDomain[normDomain(nd.GetDomain())] = g
	}
	// Functions.
	fa, fb := functions(ma), functions(mb)
	for _, id := range unionKeys(fa, fb) {
		x, y := fa[id], fb[id]
		var ch string
		switch {
		case y == nil:
			ch = Removed
		case x == nil:
			ch = Added
		case !proto.Equal(x, y):
			ch = Changed
		default:
			continue
		}
		fc := FunctionChange{ID: id, Change: ch}
		if g, ok := needFunc[id]; ok && ch != Removed {
			r.Regions[g].Functions = append(r.Regions[g].Functions, fc)
		} else {
			r.Functions = append(r.Functions, fc)
		}
	}
	// Opsets.
	oa, ob := opsets(ma), opsets(mb)
	for _, d := range unionKeys(oa, ob) {
		if oa[d] == ob[d] {
			continue
		}
		oc := OpsetChange{Domain: d, Old: oa[d], New: ob[d]}
		if oc.Domain == "" {
			oc.Domain = "ai.onnx"
		}
		if g, ok := needDomain[d]; ok && ob[d] > oa[d] {
			r.Regions[g].Opsets = append(r.Regions[g].Opsets, oc)
		} else {
			r.Opsets = append(r.Opsets, oc)
		}
	}
	// Metadata.
	mda, mdb := metadata(ma), metadata(mb)
	provKey := map[string]int{}
	for g, j := range c.fused {
		provKey[moe.ProvenanceKey+b.nodes[j].GetName()] = g
	}
	for _, k := range unionKeys(mda, mdb) {
		x, okA := mda[k]
		y, okB := mdb[k]
		var mc MetadataChange
		switch {
		case !okB:
			mc = MetadataChange{Key: k, Change: Removed, Old: x}
		case !okA:
			mc = MetadataChange{Key: k, Change: Added, New: y}
		case x != y:
			mc = MetadataChange{Key: k, Change: Changed, Old: x, New: y}
		default:
			continue
		}
		if g, ok := provKey[k]; ok && mc.Change != Removed {
			r.Regions[g].Metadata = append(r.Regions[g].Metadata, mc)
		} else {
			r.Metadata = append(r.Metadata, mc)
		}
	}
	// Model fields.
	field := func(name, x, y string) {
		if x != y {
			r.Model = append(r.Model, FieldChange{Field: name, Old: x, New: y})
		}
	}
	ira, irb := ma.GetIrVersion(), mb.GetIrVersion()
	if ira != irb {
		fc := FieldChange{Field: "ir_version", Old: strconv.FormatInt(ira, 10), New: strconv.FormatInt(irb, 10)}
		// The rewrite raises the IR to 10 for function overloads.
		if len(c.fused) > 0 && ira < 10 && irb == 10 {
			r.Regions[0].Model = append(r.Regions[0].Model, fc)
		} else {
			r.Model = append(r.Model, fc)
		}
	}
	field("producer_name", ma.GetProducerName(), mb.GetProducerName())
	field("producer_version", ma.GetProducerVersion(), mb.GetProducerVersion())
	field("domain", ma.GetDomain(), mb.GetDomain())
	field("model_version", strconv.FormatInt(ma.GetModelVersion(), 10), strconv.FormatInt(mb.GetModelVersion(), 10))
	field("doc_string", short(ma.GetDocString()), short(mb.GetDocString()))
	field("graph.name", ma.GetGraph().GetName(), mb.GetGraph().GetName())
	if len(ma.TrainingInfo) != len(mb.TrainingInfo) {
		field("training_info", strconv.Itoa(len(ma.TrainingInfo))+" entries", strconv.Itoa(len(mb.TrainingInfo))+" entries")
	}
}

func short(s string) string {
	if len(s) > 60 {
		return s[:57] + "..."
	}
	return s
}

func funcID(domain, name, overload string) string {
	id := name
	if domain != "" && domain != "ai.onnx" {
		id = domain + "::" + name
	}
	if overload != "" {
		id += "[" + overload + "]"
	}
	return id
}

func normDomain(d string) string {
	if d == "ai.onnx" {
		return ""
	}
	return d
}

func functions(m *pb.ModelProto) map[string]*pb.FunctionProto {
	out := map[string]*pb.FunctionProto{}
	for _, f := range m.Functions {
		out[funcID(f.GetDomain(), f.GetName(), f.GetOverload())] = f
	}
	return out
}

func opsets(m *pb.ModelProto) map[string]int64 {
	out := map[string]int64{}
	for _, o := range m.OpsetImport {
		out[normDomain(o.GetDomain())] = o.GetVersion()
	}
	return out
}

func metadata(m *pb.ModelProto) map[string]string {
	out := map[string]string{}
	for _, p := range m.MetadataProps {
		out[p.GetKey()] = p.GetValue()
	}
	return out
}

func unionKeys[V any](x, y map[string]V) []string {
	var ks []string
	for k := range x {
		ks = append(ks, k)
	}
	for k := range y {
		if _, ok := x[k]; !ok {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	return ks
}

func valueDesc(v *pb.ValueInfoProto) string {
	return fmt.Sprintf("%q %s", v.GetName(), typeString(v.GetType()))
}

// typeString renders a value type: "FLOAT[2,seq,64]" for tensors.
func typeString(t *pb.TypeProto) string {
	if t == nil {
		return "?"
	}
	if tt := t.GetTensorType(); tt != nil {
		s := pb.TensorProto_DataType(tt.GetElemType()).String()
		if tt.Shape == nil {
			return s
		}
		var dims []string
		for _, d := range tt.GetShape().GetDim() {
			switch d.Value.(type) {
			case *pb.TensorShapeProto_Dimension_DimParam:
				dims = append(dims, d.GetDimParam())
			case *pb.TensorShapeProto_Dimension_DimValue:
				dims = append(dims, strconv.FormatInt(d.GetDimValue(), 10))
			default:
				dims = append(dims, "?")
			}
		}
		return s + "[" + strings.Join(dims, ",") + "]"
	}
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(t)
	return fmt.Sprintf("type#%08x", uint32(bytesHash(b)))
}
