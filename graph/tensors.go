package graph

import (
	"fmt"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// placedTensor is a tensor that is not an initializer (a Constant node's
// value, any tensor-valued attribute, a sparse initializer's values or
// indices) together with a label that says where it sits.
type placedTensor struct {
	t     *pb.TensorProto
	label string
}

// otherTensors lists, in file order, every tensor of the model that is not
// a dense initializer: tensors held in node attributes (Constant values,
// sparse values, tensor lists) of the main graph, subgraphs, training_info
// and model-local functions, and the values and indices of sparse
// initializers. Such tensors may live in a side file too.
func otherTensors(mp *pb.ModelProto) []placedTensor {
	var out []placedTensor
	sparse := func(st *pb.SparseTensorProto, label string) {
		if st == nil {
			return
		}
		if st.Values != nil {
			out = append(out, placedTensor{st.Values, label + " (values)"})
		}
		if st.Indices != nil {
			out = append(out, placedTensor{st.Indices, label + " (indices)"})
		}
	}
	var nodes func(ns []*pb.NodeProto, where string)
	var walk func(g *pb.GraphProto, where string)
	nodes = func(ns []*pb.NodeProto, where string) {
		for _, n := range ns {
			for _, a := range n.Attribute {
				walk(a.G, where)
				for _, sg := range a.Graphs {
					walk(sg, where)
				}
				if a.T == nil && len(a.Tensors) == 0 && a.SparseTensor == nil && len(a.SparseTensors) == 0 {
					continue
				}
				label := fmt.Sprintf("%snode %q attribute %q", where, NodeLabel(n), a.GetName())
				if a.T != nil {
					out = append(out, placedTensor{a.T, label})
				}
				for i, t := range a.Tensors {
					out = append(out, placedTensor{t, fmt.Sprintf("%s[%d]", label, i)})
				}
				sparse(a.SparseTensor, label)
				for i, st := range a.SparseTensors {
					sparse(st, fmt.Sprintf("%s[%d]", label, i))
				}
			}
		}
	}
	walk = func(g *pb.GraphProto, where string) {
		if g == nil {
			return
		}
		for _, st := range g.SparseInitializer {
			name := ""
			if st.Values != nil {
				name = st.Values.GetName()
			}
			sparse(st, fmt.Sprintf("%ssparse initializer %q", where, name))
		}
		nodes(g.Node, where)
	}
	walk(mp.Graph, "")
	for _, ti := range mp.TrainingInfo {
		walk(ti.Algorithm, "")
		walk(ti.Initialization, "")
	}
	for _, f := range mp.Functions {
		nodes(f.Node, fmt.Sprintf("function %q: ", f.GetName()))
	}
	return out
}

// allTensors is allInitializers followed by otherTensors' tensors.
func allTensors(mp *pb.ModelProto) []*pb.TensorProto {
	out := allInitializers(mp)
	for _, p := range otherTensors(mp) {
		out = append(out, p.t)
	}
	return out
}

// tensorLabel names t in messages: its place for a tensor held in an
// attribute (as Check found it), else `initializer "NAME"`.
func (m *Model) tensorLabel(t *pb.TensorProto) string {
	if l := m.label(t); l != "" {
		return l
	}
	return fmt.Sprintf("initializer %q", t.GetName())
}

// checkBodies checks the graphs nested in nodes (If branches, Loop and Scan
// bodies, at any depth) and the bodies of model-local functions as
// Graph.Validate checks the main graph: a value produced twice in one body,
// a cycle inside a body, and a read of a value that neither the body nor an
// enclosing scope defines.
func checkBodies(mp *pb.ModelProto) []error {
	if !hasBodies(mp) {
		return nil
	}
	var errs []error
	main := map[string]bool{}
	for _, v := range mp.Graph.Input {
		main[v.GetName()] = true
	}
	for _, t := range mp.Graph.Initializer {
		main[t.GetName()] = true
	}
	for _, n := range mp.Graph.Node {
		for _, o := range n.Output {
			main[o] = true
		}
	}
	scopes := []map[string]bool{main}
	var inNodes func(ns []*pb.NodeProto, where string)
	inNodes = func(ns []*pb.NodeProto, where string) {
		for _, n := range ns {
			for _, a := range n.Attribute {
				gs := a.Graphs
				if a.G != nil {
					gs = append([]*pb.GraphProto{a.G}, gs...)
				}
				for _, g := range gs {
					w := fmt.Sprintf("%sbody %q of node %q", where, a.GetName(), NodeLabel(n))
					local := map[string]bool{}
					for _, v := range g.Input {
						local[v.GetName()] = true
					}
					for _, t := range g.Initializer {
						local[t.GetName()] = true
					}
					errs = append(errs, checkNodeList(g.Node, local, scopes, w)...)
					for _, v := range g.Output {
						if nm := v.GetName(); nm != "" && !local[nm] && !inScopes(scopes, nm) {
							errs = append(errs, fmt.Errorf("%s: output %q is not defined", w, nm))
						}
					}
					scopes = append(scopes, local)
					if len(w) > 1024 { // deep nesting: name the innermost levels only, in linear time
						w = "... " + w[len(w)-512:]
					}
					inNodes(g.Node, w+": ")
					scopes = scopes[:len(scopes)-1]
				}
			}
		}
	}
	inNodes(mp.Graph.Node, "")
	for _, f := range mp.Functions {
		w := fmt.Sprintf("function %q", f.GetName())
		local := map[string]bool{}
		for _, in := range f.Input {
			local[in] = true
		}
		saved := scopes
		scopes = nil
		errs = append(errs, checkNodeList(f.Node, local, nil, w)...)
		for _, o := range f.Output {
			if o != "" && !local[o] {
				errs = append(errs, fmt.Errorf("%s: output %q is not defined", w, o))
			}
		}
		scopes = []map[string]bool{local}
		inNodes(f.Node, w+": ")
		scopes = saved
	}
	return errs
}

// hasBodies reports whether a node of the main graph holds a subgraph or
// the model has functions.
func hasBodies(mp *pb.ModelProto) bool {
	if len(mp.Functions) > 0 {
		return true
	}
	for _, n := range mp.Graph.Node {
		for _, a := range n.Attribute {
			if a.G != nil || len(a.Graphs) > 0 {
				return true
			}
		}
	}
	return false
}

func inScopes(scopes []map[string]bool, name string) bool {
	for _, s := range scopes {
		if s[name] {
			return true
		}
	}
	return false
}

// checkNodeList checks one body's nodes: every output produced once (local
// gains them), every input defined by the body, an enclosing scope or an
// earlier node, no cycle among the nodes. Names captured from enclosing
// scopes by nested bodies are not followed (they are checked when the
// nested body is).
func checkNodeList(ns []*pb.NodeProto, local map[string]bool, scopes []map[string]bool, where string) []error {
	var errs []error
	prod := make(map[string]int, len(ns))
	for i, n := range ns {
		for _, o := range n.Output {
			if o == "" {
				continue
			}
			if _, dup := prod[o]; dup || local[o] {
				errs = append(errs, fmt.Errorf("%s: value %q is produced by more than one node (second: %q)", where, o, NodeLabel(n)))
				continue
			}
			prod[o] = i
		}
	}
	for o := range prod {
		local[o] = true
	}
	// Kahn's algorithm over the edges between the body's nodes.
	indeg := make([]int, len(ns))
	users := make([][]int, len(ns))
	for i, n := range ns {
		for _, in := range n.Input {
			if in == "" {
				continue
			}
			if p, ok := prod[in]; ok {
				indeg[i]++
				users[p] = append(users[p], i)
				continue
			}
			if !local[in] && !inScopes(scopes, in) {
				errs = append(errs, fmt.Errorf("%s: node %q (%s) reads %q, which nothing in scope defines", where, NodeLabel(n), n.GetOpType(), in))
			}
		}
	}
	queue := []int{}
	for i := range ns {
		if indeg[i] == 0 {
			queue = append(queue, i)
		}
	}
	done := 0
	for len(queue) > 0 {
		i := queue[0]
		queue = queue[1:]
		done++
		for _, u := range users[i] {
			if indeg[u]--; indeg[u] == 0 {
				queue = append(queue, u)
			}
		}
	}
	if done < len(ns) {
		for i, d := range indeg {
			if d > 0 {
				errs = append(errs, fmt.Errorf("%s: %w", where, &CycleError{Node: NodeLabel(ns[i])}))
				break
			}
		}
	}
	return errs
}
