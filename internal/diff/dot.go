package diff

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strings"
	"unicode/utf8"
)

// DOTOptions control DOTWith.
type DOTOptions struct {
	// MaxNodes caps the number of nodes drawn (default 4000). Above it each
	// fused region is drawn as one box and unchanged context is left out.
	MaxNodes int
	// CollapseRegions, when > 0, draws each fused region of more than that
	// many nodes as one summary box (node and initializer counts, op
	// census) beside its fused node; 0 draws every region in full.
	CollapseRegions int
	// Region, when > 0, draws only fused region number Region (1-based,
	// the order of Result.Regions) in full: its replaced nodes, the fused
	// node and the edges among them.
	Region int
}

// Colours of the graph renderers.
const (
	colRemovedFill = "#ffd6d6"
	colRemoved     = "#c62828"
	colAddedFill   = "#d7f5d7"
	colAdded       = "#2e7d32"
	colChangedFill = "#fff3c4"
	colChanged     = "#f9a825"
	colContextFill = "#eeeeee"
	colContext     = "#9e9e9e"
)

// DOT writes a Graphviz digraph of the changes: each fused region is a
// cluster ("cluster_region_<i>", SVG id "region-<i>") holding the removed
// nodes in red and the fused node in green; other removed nodes are red,
// added green, changed yellow, and unchanged nodes one hop from any of
// them grey. Edges only in A are red, only in B green, in both grey.
func DOT(w io.Writer, r *Result) error { return DOTWith(w, r, DOTOptions{}) }

// DOTWith is DOT with options.
func DOTWith(w io.Writer, r *Result, opt DOTOptions) error {
	if opt.MaxNodes <= 0 {
		opt.MaxNodes = 4000
	}
	if opt.Region > len(r.Regions) || opt.Region < 0 {
		return fmt.Errorf("region %d: the result has %d fused regions", opt.Region, len(r.Regions))
	}
	d := &dotGraph{clusters: make([][]string, len(r.Regions)), nodes: map[string]*dotNode{}}
	if r.cmp != nil {
		d.build(r, opt)
	} else {
		d.buildFlat(r, opt)
	}
	return d.write(w, r)
}

type dotNode struct {
	id, label, tooltip string
	fill, color        string
	cluster            int
	bold               bool
}

type dotGraph struct {
	order    []string
	nodes    map[string]*dotNode
	clusters [][]string
	edges    []dotEdge
	note     string
}

type dotEdge struct {
	from, to, color string
	dashed          bool
}

func (d *dotGraph) add(n *dotNode) {
	if _, ok := d.nodes[n.id]; ok {
		return
	}
	d.nodes[n.id] = n
	d.order = append(d.order, n.id)
	if n.cluster >= 0 {
		d.clusters[n.cluster] = append(d.clusters[n.cluster], n.id)
	}
}

func nodeLabel(op, name string) string {
	if utf8.RuneCountInString(name) > 40 {
		rs := []rune(name)
		name = "…" + string(rs[len(rs)-39:])
	}
	return dotLines(op, name)
}

func (d *dotGraph) refNode(id string, n NodeRef, fill, color string, cluster int) *dotNode {
	return &dotNode{id: id, label: nodeLabel(n.Op, n.Name), tooltip: dotEsc(n.Op + " " + n.Name), fill: fill, color: color, cluster: cluster}
}

// collapsedRegion reports whether region g is drawn as one summary box:
// everything is collapsed (too many nodes), or the region is bigger than
// opt.CollapseRegions; a region drawn alone (opt.Region) never is.
func collapsedRegion(r *Result, g int, all bool, opt DOTOptions) bool {
	if opt.Region > 0 {
		return false
	}
	return all || opt.CollapseRegions > 0 && len(r.Regions[g].Nodes) > opt.CollapseRegions
}

