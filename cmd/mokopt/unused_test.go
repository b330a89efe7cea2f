package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestUnusedFlagsRefused: every flag that a command's mode or target does
// not use (unusedRules) is refused with exit 2, naming the flag and where
// it does not apply, before anything is read or written; the same flag
// where it applies is not refused as unused. Every rule's every flag has a
// row, so a rule added without one fails here.
func TestUnusedFlagsRefused(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out.onnx")
	m := exampleModel
	value := map[string]string{
		"check-data": dir, "ep-check-tokens": "4", "mem-limit": "1GiB", "tokens": "1", "seed": "2",
		"rtol": "0.1", "atol": "0.1", "ep": "8", "tokens-per-rank": "512", "plan": filepath.Join(dir, "p.json"),
		"quant": "int8", "block-size": "32", "color": "never", "rank": "0", "placement": "after_combine",
		"quant-block-size": "32",
	}
	arg := func(flag string) string {
		if v, ok := value[flag]; ok {
			return "--" + flag + "=" + v
		}
		return "--" + flag // a bool
	}
	cases := []struct {
		mode    []string // the command line without the flag
		flag    string
		where   string
		applies []string // a command line where the flag applies (nil: none to try)
	}{
		{[]string{"rewrite", "--merge-ranks", m, m, "-o", out}, "check-data", "with --merge-ranks", []string{"rewrite", m, "-o", out}},
		{[]string{"rewrite", m, "-o", out}, "ep-check-tokens", "without --merge-ranks", []string{"rewrite", "--merge-ranks", m, m, "-o", out}},
		{[]string{"rewrite", "--no-check", m, "-o", out}, "check-data", "with --no-check", nil},
		{[]string{"rewrite", "--no-check", m, "-o", out}, "mem-limit", "with --no-check", []string{"rewrite", m, "-o", out}},
		{[]string{"rewrite", "--no-check", "--merge-ranks", m, m, "-o", out}, "ep-check-tokens", "with --no-check", nil},
		{[]string{"verify", "--data", dir, m, m}, "tokens", "with --data", []string{"verify", m, m}},
		{[]string{"verify", "--data", dir, m, m}, "seed", "with --data", []string{"verify", m, m}},
		{[]string{"verify", "--engine", "ort", m, m}, "mem-limit", "with --engine other than ref", []string{"verify", m, m}},
		{[]string{"verify", "--quant-bound", "0.1", m, m}, "rtol", "with --quant-bound", []string{"verify", m, m}},
		{[]string{"verify", "--quant-bound", "0.1", m, m}, "atol", "with --quant-bound", []string{"verify", m, m}},
		{[]string{"lower", m, "-o", out, "--target", "ort"}, "ep", "to --target ort", []string{"lower", m, "-o", out, "--target", "gb300-nvl72"}},
		{[]string{"lower", m, "-o", out, "--target", "ort"}, "tokens-per-rank", "to --target ort", []string{"lower", m, "-o", out, "--target", "gb300-nvl72"}},
		{[]string{"lower", m, "-o", out, "--target", "ort"}, "strict", "to --target ort", []string{"lower", m, "-o", out, "--target", "gb300-nvl72"}},
		{[]string{"lower", m, "-o", out, "--target", "ort"}, "plan", "to --target ort", []string{"lower", m, "-o", out, "--target", "gb300-nvl72"}},
		{[]string{"lower", m, "-o", out, "--target", "gb300-nvl72"}, "quant", "to the MoK kernel's targets", []string{"lower", m, "-o", out, "--target", "ort"}},
		{[]string{"lower", m, "-o", out, "--target", "gb200-nvl72"}, "block-size", "to the MoK kernel's targets", []string{"lower", m, "-o", out, "--target", "ort", "--quant", "int8"}},
		{[]string{"diff", "--format", "json", m, m}, "color", "to --format other than text", []string{"diff", m, m}},
		{[]string{"diff", "--json", m, m}, "verbose", "to --format other than text", []string{"diff", m, m}},
		{[]string{"gen", "-o", out}, "ep", "without --ep-form", []string{"gen", "-o", out, "--ep-form", "deepep"}},
		{[]string{"gen", "-o", out}, "rank", "without --ep-form", []string{"gen", "-o", out, "--ep-form", "deepep"}},
		{[]string{"gen", "-o", out}, "placement", "without --ep-form", []string{"gen", "-o", out, "--ep-form", "deepep"}},
		{[]string{"gen", "-o", out, "--ep-form", "sharding"}, "rank", "with --ep-form sharding", nil},
		{[]string{"gen", "-o", out, "--shape", "dense"}, "quant", "without --shape ort", []string{"gen", "-o", out, "--shape", "ort"}},
		{[]string{"gen", "-o", out}, "quant-block-size", "without --shape ort", []string{"gen", "-o", out, "--shape", "ort", "--quant", "int8"}},
		{[]string{"gen", "-o", out}, "ort-swiglu", "without --shape ort", []string{"gen", "-o", out, "--shape", "ort"}},
	}
	covered := map[string]bool{}
	for _, tc := range cases {
		covered[tc.mode[0]+" "+tc.where+" "+tc.flag] = true
		t.Run(strings.Join(append(tc.mode, arg(tc.flag)), " "), func(t *testing.T) {
			code, stdout, stderr := run(t, nil, append(append([]string{}, tc.mode...), arg(tc.flag))...)
			want := "--" + tc.flag + " does not apply " + tc.where + ": "
			if code != 2 || !strings.Contains(stderr, want) || len(stdout) != 0 {
				t.Fatalf("exit %d, stderr %q, %d bytes on stdout; want exit 2 and %q", code, stderr, len(stdout), want)
			}
			if tc.applies == nil {
				return
			}
			_, _, stderr = run(t, nil, append(append([]string{}, tc.applies...), arg(tc.flag))...)
			if strings.Contains(stderr, "does not apply") {
				t.Fatalf("refused where it applies (%q): %q", tc.applies, stderr)
			}
		})
	}
	for _, r := range unusedRules {
		for f := range r.flags {
			if !covered[r.cmd+" "+r.where+" "+f] {
				t.Errorf("%s %s --%s has no row", r.cmd, r.where, f)
			}
		}
	}
}
