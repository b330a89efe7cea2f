package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/mokopt/mokopt/graph"
)

// sideFiled fails t unless the model at path keeps its weights in a side
// file (and its own file under limit bytes).
func sideFiled(t *testing.T, path string, limit int64) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() >= limit {
		t.Errorf("%s: %d bytes, want under %d", path, st.Size(), limit)
	}
	m, err := graph.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.FirstExternal() == nil {
		t.Errorf("%s: no weight in a side file", path)
	}
}

// TestWritersAtSize: every command that writes a model, with no
// --external-data flag, writes its weights to a side file when its input's
// weights came in one (lower --target ort of a model with external data
// wrote them inside its file, which fails beyond 2 GiB), and when the model
// would exceed protobuf's 2 GiB limit (lowered here to 1 MiB, under the 6
// MiB of weights the models hold) though its input held them inside;
// graph's TestSaveOverTwoGiB does the same at the real limit.
func TestWritersAtSize(t *testing.T) {
	dir := t.TempDir()
	p := func(n string) string { return filepath.Join(dir, n) }
	gen := []string{"gen", "-q", "--hidden", "256", "--inter", "256", "--experts", "8"}
	for _, args := range [][]string{
		append(gen, "-o", p("ext.onnx")),
		append(gen, "--inline", "-o", p("inl.onnx")),
		append(gen, "--ep-form", "ort-alltoall", "--ep", "2", "-o", p("rext.onnx")),
		append(gen, "--ep-form", "ort-alltoall", "--ep", "2", "--inline", "-o", p("rinl.onnx")),
		{"rewrite", "-q", p("ext.onnx"), "-o", p("fext.onnx")},
		{"rewrite", "-q", p("inl.onnx"), "-o", p("finl.onnx")},
	} {
		if code, _, stderr := run(t, nil, args...); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
	}
	if m, err := graph.Load(p("finl.onnx")); err != nil || m.FirstExternal() != nil {
		t.Fatalf("the inline input's rewrite should hold its weights inside (%v)", err)
	} else {
		m.Close()
	}
	cases := []struct {
		name  string
		limit int64 // lowered graph.MaxProtoSize, 0: the real one
		args  []string
		outs  []string
	}{
		{"lower ort, external input", 0, []string{"lower", p("fext.onnx"), "--target", "ort", "-o", p("o1.onnx")}, []string{"o1.onnx"}},
		{"lower ort int4, external input", 0, []string{"lower", p("fext.onnx"), "--target", "ort", "--quant", "int4", "-o", p("o2.onnx")}, []string{"o2.onnx"}},
		{"lower mok, external input", 0, []string{"lower", p("fext.onnx"), "--target", "gb300-nvl72", "--ep", "8", "-o", p("o3.onnx")}, []string{"o3.onnx"}},
		{"split-ranks, external input", 0, []string{"rewrite", p("ext.onnx"), "--split-ranks", "2", "-o", p("o4.onnx")}, []string{"o4.rank0.onnx", "o4.rank1.onnx"}},
		{"merge-ranks, external input", 0, []string{"rewrite", "--merge-ranks", p("rext.rank0.onnx"), p("rext.rank1.onnx"), "-o", p("o5.onnx")}, []string{"o5.onnx"}},
		{"rewrite, over the limit", 1 << 20, []string{"rewrite", p("inl.onnx"), "-o", p("o6.onnx")}, []string{"o6.onnx"}},
		{"lower ort, over the limit", 1 << 20, []string{"lower", p("finl.onnx"), "--target", "ort", "-o", p("o7.onnx")}, []string{"o7.onnx"}},
		{"lower mok, over the limit", 1 << 20, []string{"lower", p("finl.onnx"), "--target", "gb300-nvl72", "--ep", "8", "-o", p("o8.onnx")}, []string{"o8.onnx"}},
		{"split-ranks, over the limit", 1 << 20, []string{"rewrite", p("inl.onnx"), "--split-ranks", "2", "-o", p("o9.onnx")}, []string{"o9.rank0.onnx", "o9.rank1.onnx"}},
		{"merge-ranks, over the limit", 1 << 20, []string{"rewrite", "--merge-ranks", p("rinl.rank0.onnx"), p("rinl.rank1.onnx"), "-o", p("o10.onnx")}, []string{"o10.onnx"}},
		{"gen ort int4, over the limit", 1 << 20, []string{"gen", "--shape", "ort", "--quant", "int4", "--hidden", "256", "--inter", "256", "--experts", "8", "-o", p("o12.onnx")}, []string{"o12.onnx"}},
		{"gen, over the limit", 1 << 20, []string{"gen", "--hidden", "256", "--inter", "256", "--experts", "8", "-o", p("o11.onnx")}, []string{"o11.onnx"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			limit := graph.MaxProtoSize
			if tc.limit > 0 {
				old := graph.MaxProtoSize
				graph.MaxProtoSize, limit = tc.limit, tc.limit
				defer func() { graph.MaxProtoSize = old }()
			}
			if code, out, stderr := run(t, nil, append(tc.args, "-q")...); code != 0 {
				t.Fatalf("exit %d: %s %s", code, out, stderr)
			}
			for _, o := range tc.outs {
				sideFiled(t, p(o), min(limit, 1<<20))
			}
		})
	}
	// What was written computes what its input did.
	if code, out, _ := run(t, nil, "verify", "--tokens", "7", p("o7.onnx"), p("finl.onnx")); code != 0 {
		t.Errorf("verify of the ORT lowering written to a side file: exit %d: %s", code, out)
	}
}
