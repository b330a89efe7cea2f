// Package canon rewrites a working copy of an ONNX model into one canonical
// form, so that pattern matchers downstream see one spelling of each
// computation whatever the producer wrote: model-local functions inlined,
// ONNX Runtime contrib fused ops decomposed into the standard ops they stand
// for, sequence ops with static splits turned into tensor ops, identities and
// no-op casts dropped, constant shape arithmetic folded, and opsets below 13
// raised.
//
// Every rule is one small file: a Rule names the op types it looks at and
// rewrites one node at a time through a *Work. Rules keep the output value
// names of the nodes they replace (a dropped node's consumers read its input
// instead), so that every value name of the working copy either names the
// same value in the original model or is new. The package knows nothing of
// what is matched afterwards.
package canon

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// Rule is one canonicalization: a pattern (the op types in Ops, as
// graph.OpKey spells them: "Op" for the default domain, "domain::Op"
// otherwise; nil means every node), a condition and a replacement, both in
// Apply. Apply returns false, leaving the graph as it was, when the node does
// not match; it edits through w only.
type Rule struct {
	// Name names the rule in logs and tests.
	Name string
	// Ops lists the op keys the rule looks at; nil means any node.
	Ops []string
	// Apply rewrites n and reports whether it did.
	Apply func(w *Work, n *pb.NodeProto) (bool, error)
}

// Rules returns the default rules, in the order the driver tries them on
// each node.
func Rules() []Rule {
	return []Rule{
		Inline,
		SequenceToSplit,
		ConstructToConcat,
		CastLikeToCast,
		SingleInputVariadic,
		StackedSum,
		MeanTimesCount,
		SumToAdd,
		DropInferenceDropout,
		DropIdentity,
		DropIdentityTranspose,
		TransposeOfMatMul,
		RowSplitMatMul,
		TransposedAxisOp,
		UnitBatchWeight,
		DropNoOpCast,
		DropRoundTripCast,
		DropNoOpReshape,
		ReshapeOfOwnShape,
		DropNeutral,
		SqueezeOfUnsqueeze,
		ExpandToOwnShape,
		ExpandToOperand,
		QuickGelu,
		FusedGemm,
		GemmComputedBias,
		FusedMatMul,
		BiasGelu,
		FastGelu,
		ContribGelu,
		SplitSqueezeToGather,
		SqueezeOfSliceToGather,
		ArgMaxToTopK,
		StaticDim,
		TopKSlice,
		NegationAsNeg,
		TopKOfNeg,
		GatherOfTopK,
		GatherNDOfOne,
		SliceOfGatherElements,
		OneHotOfEqual,
		WhereOfNot,
		NegOfNeg,
		PowOfConstant,
		MulReciprocal,
		SpelledSoftmax,
		SpelledLogSoftmax,
		SpelledSigmoid,
		ExpOfLogSoftmax,
		EinsumMatMul,
		FoldConstants,
		DropDead,
	}
}

// Result says what Canonicalize did.
type Result struct {
	// Applied counts rule applications by rule name.
	Applied map[string]int
	// Notes are model-level remarks (an opset raised).
	Notes []string
	// OpsetFrom and OpsetTo are the default-domain opsets before and after
	// (equal when the opset was not raised).
	OpsetFrom, OpsetTo int64
	// OpsetRefused, when not empty, says why an opset below 13 could not be
	// raised (naming the op); the working copy keeps its opset then.
	OpsetRefused string
}

// Changed reports whether the working copy differs from the model.
func (r *Result) Changed() bool {
	return len(r.Applied) > 0 || r.OpsetTo != r.OpsetFrom
}