// regionBox is the summary box of a collapsed region.
func regionBox(rg Region, g int) *dotNode {
	return &dotNode{id: fmt.Sprintf("r%d", g), cluster: g, fill: colRemovedFill, color: colRemoved,
		label:   dotLines(fmt.Sprintf("%d nodes, %d initializers replaced", len(rg.Nodes), len(rg.Initializers)), clip(opsLine(rg.Ops), 60)),
		tooltip: dotEsc(opsLine(rg.Ops))}
}

// build draws from the matched graphs.
func (d *dotGraph) build(r *Result, opt DOTOptions) {
	maxNodes := opt.MaxNodes
	only := opt.Region - 1 // the one region drawn, or -1
	c := r.cmp
	a, b, mt := c.a, c.b, c.mt
	total := 0
	for i := range a.nodes {
		if mt.ma[i] < 0 || c.changed[int32(i)] {
			total++
		}
	}
	for j := range b.nodes {
		if mt.mb[j] < 0 {
			total++
		}
	}
	collapse := total > maxNodes && only < 0
	collapsed := func(g int) bool { return collapsedRegion(r, g, collapse, opt) }
	// idA / idB give the drawn node of an A / B node, or "".
	idA := func(i int32) string {
		if mt.ma[i] >= 0 {
			if _, ok := d.nodes[fmt.Sprintf("m%d", i)]; ok {
				return fmt.Sprintf("m%d", i)
			}
			return ""
		}
		if g := c.region[i]; g >= 0 && collapsed(int(g)) {
			return fmt.Sprintf("r%d", g)
		}
		if _, ok := d.nodes[fmt.Sprintf("a%d", i)]; ok {
			return fmt.Sprintf("a%d", i)
		}
		return ""
	}
	idB := func(j int32) string {
		if i := mt.mb[j]; i >= 0 {
			return idA(i)
		}
		if _, ok := d.nodes[fmt.Sprintf("b%d", j)]; ok {
			return fmt.Sprintf("b%d", j)
		}
		return ""
	}
	drawn := 0
	for g, j := range c.fused {
		if only >= 0 && g != only {
			continue
		}
		if collapsed(g) {
			d.add(regionBox(r.Regions[g], g))
			drawn++
		}
		fn := d.refNode(fmt.Sprintf("b%d", j), b.ref(int(j)), colAddedFill, colAdded, g)
		fn.bold = true
		d.add(fn)
		drawn++
	}
	skipped := 0
	room := func() bool {
		if drawn >= maxNodes {
			skipped++
			return false
		}
		drawn++
		return true
	}
	for i := range a.nodes {
		if mt.ma[i] >= 0 {
			continue
		}
		g := int(c.region[i])
		if g >= 0 && collapsed(g) || only >= 0 && g != only {
			continue
		}
		if room() {
			d.add(d.refNode(fmt.Sprintf("a%d", i), a.ref(i), colRemovedFill, colRemoved, g))
		}
	}
	isFused := map[int32]bool{}
	for _, j := range c.fused {
		isFused[j] = true
	}
	for j := range b.nodes {
		if only < 0 && mt.mb[j] < 0 && !isFused[int32(j)] && room() {
			d.add(d.refNode(fmt.Sprintf("b%d", j), b.ref(j), colAddedFill, colAdded, -1))
		}
	}
	var changed []int32
	for i := range c.changed {
		changed = append(changed, i)
	}
	sort.Slice(changed, func(x, y int) bool { return changed[x] < changed[y] })
	for _, i := range changed {
		if only < 0 && room() {
			n := d.refNode(fmt.Sprintf("m%d", i), b.ref(int(mt.ma[i])), colChangedFill, colChanged, -1)
			d.add(n)
		}
	}
	if skipped > 0 {
		d.note = fmt.Sprintf("%d more changed nodes not drawn (limit %d)", skipped, maxNodes)
	}
	if !collapse && only < 0 {
		// One hop of unchanged context around everything drawn so far.
		ctx := func(i int32) {
			if mt.ma[i] >= 0 && !c.changed[i] {
				d.add(d.refNode(fmt.Sprintf("m%d", i), a.ref(int(i)), colContextFill, colContext, -1))
			}
		}
		core := append([]string(nil), d.order...)
		for _, id := range core {
			var ai, bj int32 = -1, -1
			switch id[0] {
			case 'a':
				fmt.Sscanf(id[1:], "%d", &ai)
			case 'b':
				fmt.Sscanf(id[1:], "%d", &bj)
			case 'm':
				fmt.Sscanf(id[1:], "%d", &ai)
				bj = mt.ma[ai]
			}
			if ai >= 0 {
				for _, ra := range a.ins[ai] {
					if ra.kind == vNode {
						ctx(ra.idx)
					}
				}
				for _, us := range a.cons[ai] {
					for _, u := range us {
						ctx(u.node)
					}
				}
			}
			if bj >= 0 {
				for _, rb := range b.ins[bj] {
					if rb.kind == vNode && mt.mb[rb.idx] >= 0 {
						ctx(mt.mb[rb.idx])
					}
				}
				for _, us := range b.cons[bj] {
					for _, u := range us {
						if mt.mb[u.node] >= 0 {
							ctx(mt.mb[u.node])
						}
					}
				}
			}
		}
	}
	// Edges of A and of B among drawn nodes.
	type pair struct{ from, to string }
	inA, inB := map[pair]bool{}, map[pair]bool{}
	var edgeOrder []pair
	note := func(set map[pair]bool, p pair) {
		if p.from == "" || p.to == "" || p.from == p.to || set[p] {
			return
		}
		if !inA[p] && !inB[p] {
			edgeOrder = append(edgeOrder, p)
		}
		set[p] = true
	}
	for i := range a.nodes {
		to := idA(int32(i))
		if to == "" {
			continue
		}
		for _, ra := range a.ins[i] {
			if ra.kind == vNode {
				note(inA, pair{idA(ra.idx), to})
			}
		}
	}
	for j := range b.nodes {
		to := idB(int32(j))
		if to == "" {
			continue
		}
		for _, rb := range b.ins[j] {
			if rb.kind == vNode {
				note(inB, pair{idB(rb.idx), to})
			}
		}
	}
	for _, p := range edgeOrder {
		e := dotEdge{from: p.from, to: p.to, color: colContext}
		switch {
		case inA[p] && !inB[p]:
			e.color, e.dashed = colRemoved, true
		case inB[p] && !inA[p]:
			e.color = colAdded
		}
		d.edges = append(d.edges, e)
	}
}

