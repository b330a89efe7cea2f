package lowering

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/ortmoe"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// materializedORT is the lowering's routed tensors as the lowering used to
// build them, whole in memory, from the fused stacks read whole: fc1 by
// ortFC1 over all experts, fc2 = down × routed_scaling_factor, and QMoE's
// codes and scales by ortmoe.Quantize over the stack.
func materializedORT(t *testing.T, m *graph.Model, s *moe.Spec, bits, blockSize int) map[string]*pb.TensorProto {
	t.Helper()
	g := m.Graph()
	var n *pb.NodeProto
	for _, c := range g.P.Node {
		if c.GetDomain() == moe.Domain {
			n = c
		}
	}
	read := func(pos int) []float32 {
		if pos >= len(n.Input) || n.Input[pos] == "" {
			return nil
		}
		init := g.Initializer(n.Input[pos])
		b, err := m.TensorBytes(init)
		if err != nil {
			t.Fatal(err)
		}
		v, err := graph.DecodeFloat32(graph.DataType(init), b)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	w := &moe.Weights{Gate: read(moe.InGate), Up: read(moe.InUp), Down: read(moe.InDown)}
	_, f, fc1, _ := ortFC1(s, w)
	scale := s.RoutedScalingFactor
	if scale == 0 {
		scale = 1
	}
	fc2 := w.Down
	if scale != 1 {
		fc2 = make([]float32, len(w.Down))
		for i, v := range w.Down {
			fc2[i] = v * scale
		}
	}
	E, H, I := int64(s.NumExperts), int64(s.Hidden), int64(s.Inter)
	out := map[string]*pb.TensorProto{}
	if bits == 0 {
		out["fc1_experts_weights"] = moe.Float32Tensor("", []int64{E, f * I, H}, fc1)
		out["fc2_experts_weights"] = moe.Float32Tensor("", []int64{E, H, I}, fc2)
		return out
	}
	quant := func(role string, v []float32, N, K int64) {
		q, sc, err := ortmoe.Quantize(v, int(E), int(N), int(K), bits, blockSize)
		if err != nil {
			t.Fatal(err)
		}
		out[role+"_experts_weights"] = &pb.TensorProto{Dims: []int64{E, N, K * int64(bits) / 8},
			DataType: proto.Int32(int32(pb.TensorProto_UINT8)), RawData: q}
		sd := []int64{E, N}
		if blockSize > 0 {
			sd = append(sd, K/int64(blockSize))
		}
		out[role+"_scales"] = moe.Float32Tensor("", sd, sc)
	}
	quant("fc1", fc1, f*I, H)
	quant("fc2", fc2, H, I)
	return out
}

// replaceDeferred swaps each deferred initializer of m for the in-memory
// tensor of the same role in want (matched by the name's last part), as
// the lowering built them before they were deferred.
func replaceDeferred(t *testing.T, m *graph.Model, want map[string]*pb.TensorProto) {
	t.Helper()
	n := 0
	for i, init := range m.Proto.Graph.Initializer {
		if _, ok := m.Deferred(init); !ok {
			continue
		}
		role := init.GetName()[strings.LastIndex(init.GetName(), "/")+1:]
		w, ok := want[role]
		if !ok {
			t.Fatalf("deferred initializer %q has no materialized counterpart", init.GetName())
		}
		c := proto.Clone(w).(*pb.TensorProto)
		c.Name = proto.String(init.GetName())
		m.Proto.Graph.Initializer[i] = c
		n++
	}
	if n != len(want) {
		t.Fatalf("%d deferred initializers, want %d", n, len(want))
	}
	m.Graph().Reindex()
}

// toBFloat16 rewrites the fused node's routed stacks as bfloat16 raw data.
func toBFloat16(t *testing.T, m *graph.Model) {
	t.Helper()
	g := m.Graph()
	n := g.P.Node[0]
	for _, pos := range []int{moe.InGate, moe.InUp, moe.InDown} {
		init := g.Initializer(n.Input[pos])
		v, err := graph.DecodeFloat32(graph.DataType(init), init.RawData)
		if err != nil {
			t.Fatal(err)
		}
		raw := make([]byte, 2*len(v))
		for i, f := range v {
			binary.LittleEndian.PutUint16(raw[2*i:], graph.Float32ToBFloat16(f))
		}
		init.DataType, init.RawData = proto.Int32(int32(pb.TensorProto_BFLOAT16)), raw
	}
}

// dirFiles reads every file of dir.
func dirFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	return out
}