// Summary lists the rules applied as "rule×count", sorted by name.
func (r *Result) Summary() string {
	var parts []string
	for k, v := range r.Applied {
		parts = append(parts, fmt.Sprintf("%s×%d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// MinOpset is the default-domain opset the working copy is raised to.
const MinOpset = 13

// maxSweeps bounds the driver's work at this many rule attempts per node:
// every rule shrinks the graph or moves it toward canonical ops, so this is
// never reached on a sane model.
const maxSweeps = 64

// Options control Canonicalize.
type Options struct {
	// Rules are the rules to apply; nil means Rules().
	Rules []Rule
	// KeepFunctionDomains lists the domains whose model-local functions
	// are never inlined (ops a later stage knows by name).
	KeepFunctionDomains []string
	// KeepOpset leaves an opset below MinOpset as it is.
	KeepOpset bool
}

// Canonicalize returns a working copy of m in canonical form (see the
// package comment) and what was done; m is not edited. When nothing would
// change (Result.Changed is false), the working copy is nil: m is its own
// canonical form, and keeps the index built to find that out for its next
// Graph call.
func Canonicalize(ctx context.Context, m *graph.Model, opt Options) (*graph.Model, *Result, error) {
	rules := opt.Rules
	if rules == nil {
		rules = Rules()
	}
	if err := graph.CheckFunctionCalls(m.Proto); err != nil {
		// Inlining a recursive function would never end.
		return nil, nil, &graph.InputError{File: m.Name(), Msg: "invalid model", Err: err}
	}
	res := &Result{Applied: map[string]int{}, OpsetFrom: m.Opset(""), OpsetTo: m.Opset("")}
	// A dry run over m's own index first: most models need nothing, and
	// then m keeps that index for its next Graph call and the working copy
	// is only lists.
	dw := newWork(m, opt)
	dw.dry = true
	dry := &Result{Applied: map[string]int{}}
	if err := Apply(ctx, dw, rules, dry); err != nil {
		return nil, nil, err
	}
	m.KeepIndex(dw.G) // for m's next Graph call, whatever follows
	if len(dry.Applied) == 0 {
		raise := !opt.KeepOpset && res.OpsetFrom > 0 && res.OpsetFrom < MinOpset
		if raise {
			if _, err := RaiseOpset(dw, MinOpset); err != nil {
				res.OpsetRefused = err.Error()
				raise = false
			}
		}
		if !raise {
			res.Notes = append(res.Notes, dw.notes...)
			return nil, res, nil
		}
	}
	wc := m.WorkingCopy()
	w := newWork(wc, opt)
	w.orig = dw.G
	if err := Apply(ctx, w, rules, res); err != nil {
		return nil, nil, err
	}
	if !opt.KeepOpset && res.OpsetFrom > 0 && res.OpsetFrom < MinOpset {
		n, err := RaiseOpset(w, MinOpset)
		switch {
		case err != nil:
			res.OpsetRefused = err.Error()
		default:
			res.OpsetTo = MinOpset
			res.Notes = append(res.Notes, fmt.Sprintf("default-domain opset raised from %d to %d (%d nodes converted); every op in the model keeps its meaning across these versions", res.OpsetFrom, MinOpset, n))
			// Converted nodes may fold further (axes now constant inputs).
			if err := Apply(ctx, w, rules, res); err != nil {
				return nil, nil, err
			}
		}
	}
	w.flush()
	w.reserveGone()
	wc.KeepIndex(w.G)
	res.Notes = append(res.Notes, w.notes...)
	return wc, res, nil
}

// Apply runs rules over w's graph to a fixed point, counting applications
// in res.Applied. It offers every node, in the graph's order, to the rules
// naming its op (first match wins), then works through a queue of the nodes
// an application may have enabled: the nodes it added, the consumers of
// values it produced or rerouted, and the producers of the values its
// removed nodes read. A node no rule changes is thus looked at once unless
// a neighbour changes, and the graph is reindexed once, at the end.
func Apply(ctx context.Context, w *Work, rules []Rule, res *Result) error {
	byOp := map[string][]*Rule{}
	var any []*Rule
	for i := range rules {
		r := &rules[i]
		if r.Ops == nil {
			any = append(any, r)
			continue
		}
		for _, op := range r.Ops {
			byOp[op] = append(byOp[op], r)
		}
	}
	merged := map[string][]*Rule{} // byOp[key] then any, by op key
	w.flush()
	// The node list's order (exporters write it topologically); the queue
	// brings a node back whenever a neighbour changes, so the fixed point
	// does not depend on it.
	order := w.G.P.Node
	queue := slices.Clone(order)
	queued := make(map[*pb.NodeProto]bool, len(queue))
	for _, n := range queue {
		queued[n] = true
	}
	w.touch = func(n *pb.NodeProto) {
		if n != nil && !queued[n] && !w.removed[n] {
			queued[n] = true
			queue = append(queue, n)
		}
	}
	defer func() { w.touch = nil }()
	added0 := w.added
	for i := 0; i < len(queue); i++ {
		if limit := maxSweeps * (len(order) + w.added - added0 + 1); i > limit {
			return fmt.Errorf("canonicalize: no fixed point after %d rule attempts", limit)
		}
		if i%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		n := queue[i]
		queued[n] = false
		if w.removed[n] {
			continue
		}
		key := graph.OpKey(n)
		rs, ok := merged[key]
		if !ok {
			rs = slices.Concat(byOp[key], any)
			merged[key] = rs
		}
		for _, r := range rs {
			ok, err := r.Apply(w, n)
			if err != nil {
				return fmt.Errorf("canonicalize (%s) at node %s: %w", r.Name, graph.NodeLabel(n), err)
			}
			if ok {
				res.Applied[r.Name]++
				if w.dry {
					return nil // something would change
				}
				break
			}
		}
	}
	w.flush()
	return nil
}
