package models

import (
	"fmt"
	"math"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// Activations of a dense MLP (MLPConfig.Activation).
const (
	// MLPSwiGLU is down(silu(gate(x)) * up(x)): the shape of a shared expert.
	MLPSwiGLU = "swiglu"
	// MLPGELU is down(gelu(up(x))) with the exact (erf) GELU.
	MLPGELU = "gelu"
)

// MLPConfig describes a dense MLP model: input hidden_states [T, H],
// output [T, H], no residual. It is the other branch when a test puts a
// dense MLP beside an MoE block on one hidden state.
type MLPConfig struct {
	// Hidden is H, Inter the MLP's width.
	Hidden, Inter int
	// Activation is MLPSwiGLU or MLPGELU.
	Activation string
	// Gated multiplies the output by sigmoid(x · g) for a [1, H] weight g
	// (a shared expert's gate, as Qwen2-MoE writes it); SwiGLU only.
	Gated bool
	// Bias adds a bias to every projection.
	Bias bool
	// Seed selects the weights; Tokens is the static T, or 0 for a
	// symbolic one.
	Seed   int64
	Tokens int
}

// BuildMLP makes cfg's dense MLP. Every projection is a Gemm with
// transB=1 on a [out, in] weight, as exporters write nn.Linear.
func BuildMLP(cfg MLPConfig) (*graph.Model, error) {
	if cfg.Hidden < 1 || cfg.Inter < 1 || cfg.Tokens < 0 {
		return nil, fmt.Errorf("invalid MLP config: hidden %d, inter %d, tokens %d", cfg.Hidden, cfg.Inter, cfg.Tokens)
	}
	if cfg.Activation != MLPSwiGLU && cfg.Activation != MLPGELU || cfg.Gated && cfg.Activation != MLPSwiGLU {
		return nil, fmt.Errorf("invalid MLP config: activation %q (want %s or %s; gated only with %s)", cfg.Activation, MLPSwiGLU, MLPGELU, MLPSwiGLU)
	}
	b := newBuilder(Config{Hidden: cfg.Hidden, Tokens: cfg.Tokens}, "mokopt_synthetic_mlp")
	b.g.Input = []*pb.ValueInfoProto{b.valueInfo(InputName)}
	b.g.Output = []*pb.ValueInfoProto{b.valueInfo(OutputName)}
	H, I := int64(cfg.Hidden), int64(cfg.Inter)
	role := 0
	lin := func(name, x string, out, in int64) string {
		role++
		key := streamKey(cfg.Seed, 0, 100+role)
		w := b.weight("mlp."+name+".weight", []int64{out, in}, contiguous(key, 0, out*in, in, int(in)))
		ins := []string{x, w}
		if cfg.Bias {
			ins = append(ins, b.weight("mlp."+name+".bias", []int64{out}, contiguous(streamKey(cfg.Seed, 1, 100+role), 0, out, out, int(in))))
		}
		return b.node("Gemm", "mlp."+name, ins, graph.IntAttr("transB", 1))
	}
	var a string
	switch cfg.Activation {
	case MLPSwiGLU:
		g := lin("gate_proj", InputName, I, H)
		u := lin("up_proj", InputName, I, H)
		a = b.swiglu("mlp.", g, u)
	case MLPGELU:
		u := lin("fc1", InputName, I, H)
		half := b.node("Mul", "mlp.half", []string{u, b.scalar(0.5)})
		erf := b.node("Erf", "mlp.erf", []string{b.node("Mul", "mlp.scaled", []string{u, b.scalar(float32(1 / math.Sqrt2))})})
		a = b.node("Mul", "mlp.gelu", []string{half, b.node("Add", "mlp.erf_plus_one", []string{erf, b.scalar(1)})})
	}
	y := lin("down_proj", a, H, I)
	if cfg.Gated {
		gate := b.node("Sigmoid", "mlp.gate_sigmoid_out", []string{lin("expert_gate", InputName, 1, H)})
		y = b.node("Mul", "mlp.gated", []string{y, gate})
	}
	b.g.Node = append(b.g.Node, graph.NewNode("Identity", "", "node_"+OutputName, []string{y}, []string{OutputName}))
	return b.m, nil
}

// scalar returns the name of a shared FLOAT scalar constant initializer.
func (b *builder) scalar(f float32) string {
	key := fmt.Sprint("f", f)
	if name, ok := b.consts[key]; ok {
		return name
	}
	name := fmt.Sprintf("const_%d", len(b.consts))
	t := &pb.TensorProto{Name: &name, DataType: int32Ptr(int32(pb.TensorProto_FLOAT)), RawData: f32le(f)}
	b.g.Initializer = append(b.g.Initializer, t)
	b.consts[key] = name
	return name
}

func int32Ptr(v int32) *int32 { return &v }

// f32le is f's little-endian bytes.
func f32le(f float32) []byte {
	u := math.Float32bits(f)
	return []byte{byte(u), byte(u >> 8), byte(u >> 16), byte(u >> 24)}
}
