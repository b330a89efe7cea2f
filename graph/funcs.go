package graph

import (
	"errors"
	"fmt"
	"strings"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// funcKey identifies a model-local function the way a call names it.
type funcKey struct{ domain, name, overload string }

func (k funcKey) String() string {
	s := domainName(k.domain) + "::" + k.name
	if k.overload != "" {
		s += ":" + k.overload
	}
	return s
}

func domainName(d string) string {
	if d == "" {
		return "ai.onnx"
	}
	return d
}

// CheckFunctionCalls returns an error naming every cycle of calls among the
// model-local functions of mp (see checkFunctionCalls), or nil.
func CheckFunctionCalls(mp *pb.ModelProto) error {
	return errors.Join(checkFunctionCalls(mp)...)
}

// checkFunctionCalls refuses model-local functions that call themselves,
// directly or through other functions, at any depth of subgraph inside their
// bodies: ONNX functions cannot recurse (a call is expanded in place), and a
// pass that inlines calls would never finish. The error names the cycle.
func checkFunctionCalls(mp *pb.ModelProto) []error {
	if len(mp.Functions) == 0 {
		return nil
	}
	calls := map[funcKey][]funcKey{}
	defined := map[funcKey]bool{}
	for _, f := range mp.Functions {
		defined[funcKey{f.GetDomain(), f.GetName(), f.GetOverload()}] = true
	}
	for _, f := range mp.Functions {
		k := funcKey{f.GetDomain(), f.GetName(), f.GetOverload()}
		seen := map[funcKey]bool{}
		eachNode(f.Node, func(n *pb.NodeProto) {
			c := funcKey{n.GetDomain(), n.GetOpType(), n.GetOverload()}
			if defined[c] && !seen[c] {
				seen[c] = true
				calls[k] = append(calls[k], c)
			}
		})
	}
	const (
		unseen = iota
		open
		done
	)
	state := map[funcKey]int{}
	var errs []error
	var path []funcKey
	var visit func(k funcKey)
	visit = func(k funcKey) {
		state[k] = open
		path = append(path, k)
		for _, c := range calls[k] {
			switch state[c] {
			case open:
				i := len(path) - 1
				for path[i] != c {
					i--
				}
				cycle := make([]string, 0, len(path)-i+1)
				for _, p := range path[i:] {
					cycle = append(cycle, p.String())
				}
				cycle = append(cycle, c.String())
				errs = append(errs, fmt.Errorf("model-local function %s is recursive (%s): a function may not call itself", c, strings.Join(cycle, " -> ")))
			case unseen:
				visit(c)
			}
		}
		path = path[:len(path)-1]
		state[k] = done
	}
	for _, f := range mp.Functions {
		if k := (funcKey{f.GetDomain(), f.GetName(), f.GetOverload()}); state[k] == unseen {
			visit(k)
		}
	}
	return errs
}

// eachNode calls fn for every node of ns and of the subgraphs in their
// attributes, at any depth.
func eachNode(ns []*pb.NodeProto, fn func(*pb.NodeProto)) {
	for _, n := range ns {
		fn(n)
		for _, a := range n.Attribute {
			if a.G != nil {
				eachNode(a.G.Node, fn)
			}
			for _, g := range a.Graphs {
				eachNode(g.Node, fn)
			}
		}
	}
}
