package diff

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/testtools"
	"google.golang.org/protobuf/proto"
)

// rewriteDiff diffs a fixture against its rewrite.
func rewriteDiff(t *testing.T, name string) *Result {
	t.Helper()
	path := fixture(t, name)
	b, _, ok := rewritten(t, path)
	if !ok {
		t.Skipf("%s does not rewrite", name)
	}
	r, err := Compare(load(t, path), b)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// syntheticDiff has one changed, one removed and one added node and a
// fused region, so every colour of the graph is used.
func syntheticDiff(t *testing.T) *Result {
	t.Helper()
	gb := mlp()
	fuse(gb)
	graph.Attr(nodeNamed(gb, "sm"), "axis").I = proto.Int64(0)
	gb.Node = append(gb.Node, graph.NewNode("Identity", "", "extra \"quoted\" \\ name", []string{"y"}, []string{"y2"}))
	gb.Output = append(gb.Output, tensorValue("y2", pb.TensorProto_FLOAT, 2, 2))
	r, err := Compare(modelOf(t, mlp(), nil), modelOf(t, gb, nil))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestDOT renders the change graph and, when Graphviz is installed, runs
// dot -Tsvg on it: it must parse and hold one cluster per fused region.
func TestDOT(t *testing.T) {
	cases := []struct {
		name     string
		result   func(t *testing.T) *Result
		opt      DOTOptions
		clusters int
		contains []string
	}{
		{"two layers", func(t *testing.T) *Result { return rewriteDiff(t, "mixtral_full_dynamo_batched_mm.onnx") }, DOTOptions{}, 2,
			[]string{colRemoved, colAdded, colContextFill, "ai.mok::MoE"}},
		{"large unrolled block", func(t *testing.T) *Result { return rewriteDiff(t, "mixtral_block_torchscript.onnx") }, DOTOptions{}, 1, nil},
		{"collapsed", func(t *testing.T) *Result { return rewriteDiff(t, "mixtral_full_dynamo_batched_mm.onnx") }, DOTOptions{MaxNodes: 10}, 2,
			[]string{"31 nodes, 3 initializers replaced"}},
		{"synthetic", syntheticDiff, DOTOptions{}, 1, []string{colChangedFill, colRemoved, `extra &quot;quoted&quot; &#92; name`}},
	}
	dotBin, dotErr := exec.LookPath("dot")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.result(t)
			var buf bytes.Buffer
			if err := DOTWith(&buf, r, tc.opt); err != nil {
				t.Fatal(err)
			}
			src := buf.String()
			for g := 0; g < tc.clusters; g++ {
				if !strings.Contains(src, `subgraph "cluster_region_`+string(rune('0'+g))+`"`) {
					t.Errorf("no cluster for region %d", g)
				}
			}
			for _, s := range tc.contains {
				if !strings.Contains(src, s) {
					t.Errorf("DOT lacks %q", s)
				}
			}
			if dotErr != nil {
				testtools.Missing(t, "dot", "apt-get install graphviz", dotErr)
			}
			cmd := exec.Command(dotBin, "-Tsvg")
			cmd.Stdin = strings.NewReader(src)
			var out, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &stderr
			if err := cmd.Run(); err != nil || stderr.Len() > 0 {
				t.Fatalf("dot -Tsvg: %v %s\n%s", err, stderr.String(), src)
			}
			svg := out.String()
			for g := 0; g < tc.clusters; g++ {
				id := string(rune('0' + g))
				if !strings.Contains(svg, `<title>cluster_region_`+id+`</title>`) || !strings.Contains(svg, `id="region_`+id+`"`) {
					t.Errorf("SVG has no group for cluster %s", id)
				}
			}
		})
	}
}

// TestHTMLChromium renders the HTML report in headless Chromium and checks
// that the live DOM holds the SVG group of each fused region's cluster.
func TestHTMLChromium(t *testing.T) {
	chromium := testtools.NeedChromium(t)
	testtools.Dot(t)
	r := rewriteDiff(t, "mixtral_full_dynamo_batched_mm.onnx")
	dir := t.TempDir()
	page := filepath.Join(dir, "diff.html")
	var buf bytes.Buffer
	if err := HTML(&buf, r); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(page, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+filepath.Join(dir, "profile"), "--dump-dom", "file://"+page)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	dom := out.String()
	// The cluster's <g> element as the browser parsed it: id, class and title.
	for _, id := range []string{"0", "1"} {
		re := regexp.MustCompile(`<g id="region_` + id + `" class="cluster">\s*<title>cluster_region_` + id + `</title>`)
		if !re.MatchString(dom) {
			t.Errorf("DOM has no SVG group for cluster region_%s", id)
		}
	}
	for _, s := range []string{"<svg", "m.model.layers.0.mlp/MoE", "Fused regions", htmlEscape(r.Summary.Line)} {
		if !strings.Contains(dom, s) {
			t.Errorf("DOM lacks %q", s)
		}
	}
}

