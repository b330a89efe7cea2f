package passes

import (
	"context"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/models"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// checkedBlock builds a generated model, detects its one block and reads
// its weights.
func checkedBlock(t *testing.T, cfg models.Config) (*graph.Model, *Block, *moe.Weights) {
	t.Helper()
	m, err := models.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	det, err := Detect(m)
	if err != nil || len(det.Blocks) != 1 {
		t.Fatalf("detect: %v, %+v", err, det)
	}
	b := det.Blocks[0]
	w, err := b.W.Materialize(m, &b.Spec)
	if err != nil {
		t.Fatal(err)
	}
	return m, b, w
}

// TestNumericCheckCatchesThroughNewPath: on a static-token batched-experts
// model (512 tokens, the gathered weights kept lazy, a few distinct tokens
// repeated over the token dim) and on a symbolic-token one, the check
// passes the true semantics and refuses each broken one: one weight moved
// by 1e-2, two experts swapped, renormalisation dropped.
func TestNumericCheckCatchesThroughNewPath(t *testing.T) {
	for _, tokens := range []int{512, 0} {
		for _, tc := range []struct {
			name   string
			break_ func(s *moe.Spec, w *moe.Weights)
			fail   bool
		}{
			{"true semantics", func(*moe.Spec, *moe.Weights) {}, false},
			{"one weight moved by 1e-2", func(s *moe.Spec, w *moe.Weights) {
				per := len(w.Gate) / s.NumExperts
				w.Gate[5*per+17] += 1e-2
			}, true},
			{"two experts swapped", func(s *moe.Spec, w *moe.Weights) {
				for _, p := range [][]float32{w.Gate, w.Up, w.Down} {
					per := len(p) / s.NumExperts
					for j := 0; j < per; j++ {
						p[2*per+j], p[6*per+j] = p[6*per+j], p[2*per+j]
					}
				}
			}, true},
			{"renormalisation dropped", func(s *moe.Spec, _ *moe.Weights) { s.NormalizeTopK = false }, true},
		} {
			t.Run(tc.name+map[bool]string{true: "/static 512 tokens", false: "/symbolic tokens"}[tokens > 0], func(t *testing.T) {
				m, b, w := checkedBlock(t, models.Config{Shape: models.ShapeBatched, Layers: 1, Experts: 8, TopK: 2, Hidden: 32, Inter: 16, Normalize: true, Seed: 3, Tokens: tokens})
				tc.break_(&b.Spec, w)
				before := eval.LazyGathers()
				errs, err := numericCheck(context.Background(), m, []*Block{b}, []*moe.Weights{w}, nil, 64<<20)
				if err != nil {
					t.Fatal(err)
				}
				if eval.LazyGathers() == before {
					t.Fatal("the gathered expert weights were copied, not kept lazy")
				}
				if (errs[0] != nil) != tc.fail {
					t.Fatalf("check error %v, want failure %v", errs[0], tc.fail)
				}
			})
		}
	}
}

// TestNumericCheckOverBudget: a check whose interpreter needs more than the
// budget fails with an error wrapping eval.ErrMemLimit (not inconclusive,
// not a crash).
func TestNumericCheckOverBudget(t *testing.T) {
	m, b, w := checkedBlock(t, models.Config{Shape: models.ShapeBatched, Layers: 1, Experts: 8, TopK: 2, Hidden: 32, Inter: 16, Normalize: true, Seed: 3, Tokens: 512})
	_, err := numericCheck(context.Background(), m, []*Block{b}, []*moe.Weights{w}, nil, 20<<10)
	if err == nil || !strings.Contains(err.Error(), "memory limit exceeded") {
		t.Fatalf("want a memory-limit error, got %v", err)
	}
}

// spreadBinades multiplies every element of the model's float initializers
// of rank >= 2 (the weights) by 2^e, e uniform in [lo, hi].
func spreadBinades(t *testing.T, m *graph.Model, lo, hi int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 9))
	for _, p := range m.Proto.Graph.Initializer {
		if graph.DataType(p) != pb.TensorProto_FLOAT || len(p.GetDims()) < 2 {
			continue
		}
		x, err := eval.FromProto(p, m.TensorBytes)
		if err != nil {
			t.Fatal(err)
		}
		for i := range x.F32 {
			x.F32[i] = float32(math.Ldexp(float64(x.F32[i]), lo+rng.IntN(hi-lo+1)))
		}
		q := moe.Float32Tensor(p.GetName(), p.GetDims(), x.F32)
		p.RawData, p.FloatData, p.DataLocation, p.ExternalData = q.RawData, q.FloatData, q.DataLocation, q.ExternalData
	}
}

