package passes

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
)

// aheadCase loads file, saved first with its weights in a side file when
// side is set.
func aheadLoad(t *testing.T, file string, side bool) *graph.Model {
	t.Helper()
	m, err := graph.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	if !side {
		return m
	}
	p := filepath.Join(t.TempDir(), "side.onnx")
	if err := m.Save(p, graph.SaveOptions{External: graph.ExternalRepack}); err != nil {
		t.Fatal(err)
	}
	m.Close()
	if m, err = graph.Load(p); err != nil {
		t.Fatal(err)
	}
	return m
}

// saved returns the bytes of m saved in mode (with Ready, when set) to a
// new folder, followed by its side file's, and the names left in that
// folder.
func saved(t *testing.T, m *graph.Model, mode graph.ExternalMode, ready func() error) ([]byte, []string, error) {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, "out.onnx")
	err := m.Save(p, graph.SaveOptions{External: mode, Ready: ready})
	es, _ := os.ReadDir(dir)
	var left []string
	for _, e := range es {
		left = append(left, e.Name())
	}
	if err != nil {
		return nil, left, err
	}
	b, rerr := os.ReadFile(p)
	if rerr != nil {
		t.Fatal(rerr)
	}
	if d, err := os.ReadFile(p + ".data"); err == nil {
		b = append(b, d...)
	}
	return b, left, nil
}

// TestRewriteAheadAsRewrite: RewriteAhead (the edit at once, the check on
// a fork meanwhile, the save committed once it passed) gives the report,
// error and output bytes that Rewrite then Save give, on real exports
// (plain, canonicalized, chained) with inline weights and side files, and
// when a moved weight fails the check: the same error, and nothing saved.
func TestRewriteAheadAsRewrite(t *testing.T) {
	files := []string{
		filepath.Join(exportedDir, "olmoe_block_dynamo_batched_mm.onnx"),
		filepath.Join(producersDir, "functions_hf4_mixtral.onnx"),
		filepath.Join(producersDir, "full_ort_extended_mixtral_dynamo.onnx"),
		filepath.Join(producersDir, "chain_same3_dynamo.onnx"),
		filepath.Join(producersDir, "opset11_hf4_mixtral.onnx"),           // the opset raised in place: a note
		filepath.Join(exportedDir, "ernie4_5_moe_block_torchscript.onnx"), // restored traced experts: a warning
	}
	for _, f := range files {
		for _, side := range []bool{false, true} {
			mode := graph.ExternalInline
			if side {
				mode = graph.ExternalKeep
			}
			for _, corrupt := range []bool{false, true} {
				name := filepath.Base(f)
				if side {
					name += "/side"
				}
				if corrupt {
					name += "/corrupt"
				}
				t.Run(name, func(t *testing.T) {
					if corrupt {
						corruptExpert = func(b *Block, e int, gate, up, down []float32) {
							for i := range down {
								down[i] *= 1.01
							}
						}
						defer func() { corruptExpert = nil }()
					}
					opt := Options{Check: true, StreamWeights: true, RestoreTracedExperts: true}
					m := aheadLoad(t, f, side)
					defer m.Close()
					rep, err := Rewrite(m, opt)
					var want []byte
					if err == nil {
						if want, _, err = saved(t, m, mode, nil); err != nil {
							t.Fatal(err)
						}
					}
					if corrupt != (err != nil) {
						t.Fatalf("Rewrite: %v", err)
					}

					m2 := aheadLoad(t, f, side)
					defer m2.Close()
					rep2, wait, err2 := RewriteAhead(m2, opt)
					if err2 != nil {
						t.Fatalf("edit: %v", err2)
					}
					got, left, final, redone, err2 := savedAhead(t, m2, mode, wait)
					if redone {
						t.Fatal("redone on a copy: no block input moves in these exports")
					}
					if corrupt {
						if err2 == nil || err2.Error() != err.Error() || len(left) != 0 {
							t.Fatalf("got %v (files %v), want %v and no file", err2, left, err)
						}
						if !errors.Is(err2, ErrNotFused) {
							t.Fatalf("%v is not ErrNotFused", err2)
						}
						return
					}
					if err2 != nil {
						t.Fatal(err2)
					}
					if !bytes.Equal(got, want) {
						t.Fatalf("output differs: %d bytes, want %d", len(got), len(want))
					}
					j1, _ := json.Marshal(rep)
					j2, _ := json.Marshal(final)
					if !bytes.Equal(j1, j2) || len(rep2.Fused) != len(rep.Fused) || len(rep.Fused) == 0 || strings.Contains(f, "opset11") && len(rep.Warnings) == 0 {
						t.Fatalf("report differs:\n%s\nwant\n%s", j2, j1)
					}
				})
			}
		}
	}
}

// savedAhead saves m as RewriteAndSave does after RewriteAhead: committed
// once wait passed, or, when wait redid the rewrite on a copy, that copy
// saved instead. It returns saved's results, wait's report, and whether the
// copy was saved.
func savedAhead(t *testing.T, m *graph.Model, mode graph.ExternalMode, wait func() (*Report, *graph.Model, error)) ([]byte, []string, *Report, bool, error) {
	t.Helper()
	var final *Report
	var copy *graph.Model
	errCopy := errors.New("the copy is the output")
	got, left, err := saved(t, m, mode, func() error {
		var err error
		final, copy, err = wait()
		if err == nil && copy != nil {
			return errCopy
		}
		return err
	})
	if copy != nil && errors.Is(err, errCopy) {
		got, left, err = saved(t, copy, mode, nil)
	}
	return got, left, final, copy != nil, err
}

// TestRewriteAheadRedoesMovedInput: when the check moves a block's input
// to its router's [T, H] input (the block's input has another shape than
// its output; forced here on an ORT-optimized Llama 4 export that needs
// canonicalization), the edit made without knowing it is discarded and the
// rewrite redone on an unedited copy: the output is the bytes Rewrite then
// Save give, whose fused node reads the router's input.
func TestRewriteAheadRedoesMovedInput(t *testing.T) {
	detectedHook = func(b *Block) { b.Input = "hidden_states" } // the [2, 5, 64] model input; the output is [10, 64]
	defer func() { detectedHook = nil }()
	f := filepath.Join(producersDir, "m_ortext_ts_llama4.onnx")
	opt := Options{Check: true, StreamWeights: true}
	m := aheadLoad(t, f, false)
	defer m.Close()
	rep, err := Rewrite(m, opt)
	if err != nil || len(rep.Fused) != 1 || rep.Fused[0].Block.Input != rep.Fused[0].Block.Router {
		t.Fatalf("Rewrite: %v (fused %+v)", err, rep)
	}
	want, _, err := saved(t, m, graph.ExternalInline, nil)
	if err != nil {
		t.Fatal(err)
	}
	m2 := aheadLoad(t, f, false)
	defer m2.Close()
	if _, wait, err := RewriteAhead(m2, opt); err != nil {
		t.Fatal(err)
	} else if got, left, final, redone, err := savedAhead(t, m2, graph.ExternalInline, wait); err != nil || !redone || !bytes.Equal(got, want) || len(left) != 1 {
		t.Fatalf("redone %v, %v, files %v, %d bytes (want %d, equal %v)", redone, err, left, len(got), len(want), bytes.Equal(got, want))
	} else if j1, j2 := mustJSON(t, rep), mustJSON(t, final); !bytes.Equal(j1, j2) {
		t.Fatalf("report differs:\n%s\nwant\n%s", j2, j1)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
