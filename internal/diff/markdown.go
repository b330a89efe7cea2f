package diff

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// mdCode renders s as inline code safe inside a GitHub table cell.
func mdCode(s string) string {
	s = strings.NewReplacer("`", "'", "|", `\|`, "\n", " ", "\r", " ").Replace(s)
	if s == "" {
		return ""
	}
	return "`" + s + "`"
}

// mdText escapes s for a GitHub table cell outside code.
func mdText(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ", "\r", " ", "<", "&lt;", ">", "&gt;", "*", `\*`, "_", `\_`, "`", "'").Replace(s)
}

// Markdown writes a report for pull-request comments: the summary, a table
// of fused regions (with collapsible node lists), then a table of other
// changes.
func Markdown(w io.Writer, r *Result) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "### mokopt diff\n\n%s → %s\n\n**%s**\n\n", mdCode(r.A.File), mdCode(r.B.File), mdText(r.Summary.Line))
	if len(r.Regions) > 0 {
		fmt.Fprintf(bw, "#### Fused regions\n\n")
		fmt.Fprintf(bw, "| # | Fused node | Op | Variant | Kind | Nodes replaced | Initializers replaced | New initializers | Provenance |\n")
		fmt.Fprintf(bw, "|---:|---|---|---|---|---:|---:|---:|---|\n")
		for i, g := range r.Regions {
			prov := provenanceShort(g)
			fmt.Fprintf(bw, "| %d | %s | %s | %s | %s | %d | %d | %d | %s |\n", i+1, mdCode(g.Fused.Name), mdCode(g.Fused.Op),
				mdCode(g.Variant), mdText(g.Kind), len(g.Nodes), len(g.Initializers), len(g.NewInitializers), prov)
		}
		fmt.Fprintln(bw)
		for i, g := range r.Regions {
			fmt.Fprintf(bw, "<details><summary>Region %d: %s — %d nodes, %d initializers</summary>\n\n",
				i+1, htmlEscape(g.Fused.Name), len(g.Nodes), len(g.Initializers))
			fmt.Fprintf(bw, "%s\n\n", mdText(provenanceLine(g)))
			if len(g.Ops) > 0 {
				fmt.Fprintf(bw, "Ops: %s\n\n", mdText(opsLine(g.Ops)))
			}
			fmt.Fprintf(bw, "| Change | What | Name | Details |\n|---|---|---|---|\n")
			for _, n := range g.Nodes {
				fmt.Fprintf(bw, "| removed | node | %s | %s |\n", mdCode(n.Name), mdCode(n.Op))
			}
			for _, t := range g.Initializers {
				fmt.Fprintf(bw, "| removed | initializer | %s | %s |\n", mdCode(t.Name), mdCode(initInfo(t)))
			}
			fmt.Fprintf(bw, "| added | node | %s | %s |\n", mdCode(g.Fused.Name), mdCode(g.Fused.Op))
			for _, e := range regionExtras(g) {
				mdEntry(bw, e)
			}
			fmt.Fprintf(bw, "\n</details>\n\n")
		}
	}
	fmt.Fprintf(bw, "#### Other changes\n\n")
	others := otherEntries(r)
	if len(others) == 0 {
		fmt.Fprintf(bw, "None.\n")
	} else {
		fmt.Fprintf(bw, "| Change | What | Name | Details |\n|---|---|---|---|\n")
		for _, e := range others {
			mdEntry(bw, e)
		}
	}
	if len(r.Warnings) > 0 {
		fmt.Fprintf(bw, "\n#### Warnings\n\n")
		for _, s := range r.Warnings {
			fmt.Fprintf(bw, "- %s\n", mdText(s))
		}
	}
	return bw.Flush()
}

func mdEntry(w io.Writer, e entry) {
	details := []string{}
	if e.Info != "" {
		details = append(details, mdCode(e.Info))
	}
	for _, d := range e.Details {
		details = append(details, mdText(d))
	}
	fmt.Fprintf(w, "| %s | %s | %s | %s |\n", e.change(), e.What, mdCode(e.Name), strings.Join(details, "<br>"))
}

func htmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
