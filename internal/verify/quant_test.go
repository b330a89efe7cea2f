package verify

import (
	"math"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func TestCompareQuant(t *testing.T) {
	ref := []float32{1, -2, 0, 4, 1e-6, -3}
	scaled := func(f float32) []float32 { // every element off by the fraction f, plus a near-zero blow-up
		out := make([]float32, len(ref))
		for i, v := range ref {
			out[i] = v * (1 + f)
		}
		out[4] = 1e-3 // 1000x the reference element: element-wise relative error 1e3
		return out
	}
	// Independent sums: |a-b| and |b| over ref.
	meanRel := func(a []float32) float64 {
		var d, w float64
		for i := range ref {
			d += math.Abs(float64(a[i]) - float64(ref[i]))
			w += math.Abs(float64(ref[i]))
		}
		return d / w
	}
	cases := []struct {
		name  string
		a     []float32
		bound float64
		pass  bool
	}{
		{"identical", ref, 0.08, true},
		{"2% off with a near-zero outlier passes 8%", scaled(0.02), 0.08, true},
		{"10% off fails 8%", scaled(0.10), 0.08, false},
		{"2% off fails 1%", scaled(0.02), 0.01, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var oc OutputCheck
			compareQuant(&oc, eval.NewFloat32([]int{2, 3}, tc.a), eval.NewFloat32([]int{2, 3}, ref), tc.bound)
			if oc.Pass != tc.pass {
				t.Fatalf("pass %v, want %v: %+v", oc.Pass, tc.pass, oc)
			}
			if got, want := float64(oc.MeanRel), meanRel(tc.a); math.Abs(got-want) > 1e-9*max(1, want) {
				t.Fatalf("mean rel %g, want %g", got, want)
			}
			if oc.QuantBound != tc.bound || oc.Elements != len(ref) || !tc.pass && !strings.Contains(oc.Message, "bound") {
				t.Fatalf("check %+v", oc)
			}
		})
	}
}

func TestIsFloat(t *testing.T) {
	for dt, want := range map[pb.TensorProto_DataType]bool{pb.TensorProto_FLOAT: true, pb.TensorProto_BFLOAT16: true, pb.TensorProto_INT64: false, pb.TensorProto_BOOL: false} {
		if isFloat(dt) != want {
			t.Errorf("isFloat(%s) = %v", dt, !want)
		}
	}
}
