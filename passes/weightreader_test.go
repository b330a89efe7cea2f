package passes

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/internal/fixtures"
	"github.com/mokopt/mokopt/models"
	"github.com/mokopt/mokopt/moe"
)

// readerModel is a model to compare the plan reader on: how it was made,
// and a loader.
type readerModel struct {
	name string
	load func(t *testing.T) *graph.Model
}

// readerModels lists generated models in every shape and element type the
// models package writes, each stored inline, as deferred tensors (Build
// with External) and in a side file (written and loaded), and every
// fixture model of the repository's testdata.
func readerModels(t *testing.T) []readerModel {
	var out []readerModel
	for _, shape := range []string{models.ShapeBatched, models.ShapeUnrolled, models.ShapeDense, models.ShapeORT, models.ShapeORT + "_swiglu"} {
		for _, dt := range models.DTypes {
			for _, storage := range []string{"inline", "deferred", "side file"} {
				cfg := models.Config{Shape: shape, Layers: 1, Experts: 4, TopK: 2, Hidden: 16, Inter: 24, Router: "softmax", Normalize: true, Seed: 9, DType: dt}
				if shape == models.ShapeORT+"_swiglu" {
					cfg.Shape, cfg.ORTSwiGLU = models.ShapeORT, true
				}
				if cfg.Shape != models.ShapeORT {
					cfg.SharedInter = 8
				}
				cfg.External = storage != "inline"
				out = append(out, readerModel{fmt.Sprintf("gen/%s/%s/%s", shape, dt, storage), func(t *testing.T) *graph.Model {
					if storage != "side file" {
						m, err := models.Build(cfg)
						if err != nil {
							t.Skipf("models.Build: %v", err) // a shape without this element type
						}
						return m
					}
					path := filepath.Join(t.TempDir(), "m.onnx")
					if err := models.Write(cfg, path); err != nil {
						t.Skipf("models.Write: %v", err)
					}
					m, err := graph.Load(path)
					if err != nil {
						t.Fatal(err)
					}
					return m
				}})
			}
		}
	}
	testdata := filepath.Dir(fixtures.Dir())
	files, _ := filepath.Glob(filepath.Join(testdata, "*", "*.onnx"))
	if len(files) < 100 {
		t.Fatalf("only %d fixture models under %s", len(files), testdata)
	}
	for _, f := range files {
		out = append(out, readerModel{"testdata/" + filepath.Base(filepath.Dir(f)) + "/" + filepath.Base(f), func(t *testing.T) *graph.Model {
			m, err := graph.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			return m
		}})
	}
	return out
}

// projLayout names what a projection exercises of the reader: its part and
// storage order, element type, whether its initializer holds every expert,
// and where its bytes are.
func projLayout(m *graph.Model, q *Proj) []string {
	where := "raw_data"
	switch _, deferred := m.Deferred(q.Init); {
	case deferred:
		where = "deferred"
	case graph.IsExternal(q.Init):
		where = "side file"
	case q.Init.RawData == nil:
		where = "typed fields"
	}
	stacked := map[bool]string{true: "stacked", false: "per expert"}[q.Expert >= 0]
	return []string{
		fmt.Sprintf("part %d inOut %v", q.Part, q.InOut),
		graph.DataType(q.Init).String(),
		stacked,
		where,
	}
}

// sameBits reports whether a and b hold the same float32 bit patterns.
func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

// TestPlanReaderMatchesMaterialize: for every block of every generated
// model (each shape, element type and storage) and fixture, every routed
// expert the plan reader returns equals, bit for bit, that expert's rows of
// the weights Materialize gathers, and the weights the check reads whole
// (router, biases, shared expert) equal Materialize's; the models must
// cover every part and storage order of a projection, float32, float16 and
// bfloat16 sources, stacked and per-expert initializers, and raw_data,
// deferred and side-file bytes.
func TestPlanReaderMatchesMaterialize(t *testing.T) {
	seen := map[string]bool{}
	blocks := 0
	for _, rm := range readerModels(t) {
		t.Run(rm.name, func(t *testing.T) {
			m := rm.load(t)
			defer m.Close()
			det, err := Detect(m)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range det.Blocks {
				w, err := b.W.Materialize(m, &b.Spec)
				if err != nil {
					continue // a plan that does not read (the check refuses it the same way)
				}
				blocks++
				for e := range b.W.Experts {
					x := &b.W.Experts[e]
					for _, q := range []*Proj{x.Gate, x.Up, x.Down} {
						if q != nil {
							for _, l := range projLayout(m, q) {
								seen[l] = true
							}
						}
					}
				}
				comparePlanReader(t, m, b, w)
			}
		})
	}
	var missing []string
	for _, want := range []string{
		"part 0 inOut false", "part 0 inOut true", "part 1 inOut false", "part 2 inOut false", "part 3 inOut false", "part 4 inOut false",
		"FLOAT", "FLOAT16", "BFLOAT16", "stacked", "per expert", "raw_data", "deferred", "side file",
	} {
		if !seen[want] {
			missing = append(missing, want)
		}
	}
	if len(missing) > 0 {
		var have []string
		for k := range seen {
			have = append(have, k)
		}
		sort.Strings(have)
		t.Errorf("no routed projection with %v: the models no longer cover it (covered: %v)", missing, have)
	}
	t.Logf("%d blocks compared; layouts covered: %v", blocks, seen)
}

