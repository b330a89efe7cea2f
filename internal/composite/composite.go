// Package composite builds the test models of two ownership questions from
// real exported blocks (testdata) and synthetic ones (package models):
// several blocks that read one hidden state (two MoE blocks, an MoE block
// beside a dense MLP), and a block whose router values are also read
// elsewhere (router logits as a model output, auxiliary losses). Each case
// says what a rewrite must make of it; the detector's tests check that
// against the reference interpreter, and the ONNX Runtime tests against
// ONNX Runtime on the original.
package composite

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/chain"
	fx "github.com/mokopt/mokopt/internal/fixtures"
	"github.com/mokopt/mokopt/models"
	"google.golang.org/protobuf/proto"
)

// Case is one composite model and what a rewrite must make of it.
type Case struct {
	Name string
	// Build makes the model (a fresh copy on each call).
	Build func() (*graph.Model, error)
	// Experts lists E of every fused block, in ascending order.
	Experts []int
	// Shared is the number of fused blocks with a shared expert.
	Shared int
	// Logits is the number of fused nodes with the router_logits output.
	Logits int
	// Left lists op types that must stay in the rewritten graph (a dense
	// branch left alone).
	Left []string
	// Half: the model's I/O is float16 or bfloat16; outputs agree to that
	// precision (Tolerance), and ONNX Runtime's Go harness, which feeds
	// float32 and int64 only, does not run it.
	Half bool
}

// Tolerance returns the relative and absolute tolerance of the case's
// outputs against the original's: 1e-4 and 1e-5, or 1e-2 and 1e-3 for
// half-precision I/O.
func (c Case) Tolerance() (rtol, atol float64) {
	if c.Half {
		return 1e-2, 1e-3
	}
	return 1e-4, 1e-5
}

// Cases returns the composite cases.
func Cases() []Case {
	qwen3 := exported("qwen3_moe_block_dynamo_batched_mm")
	return []Case{
		{Name: "two MoE blocks (E=8, E=16) summed", Build: parallel(true, false, qwen3, synth(16, models.ShapeBatched)), Experts: []int{8, 16}},
		{Name: "two MoE blocks (E=8, E=4) as two outputs", Build: parallel(false, false, exported("olmoe_block_dynamo_batched_mm"), synth(4, models.ShapeUnrolled)), Experts: []int{4, 8}},
		{Name: "two batched MoE blocks (E=4, E=6) sharing their input's reshape, summed", Build: sharedFront(true, synth(4, models.ShapeBatched), synth(6, models.ShapeBatched)), Experts: []int{4, 6}},
		{Name: "two batched MoE blocks (E=4, E=6) sharing their input's reshape, as two outputs", Build: sharedFront(false, synth(4, models.ShapeBatched), synth(6, models.ShapeBatched)), Experts: []int{4, 6}},
		{Name: "two unrolled MoE blocks (E=4, E=6) sharing their input's reshape, summed", Build: sharedFront(true, synth(4, models.ShapeUnrolled), synth(6, models.ShapeUnrolled)), Experts: []int{4, 6}},
		{Name: "two unrolled MoE blocks (E=4, E=6) sharing their input's reshape, as two outputs", Build: sharedFront(false, synth(4, models.ShapeUnrolled), synth(6, models.ShapeUnrolled)), Experts: []int{4, 6}},
		{Name: "an unrolled (E=4) and a batched (E=6) MoE block sharing their input's reshape, summed", Build: sharedFront(true, synth(4, models.ShapeUnrolled), synth(6, models.ShapeBatched)), Experts: []int{4, 6}},
		{Name: "two MoE blocks of two exporters summed", Build: parallel(true, false, exported("qwen3_moe_block_torchscript"), fixture("mixtral_block_dynamo_batched_mm")), Experts: []int{8, 8}},
		{Name: "MoE block and dense SwiGLU MLP summed", Build: parallel(true, false, qwen3, mlp(models.MLPConfig{Activation: models.MLPSwiGLU})), Experts: []int{8}, Shared: 1},
		{Name: "MoE block and gated dense SwiGLU MLP summed", Build: parallel(true, false, qwen3, mlp(models.MLPConfig{Activation: models.MLPSwiGLU, Gated: true})), Experts: []int{8}, Shared: 1},
		{Name: "MoE block and dense GELU MLP summed", Build: parallel(true, false, qwen3, mlp(models.MLPConfig{Activation: models.MLPGELU})), Experts: []int{8}, Left: []string{"Erf"}},
		{Name: "MoE block and dense SwiGLU MLP with biases summed", Build: parallel(true, false, qwen3, mlp(models.MLPConfig{Activation: models.MLPSwiGLU, Bias: true})), Experts: []int{8}, Left: []string{"Sigmoid"}},
		{Name: "MoE block with its shared expert and dense GELU MLP summed", Build: parallel(true, false, fixture("qwen2_moe_block_dynamo_batched_mm"), mlp(models.MLPConfig{Activation: models.MLPGELU})), Experts: []int{8}, Shared: 1, Left: []string{"Erf"}},
		{Name: "MoE block output also consumed elsewhere", Build: parallel(true, true, qwen3, mlp(models.MLPConfig{Activation: models.MLPSwiGLU})), Experts: []int{8}, Left: []string{"Sigmoid"}},
		{Name: "router logits as a model output", Build: routerOut(qwen3, chain.RouterOutputs{Logits: true}), Experts: []int{8}, Logits: 1},
		{Name: "router logits with a router bias as a model output", Build: routerOut(fixture("gpt_oss_block_dynamo_batched_mm"), chain.RouterOutputs{Logits: true}), Experts: []int{8}, Logits: 1},
		{Name: "aux loss from the router probabilities", Build: routerOut(exported("qwen3_moe_block_torchscript"), chain.RouterOutputs{ProbLoss: true}), Experts: []int{8}, Logits: 1},
		{Name: "load-balancing loss from the chosen experts, and the logits", Build: routerOut(fixture("mixtral_block_dynamo_batched_mm"), chain.RouterOutputs{Logits: true, BalanceLoss: true}), Experts: []int{8}, Logits: 1},
		{Name: "router logits of a block with a shared expert", Build: routerOut(fixture("qwen2_moe_block_dynamo_batched_mm"), chain.RouterOutputs{Logits: true}), Experts: []int{8}, Shared: 1, Logits: 1},
		{Name: "float16 block with a balance loss: logits in float16 stay in the graph", Build: routerOut(load("exported_half", "qwen3_moe_block_dynamo_float16"), chain.RouterOutputs{Logits: true, BalanceLoss: true}), Experts: []int{8}, Left: []string{"TopK"}, Half: true},
		{Name: "load-balancing loss with a top-k of its own", Build: routerOut(qwen3, chain.RouterOutputs{BalanceLoss: true, OwnTopK: true}), Experts: []int{8}, Logits: 1, Left: []string{"TopK"}},
		{Name: "two layers, each with its logits, a balance loss summed over layers", Build: routerOut(layers(2, models.ShapeBatched), chain.RouterOutputs{Logits: true, BalanceLoss: true}), Experts: []int{8, 8}, Logits: 2},
		{Name: "three chained real blocks, losses from top-ks of their own summed", Build: routerOut(chained(qwen3, 3), chain.RouterOutputs{ProbLoss: true, BalanceLoss: true, OwnTopK: true}), Experts: []int{8, 8, 8}, Logits: 3},
		{Name: "two MoE blocks summed, each with its router logits", Build: parallel(true, false, routerOut(qwen3, chain.RouterOutputs{Logits: true}), routerOut(synth(16, models.ShapeBatched), chain.RouterOutputs{BalanceLoss: true})), Experts: []int{8, 16}, Logits: 2},
	}
}

