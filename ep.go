package mokopt

import (
	"context"
	"fmt"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/internal/ep"
	"github.com/mokopt/mokopt/kernel"
	"github.com/mokopt/mokopt/lowering"
	"github.com/mokopt/mokopt/passes"
)

// EPTable names the collective, dispatch and combine ops that mark
// expert-parallel (EP) MoE blocks ([docs/expert-parallelism.md]); nil
// means the defaults (ONNX Runtime's com.microsoft AllToAll, AllGather
// and AllReduce, DeepEP's dispatch and combine). Its fields:
//
//   - Ops: one entry per op: Domain and Name (the op type), Kind
//     ("all_to_all", "all_gather", "all_reduce", "dispatch" or "combine"),
//     GroupAttr (the attribute holding the EP group size) and ExpertsAttr
//     (the one holding the global expert count, where there is one).
//   - ReplaceDefaults: in a file, drop the defaults instead of adding to
//     them.
type EPTable = ep.Table

// LoadEPTable reads a JSON EP op table; its entries extend (or, with
// replace_defaults, replace) the defaults.
func LoadEPTable(path string) (*EPTable, error) { return ep.LoadTable(path) }

// MergeReport is what RewriteRanks merged: the fused nodes with E, E/EP and
// k, and the largest error of the group check.
type MergeReport = passes.MergeReport

// MetaEPRank is the metadata_props key holding a rank file's rank.
const MetaEPRank = passes.MetaEPRank

// RewriteRanks fuses the rank models of one EP group (ranks[r] is rank r
// unless its metadata says otherwise), merges their shards into one global
// model, and, unless opt.SkipCheck, runs the original ranks in lockstep with
// simulated collectives against the merged model (tokensPerRank tokens per
// rank, two seeds). The rank models are edited in place.
func RewriteRanks(ctx context.Context, ranks []*Model, opt RewriteOptions, tokensPerRank int) (*Model, *MergeReport, []*RewriteReport, error) {
	if err := errCtx(ctx); err != nil {
		return nil, nil, nil, err
	}
	gs := make([]*graph.Model, len(ranks))
	for i, m := range ranks {
		gs[i] = m.g
	}
	po := passes.Options{Partial: opt.Partial, Check: !opt.SkipCheck, Context: ctx, RestoreTracedExperts: opt.RestoreTracedExperts, EPTable: opt.EPTable}
	merged, mrep, reps, err := passes.RewriteRanks(gs, po, tokensPerRank)
	if err != nil {
		return nil, mrep, reps, err
	}
	for _, r := range gs {
		merged.SetExternalOrigin(r) // rank files with side files merge into one with a side file
	}
	return Wrap(merged), mrep, reps, nil
}

// SplitRanks cuts a fused global model into n rank models (the reverse of
// RewriteRanks' merge).
func SplitRanks(m *Model, n int) ([]*Model, error) {
	parts, err := passes.SplitRanks(m.g, n)
	if err != nil {
		return nil, err
	}
	out := make([]*Model, len(parts))
	for i, p := range parts {
		p.SetExternalOrigin(m.g)
		out[i] = Wrap(p)
	}
	return out, nil
}

// PickEP chooses the EP size for lowering m onto target when none is
// given: the fused nodes' ep_size, else the largest size MoK runs that fits
// the target's NVLink domain and divides every node's experts; it says why.
func PickEP(m *Model, target Target) (int, string, error) {
	if !target.IsMoK() {
		return 0, "", fmt.Errorf("target %s has no expert-parallel size", target)
	}
	tgt, err := kernel.LookupTarget(string(target))
	if err != nil {
		return 0, "", err
	}
	return lowering.PickEP(m.g, tgt)
}
