package canon

import (
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestGemmComputedBias(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	a, b, bt := randF32(r, 3, 4), randF32(r, 4, 5), randF32(r, 5, 4)
	c2, c1 := randF32(r, 3, 5), randF32(r, 5)
	// want returns alpha·op(A)op(B) + beta·C with C broadcast over rows.
	want := func(ab *eval.Tensor, c *eval.Tensor, beta float64) map[string]*eval.Tensor {
		y := eval.NewFloat32(ab.Shape, append([]float32(nil), ab.F32...))
		for i := range y.F32 {
			y.F32[i] += float32(beta * float64(c.F32[i%len(c.F32)]))
		}
		return map[string]*eval.Tensor{"y": y}
	}
	runRuleCases(t, []Rule{GemmComputedBias}, []ruleCase{
		{name: "computed C, beta 1", nodes: []*pb.NodeProto{node("Gemm", []string{"a", "b", "c"}, []string{"y"})},
			inputs: map[string]*eval.Tensor{"a": a, "c": c2}, inits: map[string]*eval.Tensor{"b": b}, outputs: []string{"y"},
			want: map[string]int{"Gemm": 1, "Add": 1, "Mul": 0},
			ref: func(map[string]*eval.Tensor) map[string]*eval.Tensor {
				return want(matmul2(a, b, false, false, 1), c2, 1)
			}},
		{name: "computed 1-D C, beta and alpha, transB", nodes: []*pb.NodeProto{node("Gemm", []string{"a", "bt", "c"}, []string{"y"},
			graph.FloatAttr("alpha", 0.5), graph.FloatAttr("beta", 2), graph.IntAttr("transB", 1))},
			inputs: map[string]*eval.Tensor{"a": a, "c": c1}, inits: map[string]*eval.Tensor{"bt": bt}, outputs: []string{"y"},
			want: map[string]int{"Gemm": 1, "Add": 1, "Mul": 1},
			ref: func(map[string]*eval.Tensor) map[string]*eval.Tensor {
				return want(matmul2(a, bt, false, true, 0.5), c1, 2)
			}},
		{name: "constant bias kept", nodes: []*pb.NodeProto{node("Gemm", []string{"a", "b", "c"}, []string{"y"})},
			inputs: map[string]*eval.Tensor{"a": a}, inits: map[string]*eval.Tensor{"b": b, "c": c1}, outputs: []string{"y"}, noChange: true},
		{name: "no C", nodes: []*pb.NodeProto{node("Gemm", []string{"a", "b"}, []string{"y"})},
			inputs: map[string]*eval.Tensor{"a": a}, inits: map[string]*eval.Tensor{"b": b}, outputs: []string{"y"}, noChange: true},
	})
}