// buildFlat draws a Result without its matched graphs (decoded from JSON):
// the nodes only, no edges.
func (d *dotGraph) buildFlat(r *Result, opt DOTOptions) {
	maxNodes, only := opt.MaxNodes, opt.Region-1
	drawn := 0
	for g, rg := range r.Regions {
		if only >= 0 && g != only {
			continue
		}
		if collapsedRegion(r, g, false, opt) {
			d.add(regionBox(rg, g))
			drawn++
		}
		for k, n := range rg.Nodes {
			if collapsedRegion(r, g, false, opt) {
				break
			}
			if drawn < maxNodes {
				d.add(d.refNode(fmt.Sprintf("r%d_%d", g, k), n, colRemovedFill, colRemoved, g))
				drawn++
			}
		}
		fn := d.refNode(fmt.Sprintf("f%d", g), rg.Fused, colAddedFill, colAdded, g)
		fn.bold = true
		d.add(fn)
	}
	if only >= 0 {
		return
	}
	for k, n := range r.Nodes.Removed {
		d.add(d.refNode(fmt.Sprintf("a%d", k), n, colRemovedFill, colRemoved, -1))
	}
	for k, n := range r.Nodes.Added {
		d.add(d.refNode(fmt.Sprintf("b%d", k), n, colAddedFill, colAdded, -1))
	}
	for k, n := range r.Nodes.Changed {
		d.add(d.refNode(fmt.Sprintf("m%d", k), n.B, colChangedFill, colChanged, -1))
	}
}

