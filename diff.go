package mokopt

import "github.com/mokopt/mokopt/internal/diff"

// DiffResult is a structural comparison of two models; render it with the
// diff package (Text, JSON, Markdown, DOT, HTML).
type DiffResult = diff.Result

// Diff compares model a (old) with model b (new) by structure, not by
// names, and explains each fused ai.mok::MoE node of b by the region of a
// it replaced. DiffResult.Same reports whether they are equivalent.
func Diff(a, b *Model) (*DiffResult, error) { return diff.Compare(a.g, b.g) }