// toDouble rewrites m to compute in float64: float initializers and graph
// inputs and outputs become DOUBLE (the generated graphs hold no casts).
func toDouble(t *testing.T, m *graph.Model) *graph.Model {
	t.Helper()
	c := &graph.Model{Proto: proto.Clone(m.Proto).(*pb.ModelProto), Dir: m.Dir}
	for _, p := range c.Proto.Graph.Initializer {
		if graph.DataType(p) != pb.TensorProto_FLOAT {
			continue
		}
		x, err := eval.FromProto(p, m.TensorBytes)
		if err != nil {
			t.Fatal(err)
		}
		d := make([]float64, len(x.F32))
		for i, v := range x.F32 {
			d[i] = float64(v)
		}
		p.RawData, p.FloatData, p.DataLocation, p.ExternalData = nil, nil, nil, nil
		p.DataType = proto.Int32(int32(pb.TensorProto_DOUBLE))
		p.DoubleData = d
	}
	for _, v := range append(c.Proto.Graph.Input, c.Proto.Graph.Output...) {
		if tt := v.GetType().GetTensorType(); tt != nil && tt.GetElemType() == int32(pb.TensorProto_FLOAT) {
			tt.ElemType = proto.Int32(int32(pb.TensorProto_DOUBLE))
		}
	}
	return c
}

// TestWideBinadeTolerance: a block whose weights span 40 binades (2^-30 to
// 2^10 times their usual size) computes, in float32, outputs whose
// elements are sums of terms of very different sizes; the order of those
// sums differs between the original graph and the fused semantics. A
// float64 evaluation of the original graph is the truth that decides: both
// float32 results are within float32 rounding of it, relative to each
// token's output magnitude, so the check must pass the true semantics, and
// still refuse a moved weight and swapped experts.
func TestWideBinadeTolerance(t *testing.T) {
	cfg := models.Config{Shape: models.ShapeBatched, Layers: 1, Experts: 8, TopK: 2, Hidden: 64, Inter: 64, Normalize: true, Seed: 5}
	for _, tc := range []struct {
		name   string
		break_ func(s *moe.Spec, w *moe.Weights)
		fail   bool
	}{
		{"true semantics", func(*moe.Spec, *moe.Weights) {}, false},
		{"two experts swapped", func(s *moe.Spec, w *moe.Weights) {
			per := len(w.Down) / s.NumExperts
			for j := 0; j < per; j++ {
				w.Down[2*per+j], w.Down[6*per+j] = w.Down[6*per+j], w.Down[2*per+j]
			}
		}, true},
		{"renormalisation dropped", func(s *moe.Spec, _ *moe.Weights) { s.NormalizeTopK = false }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := models.Build(cfg)
			if err != nil {
				t.Fatal(err)
			}
			spreadBinades(t, m, -30, 10)
			det, err := Detect(m)
			if err != nil || len(det.Blocks) != 1 {
				t.Fatalf("detect: %v", err)
			}
			b := det.Blocks[0]
			w, err := b.W.Materialize(m, &b.Spec)
			if err != nil {
				t.Fatal(err)
			}
			if tc.name == "true semantics" {
				reassociationOnly(t, m, b, w)
			}
			tc.break_(&b.Spec, w)
			errs, err := numericCheck(context.Background(), m, []*Block{b}, []*moe.Weights{w}, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			if (errs[0] != nil) != tc.fail {
				t.Fatalf("check error %v, want failure %v", errs[0], tc.fail)
			}
		})
	}
}

