package diff

import (
	"fmt"
	"strings"

	"github.com/mokopt/mokopt/graph"
)

// SchemaVersion is the version of the JSON document JSON writes (see docs/diff-schema.md).
const SchemaVersion = 1

// Change kinds used throughout a Result.
const (
	Removed = "removed"
	Added   = "added"
	Changed = "changed"
)

// Result is the difference between model A (old) and model B (new).
// Everything attributed to a fused region is reported under Regions and
// nowhere else; the other fields hold the remaining, unrelated changes.
// Slices are never nil, so the JSON form always has every key.
type Result struct {
	SchemaVersion int `json:"schema_version"`
	// A and B describe the two models.
	A ModelInfo `json:"a"`
	B ModelInfo `json:"b"`
	// Summary holds the counts and the one-line summary.
	Summary Summary `json:"summary"`
	// Regions lists, per fused node of B, the part of A it replaced.
	Regions []Region `json:"fused_regions"`
	// Nodes holds node changes outside fused regions.
	Nodes NodeChanges `json:"nodes"`
	// Initializers holds initializer changes outside fused regions.
	Initializers InitChanges `json:"initializers"`
	// IO lists changes of graph inputs and outputs (compared by position).
	IO []IOChange `json:"graph_io"`
	// Functions lists model-local functions added, removed or changed.
	Functions []FunctionChange `json:"functions"`
	// Opsets lists opset_import entries added, removed or changed.
	Opsets []OpsetChange `json:"opsets"`
	// Metadata lists metadata_props entries added, removed or changed.
	Metadata []MetadataChange `json:"metadata"`
	// Model lists changed model-level fields (ir_version, producer, ...).
	Model []FieldChange `json:"model"`
	// Warnings are notes about the comparison itself (unreadable data, ...).
	Warnings []string `json:"warnings"`

	cmp *compared // for the graph renderers; nil after a JSON round trip
}

// ModelInfo describes one side of the comparison.
type ModelInfo struct {
	File         string `json:"file"`
	Nodes        int    `json:"nodes"`
	Initializers int    `json:"initializers"`
	IRVersion    int64  `json:"ir_version"`
}

// Summary counts the differences.
type Summary struct {
	// Same is true when the models are structurally identical (names may differ).
	Same bool `json:"same"`
	// Line is the one-line human summary.
	Line string `json:"line"`
	// FusedRegions is len(Regions); RegionNodes and RegionInitializers sum
	// the nodes and initializers of A they replaced.
	FusedRegions       int `json:"fused_regions"`
	RegionNodes        int `json:"region_nodes"`
	RegionInitializers int `json:"region_initializers"`
	// FusedOps counts the fused nodes per op ("ai.mok::MoE").
	FusedOps []OpCount `json:"fused_ops"`
	// Counts of changes outside fused regions.
	NodesRemoved        int `json:"nodes_removed"`
	NodesAdded          int `json:"nodes_added"`
	NodesChanged        int `json:"nodes_changed"`
	InitializersRemoved int `json:"initializers_removed"`
	InitializersAdded   int `json:"initializers_added"`
	InitializersChanged int `json:"initializers_changed"`
	// OtherChanges is the number of entries outside fused regions, all kinds.
	OtherChanges int `json:"other_changes"`
	// NodesMatched is the number of node pairs found; RenamedNodes and
	// RenamedInitializers count pairs whose names differ (not a difference).
	NodesMatched        int `json:"nodes_matched"`
	RenamedNodes        int `json:"renamed_nodes"`
	RenamedInitializers int `json:"renamed_initializers"`
}

// OpCount is a number of nodes of one op.
type OpCount = graph.OpCount

// NodeRef names a node of one model.
type NodeRef struct {
	// Name is the node's name, or "Op->first output" when it has none.
	Name string `json:"name"`
	// Op is "op" for the default domain, else "domain::op".
	Op string `json:"op"`
	// Index is the node's position in the model's node list.
	Index int `json:"index"`
}