// comparePlanReader checks block b's plan reader against w, its weights as
// Materialize reads them. Experts are read in a shuffled order, each twice,
// so that no result depends on what the reader read before.
func comparePlanReader(t *testing.T, m *graph.Model, b *Block, w *moe.Weights) {
	t.Helper()
	cw, err := b.checkWeights(m, nil)
	if err != nil {
		t.Fatalf("%s: checkWeights: %v", b.Name, err)
	}
	if cw.Gate != nil || cw.Up != nil || cw.Down != nil || cw.Experts == nil {
		t.Fatalf("%s: the check's weights hold the routed matrices whole", b.Name)
	}
	for _, p := range []struct {
		name      string
		got, want []float32
	}{
		{"router", cw.RouterW, w.RouterW}, {"router bias", cw.RouterB, w.RouterB}, {"correction bias", cw.CorrectionBias, w.CorrectionBias},
		{"gate bias", cw.GateB, w.GateB}, {"up bias", cw.UpB, w.UpB}, {"down bias", cw.DownB, w.DownB},
		{"shared gate", cw.SharedGate, w.SharedGate}, {"shared up", cw.SharedUp, w.SharedUp},
		{"shared down", cw.SharedDown, w.SharedDown}, {"shared gate weight", cw.SharedGateW, w.SharedGateW},
	} {
		if !sameBits(p.got, p.want) || (p.got == nil) != (p.want == nil) {
			t.Errorf("%s: %s read whole differs from Materialize's", b.Name, p.name)
		}
	}
	E, n := len(b.W.Experts), b.Spec.Inter*b.Spec.Hidden
	order := make([]int, 0, 2*E)
	for e := range E {
		order = append(order, (e*5+3)%E, E-1-e)
	}
	for _, e := range order {
		gate, up, down, err := cw.Experts.Expert(e)
		if err != nil {
			t.Fatalf("%s: expert %d: %v", b.Name, e, err)
		}
		if (gate == nil) != (w.Gate == nil) {
			t.Fatalf("%s: expert %d: gate %v, Materialize's %v", b.Name, e, gate != nil, w.Gate != nil)
		}
		if w.Gate != nil && !sameBits(gate, w.Gate[e*n:(e+1)*n]) {
			t.Fatalf("%s: expert %d: gate differs from Materialize's rows", b.Name, e)
		}
		if !sameBits(up, w.Up[e*n:(e+1)*n]) {
			t.Fatalf("%s: expert %d: up differs from Materialize's rows", b.Name, e)
		}
		if !sameBits(down, w.Down[e*n:(e+1)*n]) {
			t.Fatalf("%s: expert %d: down differs from Materialize's rows", b.Name, e)
		}
	}
}

// TestCheckReadsRoutedExpertsOnce: the numerical check of generated
// two-layer models (weights in a side file; fused gate_up halves,
// per-expert initializers, stacked [in, out] matrices, an interleaved
// gate_up) reads each routed expert that its tokens are routed to exactly
// once and no other, on one core and with blocks checked while the model
// runs, and passes.
func TestCheckReadsRoutedExpertsOnce(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  models.Config
	}{
		{"batched", models.Config{Shape: models.ShapeBatched}},
		{"batched bf16", models.Config{Shape: models.ShapeBatched, DType: models.DTypeBFloat16}},
		{"unrolled", models.Config{Shape: models.ShapeUnrolled}},
		{"dense", models.Config{Shape: models.ShapeDense}},
		{"ort swiglu", models.Config{Shape: models.ShapeORT, ORTSwiGLU: true}},
	} {
		cfg := c.cfg
		cfg.Layers, cfg.Experts, cfg.TopK, cfg.Hidden, cfg.Inter = 2, 16, 2, 32, 48
		cfg.Router, cfg.Normalize, cfg.External, cfg.Seed = "softmax", true, true, 4
		path := filepath.Join(t.TempDir(), "m.onnx")
		if err := models.Write(cfg, path); err != nil {
			t.Fatal(err)
		}
		for _, procs := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/GOMAXPROCS=%d", c.name, procs), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				m, err := graph.Load(path)
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				det, err := Detect(m)
				if err != nil || len(det.Blocks) != cfg.Layers {
					t.Fatalf("detect: %v, %d blocks", err, len(det.Blocks))
				}
				assertReadsOnce(t, m, det.Blocks)
			})
		}
	}
}

