package diff

import (
	"bytes"
	"html"
	"os/exec"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/internal/testtools"
)

// hostileNames are node names a model may hold that would end a DOT
// string, add lines or attributes, or act on a terminal.
var hostileNames = []string{
	`plain/name`,
	`quote " inside`,
	`"];  evil [label="x`,
	`trailing backslash \`,
	`\" escaped quote`,
	`\\"`,
	"new\nline",
	"cr\rlf",
	"tab\tbel\aesc\x1b[31m",
	"nul\x00byte",
	`<b>html</b>`,
	`<<TABLE>>`,
	`&amp; &#92; entity`,
	`\N \G \L \l`,
	"invalid \xff utf-8",
	"bidi \u202e override",
}

// TestDOTEscape: dotEsc leaves no quote, backslash, control character or
// angle bracket in what it writes, and loses nothing (decoding the
// entities gives the Printable name back).
func TestDOTEscape(t *testing.T) {
	for _, name := range hostileNames {
		got := dotEsc(name)
		if strings.ContainsAny(got, "\"\\<>") || strings.IndexFunc(got, needsEscape) >= 0 {
			t.Errorf("dotEsc(%q) = %q", name, got)
		}
		if back := html.UnescapeString(got); back != Printable(name) {
			t.Errorf("dotEsc(%q) decodes to %q, want %q", name, back, Printable(name))
		}
	}
}

// TestDOTHostileNamesRender: a graph whose ids and labels are the hostile
// names is valid DOT for Graphviz, with one node per name (none forged),
// each labelled with the name as Printable shows it.
func TestDOTHostileNamesRender(t *testing.T) {
	dot := testtools.Dot(t)
	var src strings.Builder
	src.WriteString("digraph g {\n")
	for i, n := range hostileNames {
		src.WriteString("  " + dotID(n) + ` [label="` + dotLines("op", n) + `", tooltip="` + dotEsc(n) + `"];` + "\n")
		if i > 0 {
			src.WriteString("  " + dotID(hostileNames[i-1]) + " -> " + dotID(n) + ";\n")
		}
	}
	src.WriteString("}\n")
	cmd := exec.Command(dot, "-Tsvg")
	cmd.Stdin = strings.NewReader(src.String())
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil || stderr.Len() > 0 {
		t.Fatalf("dot: %v: %s\n%s", err, stderr.String(), src.String())
	}
	svg := out.String()
	// Graphviz writes a run of spaces as space, no-break space.
	shown := strings.ReplaceAll(html.UnescapeString(svg), "\u00a0", " ")
	if n := strings.Count(svg, `class="node"`); n != len(hostileNames) {
		t.Errorf("%d nodes drawn, want %d", n, len(hostileNames))
	}
	for _, n := range hostileNames {
		if !strings.Contains(shown, Printable(n)) {
			t.Errorf("the SVG does not show %q", Printable(n))
		}
	}
}
