package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestUnfusableMoEIsNeverSilent: a capacity-limited router and an int8
// dynamically quantized block are MoE blocks mokopt cannot fuse. inspect
// lists them (text and JSON, with the class and the capacity), rewrite
// refuses to write the model (exit 1, the reason on standard error) as for
// any other near-miss, and --partial writes it unfused (exit 0) naming the
// block it did not fuse.
func TestUnfusableMoEIsNeverSilent(t *testing.T) {
	cases := []struct {
		model    string
		class    string
		capacity []int64
		say      string // in every message about the block
	}{
		{"capacity_nllb_replica_dynamo", "capacity_limited", []int64{5}, "expert_capacity 5"},
		{"capacity_switch_replica_torchscript", "capacity_limited", []int64{2}, "expert_capacity 2"},
		{"int8_hf4_qwen2_shared_torchscript", "int8_quantized", nil, "int8-quantized"},
	}
	for _, tc := range cases {
		t.Run(tc.model, func(t *testing.T) {
			in := filepath.Join("..", "..", "testdata", "producers", tc.model+".onnx")
			dir := t.TempDir()

			code, out, errs := run(t, nil, "inspect", "-q", in)
			if code != 0 || !strings.Contains(string(out), "MoE blocks: 0") || !strings.Contains(string(out), "near-miss at") || !strings.Contains(string(out), tc.say) {
				t.Fatalf("inspect: exit %d\n%s%s", code, out, errs)
			}
			code, out, errs = run(t, nil, "inspect", "-q", "--json", in)
			var ins struct {
				MoE struct {
					Blocks     []json.RawMessage `json:"blocks"`
					NearMisses []struct {
						Node, Reason, Class string
						Capacity            []int64
					} `json:"near_misses"`
				} `json:"moe"`
			}
			if code != 0 || json.Unmarshal(out, &ins) != nil {
				t.Fatalf("inspect --json: exit %d\n%s%s", code, out, errs)
			}
			if len(ins.MoE.Blocks) != 0 || len(ins.MoE.NearMisses) != 1 {
				t.Fatalf("inspect --json: %s", out)
			}
			nm := ins.MoE.NearMisses[0]
			if nm.Class != tc.class || !slices.Equal(nm.Capacity, tc.capacity) || !strings.Contains(nm.Reason, tc.say) {
				t.Fatalf("inspect --json near-miss %+v", nm)
			}

			o := filepath.Join(dir, "all.onnx")
			code, out, errs = run(t, nil, "rewrite", "-q", in, "-o", o)
			if code != 1 || !strings.Contains(errs, tc.say) || !strings.Contains(errs, "no output written") {
				t.Fatalf("rewrite: exit %d\n%s%s", code, out, errs)
			}
			if _, err := os.Stat(o); err == nil {
				t.Fatal("rewrite wrote a model it refused")
			}
			o = filepath.Join(dir, "partial.onnx")
			code, out, errs = run(t, nil, "rewrite", "-q", "--partial", in, "-o", o)
			if code != 0 || !strings.Contains(string(out), "0 MoE block(s) fused") || !strings.Contains(string(out), "not fused") || !strings.Contains(string(out), tc.say) {
				t.Fatalf("rewrite --partial: exit %d\n%s%s", code, out, errs)
			}
			if _, err := os.Stat(o); err != nil {
				t.Fatalf("rewrite --partial wrote nothing: %v", err)
			}
		})
	}
}
