package diff

import (
	"fmt"
	"strings"
)

// entry is one line-item of a report, shared by the text, Markdown and
// HTML renderers.
type entry struct {
	Sign    byte   // '-', '+' or '~'
	What    string // "node", "initializer", "graph input", ...
	Name    string
	Info    string   // short description after the name
	Details []string // sub-lines
}

func (e entry) change() string {
	switch e.Sign {
	case '-':
		return Removed
	case '+':
		return Added
	}
	return Changed
}

func initInfo(t Init) string {
	h := t.SHA256
	if len(h) > 12 {
		h = h[:12]
	}
	return fmt.Sprintf("%s%s sha256:%s", t.DType, formatDims(t.Shape), h)
}

func signOf(change string) byte {
	switch change {
	case Removed:
		return '-'
	case Added:
		return '+'
	}
	return '~'
}

func functionEntries(fs []FunctionChange) []entry {
	var out []entry
	for _, f := range fs {
		out = append(out, entry{Sign: signOf(f.Change), What: "function", Name: f.ID})
	}
	return out
}

func opsetEntries(os []OpsetChange) []entry {
	var out []entry
	for _, o := range os {
		switch {
		case o.Old == 0:
			out = append(out, entry{Sign: '+', What: "opset", Name: o.Domain, Info: fmt.Sprint(o.New)})
		case o.New == 0:
			out = append(out, entry{Sign: '-', What: "opset", Name: o.Domain, Info: fmt.Sprint(o.Old)})
		default:
			out = append(out, entry{Sign: '~', What: "opset", Name: o.Domain, Info: fmt.Sprintf("%d -> %d", o.Old, o.New)})
		}
	}
	return out
}

func metadataEntries(ms []MetadataChange) []entry {
	var out []entry
	for _, m := range ms {
		e := entry{Sign: signOf(m.Change), What: "metadata", Name: m.Key}
		switch m.Change {
		case Removed:
			e.Info = clip(m.Old, 80)
		case Added:
			e.Info = clip(m.New, 80)
		default:
			e.Info = clip(m.Old, 40) + " -> " + clip(m.New, 40)
		}
		out = append(out, e)
	}
	return out
}

func fieldEntries(fs []FieldChange) []entry {
	var out []entry
	for _, f := range fs {
		out = append(out, entry{Sign: '~', What: "model", Name: f.Field, Info: fmt.Sprintf("%s -> %s", f.Old, f.New)})
	}
	return out
}

func clip(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		return s[:n-3] + "..."
	}
	return s
}

// regionExtras lists what came with a region besides its nodes.
func regionExtras(g Region) []entry {
	var out []entry
	for _, t := range g.NewInitializers {
		out = append(out, entry{Sign: '+', What: "initializer", Name: t.Name, Info: initInfo(t)})
	}
	out = append(out, functionEntries(g.Functions)...)
	out = append(out, opsetEntries(g.Opsets)...)
	out = append(out, metadataEntries(g.Metadata)...)
	out = append(out, fieldEntries(g.Model)...)
	return out
}

// provenanceLine says how the provenance record compares with the region.
func provenanceLine(g Region) string {
	p := g.Provenance
	if p == nil {
		return "no provenance record; region inferred from the graph"
	}
	s := fmt.Sprintf("provenance: %s, %s", plural(p.Nodes, "node"), plural(p.Initializers, "initializer"))
	if p.Consistent {
		return s + ", consistent with the diff"
	}
	var parts []string
	add := func(xs []string, what string) {
		if len(xs) > 0 {
			parts = append(parts, fmt.Sprintf("%d %s (%s)", len(xs), what, clip(strings.Join(xs, ", "), 120)))
		}
	}
	add(p.MissingNodes, "recorded nodes not removed here")
	add(p.ExtraNodes, "removed nodes not recorded")
	add(p.MissingInitializers, "recorded initializers not removed here")
	add(p.ExtraInitializers, "removed initializers not recorded")
	return s + ", INCONSISTENT: " + strings.Join(parts, "; ")
}