func (d *dotGraph) write(w io.Writer, r *Result) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "digraph \"mokopt_diff\" {\n")
	fmt.Fprintf(bw, "  graph [rankdir=TB, newrank=true, fontname=\"Helvetica\", fontsize=12, labelloc=t, label=\"%s\"];\n",
		dotLines(r.A.File+" -> "+r.B.File, r.Summary.Line))
	fmt.Fprintf(bw, "  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=10, fillcolor=\"%s\", color=\"%s\"];\n", colContextFill, colContext)
	fmt.Fprintf(bw, "  edge [color=\"%s\", arrowsize=0.6];\n", colContext)
	writeNode := func(indent string, id string) {
		n := d.nodes[id]
		extra := ""
		if n.bold {
			extra = ", penwidth=2.5"
		}
		if n.fill == colContextFill {
			extra += fmt.Sprintf(", fontcolor=\"%s\"", "#616161")
		}
		fmt.Fprintf(bw, "%s%s [label=\"%s\", tooltip=\"%s\", fillcolor=\"%s\", color=\"%s\"%s];\n", indent, dotID(id), n.label, n.tooltip, n.fill, n.color, extra)
	}
	for g, ids := range d.clusters {
		if len(ids) == 0 {
			continue // a region not drawn (DOTOptions.Region)
		}
		rg := r.Regions[g]
		fmt.Fprintf(bw, "  subgraph \"cluster_region_%d\" {\n", g)
		fmt.Fprintf(bw, "    id=\"region_%d\";\n", g)
		fmt.Fprintf(bw, "    label=\"%s\";\n", dotLines(fmt.Sprintf("fused region %d: %s", g+1, rg.Fused.Name),
			fmt.Sprintf("%s, %s -> %s", plural(len(rg.Nodes), "node"), plural(len(rg.Initializers), "initializer"), rg.Fused.Op)))
		fmt.Fprintf(bw, "    style=\"rounded,dashed\"; color=\"%s\"; fontcolor=\"%s\"; penwidth=2;\n", colAdded, colAdded)
		for _, id := range ids {
			writeNode("    ", id)
		}
		fmt.Fprintf(bw, "  }\n")
	}
	for _, id := range d.order {
		if d.nodes[id].cluster < 0 {
			writeNode("  ", id)
		}
	}
	if d.note != "" {
		fmt.Fprintf(bw, "  \"note\" [shape=note, style=filled, fillcolor=\"#ffffff\", label=\"%s\"];\n", dotEsc(d.note))
	}
	for _, e := range d.edges {
		style := ""
		if e.dashed {
			style = ", style=dashed"
		}
		fmt.Fprintf(bw, "  %s -> %s [color=\"%s\"%s];\n", dotID(e.from), dotID(e.to), e.color, style)
	}
	fmt.Fprintf(bw, "}\n")
	return bw.Flush()
}

// dotEsc is the one escape of every text written into a double-quoted
// DOT string (ids, labels, tooltips): a name read from a model can neither
// end the string, nor break or restyle its label, nor reach a terminal.
// Control characters and invalid UTF-8 become Printable's visible escapes;
// then ", \, &, < and > become HTML character entities, which Graphviz
// decodes in labels (and SVG output escapes again). The result holds no
// backslash and no quote, so a `\n` written between escaped parts
// (dotLines) is the only line break.
func dotEsc(s string) string { return dotEntities.Replace(Printable(s)) }

var dotEntities = strings.NewReplacer(`&`, "&amp;", `\`, "&#92;", `"`, "&quot;", `<`, "&lt;", `>`, "&gt;")

// dotLines escapes each line and joins them with DOT's line break.
func dotLines(lines ...string) string {
	for i, l := range lines {
		lines[i] = dotEsc(l)
	}
	return strings.Join(lines, `\n`)
}

// dotID is id escaped and quoted, a DOT identifier.
func dotID(id string) string { return `"` + dotEsc(id) + `"` }
