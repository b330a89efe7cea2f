package mokopt_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/models"
)

// TestRewriteAndSave: RewriteAndSave writes what Rewrite then Save write,
// with the same report, whichever path it takes (the check while the
// model is written, or one after the other for Partial and SkipCheck);
// a check that fails (over its memory limit) gives Rewrite's error and
// leaves no file at all; progress events arrive one at a time.
func TestRewriteAndSave(t *testing.T) {
	dir := t.TempDir()
	g, err := models.Build(models.Config{Shape: models.ShapeBatched, Layers: 3, Experts: 8, TopK: 2, Hidden: 64, Inter: 96, Router: "softmax", Normalize: true, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "src.onnx")
	if err := g.Save(src, graph.SaveOptions{External: graph.ExternalRepack}); err != nil {
		t.Fatal(err)
	}
	files := func(d string) []string {
		es, _ := os.ReadDir(d)
		var out []string
		for _, e := range es {
			out = append(out, e.Name())
		}
		return out
	}
	read := func(p string) []byte {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := os.ReadFile(p + ".data")
		return append(b, d...)
	}
	for _, tc := range []struct {
		name string
		opt  mokopt.RewriteOptions
		fail bool
	}{
		{"check", mokopt.RewriteOptions{StreamWeights: true}, false},
		{"no check", mokopt.RewriteOptions{SkipCheck: true, StreamWeights: true}, false},
		{"partial", mokopt.RewriteOptions{Partial: true}, false},
		{"over the check's memory limit", mokopt.RewriteOptions{MemLimit: 4096, StreamWeights: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, mode := range []mokopt.ExternalMode{mokopt.ExternalKeep, mokopt.ExternalInline} {
				a, b := filepath.Join(t.TempDir(), "out.onnx"), t.TempDir()
				m := load(t, src)
				rep, err := mokopt.Rewrite(context.Background(), m, tc.opt)
				if err == nil {
					err = mokopt.Save(context.Background(), m, a, mokopt.SaveOptions{External: mode})
				}
				m.Close()
				if tc.fail != (err != nil) {
					t.Fatalf("Rewrite then Save: %v", err)
				}

				m2 := load(t, src)
				busy := make(chan struct{}, 1)
				events := 0
				opt := tc.opt
				opt.Progress = func(mokopt.Event) {
					select {
					case busy <- struct{}{}:
					default:
						t.Error("two progress calls at once")
					}
					events++
					<-busy
				}
				rep2, err2 := mokopt.RewriteAndSave(context.Background(), m2, filepath.Join(b, "out.onnx"), opt, mokopt.SaveOptions{External: mode, Progress: opt.Progress})
				m2.Close()
				if tc.fail {
					var se *mokopt.SaveError
					if err2 == nil || err2.Error() != err.Error() || !errors.Is(err2, eval.ErrMemLimit) || errors.As(err2, &se) {
						t.Fatalf("got %v, want %v", err2, err)
					}
					if left := files(b); len(left) != 0 {
						t.Fatalf("a failed check left %v", left)
					}
					continue
				}
				if err2 != nil {
					t.Fatal(err2)
				}
				if !bytes.Equal(read(filepath.Join(b, "out.onnx")), read(a)) {
					t.Fatalf("mode %v: RewriteAndSave wrote other bytes than Rewrite then Save", mode)
				}
				j1, _ := json.Marshal(rep)
				j2, _ := json.Marshal(rep2)
				if !bytes.Equal(j1, j2) || len(rep.Fused) != 3 {
					t.Fatalf("reports differ:\n%s\n%s", j2, j1)
				}
				if events == 0 {
					t.Fatal("no progress reported")
				}
			}
			// To standard output, with the weights inline: the bytes of
			// Rewrite then Write, and nothing at all when the check fails.
			m := load(t, src)
			rep, err := mokopt.Rewrite(context.Background(), m, tc.opt)
			var want bytes.Buffer
			if err == nil {
				err = mokopt.Write(context.Background(), m, &want, mokopt.SaveOptions{External: mokopt.ExternalInline})
			}
			m.Close()
			out, err2 := os.CreateTemp(t.TempDir(), "stdout")
			if err2 != nil {
				t.Fatal(err2)
			}
			old := os.Stdout
			os.Stdout = out
			m2 := load(t, src)
			rep2, err2 := mokopt.RewriteAndSave(context.Background(), m2, mokopt.Stdio, tc.opt, mokopt.SaveOptions{External: mokopt.ExternalInline})
			os.Stdout = old
			m2.Close()
			out.Close()
			got, _ := os.ReadFile(out.Name())
			if tc.fail {
				if err2 == nil || err2.Error() != err.Error() || len(got) != 0 {
					t.Fatalf("to standard output: %v with %d bytes written, want %v and nothing", err2, len(got), err)
				}
				return
			}
			if err2 != nil || !bytes.Equal(got, want.Bytes()) {
				t.Fatalf("to standard output: %v, %d bytes, not the %d of Rewrite then Write", err2, len(got), want.Len())
			}
			j1, _ := json.Marshal(rep)
			j2, _ := json.Marshal(rep2)
			if !bytes.Equal(j1, j2) {
				t.Fatalf("to standard output, reports differ:\n%s\n%s", j2, j1)
			}
		})
	}
}
