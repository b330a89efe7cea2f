package moe

import (
	"fmt"
	"slices"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// CheckBodies checks every fused node of m's main graph against the
// function body it calls. The body is what every runtime other than mokopt
// executes, while mokopt's own engine runs the reference semantics of the
// node's attributes: the two must mean the same. A node whose overload has
// no ai.mok::MoE function in the model, or whose function differs from the
// canonical body of its spec (Function), is an error naming both. EP shards
// (no standalone body) and nodes whose weight dims are not known from
// initializers are not compared; every other malformed node fails as
// SpecFromNode says.
func CheckBodies(m *graph.Model) error {
	var nodes []*pb.NodeProto
	for _, n := range m.Proto.Graph.Node {
		if n.GetDomain() == Domain && n.GetOpType() == OpType {
			nodes = append(nodes, n)
		}
	}
	if len(nodes) == 0 {
		return nil
	}
	funcs := map[string]*pb.FunctionProto{}
	for _, f := range m.Proto.Functions {
		if f.GetDomain() == Domain && f.GetName() == OpType {
			funcs[f.GetOverload()] = f
		}
	}
	g := m.Graph()
	checked := map[string]bool{}
	for _, n := range nodes {
		dims := InitializerDims(g, n)
		s, err := SpecFromNode(n, dims)
		if err != nil {
			return &graph.InputError{File: m.Name(), Msg: "invalid fused node", Err: err}
		}
		if s.Shard() || dims(InDown) == nil || checked[n.GetOverload()] {
			continue
		}
		checked[n.GetOverload()] = true
		have := funcs[n.GetOverload()]
		if have == nil {
			return &graph.InputError{File: m.Name(), Object: fmt.Sprintf("node %q", graph.NodeLabel(n)),
				Msg: fmt.Sprintf("calls %s::%s overload %q, which has no function body in the model: runtimes other than mokopt cannot run it", Domain, OpType, n.GetOverload())}
		}
		want, err := Function(s, m.Opset(""))
		if err != nil {
			return &graph.InputError{File: m.Name(), Object: fmt.Sprintf("node %q", graph.NodeLabel(n)), Msg: "no function body for its spec", Err: err}
		}
		if d := bodyDiff(have, want); d != "" {
			return &graph.InputError{File: m.Name(), Object: fmt.Sprintf("node %q", graph.NodeLabel(n)),
				Msg: fmt.Sprintf("the function body of %s::%s overload %q does not compute what the node's attributes mean (%s): other runtimes would compute something else", Domain, OpType, n.GetOverload(), d)}
		}
	}
	return nil
}

// bodyDiff says where function have differs from want, ignoring names,
// overloads and doc strings, or returns "".
func bodyDiff(have, want *pb.FunctionProto) string {
	switch {
	case !slices.Equal(have.Input, want.Input):
		return fmt.Sprintf("formal inputs %q, want %q", have.Input, want.Input)
	case !slices.Equal(have.Output, want.Output):
		return fmt.Sprintf("formal outputs %q, want %q", have.Output, want.Output)
	case len(have.Node) != len(want.Node):
		return fmt.Sprintf("%d nodes, want %d", len(have.Node), len(want.Node))
	}
	for i := range have.Node {
		a, b := proto.Clone(have.Node[i]).(*pb.NodeProto), proto.Clone(want.Node[i]).(*pb.NodeProto)
		a.DocString, b.DocString = nil, nil
		if !proto.Equal(a, b) {
			return fmt.Sprintf("node %d is %s, want %s", i, graph.NodeLabel(have.Node[i])+" "+have.Node[i].GetOpType(), want.Node[i].GetOpType())
		}
	}
	return ""
}
