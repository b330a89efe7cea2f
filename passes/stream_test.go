package passes

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
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

// TestWriteCanonicalMatchesValues: every fused tensor streamed from a side
// file (writeCanonical: range copies of float32 rows, whole, halves or
// interleaved, and transposes) holds the bytes of the same tensor gathered
// in memory (values, the path the numerical check's weights take), over
// shapes whose weight plans cover every part and both layouts.
func TestWriteCanonicalMatchesValues(t *testing.T) {
	seen := map[[2]int]bool{} // {part, inOut}
	halves := map[pb.TensorProto_DataType]int{}
	for _, cfg := range []models.Config{
		{Shape: models.ShapeBatched, Tokens: 16},
		{Shape: models.ShapeUnrolled},
		{Shape: models.ShapeDense},
		{Shape: models.ShapeORT},
		{Shape: models.ShapeORT, ORTSwiGLU: true},
		{Shape: models.ShapeBatched, DType: models.DTypeBFloat16},
		{Shape: models.ShapeUnrolled, DType: models.DTypeFloat16},
	} {
		cfg.Layers, cfg.Experts, cfg.TopK, cfg.Hidden, cfg.Inter = 1, 4, 2, 16, 24
		if cfg.Shape != models.ShapeORT {
			cfg.SharedInter = 8
		}
		cfg.Router, cfg.Normalize, cfg.External, cfg.Seed = "softmax", true, true, 5
		name := cfg.Shape + map[bool]string{true: "_swiglu"}[cfg.ORTSwiGLU] + map[bool]string{true: "_" + cfg.DType}[cfg.DType != ""]
		t.Run(name, func(t *testing.T) {
			m := writtenModel(t, cfg)
			det, err := Detect(m)
			if err != nil || len(det.Blocks) == 0 {
				t.Fatalf("detect: %v, %d blocks", err, len(det.Blocks))
			}
			for _, b := range det.Blocks {
				ts, err := b.W.fusedTensors(&b.Spec)
				if err != nil {
					t.Fatal(err)
				}
				keepHalfWeights(ts) // half sources: their matrices stream as they are stored
				for i := range ts {
					ft := &ts[i]
					if len(ft.projs) == 0 {
						continue
					}
					var streamed, widened bytes.Buffer
					for _, q := range ft.projs {
						seen[[2]int{q.Part, map[bool]int{true: 1}[q.InOut]}] = true
						if err := q.writeCanonical(m, &streamed, ft.isVec, ft.dtype()); err != nil {
							t.Fatal(err)
						}
						if err := q.writeCanonical(m, &widened, ft.isVec, pb.TensorProto_FLOAT); err != nil {
							t.Fatal(err)
						}
					}
					v, err := ft.values(m, map[*pb.TensorProto][]float32{})
					if err != nil {
						t.Fatal(err)
					}
					// Independently: each source decoded whole, its rows taken.
					var ref []float32
					for _, q := range ft.projs {
						raw, err := m.TensorBytes(q.Init)
						if err != nil {
							t.Fatal(err)
						}
						all, err := graph.DecodeFloat32(graph.DataType(q.Init), raw)
						if err != nil {
							t.Fatal(err)
						}
						d := q.Init.GetDims()
						if ft.isVec {
							n := int(d[len(d)-1])
							src := all[max(q.Expert, 0)*n:][:n]
							start, step, k := partRange(q.Part, n)
							for i := 0; i < k; i++ {
								ref = append(ref, src[start+i*step])
							}
							continue
						}
						r, cc := int(d[len(d)-2]), int(d[len(d)-1])
						ref = appendRows(ref, all[max(q.Expert, 0)*r*cc:][:r*cc], r, cc, q.InOut, q.Part)
					}
					if !slices.Equal(v, ref) {
						t.Errorf("%s %s: values read %v, decoded whole %v", b.Name, ft.role, v, ref)
					}
					var want, want32 bytes.Buffer
					if err := writeFloatsAs(&want, v, ft.dtype()); err != nil {
						t.Fatal(err)
					}
					if err := writeFloatsAs(&want32, v, pb.TensorProto_FLOAT); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(streamed.Bytes(), want.Bytes()) || int64(streamed.Len()) != ft.size() {
						t.Errorf("%s %s: streamed %d bytes (%s) differ from the %d gathered in memory (size %d)", b.Name, ft.role, streamed.Len(), ft.dtype(), want.Len(), ft.size())
					}
					if !bytes.Equal(widened.Bytes(), want32.Bytes()) {
						t.Errorf("%s %s: streamed float32 bytes differ from the values gathered in memory", b.Name, ft.role)
					}
					if ft.dtype() != pb.TensorProto_FLOAT {
						halves[ft.dtype()]++
						// The kept half matrix is the source's bytes: decoding
						// it gives the values gathered, exactly.
						back, err := graph.DecodeFloat32(ft.dtype(), streamed.Bytes())
						if err != nil || !slices.Equal(back, v) {
							t.Errorf("%s %s: kept %s bytes decode to other values (%v)", b.Name, ft.role, ft.dtype(), err)
						}
					}
				}
			}
		})
	}
	if halves[pb.TensorProto_BFLOAT16] == 0 || halves[pb.TensorProto_FLOAT16] == 0 {
		t.Errorf("half matrices kept: %v, want both half types", halves)
	}
	for _, want := range [][2]int{{PartWhole, 0}, {PartWhole, 1}, {PartFirstHalf, 0}, {PartSecondHalf, 0}, {PartEven, 0}, {PartOdd, 0}} {
		if !seen[want] {
			t.Errorf("no projection with {part, inOut} %v: the shapes no longer cover it (covered: %v)", want, seen)
		}
	}
}
