package diff

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html/template"
	"io"
	"os/exec"
	"strings"
	"time"
)

// Rendering Graphviz. The HTML report embeds an SVG made by the Graphviz
// `dot` program when it is installed (exec.LookPath("dot")); without it the
// report embeds the DOT source with a note. Go libraries were evaluated and
// not used: github.com/goccy/go-graphviz bundles Graphviz compiled to
// WebAssembly (older releases needed cgo) and runs it under wazero, which
// adds megabytes to the binary and start-up time; pure-Go layout packages
// (gonum's graph/encoding/dot only parses and writes DOT, and the small
// layered-layout libraries) do not lay out clusters or render labels the
// way Graphviz does. Shipping the DOT source keeps the binary small and the
// output exact wherever Graphviz exists.

// HTMLOptions control HTMLWith.
type HTMLOptions struct {
	// DotPath is the Graphviz dot program; "" looks it up on PATH.
	DotPath string
	// NoDot skips rendering and embeds the DOT source instead.
	NoDot bool
	// Timeout bounds the dot run (default 2 minutes).
	Timeout time.Duration
	// DOT are the options of the embedded graph. DOT.CollapseRegions 0
	// means DefaultCollapseRegions; < 0 draws every region in full.
	DOT DOTOptions
}

// DefaultCollapseRegions is the region size above which the HTML report's
// graph draws a fused region as one summary box; the region's own graph
// is then in its section, expandable.
const DefaultCollapseRegions = 40

// HTML writes one self-contained HTML page (no scripts, no network): the
// summary, the tables of fused regions and other changes, and the change
// graph as inline SVG rendered by Graphviz dot, or as DOT source when dot
// is not installed.
func HTML(w io.Writer, r *Result) error { return HTMLWith(w, r, HTMLOptions{}) }

// HTMLWith is HTML with options.
func HTMLWith(w io.Writer, r *Result, opt HTMLOptions) error {
	switch {
	case opt.DOT.CollapseRegions == 0:
		opt.DOT.CollapseRegions = DefaultCollapseRegions
	case opt.DOT.CollapseRegions < 0:
		opt.DOT.CollapseRegions = 0
	}
	var dot bytes.Buffer
	if err := DOTWith(&dot, r, opt.DOT); err != nil {
		return err
	}
	page := htmlPage{R: r, Dot: dot.String()}
	if opt.NoDot {
		page.DotNote = "Graph rendering was turned off; the DOT source is below (render it with `dot -Tsvg`)."
	} else if svg, err := RenderSVG(dot.Bytes(), opt.DotPath, opt.Timeout); err != nil {
		page.DotNote = fmt.Sprintf("Graphviz could not render the graph (%v); the DOT source is below (render it with `dot -Tsvg`).", err)
	} else {
		page.SVG = template.HTML(fitSVG(svg))
	}
	for gi, g := range r.Regions {
		rows := []htmlRow{}
		for _, n := range g.Nodes {
			rows = append(rows, htmlRow{Change: Removed, What: "node", Name: n.Name, Info: n.Op})
		}
		for _, t := range g.Initializers {
			rows = append(rows, htmlRow{Change: Removed, What: "initializer", Name: t.Name, Info: initInfo(t)})
		}
		rows = append(rows, htmlRow{Change: Added, What: "node", Name: g.Fused.Name, Info: g.Fused.Op})
		for _, e := range regionExtras(g) {
			rows = append(rows, rowOf(e))
		}
		hr := htmlRegion{N: gi + 1, ID: fmt.Sprintf("table_region_%d", gi), Title: regionTitle(g),
			Region: g, Ops: opsLine(g.Ops), Prov: provenanceLine(g), ProvShort: provenanceShort(g), Rows: rows}
		if page.SVG != "" && opt.DOT.CollapseRegions > 0 && len(g.Nodes) > opt.DOT.CollapseRegions {
			// Collapsed in the overview: its own graph, expandable here.
			var rd bytes.Buffer
			ro := opt.DOT
			ro.Region = gi + 1
			if err := DOTWith(&rd, r, ro); err != nil {
				return err
			}
			if svg, err := RenderSVG(rd.Bytes(), opt.DotPath, opt.Timeout); err == nil {
				hr.SVG = template.HTML(fitSVG(svg))
			}
		}
		page.Regions = append(page.Regions, hr)
	}
	for _, e := range otherEntries(r) {
		page.Others = append(page.Others, rowOf(e))
	}
	return htmlTemplate.Execute(w, page)
}

// fitSVG makes an SVG from Graphviz scale to the page width: the fixed
// width and height of its root element (in points, often thousands) are
// removed, so that its viewBox scales into a box as wide as the page.
func fitSVG(svg []byte) []byte {
	end := bytes.IndexByte(svg, '>')
	if !bytes.HasPrefix(svg, []byte("<svg")) || end < 0 {
		return svg
	}
	head := string(svg[:end])
	for _, attr := range []string{"width", "height"} {
		if i := strings.Index(head, " "+attr+"=\""); i >= 0 {
			if j := strings.IndexByte(head[i+len(attr)+3:], '"'); j >= 0 {
				head = head[:i] + head[i+len(attr)+3+j+1:]
			}
		}
	}
	out := append([]byte(head+` class="fit"`), svg[end:]...)
	return out
}

func rowOf(e entry) htmlRow {
	return htmlRow{Change: e.change(), What: e.What, Name: e.Name, Info: e.Info, Details: e.Details}
}

