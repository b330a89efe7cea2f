package passes

import (
	"fmt"
	"strings"
)

// String summarises a rewrite report in lines of text (what was fused,
// near-misses, refusals, warnings), so that printing a report shows its
// content rather than pointers.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d MoE block(s) fused", len(r.Fused))
	for _, f := range r.Fused {
		fmt.Fprintf(&b, "\n  %s", f)
	}
	for _, n := range r.NearMiss {
		fmt.Fprintf(&b, "\n  not fused %s", n)
	}
	for _, n := range r.Refused {
		fmt.Fprintf(&b, "\n  refused %s", n)
	}
	for _, w := range r.Warnings {
		fmt.Fprintf(&b, "\n  warning: %s", w)
	}
	return b.String()
}

// String names the fused node, its variant and what it replaced.
func (f Fused) String() string {
	s := fmt.Sprintf("%s [%s]: %d nodes, %d initializers replaced", f.Node, f.Variant, f.NodesRemoved, f.InitsRemoved)
	if f.Block != nil {
		s += " (" + f.Block.String() + ")"
	}
	return s
}

// String names the block, its kind, size and sizes.
func (b Block) String() string {
	return fmt.Sprintf("%s, %s, %d nodes: E=%d k=%d H=%d I=%d", b.Name, b.Kind, b.Nodes, b.Spec.NumExperts, b.Spec.TopK, b.Spec.Hidden, b.Spec.Inter)
}

// String is "node: reason".
func (n NearMiss) String() string { return n.Node + ": " + n.Reason }