// source builds one model.
type source func() (*graph.Model, error)

func exported(name string) source { return load("exported", name) }
func fixture(name string) source  { return load("fixtures", name) }

func load(dir, name string) source {
	return func() (*graph.Model, error) { return graph.Load(fx.Path(dir, name+".onnx")) }
}

// synth is a synthetic one-layer block (h + MoE(h)) of E experts, H 64.
func synth(E int, shape string) source {
	return func() (*graph.Model, error) {
		return models.Build(models.Config{Shape: shape, Layers: 1, Experts: E, TopK: 2, Hidden: 64, Inter: 32, Normalize: true, Seed: int64(E)})
	}
}

// layers is a synthetic model of n layers (h = h + MoE(h)), E 8, H 64.
func layers(n int, shape string) source {
	return func() (*graph.Model, error) {
		return models.Build(models.Config{Shape: shape, Layers: n, Experts: 8, TopK: 2, Hidden: 64, Inter: 32, Normalize: true, Seed: 3})
	}
}

// chained is n directly chained copies of src's block, each with weights
// of its own (chain.Compose).
func chained(src source, n int) source {
	return func() (*graph.Model, error) {
		m, err := src()
		if err != nil {
			return nil, err
		}
		mp, err := chain.Compose(m, n, chain.Options{Perturb: true})
		if err != nil {
			return nil, err
		}
		return parse(mp, fmt.Sprintf("%s x%d", m.Name(), n))
	}
}

// mlp is a dense MLP of H 64, width 48, on cfg's activation.
func mlp(cfg models.MLPConfig) source {
	return func() (*graph.Model, error) {
		cfg.Hidden, cfg.Inter, cfg.Seed = 64, 48, 7
		return models.BuildMLP(cfg)
	}
}

// parallel puts the models of srcs on one input (chain.Parallel).
func parallel(sum, keep bool, srcs ...source) source {
	return composed(chain.ParallelOptions{Sum: sum, KeepOutputs: keep}, srcs...)
}

// composed puts the models of srcs on one input with opt (chain.Parallel).
func composed(opt chain.ParallelOptions, srcs ...source) source {
	return func() (*graph.Model, error) {
		ms := make([]*graph.Model, len(srcs))
		for i, s := range srcs {
			m, err := s()
			if err != nil {
				return nil, err
			}
			ms[i] = m
		}
		mp, err := chain.Parallel(ms, opt)
		if err != nil {
			return nil, err
		}
		return parse(mp, "parallel")
	}
}

// sharedFront is parallel with the computations of the shared input that
// the branches write alike merged into one (chain.ParallelOptions.ShareFront):
// two blocks that read one flatten of the hidden state, as an exporter's
// common-subexpression pass writes them.
func sharedFront(sum bool, srcs ...source) source {
	return composed(chain.ParallelOptions{Sum: sum, ShareFront: true}, srcs...)
}

// routerOut adds router outputs to src's block (chain.WithRouterOutputs).
func routerOut(src source, opt chain.RouterOutputs) source {
	return func() (*graph.Model, error) {
		m, err := src()
		if err != nil {
			return nil, err
		}
		mp, err := chain.WithRouterOutputs(m, opt)
		if err != nil {
			return nil, err
		}
		return parse(mp, m.Name()+" with router outputs")
	}
}

// parse makes a model of mp, as if loaded from a file.
func parse(mp *pb.ModelProto, name string) (*graph.Model, error) {
	b, err := proto.Marshal(mp)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return graph.Parse(b, name)
}
