package main

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/models"
	"github.com/mokopt/mokopt/passes"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// epFlags are the expert-parallel options of rewrite and inspect.
type epFlags struct {
	opsFile string
	rank    int
	merge   bool
	split   int
	tokens  int
}

func (f *epFlags) addDetect(fs *pflag.FlagSet) {
	fs.StringVar(&f.opsFile, "ep-ops", "", "JSON table of EP collective / dispatch / combine ops, added to the defaults (com.microsoft AllToAll/AllGather/AllReduce, deep_ep dispatch/combine)")
}

func (f *epFlags) addRewrite(fs *pflag.FlagSet) {
	f.addDetect(fs)
	fs.IntVar(&f.rank, "ep-rank", -1, "this file's rank in its EP group (sets metadata "+passes.MetaEPRank+")")
	fs.BoolVar(&f.merge, "merge-ranks", false, "the inputs are the rank models of one EP group (in rank order): fuse each, check the group in lockstep, write one global model")
	fs.IntVar(&f.split, "split-ranks", 0, "after fusing, cut the global model into N rank models written as OUT with .rankR before the extension")
	fs.IntVar(&f.tokens, "ep-check-tokens", 4, "tokens per rank of the --merge-ranks group check")
}

// table returns the EP op table (nil: the default).
func (f *epFlags) table() (*mokopt.EPTable, error) {
	if f.opsFile == "" {
		return nil, nil
	}
	t, err := mokopt.LoadEPTable(f.opsFile)
	if err != nil {
		return nil, usageErr(err)
	}
	return t, nil
}

// maxSplitRanks is the most rank files --split-ranks writes: beyond any
// model's expert count, and a bound on the files checked and written.
const maxSplitRanks = 4096

// rankPath inserts .rankR before out's extension.
func rankPath(out string, r int) string {
	ext := filepath.Ext(out)
	return strings.TrimSuffix(out, ext) + ".rank" + strconv.Itoa(r) + ext
}

// runMergeRanks is `rewrite --merge-ranks RANK0 .. RANKN -o OUT`.
func runMergeRanks(c *cobra.Command, args []string, out, report string, opt mokopt.RewriteOptions, f *epFlags, mode mokopt.ExternalMode, asJSON bool) error {
	if f.split > 0 {
		return usageErr(errors.New("--merge-ranks and --split-ranks go opposite ways; give one"))
	}
	if f.rank >= 0 {
		return usageErr(errors.New("--ep-rank names one file's rank; with --merge-ranks the files are given in rank order"))
	}
	if out == mokopt.Stdio && (asJSON || report == mokopt.Stdio) {
		return usageErr(errors.New("two outputs would share standard output (-o -, --report -, --json)"))
	}
	for _, a := range args {
		if a == out && a != mokopt.Stdio {
			return usageErr(fmt.Errorf("refusing to overwrite the input %s", out))
		}
		if a == mokopt.Stdio {
			return usageErr(errors.New("--merge-ranks reads rank files, not standard input"))
		}
	}
	ranks := make([]*mokopt.Model, len(args))
	for i, a := range args {
		m, err := loadModel(a)
		if err != nil {
			return err
		}
		defer m.Close()
		ranks[i] = m
	}
	if err := checkSameFiles(append(modelInputs(ranks...), fileInputs("the --ep-ops table", f.opsFile)...), rewriteOutputs(out, report, 0), false); err != nil {
		return err
	}
	merged, mrep, reps, err := mokopt.RewriteRanks(c.Context(), ranks, opt, f.tokens)
	res := map[string]any{"schema_version": 1, "inputs": args, "output": out, "merge": mrep, "ranks": reps}
	if report != "" {
		if werr := writeJSONFile(report, res); werr != nil {
			return werr
		}
	}
	if err != nil {
		if errors.Is(err, graph.ErrBadInput) {
			return &exitError{code: 2, msg: err.Error(), err: err}
		}
		return &exitError{code: 1, msg: fmt.Sprintf("%v; no output written", err), err: err}
	}
	if err := saveModel(c, merged, out, mode, nil); err != nil {
		return err
	}
	w := c.OutOrStdout()
	if asJSON {
		return writeJSON(w, res)
	}
	if out == mokopt.Stdio || report == mokopt.Stdio {
		w = c.ErrOrStderr()
	}
	fmt.Fprintf(w, "%d ranks -> %s: %d fused MoE node(s)\n", len(args), out, len(mrep.Nodes))
	for _, n := range mrep.Nodes {
		fmt.Fprintf(w, "  %s: E=%d k=%d, EP=%d with %d experts per rank\n", n.Node, n.NumExperts, n.TopK, n.EPSize, n.LocalExperts)
	}
	for _, n := range mrep.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
	if mrep.Checked {
		fmt.Fprintf(w, "  group check (ranks in lockstep vs merged, %d tokens/rank, 2 seeds): max |error| %.3g\n", f.tokens, mrep.MaxAbsErr)
	}
	return nil
}

