package diff

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/internal/testtools"
)

// TestDOTCollapseAndRegion: a region above CollapseRegions is one summary
// box; DOTOptions.Region draws that region alone, in full.
func TestDOTCollapseAndRegion(t *testing.T) {
	r := rewriteDiff(t, "mixtral_block_torchscript.onnx")
	n := len(r.Regions[0].Nodes)
	if n <= 40 {
		t.Fatalf("the unrolled region has %d nodes; the test wants one above 40", n)
	}
	nodeLine := regexp.MustCompile(`(?m)^\s+"[abmr]\d+(_\d+)?" \[label=`)
	cases := []struct {
		name     string
		opt      DOTOptions
		minNodes int
		maxNodes int
		want     []string
		wantNot  []string
	}{
		{"full", DOTOptions{}, n + 1, 1 << 30, nil, []string{"initializers replaced"}},
		{"collapsed above 40", DOTOptions{CollapseRegions: 40}, 2, 2 + 40, []string{"initializers replaced"}, nil},
		{"kept below its size", DOTOptions{CollapseRegions: n}, n + 1, 1 << 30, nil, []string{"initializers replaced"}},
		{"region alone", DOTOptions{Region: 1, CollapseRegions: 40}, n + 1, n + 1, nil, []string{"initializers replaced"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := DOTWith(&buf, r, tc.opt); err != nil {
				t.Fatal(err)
			}
			src := buf.String()
			got := len(nodeLine.FindAllString(src, -1))
			if got < tc.minNodes || got > tc.maxNodes {
				t.Errorf("%d nodes drawn, want %d..%d", got, tc.minNodes, tc.maxNodes)
			}
			for _, s := range tc.want {
				if !strings.Contains(src, s) {
					t.Errorf("DOT lacks %q", s)
				}
			}
			for _, s := range tc.wantNot {
				if strings.Contains(src, s) {
					t.Errorf("DOT has %q", s)
				}
			}
		})
	}
	if err := DOTWith(&bytes.Buffer{}, r, DOTOptions{Region: 2}); err == nil {
		t.Error("region 2 of a one-region result accepted")
	}
}

func TestFitSVG(t *testing.T) {
	cases := []struct{ in, want string }{
		{`<svg width="6408pt" height="6624pt"
 viewBox="0 0 6408 6624" xmlns="http://www.w3.org/2000/svg"><g/></svg>`, `<svg
 viewBox="0 0 6408 6624" xmlns="http://www.w3.org/2000/svg" class="fit"><g/></svg>`},
		{`<svg viewBox="0 0 1 1"><g/></svg>`, `<svg viewBox="0 0 1 1" class="fit"><g/></svg>`},
		{`not svg`, `not svg`},
	}
	for _, tc := range cases {
		if got := string(fitSVG([]byte(tc.in))); got != tc.want {
			t.Errorf("fitSVG(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestHTMLCollapsesBigRegions: the HTML report draws a big region as one
// box in the overview and its own graph in an expandable section, scales
// both to the page width, and marks provenance without emoji.
func TestHTMLCollapsesBigRegions(t *testing.T) {
	testtools.Dot(t)
	r := rewriteDiff(t, "mixtral_block_torchscript.onnx")
	var buf bytes.Buffer
	if err := HTML(&buf, r); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	svgs := regexp.MustCompile(`(?s)<svg[^>]*>`).FindAllString(page, -1)
	if len(svgs) != 2 {
		t.Fatalf("%d SVGs, want the overview and the region's own graph", len(svgs))
	}
	for _, s := range svgs {
		if strings.Contains(s, "width=") || strings.Contains(s, "height=") || !strings.Contains(s, `class="fit"`) {
			t.Errorf("SVG root %q keeps a fixed size", s)
		}
	}
	if !strings.Contains(page, "<details><summary>Graph of the") || !strings.Contains(page, "initializers replaced") {
		t.Error("no collapsed box and expandable region graph")
	}
	if strings.ContainsAny(page, "✅⚠") || !strings.Contains(page, `class="prov-ok">verified:`) {
		t.Error("provenance marked with emoji, or not marked")
	}
}
