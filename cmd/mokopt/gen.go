package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/models"
	"github.com/spf13/cobra"
)

func init() { subcommands = append(subcommands, newGenCmd) }

// GenSummary is the result of `mokopt gen --json`.
type GenSummary struct {
	Output           string        `json:"output"`
	DataFile         string        `json:"data_file,omitempty"`
	Config           models.Config `json:"config"`
	Nodes            int           `json:"nodes"`
	Initializers     int           `json:"initializers"`
	InitializerBytes int64         `json:"initializer_bytes"`
	ModelFileBytes   int64         `json:"model_file_bytes"`
	DataFileBytes    int64         `json:"data_file_bytes"`
	Seconds          float64       `json:"seconds"`
}

func newGenCmd() *cobra.Command {
	var cfg models.Config
	var out string
	var inline, asJSON bool
	var dtype string
	var epg epGenFlags
	c := &cobra.Command{
		Use:   "gen -o FILE",
		Short: "Write a synthetic MoE model in an exporter's shape",
		Long: `gen writes a deterministic synthetic model: input hidden_states [T, H], output
[T, H], and --layers MoE blocks chained as h = h + MoE(h). Each block routes
with a Gemm, softmax or sigmoid, TopK and optional renormalisation, and runs
SwiGLU experts in the shape one exporter writes:

  batched   transformers' batched_mm export: fused gate_up [E,2I,H] and down
            [E,H,I] gathered by the top-k indices (GatherND), batched MatMuls
  unrolled  transformers 4.x loop unrolled by the dynamo exporter: per expert
            w1/w3 [I,H], w2 [H,I] Gemms on the tokens NonZero picks, ScatterND add
  dense     every expert on every token: stacked [E,H,I] MatMuls weighted by a
            [T,E] routing matrix (ScatterElements)
  ort       one ONNX Runtime com.microsoft::MoE node per block (softmax routing,
            no shared expert); with --quant int8|int4 one com.microsoft::QMoE
            node (quantized interleaved fc1 and fc2 with float scales)

--dtype fp16 or bf16 writes the model as torch.onnx exports one cast to that
type: input, output and weights in it, the router linear and the experts
computing in it, the routing between Casts in float32.

The same flags always give the same bytes; the same flags with another shape
give a model computing the same function. Weights are streamed into FILE.data
unless --inline.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if out == "" {
				return usageErr(errors.New("gen needs -o FILE"))
			}
			if out == mokopt.Stdio && asJSON {
				return usageErr(errors.New("--json and -o - would share standard output"))
			}
			cfg.External = !inline && out != mokopt.Stdio // a stream carries one file: weights inline
			dt, err := models.ParseDType(dtype)
			if err != nil {
				return usageErr(err)
			}
			if cfg.DType = dt; dt == models.DTypeFloat32 {
				cfg.DType = ""
			}
			if err := genPrecheck(cfg); err != nil {
				return err
			}
			if epg.form != "" {
				return genEP(c.OutOrStdout(), cfg, &epg, out)
			}
			if err := cfg.Validate(); err != nil {
				return usageErr(err)
			}
			start := time.Now()
			m, err := models.Build(cfg)
			if err != nil {
				return usageErr(err)
			}
			s := GenSummary{Output: out, Config: cfg, Nodes: len(m.Proto.Graph.Node), Initializers: len(m.Proto.Graph.Initializer)}
			for _, t := range m.Proto.Graph.Initializer {
				n, err := graph.ByteSize(graph.DataType(t), t.GetDims())
				if err != nil {
					return usageErr(fmt.Errorf("gen: initializer %q: %w", t.GetName(), err))
				}
				s.InitializerBytes += n
			}
			if err := saveModel(c, mokopt.Wrap(m), out, graph.ExternalKeep, newProgress(c)); err != nil {
				if errors.Is(err, graph.ErrTooLarge) {
					return fmt.Errorf("%w (drop --inline)", err)
				}
				return err
			}
			s.Seconds = time.Since(start).Seconds()
			if st, err := os.Stat(out); err == nil {
				s.ModelFileBytes = st.Size()
			}
			if cfg.External {
				if st, err := os.Stat(out + ".data"); err == nil {
					s.DataFile, s.DataFileBytes = out+".data", st.Size()
				}
			}
			if asJSON {
				return writeJSON(c.OutOrStdout(), map[string]any{"schema_version": 1, "gen": s})
			}
			where := "inline"
			if s.DataFile != "" {
				where = fmt.Sprintf("%d in %s", s.DataFileBytes, s.DataFile)
			}
			w := c.OutOrStdout()
			if out == mokopt.Stdio {
				w = c.ErrOrStderr() // standard output holds the model
			}
			fmt.Fprintf(w, "%s: %s %s, %d layers, E=%d k=%d H=%d I=%d: %d nodes, %d initializers, %d initializer bytes (%s), %.1fs\n",
				out, cfg.Shape, dt, cfg.Layers, cfg.Experts, cfg.TopK, cfg.Hidden, cfg.Inter, s.Nodes, s.Initializers, s.InitializerBytes, where, s.Seconds)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&cfg.Shape, "shape", models.ShapeBatched, "exporter shape: batched, unrolled, dense or ort")
	f.IntVar(&cfg.Layers, "layers", 1, "number of MoE blocks")
	f.IntVar(&cfg.Experts, "experts", 8, "routed experts E")
	f.IntVar(&cfg.TopK, "top-k", 2, "experts per token k")
	f.IntVar(&cfg.Hidden, "hidden", 64, "hidden size H")
	f.IntVar(&cfg.Inter, "inter", 128, "expert intermediate size I")
	f.IntVar(&cfg.SharedInter, "shared-inter", 0, "intermediate size of an ungated shared SwiGLU expert (0: none)")
	f.StringVar(&cfg.Router, "router", "softmax", "router activation: softmax or sigmoid")
	f.BoolVar(&cfg.Normalize, "normalize", true, "renormalise the top-k weights to sum to 1")
	f.IntVar(&cfg.Tokens, "tokens", 0, "static token count T of the input (0: symbolic \"tokens\")")
	f.Int64Var(&cfg.Seed, "seed", 0, "weight seed")
	f.BoolVar(&cfg.ORTSwiGLU, "ort-swiglu", false, "ort: activation_type swiglu with an interleaved fused fc1 (swiglu_fusion=1) instead of silu with fc1/fc3")
	f.StringVar(&cfg.Quant, "quant", "", "ort: int8 or int4 expert weights in a com.microsoft::QMoE node")
	f.IntVar(&cfg.QuantBlockSize, "quant-block-size", 0, "ort --quant: block-wise scales over N inputs (power of two >= 16; 0: one scale per row)")
	f.StringVar(&dtype, "dtype", "fp32", "element type of input, output, weights and compute: fp32, fp16 or bf16")
	f.BoolVar(&inline, "inline", false, "store the weights inside FILE (2 GiB protobuf limit) instead of FILE.data (always with -o -)")
	f.StringVarP(&out, "output", "o", "", "output model path")
	f.BoolVar(&asJSON, "json", false, "machine-readable output")
	epg.add(f)
	return c
}