// otherEntries lists every change outside fused regions.
func otherEntries(r *Result) []entry {
	var out []entry
	for _, n := range r.Nodes.Removed {
		out = append(out, entry{Sign: '-', What: "node", Name: n.Name, Info: n.Op})
	}
	for _, n := range r.Nodes.Added {
		out = append(out, entry{Sign: '+', What: "node", Name: n.Name, Info: n.Op})
	}
	for _, c := range r.Nodes.Changed {
		e := entry{Sign: '~', What: "node", Name: c.B.Name, Info: c.B.Op}
		if c.A.Name != c.B.Name {
			e.Info += fmt.Sprintf(" (was %s)", c.A.Name)
		}
		for _, a := range c.Attributes {
			switch a.Change {
			case Removed:
				e.Details = append(e.Details, fmt.Sprintf("attribute %s removed (was %s)", a.Name, a.Old))
			case Added:
				e.Details = append(e.Details, fmt.Sprintf("attribute %s added: %s", a.Name, a.New))
			default:
				e.Details = append(e.Details, fmt.Sprintf("attribute %s: %s -> %s", a.Name, a.Old, a.New))
			}
		}
		for _, in := range c.Inputs {
			e.Details = append(e.Details, fmt.Sprintf("input %d: %s -> %s", in.Slot, in.Old, in.New))
		}
		out = append(out, e)
	}
	for _, t := range r.Initializers.Removed {
		out = append(out, entry{Sign: '-', What: "initializer", Name: t.Name, Info: initInfo(t)})
	}
	for _, t := range r.Initializers.Added {
		out = append(out, entry{Sign: '+', What: "initializer", Name: t.Name, Info: initInfo(t)})
	}
	for _, c := range r.Initializers.Changed {
		e := entry{Sign: '~', What: "initializer", Name: c.B.Name, Info: initInfo(c.A) + " -> " + initInfo(c.B)}
		if c.A.Name != c.B.Name {
			e.Details = append(e.Details, "was "+c.A.Name)
		}
		out = append(out, e)
	}
	for _, io := range r.IO {
		e := entry{Sign: signOf(io.Change), What: "graph " + io.Kind, Name: fmt.Sprint(io.Index)}
		switch io.Change {
		case Removed:
			e.Info = io.Old
		case Added:
			e.Info = io.New
		default:
			e.Info = fmt.Sprintf("%s: %s -> %s", io.Change, io.Old, io.New)
		}
		out = append(out, e)
	}
	out = append(out, functionEntries(r.Functions)...)
	out = append(out, opsetEntries(r.Opsets)...)
	out = append(out, metadataEntries(r.Metadata)...)
	out = append(out, fieldEntries(r.Model)...)
	return out
}

// opsLine renders an op census: "MatMul 4, Reshape 6".
func opsLine(ops []OpCount) string {
	parts := make([]string, len(ops))
	for i, o := range ops {
		parts[i] = fmt.Sprintf("%s %d", o.Op, o.Count)
	}
	return strings.Join(parts, ", ")
}

// regionTitle is "fused node (op [variant], kind)".
func regionTitle(g Region) string {
	s := g.Fused.Op
	if g.Variant != "" {
		s += " [" + g.Variant + "]"
	}
	if g.Kind != "" {
		s += ", " + g.Kind
	}
	return fmt.Sprintf("%s (%s)", g.Fused.Name, s)
}

// Marks of the provenance column: words, which render in any font.
const (
	provOKMark  = "verified:"
	provBadMark = "WARNING:"
)

// provenanceShort is the provenance column of the region tables.
func provenanceShort(g Region) string {
	p := g.Provenance
	switch {
	case p == nil:
		return "none (inferred)"
	case p.Consistent:
		return fmt.Sprintf("%s %s, %s", provOKMark, plural(p.Nodes, "node"), plural(p.Initializers, "initializer"))
	}
	return fmt.Sprintf("%s inconsistent: records %s, %s", provBadMark, plural(p.Nodes, "node"), plural(p.Initializers, "initializer"))
}
