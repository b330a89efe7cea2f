package passes

import (
	"encoding/json"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/models"
)

// TestDenseIndexMatchesGraph checks the detector's numbering against the
// graph index's own answers, node by node and edge by edge, on a generated
// model and on a graph whose file order is not topological (where the
// index's recorded numbers cannot be reused and names are looked up).
func TestDenseIndexMatchesGraph(t *testing.T) {
	m, err := models.Build(models.Config{Shape: models.ShapeUnrolled, Layers: 2, Experts: 4, TopK: 2, Hidden: 8, Inter: 8, Normalize: true, SharedInter: 8})
	if err != nil {
		t.Fatal(err)
	}
	shuffled, err := models.Build(models.Config{Shape: models.ShapeBatched, Layers: 2, Experts: 4, TopK: 2, Hidden: 8, Inter: 8, Normalize: true})
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(shuffled.Proto.Graph.Node)
	for name, m := range map[string]*graph.Model{"unrolled": m, "reversed": shuffled} {
		g := m.Graph()
		c, err := newCtx(m, g)
		if err != nil {
			t.Fatal(err)
		}
		for p, n := range c.topo {
			if q, ok := c.posOf(n); !ok || int(q) != p {
				t.Fatalf("%s: posOf(%s) = %d, %v, want %d", name, graph.NodeLabel(n), q, ok, p)
			}
			ins := graph.NodeInputs(n)
			if got := int(c.d.inOff[p+1] - c.d.inOff[p]); got != len(ins) {
				t.Fatalf("%s: %s has %d input edges, want %d", name, graph.NodeLabel(n), got, len(ins))
			}
			for k, in := range ins {
				e := c.d.inOff[p] + int32(k)
				if in == "" {
					if c.d.inVal[e] != -1 || c.d.inPred[e] != -1 {
						t.Fatalf("%s: empty input %d of %s numbered %d", name, k, graph.NodeLabel(n), c.d.inVal[e])
					}
					continue
				}
				if c.d.inVal[e] != g.ValueID(in) {
					t.Fatalf("%s: input %q of %s numbered %d, want %d", name, in, graph.NodeLabel(n), c.d.inVal[e], g.ValueID(in))
				}
				prod := g.Producer(in)
				if want, ok := c.posOf(prod); (prod == nil) != (c.d.inPred[e] < 0) || prod != nil && (!ok || c.d.inPred[e] != want) {
					t.Fatalf("%s: producer of %q at %d, want %v", name, in, c.d.inPred[e], prod)
				}
				cons := c.d.consumers(c.d.inVal[e])
				if len(cons) != len(g.Consumers(in)) || !slices.Contains(cons, int32(p)) {
					t.Fatalf("%s: consumers of %q: %v, graph has %d", name, in, cons, len(g.Consumers(in)))
				}
			}
			for k, o := range n.Output {
				if got := c.d.outVal[c.d.outOff[p]+int32(k)]; o != "" && got != g.ValueID(o) {
					t.Fatalf("%s: output %q numbered %d, want %d", name, o, got, g.ValueID(o))
				}
			}
		}
	}
}

// TestSpeculationMatchesSequential detects every real export with one
// processor (candidates analysed in turn, on the detector's own context)
// and with several (candidates analysed by parallel workers first): the
// blocks, their regions and the near-misses must be the same.
func TestSpeculationMatchesSequential(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(exportedDir, "*.onnx"))
	more, _ := filepath.Glob(filepath.Join(fixtureDir, "*.onnx"))
	files = append(files, more...)
	if len(files) == 0 {
		t.Fatalf("no exported models in %s or %s", exportedDir, fixtureDir)
	}
	// A generated model with many blocks: several per worker.
	gen := filepath.Join(t.TempDir(), "gen.onnx")
	m, err := models.Build(models.Config{Shape: models.ShapeUnrolled, Layers: 6, Experts: 8, TopK: 2, Hidden: 8, Inter: 8, Normalize: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Save(gen, graph.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	files = append(files, gen)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	detect := func(path string, procs int) string {
		runtime.GOMAXPROCS(procs)
		m, err := graph.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		det, err := Detect(m)
		if err != nil {
			t.Fatal(err)
		}
		type blk struct {
			B      *Block
			Region []string
		}
		var out []blk
		for _, b := range det.Blocks {
			r := blk{B: b}
			for _, n := range b.Region {
				r.Region = append(r.Region, graph.NodeLabel(n))
			}
			out = append(out, r)
		}
		j, err := json.Marshal(struct {
			Blocks   []blk
			NearMiss []NearMiss
		}{out, det.NearMiss})
		if err != nil {
			t.Fatal(err)
		}
		return string(j)
	}
	for _, f := range files {
		seq, par := detect(f, 1), detect(f, 4)
		if seq != par {
			t.Errorf("%s: detection differs between 1 and 4 processors:\n%s\n%s", filepath.Base(f), seq, par)
		}
	}
}