// NodeChanges holds node-level differences.
type NodeChanges struct {
	Removed []NodeRef    `json:"removed"`
	Added   []NodeRef    `json:"added"`
	Changed []NodeChange `json:"changed"`
}

// NodeChange is a pair of matched nodes that differ in attributes or in
// what feeds their inputs.
type NodeChange struct {
	A          NodeRef       `json:"a"`
	B          NodeRef       `json:"b"`
	Attributes []AttrChange  `json:"attributes"`
	Inputs     []InputChange `json:"inputs"`
}

// AttrChange is one attribute that differs; Old or New is "" when absent.
type AttrChange struct {
	Name   string `json:"name"`
	Change string `json:"change"`
	Old    string `json:"old"`
	New    string `json:"new"`
}

// InputChange is an input slot fed by something else (described in words).
type InputChange struct {
	Slot int    `json:"slot"`
	Old  string `json:"old"`
	New  string `json:"new"`
}

// Init describes an initializer.
type Init struct {
	Name  string  `json:"name"`
	DType string  `json:"dtype"`
	Shape []int64 `json:"shape"`
	// SHA256 is the hex SHA-256 of the raw bytes.
	SHA256 string `json:"sha256"`
	Bytes  int64  `json:"bytes"`
}

// InitChanges holds initializer-level differences.
type InitChanges struct {
	Removed []Init       `json:"removed"`
	Added   []Init       `json:"added"`
	Changed []InitChange `json:"changed"`
}

// InitChange is an initializer whose contents, type or shape changed.
type InitChange struct {
	A Init `json:"a"`
	B Init `json:"b"`
}

// Region is the part of A one fused node of B replaced.
type Region struct {
	// Fused is the fused node in B.
	Fused NodeRef `json:"fused"`
	// Variant is the fused node's overload (the model-local function it calls).
	Variant string `json:"variant"`
	// Kind is the block kind from provenance ("batched", "unrolled", "dense").
	Kind string `json:"kind"`
	// Nodes are the nodes of A it replaced; Ops is their census.
	Nodes []NodeRef `json:"nodes"`
	Ops   []OpCount `json:"ops"`
	// Initializers are the initializers of A it replaced.
	Initializers []Init `json:"initializers"`
	// NewInitializers are the initializers added in B for it.
	NewInitializers []Init `json:"new_initializers"`
	// Functions, Opsets, Metadata and Model are the model-level additions
	// that come with the fusion, each reported under the first region that
	// needs it.
	Functions []FunctionChange `json:"functions"`
	Opsets    []OpsetChange    `json:"opsets"`
	Metadata  []MetadataChange `json:"metadata"`
	Model     []FieldChange    `json:"model"`
	// Provenance is the check of B's provenance record against the diff;
	// nil when B has none for this node (the region was inferred).
	Provenance *ProvenanceCheck `json:"provenance"`
}

// ProvenanceCheck compares a fused node's provenance record with the
// region the diff found.
type ProvenanceCheck struct {
	Nodes        int  `json:"nodes"`
	Initializers int  `json:"initializers"`
	Consistent   bool `json:"consistent"`
	// MissingNodes are recorded but not found removed in this region;
	// ExtraNodes are in the region but not recorded. Likewise initializers.
	MissingNodes        []string `json:"missing_nodes"`
	ExtraNodes          []string `json:"extra_nodes"`
	MissingInitializers []string `json:"missing_initializers"`
	ExtraInitializers   []string `json:"extra_initializers"`
}

// IOChange is a difference of a graph input or output, by position.
type IOChange struct {
	// Kind is "input" or "output".
	Kind  string `json:"kind"`
	Index int    `json:"index"`
	// Change is "removed", "added", "type" or "source".
	Change string `json:"change"`
	Old    string `json:"old"`
	New    string `json:"new"`
}

