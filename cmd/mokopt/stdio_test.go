package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/graph"
)

func mokoptEvent(stage string, done, total int64) mokopt.Event {
	return mokopt.Event{Stage: stage, Done: done, Total: total}
}

const exampleModel = "../../testdata/example/mixtral_block_dynamo_batched_mm.onnx"

// run executes the CLI with stdin fed from in, and returns the exit code,
// standard output and standard error.
func run(t *testing.T, in []byte, args ...string) (int, []byte, string) {
	t.Helper()
	dir := t.TempDir()
	files := map[string]*os.File{}
	for _, n := range []string{"stdin", "stdout", "stderr"} {
		f, err := os.Create(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		files[n] = f
	}
	files["stdin"].Write(in)
	files["stdin"].Seek(0, 0)
	oldIn, oldOut, oldErr := os.Stdin, os.Stdout, os.Stderr
	os.Stdin, os.Stdout, os.Stderr = files["stdin"], files["stdout"], files["stderr"]
	code := execute(args)
	os.Stdin, os.Stdout, os.Stderr = oldIn, oldOut, oldErr
	for _, f := range files {
		f.Close()
	}
	out, _ := os.ReadFile(filepath.Join(dir, "stdout"))
	errb, _ := os.ReadFile(filepath.Join(dir, "stderr"))
	return code, out, string(errb)
}

func fusedCount(t *testing.T, model []byte) int {
	t.Helper()
	m, err := graph.Parse(model, "stdout")
	if err != nil {
		t.Fatalf("stdout is not a model: %v", err)
	}
	n := 0
	for _, nd := range m.Proto.Graph.Node {
		if nd.GetDomain() == "ai.mok" && nd.GetOpType() == "MoE" {
			n++
		}
	}
	return n
}

func TestStdinStdout(t *testing.T) {
	src, err := os.ReadFile(exampleModel)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// rewrite - -o -: the model on stdout, the summary on stderr.
	code, fused, stderr := run(t, src, "rewrite", "-", "-o", "-")
	if code != 0 {
		t.Fatalf("rewrite - -o -: exit %d: %s", code, stderr)
	}
	if n := fusedCount(t, fused); n != 1 {
		t.Fatalf("%d fused nodes on stdout, want 1", n)
	}
	if !strings.Contains(stderr, "- -> -: 1 MoE block(s) fused") {
		t.Fatalf("summary not on stderr: %q", stderr)
	}
	// The same bytes as a rewrite between files.
	file := filepath.Join(dir, "f.onnx")
	if code := execute([]string{"rewrite", exampleModel, "-o", file}); code != 0 {
		t.Fatal("rewrite to a file failed")
	}
	want, _ := os.ReadFile(file)
	if !bytes.Equal(fused, want) {
		t.Fatalf("rewrite to stdout (%d bytes) differs from rewrite to a file (%d bytes)", len(fused), len(want))
	}
	// inspect -, verify A -, diff - B read stdin.
	code, out, stderr := run(t, fused, "inspect", "--json", "-")
	var ins struct {
		Model struct{ File string }
		MoE   struct{ Blocks []any }
	}
	if code != 0 || json.Unmarshal(out, &ins) != nil || ins.Model.File != "-" {
		t.Fatalf("inspect -: exit %d, %s %s", code, out, stderr)
	}
	code, out, stderr = run(t, fused, "verify", exampleModel, "-")
	if code != 0 || !strings.HasPrefix(string(out), "ok ") {
		t.Fatalf("verify A -: exit %d: %s %s", code, out, stderr)
	}
	code, out, _ = run(t, fused, "diff", "--format", "markdown", exampleModel, "-")
	if code != 1 || !strings.Contains(string(out), "ai.mok::MoE") {
		t.Fatalf("diff A -: exit %d, %s", code, out)
	}
	if code, _, stderr = run(t, fused, "verify", "-", "-"); code != 2 || !strings.Contains(stderr, "standard input") {
		t.Fatalf("verify - -: exit %d, %q; want 2 and a message", code, stderr)
	}
	// lower - -o -: the lowered model on stdout.
	code, low, stderr := run(t, fused, "lower", "-", "-o", "-", "--target", "gb300-nvl72", "--ep", "8", "--partial")
	if code != 0 || len(low) == 0 || !strings.Contains(stderr, "0 of 1 MoE block(s) lowered") {
		t.Fatalf("lower - -o -: exit %d, %d bytes, %q", code, len(low), stderr)
	}
	if _, err := graph.Parse(low, "stdout"); err != nil {
		t.Fatal(err)
	}
	// gen -o -: an inline model.
	code, gen, stderr := run(t, nil, "gen", "--experts", "4", "-o", "-")
	if code != 0 {
		t.Fatalf("gen -o -: exit %d: %s", code, stderr)
	}
	if m, err := graph.Parse(gen, "stdout"); err != nil || m.FirstExternal() != nil {
		t.Fatalf("gen -o -: %v (external data: %v)", err, err == nil && m.FirstExternal() != nil)
	}
	// --report - and diff -o - write standard output.
	code, out, stderr = run(t, nil, "rewrite", exampleModel, "-o", filepath.Join(dir, "r.onnx"), "--report", "-")
	var rep map[string]any
	if code != 0 || json.Unmarshal(out, &rep) != nil || rep["schema_version"] != 1.0 || !strings.Contains(stderr, "1 MoE block(s) fused") {
		t.Fatalf("rewrite --report -: exit %d, stdout %s, stderr %q", code, out, stderr)
	}
	code, out, _ = run(t, nil, "diff", "--stat", "-o", "-", exampleModel, file)
	if code != 1 || !strings.Contains(string(out), "1 fused region") {
		t.Fatalf("diff -o -: exit %d, %s", code, out)
	}
	if _, err := os.Stat("-"); err == nil {
		os.Remove("-")
		t.Fatal(`a file named "-" was written`)
	}
	// Refusals: --json would share stdout; --in-place of stdin.
	for _, args := range [][]string{
		{"rewrite", "-", "-o", "-", "--json"},
		{"rewrite", "-", "-o", "-", "--report", "-"},
		{"rewrite", "-", "--in-place"},
		{"lower", "-", "-o", "-", "--json", "--target", "gb300-nvl72", "--ep", "8"},
		{"gen", "-o", "-", "--json"},
	} {
		if code, out, _ := run(t, src, args...); code != 2 || len(out) != 0 {
			t.Errorf("%v: exit %d with %d bytes on stdout, want 2 and nothing", args, code, len(out))
		}
	}
}

func TestStdinRefusesSideFiles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "ext.onnx")
	if code := execute([]string{"gen", "--experts", "4", "-o", src}); code != 0 {
		t.Fatal("gen failed")
	}
	b, _ := os.ReadFile(src)
	code, out, stderr := run(t, b, "rewrite", "-", "-o", filepath.Join(dir, "x.onnx"))
	if code != 2 || len(out) != 0 || !strings.Contains(stderr, "ext.onnx.data") || !strings.Contains(stderr, "external data") {
		t.Fatalf("rewrite of a stdin model with side files: exit %d, %q", code, stderr)
	}
	// A model on disk with external data cannot go to stdout unless inlined.
	fused := filepath.Join(dir, "f.onnx")
	if code := execute([]string{"rewrite", src, "-o", fused, "--external-data", "repack"}); code != 0 {
		t.Fatal("rewrite failed")
	}
	lower := []string{"lower", fused, "-o", "-", "--target", "gb300-nvl72", "--ep", "8", "--partial"}
	code, out, stderr = run(t, nil, lower...)
	if code != 2 || len(out) != 0 || !strings.Contains(stderr, "f.onnx.data") || !strings.Contains(stderr, "--external-data inline") {
		t.Fatalf("lower -o - of a model with side files: exit %d, %d bytes, %q", code, len(out), stderr)
	}
	code, out, stderr = run(t, nil, append(lower, "--external-data", "inline")...)
	if m, err := graph.Parse(out, "stdout"); code != 0 || err != nil || m.FirstExternal() != nil {
		t.Fatalf("lower -o - --external-data inline: exit %d, %v, %q", code, err, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "x.onnx")); err == nil {
		t.Fatal("output written for a refused input")
	}
}