// splitAfter writes the --split-ranks outputs of a rewritten global model.
func splitAfter(c *cobra.Command, m *mokopt.Model, out string, n int, mode mokopt.ExternalMode) error {
	if out == mokopt.Stdio {
		return usageErr(errors.New("--split-ranks writes one file per rank, not standard output"))
	}
	parts, err := mokopt.SplitRanks(m, n)
	if err != nil {
		return &exitError{code: 1, msg: err.Error(), err: err}
	}
	for r, p := range parts {
		path := rankPath(out, r)
		if err := saveModel(c, p, path, mode, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.OutOrStdout(), "  rank %d -> %s\n", r, path)
	}
	return nil
}

// epGenFlags are gen's expert-parallel options.
type epGenFlags struct {
	form, placement string
	ep, rank        int
}

func (f *epGenFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&f.form, "ep-form", "", "write an expert-parallel model: ort-alltoall or deepep (one file per rank, .rankR inserted in -o), or sharding (one global annotated model)")
	fs.IntVar(&f.ep, "ep", 4, "EP group size of --ep-form")
	fs.IntVar(&f.rank, "rank", -1, "--ep-form: write only this rank (-1: all)")
	fs.StringVar(&f.placement, "placement", models.BeforeCombine, "--ep-form: router-weight multiply before_combine (DeepEP) or after_combine (MoK)")
}

// genEP writes the EP models of `gen --ep-form`.
func genEP(w io.Writer, cfg models.Config, f *epGenFlags, out string) error {
	if out == mokopt.Stdio {
		return usageErr(errors.New("gen --ep-form writes files (one per rank), not standard output"))
	}
	c := models.EPConfig{Config: cfg, Form: f.form, EP: f.ep, Placement: f.placement}
	if err := c.Validate(); err != nil {
		return usageErr(err)
	}
	save := func(m *graph.Model, path string) error {
		if err := m.Save(path, graph.SaveOptions{External: graph.ExternalKeep}); err != nil {
			return err
		}
		fmt.Fprintf(w, "%s: %s EP=%d (%s), %d layers, E=%d k=%d H=%d I=%d: %d nodes\n", path, c.Form, c.EP, c.Placement, cfg.Layers, cfg.Experts, cfg.TopK, cfg.Hidden, cfg.Inter, len(m.Proto.Graph.Node))
		return nil
	}
	if f.form == models.FormSharding {
		m, err := models.BuildSharded(c)
		if err != nil {
			return usageErr(err)
		}
		return save(m, out)
	}
	for r := 0; r < f.ep; r++ {
		if f.rank >= 0 && r != f.rank {
			continue
		}
		m, err := models.BuildRank(c, r)
		if err != nil {
			return usageErr(err)
		}
		if err := save(m, rankPath(out, r)); err != nil {
			return err
		}
	}
	return nil
}

// printEP prints an EP block's placement line in inspect.
func printEP(w io.Writer, b *passes.Block) {
	s := b.Spec
	if s.EPSize <= 1 {
		return
	}
	L := s.NumExperts / s.EPSize
	if s.Shard() {
		fmt.Fprintf(w, "    expert parallel: EP=%d, E/EP=%d local experts [%d, %d) on this rank, router weight %s\n", s.EPSize, L, s.ExpertOffset, s.ExpertOffset+L, strings.ReplaceAll(b.Placement, "_", " "))
		return
	}
	fmt.Fprintf(w, "    expert parallel: EP=%d, E/EP=%d experts per rank (%s), all experts in this model\n", s.EPSize, L, b.Placement)
}
