package main

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/mokopt/mokopt/graph"
)

// TestEPCommands drives gen --ep-form, rewrite --merge-ranks/--split-ranks
// and verify end to end, with exit codes and outputs.
func TestEPCommands(t *testing.T) {
	dir := t.TempDir()
	p := func(name string) string { return filepath.Join(dir, name) }
	size := []string{"--experts", "8", "--top-k", "2", "--hidden", "8", "--inter", "16", "--layers", "2", "--inline"}
	gen := func(args ...string) {
		t.Helper()
		if code := execute(append(append([]string{"gen"}, size...), args...)); code != 0 {
			t.Fatalf("gen %v: exit %d", args, code)
		}
	}
	gen("--ep-form", "ort-alltoall", "--ep", "4", "--placement", "after_combine", "-o", p("a2a.onnx"))
	gen("--shape", "batched", "-o", p("ref.onnx"))
	gen("--ep-form", "sharding", "--ep", "4", "-o", p("sharded.onnx"))
	gen("--ep-form", "ort-sharded", "--ep", "8", "-o", p("smoe.onnx"))
	// Big enough for its weights to go to the side file.
	if code := execute([]string{"gen", "--shape", "batched", "--experts", "8", "--hidden", "64", "--inter", "128", "-o", p("ext.onnx")}); code != 0 {
		t.Fatalf("gen with a side file: exit %d", code)
	}
	ranks := func(prefix string, n int) []string {
		var out []string
		for r := 0; r < n; r++ {
			out = append(out, p(prefix+".rank"+strconv.Itoa(r)+".onnx"))
		}
		return out
	}
	rewrite := func(args ...string) []string { return append([]string{"rewrite"}, args...) }
	cases := []struct {
		name    string
		args    []string
		code    int
		written []string
		absent  []string
	}{
		{"merge", rewrite(append(append([]string{"--merge-ranks"}, ranks("a2a", 4)...), "-o", p("merged.onnx"))...), 0, []string{p("merged.onnx")}, nil},
		{"merge with a rank missing", rewrite(append(append([]string{"--merge-ranks"}, ranks("a2a", 4)[:3]...), "-o", p("bad.onnx"))...), 1, nil, []string{p("bad.onnx")}},
		{"merge and split at once", rewrite(append(append([]string{"--merge-ranks", "--split-ranks", "2"}, ranks("a2a", 4)...), "-o", p("x.onnx"))...), 2, nil, []string{p("x.onnx")}},
		{"two files without --merge-ranks", rewrite(append(ranks("a2a", 2), "-o", p("y.onnx"))...), 2, nil, []string{p("y.onnx")}},
		{"one rank alone", rewrite(ranks("a2a", 4)[2], "-o", p("rank2.fused.onnx")), 0, []string{p("rank2.fused.onnx")}, nil},
		{"verify merged against the reference", []string{"verify", p("merged.onnx"), p("ref.onnx")}, 0, nil, nil},
		{"split", rewrite(p("merged.onnx"), "--split-ranks", "4", "-o", p("split.onnx")), 0, ranks("split", 4), nil},
		{"split merged back", rewrite(append(append([]string{"--merge-ranks"}, ranks("split", 4)...), "-o", p("back.onnx"))...), 0, []string{p("back.onnx")}, nil},
		{"verify split+merged", []string{"verify", p("back.onnx"), p("merged.onnx")}, 0, nil, nil},
		{"the side file is there", []string{"inspect", p("ext.onnx.data")}, 2, []string{p("ext.onnx.data")}, nil},
		{"split a model with a side file", rewrite(p("ext.onnx"), "--split-ranks", "2", "-o", p("ext.split.onnx")), 0, ranks("ext.split", 2), nil},
		{"merge the side-file split back", rewrite(append(append([]string{"--merge-ranks"}, ranks("ext.split", 2)...), "-o", p("ext.back.onnx"))...), 0, []string{p("ext.back.onnx")}, nil},
		{"verify the side-file split against its source", []string{"verify", p("ext.back.onnx"), p("ext.onnx")}, 0, nil, nil},
		{"split 3 ways refused", rewrite(p("merged.onnx"), "--split-ranks", "3", "-o", p("three.onnx")), 1, nil, []string{p("three.rank0.onnx")}},
		{"split past the rank bound refused at once", rewrite(p("merged.onnx"), "--split-ranks", "1000000", "-o", p("many.onnx")), 2, nil, []string{p("many.rank0.onnx")}},
		{"sharding annotations fuse", rewrite(p("sharded.onnx"), "-o", p("sharded.fused.onnx")), 0, []string{p("sharded.fused.onnx")}, nil},
		{"verify annotated against the reference", []string{"verify", p("sharded.fused.onnx"), p("ref.onnx")}, 0, nil, nil},
		{"ShardedMoE ranks merge", rewrite(append(append([]string{"--merge-ranks"}, ranks("smoe", 8)...), "-o", p("smoe.merged.onnx"))...), 0, []string{p("smoe.merged.onnx")}, nil},
		{"verify merged ShardedMoE against the reference", []string{"verify", p("smoe.merged.onnx"), p("ref.onnx")}, 0, nil, nil},
		{"bad --ep-ops", []string{"inspect", "--ep-ops", p("nope.json"), p("ref.onnx")}, 2, nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if code := execute(tc.args); code != tc.code {
				t.Fatalf("exit %d, want %d", code, tc.code)
			}
			for _, f := range tc.written {
				if _, err := os.Stat(f); err != nil {
					t.Fatalf("%s not written", f)
				}
			}
			for _, f := range tc.absent {
				if _, err := os.Stat(f); err == nil {
					t.Fatalf("%s written", f)
				}
			}
		})
	}
	m, err := graph.Load(p("merged.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, nd := range m.Proto.Graph.Node {
		if nd.GetDomain() == "ai.mok" {
			n++
			if graph.AttrInt(nd, "ep_size", 0) != 4 || graph.AttrInt(nd, "expert_offset", -1) != 0 {
				t.Fatalf("merged node %s: ep_size %d expert_offset %d", nd.GetName(), graph.AttrInt(nd, "ep_size", 0), graph.AttrInt(nd, "expert_offset", -1))
			}
		}
	}
	if n != 2 || len(m.Proto.Graph.Node) != 4 {
		t.Fatalf("merged model: %d fused of %d nodes, want 2 of 4", n, len(m.Proto.Graph.Node))
	}
}
