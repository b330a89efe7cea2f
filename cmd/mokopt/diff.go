package main

import (
	"bytes"
	"fmt"
	"io"
	"os"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/graph"
	"github.com/spf13/cobra"
)

func init() { subcommands = append(subcommands, newDiffCmd) }

func newDiffCmd() *cobra.Command {
	var format, out, color string
	var stat, verbose, asJSON bool
	c := &cobra.Command{
		Use:   "diff A B",
		Short: "Compare two models structurally; explain fused regions",
		Long: `diff compares model A (old) with model B (new) by structure, not by names:
nodes are matched by op, attributes and what feeds them (anchored on graph
inputs and outputs by position, initializers by content), so renamed but
identical graphs compare equal. Each fused ai.mok::MoE node of B is reported
with the region of A it replaced (checked against B's provenance record when
present); everything else is listed as removed, added or changed.

Formats: text (default; coloured on a terminal), json (schema in docs/diff-schema.md),
markdown (for pull-request comments), dot (Graphviz), html (one self-contained
page; the graph is rendered with Graphviz dot when it is installed).

Exit codes like diff(1): 0 the models are the same, 1 they differ, 2 error.`,
		Args: cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			if asJSON {
				// --json is --format json, as every other command spells it.
				if c.Flags().Changed("format") && format != "json" {
					return usageErr(fmt.Errorf("--json and --format %s disagree", format))
				}
				format = "json"
			}
			switch format {
			case "text", "json", "markdown", "md", "dot", "html":
			default:
				return usageErr(fmt.Errorf("unknown --format %q (want text, json, markdown, dot or html)", format))
			}
			if stat && format != "text" && format != "json" {
				return usageErr(fmt.Errorf("--stat works with --format text or json, not %s", format))
			}
			if color != "auto" && color != "always" && color != "never" {
				return usageErr(fmt.Errorf("unknown --color %q (want auto, always or never)", color))
			}
			a, b, err := loadPair(args)
			if err != nil {
				return err
			}
			defer a.Close()
			defer b.Close()
			if err := checkSameFiles(modelInputs(a, b), []outFile{{out, "the -o file", false}}, false); err != nil {
				return err
			}
			r, err := mokopt.Diff(a, b)
			if err != nil {
				// Any failure to compare is an error (exit 2), as in diff(1).
				return &exitError{code: 2, msg: err.Error(), err: err}
			}
			var buf bytes.Buffer
			w := io.Writer(&buf)
			if out == mokopt.Stdio {
				out = "" // -o - is standard output, the default
			}
			useColor := color == "always" || color == "auto" && out == "" && os.Getenv("NO_COLOR") == "" && isTerminal(c.OutOrStdout())
			err = mokopt.WriteDiff(w, r, mokopt.DiffWriteOptions{Format: format, Stat: stat, Color: useColor && format == mokopt.DiffText && !stat, Verbose: verbose})
			if err != nil {
				return &exitError{code: 2, msg: err.Error(), err: err}
			}
			if out != "" {
				if err := graph.WriteFileAtomic(out, buf.Bytes()); err != nil {
					return &exitError{code: 2, msg: err.Error(), err: err}
				}
			} else if _, err := outFor(c, useColor).Write(buf.Bytes()); err != nil {
				return &exitError{code: 2, msg: err.Error(), err: err}
			}
			if !r.Same() {
				return &exitError{code: 1}
			}
			return nil
		},
	}
	c.Flags().StringVar(&format, "format", "text", "output format: text, json, markdown, dot or html")
	c.Flags().BoolVar(&asJSON, "json", false, "the same as --format json")
	c.Flags().BoolVar(&stat, "stat", false, "print counts only")
	c.Flags().StringVarP(&out, "output", "o", "", "write the report to this file instead of stdout")
	c.Flags().StringVar(&color, "color", "auto", "colour text output: auto (on a terminal, unless NO_COLOR is set), always or never")
	c.Flags().BoolVarP(&verbose, "verbose", "v", false, "text: list every node of every fused region")
	return c
}

// isTerminal reports whether w is a character device (a terminal).
// outFor is where diff writes to standard output: the raw stream for its
// own colours (names are escaped by the diff itself), else the escaping one.
func outFor(c *cobra.Command, color bool) io.Writer {
	if color {
		return raw(c.OutOrStdout())
	}
	return c.OutOrStdout()
}

func isTerminal(w io.Writer) bool {
	f, ok := raw(w).(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