func TestProgressOnStderrOnly(t *testing.T) {
	old := progressDelay
	progressDelay = 0
	defer func() { progressDelay = old }()
	dir := t.TempDir()
	src := filepath.Join(dir, "big.onnx")
	code, out, stderr := run(t, nil, "gen", "--shape", "unrolled", "--experts", "16", "--layers", "2", "--hidden", "128", "--inter", "256", "-o", src)
	if code != 0 {
		t.Fatalf("gen: %d %s", code, stderr)
	}
	if !strings.Contains(stderr, "mokopt: save ") || strings.Contains(string(out), "mokopt:") {
		t.Fatalf("gen: progress lines missing from stderr or present on stdout:\nstdout %s\nstderr %s", out, stderr)
	}
	code, out, stderr = run(t, nil, "rewrite", src, "-o", filepath.Join(dir, "f.onnx"), "--external-data", "repack", "--json")
	if code != 0 {
		t.Fatalf("rewrite: %d %s", code, stderr)
	}
	for _, stage := range []string{"detect", "weights", "check", "fuse", "save"} {
		if !strings.Contains(stderr, "mokopt: "+stage+" ") {
			t.Errorf("no %s progress on stderr: %s", stage, stderr)
		}
	}
	var doc map[string]any
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("progress leaked into the --json output: %v\n%s", err, out)
	}
	code, out, stderr = run(t, nil, "rewrite", "--quiet", src, "-o", filepath.Join(dir, "g.onnx"))
	if code != 0 || stderr != "" || !strings.Contains(string(out), "2 MoE block(s) fused") {
		t.Fatalf("--quiet: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = run(t, nil, "verify", "-q", exampleModel, exampleModel)
	if code != 0 || stderr != "" {
		t.Fatalf("verify -q: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = run(t, nil, "verify", exampleModel, exampleModel)
	if code != 0 || !strings.Contains(stderr, "mokopt: verify 2/2 (100%)") {
		t.Fatalf("verify: exit %d, stderr %q", code, stderr)
	}
}

func TestProgressLines(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(0, 0)
	p := &progressReporter{w: &buf, start: now, now: func() time.Time { return now }}
	now = now.Add(time.Second)
	for i := int64(0); i <= 100; i++ {
		p.event(mokoptEvent("save", i, 100))
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 11 || lines[0] != "mokopt: save 0/100 (0%)" || lines[10] != "mokopt: save 100/100 (100%)" {
		t.Fatalf("every 10%%: got %d lines %q", len(lines), lines)
	}
	// Slow work: a line every progressEvery even between 10% steps.
	buf.Reset()
	p = &progressReporter{w: &buf, start: now, now: func() time.Time { return now }}
	for i := int64(0); i < 5; i++ {
		now = now.Add(progressEvery)
		p.event(mokoptEvent("check", i, 1000))
	}
	if n := strings.Count(buf.String(), "\n"); n != 5 {
		t.Fatalf("slow work: %d lines, want 5: %q", n, buf.String())
	}
	// Slow work carries an estimate of the time left, from its rate so far:
	// 4 of 1000 done in 20 s leaves 996 at 5 s each.
	if want := "mokopt: check 4/1000 (0%, ETA 1h23m0s)"; !strings.Contains(buf.String(), want) {
		t.Fatalf("slow work: no %q in %q", want, buf.String())
	}
	// Quick work (within progressDelay) shows nothing.
	buf.Reset()
	p = &progressReporter{w: &buf, start: now, now: func() time.Time { return now }}
	p.event(mokoptEvent("fuse", 1, 1))
	if buf.Len() != 0 {
		t.Fatalf("quick work printed %q", buf.String())
	}
}

func TestJSONSchemaVersion(t *testing.T) {
	dir := t.TempDir()
	fused := filepath.Join(dir, "f.onnx")
	data := "../../testdata/example/mixtral_block_dynamo_batched_mm_data"
	cmds := [][]string{
		{"version", "--json"},
		{"inspect", "--json", exampleModel},
		{"rewrite", "--json", exampleModel, "-o", fused},
		{"verify", "--json", fused, exampleModel},
		{"run", "--json", exampleModel, "--data", data},
		{"lower", "--json", fused, "-o", filepath.Join(dir, "l.onnx"), "--target", "gb300-nvl72", "--ep", "8", "--partial"},
		{"diff", "--format", "json", exampleModel, fused},
		{"diff", "--format", "json", "--stat", exampleModel, fused},
		{"gen", "--json", "-o", filepath.Join(dir, "g.onnx")},
	}
	for _, args := range cmds {
		code, out, stderr := run(t, nil, args...)
		if code != 0 && !(args[0] == "diff" && code == 1) {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		var doc map[string]any
		if err := json.Unmarshal(out, &doc); err != nil {
			t.Fatalf("%v: not one JSON document: %v\n%s", args, err, out)
		}
		if v, ok := doc["schema_version"].(float64); !ok || v != 1 {
			t.Errorf("%v: schema_version = %v, want 1", args, doc["schema_version"])
		}
	}
	// Files written with JSON: --report and --plan.
	rep, plan := filepath.Join(dir, "r.json"), filepath.Join(dir, "p.json")
	if code := execute([]string{"rewrite", exampleModel, "-o", filepath.Join(dir, "f2.onnx"), "--report", rep}); code != 0 {
		t.Fatal("rewrite --report failed")
	}
	if code := execute([]string{"lower", fused, "-o", filepath.Join(dir, "l2.onnx"), "--target", "gb300-nvl72", "--ep", "8", "--partial", "--plan", plan}); code != 0 {
		t.Fatal("lower --plan failed")
	}
	for _, f := range []string{rep, plan} {
		b, _ := os.ReadFile(f)
		var doc map[string]any
		if err := json.Unmarshal(b, &doc); err != nil || doc["schema_version"] != 1.0 {
			t.Errorf("%s: schema_version %v (%v)", filepath.Base(f), doc["schema_version"], err)
		}
	}
}

func TestProgressBar(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(0, 0)
	p := &progressReporter{w: &buf, tty: true, start: now, now: func() time.Time { return now }}
	now = now.Add(time.Second)
	for i := int64(0); i <= 4; i++ {
		p.event(mokopt.Event{Stage: "fuse", Done: i, Total: 4})
	}
	p.event(mokopt.Event{Stage: "save", Done: 1 << 20, Total: 2 << 20, Bytes: true})
	p.event(mokopt.Event{Stage: "save", Done: 2 << 20, Total: 2 << 20, Bytes: true})
	out := buf.String()
	for _, want := range []string{"fuse", "4/4", "save", "2.0 MiB"} {
		if !strings.Contains(out, want) {
			t.Errorf("bar output lacks %q: %q", want, out)
		}
	}
	if strings.Contains(out, "mokopt: fuse") {
		t.Errorf("a terminal got plain lines: %q", out)
	}
}
