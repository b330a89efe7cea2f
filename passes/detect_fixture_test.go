package passes

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/fixtures"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

var fixtureDir = fixtures.Dir()

func readPB(t *testing.T, path string) []float32 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tp := &pb.TensorProto{}
	if err := proto.Unmarshal(b, tp); err != nil {
		t.Fatal(err)
	}
	m := &graph.Model{}
	raw, err := m.TensorBytes(tp)
	if err != nil {
		t.Fatal(err)
	}
	f, err := graph.DecodeFloat32(graph.DataType(tp), raw)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestDetectFixturesReferenceMath checks the detector's block count on
// every fixture and, on the block fixtures, that the fused node's reference
// semantics with the extracted spec and weights reproduce ONNX Runtime's
// golden output from the golden input.
func TestDetectFixturesReferenceMath(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(fixtureDir, "*.onnx"))
	if len(files) == 0 {
		t.Fatalf("no fixtures in %s", fixtureDir)
	}
	for _, f := range files {
		m, err := graph.Load(f)
		if err != nil {
			t.Fatal(err)
		}
		d, err := Detect(m)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(f)
		var sb strings.Builder
		for _, b := range d.Blocks {
			fmt.Fprintf(&sb, "  block %s kind=%s nodes=%d spec=%+v\n", b.Name, b.Kind, b.Nodes, b.Spec)
			if strings.Contains(name, "_block_") {
				w, err := b.W.Materialize(m, &b.Spec)
				if err != nil {
					fmt.Fprintf(&sb, "  materialize: %v\n", err)
					continue
				}
				dir := strings.TrimSuffix(f, ".onnx") + "_data/test_data_set_0"
				x := readPB(t, dir+"/input_0.pb")
				y := readPB(t, dir+"/output_0.pb")
				got, err := moe.Forward(&b.Spec, w, x, len(x)/b.Spec.Hidden)
				if err != nil {
					t.Fatal(err)
				}
				var worst float64
				for i := range y {
					d := math.Abs(float64(got[i] - y[i]))
					worst = math.Max(worst, d)
					if d > 1e-5+1e-4*math.Abs(float64(y[i])) {
						t.Errorf("%s: element %d: reference %g, golden %g", name, i, got[i], y[i])
						break
					}
				}
				fmt.Fprintf(&sb, "  max abs err vs golden: %.3g\n", worst)
			}
		}
		want := 1
		switch base := strings.TrimSuffix(name, ".onnx"); {
		case lostExperts[base] && strings.Contains(base, "_full_"):
			want = 1 // one of the two layers lost experts
		case lostExperts[base]:
			want = 0
		case strings.Contains(base, "_full_"):
			want = 2
		}
		if len(d.Blocks) != want {
			t.Errorf("%s: %d blocks detected, want %d", name, len(d.Blocks), want)
		}
		for _, nm := range d.NearMiss {
			fmt.Fprintf(&sb, "  near-miss %s: %s\n", nm.Node, nm.Reason)
		}
		t.Logf("%s: %d blocks\n%s", name, len(d.Blocks), sb.String())
	}
}