// TestHTMLSelfContained checks both HTML forms (rendered SVG, and DOT
// source when rendering is off) for scripts and remote resources.
func TestHTMLSelfContained(t *testing.T) {
	r := syntheticDiff(t)
	cases := []struct {
		name string
		opt  HTMLOptions
		want []string
	}{
		{"no dot", HTMLOptions{NoDot: true}, []string{"<pre>digraph", "DOT source", "cluster_region_0"}},
		{"missing dot", HTMLOptions{DotPath: filepath.Join(t.TempDir(), "no-such-dot")}, []string{"<pre>digraph", "could not render"}},
		{"rendered", HTMLOptions{}, []string{"<svg", `id="region_0"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "rendered" {
				testtools.Dot(t)
			}
			var buf bytes.Buffer
			if err := HTMLWith(&buf, r, tc.opt); err != nil {
				t.Fatal(err)
			}
			page := buf.String()
			for _, s := range tc.want {
				if !strings.Contains(page, s) {
					t.Errorf("page lacks %q", s)
				}
			}
			for _, bad := range []string{"<script", `src="http`, `href="http`, "@import", "url(http"} {
				if strings.Contains(page, bad) {
					t.Errorf("page is not self-contained: has %q", bad)
				}
			}
			if !strings.Contains(page, "extra &#34;quoted&#34;") && !strings.Contains(page, "extra &quot;quoted&quot;") {
				t.Errorf("node name not escaped in the tables")
			}
		})
	}
}

// TestFormats checks the text, JSON, Markdown and stat renderers.
func TestFormats(t *testing.T) {
	r := syntheticDiff(t)
	same, err := Compare(modelOf(t, mlp(), nil), modelOf(t, mlp(), nil))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		r       *Result
		render  func(w *bytes.Buffer, r *Result) error
		want    []string
		notWant []string
	}{
		{"text", r, func(w *bytes.Buffer, r *Result) error { return Text(w, r, false) },
			[]string{r.Summary.Line, "fused region 1/1: fused/MoE", "~ node sm", "attribute axis: -1 -> 0", "+ node extra", "- node add1"}, []string{"\x1b["}},
		{"text colour", r, func(w *bytes.Buffer, r *Result) error { return Text(w, r, true) },
			[]string{ansiRed + "  - node add1", ansiGreen, ansiYellow}, nil},
		{"text same", same, func(w *bytes.Buffer, r *Result) error { return Text(w, r, false) },
			[]string{"no differences"}, []string{"other changes"}},
		{"markdown", r, func(w *bytes.Buffer, r *Result) error { return Markdown(w, r) },
			[]string{"| # | Fused node |", "| 1 | `fused/MoE` |", "#### Other changes", "| changed | node | `sm` |", "<details>"}, nil},
		{"markdown same", same, func(w *bytes.Buffer, r *Result) error { return Markdown(w, r) },
			[]string{"**no differences**", "None."}, []string{"Fused regions"}},
		{"stat", r, func(w *bytes.Buffer, r *Result) error { return Stat(w, r) },
			[]string{"fused regions:  1 (2 nodes, 1 initializer replaced; 1 initializer new)", "nodes:          0 removed, 1 added, 1 changed"}, []string{"add1"}},
		{"json stat", r, func(w *bytes.Buffer, r *Result) error { return JSONStat(w, r) },
			[]string{`"schema_version": 1`, `"summary"`, `"nodes_changed": 1`}, []string{`"fused_regions": [`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := tc.render(&buf, tc.r); err != nil {
				t.Fatal(err)
			}
			out := buf.String()
			for _, s := range tc.want {
				if !strings.Contains(out, s) {
					t.Errorf("output lacks %q:\n%s", s, out)
				}
			}
			for _, s := range tc.notWant {
				if strings.Contains(out, s) {
					t.Errorf("output has %q:\n%s", s, out)
				}
			}
		})
	}
}

// TestJSONSchema checks the JSON document against docs/diff-schema.md: it decodes
// back into a Result, has schema_version 1, and every key it uses (at any
// depth) is documented.
func TestJSONSchema(t *testing.T) {
	doc, err := os.ReadFile("../../docs/diff-schema.md")
	if err != nil {
		t.Fatal(err)
	}
	results := map[string]*Result{"synthetic": syntheticDiff(t)}
	if files, _ := filepath.Glob(filepath.Join(fixtureDir, "*.onnx")); len(files) > 0 {
		results["rewrite"] = rewriteDiff(t, "mixtral_full_dynamo_batched_mm.onnx")
	}
	for name, r := range results {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := JSON(&buf, r); err != nil {
				t.Fatal(err)
			}
			var back Result
			if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
				t.Fatal(err)
			}
			if back.SchemaVersion != 1 || back.Summary.Line != r.Summary.Line || len(back.Regions) != len(r.Regions) {
				t.Errorf("round trip lost data: %+v", back.Summary)
			}
			var generic any
			if err := json.Unmarshal(buf.Bytes(), &generic); err != nil {
				t.Fatal(err)
			}
			keys := map[string]bool{}
			collectKeys(generic, keys)
			var missing []string
			for k := range keys {
				if !bytes.Contains(doc, []byte("`"+k+"`")) {
					missing = append(missing, k)
				}
			}
			sort.Strings(missing)
			if len(missing) > 0 {
				t.Errorf("keys not documented in docs/diff-schema.md: %v", missing)
			}
			// A Result decoded from JSON still renders as DOT (without edges).
			var dot bytes.Buffer
			if err := DOT(&dot, &back); err != nil || !strings.Contains(dot.String(), "cluster_region_0") {
				t.Errorf("DOT of a decoded result: %v", err)
			}
		})
	}
}

func collectKeys(v any, keys map[string]bool) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			keys[k] = true
			collectKeys(e, keys)
		}
	case []any:
		for _, e := range x {
			collectKeys(e, keys)
		}
	}
}
