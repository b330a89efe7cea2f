package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/internal/diff"
	"github.com/mokopt/mokopt/internal/verify"
	"github.com/spf13/cobra"
)

func init() { subcommands = append(subcommands, newVerifyCmd, newRunCmd) }

func parseTokens(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--tokens: %q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func newVerifyCmd() *cobra.Command {
	var data, tokens, engine string
	var seed int64
	var rtol, atol float64
	var asJSON bool
	var elementwise, wholeModel bool
	var quantBound float64
	memLimit := memLimitAuto
	c := &cobra.Command{
		Use:   "verify A B",
		Short: "Run two models on the same inputs and compare their outputs",
		Long: `verify runs models A and B on the same inputs in mokopt's reference interpreter
(or, with --engine ort, in ONNX Runtime) and compares every output element-wise: |a-b| <= atol + rtol*|b|. Inputs come from
--data (an ONNX test_data_set folder) or are random, one case per --tokens value
(for inputs with dynamic dims). Exit 1 on mismatch, naming the output and the worst element.

When either model holds MXFP8 weights (a lowered model), element-wise relative
errors mean nothing near zero: each float output is then compared by its mean
relative error and relative L2 error against the MXFP8 bound (8%), and a note
says so; --elementwise keeps the element-wise check, --quant-bound sets
another bound.

A lowered model compared with the fused model it came from is compared block
by block: each fused block's lowering runs on the fused model's input of that
block, with the fused model's routing forced, and is held to the bound; each
block's line gives its errors and how many routing decisions flip, on those
inputs and in the lowered model's own run. The graph outputs, where the
blocks' errors compound over the depth, are held to the bound times the square
root of the lowered blocks (at most 50%). --whole-model compares only the
graph outputs, at the bound.`,
		Args: cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			toks, err := parseTokens(tokens)
			if err != nil {
				return usageErr(err)
			}
			runner, err := engineRunner(engine)
			if err != nil {
				return err
			}
			a, b, err := loadPair(args)
			if err != nil {
				return err
			}
			defer a.Close()
			defer b.Close()
			if elementwise && quantBound != 0 {
				return usageErr(errors.New("--elementwise and --quant-bound exclude each other"))
			}
			if quantBound < 0 || math.IsNaN(quantBound) {
				return usageErr(fmt.Errorf("--quant-bound %g: want a positive fraction (e.g. 0.08)", quantBound))
			}
			if elementwise {
				quantBound = -1
			}
			budget := memBudget(memLimit)
			rep, err := mokopt.Verify(c.Context(), a, b, mokopt.VerifyOptions{Tokens: toks, Seed: seed, RTol: flagTol(rtol), ATol: flagTol(atol), DataDir: data, MemLimit: budget, Runner: runner, Engine: engine, Progress: newProgress(c), QuantBound: quantBound, WholeModel: wholeModel})
			return reportVerify(c.OutOrStdout(), rep, memLimitError(err, budget, ""), asJSON)
		},
	}
	c.Flags().StringVar(&data, "data", "", "ONNX test_data_set folder with input_N.pb files")
	c.Flags().StringVar(&engine, "engine", "ref", "evaluator: ref (mokopt's reference interpreter) or ort (ONNX Runtime; binaries built with -tags ort)")
	c.Flags().BoolVar(&elementwise, "elementwise", false, "compare element-wise at --rtol/--atol even when a model holds MXFP8 weights or computes in half precision behind float32 outputs")
	c.Flags().Float64Var(&quantBound, "quant-bound", 0, "compare each float output by mean relative error and relative L2 error against this bound (default: 0.08 when a model holds MXFP8 weights, else element-wise)")
	c.Flags().BoolVar(&wholeModel, "whole-model", false, "compare a lowered model with its fused model by the graph outputs only, not block by block")
	c.Flags().StringVar(&tokens, "tokens", "1,7,64", "token counts for random inputs (dynamic dims only)")
	c.Flags().Int64Var(&seed, "seed", 1, "seed of the random inputs")
	c.Flags().Float64Var(&rtol, "rtol", verify.DefaultRTol, "relative tolerance")
	c.Flags().Float64Var(&atol, "atol", verify.DefaultATol, "absolute tolerance")
	c.Flags().BoolVar(&asJSON, "json", false, "machine-readable output")
	c.Flags().Var(&memLimit, "mem-limit", memLimitHelp)
	return c
}