// reassociationOnly shows, with a float64 evaluation of the original graph
// as the truth, that the float32 original and the float32 fused semantics
// differ from it by float32 rounding relative to each token's magnitude
// (and logs how far apart they are element-wise).
func reassociationOnly(t *testing.T, m *graph.Model, b *Block, w *moe.Weights) {
	t.Helper()
	feeds, err := checkFeeds(m, 1, 14, 0)
	if err != nil {
		t.Fatal(err)
	}
	x := feeds[m.Proto.Graph.Input[0].GetName()]
	out32, err := eval.Run(context.Background(), m, feeds, eval.Options{})
	if err != nil {
		t.Fatal(err)
	}
	md := toDouble(t, m)
	xd := make([]float64, len(x.F32))
	for i, v := range x.F32 {
		xd[i] = float64(v)
	}
	in := md.Proto.Graph.Input[0].GetName()
	out64, err := eval.Run(context.Background(), md, map[string]*eval.Tensor{in: eval.NewFloat64(x.Shape, xd)}, eval.Options{})
	if err != nil {
		t.Fatal(err)
	}
	name := m.Proto.Graph.Output[0].GetName()
	y32, y64 := out32[name].F32, out64[name].F64
	H := b.Spec.Hidden
	got, err := moe.Forward(&b.Spec, w, x.F32, len(x.F32)/H)
	if err != nil {
		t.Fatal(err)
	}
	worstElem, worstTok, worstTruth := 0.0, 0.0, 0.0
	for tok := 0; tok*H < len(y32); tok++ {
		mag := 0.0
		for j := tok * H; j < (tok+1)*H; j++ {
			mag = max(mag, math.Abs(y64[j]))
		}
		for j := tok * H; j < (tok+1)*H; j++ {
			d := math.Abs(float64(got[j]) - float64(y32[j]))
			worstElem = max(worstElem, d/(1e-30+math.Abs(float64(y32[j]))))
			worstTok = max(worstTok, d/mag)
			worstTruth = max(worstTruth, math.Abs(float64(y32[j])-y64[j])/mag, math.Abs(float64(got[j])-y64[j])/mag)
		}
	}
	t.Logf("fused vs original float32: worst element-relative difference %.3g, worst token-relative %.3g; worst token-relative distance of either from the float64 truth %.3g", worstElem, worstTok, worstTruth)
	if worstTruth > tokenRTol {
		t.Fatalf("a float32 result is %.3g (relative to its token's magnitude) from the float64 truth: not rounding", worstTruth)
	}
}

// TestSymbolicDimsStaticTrace: an export whose input declares symbolic
// dims while a Reshape inside pins the traced token count gets a
// conclusive check (random inputs of the pinned shape, no inconclusive
// warning) that passes the true semantics and refuses swapped experts.
func TestSymbolicDimsStaticTrace(t *testing.T) {
	f := "../testdata/producers/symbolic_static_hf4_mixtral.onnx"
	for _, swap := range []bool{false, true} {
		m, err := graph.Load(f)
		if err != nil {
			t.Fatal(err)
		}
		det, err := Detect(m)
		if err != nil || len(det.Blocks) != 1 {
			t.Fatalf("detect: %v", err)
		}
		b := det.Blocks[0]
		w, err := b.W.Materialize(m, &b.Spec)
		if err != nil {
			t.Fatal(err)
		}
		if swap {
			per := len(w.Down) / b.Spec.NumExperts
			for j := 0; j < per; j++ {
				w.Down[j], w.Down[per+j] = w.Down[per+j], w.Down[j]
			}
		}
		errs, err := numericCheck(context.Background(), m, []*Block{b}, []*moe.Weights{w}, nil, 0)
		if err != nil {
			t.Fatalf("swap %v: %v", swap, err)
		}
		if (errs[0] != nil) != swap {
			t.Fatalf("swap %v: check error %v", swap, errs[0])
		}
	}
	// Declared with dims of its own, the output is not said to have the
	// input's dims: the fused node, whose output has its input's shape,
	// could change it, and the check says so.
	m, err := graph.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	out := m.Proto.Graph.Output[0].GetType().GetTensorType().GetShape()
	out.Dim[0] = &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "rows"}}
	out.Dim[1] = &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "cols"}}
	det, err := Detect(m)
	if err != nil || len(det.Blocks) != 1 {
		t.Fatalf("detect: %v", err)
	}
	errs, err := numericCheck(context.Background(), m, det.Blocks, make([]*moe.Weights, 1), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "differs from output shape") {
		t.Fatalf("output declared [rows cols 96]: check error %v, want the shapes named", errs[0])
	}
}

