package passes

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/models"
)

// TestStreamedStackingMatchesMaterialized rewrites generated models whose
// expert weights live in a side file, in every exporter shape: without the
// numerical check the stacked weights must be deferred (streamed into the
// output's side file, not held in memory), and the saved bytes must equal
// those of the rewrite that materializes the weights (with the check),
// both inlined and kept external.
func TestStreamedStackingMatchesMaterialized(t *testing.T) {
	dir := t.TempDir()
	for _, shape := range []string{models.ShapeBatched, models.ShapeUnrolled, models.ShapeDense} {
		t.Run(shape, func(t *testing.T) {
			cfg := models.Config{Shape: shape, Layers: 2, Experts: 4, TopK: 2, Hidden: 32, Inter: 48, SharedInter: 16,
				Router: "softmax", Normalize: true, External: true, Seed: 3}
			in := filepath.Join(dir, shape+".onnx")
			if err := models.Write(cfg, in); err != nil {
				t.Fatal(err)
			}
			save := func(check bool, mode graph.ExternalMode, name string) ([]byte, []byte, *graph.Model) {
				m, err := graph.Load(in)
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if _, err := Rewrite(m, Options{Check: check}); err != nil {
					t.Fatal(err)
				}
				// Same file name in its own folder: the side file's name is in the model.
				if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
					t.Fatal(err)
				}
				out := filepath.Join(dir, name, "out.onnx")
				if err := m.Save(out, graph.SaveOptions{External: mode}); err != nil {
					t.Fatal(err)
				}
				b, err := os.ReadFile(out)
				if err != nil {
					t.Fatal(err)
				}
				data, _ := os.ReadFile(out + ".data")
				return b, data, m
			}
			streamed, sdata, m := save(false, graph.ExternalKeep, shape+"_s.onnx")
			stacked := 0
			for _, init := range m.Proto.Graph.Initializer {
				if n := init.GetName(); len(n) > 3 && (bytes.HasSuffix([]byte(n), []byte("/gate")) || bytes.HasSuffix([]byte(n), []byte("/down"))) {
					stacked++
					if init.RawData != nil || len(init.FloatData) > 0 {
						t.Errorf("stacked weight %q is held in memory", n)
					}
				}
			}
			if stacked != 2*cfg.Layers {
				t.Errorf("%d stacked gate/down weights, want %d", stacked, 2*cfg.Layers)
			}
			materialized, mdata, _ := save(true, graph.ExternalKeep, shape+"_m.onnx")
			if !bytes.Equal(streamed, materialized) || !bytes.Equal(sdata, mdata) {
				t.Error("streamed and materialized rewrites differ (external data kept)")
			}
			si, _, _ := save(false, graph.ExternalInline, shape+"_si.onnx")
			mi, _, _ := save(true, graph.ExternalInline, shape+"_mi.onnx")
			if !bytes.Equal(si, mi) {
				t.Error("streamed and materialized rewrites differ (inlined)")
			}
		})
	}
}