// assertReadsOnce runs the numerical check of blocks on m from their weight
// plans and checks that it read each routed expert once.
func assertReadsOnce(t *testing.T, m *graph.Model, blocks []*Block) {
	t.Helper()
	var mu sync.Mutex
	reads := map[*Block]map[int]int{}
	routed := map[*Block]map[int]bool{}
	expertRead = func(b *Block, e int) {
		mu.Lock()
		defer mu.Unlock()
		if reads[b] == nil {
			reads[b] = map[int]int{}
		}
		reads[b][e]++
	}
	checkedRouting = func(b *Block, ids [][]int, only func(int) bool) {
		mu.Lock()
		defer mu.Unlock()
		if routed[b] != nil {
			t.Errorf("%s checked twice", b.Name)
		}
		routed[b] = map[int]bool{}
		for _, tok := range ids {
			for _, e := range tok {
				if only == nil || only(e) {
					routed[b][e] = true
				}
			}
		}
	}
	defer func() { expertRead, checkedRouting = nil, nil }()
	errs, err := numericCheck(context.Background(), m, blocks, make([]*moe.Weights, len(blocks)), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range blocks {
		if errs[i] != nil {
			t.Fatalf("%s: %v", b.Name, errs[i])
		}
		if len(routed[b]) == 0 {
			t.Fatalf("%s: no expert routed to", b.Name)
		}
		var bad []string
		for e := range b.W.Experts {
			if want := map[bool]int{true: 1}[routed[b][e]]; reads[b][e] != want {
				bad = append(bad, fmt.Sprintf("expert %d read %d times, want %d", e, reads[b][e], want))
			}
		}
		if len(bad) > 0 {
			t.Errorf("%s: %s", b.Name, strings.Join(bad, "; "))
		}
	}
}

// TestCorruptExpertFails: a routed weight edited as the reader reads it
// makes the check of that block fail, of the others pass, so the check
// computes from what the reader returns.
func TestCorruptExpertFails(t *testing.T) {
	m := writtenModel(t, models.Config{Shape: models.ShapeBatched, Layers: 2, Experts: 8, TopK: 2, Hidden: 32, Inter: 48, Router: "softmax", Normalize: true, External: true, Seed: 4})
	det, err := Detect(m)
	if err != nil || len(det.Blocks) != 2 {
		t.Fatalf("detect: %v", err)
	}
	bad := det.Blocks[1]
	corruptExpert = func(b *Block, e int, gate, up, down []float32) {
		if b == bad {
			down[7] += 0.5
		}
	}
	defer func() { corruptExpert = nil }()
	errs, err := numericCheck(context.Background(), m, det.Blocks, make([]*moe.Weights, 2), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || errs[1] == nil || !strings.Contains(errs[1].Error(), "differ") {
		t.Fatalf("check errors %v, want only the second block's to fail", errs)
	}
}

// TestCheckBytesBoundedByExperts: what the check of a block holds for its
// weights (checkBytes) is the router, shared expert and biases plus two
// experts' matrices, a small part of the block's routed weights at many
// experts.
func TestCheckBytesBoundedByExperts(t *testing.T) {
	cfg := models.Config{Shape: models.ShapeBatched, Layers: 1, Experts: 64, TopK: 8, Hidden: 32, Inter: 48, SharedInter: 16, Router: "softmax", Normalize: true, Seed: 1}
	m, err := models.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	det, err := Detect(m)
	if err != nil || len(det.Blocks) != 1 {
		t.Fatalf("detect: %v", err)
	}
	b := det.Blocks[0]
	H, I, E, Is := int64(cfg.Hidden), int64(cfg.Inter), int64(cfg.Experts), int64(cfg.SharedInter)
	want := 4 * (E*H + 3*Is*H + 2*3*H*I) // router, shared expert, two experts (the generated router has no bias)
	if got := b.W.checkBytes(&b.Spec); got != want {
		t.Errorf("checkBytes %d, want %d", got, want)
	}
	if routed := 4 * 3 * E * H * I; want*4 > routed {
		t.Errorf("checkBytes %d is not small against the %d bytes of routed matrices", want, routed)
	}
}

// writtenModel writes the model cfg describes to a temporary folder (its
// weights in a side file when cfg.External) and loads it; the model is
// closed when the test ends.
func writtenModel(t *testing.T, cfg models.Config) *graph.Model {
	t.Helper()
	path := filepath.Join(t.TempDir(), "m.onnx")
	if err := models.Write(cfg, path); err != nil {
		t.Fatal(err)
	}
	m, err := graph.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}
