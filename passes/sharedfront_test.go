package passes

import (
	"fmt"
	"slices"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/chain"
	"github.com/mokopt/mokopt/models"
	"google.golang.org/protobuf/proto"
)

// TestSharedFrontOverlap runs detection's last step on two blocks (E=4
// and E=6, batched and unrolled) that read one flatten of their input
// (chain.ParallelOptions.ShareFront): their regions share that node and
// the other weightless computations of the input, and both are kept. The
// same blocks with one more node of the other's in one region, computed
// after a weight (the other's router linear, selection, an expert's
// output, its combine), are both refused.
func TestSharedFrontOverlap(t *testing.T) {
	for _, shape := range []string{models.ShapeBatched, models.ShapeUnrolled} {
		var ms []*graph.Model
		for _, E := range []int{4, 6} {
			m, err := models.Build(models.Config{Shape: shape, Layers: 1, Experts: E, TopK: 2, Hidden: 16, Inter: 8, Normalize: true, Seed: int64(E)})
			if err != nil {
				t.Fatal(err)
			}
			ms = append(ms, m)
		}
		mp, err := chain.Parallel(ms, chain.ParallelOptions{Sum: true, ShareFront: true})
		if err != nil {
			t.Fatal(err)
		}
		raw, err := proto.Marshal(mp)
		if err != nil {
			t.Fatal(err)
		}
		m, err := graph.Parse(raw, "shared front "+shape)
		if err != nil {
			t.Fatal(err)
		}
		c, det := detectView(t, m)
		if len(det.Blocks) != 2 {
			t.Fatalf("%s: detect: %d blocks, %v", shape, len(det.Blocks), det.NearMiss)
		}
		a, b := det.Blocks[0], det.Blocks[1]
		var shared []*pb.NodeProto
		for _, n := range a.Region {
			if slices.Contains(b.Region, n) {
				shared = append(shared, n)
			}
		}
		if len(shared) == 0 {
			t.Fatalf("%s: the blocks share no node: the case does not test sharing", shape)
		}
		weighted := func(op string) *pb.NodeProto {
			for _, n := range a.Region {
				if n.GetOpType() == op && !slices.Contains(shared, n) {
					if op != "Gemm" && op != "MatMul" || c.expertMatMul(n) != nil {
						return n
					}
				}
			}
			t.Fatalf("%s: no %s in the first block", shape, op)
			return nil
		}
		out := c.g.Producer(a.Output)
		cases := []struct {
			name  string
			extra *pb.NodeProto
			kept  int
		}{
			{"as detected", nil, 2},
			{"the other's selection", a.TopK, 0},
			{"the other's router linear or an expert", weighted(map[string]string{models.ShapeBatched: "MatMul", models.ShapeUnrolled: "Gemm"}[shape]), 0},
			{"the other's combine", out, 0},
		}
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/%s", shape, tc.name), func(t *testing.T) {
				b2 := *b
				b2.Region, b2.regionPos = slices.Clone(b.Region), nil
				if tc.extra != nil {
					b2.Region = append(b2.Region, tc.extra)
				}
				d := &Detection{Blocks: []*Block{a, &b2}}
				c.dropOverlaps(d)
				if len(d.Blocks) != tc.kept {
					t.Fatalf("kept %d blocks, want %d (shared: %d nodes; near-misses %v)", len(d.Blocks), tc.kept, len(shared), d.NearMiss)
				}
			})
		}
	}
}
