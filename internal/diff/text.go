package diff

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// TextOptions control TextWith.
type TextOptions struct {
	// Color adds ANSI colours (red removed, green added, yellow changed).
	Color bool
	// Verbose lists every node of every fused region; otherwise the first
	// MaxRegionNodes are listed and the rest counted.
	Verbose bool
	// MaxRegionNodes defaults to 12.
	MaxRegionNodes int
}

const (
	ansiReset  = "\x1b[0m"
	ansiBold   = "\x1b[1m"
	ansiRed    = "\x1b[31m"
	ansiGreen  = "\x1b[32m"
	ansiYellow = "\x1b[33m"
	ansiCyan   = "\x1b[36m"
	ansiDim    = "\x1b[2m"
)

// Text writes the human-readable report: the summary line, each fused
// region with what it replaced, then every other change.
func Text(w io.Writer, r *Result, color bool) error {
	return TextWith(w, r, TextOptions{Color: color})
}

// TextWith is Text with options.
func TextWith(w io.Writer, r *Result, opt TextOptions) error {
	if opt.MaxRegionNodes <= 0 {
		opt.MaxRegionNodes = 12
	}
	bw := bufio.NewWriter(w)
	paint := func(code, s string) string {
		if !opt.Color {
			return s
		}
		return code + s + ansiReset
	}
	signColor := map[byte]string{'-': ansiRed, '+': ansiGreen, '~': ansiYellow}
	line := func(indent string, e entry) {
		// Names come from the models: escaped, they cannot forge lines.
		s := fmt.Sprintf("%s%c %s %s", indent, e.Sign, e.What, Printable(e.Name))
		if e.Info != "" {
			s += "  " + Printable(e.Info)
		}
		fmt.Fprintln(bw, paint(signColor[e.Sign], s))
		for _, d := range e.Details {
			fmt.Fprintln(bw, indent+"    "+Printable(d))
		}
	}
	fmt.Fprintln(bw, paint(ansiBold, fmt.Sprintf("--- %s\n+++ %s", Printable(r.A.File), Printable(r.B.File))))
	fmt.Fprintln(bw, paint(ansiBold, Printable(r.Summary.Line)))
	for gi, g := range r.Regions {
		fmt.Fprintln(bw)
		fmt.Fprintln(bw, paint(ansiCyan+ansiBold, fmt.Sprintf("fused region %d/%d: %s", gi+1, len(r.Regions), Printable(regionTitle(g)))))
		fmt.Fprintf(bw, "  replaced %s, %s", plural(len(g.Nodes), "node"), plural(len(g.Initializers), "initializer"))
		if len(g.Ops) > 0 {
			fmt.Fprintf(bw, "; ops: %s", Printable(opsLine(g.Ops)))
		}
		fmt.Fprintln(bw)
		fmt.Fprintln(bw, paint(ansiDim, "  "+Printable(provenanceLine(g))))
		for i, n := range g.Nodes {
			if !opt.Verbose && i == opt.MaxRegionNodes {
				fmt.Fprintln(bw, paint(ansiRed, fmt.Sprintf("  - ... %d more nodes (--verbose or --format json lists all)", len(g.Nodes)-i)))
				break
			}
			line("  ", entry{Sign: '-', What: "node", Name: n.Name, Info: n.Op})
		}
		for _, t := range g.Initializers {
			line("  ", entry{Sign: '-', What: "initializer", Name: t.Name, Info: initInfo(t)})
		}
		line("  ", entry{Sign: '+', What: "node", Name: g.Fused.Name, Info: g.Fused.Op})
		for _, e := range regionExtras(g) {
			line("  ", e)
		}
	}
	if others := otherEntries(r); len(others) > 0 {
		fmt.Fprintln(bw)
		fmt.Fprintln(bw, paint(ansiBold, "other changes:"))
		for _, e := range others {
			line("  ", e)
		}
	}
	if len(r.Warnings) > 0 {
		fmt.Fprintln(bw)
		fmt.Fprintln(bw, paint(ansiBold, "warnings:"))
		for _, s := range r.Warnings {
			fmt.Fprintln(bw, "  "+Printable(s))
		}
	}
	return bw.Flush()
}

// Stat writes the counts only.
func Stat(w io.Writer, r *Result) error {
	s := r.Summary
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", Printable(s.Line))
	newInits := 0
	for _, g := range r.Regions {
		newInits += len(g.NewInitializers)
	}
	fmt.Fprintf(&b, "fused regions:  %d (%s, %s replaced; %s new)\n", s.FusedRegions,
		plural(s.RegionNodes, "node"), plural(s.RegionInitializers, "initializer"), plural(newInits, "initializer"))
	fmt.Fprintf(&b, "nodes:          %d removed, %d added, %d changed (%d matched, %d renamed)\n",
		s.NodesRemoved, s.NodesAdded, s.NodesChanged, s.NodesMatched, s.RenamedNodes)
	fmt.Fprintf(&b, "initializers:   %d removed, %d added, %d changed (%d renamed)\n",
		s.InitializersRemoved, s.InitializersAdded, s.InitializersChanged, s.RenamedInitializers)
	fmt.Fprintf(&b, "graph I/O:      %d changes\n", len(r.IO))
	fmt.Fprintf(&b, "model:          %d function, %d opset, %d metadata, %d field changes\n",
		len(r.Functions), len(r.Opsets), len(r.Metadata), len(r.Model))
	_, err := io.WriteString(w, b.String())
	return err
}

// JSON writes the whole Result as indented JSON (schema in docs/diff-schema.md).
func JSON(w io.Writer, r *Result) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// JSONStat writes the counts only: schema_version, a, b and summary.
func JSONStat(w io.Writer, r *Result) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		SchemaVersion int       `json:"schema_version"`
		A             ModelInfo `json:"a"`
		B             ModelInfo `json:"b"`
		Summary       Summary   `json:"summary"`
	}{r.SchemaVersion, r.A, r.B, r.Summary})
}
