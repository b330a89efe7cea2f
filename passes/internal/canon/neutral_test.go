package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestDropNeutral(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	x := map[string]*eval.Tensor{"x": randF32(r, 3, 4)}
	c := func(v ...float32) map[string]*eval.Tensor {
		s := []int{} // a scalar, or a vector of len(v)
		if len(v) > 1 {
			s = []int{len(v)}
		}
		return map[string]*eval.Tensor{"c": eval.NewFloat32(s, v)}
	}
	one3 := map[string]*eval.Tensor{"c": eval.NewFloat32([]int{1, 1, 1}, []float32{1})} // adds an axis
	bin := func(op, a, b string) []*pb.NodeProto {
		return []*pb.NodeProto{node(op, []string{a, b}, []string{"y0"}), node("Sigmoid", []string{"y0"}, []string{"y"})}
	}
	runRuleCases(t, []Rule{DropNeutral, DropDead}, []ruleCase{
		{name: "x·1", nodes: bin("Mul", "x", "c"), inputs: x, inits: c(1), outputs: []string{"y"}, want: map[string]int{"Mul": 0}},
		{name: "1·x", nodes: bin("Mul", "c", "x"), inputs: x, inits: c(1), outputs: []string{"y"}, want: map[string]int{"Mul": 0}},
		{name: "x/1", nodes: bin("Div", "x", "c"), inputs: x, inits: c(1), outputs: []string{"y"}, want: map[string]int{"Div": 0}},
		{name: "x+0", nodes: bin("Add", "x", "c"), inputs: x, inits: c(0), outputs: []string{"y"}, want: map[string]int{"Add": 0}},
		{name: "0+x", nodes: bin("Add", "c", "x"), inputs: x, inits: c(0), outputs: []string{"y"}, want: map[string]int{"Add": 0}},
		{name: "x−0", nodes: bin("Sub", "x", "c"), inputs: x, inits: c(0), outputs: []string{"y"}, want: map[string]int{"Sub": 0}},
		{name: "x·2 kept", nodes: bin("Mul", "x", "c"), inputs: x, inits: c(2), outputs: []string{"y"}, noChange: true},
		{name: "0−x kept", nodes: bin("Sub", "c", "x"), inputs: x, inits: c(0), outputs: []string{"y"}, noChange: true},
		{name: "1/x kept", nodes: bin("Div", "c", "x"), inputs: x, inits: c(1), outputs: []string{"y"}, noChange: true},
		{name: "x·ones of more axes kept", nodes: bin("Mul", "x", "c"), inputs: x, inits: one3, outputs: []string{"y"}, noChange: true},
		{name: "x·[1, 2, 1, 1] kept", nodes: bin("Mul", "x", "c"), inputs: x, inits: c(1, 2, 1, 1), outputs: []string{"y"}, noChange: true},
	})
}

func TestNegationAsNeg(t *testing.T) {
	r := rand.New(rand.NewPCG(54, 55))
	x := map[string]*eval.Tensor{"x": randF32(r, 3, 4)}
	c := func(v ...float32) map[string]*eval.Tensor {
		s := []int{}
		if len(v) > 1 {
			s = []int{len(v)}
		}
		return map[string]*eval.Tensor{"c": eval.NewFloat32(s, v)}
	}
	bin := func(op, a, b string) []*pb.NodeProto {
		return []*pb.NodeProto{node(op, []string{a, b}, []string{"y0"}), node("Sigmoid", []string{"y0"}, []string{"y"})}
	}
	neg := map[string]int{"Neg": 1, "Mul": 0, "Div": 0}
	runRuleCases(t, []Rule{NegationAsNeg, DropDead}, []ruleCase{
		{name: "x·−1", nodes: bin("Mul", "x", "c"), inputs: x, inits: c(-1), outputs: []string{"y"}, want: neg},
		{name: "−1·x", nodes: bin("Mul", "c", "x"), inputs: x, inits: c(-1), outputs: []string{"y"}, want: neg},
		{name: "x/−1", nodes: bin("Div", "x", "c"), inputs: x, inits: c(-1), outputs: []string{"y"}, want: neg},
		{name: "−1/x kept", nodes: bin("Div", "c", "x"), inputs: x, inits: c(-1), outputs: []string{"y"}, noChange: true},
		{name: "x·−2 kept", nodes: bin("Mul", "x", "c"), inputs: x, inits: c(-2), outputs: []string{"y"}, noChange: true},
		{name: "x·[−1, 1, −1, −1] kept", nodes: bin("Mul", "x", "c"), inputs: x, inits: c(-1, 1, -1, -1), outputs: []string{"y"}, noChange: true},
	})
}