// FunctionChange is a model-local function ("domain::name[overload]").
type FunctionChange struct {
	ID     string `json:"id"`
	Change string `json:"change"`
}

// OpsetChange is an opset_import entry; a version of 0 means absent.
type OpsetChange struct {
	Domain string `json:"domain"`
	Old    int64  `json:"old"`
	New    int64  `json:"new"`
}

// MetadataChange is a metadata_props entry.
type MetadataChange struct {
	Key    string `json:"key"`
	Change string `json:"change"`
	Old    string `json:"old"`
	New    string `json:"new"`
}

// FieldChange is a model-level field that differs.
type FieldChange struct {
	Field string `json:"field"`
	Old   string `json:"old"`
	New   string `json:"new"`
}

// Same reports whether the models are structurally identical.
func (r *Result) Same() bool { return r.Summary.Same }

// summarize fills r.Summary from the lists.
func (r *Result) summarize() {
	s := &r.Summary
	s.FusedRegions = len(r.Regions)
	s.RegionNodes, s.RegionInitializers = 0, 0
	ops := map[string]int{}
	for _, g := range r.Regions {
		s.RegionNodes += len(g.Nodes)
		s.RegionInitializers += len(g.Initializers)
		ops[g.Fused.Op]++
	}
	s.FusedOps = graph.SortCounts(ops)
	s.NodesRemoved, s.NodesAdded, s.NodesChanged = len(r.Nodes.Removed), len(r.Nodes.Added), len(r.Nodes.Changed)
	s.InitializersRemoved, s.InitializersAdded, s.InitializersChanged = len(r.Initializers.Removed), len(r.Initializers.Added), len(r.Initializers.Changed)
	s.OtherChanges = s.NodesRemoved + s.NodesAdded + s.NodesChanged + s.InitializersRemoved + s.InitializersAdded +
		s.InitializersChanged + len(r.IO) + len(r.Functions) + len(r.Opsets) + len(r.Metadata) + len(r.Model)
	s.Same = s.FusedRegions == 0 && s.OtherChanges == 0
	s.Line = r.line()
}

func (r *Result) line() string {
	s := &r.Summary
	if s.Same {
		if s.RenamedNodes+s.RenamedInitializers > 0 {
			return fmt.Sprintf("no differences (structurally identical; %s, %s renamed)",
				plural(s.RenamedNodes, "node"), plural(s.RenamedInitializers, "initializer"))
		}
		return "no differences"
	}
	var b strings.Builder
	if s.FusedRegions > 0 {
		var fused []string
		for _, o := range s.FusedOps {
			fused = append(fused, fmt.Sprintf("%d %s", o.Count, o.Op))
		}
		fmt.Fprintf(&b, "%s: %s, %s -> %s; ", plural(s.FusedRegions, "fused region"),
			plural(s.RegionNodes, "node"), plural(s.RegionInitializers, "initializer"), strings.Join(fused, ", "))
	} else {
		b.WriteString("no fused regions; ")
	}
	fmt.Fprintf(&b, "%s", plural(s.OtherChanges, "other change"))
	if s.OtherChanges > 0 {
		var parts []string
		add := func(n int, noun, verb string) {
			if n > 0 {
				parts = append(parts, strings.TrimSpace(plural(n, noun)+" "+verb))
			}
		}
		add(s.NodesRemoved, "node", "removed")
		add(s.NodesAdded, "node", "added")
		add(s.NodesChanged, "node", "changed")
		add(s.InitializersRemoved, "initializer", "removed")
		add(s.InitializersAdded, "initializer", "added")
		add(s.InitializersChanged, "initializer", "changed")
		add(len(r.IO), "graph input/output change", "")
		add(len(r.Functions), "function change", "")
		add(len(r.Opsets), "opset change", "")
		add(len(r.Metadata), "metadata change", "")
		add(len(r.Model), "model field change", "")
		fmt.Fprintf(&b, " (%s)", strings.Join(parts, ", "))
	}
	return b.String()
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
