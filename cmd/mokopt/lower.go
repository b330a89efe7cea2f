package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/lowering"
	"github.com/spf13/cobra"
)

func init() { subcommands = append(subcommands, newLowerCmd) }

func newLowerCmd() *cobra.Command {
	var out, target, planPath, extMode, quant string
	var ep, tokens, blockSize int
	var strict, asJSON, partial bool
	c := &cobra.Command{
		Use:   "lower IN -o OUT --target gb300-nvl72|gb200-nvl72|ort [--ep N]",
		Short: "Lower fused ai.mok::MoE nodes to the MoK megakernel (MXFP8 routed, BF16 shared)",
		Long: `lower replaces each fused ai.mok::MoE node that the Mixture-of-Kittens kernel
can take by the router in standard ONNX ops (topk_experts int64 [T,k],
router_weights float [T,k]) and one ai.mok::MoKDispatchFFNCombine node with the
routed experts quantized to MXFP8 (E4M3 + UE8M0 scales in the tcgen05 layout)
and the shared expert in BF16, all kernel knobs at their defaults, the EP
placement and the target as attributes.

Every violated constraint of the kernel contract is reported with its number.
Lowering is all-or-nothing, as rewrite is: a fused node the kernel cannot take
(e.g. H % 256 != 0, GELU, expert biases) refuses the model (exit 1, nothing
written) unless --partial keeps it as ai.mok::MoE with a warning. A gated or
wider shared expert is kept outside the kernel as standard ONNX ops; --strict
refuses that too (any error-severity violation: exit 1, nothing written).

--target ort instead writes ONNX Runtime's com.microsoft::MoE for each fused
node (com.microsoft::QMoE with --quant int8|int4, --block-size N for block-wise
scales): the router as a standard Gemm, gate and up interleaved into fc1
(swiglu_fusion 1), the SwiGLU variant pinned by activation_alpha/beta and
swiglu_limit, a shared expert as standard ops beside the op. A node whose
semantics the op lacks (sigmoid or group-limited routing, a score-correction
bias, weights_on_input, exact GELU; unnormalised weights with --quant) is
refused naming the node and the semantics (exit 1), unless --partial keeps it
as ai.mok::MoE.

--plan writes the launch plan (shapes, placement, workspace, weight bytes,
knobs, predicted times against an unfused DeepEP baseline, and the vendor's
benchmark shapes) as JSON.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if out == "" {
				return usageErr(errors.New("lower needs -o OUT"))
			}
			if out == args[0] && out != mokopt.Stdio {
				return usageErr(fmt.Errorf("refusing to overwrite the input %s", out))
			}
			if out == mokopt.Stdio && asJSON || planPath == mokopt.Stdio && (out == mokopt.Stdio || asJSON) {
				return usageErr(errors.New("two outputs would share standard output (-o -, --plan -, --json)"))
			}
			tgt, err := parseLowerTarget(target)
			if err != nil {
				return err
			}
			switch quant {
			case "", "int8", "int4":
			default:
				return usageErr(fmt.Errorf("--quant %q (want int8 or int4)", quant))
			}
			if blockSize != 0 && (quant == "" || blockSize < 16 || blockSize&(blockSize-1) != 0) {
				return usageErr(fmt.Errorf("--block-size %d needs --quant and a power of two >= 16", blockSize))
			}
			if tokens < 0 {
				return usageErr(fmt.Errorf("--tokens-per-rank %d is negative", tokens))
			}
			mode, err := graph.ParseExternalMode(extMode)
			if err != nil {
				return usageErr(err)
			}
			m, err := loadModel(args[0])
			if err != nil {
				return err
			}
			defer m.Close()
			if err := checkSameFiles(modelInputs(m), []outFile{{out, "the output model", true}, {planPath, "the --plan file", false}}, false); err != nil {
				return err
			}
			if ep <= 0 && tgt.IsMoK() {
				var why string
				if ep, why, err = mokopt.PickEP(m, tgt); err != nil {
					if errors.Is(err, lowering.ErrNoFusedNode) {
						return &exitError{code: 1, msg: fmt.Sprintf("%s: %v", args[0], err), err: err}
					}
					return usageErr(err)
				}
				fmt.Fprintf(c.ErrOrStderr(), "mokopt: EP %d: %s (--ep overrides)\n", ep, why)
			}
			progress := newProgress(c)
			rep, lerr := mokopt.Lower(c.Context(), m, tgt, mokopt.LowerOptions{EP: ep, TokensPerRank: tokens, Strict: strict, Partial: partial, Quant: quant, BlockSize: blockSize, Progress: progress})
			if lerr != nil {
				if asJSON && rep != nil {
					_ = writeJSON(c.OutOrStdout(), map[string]any{"schema_version": 1, "input": args[0], "output": nil, "report": rep})
				}
				if errors.Is(lerr, graph.ErrBadInput) {
					return &exitError{code: 2, msg: lerr.Error(), err: lerr}
				}
				return &exitError{code: 1, msg: fmt.Sprintf("%s: %v; no output written", args[0], lerr), err: lerr}
			}
			if err := saveModel(c, m, out, mode, progress); err != nil {
				return err
			}
			if planPath != "" {
				if err := mokopt.SavePlan(planPath, rep); err != nil {
					return err
				}
			}
			if asJSON {
				return writeJSON(c.OutOrStdout(), map[string]any{"schema_version": 1, "input": args[0], "output": out, "report": rep})
			}
			w := c.OutOrStdout()
			if out == mokopt.Stdio || planPath == mokopt.Stdio {
				w = c.ErrOrStderr() // standard output holds the model or the plan
			}
			fmt.Fprintf(w, "%s -> %s: %s", args[0], out, rep.Summary())
			if planPath != "" {
				fmt.Fprintf(w, "  plan written to %s\n", planPath)
			}
			return nil
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "output model path")
	c.Flags().StringVar(&target, "target", "", "target: "+strings.Join(lowerTargets(), ", ")+" (gb*: the MoK kernel on that rack; ort: ONNX Runtime's com.microsoft::MoE)")
	c.Flags().StringVar(&quant, "quant", "", "ort: int8 or int4 expert weights (com.microsoft::QMoE)")
	c.Flags().IntVar(&blockSize, "block-size", 0, "ort --quant: block-wise scales over N inputs (power of two >= 16; 0: one scale per row)")
	c.Flags().BoolVar(&partial, "partial", false, "keep the fused nodes the target cannot take as ai.mok::MoE (with a warning) instead of refusing the model")
	c.Flags().IntVar(&ep, "ep", 0, "expert-parallel group size (1, 4, 8, 16, 32 or 64); default: the fused nodes' ep_size, else the largest that fits the rack and divides E")
	c.Flags().IntVar(&tokens, "tokens-per-rank", 0, "static tokens per rank T (checked: >= 512, multiple of 256); 0: unknown")
	c.Flags().StringVar(&planPath, "plan", "", "write the launch plan JSON to this file")
	c.Flags().BoolVar(&strict, "strict", false, "refuse the model when any block violates the kernel contract")
	c.Flags().StringVar(&extMode, "external-data", "keep", "where initializer bytes go: keep, repack or inline")
	c.Flags().BoolVar(&asJSON, "json", false, "machine-readable output")
	return c
}

// parseLowerTarget checks a --target value (mokopt.ParseTarget: a known
// machine the kernel does not run on is refused with the reason).
func parseLowerTarget(name string) (mokopt.Target, error) {
	if name == "" {
		return "", usageErr(fmt.Errorf("lower needs --target (%s)", strings.Join(lowerTargets(), ", ")))
	}
	t, err := mokopt.ParseTarget(name)
	if err != nil {
		return "", usageErr(fmt.Errorf("lower: %w", err))
	}
	return t, nil
}