// RenderSVG runs Graphviz dot (dotPath, or "dot" from PATH) on a DOT
// document and returns the <svg> element, without XML prolog or doctype.
func RenderSVG(dot []byte, dotPath string, timeout time.Duration) ([]byte, error) {
	if dotPath == "" {
		p, err := exec.LookPath("dot")
		if err != nil {
			return nil, errors.New("the Graphviz dot program is not installed")
		}
		dotPath = p
	}
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, dotPath, "-Tsvg")
	cmd.Stdin = bytes.NewReader(dot)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if ctx.Err() != nil {
			msg = "timed out after " + timeout.String()
		}
		return nil, fmt.Errorf("%s: %v %s", dotPath, err, clip(msg, 200))
	}
	svg := out.Bytes()
	if k := bytes.Index(svg, []byte("<svg")); k >= 0 {
		svg = svg[k:]
	} else {
		return nil, errors.New("dot produced no <svg> element")
	}
	return svg, nil
}

type htmlRow struct {
	Change, What, Name, Info string
	Details                  []string
}

type htmlRegion struct {
	N         int
	ID, Title string
	Region    Region
	Ops, Prov string
	ProvShort string
	Rows      []htmlRow
	// SVG is the region's own graph when the overview collapses it.
	SVG template.HTML
}

type htmlPage struct {
	R       *Result
	Regions []htmlRegion
	Others  []htmlRow
	SVG     template.HTML
	Dot     string
	DotNote string
}

var htmlTemplate = template.Must(template.New("diff").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>mokopt diff: {{.R.A.File}} → {{.R.B.File}}</title>
<style>
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
code, td.name { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 0.9em; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f5f5f5; }
tr.removed td:first-child { color: #c62828; } tr.added td:first-child { color: #2e7d32; } tr.changed td:first-child { color: #b28704; }
.summary { font-weight: bold; font-size: 1.05em; }
.graph { overflow: auto; border: 1px solid #ddd; padding: 0.5em; }
svg.fit { width: 100%; height: auto; max-height: 85vh; }
.prov-ok::before { content: ""; display: inline-block; width: 0.35em; height: 0.7em; margin: 0 0.4em 0.1em 0.1em; border: solid #2e7d32; border-width: 0 0.18em 0.18em 0; transform: rotate(45deg); }
.prov-bad { color: #c62828; font-weight: bold; }
.note { background: #fff8e1; border: 1px solid #f9a825; padding: 0.5em; }
pre { background: #f7f7f7; padding: 0.5em; overflow: auto; max-height: 40vh; }
</style>
</head>
<body>
<h1>mokopt diff</h1>
<p><code>{{.R.A.File}}</code> ({{.R.A.Nodes}} nodes) → <code>{{.R.B.File}}</code> ({{.R.B.Nodes}} nodes)</p>
<p class="summary">{{.R.Summary.Line}}</p>
{{if .Regions}}
<h2>Fused regions</h2>
<table>
<tr><th>#</th><th>Fused node</th><th>Op</th><th>Variant</th><th>Kind</th><th>Nodes replaced</th><th>Initializers replaced</th><th>New initializers</th><th>Provenance</th></tr>
{{range .Regions}}<tr><td><a href="#{{.ID}}">{{.N}}</a></td><td class="name">{{.Region.Fused.Name}}</td><td>{{.Region.Fused.Op}}</td><td><code>{{.Region.Variant}}</code></td><td>{{.Region.Kind}}</td><td>{{len .Region.Nodes}}</td><td>{{len .Region.Initializers}}</td><td>{{len .Region.NewInitializers}}</td><td>{{if and .Region.Provenance .Region.Provenance.Consistent}}<span class="prov-ok">{{.ProvShort}}</span>{{else if .Region.Provenance}}<span class="prov-bad">{{.ProvShort}}</span>{{else}}{{.ProvShort}}{{end}}</td></tr>
{{end}}</table>
{{end}}
<h2>Graph</h2>
{{if .SVG}}<div class="graph">{{.SVG}}</div>
{{else}}<p class="note">{{.DotNote}}</p>
<pre>{{.Dot}}</pre>
{{end}}
{{range .Regions}}
<h2 id="{{.ID}}">Fused region {{.N}}: {{.Title}}</h2>
<p>{{.Prov}}</p>
{{if .Ops}}<p>Ops: {{.Ops}}</p>{{end}}
{{if .SVG}}<details><summary>Graph of the {{len .Region.Nodes}} replaced nodes (collapsed to one box above)</summary>
<div class="graph">{{.SVG}}</div>
</details>
{{end}}<details><summary>{{len .Rows}} entries</summary>
<table>
<tr><th>Change</th><th>What</th><th>Name</th><th>Details</th></tr>
{{range .Rows}}<tr class="{{.Change}}"><td>{{.Change}}</td><td>{{.What}}</td><td class="name">{{.Name}}</td><td>{{.Info}}{{range .Details}}<br>{{.}}{{end}}</td></tr>
{{end}}</table>
</details>
{{end}}
<h2>Other changes</h2>
{{if .Others}}<table>
<tr><th>Change</th><th>What</th><th>Name</th><th>Details</th></tr>
{{range .Others}}<tr class="{{.Change}}"><td>{{.Change}}</td><td>{{.What}}</td><td class="name">{{.Name}}</td><td>{{.Info}}{{range .Details}}<br>{{.}}{{end}}</td></tr>
{{end}}</table>
{{else}}<p>None.</p>{{end}}
{{if .R.Warnings}}<h2>Warnings</h2><ul>{{range .R.Warnings}}<li>{{.}}</li>{{end}}</ul>{{end}}
</body>
</html>
`))
