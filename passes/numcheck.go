package passes

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// CheckTolerance is the tolerance of the per-block numerical check:
// |fused - original| <= ATol + RTol*|original| element-wise.
var CheckTolerance = struct{ RTol, ATol float64 }{1e-4, 1e-5}

// RandomFeeds makes deterministic random inputs for every graph input of m
// that is not an initializer: float inputs from N(0, 1); integer inputs
// uniform in [0, V) where V is the row count of the first initializer the
// input gathers from (an embedding), else 100. Dynamic dims take
// dynDim (the first) and 1 (the rest).
func RandomFeeds(m *graph.Model, seed uint64, dynDim int) (map[string]*eval.Tensor, error) {
	g := m.Graph()
	rng := rand.New(rand.NewPCG(seed, 0x6d6f6b6f7074))
	feeds := map[string]*eval.Tensor{}
	for _, v := range m.Proto.Graph.Input {
		if g.Initializer(v.GetName()) != nil {
			continue
		}
		tt := v.GetType().GetTensorType()
		if tt == nil {
			return nil, fmt.Errorf("graph input %q is not a tensor", v.GetName())
		}
		var shape []int
		dyn := dynDim
		for _, d := range tt.GetShape().GetDim() {
			if _, ok := d.Value.(*pb.TensorShapeProto_Dimension_DimValue); ok {
				shape = append(shape, int(d.GetDimValue()))
			} else {
				shape = append(shape, dyn)
				dyn = 1
			}
		}
		n := 1
		for _, d := range shape {
			n *= d
		}
		dt := pb.TensorProto_DataType(tt.GetElemType())
		switch dt {
		case pb.TensorProto_FLOAT, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16, pb.TensorProto_DOUBLE:
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			t := eval.NewFloat32(shape, x)
			t.DType = dt
			feeds[v.GetName()] = t
		case pb.TensorProto_INT64, pb.TensorProto_INT32:
			bound := int64(100)
			for _, c := range g.Consumers(v.GetName()) {
				if c.GetOpType() == "Gather" && len(c.Input) > 1 && c.Input[1] == v.GetName() {
					if emb := g.Initializer(c.Input[0]); emb != nil && len(emb.GetDims()) > 0 {
						bound = emb.GetDims()[0]
						break
					}
				}
			}
			x := make([]int64, n)
			for i := range x {
				x[i] = rng.Int64N(bound)
			}
			t := eval.NewInt64(shape, x)
			t.DType = dt
			feeds[v.GetName()] = t
		default:
			return nil, fmt.Errorf("graph input %q has type %s, which random inputs do not cover", v.GetName(), dt)
		}
	}
	return feeds, nil
}

// numericCheck runs the original model on random inputs (two seeds),
// captures each block's input and output, and compares the output with the
// fused node's reference semantics on the captured input. It returns one
// error (or nil) per block. A block whose fused input has the wrong shape
// but whose router input fits is switched to the router input.
//
// With data (CheckData) the model runs on those input sets instead, each of
// which must run; the case label in messages is then the set's position.
func numericCheck(ctx context.Context, m *graph.Model, blocks []*Block, ws []*moe.Weights, data []map[string]*eval.Tensor) ([]error, error) {
	errs := make([]error, len(blocks))
	want := map[string]bool{}
	for _, b := range blocks {
		want[b.Input], want[b.Router], want[b.Output] = true, true, true
	}
	ran := 0
	var lastErr error
	cases := uint64(12)
	if len(data) > 0 {
		cases = uint64(len(data))
	}
	for seed := uint64(1); seed <= cases && (ran < 2 || len(data) > 0); seed++ {
		var feeds map[string]*eval.Tensor
		var err error
		if len(data) > 0 {
			feeds = data[seed-1]
		} else if feeds, err = RandomFeeds(m, seed, 7); err != nil {
			return nil, err
		}
		vals, err := eval.Run(ctx, m, feeds, eval.Options{Capture: func(n string) bool { return want[n] }})
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if len(data) > 0 {
				return nil, fmt.Errorf("numerical check: the original model does not run on check data set %d: %w", seed-1, err)
			}
			// Some traced graphs only run on inputs like their trace input
			// (a loop unrolled over the experts hit at trace time): try others.
			lastErr = err
			continue
		}
		ran++
		for i, b := range blocks {
			if errs[i] != nil {
				continue
			}
			x, y := vals[b.Input], vals[b.Output]
			if x == nil || y == nil || x.F32 == nil || y.F32 == nil {
				errs[i] = fmt.Errorf("numerical check: block input or output not computed as float")
				continue
			}
			if !slices.Equal(x.Shape, y.Shape) {
				if r := vals[b.Router]; r != nil && slices.Equal(r.Shape, y.Shape) {
					b.Input, x = b.Router, r
				} else {
					errs[i] = fmt.Errorf("numerical check: block input shape %v differs from output shape %v", x.Shape, y.Shape)
					continue
				}
			}
			T := len(x.F32) / b.Spec.Hidden
			var keep func(int) bool
			if b.TracedExperts > 0 {
				keep = tracedExperts(&b.Spec, ws[i], x.F32, T, b.TracedExperts)
			}
			got, err := moe.ForwardExperts(&b.Spec, ws[i], x.F32, T, keep)
			if err != nil {
				errs[i] = err
				continue
			}
			peak := 0.0
			for _, v := range y.F32 {
				peak = max(peak, math.Abs(float64(v)))
			}
			rtol, atol, half := checkTolerance(y.DType, peak)
			var skip func(int) bool
			if half { // tokens whose routing a rounded router may flip
				gaps := moe.RouteGaps(&b.Spec, ws[i], x.F32, T)
				tie := nearTie(y.DType)
				skip = func(t int) bool { return gaps[t] < tie }
			}
			off, worst, at := tokensOff(got, y.F32, b.Spec.Hidden, rtol, atol, skip)
			if off > 0 {
				where := fmt.Sprintf("random inputs, seed %d", seed)
				if len(data) > 0 {
					where = fmt.Sprintf("check data set %d", seed-1)
				}
				errs[i] = fmt.Errorf("numerical check failed: the fused node's semantics differ from the original subgraph by %.3g at element %d, %d of %d tokens off (%s)", worst, at, off, T, where)
			}
		}
	}
	if ran == 0 {
		return nil, fmt.Errorf("%w: the original model fails on random inputs: %v", ErrCheckInconclusive, lastErr)
	}
	return errs, nil
}

// ErrCheckInconclusive is wrapped when the numerical check could not run.
var ErrCheckInconclusive = errors.New("numerical check inconclusive")

// tracedExperts says which experts a trace unrolled over the experts hit at
// trace time computes on input x: the first n experts hit, in ascending id
// order (the order ONNX NonZero lists them in, which such traces iterate
// over). The check of a restored block compares the original graph with the
// fused semantics restricted to these experts, which proves the restored
// block equal to the trace on everything the trace computes.
func tracedExperts(s *moe.Spec, w *moe.Weights, x []float32, T, n int) func(int) bool {
	ids, _ := moe.Route(s, w, x, T)
	hit := make([]bool, s.NumExperts)
	for _, row := range ids {
		for _, e := range row {
			hit[e] = true
		}
	}
	kept := make([]bool, s.NumExperts)
	for e := 0; e < s.NumExperts && n > 0; e++ {
		if hit[e] {
			kept[e] = true
			n--
		}
	}
	return func(e int) bool { return kept[e] }
}
