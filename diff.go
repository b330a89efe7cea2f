package mokopt

import (
	"fmt"
	"io"

	"github.com/mokopt/mokopt/internal/diff"
)

// DiffResult is a structural comparison of model A (old) with model B
// (new): Same() reports whether they are equivalent, WriteDiff renders
// it. Its fields (docs/diff-schema.md gives their JSON key by key):
//
//   - SchemaVersion: 1.
//   - A, B: the two models (file, node and initializer counts).
//   - Summary: the counts and the one-line summary.
//   - Regions: per fused node of B, the part of A it replaced (nodes,
//     initializers, the fused node's spec); what a region explains is
//     reported there and nowhere else.
//   - Nodes, Initializers: the other node and initializer changes
//     (removed, added, changed, renamed).
//   - IO: changes of graph inputs and outputs, by position.
//   - Functions, Opsets, Metadata: model-local functions, opset_import
//     and metadata_props entries added, removed or changed.
//   - Model: changed model-level fields (ir_version, producer, ...).
//   - Warnings: notes on the comparison itself.
type DiffResult = diff.Result

// Diff compares model a (old) with model b (new) by structure, not by
// names, and explains each fused ai.mok::MoE node of b by the region of a
// it replaced. DiffResult.Same reports whether they are equivalent.
func Diff(a, b *Model) (*DiffResult, error) { return diff.Compare(a.g, b.g) }

// Formats of WriteDiff, the values of `mokopt diff --format`.
const (
	DiffText     = "text"
	DiffJSON     = "json"
	DiffMarkdown = "markdown"
	DiffDOT      = "dot"
	DiffHTML     = "html"
)

// DiffWriteOptions control WriteDiff.
type DiffWriteOptions struct {
	// Format is one of DiffText (the default, ""), DiffJSON, DiffMarkdown,
	// DiffDOT or DiffHTML.
	Format string
	// Stat writes counts only (DiffText and DiffJSON).
	Stat bool
	// Color colours DiffText with ANSI escapes.
	Color bool
	// Verbose lists every node of every fused region (DiffText).
	Verbose bool
}

// WriteDiff renders r to w as `mokopt diff` does. An option the format
// does not use is refused.
func WriteDiff(w io.Writer, r *DiffResult, opt DiffWriteOptions) error {
	text := opt.Format == "" || opt.Format == DiffText
	switch {
	case opt.Stat && !text && opt.Format != DiffJSON:
		return fmt.Errorf("diff: Stat works with the text or json format, not %s", opt.Format)
	case (opt.Color || opt.Verbose) && !text:
		return fmt.Errorf("diff: Color and Verbose are for the text format, not %s", opt.Format)
	}
	switch {
	case opt.Stat && opt.Format == DiffJSON:
		return diff.JSONStat(w, r)
	case opt.Stat:
		return diff.Stat(w, r)
	case text:
		return diff.TextWith(w, r, diff.TextOptions{Color: opt.Color, Verbose: opt.Verbose})
	case opt.Format == DiffJSON:
		return diff.JSON(w, r)
	case opt.Format == DiffMarkdown || opt.Format == "md":
		return diff.Markdown(w, r)
	case opt.Format == DiffDOT:
		return diff.DOT(w, r)
	case opt.Format == DiffHTML:
		return diff.HTML(w, r)
	}
	return fmt.Errorf("diff: unknown format %q (want text, json, markdown, dot or html)", opt.Format)
}
