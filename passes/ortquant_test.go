package passes

import (
	"context"
	"math"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/ortmoe"
	"github.com/mokopt/mokopt/moe"
)

// TestQMoEDequantizesOnce: a QMoE model whose codes lie in a side file is
// rewritten as the command line does it (RewriteAhead: the check runs on
// a fork while the writer streams the fused weights), and the fused model
// computes what the QMoE node computed (ortmoe's kernel, run before the
// rewrite). Each row of the dequantized stacks is made a bounded number
// of times in all (the check reads each expert once, the writer each part
// of it once), not once per expert read: with 16 experts, dequantizing a
// whole stack per expert read would make every row 16 times or more.
func TestQMoEDequantizesOnce(t *testing.T) {
	byName := map[string]ortmoe.Case{}
	for _, c := range ortmoe.Cases() {
		byName[c.Name] = c
	}
	defer func(c int) { qmoeChunk = c }(qmoeChunk)
	for _, tc := range []struct {
		name  string
		zero  bool // explicit fc1 zero points
		chunk int  // values dequantized at a time
	}{
		{"qmoe_int8_swiglu", false, 1 << 20},
		{"qmoe_int4_swiglu_nonorm", true, 1 << 20},
		{"qmoe_int4_block16_oai_bias", true, 1000}, // chunks that do not divide an expert's rows
		{"qmoe_int8_block32_swiglu", false, 64 * 3},
		{"qmoe_int8_relu", false, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ok := byName[tc.name]
			if !ok {
				t.Fatalf("no case %s", tc.name)
			}
			c.E, c.H, c.I = 16, 64, 96
			qmoeChunk = tc.chunk
			b, err := c.Model()
			if err != nil {
				t.Fatal(err)
			}
			if tc.zero {
				c.AddZeroPoints(b.Model)
			}
			dir := t.TempDir()
			in := filepath.Join(dir, "qmoe.onnx")
			if err := b.Model.Save(in, graph.SaveOptions{External: graph.ExternalRepack, Threshold: 1}); err != nil {
				t.Fatal(err)
			}
			m, err := graph.Load(in)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			feeds := ortFeeds(c.H, c.Seed)
			want, err := eval.Run(context.Background(), m, feeds, eval.Options{Kernels: evalKernels()})
			if err != nil {
				t.Fatalf("original: %v", err)
			}
			var rows atomic.Int64
			qmoeRowsMade = func(k int) { rows.Add(int64(k)) }
			defer func() { qmoeRowsMade = nil }()
			rep, wait, err := RewriteAhead(m, Options{Check: true})
			if err != nil {
				t.Fatalf("RewriteAhead: %v", err)
			}
			if len(rep.Fused) != 1 {
				t.Fatalf("%d blocks fused, want 1", len(rep.Fused))
			}
			out := filepath.Join(dir, "fused.onnx")
			ready := func() error { _, _, err := wait(); return err }
			if err := m.Save(out, graph.SaveOptions{External: graph.ExternalKeep, Ready: ready}); err != nil {
				t.Fatalf("save: %v", err)
			}
			f := 1
			if c.Attrs.Fusion > 0 {
				f = 2
			}
			stacked := int64(c.E * (f*c.I + c.H)) // rows of fc1 and fc2
			if got := rows.Load(); got == 0 || got > 4*stacked {
				t.Errorf("%d rows dequantized for stacks of %d rows: want at least one and at most 4 passes", got, stacked)
			}
			fm, err := graph.Load(out)
			if err != nil {
				t.Fatal(err)
			}
			defer fm.Close()
			for _, n := range fm.Proto.Graph.Node {
				if n.GetOpType() != moe.OpType {
					continue
				}
				if w := fm.Graph().Initializer(n.Input[moe.InUp]); w == nil || !graph.IsExternal(w) {
					t.Errorf("the fused up weights %q of a model whose codes came in a side file are not in one", n.Input[moe.InUp])
				}
			}
			got, err := eval.Run(context.Background(), fm, feeds, eval.Options{Kernels: evalKernels()})
			if err != nil {
				t.Fatalf("fused: %v", err)
			}
			// Outputs of unit scale or more (the oai case's weights are
			// scaled 6×, its outputs cancel from terms of ~50) are
			// compared with an absolute tolerance of their scale.
			scale := 1.0
			for _, v := range want[ortmoe.OutputName].F32 {
				scale = max(scale, math.Abs(float64(v)))
			}
			d, err := eval.Compare(got[ortmoe.OutputName], want[ortmoe.OutputName], CheckTolerance.RTol, CheckTolerance.ATol*scale)
			if err != nil || !d.OK() {
				t.Fatalf("fused vs QMoE: %+v %v", d, err)
			}
			t.Logf("%d rows dequantized for %d stacked rows; max abs err %.3g of outputs up to %.3g", rows.Load(), stacked, d.MaxAbs, scale)
		})
	}
}
