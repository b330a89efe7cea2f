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
	"github.com/mokopt/mokopt/moe"
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
						corruptWeights = func(b *Block, w *moe.Weights) {
							for i := range w.Down {
								w.Down[i] *= 1.01
							}
						}
						defer func() { corruptWeights = nil }()
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
					var final *Report
					got, left, err2 := saved(t, m2, mode, func() error {
						var err error
						final, err = wait()
						return err
					})
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