// TestSameDeclaredDims: values declared with the same dims, each the same
// number or the same name, agree; any other pair, or a value declared
// without a shape or not at all, does not.
func TestSameDeclaredDims(t *testing.T) {
	vi := func(name string, dims ...any) *pb.ValueInfoProto {
		sh := &pb.TensorShapeProto{}
		for _, d := range dims {
			switch d := d.(type) {
			case int:
				sh.Dim = append(sh.Dim, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: int64(d)}})
			case string:
				sh.Dim = append(sh.Dim, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: d}})
			default:
				sh.Dim = append(sh.Dim, &pb.TensorShapeProto_Dimension{})
			}
		}
		return &pb.ValueInfoProto{Name: proto.String(name), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{Shape: sh}}}}
	}
	gp := &pb.GraphProto{
		Input:     []*pb.ValueInfoProto{vi("x", "batch", "seq", 96)},
		Output:    []*pb.ValueInfoProto{vi("y", "batch", "seq", 96), vi("static", 2, 8, 96)},
		ValueInfo: []*pb.ValueInfoProto{vi("z", "batch", "seq", 96), vi("other", "b", "seq", 96), vi("rank2", "batch", 96), vi("unknown", nil, "seq", 96), {Name: proto.String("noshape")}},
	}
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"x", "y", true}, {"x", "z", true}, {"x", "static", false}, {"x", "other", false},
		{"x", "rank2", false}, {"x", "unknown", false}, {"unknown", "unknown", false}, {"x", "noshape", false}, {"x", "missing", false},
	} {
		if got := sameDeclaredDims(gp, c.a, c.b); got != c.want {
			t.Errorf("sameDeclaredDims(%s, %s) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

// TestNumericCheckPerCopyWeights: in a model of 12 blocks of one structure,
// checked together (blocks in parallel where there are cores), the check
// compares each block against its own weights: a gate weight of each
// expert moved by 1e-2 in one block's weights fails that block, and only
// it, whether the blocks are checked while the model runs (two procs) or
// after it (one).
func TestNumericCheckPerCopyWeights(t *testing.T) {
	const n, bad = 12, 7
	m, err := models.Build(models.Config{Shape: models.ShapeBatched, Layers: n, Experts: 8, TopK: 2, Hidden: 32, Inter: 16, Normalize: true, Seed: 3, Tokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	det, err := Detect(m)
	if err != nil || len(det.Blocks) != n {
		t.Fatalf("detect: %v, %d blocks, want %d", err, len(det.Blocks), n)
	}
	for _, procs := range []int{1, 2} {
		prev := runtime.GOMAXPROCS(procs)
		ws := make([]*moe.Weights, n)
		w, err := det.Blocks[bad].W.Materialize(m, &det.Blocks[bad].Spec)
		if err != nil {
			t.Fatal(err)
		}
		per := len(w.Gate) / det.Blocks[bad].Spec.NumExperts
		for e := range det.Blocks[bad].Spec.NumExperts {
			w.Gate[e*per+3] += 1e-2
		}
		ws[bad] = w
		errs, err := numericCheck(context.Background(), m, det.Blocks, ws, nil, 0)
		runtime.GOMAXPROCS(prev)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range errs {
			if (e != nil) != (i == bad) {
				t.Errorf("%d procs: block %d: check error %v, want failure %v", procs, i, e, i == bad)
			}
		}
	}
}

// TestCheckReadsInputOfOutputShape: the fused node's output has its
// input's shape, so a block whose output is the [T, H] reshape of a
// [B, S, H] input is fused on the router's [T, H] input: the check moves
// the block's input there rather than comparing rows across shapes.
func TestCheckReadsInputOfOutputShape(t *testing.T) {
	m, err := graph.Load("../testdata/producers/m_ortext_ts_llama4.onnx")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	wc, _, _ := canonicalView(context.Background(), m)
	if wc == nil {
		t.Fatal("the export needs no canonicalization: not the case of this test")
	}
	det, err := Detect(wc)
	if err != nil || len(det.Blocks) != 1 {
		t.Fatalf("detect: %v", err)
	}
	b := det.Blocks[0]
	b.Input = "hidden_states" // the [2, 5, 64] model input; the block's output is [10, 64]
	errs, err := numericCheck(context.Background(), wc, []*Block{b}, []*moe.Weights{nil}, nil, 0)
	if err != nil || errs[0] != nil {
		t.Fatalf("check: %v, %v", err, errs[0])
	}
	if b.Input != b.Router {
		t.Fatalf("fused input %q, want the router's [T, H] input %q", b.Input, b.Router)
	}
}

// TestEarlyChecks: with a second proc, every block that reads a computed
// value is checked while the model runs, with the result the check after the run gives (a block with
// a wrong weight fails, the others pass); a run that fails records nothing.
func TestEarlyChecks(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	m, err := models.Build(models.Config{Shape: models.ShapeBatched, Layers: 3, Experts: 4, TopK: 2, Hidden: 8, Inter: 8, Router: "softmax", Normalize: true})
	if err != nil {
		t.Fatal(err)
	}
	det, err := Detect(m)
	if err != nil || len(det.Blocks) != 3 {
		t.Fatalf("detect: %v", err)
	}
	ws := make([]*moe.Weights, 3)
	if ws[1], err = det.Blocks[1].W.Materialize(m, &det.Blocks[1].Spec); err != nil {
		t.Fatal(err)
	}
	ws[1].Down[5] += 1e-2
	feeds, err := checkFeeds(m, 1, checkTokens(det.Blocks), 0)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, b := range det.Blocks {
		want[b.Input], want[b.Router], want[b.Output] = true, true, true
	}
	for _, ok := range []bool{true, false} {
		errs := make([]error, 3)
		early := newEarlyChecks(context.Background(), m, det.Blocks, ws, errs, 0, "seed 1", nil)
		vals, err := eval.Run(context.Background(), m, feeds, eval.Options{Capture: func(n string) bool { return want[n] }, OnCapture: early.captured})
		if err != nil {
			t.Fatal(err)
		}
		done := early.finish(ok)
		for i, b := range det.Blocks {
			// the first block reads the graph's input, which the run does
			// not report: it is checked after the run
			if done[i] != (ok && i > 0) {
				t.Fatalf("run ok %v: block %d checked early: %v", ok, i, done[i])
			}
			if !ok {
				if errs[i] != nil {
					t.Fatalf("failed run recorded an error for block %d: %v", i, errs[i])
				}
				continue
			}
			late := checkBlock(m, b, vals, ws, i, nil, "seed 1")
			if (errs[i] != nil) != (i == 1) || (late != nil) != (i == 1) {
				t.Fatalf("block %d: early check %v, after the run %v, want failure %v", i, errs[i], late, i == 1)
			}
		}
	}
}

// TestDistinctRows: rows equal in every bit share a distinct row, in order
// of first appearance, with the hash a good one or one that makes every
// row collide.
func TestDistinctRows(t *testing.T) {
	nan := float32(math.NaN())
	negZero := float32(math.Copysign(0, -1))
	x := []float32{
		1, 2,
		3, 4,
		1, 2,
		0, 0,
		negZero, 0, // bits differ from 0, 0
		nan, 1,
		3, 4,
		nan, 1, // the same NaN bits
	}
	wantOut := []float32{1, 2, 3, 4, 0, 0, negZero, 0, nan, 1}
	wantOf := []int{0, 1, 0, 2, 3, 4, 1, 4}
	hashes := map[string]func([]byte) uint64{
		"maphash":     nil,
		"all collide": func([]byte) uint64 { return 7 },
	}
	for name, h := range hashes {
		var out []float32
		var of []int
		if h == nil {
			out, of = distinctRows(x, 2)
		} else {
			out, of = distinctRowsBy(x, 2, h)
		}
		if !slices.Equal(of, wantOf) {
			t.Errorf("%s: positions %v, want %v", name, of, wantOf)
		}
		if len(out) != len(wantOut) {
			t.Fatalf("%s: %d distinct values, want %d", name, len(out), len(wantOut))
		}
		for i := range out {
			if math.Float32bits(out[i]) != math.Float32bits(wantOut[i]) {
				t.Errorf("%s: distinct value %d is %v, want %v", name, i, out[i], wantOut[i])
			}
		}
	}
}

// TestStaticTwin: the static shape the check feeds a graph input declared
// with symbolic dims, from a constant Reshape of it (in the graph, or inside
// an If branch that reads it from the outer scope); a constant
// Reshape target elsewhere of its rank is not taken for the input's dims.
func TestStaticTwin(t *testing.T) {
	i64 := func(name string, v ...int64) *pb.TensorProto {
		return &pb.TensorProto{Name: proto.String(name), Dims: []int64{int64(len(v))}, DataType: proto.Int32(int32(pb.TensorProto_INT64)), Int64Data: v}
	}
	sym := func(names ...any) *pb.ValueInfoProto {
		var dims []*pb.TensorShapeProto_Dimension
		for _, n := range names {
			switch v := n.(type) {
			case string:
				dims = append(dims, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: v}})
			case int:
				dims = append(dims, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: int64(v)}})
			}
		}
		return &pb.ValueInfoProto{Name: proto.String("x"), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
			ElemType: proto.Int32(int32(pb.TensorProto_FLOAT)), Shape: &pb.TensorShapeProto{Dim: dims}}}}}
	}
	flat := graph.NewNode("Reshape", "", "flat", []string{"x", "s2"}, []string{"f"})
	back := graph.NewNode("Reshape", "", "back", []string{"f", "s3"}, []string{"y"})
	branch := func(nodes ...*pb.NodeProto) *pb.NodeProto {
		return graph.NewNode("If", "", "if", []string{"c"}, []string{"y"},
			&pb.AttributeProto{Name: proto.String("then_branch"), Type: pb.AttributeProto_GRAPH.Enum(),
				G: &pb.GraphProto{Node: nodes, Output: []*pb.ValueInfoProto{{Name: proto.String("y")}}}},
			&pb.AttributeProto{Name: proto.String("else_branch"), Type: pb.AttributeProto_GRAPH.Enum(),
				G: &pb.GraphProto{Node: []*pb.NodeProto{graph.NewNode("Identity", "", "e", []string{"x"}, []string{"y"})}, Output: []*pb.ValueInfoProto{{Name: proto.String("y")}}}})
	}
	shadow := graph.NewNode("Identity", "", "shadow", []string{"c"}, []string{"x"})
	cases := []struct {
		name  string
		in    *pb.ValueInfoProto
		nodes []*pb.NodeProto
		want  []int
	}{
		{"reshape pins the tokens", sym("batch", "seq", 96), []*pb.NodeProto{flat}, []int{16, 1, 96}},
		{"traced shape elsewhere not taken", sym("batch", "seq", 96), []*pb.NodeProto{flat, back}, []int{16, 1, 96}},
		{"inside an If branch", sym("batch", "seq", 96), []*pb.NodeProto{branch(flat, back)}, []int{16, 1, 96}},
		{"shadowed in the branch", sym("batch", "seq", 96), []*pb.NodeProto{branch(shadow, flat)}, nil},
		{"static dims", sym("batch", "seq", 48), []*pb.NodeProto{graph.NewNode("Reshape", "", "flat", []string{"x", "s1"}, []string{"f"}), back}, []int{32, 1, 48}},
		{"static input", sym(16, 96), []*pb.NodeProto{flat}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mp := &pb.ModelProto{IrVersion: proto.Int64(8), OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(17)}},
				Graph: &pb.GraphProto{Node: c.nodes, Input: []*pb.ValueInfoProto{c.in}, Output: []*pb.ValueInfoProto{{Name: proto.String("y")}},
					Initializer: []*pb.TensorProto{i64("s1", 32, 48), i64("s2", 16, 96), i64("s3", 2, 8, 96)}}}
			got := staticTwin(&graph.Model{Proto: mp}, c.in)
			if !slices.Equal(got, c.want) {
				t.Fatalf("static twin %v, want %v", got, c.want)
			}
		})
	}
}
