package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestVerifyLoweredMXFP8: verify of a fused model against its lowering
// (MXFP8 weights) compares by mean relative and relative L2 error against
// the MXFP8 bound and says so; --elementwise and a tight --quant-bound
// report the mismatch.
func TestVerifyLoweredMXFP8(t *testing.T) {
	dir := t.TempDir()
	src, fused, low := filepath.Join(dir, "m.onnx"), filepath.Join(dir, "f.onnx"), filepath.Join(dir, "l.onnx")
	for _, args := range [][]string{
		{"gen", "-q", "--hidden", "256", "--inter", "256", "--experts", "8", "--shared-inter", "256", "-o", src},
		{"rewrite", "-q", src, "-o", fused},
		{"lower", "-q", fused, "-o", low, "--target", "gb300-nvl72", "--ep", "8"},
	} {
		if code, _, stderr := run(t, nil, args...); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
	}
	cases := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"automatic", []string{"verify", "--tokens", "7", fused, low}, 0, []string{"holds MXFP8 weights", "mean rel err", "bound 8%", "ok tokens=7"}},
		{"either side", []string{"verify", "--tokens", "7", low, fused}, 0, []string{"a (" + low + ") holds MXFP8"}},
		{"element-wise", []string{"verify", "--tokens", "7", "--elementwise", fused, low}, 1, []string{"MISMATCH", "max rel err"}},
		{"tight bound", []string{"verify", "--tokens", "7", "--quant-bound", "0.0001", fused, low}, 1, []string{"MISMATCH", "bound 0.01%"}},
		{"exclusive flags", []string{"verify", "--elementwise", "--quant-bound", "0.1", fused, low}, 2, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, stderr := run(t, nil, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d: %s %s", code, tc.code, out, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}
