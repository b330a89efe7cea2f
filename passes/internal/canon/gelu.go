package canon

import (
	"math"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// ContribGelu decomposes com.microsoft::Gelu(X), the exact GELU
// 0.5 * X * (1 + Erf(X / sqrt(2))), into standard ops.
var ContribGelu = Rule{
	Name: "contrib-gelu",
	Ops:  []string{msDomain + "::Gelu"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 1 || len(n.Output) != 1 {
			return false, nil
		}
		return w.exactGelu(n, n.Input[0], "")
	},
}

// BiasGelu decomposes com.microsoft::BiasGelu(A, B), the exact GELU of
// A + B, into Add and the exact GELU's standard ops.
var BiasGelu = Rule{
	Name: "contrib-biasgelu",
	Ops:  []string{msDomain + "::BiasGelu"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) != 2 || len(n.Output) != 1 {
			return false, nil
		}
		return w.exactGelu(n, n.Input[0], n.Input[1])
	},
}

// FastGelu decomposes com.microsoft::FastGelu(X, bias?), the tanh
// approximation 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) of
// x = X + bias, into standard ops.
var FastGelu = Rule{
	Name: "contrib-fastgelu",
	Ops:  []string{msDomain + "::FastGelu"},
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if len(n.Input) < 1 || len(n.Input) > 2 || len(n.Output) != 1 {
			return false, nil
		}
		dt := w.ElemType(n.Input[0])
		if dt == 0 {
			return false, nil
		}
		var nodes []*pb.NodeProto
		x := n.Input[0]
		if len(n.Input) == 2 && n.Input[1] != "" {
			s := w.Temp(n, "biased")
			nodes = append(nodes, w.Node("Add", "", n.GetName()+"/Add_bias", []string{x, n.Input[1]}, []string{s}))
			x = s
		}
		k := map[string]float64{"c": 0.044715, "s": math.Sqrt(2 / math.Pi), "one": 1, "half": 0.5}
		names := map[string]string{}
		for _, key := range []string{"c", "s", "one", "half"} {
			v, err := w.Scalar(n.GetName()+"/"+key, dt, k[key])
			if err != nil {
				return false, nil
			}
			names[key] = v
		}
		x2, x3, cx3, inner, sc, th, p1, hx := w.Temp(n, "x2"), w.Temp(n, "x3"), w.Temp(n, "cx3"), w.Temp(n, "inner"), w.Temp(n, "scaled"), w.Temp(n, "tanh"), w.Temp(n, "plus1"), w.Temp(n, "halfx")
		nodes = append(nodes,
			w.Node("Mul", "", n.GetName()+"/x2", []string{x, x}, []string{x2}),
			w.Node("Mul", "", n.GetName()+"/x3", []string{x2, x}, []string{x3}),
			w.Node("Mul", "", n.GetName()+"/cx3", []string{x3, names["c"]}, []string{cx3}),
			w.Node("Add", "", n.GetName()+"/inner", []string{x, cx3}, []string{inner}),
			w.Node("Mul", "", n.GetName()+"/scale", []string{inner, names["s"]}, []string{sc}),
			w.Node("Tanh", "", n.GetName()+"/Tanh", []string{sc}, []string{th}),
			w.Node("Add", "", n.GetName()+"/plus1", []string{th, names["one"]}, []string{p1}),
			w.Node("Mul", "", n.GetName()+"/halfx", []string{x, names["half"]}, []string{hx}),
			w.Node("Mul", "", n.GetName()+"/Mul", []string{hx, p1}, n.Output))
		w.Replace(n, nodes...)
		return true, nil
	},
}

// exactGelu replaces n by the exact GELU of x (+ bias when not empty).
func (w *Work) exactGelu(n *pb.NodeProto, x, bias string) (bool, error) {
	dt := w.ElemType(x)
	if dt == 0 {
		return false, nil
	}
	var nodes []*pb.NodeProto
	if bias != "" {
		s := w.Temp(n, "biased")
		nodes = append(nodes, w.Node("Add", "", n.GetName()+"/Add_bias", []string{x, bias}, []string{s}))
		x = s
	}
	sqrt2, err := w.Scalar(n.GetName()+"/sqrt2", dt, math.Sqrt2)
	if err != nil {
		return false, nil
	}
	one, _ := w.Scalar(n.GetName()+"/one", dt, 1)
	half, _ := w.Scalar(n.GetName()+"/half", dt, 0.5)
	d, e, p, m := w.Temp(n, "div"), w.Temp(n, "erf"), w.Temp(n, "plus1"), w.Temp(n, "xplus")
	nodes = append(nodes,
		w.Node("Div", "", n.GetName()+"/Div", []string{x, sqrt2}, []string{d}),
		w.Node("Erf", "", n.GetName()+"/Erf", []string{d}, []string{e}),
		w.Node("Add", "", n.GetName()+"/Add", []string{e, one}, []string{p}),
		w.Node("Mul", "", n.GetName()+"/Mul_x", []string{x, p}, []string{m}),
		w.Node("Mul", "", n.GetName()+"/Mul_half", []string{m, half}, n.Output))
	w.Replace(n, nodes...)
	return true, nil
}
