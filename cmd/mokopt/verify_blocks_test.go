package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/verify"
	"github.com/mokopt/mokopt/kernel/mxfp8"
	"github.com/mokopt/mokopt/lowering"
	"google.golang.org/protobuf/proto"
)

// deepLowered writes a 16-layer generated model (h = h + MoE(h)), its
// rewrite and its lowering to the MoK kernel, and returns the fused and
// lowered paths.
func deepLowered(t *testing.T, dir string) (fused, low string) {
	t.Helper()
	src := filepath.Join(dir, "m.onnx")
	fused, low = filepath.Join(dir, "f.onnx"), filepath.Join(dir, "l.onnx")
	for _, args := range [][]string{
		{"gen", "-q", "--layers", "16", "--hidden", "256", "--inter", "256", "--experts", "8", "-o", src},
		{"rewrite", "-q", src, "-o", fused},
		{"lower", "-q", fused, "-o", low, "--target", "gb300-nvl72", "--ep", "8"},
	} {
		if code, _, stderr := run(t, nil, args...); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
	}
	return fused, low
}

// mutateKernel rewrites the lowered model at path into out with edit
// applied to the initializers of the block-th kernel node (by position in
// the graph), by name: its inputs by lowering's input positions.
func mutateKernel(t *testing.T, path, out string, block int, edit func(in []string, get func(string) []byte)) {
	t.Helper()
	m, err := graph.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	g := m.Graph()
	var kn *pb.NodeProto
	i := 0
	for _, n := range g.P.GetNode() {
		if _, _, ok := lowering.KernelRouting(n); ok {
			if i == block {
				kn = n
			}
			i++
		}
	}
	if kn == nil {
		t.Fatalf("no kernel node %d in %s", block, path)
	}
	edited := map[string][]byte{}
	get := func(name string) []byte {
		if b, ok := edited[name]; ok {
			return b
		}
		b, err := m.TensorBytes(g.Initializer(name))
		if err != nil {
			t.Fatal(err)
		}
		edited[name] = append([]byte(nil), b...)
		return edited[name]
	}
	edit(kn.Input, get)
	for name, b := range edited {
		tp := g.Initializer(name)
		tp.RawData, tp.ExternalData, tp.DataLocation = b, nil, nil
	}
	if err := m.Save(out, graph.SaveOptions{External: graph.ExternalRepack}); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyLoweredBlocks: a correct lowering of 16 stacked blocks passes
// block by block, each block's figures and routing flips reported, while
// the end-to-end error (reported) exceeds the per-block bound, so that the
// whole-model check at that bound refuses it; a lowering wrong in one block
// (its MXFP8 down scales one exponent off, two experts swapped, the gate
// matrices transposed) fails naming that block, and only that one.
func TestVerifyLoweredBlocks(t *testing.T) {
	dir := t.TempDir()
	fused, low := deepLowered(t, dir)
	const E, H, I = 8, 256, 256

	code, out, stderr := run(t, nil, "verify", "--json", "--tokens", "7", low, fused)
	if code != 0 {
		t.Fatalf("correct lowering: exit %d: %s %s", code, out, stderr)
	}
	var rep verify.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	cs := rep.Cases[0]
	if len(cs.Blocks) != 16 || rep.BlockBound != verify.DefaultMXFP8Bound || rep.EndToEndBound != 0.32 {
		t.Fatalf("want 16 blocks at bound 0.08, end to end 0.32; got %d blocks, %g, %g", len(cs.Blocks), rep.BlockBound, rep.EndToEndBound)
	}
	e2eFlips := 0
	for _, b := range cs.Blocks {
		if !b.Pass || b.RelL2 <= 0.01 || b.RelL2 > 0.08 || b.Decisions != 14 || b.RouterFlips != 0 || b.EndToEndFlips < 0 || b.KernelNode == "" {
			t.Errorf("block %d: %+v", b.Index, b)
		}
		e2eFlips += b.EndToEndFlips
	}
	e2e := cs.Outputs[0]
	if !e2e.Pass || e2e.QuantBound != 0.32 || e2e.RelL2 <= verify.DefaultMXFP8Bound {
		t.Errorf("end to end: want a rel L2 error above 8%% within 32%%, got %+v", e2e)
	}
	t.Logf("end to end: mean rel %.4f, rel L2 %.4f; %d routing decisions flip end to end, 0 on the reference's block inputs", float64(e2e.MeanRel), float64(e2e.RelL2), e2eFlips)
	if code, out, _ := run(t, nil, "verify", "--tokens", "7", "--whole-model", low, fused); code != 1 || !strings.Contains(string(out), "MISMATCH") {
		t.Errorf("--whole-model: want exit 1 (the end-to-end error is above 8%%), got %d: %s", code, out)
	}
	if code, out, _ := run(t, nil, "verify", "--tokens", "7", fused, low); code != 0 || !strings.Contains(string(out), "ok tokens=7 block 15 ") || !strings.Contains(string(out), "(end to end)") {
		t.Errorf("fused first: want exit 0 with block lines, got %d: %s", code, out)
	}

	// A lowering wrong outside the blocks (the last residual Add made a
	// Mul): every block passes, the end-to-end bound fails.
	t.Run("residual outside the blocks", func(t *testing.T) {
		m, err := graph.Load(low)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		g := m.Graph()
		last := g.Producer(m.Proto.Graph.Output[0].GetName())
		if last == nil || last.GetOpType() != "Add" {
			t.Fatalf("the output's producer is %v, want the residual Add", last)
		}
		last.OpType = proto.String("Mul")
		bad := filepath.Join(dir, "residual.onnx")
		if err := m.Save(bad, graph.SaveOptions{}); err != nil {
			t.Fatal(err)
		}
		code, out, stderr := run(t, nil, "verify", "--json", "--tokens", "7", bad, fused)
		var rep verify.Report
		if code != 1 || json.Unmarshal(out, &rep) != nil {
			t.Fatalf("exit %d, want 1: %s %s", code, out, stderr)
		}
		for _, b := range rep.Cases[0].Blocks {
			if !b.Pass {
				t.Errorf("block %d fails: %s", b.Index, b.Message)
			}
		}
		if o := rep.Cases[0].Outputs[0]; o.Pass || !strings.Contains(rep.Cases[0].Message, "end-to-end bound") {
			t.Errorf("want the output to fail the end-to-end bound: %+v, %q", o, rep.Cases[0].Message)
		}
	})

	swapExperts := func(b []byte, n, k int, scales bool) {
		if !scales {
			for i := 0; i < n*k; i++ {
				b[i], b[n*k+i] = b[n*k+i], b[i]
			}
			return
		}
		for r := 0; r < n; r++ {
			for kb := 0; kb < k/mxfp8.BlockSize; kb++ {
				x, y := mxfp8.ScaleIndex(r, kb, k), mxfp8.ScaleIndex(n+r, kb, k)
				b[x], b[y] = b[y], b[x]
			}
		}
	}
	cases := []struct {
		name  string
		block int
		edit  func(in []string, get func(string) []byte)
	}{
		{"scale one exponent off", 5, func(in []string, get func(string) []byte) {
			s := get(in[lowering.InDownScale])
			for i := range s {
				s[i]++
			}
		}},
		{"experts swapped", 9, func(in []string, get func(string) []byte) {
			for _, p := range [][2]int{{lowering.InGate, lowering.InGateScale}, {lowering.InUp, lowering.InUpScale}} {
				swapExperts(get(in[p[0]]), I, H, false)
				swapExperts(get(in[p[1]]), I, H, true)
			}
			swapExperts(get(in[lowering.InDown]), H, I, false)
			swapExperts(get(in[lowering.InDownScale]), H, I, true)
		}},
		{"layout transposed", 12, func(in []string, get func(string) []byte) {
			b := get(in[lowering.InGate])
			for e := 0; e < E; e++ {
				m := b[e*I*H : (e+1)*I*H]
				for r := 0; r < I; r++ {
					for c := r + 1; c < H; c++ {
						m[r*H+c], m[c*H+r] = m[c*H+r], m[r*H+c]
					}
				}
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bad := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".onnx")
			mutateKernel(t, low, bad, tc.block, tc.edit)
			code, out, stderr := run(t, nil, "verify", "--json", "--tokens", "7", bad, fused)
			if code != 1 {
				t.Fatalf("exit %d, want 1: %s %s", code, out, stderr)
			}
			var rep verify.Report
			if err := json.Unmarshal(out, &rep); err != nil {
				t.Fatal(err)
			}
			cs := rep.Cases[0]
			for _, b := range cs.Blocks {
				if b.Pass == (b.Index == tc.block) {
					t.Errorf("block %d: pass %v (rel L2 %.3g), want only block %d to fail", b.Index, b.Pass, float64(b.RelL2), tc.block)
				}
			}
			name := fmt.Sprintf("block %d model.layers.%d.mlp/MoE", tc.block, tc.block)
			if !strings.Contains(cs.Message, name) {
				t.Errorf("case message %q does not name %q", cs.Message, name)
			}
			if tc.block != 5 {
				return // the text once
			}
			code, text, _ := run(t, nil, "verify", "--tokens", "7", bad, fused)
			if code != 1 || !strings.Contains(string(text), "MISMATCH tokens=7 "+name+" ") {
				t.Errorf("text: want exit 1 and a MISMATCH line for %s, got %d:\n%s", name, code, text)
			}
		})
	}
}
