package canon

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

var msImport = []*pb.OperatorSetIdProto{{Domain: proto.String(msDomain), Version: proto.Int64(1)}}

func sigmoid(v float64) float64 { return 1 / (1 + math.Exp(-v)) }

// matmul2 multiplies row-major a (m×k) by b (k×n), transposing either
// first when asked, then scales by alpha: the independent truth for the
// Gemm-like contrib ops.
func matmul2(a, b *eval.Tensor, ta, tb bool, alpha float64) *eval.Tensor {
	m, k := a.Shape[0], a.Shape[1]
	if ta {
		m, k = k, m
	}
	n := b.Shape[1]
	if tb {
		n = b.Shape[0]
	}
	out := make([]float32, m*n)
	for i := range m {
		for j := range n {
			s := 0.0
			for l := range k {
				av := a.F32[i*k+l]
				if ta {
					av = a.F32[l*m+i]
				}
				bv := b.F32[l*n+j]
				if tb {
					bv = b.F32[j*k+l]
				}
				s += float64(av) * float64(bv)
			}
			out[i*n+j] = float32(alpha * s)
		}
	}
	return eval.NewFloat32([]int{m, n}, out)
}

func TestContribDecompositions(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	x := randF32(r, 3, 4)
	b32 := randF32(r, 3, 2)
	a, b, bt, c := randF32(r, 3, 4), randF32(r, 4, 5), randF32(r, 5, 4), randF32(r, 5)
	in := map[string]*eval.Tensor{"x": x}
	gelu := func(v float64) float64 { return 0.5 * v * (1 + math.Erf(v/math.Sqrt2)) }
	runRuleCases(t, Rules(), []ruleCase{
		{name: "quickgelu alpha 1 (SiLU)", nodes: []*pb.NodeProto{msNode("QuickGelu", []string{"x"}, []string{"y"}, graph.FloatAttr("alpha", 1))}, extra: msImport,
			inputs: in, outputs: []string{"y"}, want: map[string]int{"com.microsoft::QuickGelu": 0, "Sigmoid": 1, "Mul": 1},
			ref: func(map[string]*eval.Tensor) map[string]*eval.Tensor {
				return map[string]*eval.Tensor{"y": mapF32(x, func(v float64) float64 { return v * sigmoid(v) })}
			}},
		{name: "quickgelu default alpha", nodes: []*pb.NodeProto{msNode("QuickGelu", []string{"x"}, []string{"y"})}, extra: msImport,
			inputs: in, outputs: []string{"y"}, want: map[string]int{"Sigmoid": 1, "Mul": 2},
			ref: func(map[string]*eval.Tensor) map[string]*eval.Tensor {
				return map[string]*eval.Tensor{"y": mapF32(x, func(v float64) float64 { return v * sigmoid(float64(float32(1.702))*v) })}
			}},
		{name: "fusedgemm relu transB", nodes: []*pb.NodeProto{msNode("FusedGemm", []string{"a", "bt", "c"}, []string{"y"}, graph.StringAttr("activation", "Relu"), graph.IntAttr("transB", 1), graph.FloatAttr("alpha", 0.5))}, extra: msImport,
			inputs: map[string]*eval.Tensor{"a": a}, inits: map[string]*eval.Tensor{"bt": bt, "c": c}, outputs: []string{"y"}, want: map[string]int{"Gemm": 1, "Relu": 1},
			ref: func(map[string]*eval.Tensor) map[string]*eval.Tensor {
				y := matmul2(a, bt, false, true, 0.5)
				for i := range y.F32 {
					y.F32[i] = float32(math.Max(0, float64(y.F32[i]+c.F32[i%5])))
				}
				return map[string]*eval.Tensor{"y": y}
			}},
		{name: "fusedgemm no activation", nodes: []*pb.NodeProto{msNode("FusedGemm", []string{"a", "b"}, []string{"y"})}, extra: msImport,
			inputs: map[string]*eval.Tensor{"a": a}, inits: map[string]*eval.Tensor{"b": b}, outputs: []string{"y"}, want: map[string]int{"Gemm": 1},
			ref: func(map[string]*eval.Tensor) map[string]*eval.Tensor {
				return map[string]*eval.Tensor{"y": matmul2(a, b, false, false, 1)}
			}},
		{name: "fusedmatmul transB alpha", nodes: []*pb.NodeProto{msNode("FusedMatMul", []string{"a", "bt"}, []string{"y"}, graph.IntAttr("transB", 1), graph.FloatAttr("alpha", 0.25))}, extra: msImport,
			inputs: map[string]*eval.Tensor{"a": a, "bt": bt}, outputs: []string{"y"}, want: map[string]int{"MatMul": 1, "Transpose": 1, "Mul": 1},
			ref: func(map[string]*eval.Tensor) map[string]*eval.Tensor {
				return map[string]*eval.Tensor{"y": matmul2(a, bt, false, true, 0.25)}
			}},
		{name: "fusedmatmul transA", nodes: []*pb.NodeProto{msNode("FusedMatMul", []string{"at", "b"}, []string{"y"}, graph.IntAttr("transA", 1))}, extra: msImport,
			inputs: map[string]*eval.Tensor{"at": a}, inits: map[string]*eval.Tensor{"b": b32}, outputs: []string{"y"}, want: map[string]int{"MatMul": 1, "Transpose": 1},
			ref: func(map[string]*eval.Tensor) map[string]*eval.Tensor {
				return map[string]*eval.Tensor{"y": matmul2(a, b32, true, false, 1)}
			}},
		{name: "transposematmul (older name)", nodes: []*pb.NodeProto{msNode("TransposeMatMul", []string{"a", "bt"}, []string{"y"}, graph.IntAttr("transB", 1))}, extra: msImport,
			inputs: map[string]*eval.Tensor{"a": a, "bt": bt}, outputs: []string{"y"}, want: map[string]int{"MatMul": 1, "Transpose": 1},
			ref: func(map[string]*eval.Tensor) map[string]*eval.Tensor {
				return map[string]*eval.Tensor{"y": matmul2(a, bt, false, true, 1)}
			}},
		{name: "fusedmatmul batch transpose kept", nodes: []*pb.NodeProto{msNode("FusedMatMul", []string{"a", "bt"}, []string{"y"}, graph.IntAttr("transBatchA", 1))}, extra: msImport,
			inputs: map[string]*eval.Tensor{"a": a, "bt": bt}, outputs: []string{"y"}, noChange: true},
		{name: "gelu", nodes: []*pb.NodeProto{msNode("Gelu", []string{"x"}, []string{"y"})}, extra: msImport,
			inputs: in, outputs: []string{"y"}, want: map[string]int{"Erf": 1},
			ref: func(map[string]*eval.Tensor) map[string]*eval.Tensor {
				return map[string]*eval.Tensor{"y": mapF32(x, gelu)}
			}},
		{name: "biasgelu", nodes: []*pb.NodeProto{msNode("BiasGelu", []string{"x", "bias"}, []string{"y"})}, extra: msImport,
			inputs: in, inits: map[string]*eval.Tensor{"bias": eval.NewFloat32([]int{4}, []float32{0.5, -1, 0, 2})}, outputs: []string{"y"}, want: map[string]int{"Erf": 1},
			ref: func(map[string]*eval.Tensor) map[string]*eval.Tensor {
				y := eval.NewFloat32(x.Shape, make([]float32, len(x.F32)))
				bias := []float64{0.5, -1, 0, 2}
				for i, v := range x.F32 {
					y.F32[i] = float32(gelu(float64(v) + bias[i%4]))
				}
				return map[string]*eval.Tensor{"y": y}
			}},
		{name: "fastgelu", nodes: []*pb.NodeProto{msNode("FastGelu", []string{"x"}, []string{"y"})}, extra: msImport,
			inputs: in, outputs: []string{"y"}, want: map[string]int{"Tanh": 1},
			ref: func(map[string]*eval.Tensor) map[string]*eval.Tensor {
				return map[string]*eval.Tensor{"y": mapF32(x, func(v float64) float64 {
					return 0.5 * v * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v)))
				})}
			}},
	})
}