func newRunCmd() *cobra.Command {
	var data string
	var rtol, atol float64
	var asJSON, elementwise bool
	memLimit := memLimitAuto
	c := &cobra.Command{
		Use:   "run MODEL --data DIR",
		Short: "Run a model on a test_data_set and compare with its output_N.pb files",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if data == "" {
				return usageErr(fmt.Errorf("run needs --data DIR"))
			}
			m, err := loadModel(args[0])
			if err != nil {
				return err
			}
			defer m.Close()
			budget := memBudget(memLimit)
			opt := mokopt.VerifyOptions{RTol: flagTol(rtol), ATol: flagTol(atol), MemLimit: budget, Progress: newProgress(c)}
			if elementwise {
				opt.QuantBound = -1
			}
			rep, err := mokopt.Run(c.Context(), m, data, opt)
			return reportVerify(c.OutOrStdout(), rep, memLimitError(err, budget, ""), asJSON)
		},
	}
	c.Flags().StringVar(&data, "data", "", "ONNX test_data_set folder")
	c.Flags().BoolVar(&elementwise, "elementwise", false, "compare at --rtol/--atol even when the model computes in half precision behind float32 outputs")
	c.Flags().Float64Var(&rtol, "rtol", verify.DefaultRTol, "relative tolerance")
	c.Flags().Float64Var(&atol, "atol", verify.DefaultATol, "absolute tolerance")
	c.Flags().BoolVar(&asJSON, "json", false, "machine-readable output")
	c.Flags().Var(&memLimit, "mem-limit", memLimitHelp)
	return c
}

// flagTol is a --rtol or --atol value as VerifyOptions spells it: the
// flag's 0 is no tolerance, which the library spells negative (its 0 is
// the default).
func flagTol(v float64) float64 {
	if v == 0 {
		return -1
	}
	return v
}

// reportVerify prints a verify or run report; err is what the facade
// returned with it (a *mokopt.MismatchError when outputs differ).
func reportVerify(w io.Writer, rep *verify.Report, err error, asJSON bool) error {
	var mm *mokopt.MismatchError
	if err != nil && !errors.As(err, &mm) {
		return runFailed(err)
	}
	if asJSON {
		if err := writeJSON(w, rep); err != nil {
			return err
		}
	} else {
		for _, cs := range rep.Cases {
			printBlockChecks(w, cs)
			for _, o := range cs.Outputs {
				status := "ok"
				if !o.Pass {
					status = "MISMATCH"
				}
				if o.QuantBound > 0 {
					scope := ""
					if len(cs.Blocks) > 0 {
						scope = " (end to end)"
					}
					fmt.Fprintf(w, "%s %s output %d %s%s: mean rel err %.2f%%, rel L2 err %.2f%% (bound %.3g%%), max abs err %.3g of max |b| %.3g\n",
						status, diff.Printable(cs.Name), o.Index, diff.Printable(o.NameA), scope, 100*float64(o.MeanRel), 100*float64(o.RelL2), 100*o.QuantBound, float64(o.MaxAbsErr), float64(o.MaxAbsRef))
					continue
				}
				nonFinite := ""
				if o.NonFinite > 0 {
					nonFinite = fmt.Sprintf("; %d NaN or infinite in both models, equal but proving nothing", o.NonFinite)
				}
				if o.NearTieTokens > 0 {
					nonFinite += fmt.Sprintf("; %d token(s) at a routing near tie left out", o.NearTieTokens)
				}
				fmt.Fprintf(w, "%s %s output %d %s: max abs err %.3g, max rel err %.3g, worst at %v (%d of %d elements off%s)\n",
					status, diff.Printable(cs.Name), o.Index, diff.Printable(o.NameA), float64(o.MaxAbsErr), float64(o.MaxRelErr), o.WorstMultiIndex, o.Mismatches, o.Elements, nonFinite)
			}
			if cs.Message != "" {
				fmt.Fprintf(w, "%s: %s\n", diff.Printable(cs.Name), diff.Printable(cs.Message))
			}
		}
		for _, n := range rep.Notes {
			fmt.Fprintf(w, "note: %s\n", diff.Printable(n))
		}
	}
	if !rep.Pass {
		return &exitError{code: 1, msg: "outputs differ"}
	}
	return nil
}

// printBlockChecks prints a block-by-block comparison's line per block.
func printBlockChecks(w io.Writer, cs verify.Case) {
	flips := func(n, of int) string {
		if n < 0 {
			return "n/a"
		}
		return fmt.Sprintf("%d of %d", n, of)
	}
	for _, b := range cs.Blocks {
		status := "ok"
		if !b.Pass {
			status = "MISMATCH"
		}
		what := "kept fused"
		if b.KernelNode != "" {
			what = "lowered to " + diff.Printable(b.KernelNode)
		}
		fmt.Fprintf(w, "%s %s block %d %s (%s): mean rel err %.2f%%, rel L2 err %.2f%% (bound %.3g%%) on the reference's input and routing; routing flips %s on that input, %s end to end\n",
			status, diff.Printable(cs.Name), b.Index, diff.Printable(b.Node), what, 100*float64(b.MeanRel), 100*float64(b.RelL2), 100*b.Bound, flips(b.RouterFlips, b.Decisions), flips(b.EndToEndFlips, b.Decisions))
		if b.Message != "" && b.Elements == 0 {
			fmt.Fprintf(w, "  %s\n", diff.Printable(b.Message))
		}
	}
}
