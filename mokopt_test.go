package mokopt_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/models"
)

const example = "testdata/example/mixtral_block_dynamo_batched_mm.onnx"

func load(t *testing.T, path string) *mokopt.Model {
	t.Helper()
	m, err := mokopt.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func fusedExample(t *testing.T) *mokopt.Model {
	t.Helper()
	m := load(t, example)
	rep, err := mokopt.Rewrite(context.Background(), m, mokopt.RewriteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Fused) != 1 {
		t.Fatalf("%d blocks fused, want 1", len(rep.Fused))
	}
	return m
}

// leftovers lists the files of dir other than keep.
func leftovers(t *testing.T, dir string, keep ...string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "src") && !contains(keep, e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

func TestBadInputIsTyped(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.onnx")
	os.WriteFile(garbage, []byte("\xff\xff\xffnot a model"), 0o644)
	for _, path := range []string{garbage, filepath.Join(dir, "missing.onnx")} {
		_, err := mokopt.Load(path)
		var ie *mokopt.InputError
		if !errors.As(err, &ie) || !errors.Is(err, mokopt.ErrBadInput) {
			t.Fatalf("Load(%s): %v (%T), want an *InputError", path, err, err)
		}
		if ie.File != path {
			t.Fatalf("InputError names %q, want %q", ie.File, path)
		}
	}
}

func TestReadRefusesExternalData(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src.onnx")
	if err := models.Write(models.Config{Shape: models.ShapeBatched, Layers: 1, Experts: 4, TopK: 2, Hidden: 64, Inter: 64, Router: "softmax", Normalize: true, External: true}, src); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	_, err = mokopt.Read(bytes.NewReader(b), "-")
	var ie *mokopt.InputError
	if !errors.As(err, &ie) || !strings.Contains(ie.Msg, "src.onnx.data") || !strings.HasPrefix(ie.Object, "initializer ") {
		t.Fatalf("Read of a model with side files: %v, want an *InputError naming the initializer and the side file", err)
	}
	// Writing such a model to a stream is refused before anything is written.
	m := load(t, src)
	var out bytes.Buffer
	err = mokopt.Write(context.Background(), m, &out, mokopt.SaveOptions{})
	if !errors.Is(err, mokopt.ErrNeedsSideFile) || out.Len() != 0 {
		t.Fatalf("Write: %v with %d bytes written, want ErrNeedsSideFile and nothing", err, out.Len())
	}
	// With ExternalInline it is one self-contained stream that reads back.
	if err := mokopt.Write(context.Background(), m, &out, mokopt.SaveOptions{External: mokopt.ExternalInline}); err != nil {
		t.Fatal(err)
	}
	back, err := mokopt.Read(&out, "-")
	if err != nil {
		t.Fatal(err)
	}
	in, err := mokopt.Inspect(context.Background(), back)
	if err != nil {
		t.Fatal(err)
	}
	if in.Model.ExternalBytes != 0 || in.Model.InitializerBytes == 0 || len(in.MoE.Blocks) != 1 {
		t.Fatalf("inline copy: %d external bytes, %d initializer bytes, %d blocks", in.Model.ExternalBytes, in.Model.InitializerBytes, len(in.MoE.Blocks))
	}
}

func TestUnsupportedPatternIsTyped(t *testing.T) {
	// A block whose experts 1..E-1 are missing from the graph (as a trace
	// that only saw expert 0 would be) is a near-miss, not a fusion.
	dir := t.TempDir()
	src := filepath.Join(dir, "src.onnx")
	if err := models.Write(models.Config{Shape: models.ShapeUnrolled, Layers: 1, Experts: 4, TopK: 2, Hidden: 64, Inter: 64, Router: "softmax", Normalize: true}, src); err != nil {
		t.Fatal(err)
	}
	m := load(t, src)
	g := m.Graph().Graph()
	// Drop the branch of expert 1 and chain expert 2's accumulation onto
	// expert 0's, as a trace that never routed a token to expert 1 would.
	kept := g.P.Node[:0]
	for _, n := range g.P.Node {
		if strings.Contains(n.GetName(), "layers.0.e1.") {
			continue
		}
		for i, in := range n.Input {
			if in == "layers.0.e1.acc" {
				n.Input[i] = "layers.0.e0.acc"
			}
		}
		kept = append(kept, n)
	}
	if len(kept) == len(g.P.Node) {
		t.Fatal("generator names changed: no layers.0.e1 nodes")
	}
	removed := len(g.P.Node) - len(kept)
	g.P.Node = kept
	g.Reindex()
	before := len(g.P.Node)
	_, err := mokopt.Rewrite(context.Background(), m, mokopt.RewriteOptions{})
	if err == nil {
		t.Fatalf("rewrite of a block missing expert 3 (%d nodes removed) succeeded", removed)
	}
	var up *mokopt.UnsupportedPatternError
	if !errors.As(err, &up) || !errors.Is(err, mokopt.ErrUnsupportedPattern) {
		t.Fatalf("%v (%T), want an *UnsupportedPatternError", err, err)
	}
	t.Logf("refused: %v", err)
	if !strings.Contains(err.Error(), "Partial option") {
		t.Errorf("the error %q does not name the option that fuses the others", err)
	}
	if len(up.Candidates) != 1 || !strings.Contains(up.Candidates[0].Reason, "expert") || up.Candidates[0].Node == "" {
		t.Fatalf("candidates %+v: want each with node and reason", up.Candidates)
	}
	if len(m.Graph().Proto.Graph.Node) != before {
		t.Fatal("a refused rewrite edited the model")
	}
}

func TestKernelConstraintIsTyped(t *testing.T) {
	m := fusedExample(t)
	rep, err := mokopt.Lower(context.Background(), m, mokopt.TargetGB300NVL72, mokopt.LowerOptions{EP: 8, Strict: true})
	var kc *mokopt.KernelConstraintError
	if !errors.As(err, &kc) || !errors.Is(err, mokopt.ErrKernelConstraint) {
		t.Fatalf("strict lower of H=64: %v (%T), want a *KernelConstraintError", err, err)
	}
	codes := strings.Join(kc.Codes(), ",")
	if codes != "H_MOD_256,I_MOD_256" {
		t.Fatalf("violated codes %s, want H_MOD_256,I_MOD_256", codes)
	}
	if kc.Violations[0].Number == 0 || kc.Violations[0].Node == "" || rep == nil || rep.Lowered() != 0 {
		t.Fatalf("violation %+v, report %v", kc.Violations[0], rep)
	}
	// Without Partial a block the kernel cannot take refuses the model,
	// which stays unchanged.
	before := len(m.Graph().Proto.Graph.Node)
	_, err = mokopt.Lower(context.Background(), m, mokopt.TargetGB300NVL72, mokopt.LowerOptions{EP: 8})
	if !errors.As(err, &kc) || !strings.Contains(err.Error(), "Partial") || len(kc.Violations) == 0 || len(m.Graph().Proto.Graph.Node) != before {
		t.Fatalf("all-or-nothing lower of H=64: %v (%T), %d nodes (had %d)", err, err, len(m.Graph().Proto.Graph.Node), before)
	}
	// With Partial the block stays unlowered, with the same violations as warnings.
	rep, err = mokopt.Lower(context.Background(), m, mokopt.TargetGB300NVL72, mokopt.LowerOptions{EP: 8, Partial: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Lowered() != 0 || len(rep.Warnings()) == 0 || !strings.Contains(strings.Join(rep.Warnings(), "\n"), "H_MOD_256") {
		t.Fatalf("lenient lower: %d lowered, warnings %q", rep.Lowered(), rep.Warnings())
	}
	if _, err := mokopt.Lower(context.Background(), m, "gb999", mokopt.LowerOptions{EP: 8}); err == nil {
		t.Fatal("unknown target accepted")
	}
}

func TestMismatchIsTyped(t *testing.T) {
	a := load(t, example)
	b := fusedExample(t)
	opt := mokopt.DefaultVerifyOptions()
	rep, err := mokopt.Verify(context.Background(), a, b, opt)
	if err != nil || !rep.Pass {
		t.Fatalf("example vs its rewrite: %v", err)
	}
	// Perturb one weight of the fused node: expert 0's down projection.
	g := b.Graph().Graph()
	var hit string
	for _, init := range g.P.Initializer {
		if strings.HasSuffix(init.GetName(), "/down") && init.RawData != nil {
			f := math.Float32frombits(uint32(init.RawData[0]) | uint32(init.RawData[1])<<8 | uint32(init.RawData[2])<<16 | uint32(init.RawData[3])<<24)
			u := math.Float32bits(f + 10)
			init.RawData[0], init.RawData[1], init.RawData[2], init.RawData[3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
			hit = init.GetName()
		}
	}
	if hit == "" {
		t.Fatal("no fused down weight found")
	}
	rep, err = mokopt.Verify(context.Background(), a, b, opt)
	var mm *mokopt.MismatchError
	if !errors.As(err, &mm) || !errors.Is(err, mokopt.ErrMismatch) {
		t.Fatalf("verify after perturbing %s: %v (%T), want a *MismatchError", hit, err, err)
	}
	if rep == nil || rep.Pass || mm.Report != rep || len(mm.Outputs) == 0 || mm.Outputs[0].Mismatches == 0 || float64(mm.Outputs[0].MaxAbsErr) <= 0 {
		t.Fatalf("mismatch error %+v", mm)
	}
	if !strings.Contains(err.Error(), mm.Outputs[0].NameA) {
		t.Fatalf("message %q does not name the output", err)
	}
	if _, err := mokopt.Verify(context.Background(), a, b, mokopt.VerifyOptions{Engine: "nope"}); err == nil {
		t.Fatal("unknown engine accepted")
	}
}

func TestStdioRoundTrip(t *testing.T) {
	m := fusedExample(t)
	var out bytes.Buffer
	if err := mokopt.Write(context.Background(), m, &out, mokopt.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "f.onnx")
	if err := mokopt.Save(context.Background(), m, file, mokopt.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(file)
	if !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("stream (%d bytes) and file (%d bytes) differ", out.Len(), len(want))
	}
	back, err := mokopt.Read(&out, "-")
	if err != nil {
		t.Fatal(err)
	}
	r, err := mokopt.Diff(m, back)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Same() {
		t.Fatal("a model read back from its stream differs from it")
	}
}

// bigModel writes an unrolled E=64 model of several layers with external
// data (about 100 MB) and returns its path.
func bigModel(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: no large model")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src.onnx")
	cfg := models.Config{Shape: models.ShapeUnrolled, Layers: 4, Experts: 64, TopK: 2, Hidden: 128, Inter: 256, Router: "softmax", Normalize: true, External: true}
	if err := models.Write(cfg, src); err != nil {
		t.Fatal(err)
	}
	return src
}

// cancelAt runs a rewrite and save of src into dir, cancelling the context
// from the progress hook at the first event of stage. It returns the error
// and how long the work went on after the cancellation.
func cancelAt(t *testing.T, src, out, stage string) (time.Duration, []string, error) {
	t.Helper()
	m := load(t, src)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var cancelled time.Time
	var after []string
	hook := func(e mokopt.Event) {
		mu.Lock()
		defer mu.Unlock()
		if !cancelled.IsZero() {
			after = append(after, e.Stage)
			return
		}
		if e.Stage == stage {
			cancelled = time.Now()
			cancel()
		}
	}
	_, err := mokopt.Rewrite(ctx, m, mokopt.RewriteOptions{Progress: hook})
	if err == nil {
		err = mokopt.Save(ctx, m, out, mokopt.SaveOptions{External: mokopt.ExternalRepack, Progress: hook})
	}
	mu.Lock()
	defer mu.Unlock()
	if cancelled.IsZero() {
		t.Fatalf("stage %s never reported", stage)
	}
	return time.Since(cancelled), after, err
}

func TestCancelRewrite(t *testing.T) {
	src := bigModel(t)
	dir := filepath.Dir(src)
	out := filepath.Join(dir, "out.onnx")
	for _, stage := range []string{mokopt.StageDetect, mokopt.StageCheck, mokopt.StageFuse, mokopt.StageSave} {
		t.Run(stage, func(t *testing.T) {
			latency, after, err := cancelAt(t, src, out, stage)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled at %s: %v, want context.Canceled", stage, err)
			}
			t.Logf("cancelled at %s: returned %v later (events after: %v)", stage, latency, after)
			// Generous: a run that finished would take seconds; this bounds
			// a hang, not speed.
			if latency > 10*time.Second {
				t.Fatalf("returned %v after the cancellation", latency)
			}
			// The work stopped: no later stage was reached.
			for _, s := range after {
				if s != stage {
					t.Fatalf("stage %s ran after the cancellation at %s", s, stage)
				}
			}
			if left := leftovers(t, dir); len(left) > 0 {
				t.Fatalf("files left behind: %v", left)
			}
		})
	}
}

func TestCancelAfterDelay(t *testing.T) {
	src := bigModel(t)
	dir := filepath.Dir(src)
	out := filepath.Join(dir, "out.onnx")
	m := load(t, src)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const delay = 150 * time.Millisecond
	var mu sync.Mutex
	var last mokopt.Event
	var cancelledAt time.Time
	hook := func(e mokopt.Event) {
		mu.Lock()
		last = e
		mu.Unlock()
	}
	start := time.Now()
	time.AfterFunc(delay, func() {
		mu.Lock()
		cancelledAt = time.Now()
		mu.Unlock()
		cancel()
	})
	_, err := mokopt.Rewrite(ctx, m, mokopt.RewriteOptions{Progress: hook})
	if err == nil {
		err = mokopt.Save(ctx, m, out, mokopt.SaveOptions{External: mokopt.ExternalRepack, Progress: hook})
	}
	took := time.Since(start)
	mu.Lock()
	defer mu.Unlock()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("rewrite and save cancelled after %v: %v after %v, want context.Canceled", delay, err, took)
	}
	if cancelledAt.IsZero() {
		t.Fatal("returned context.Canceled before the cancellation")
	}
	t.Logf("cancelled %v after the start, returned %v after the cancellation; last progress %s %d/%d", delay, time.Since(cancelledAt), last.Stage, last.Done, last.Total)
	// It stopped before finishing: the save never completed.
	if last.Stage == mokopt.StageSave && last.Done == last.Total {
		t.Fatal("the save completed despite the cancellation")
	}
	if left := leftovers(t, dir); len(left) > 0 {
		t.Fatalf("files left behind: %v", left)
	}
	// The same work uncancelled does finish (so the cancellation, not a
	// failure, stopped it) and writes the output.
	m2 := load(t, src)
	full := time.Now()
	if _, err := mokopt.Rewrite(context.Background(), m2, mokopt.RewriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := mokopt.Save(context.Background(), m2, out, mokopt.SaveOptions{External: mokopt.ExternalRepack}); err != nil {
		t.Fatal(err)
	}
	t.Logf("uncancelled rewrite and save: %v", time.Since(full))
	if _, err := graph.Load(out); err != nil {
		t.Fatal(err)
	}
}

func TestCancelLoweredSave(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no large model")
	}
	// Lowering quantizes the routed experts to MXFP8 while the model is
	// saved; cancelling the save stops the quantizer and leaves nothing.
	dir := t.TempDir()
	src := filepath.Join(dir, "src.onnx")
	cfg := models.Config{Shape: models.ShapeBatched, Layers: 2, Experts: 64, TopK: 2, Hidden: 256, Inter: 256, Router: "softmax", Normalize: true, External: true}
	if err := models.Write(cfg, src); err != nil {
		t.Fatal(err)
	}
	m := load(t, src)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := mokopt.Rewrite(ctx, m, mokopt.RewriteOptions{}); err != nil {
		t.Fatal(err)
	}
	rep, err := mokopt.Lower(ctx, m, mokopt.TargetGB300NVL72, mokopt.LowerOptions{EP: 8})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Lowered() != 2 {
		t.Fatalf("%d blocks lowered, want 2: %q", rep.Lowered(), rep.Warnings())
	}
	var total, at int64
	var when time.Time
	err = mokopt.Save(ctx, m, filepath.Join(dir, "low.onnx"), mokopt.SaveOptions{Progress: func(e mokopt.Event) {
		if when.IsZero() {
			total, at, when = e.Total, e.Done, time.Now()
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("save cancelled at %d of %d bytes: %v, want context.Canceled", at, total, err)
	}
	t.Logf("save cancelled at %d of %d bytes, returned %v later", at, total, time.Since(when))
	if at >= total {
		t.Fatal("the cancellation came after the last byte")
	}
	if left := leftovers(t, dir); len(left) > 0 {
		t.Fatalf("files left behind: %v", left)
	}
}

func TestCancelVerify(t *testing.T) {
	a := load(t, example)
	b := fusedExample(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var events []mokopt.Event
	opt := mokopt.DefaultVerifyOptions()
	opt.Progress = func(e mokopt.Event) {
		events = append(events, e)
		cancel() // after the first interpreter run
	}
	_, err := mokopt.Verify(ctx, a, b, opt)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("verify cancelled after the first run: %v, want context.Canceled", err)
	}
	if len(events) != 1 || events[0].Stage != mokopt.StageVerify || events[0].Done != 1 || events[0].Total != 2 {
		t.Fatalf("events %+v, want one verify 1/2", events)
	}
}

// TestLowerORT: Lower to TargetORT: the example's fused node becomes com.microsoft::MoE; a
// sigmoid-routed block (a generated one) is refused with ErrORTUnsupported
// naming the semantics, and the model is left as it was.
func TestLowerORT(t *testing.T) {
	m := fusedExample(t)
	rep, err := mokopt.Lower(context.Background(), m, mokopt.TargetORT, mokopt.LowerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ortNodes, fused := 0, 0
	for _, n := range m.Graph().Proto.Graph.Node {
		switch {
		case n.GetDomain() == "com.microsoft" && n.GetOpType() == "MoE":
			ortNodes++
		case n.GetDomain() == "ai.mok":
			fused++
		}
	}
	if ortNodes != 1 || fused != 0 || rep == nil || rep.ORT == nil || rep.Report != nil || rep.Lowered() != 1 {
		t.Fatalf("%d com.microsoft::MoE and %d ai.mok nodes after Lower to ort, want 1 and 0", ortNodes, fused)
	}

	dir := t.TempDir()
	src := filepath.Join(dir, "sig.onnx")
	if err := models.Write(models.Config{Shape: models.ShapeBatched, Layers: 1, Experts: 4, TopK: 2, Hidden: 64, Inter: 64, Router: "sigmoid", Normalize: true}, src); err != nil {
		t.Fatal(err)
	}
	s := load(t, src)
	if _, err := mokopt.Rewrite(context.Background(), s, mokopt.RewriteOptions{}); err != nil {
		t.Fatal(err)
	}
	before := len(s.Graph().Proto.Graph.Node)
	_, err = mokopt.Lower(context.Background(), s, mokopt.TargetORT, mokopt.LowerOptions{})
	if !errors.Is(err, mokopt.ErrORTUnsupported) || !strings.Contains(err.Error(), "sigmoid") {
		t.Fatalf("Lower to ort of a sigmoid-routed block: %v, want ErrORTUnsupported naming sigmoid routing", err)
	}
	if len(s.Graph().Proto.Graph.Node) != before {
		t.Fatal("a refused Lower to ort edited the model")
	}
}

// TestRewriteChecksByDefault: the zero RewriteOptions runs the numerical
// check (check events are reported); SkipCheck turns it off.
func TestRewriteChecksByDefault(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  mokopt.RewriteOptions
		want bool
	}{
		{"zero value", mokopt.RewriteOptions{}, true},
		{"SkipCheck", mokopt.RewriteOptions{SkipCheck: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := load(t, example)
			checked := false
			tc.opt.Progress = func(e mokopt.Event) {
				if e.Stage == mokopt.StageCheck {
					checked = true
				}
			}
			rep, err := mokopt.Rewrite(context.Background(), m, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			if checked != tc.want || len(rep.Fused) != 1 {
				t.Fatalf("check ran = %v, want %v (%d fused)", checked, tc.want, len(rep.Fused))
			}
		})
	}
}

// TestReportsPrintNoPointers: printing any report with %v or %+v shows its
// content, not addresses.
func TestReportsPrintNoPointers(t *testing.T) {
	ctx := context.Background()
	src := "testdata/example/mixtral_block_dynamo_batched_mm.onnx"
	m := load(t, src)
	rrep, err := mokopt.Rewrite(ctx, m, mokopt.RewriteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vrep, err := mokopt.Verify(ctx, m, load(t, src), mokopt.DefaultVerifyOptions())
	if err != nil {
		t.Fatal(err)
	}
	ort := load(t, src)
	if _, err := mokopt.Rewrite(ctx, ort, mokopt.RewriteOptions{SkipCheck: true}); err != nil {
		t.Fatal(err)
	}
	orep, err := mokopt.Lower(ctx, ort, mokopt.TargetORT, mokopt.LowerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lrep, err := mokopt.Lower(ctx, m, mokopt.TargetGB300NVL72, mokopt.LowerOptions{EP: 8, Partial: true})
	if err != nil {
		t.Fatal(err)
	}
	ptr := regexp.MustCompile(`0x[0-9a-f]{6,}`)
	for name, rep := range map[string]any{"rewrite": rrep, "verify": vrep, "lower": lrep, "lower ort": orep} {
		for _, verb := range []string{"%v", "%+v"} {
			s := fmt.Sprintf(verb, rep)
			if ptr.MatchString(s) || !strings.Contains(s, "MoE") && !strings.Contains(s, "ok") {
				t.Errorf("%s report printed with %s: %q", name, verb, s)
			}
		}
	}
}

// TestRunContribOpsOutsideBlocks: a whole decoder that ONNX Runtime's
// offline optimizer rewrote keeps contrib ops (FusedMatMul in its
// attention) outside the MoE blocks; Run and Verify evaluate their
// standard decomposition, before and after the rewrite, and reproduce ONNX
// Runtime's golden outputs.
func TestRunContribOpsOutsideBlocks(t *testing.T) {
	const name = "testdata/producers/m_full_ortext_qwen3_moe"
	data := name + "_data"
	ctx := context.Background()
	orig := load(t, name+".onnx")
	if !hasOp(orig, "FusedMatMul") {
		t.Fatal("the export holds no FusedMatMul: not the case this test is about")
	}
	if rep, err := mokopt.Run(ctx, orig, data, mokopt.DefaultVerifyOptions()); err != nil || !rep.Pass {
		t.Fatalf("run the export: %v", err)
	}
	fused := load(t, name+".onnx")
	if rep, err := mokopt.Rewrite(ctx, fused, mokopt.RewriteOptions{}); err != nil || len(rep.Fused) != 2 {
		t.Fatalf("rewrite: %v", err)
	}
	if !hasOp(fused, "FusedMatMul") {
		t.Fatal("the rewrite dropped the contrib ops outside the blocks")
	}
	if rep, err := mokopt.Run(ctx, fused, data, mokopt.DefaultVerifyOptions()); err != nil || !rep.Pass {
		t.Fatalf("run the rewrite: %v", err)
	}
	if rep, err := mokopt.Verify(ctx, fused, orig, mokopt.DefaultVerifyOptions()); err != nil || !rep.Pass {
		t.Fatalf("verify the rewrite against the export: %v", err)
	}
}

// hasOp reports whether m's main graph has a node of type op.
func hasOp(m *mokopt.Model, op string) bool {
	for _, n := range m.Graph().Proto.GetGraph().GetNode() {
		if n.GetOpType() == op {
			return true
		}
	}
	return false
}

// TestRunHalfComputeBehindFloatIO: a float16 conversion that keeps float32
// inputs and outputs computes in float16 inside; its rewrite computes in
// float32 from the same weights. Run compares both with ONNX Runtime's
// golden outputs at float16's precision, says so, and fails the rewrite
// element by element when asked for exact tolerances.
func TestRunHalfComputeBehindFloatIO(t *testing.T) {
	const name = "testdata/producers/m_fp16_ts_gpt_oss"
	ctx := context.Background()
	fused := load(t, name+".onnx")
	if _, err := mokopt.Rewrite(ctx, fused, mokopt.RewriteOptions{}); err != nil {
		t.Fatalf("rewrite: %v", err)
	}
	for _, m := range []*mokopt.Model{load(t, name+".onnx"), fused} {
		rep, err := mokopt.Run(ctx, m, name+"_data", mokopt.DefaultVerifyOptions())
		if err != nil || !rep.Pass {
			t.Fatalf("run: %v", err)
		}
		if !strings.Contains(strings.Join(rep.Notes, "\n"), "float16 precision") {
			t.Fatalf("no note on the precision: %q", rep.Notes)
		}
	}
	exact := mokopt.VerifyOptions{QuantBound: -1}
	var mm *mokopt.MismatchError
	if _, err := mokopt.Run(ctx, fused, name+"_data", exact); !errors.As(err, &mm) {
		t.Fatalf("exact run of the float32 rewrite against float16 goldens: %v, want a mismatch", err)
	}
}

// TestStreamWeightsSameBytes: a rewrite with StreamWeights, whose fused
// weights are written from their sources at save time, saves the same bytes
// as one that copies them during Rewrite (saved as files and as a stream),
// for a model of several layers with its weights inline.
func TestStreamWeightsSameBytes(t *testing.T) {
	dir := t.TempDir()
	g, err := models.Build(models.Config{Shape: models.ShapeBatched, Layers: 3, Experts: 8, TopK: 2, Hidden: 64, Inter: 96, Router: "softmax", Normalize: true, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "src.onnx")
	if err := g.Save(src, graph.SaveOptions{External: graph.ExternalInline}); err != nil {
		t.Fatal(err)
	}
	outs := map[bool][]byte{}
	streams := map[bool][]byte{}
	for _, stream := range []bool{false, true} {
		m := load(t, src)
		rep, err := mokopt.Rewrite(context.Background(), m, mokopt.RewriteOptions{StreamWeights: stream})
		if err != nil || len(rep.Fused) != 3 {
			t.Fatalf("stream %v: %v, %d fused", stream, err, len(rep.Fused))
		}
		out := filepath.Join(dir, fmt.Sprintf("out_%v.onnx", stream))
		if err := mokopt.Save(context.Background(), m, out, mokopt.SaveOptions{}); err != nil {
			t.Fatal(err)
		}
		if outs[stream], err = os.ReadFile(out); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := mokopt.Write(context.Background(), m, &buf, mokopt.SaveOptions{}); err != nil {
			t.Fatal(err)
		}
		streams[stream] = buf.Bytes()
	}
	if !bytes.Equal(outs[false], outs[true]) || !bytes.Equal(streams[false], streams[true]) || !bytes.Equal(outs[false], streams[false]) {
		t.Fatalf("streamed and copied weights saved differently (%d, %d bytes; streams %d, %d)", len(outs[false]), len(outs[true]), len(streams[false]), len(streams[true]))
	}
}

// TestVerifyOptionsZeroValue: the zero VerifyOptions is the command's
// default comparison (a correct rewrite passes, as with
// DefaultVerifyOptions, whose report it matches), and an exact comparison
// is an explicit choice (Exact, or negative tolerances), which the same
// rewrite fails on its float32 rounding.
func TestVerifyOptionsZeroValue(t *testing.T) {
	ctx := context.Background()
	a, b := load(t, example), fusedExample(t)
	def, err := mokopt.Verify(ctx, b, a, mokopt.DefaultVerifyOptions())
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		name string
		opt  mokopt.VerifyOptions
		pass bool
		bad  bool
	}{
		{"zero value", mokopt.VerifyOptions{}, true, false},
		{"defaults", mokopt.DefaultVerifyOptions(), true, false},
		{"Exact", mokopt.VerifyOptions{Exact: true}, false, false},
		{"negative tolerances", mokopt.VerifyOptions{RTol: -1, ATol: -1, QuantBound: -1}, false, false},
		{"Exact with a tolerance", mokopt.VerifyOptions{Exact: true, ATol: 1e-3}, false, true},
		{"NaN tolerance", mokopt.VerifyOptions{RTol: math.NaN()}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := mokopt.Verify(ctx, b, a, tc.opt)
			var mm *mokopt.MismatchError
			switch {
			case tc.bad:
				if err == nil || errors.As(err, &mm) {
					t.Fatalf("got %v, want an options error", err)
				}
				return
			case tc.pass && err != nil, !tc.pass && !errors.As(err, &mm):
				t.Fatalf("pass=%v, got %v", tc.pass, err)
			}
			if rep.Seed != def.Seed || len(rep.Cases) != len(def.Cases) {
				t.Fatalf("seed %d, %d cases; the defaults: seed %d, %d cases", rep.Seed, len(rep.Cases), def.Seed, len(def.Cases))
			}
			if tc.pass && (rep.RTol != def.RTol || rep.ATol != def.ATol) {
				t.Fatalf("tolerances %g/%g, the defaults %g/%g", rep.RTol, rep.ATol, def.RTol, def.ATol)
			}
			if !tc.pass && (rep.RTol != 0 || rep.ATol != 0) {
				t.Fatalf("exact comparison with tolerances %g/%g", rep.RTol, rep.ATol)
			}
		})
	}
}

// TestTargets: every name the command's --target takes is one ParseTarget
// takes and Lower lowers to (h200, a machine MoK does not run on, and an
// unknown name are refused with the reason); an option the target does
// not use is refused naming it.
func TestTargets(t *testing.T) {
	var names []string
	for _, tg := range mokopt.Targets() {
		names = append(names, string(tg))
	}
	if got := strings.Join(names, " "); got != "gb200-nvl72 gb300-nvl72 ort" {
		t.Fatalf("Targets() = %s", got)
	}
	for _, tc := range []struct {
		name string
		opt  mokopt.LowerOptions
		want string // "" lowered; else a part of the error
	}{
		{"ort", mokopt.LowerOptions{}, ""},
		{"ort", mokopt.LowerOptions{Quant: "int8"}, ""},
		{"gb300-nvl72", mokopt.LowerOptions{Partial: true}, ""},
		{"gb200-nvl72", mokopt.LowerOptions{EP: 8, Partial: true}, ""},
		{"h200", mokopt.LowerOptions{}, "does not run there (SM90"},
		{"mi300x", mokopt.LowerOptions{}, `unknown target "mi300x" (targets: gb200-nvl72, gb300-nvl72, ort)`},
		{"ort", mokopt.LowerOptions{EP: 8}, "does not use LowerOptions.EP"},
		{"ort", mokopt.LowerOptions{Strict: true, TokensPerRank: 512}, "LowerOptions.TokensPerRank, LowerOptions.Strict"},
		{"gb300-nvl72", mokopt.LowerOptions{Quant: "int8", Partial: true}, "does not use LowerOptions.Quant"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, perr := mokopt.ParseTarget(tc.name)
			m := fusedExample(t)
			rep, err := mokopt.Lower(context.Background(), m, mokopt.Target(tc.name), tc.opt)
			if tc.want == "" {
				if perr != nil || err != nil || rep == nil || len(rep.Summary()) == 0 {
					t.Fatalf("ParseTarget: %v; Lower: %v", perr, err)
				}
				if b, err := json.Marshal(rep); err != nil || !strings.Contains(string(b), `"target": "`+tc.name+`"`) && !strings.Contains(string(b), `"target":"`+tc.name+`"`) {
					t.Fatalf("report JSON %s: %v", b, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Lower: %v, want an error with %q", err, tc.want)
			}
			if strings.HasPrefix(tc.want, "unknown") || strings.HasPrefix(tc.want, "does not run") {
				if perr == nil || perr.Error() != err.Error() {
					t.Fatalf("ParseTarget: %v; Lower: %v", perr, err)
				}
			}
		})
	}
}
