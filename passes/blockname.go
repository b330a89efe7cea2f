package passes

import (
	"fmt"
	"strings"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// nameScopesKey is the node metadata key under which the PyTorch dynamo
// exporter records a node's module scopes, outermost first, as a Python
// list of strings ending with the node's own name:
// [”, 'm', 'm.model', 'm.model.layers.0', 'm.model.layers.0.mlp', 'topk'].
const nameScopesKey = "pkg.torch.onnx.name_scopes"

// nodeScope returns the module path a node belongs to, as its components
// ("m", "model", "layers", "0", "mlp"), or nil when its name says nothing:
// from the dynamo exporter's name_scopes metadata, else from a
// slash-separated node name ("/m/experts/gate_proj/MatMul", as the
// TorchScript exporter writes), without the node's own last part.
func nodeScope(n *pb.NodeProto) []string {
	for _, p := range n.MetadataProps {
		if p.GetKey() != nameScopesKey {
			continue
		}
		// The last entry is the node itself; the one before it is the
		// innermost module, whose dotted path holds all outer ones.
		mod, ok := lastButOne(p.GetValue())
		if !ok || mod == "" {
			return nil
		}
		return strings.Split(mod, ".")
	}
	name := n.GetName()
	if !strings.Contains(name, "/") {
		return nil
	}
	var parts []string
	for _, s := range strings.Split(name, "/") {
		if s != "" {
			parts = append(parts, strings.Split(s, ".")...)
		}
	}
	if len(parts) < 2 {
		return nil
	}
	return parts[:len(parts)-1]
}

// lastButOne returns the last but one string of the Python list of strings
// s (see eachPyString), without building the list.
func lastButOne(s string) (string, bool) {
	var prev, last string
	n := 0
	ok := eachPyString(s, func(x string) { prev, last = last, x; n++ })
	return prev, ok && n >= 2
}

// eachPyString calls f with each string of s, a Python list of single- or
// double-quoted strings without escapes inside ("[”, 'm', 'm.model']"), in
// turn, and reports whether s is such a list (f may have been called before
// a malformed part was found).
func eachPyString(s string, f func(string)) bool {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "[") || !strings.HasSuffix(s, "]") {
		return false
	}
	rest := strings.TrimSpace(s[1 : len(s)-1])
	for rest != "" {
		q := rest[0]
		if q != '\'' && q != '"' {
			return false
		}
		end := strings.IndexByte(rest[1:], q)
		if end < 0 {
			return false
		}
		f(rest[1 : 1+end])
		rest = strings.TrimSpace(rest[end+2:])
		if rest != "" {
			if rest[0] != ',' {
				return false
			}
			rest = strings.TrimSpace(rest[1:])
		}
	}
	return true
}

// commonScope returns the longest module path every scoped node of region
// shares, dotted ("m.model.layers.0.mlp"), or "" when no node is scoped or
// they share nothing. Nodes without a scope (constants an exporter left
// unnamed) do not count.
func commonScope(region []*pb.NodeProto) string {
	var common []string
	seen := false
	for _, n := range region {
		sc := nodeScope(n)
		if sc == nil {
			continue
		}
		if !seen {
			common, seen = sc, true
			continue
		}
		k := 0
		for k < len(common) && k < len(sc) && common[k] == sc[k] {
			k++
		}
		common = common[:k]
	}
	return strings.Join(common, ".")
}

// blockName derives a readable block name (for display and provenance only,
// never for matching): the module scope the region's nodes share, else the
// router weight's module path, else the block's output value.
func blockName(y, routerW string, region []*pb.NodeProto) string {
	if s := commonScope(region); s != "" {
		return s
	}
	if parts := strings.Split(routerW, "."); len(parts) > 2 {
		return strings.Join(parts[:len(parts)-2], ".")
	}
	return y
}

// uniqueBlockNames makes the names of blocks distinct, deterministically
// and keeping them readable: every block of a group that shares a name
// takes, in turn, its region's common scope or its output value when those
// tell the group apart, else the name with "#2", "#3" ... after the first,
// in block order.
func uniqueBlockNames(blocks []*Block) {
	groups := map[string][]*Block{}
	var order []string
	for _, b := range blocks {
		if _, ok := groups[b.Name]; !ok {
			order = append(order, b.Name)
		}
		groups[b.Name] = append(groups[b.Name], b)
	}
	taken := map[string]bool{}
	for _, b := range blocks {
		taken[b.Name] = true
	}
	alts := []func(b *Block) string{
		func(b *Block) string { return commonScope(b.Region) },
		func(b *Block) string { return b.Output },
	}
	for _, name := range order {
		g := groups[name]
		if len(g) < 2 {
			continue
		}
		renamed := false
		for _, alt := range alts {
			names := map[string]bool{}
			ok := true
			for _, b := range g {
				a := alt(b)
				if a == "" || names[a] || a != name && taken[a] {
					ok = false
					break
				}
				names[a] = true
			}
			if ok {
				for _, b := range g {
					b.Name = alt(b)
					taken[b.Name] = true
				}
				renamed = true
				break
			}
		}
		if renamed {
			continue
		}
		k := 2
		for _, b := range g[1:] {
			for taken[fmt.Sprintf("%s#%d", name, k)] {
				k++
			}
			b.Name = fmt.Sprintf("%s#%d", name, k)
			taken[b.Name] = true
			k++
		}
	}
}
