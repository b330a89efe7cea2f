package chain

import (
	"fmt"
	"slices"
	"strings"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// shareFront merges the nodes of ng that compute the same thing as an
// earlier node: the same op, domain and attributes on the same inputs,
// initializers compared by content (dims, type, bytes). This is what an
// exporter's common-subexpression pass makes of two blocks on one hidden
// state: the flatten of the input, its shape reads and the other
// computations of the input alone are written once and read by both
// blocks. Nodes with subgraphs or that write a graph output are kept, and
// so are the nodes after a node that differs (their inputs differ), so
// only what depends on the shared input and on equal constants is merged.
// ng's nodes must be in topological order; initializers no node reads any
// more are dropped.
func shareFront(ng *pb.GraphProto) {
	outputs := map[string]bool{}
	for _, o := range ng.Output {
		outputs[o.GetName()] = true
	}
	inits := map[string]*pb.TensorProto{}
	byContent := map[string]string{} // content key -> first initializer's name
	rename := map[string]string{}
	for _, t := range ng.Initializer {
		inits[t.GetName()] = t
		k := fmt.Sprint(t.GetDataType(), t.GetDims(), string(t.GetRawData()))
		if len(t.GetRawData()) == 0 {
			continue // data in typed fields: compared by name only
		}
		if first, ok := byContent[k]; ok {
			rename[t.GetName()] = first
			continue
		}
		byContent[k] = t.GetName()
	}
	seen := map[string]*pb.NodeProto{}
	kept := ng.Node[:0]
	for _, n := range ng.Node {
		for i, v := range n.Input {
			if r, ok := rename[v]; ok {
				n.Input[i] = r
			}
		}
		key, ok := nodeKey(n, outputs)
		if !ok {
			kept = append(kept, n)
			continue
		}
		first, dup := seen[key]
		if !dup || len(first.Output) != len(n.Output) {
			seen[key] = n
			kept = append(kept, n)
			continue
		}
		for i, o := range n.Output {
			if o != "" {
				rename[o] = first.Output[i]
			}
		}
	}
	ng.Node = kept
	read := map[string]bool{}
	for _, n := range ng.Node {
		for _, v := range n.Input {
			read[v] = true
		}
	}
	ng.Initializer = slices.DeleteFunc(ng.Initializer, func(t *pb.TensorProto) bool {
		_, renamed := rename[t.GetName()]
		return renamed && !read[t.GetName()] && !outputs[t.GetName()]
	})
}

// nodeKey returns what n computes as a string (op, domain, attributes,
// inputs), or false for a node that is not merged.
func nodeKey(n *pb.NodeProto, outputs map[string]bool) (string, bool) {
	for _, o := range n.Output {
		if outputs[o] {
			return "", false
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%s|%q", n.GetDomain(), n.GetOpType(), n.Input)
	attrs := slices.Clone(n.Attribute)
	slices.SortFunc(attrs, func(x, y *pb.AttributeProto) int { return strings.Compare(x.GetName(), y.GetName()) })
	for _, a := range attrs {
		if a.G != nil || len(a.Graphs) > 0 {
			return "", false
		}
		raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(a)
		if err != nil {
			return "", false
		}
		fmt.Fprintf(&b, "|%q", raw)
	}
	return b.String(), true
}
