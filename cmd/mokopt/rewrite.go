package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/passes"
	"github.com/spf13/cobra"
)

func init() { subcommands = append(subcommands, newRewriteCmd) }

func newRewriteCmd() *cobra.Command {
	var out, report, extMode, checkData string
	var partial, asJSON, inPlace, noCheck, restore bool
	var epf epFlags
	memLimit := memLimitAuto
	c := &cobra.Command{
		Use:   "rewrite IN -o OUT",
		Short: "Fuse every MoE block into one ai.mok::MoE node",
		Long: `rewrite finds every Mixture-of-Experts block and replaces each with one fused
ai.mok::MoE node that carries a model-local function (its decomposition in
standard ONNX ops), stacked canonical weights, and provenance in metadata_props.

By default it is all-or-nothing: if any candidate cannot be fused (for example a
TorchScript trace that lost experts), nothing is written and the exit code is 1.
--partial fuses the blocks that pass and reports the rest. Each block is checked
numerically (reference semantics of the fused node against the original
subgraph on random inputs) before the model is edited, unless --no-check.

Expert-parallel models (docs/expert-parallelism.md): a rank file's EP blocks
become ai.mok::MoE shards (ep_size, expert_offset, E/EP local experts);
--merge-ranks RANK0 .. RANKN fuses the rank files, checks them in lockstep with
simulated collectives against the merged model, and writes one global model;
--split-ranks N cuts the fused global model into N rank files.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			tbl, err := epf.table()
			if err != nil {
				return err
			}
			if epf.merge {
				if out == "" || inPlace {
					return usageErr(errors.New("rewrite --merge-ranks needs -o OUT"))
				}
				mode, err := graph.ParseExternalMode(extMode)
				if err != nil {
					return usageErr(err)
				}
				return runMergeRanks(c, args, out, report, mokopt.RewriteOptions{Partial: partial, SkipCheck: noCheck, RestoreTracedExperts: restore, EPTable: tbl, MemLimit: memBudget(memLimit)}, &epf, mode, asJSON)
			}
			if len(args) != 1 {
				return usageErr(fmt.Errorf("rewrite takes one model (%d given; rank files need --merge-ranks)", len(args)))
			}
			if out == "" && !inPlace {
				return usageErr(errors.New("rewrite needs -o OUT (or --in-place)"))
			}
			if inPlace && args[0] == mokopt.Stdio {
				return usageErr(errors.New("--in-place needs a model file, not standard input"))
			}
			if inPlace {
				out = args[0]
			}
			if out == args[0] && !inPlace && out != mokopt.Stdio {
				return usageErr(fmt.Errorf("refusing to overwrite the input %s without --in-place", out))
			}
			if epf.split < 0 || epf.split > maxSplitRanks {
				return usageErr(fmt.Errorf("--split-ranks %d: give 1 to %d ranks (one file each; the count must divide every block's experts)", epf.split, maxSplitRanks))
			}
			if n := btoi(out == mokopt.Stdio) + btoi(asJSON) + btoi(report == mokopt.Stdio); n > 1 {
				return usageErr(errors.New("two outputs would share standard output (-o -, --report -, --json)"))
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
			if err := checkSameFiles(append(modelInputs(m), fileInputs("the --ep-ops table", epf.opsFile)...), rewriteOutputs(out, report, epf.split), inPlace); err != nil {
				return err
			}
			if epf.rank >= 0 {
				m.Graph().SetMetadata(mokopt.MetaEPRank, strconv.Itoa(epf.rank))
			}
			progress := newProgress(c)
			budget := memBudget(memLimit)
			ropt := mokopt.RewriteOptions{Partial: partial, SkipCheck: noCheck, RestoreTracedExperts: restore, Progress: progress, EPTable: tbl, CheckData: checkData, MemLimit: budget, StreamWeights: epf.split == 0}
			var rep *passes.Report
			var rerr error
			if epf.split > 0 {
				rep, rerr = mokopt.Rewrite(c.Context(), m, ropt)
			} else {
				// written while the check runs, committed once it passed
				rep, rerr = mokopt.RewriteAndSave(c.Context(), m, out, ropt, mokopt.SaveOptions{External: mode, Progress: progress})
			}
			var serr *mokopt.SaveError
			if errors.As(rerr, &serr) {
				rerr = nil
			}
			rerr = memLimitError(rerr, budget, "--no-check skips the numerical check")
			if rep != nil && report != "" && c.Context().Err() == nil {
				if err := writeJSONFile(report, map[string]any{"schema_version": 1, "input": args[0], "output": out, "report": rep}); err != nil {
					return err
				}
			}
			if rerr != nil {
				if errors.Is(rerr, graph.ErrBadInput) {
					return &exitError{code: 2, msg: rerr.Error(), err: rerr}
				}
				return &exitError{code: 1, msg: fmt.Sprintf("%s: %v; no output written", args[0], rerr), err: rerr}
			}
			if serr != nil {
				return saveModelError(m, serr.Err)
			}
			if epf.split > 0 {
				return splitAfter(c, m, out, epf.split, mode)
			}
			if asJSON {
				return writeJSON(c.OutOrStdout(), map[string]any{"schema_version": 1, "input": args[0], "output": out, "report": rep})
			}
			w := c.OutOrStdout()
			if out == mokopt.Stdio || report == mokopt.Stdio {
				w = c.ErrOrStderr() // standard output holds the model or the report
			}
			printRewrite(w, c.ErrOrStderr(), args[0], out, rep)
			return nil
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "output model path")
	c.Flags().StringVar(&report, "report", "", "write the JSON report to this file")
	c.Flags().BoolVar(&partial, "partial", false, "fuse the blocks that pass, report the rest")
	c.Flags().BoolVar(&inPlace, "in-place", false, "overwrite the input model")
	c.Flags().BoolVar(&noCheck, "no-check", false, "skip the per-block numerical check")
	c.Flags().StringVar(&checkData, "check-data", "", "run the numerical check on this ONNX test data folder's inputs instead of random ones (for traces that only run on inputs like their export's)")
	c.Flags().BoolVar(&restore, "restore-traced-experts", false, "rebuild, with a warning, blocks whose TorchScript trace computes fewer experts than its stacked weights hold")
	c.Flags().StringVar(&extMode, "external-data", "keep", "where initializer bytes go: keep, repack or inline")
	c.Flags().BoolVar(&asJSON, "json", false, "machine-readable output")
	c.Flags().Var(&memLimit, "mem-limit", memLimitHelp)
	epf.addRewrite(c.Flags())
	return c
}

// printRewrite writes the rewrite summary to w and its warnings to errw.
func printRewrite(w, errw io.Writer, in, out string, rep *passes.Report) {
	fmt.Fprintf(w, "%s -> %s: %d MoE block(s) fused\n", in, out, len(rep.Fused))
	for _, f := range rep.Fused {
		s := f.Block.Spec
		fmt.Fprintf(w, "  %s (%s): %d nodes, %d initializers -> ai.mok::MoE [%s] E=%d k=%d H=%d I=%d\n",
			f.Node, f.Block.Kind, f.NodesRemoved, f.InitsRemoved, f.Variant, s.NumExperts, s.TopK, s.Hidden, s.Inter)
		if f.Block.Scope != "" {
			fmt.Fprintf(w, "    in %s\n", f.Block.Scope)
		}
		if f.CheckPrecision != "" {
			fmt.Fprintf(w, "    checked at %s precision: %s, atol that fraction of the output's peak\n", f.CheckPrecision, f.CheckTolerance)
		}
	}
	for _, n := range rep.NearMiss {
		fmt.Fprintf(w, "  not fused %s: %s\n", n.Node, n.Reason)
	}
	for _, msg := range rep.Warnings {
		fmt.Fprintf(errw, "mokopt: warning: %s\n", msg)
	}
	for _, n := range rep.Refused {
		fmt.Fprintf(w, "  refused %s: %s\n", n.Node, n.Reason)
	}
}

// writeJSONFile writes v as indented JSON to path atomically ("-": standard
// output).
func writeJSONFile(path string, v any) error {
	var buf bytes.Buffer
	if err := writeJSON(&buf, v); err != nil {
		return err
	}
	if path == mokopt.Stdio {
		_, err := os.Stdout.Write(buf.Bytes())
		return err
	}
	return graph.WriteFileAtomic(path, buf.Bytes())
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
