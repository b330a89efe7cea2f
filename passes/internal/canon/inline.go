package canon

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// Inline replaces a call of a model-local function by the function's body:
// formal inputs become the call's inputs, formal outputs the call's outputs
// (their names kept), every other value and node gets a new unique name
// under the call's first output, attributes referenced through
// ref_attr_name take the call's value (or the function's default), and the
// domains the body imports are imported by the model. Calls inside the body
// are inlined on the next sweep, so nested functions unfold completely.
//
// A function is left alone when its domain is one the Work keeps (see
// Options.KeepFunctionDomains), when its body has subgraphs, or when it
// imports a domain at a version other than the model's (its ops could mean
// something else there); the last case is noted.
var Inline = Rule{
	Name: "inline-function",
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		f := w.function(n)
		if f == nil {
			return false, nil
		}
		for _, o := range f.OpsetImport {
			have := w.M.Opset(o.GetDomain())
			if have != 0 && have != o.GetVersion() {
				w.note(fmt.Sprintf("function %s::%s not inlined: it imports %s at version %d, the model at %d", f.GetDomain(), f.GetName(), domainLabel(o.GetDomain()), o.GetVersion(), have))
				return false, nil
			}
		}
		for _, b := range f.Node {
			for _, a := range b.Attribute {
				if a.G != nil || len(a.Graphs) > 0 {
					return false, nil
				}
			}
		}
		base := n.GetName()
		if len(n.Output) > 0 && n.Output[0] != "" {
			base = n.Output[0]
		}
		rename := map[string]string{"": ""}
		for i, v := range f.Input {
			rename[v] = ""
			if i < len(n.Input) {
				rename[v] = n.Input[i]
			}
		}
		for i, v := range f.Output {
			if _, isIn := rename[v]; !isIn && i < len(n.Output) && n.Output[i] != "" {
				rename[v] = n.Output[i]
			}
		}
		callAttrs := map[string]*pb.AttributeProto{}
		for _, a := range n.Attribute {
			callAttrs[a.GetName()] = a
		}
		defaults := map[string]*pb.AttributeProto{}
		for _, a := range f.AttributeProto {
			defaults[a.GetName()] = a
		}
		// A body's nodes need not be in order (as a graph's need not): they
		// are inlined producers first.
		order, err := graph.NewGraph(&pb.GraphProto{Node: f.Node}).TopoSort()
		if err != nil {
			return false, fmt.Errorf("function %s::%s: %w", f.GetDomain(), f.GetName(), err)
		}
		var body []*pb.NodeProto
		for _, b := range order {
			c := proto.Clone(b).(*pb.NodeProto)
			for i, v := range c.Input {
				r, ok := rename[v]
				if !ok {
					return false, fmt.Errorf("function %s::%s: node %s reads %q, which is neither a formal input nor computed before it", f.GetDomain(), f.GetName(), b.GetName(), v)
				}
				c.Input[i] = r
			}
			for i, v := range c.Output {
				if v == "" {
					continue
				}
				if _, ok := rename[v]; !ok {
					rename[v] = w.NewName(base + "/" + v)
				}
				c.Output[i] = rename[v]
			}
			label := b.GetName()
			if label == "" {
				label = b.GetOpType()
			}
			c.Name = proto.String(w.NewName(base + "/" + label))
			kept := c.Attribute[:0]
			for _, a := range c.Attribute {
				ref := a.GetRefAttrName()
				if ref == "" {
					kept = append(kept, a)
					continue
				}
				v := callAttrs[ref]
				if v == nil {
					v = defaults[ref]
				}
				if v == nil {
					continue // optional attribute left unset
				}
				r := proto.Clone(v).(*pb.AttributeProto)
				r.Name = proto.String(a.GetName())
				r.RefAttrName = nil
				kept = append(kept, r)
			}
			c.Attribute = kept
			body = append(body, c)
		}
		for _, vi := range f.ValueInfo {
			if r, ok := rename[vi.GetName()]; ok && r != "" {
				if tt := vi.GetType().GetTensorType(); tt != nil {
					if _, known := w.types[r]; !known {
						w.types[r] = tt
					}
				}
			}
		}
		for _, o := range f.OpsetImport {
			if w.M.Opset(o.GetDomain()) == 0 {
				w.SetOpset(o.GetDomain(), o.GetVersion())
			}
		}
		// A formal output the body returns as a formal input (or another
		// output) needs a node to carry the name.
		produced := map[string]bool{}
		for _, c := range body {
			for _, o := range c.Output {
				produced[o] = true
			}
		}
		for i, v := range f.Output {
			if i < len(n.Output) && n.Output[i] != "" && !produced[n.Output[i]] {
				src, ok := rename[v]
				if !ok || src == "" {
					return false, fmt.Errorf("function %s::%s: output %q is not computed", f.GetDomain(), f.GetName(), v)
				}
				body = append(body, w.Node("Identity", "", base+"/Identity", []string{src}, []string{n.Output[i]}))
			}
		}
		w.Replace(n, body...)
		return true, nil
	},
}

func domainLabel(d string) string {
	if d == "" {
		return "ai.onnx"
	}
	return d
}

// function returns the model-local function n calls, or nil.
func (w *Work) function(n *pb.NodeProto) *pb.FunctionProto {
	if len(w.M.Proto.Functions) == 0 {
		return nil
	}
	for _, d := range w.opt.KeepFunctionDomains {
		if n.GetDomain() == d {
			return nil
		}
	}
	return localFunction(w.M, n)
}

// localFunction returns the model-local function of m that n calls, or nil.
func localFunction(m *graph.Model, n *pb.NodeProto) *pb.FunctionProto {
	for _, f := range m.Proto.Functions {
		if f.GetDomain() == n.GetDomain() && f.GetName() == n.GetOpType() && f.GetOverload() == n.GetOverload() {
			return f
		}
	}
	return nil
}

// InlineCalls inlines, in m itself, the given calls of model-local
// functions (as the Inline rule does), and reports whether each call was: a
// node that calls no model-local function, or one the rule leaves alone,
// is an error naming it.
func InlineCalls(m *graph.Model, calls []*pb.NodeProto) error {
	w := newWork(m, Options{})
	for _, n := range calls {
		if w.function(n) == nil {
			return fmt.Errorf("node %s calls no model-local function", graph.NodeLabel(n))
		}
		ok, err := Inline.Apply(w, n)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("the call %s of function %s::%s cannot be inlined", graph.NodeLabel(n), n.GetDomain(), n.GetOpType())
		}
	}
	w.flush()
	return nil
}

// IsLocalCall reports whether n calls one of m's model-local functions.
func IsLocalCall(m *graph.Model, n *pb.NodeProto) bool {
	return localFunction(m, n) != nil
}
