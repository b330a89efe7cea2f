// Package ep describes expert-parallel (EP) ONNX graphs: the table of
// collective and dispatch/combine ops mokopt recognises (Table), and a
// simulator that runs the per-rank models of one EP group in lockstep in the
// reference interpreter, with those ops' semantics (RunRanks).
//
// An EP model is written one file per rank. Rank r of an EP group of size
// G owns the routed experts [r·E/G, (r+1)·E/G) and sees its own tokens; the
// router is replicated. Collective ops exchange tensors between the ranks;
// the simulator gives each rank's run a Group and rank through its context,
// and every collective call blocks until all G ranks have reached their
// call with the same position in their sequence of collective calls.
package ep

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/mokopt/mokopt/graph"
)

// Kinds of EP ops. Their semantics (what the simulator computes and what
// the detector assumes) are documented on each constant; G is the group
// size, r the calling rank.
const (
	// AllToAll splits its input along axis 0 into G equal chunks, sends
	// chunk j to rank j, and returns the chunks received, in source-rank
	// order (ONNX Runtime com.microsoft::AllToAll).
	AllToAll = "all_to_all"
	// AllGather concatenates every rank's input along axis 0 in rank order
	// (com.microsoft::AllGather; attribute axis, default 0).
	AllGather = "all_gather"
	// AllReduce sums the inputs of all ranks element-wise
	// (com.microsoft::AllReduce).
	AllReduce = "all_reduce"
	// Dispatch is DeepEP-style token dispatch: inputs x [T, H], topk_idx
	// [T, k] (global expert ids) and topk_weights [T, k]; outputs recv_x
	// [G·T, H], recv_topk_idx [G·T, k], recv_topk_weights [G·T, k] and a
	// handle [G·T] (int64). Row s·T+t holds token t of rank s when that
	// token routes at least one expert to rank r, else zeros; its ids are
	// local (e − r·E/G) for the experts rank r owns and −1 for the others
	// (weights 0 there); the handle is t, or −1 for an empty row. Every rank
	// must have the same T (MoK's rule too). The number of experts E is the
	// entry's experts attribute.
	Dispatch = "dispatch"
	// Combine is the reverse of Dispatch: input y [G·T, ...] (and the handle,
	// ignored), output [T, ...] with out[t] = Σ_s y_s[r·T + t], the sum over
	// the ranks s of the rows they computed for rank r's token t.
	Combine = "combine"
)

// Op is one recognised op.
type Op struct {
	// Domain and Name identify the node (Domain "" is the ONNX domain).
	Domain string `json:"domain"`
	Name   string `json:"op"`
	// Kind is one of all_to_all, all_gather, all_reduce, dispatch, combine.
	Kind string `json:"kind"`
	// GroupAttr is the integer attribute holding the group size.
	GroupAttr string `json:"group_attr"`
	// ExpertsAttr (dispatch only) is the integer attribute holding the
	// global number of experts.
	ExpertsAttr string `json:"experts_attr,omitempty"`
}

// Table is the set of ops mokopt treats as EP collectives.
type Table struct {
	Ops []Op `json:"ops"`
	// ReplaceDefaults, in a file, drops the default entries instead of
	// adding to them.
	ReplaceDefaults bool `json:"replace_defaults,omitempty"`
}

// DefaultTable lists ONNX Runtime's collective contrib ops and the
// DeepEP-style dispatch/combine names PyTorch export pipelines emit for
// deep_ep.Buffer.dispatch / combine with a custom-op symbolic.
func DefaultTable() *Table {
	return &Table{Ops: []Op{
		{Domain: "com.microsoft", Name: "AllToAll", Kind: AllToAll, GroupAttr: "group_size"},
		{Domain: "com.microsoft", Name: "AllGather", Kind: AllGather, GroupAttr: "group_size"},
		{Domain: "com.microsoft", Name: "AllReduce", Kind: AllReduce, GroupAttr: "group_size"},
		{Domain: "deep_ep", Name: "dispatch", Kind: Dispatch, GroupAttr: "num_ranks", ExpertsAttr: "num_experts"},
		{Domain: "deep_ep", Name: "combine", Kind: Combine, GroupAttr: "num_ranks"},
		{Domain: "deep_ep", Name: "intranode_dispatch", Kind: Dispatch, GroupAttr: "num_ranks", ExpertsAttr: "num_experts"},
		{Domain: "deep_ep", Name: "intranode_combine", Kind: Combine, GroupAttr: "num_ranks"},
	}}
}

// MaxTableBytes bounds the size of an EP op table file (a few entries).
const MaxTableBytes = 16 << 20

// LoadTable reads a JSON table ({"ops": [{"domain", "op", "kind",
// "group_attr", "experts_attr"}], "replace_defaults": false}); its entries
// are added to (or, with replace_defaults, replace) DefaultTable's.
func LoadTable(path string) (*Table, error) {
	b, err := graph.ReadFileLimited(path, MaxTableBytes, "the 16 MiB an EP op table may take")
	if err != nil {
		return nil, err
	}
	var t Table
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("EP op table %s: %w", path, err)
	}
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("EP op table %s: %w", path, err)
	}
	if t.ReplaceDefaults {
		return &t, nil
	}
	d := DefaultTable()
	for _, o := range t.Ops {
		d.set(o)
	}
	return d, nil
}

func (t *Table) set(o Op) {
	for i := range t.Ops {
		if t.Ops[i].Domain == o.Domain && t.Ops[i].Name == o.Name {
			t.Ops[i] = o
			return
		}
	}
	t.Ops = append(t.Ops, o)
}

// Validate names every malformed entry.
func (t *Table) Validate() error {
	var errs []string
	for i, o := range t.Ops {
		switch o.Kind {
		case AllToAll, AllGather, AllReduce, Combine:
		case Dispatch:
			if o.ExpertsAttr == "" {
				errs = append(errs, fmt.Sprintf("entry %d (%s::%s): dispatch needs experts_attr", i, o.Domain, o.Name))
			}
		default:
			errs = append(errs, fmt.Sprintf("entry %d (%s::%s): kind %q is not one of all_to_all, all_gather, all_reduce, dispatch, combine", i, o.Domain, o.Name, o.Kind))
		}
		if o.Name == "" || o.GroupAttr == "" {
			errs = append(errs, fmt.Sprintf("entry %d: op and group_attr are required", i))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// Lookup returns the entry for a node's domain and op type.
func (t *Table) Lookup(domain, op string) (Op, bool) {
	if domain == "ai.onnx" {
		domain = ""
	}
	for _, o := range t.Ops {
		if o.Domain == domain && o.Name == op {
			return o, true
		}
	}
	return Op{}, false
}

// Domains lists the table's domains, sorted.
func (t *Table) Domains() []string {
	seen := map[string]bool{}
	var out []string
	for _, o := range t.Ops {
		if !seen[o.Domain] {
			seen[o.Domain] = true
			out = append(out, o.Domain)
		}
	}
	sort.Strings(out)
	return out
}