// TestLowerORTDeferredBytes: the --target ort lowering computes its routed
// tensors (fc1, fc2, QMoE's codes and scales) expert by expert from ranged
// reads when the model is saved, and the saved files are byte for byte
// those of the same tensors built whole in memory, as the lowering did
// before: for float and quantized ops, biases, a scaling factor, shared
// experts, half-precision I/O, bfloat16 stacks, ungated activations, and
// fused models whose weights are inline or in a side file (which stay
// where they were: a side file in, a side file out).
func TestLowerORTDeferredBytes(t *testing.T) {
	base := blockCfg{E: 6, K: 2, H: 32, I: 48, Norm: true, Seed: 11}
	with := func(f func(*blockCfg)) blockCfg { c := base; f(&c); return c }
	cases := []struct {
		name string
		cfg  blockCfg
		opt  ORTOptions
		bf16 bool
	}{
		{name: "swiglu", cfg: base},
		{name: "bias_scaled", cfg: with(func(c *blockCfg) { c.ExpertBias, c.Scale, c.RBias = true, 2.5, true })},
		{name: "oai_shared_gated", cfg: with(func(c *blockCfg) { c.Act, c.Limit, c.Is, c.Gated = moe.SwiGLUOAI, 7, 40, true })},
		{name: "relu_ungated_bias", cfg: with(func(c *blockCfg) { c.Act, c.ExpertBias = moe.ReLU, true })},
		{name: "half_io_shared", cfg: with(func(c *blockCfg) { c.IO, c.Is, c.Scale = moe.IOBFloat16, 16, 0.5 })},
		{name: "bf16_stacks", cfg: with(func(c *blockCfg) { c.Scale = 1.5 }), bf16: true},
		{name: "int8_scaled", cfg: with(func(c *blockCfg) { c.Scale, c.ExpertBias = 2, true }), opt: ORTOptions{Quant: "int8"}},
		{name: "int4_block16_shared", cfg: with(func(c *blockCfg) { c.Is = 32 }), opt: ORTOptions{Quant: "int4", BlockSize: 16}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fused, _, _ := buildFused(t, tc.cfg)
			if tc.bf16 {
				toBFloat16(t, fused)
			}
			for _, mode := range []graph.ExternalMode{graph.ExternalInline, graph.ExternalRepack} {
				dir := t.TempDir()
				src := filepath.Join(dir, "fused.onnx")
				if err := fused.Save(src, graph.SaveOptions{External: mode}); err != nil {
					t.Fatal(err)
				}
				lowered := func(materialize bool) map[string][]byte {
					m, err := graph.Load(src)
					if err != nil {
						t.Fatal(err)
					}
					defer m.Close()
					s, err := moe.SpecFromNode(m.Graph().P.Node[0], nodeDims(m.Graph(), m.Graph().P.Node[0]))
					if err != nil {
						t.Fatal(err)
					}
					bits := map[string]int{"int8": 8, "int4": 4}[tc.opt.Quant]
					var want map[string]*pb.TensorProto
					if materialize {
						want = materializedORT(t, m, s, bits, tc.opt.BlockSize)
					}
					if _, err := LowerORT(m, tc.opt); err != nil {
						t.Fatal(err)
					}
					if materialize {
						replaceDeferred(t, m, want)
					}
					out := t.TempDir()
					if err := m.Save(filepath.Join(out, "ort.onnx"), graph.SaveOptions{}); err != nil {
						t.Fatal(err)
					}
					return dirFiles(t, out)
				}
				got, want := lowered(false), lowered(true)
				if len(got) != len(want) {
					t.Fatalf("%v: files %d, want %d", mode, len(got), len(want))
				}
				for name, b := range want {
					if !bytes.Equal(got[name], b) {
						t.Fatalf("%v: %s differs from the materialized lowering's (%d vs %d bytes)", mode, name, len(got[name]), len(b))
					}
				}
				if external := len(want) > 1; external != (mode == graph.ExternalRepack) {
					t.Fatalf("%v: %d output files (a side file out iff one came in)", mode, len(want))
				}
			}
		})
	}
}
