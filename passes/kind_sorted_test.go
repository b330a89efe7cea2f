package passes

import (
	"context"
	"fmt"
	"math/rand"
	rand2 "math/rand/v2"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/models"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// sortedOpts shapes a synthetic sort-based (MegaBlocks-style) MoE block.
type sortedOpts struct {
	E, K, H, I, B, S int
	gateSecond       bool             // the gate is the second half of the fused projection
	separate         bool             // separate gate and up weights, activation per group
	actThenTopK      bool             // softmax over all experts before the top-k
	scatterElements  bool             // scatter back with ScatterElements instead of ScatterND
	listCounts       bool             // split sizes listed count by count (Gather + Concat)
	oneHot           bool             // counts from OneHot instead of ScatterElements
	oneHotTwice      bool             // the OneHot summed by two reductions
	breakOnes        bool             // the counts' one-hot scatters twos
	countSorted      bool             // with equalCounts: count the sorted ids
	unsort           string           // "scatter" or "gather": outputs put back in pair order, then weighted and summed over k
	unsortWeighted   bool             // with unsort: weight by the sorted weights before putting back
	tokGather        string           // "const" or "range": the pairs' tokens gathered by the permutation from token_of_pair
	breakTok         bool             // with tokGather "const": each pair given the next pair's token
	halveUp          bool             // the up half scaled by 0.5: silu(g)·u/2, which no activation of the table computes
	perPair          bool             // first projections put back in pair order between the projections
	bias             bool             // an output bias after the scatter
	gatesPerGroup    bool             // weight each expert's group before joining the groups
	noDiv            bool             // top-1: the permutation is the pairs' tokens, no division
	rawGates         bool             // weight by the top-k logits instead of their softmax
	gelu             bool             // a two-layer GELU MLP per expert
	equalCounts      bool             // counts from ids[:, None] == arange(E) over the flattened ids
	sliceGroups      string           // "inclusive", "exclusive" or "padded": groups sliced between running sums of the counts; "traced": at constant rows
	breakSlice       bool             // the first group sliced over two experts' rows
	gemmBias         bool             // per-expert projections as Gemm with per-expert biases
	half             bool             // float16 input and output around a float32 block
	unbindCounts     bool             // split sizes from the counts split into one-element pieces
	shared           bool             // a SwiGLU shared expert added to the scattered outputs
	sharedFused      bool             // the shared expert with one fused gate_up projection (GraniteMoeShared)
	breakScatter     string           // "perm": scatter back by the permutation, not the tokens; "identity": by the unsorted pairs' tokens
	breakSplit       string           // "const": split by constant sizes
	breakDiv         int              // divide the permutation by this instead of K
	floatMulDiv      bool             // the pairs' tokens as floor(float(perm) · (1/K)), cast back
	act              *models.Spelling // the expert activation spelled so (gated: of the fused gate_up halves; else of the gelu MLP's hidden)
}

// sortedModel builds a sort-based block as JetMoE's ParallelExperts export
// writes it (see KindSorted), with random weights from seed.
func sortedModel(o sortedOpts, seed int64) *graph.Model {
	r := rand.New(rand.NewSource(seed))
	rnd := func(n int, scale float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = (r.Float32()*2 - 1) * scale
		}
		return v
	}
	E, K, H, I := o.E, o.K, o.H, o.I
	var nodes []*pb.NodeProto
	var inits []*pb.TensorProto
	nn := 0
	add := func(op string, in []string, nout int, attrs ...*pb.AttributeProto) []string {
		nn++
		outs := make([]string, nout)
		for i := range outs {
			outs[i] = fmt.Sprintf("v%d_%d", nn, i)
		}
		nodes = append(nodes, graph.NewNode(op, "", fmt.Sprintf("n%d", nn), in, outs, attrs...))
		return outs
	}
	one := func(op string, in []string, attrs ...*pb.AttributeProto) string { return add(op, in, 1, attrs...)[0] }
	ints := func(v ...int64) string {
		name := fmt.Sprintf("c%d", len(inits))
		inits = append(inits, moe.Int64Tensor(name, []int64{int64(len(v))}, v))
		return name
	}
	scalarI := func(v int64) string {
		name := fmt.Sprintf("c%d", len(inits))
		inits = append(inits, moe.Int64Tensor(name, nil, []int64{v}))
		return name
	}
	floats := func(dims []int64, v []float32) string {
		name := fmt.Sprintf("w%d", len(inits))
		inits = append(inits, moe.Float32Tensor(name, dims, v))
		return name
	}
	zeroF := graph.TensorAttr("value", moe.Float32Tensor("", []int64{1}, []float32{0}))
	spelled := func(g, u string) string { // o.act written between the projections
		b := &moe.Builder{Prefix: "act"}
		out := o.act.Write(b, g, u, int64(I))
		nodes = append(nodes, b.Nodes...)
		return out
	}

	xin := "x"
	if o.half {
		xin = one("Cast", []string{"x"}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT)))
	}
	x2 := one("Reshape", []string{xin, ints(-1, int64(H))})
	logits := one("MatMul", []string{x2, floats([]int64{int64(H), int64(E)}, rnd(H*E, 1))})
	var vals, idx, w string
	if o.actThenTopK {
		p := one("Softmax", []string{logits}, graph.IntAttr("axis", -1))
		tk := add("TopK", []string{p, ints(int64(K))}, 2, graph.IntAttr("axis", -1))
		vals, idx = tk[0], tk[1]
		w = vals
	} else {
		tk := add("TopK", []string{logits, ints(int64(K))}, 2, graph.IntAttr("axis", -1))
		vals, idx = tk[0], tk[1]
		w = one("Softmax", []string{vals}, graph.IntAttr("axis", 1))
	}
	flat := one("Reshape", []string{idx, ints(-1)})
	st := add("TopK", []string{flat, one("Shape", []string{flat})}, 2, graph.IntAttr("axis", 0), graph.IntAttr("largest", 0))
	sortVals := st[0]
	// per-expert counts
	var counts string
	if o.equalCounts {
		fl := one("Unsqueeze", []string{one("Reshape", []string{idx, ints(-1)}), ints(-1)})
		if o.countSorted { // count the sort's values: the same ids, in sorted order
			fl = one("Unsqueeze", []string{sortVals, ints(-1)})
		}
		eq := one("Equal", []string{fl, one("Range", []string{scalarI(0), scalarI(int64(E)), scalarI(1)})})
		counts = one("ReduceSum", []string{one("Cast", []string{eq}, graph.IntAttr("to", int64(pb.TensorProto_INT64))), ints(0)}, graph.IntAttr("keepdims", 0))
	} else if o.oneHot {
		oh := one("OneHot", []string{idx, scalarI(int64(E)), floats([]int64{2}, []float32{0, 1})}, graph.IntAttr("axis", -1))
		if o.oneHotTwice { // summed over the tokens, then over the slots
			oh = one("ReduceSum", []string{oh, ints(0)}, graph.IntAttr("keepdims", 0))
			counts = one("Cast", []string{one("ReduceSum", []string{oh, ints(-2)}, graph.IntAttr("keepdims", 0))}, graph.IntAttr("to", int64(pb.TensorProto_INT64)))
		} else {
			counts = one("Cast", []string{one("ReduceSum", []string{oh, ints(0, 1)}, graph.IntAttr("keepdims", 0))}, graph.IntAttr("to", int64(pb.TensorProto_INT64)))
		}
	} else {
		z := one("ConstantOfShape", []string{one("Shape", []string{logits})}, zeroF)
		fill := float32(1)
		if o.breakOnes {
			fill = 2
		}
		ones := one("Expand", []string{floats(nil, []float32{fill}), one("Shape", []string{idx})})
		mh := one("ScatterElements", []string{z, idx, ones}, graph.IntAttr("axis", 1))
		counts = one("ReduceSum", []string{one("Cast", []string{mh}, graph.IntAttr("to", int64(pb.TensorProto_INT64))), ints(0)}, graph.IntAttr("keepdims", 0))
	}
	if o.unbindCounts {
		parts := add("Split", []string{counts}, E, graph.IntAttr("axis", 0), graph.IntAttr("num_outputs", int64(E)))
		counts = one("Concat", parts, graph.IntAttr("axis", 0))
	}
	if o.listCounts {
		parts := make([]string, E)
		for e := range E {
			parts[e] = one("Unsqueeze", []string{one("Gather", []string{counts, scalarI(int64(e))}, graph.IntAttr("axis", 0)), ints(0)})
		}
		counts = one("Concat", parts, graph.IntAttr("axis", 0))
	}
	split := counts
	if o.breakSplit == "const" {
		per := int64(o.B * o.S * K / E)
		sz := make([]int64, E)
		for e := range sz {
			sz[e] = per
		}
		sz[E-1] += int64(o.B*o.S*K) - per*int64(E)
		split = ints(sz...)
	}
	perm := st[1]
	div := int64(K)
	if o.breakDiv != 0 {
		div = int64(o.breakDiv)
	}
	tok := perm
	switch {
	case o.tokGather == "const":
		n := o.B * o.S * K
		tp := make([]int64, n)
		for i := range tp {
			tp[i] = int64(i / K)
			if o.breakTok {
				tp[i] = int64((i + 1) % n / K)
			}
		}
		tok = one("Gather", []string{ints(tp...), perm}, graph.IntAttr("axis", 0))
	case o.tokGather == "range":
		T := one("Gather", []string{one("Shape", []string{x2}), scalarI(0)}, graph.IntAttr("axis", 0))
		ar := one("Unsqueeze", []string{one("Range", []string{scalarI(0), T, scalarI(1)}), ints(1)})
		shp := one("Concat", []string{one("Unsqueeze", []string{T, ints(0)}), ints(int64(K))}, graph.IntAttr("axis", 0))
		tp := one("Reshape", []string{one("Expand", []string{ar, shp}), ints(-1)})
		tok = one("Gather", []string{tp, perm}, graph.IntAttr("axis", 0))
	case o.floatMulDiv:
		pf := one("Cast", []string{perm}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT)))
		q := one("Floor", []string{one("Mul", []string{pf, floats(nil, []float32{float32(1 / float64(div))})})})
		tok = one("Cast", []string{q}, graph.IntAttr("to", int64(pb.TensorProto_INT64)))
	case !o.noDiv:
		tok = one("Div", []string{perm, scalarI(div)})
	}
	if o.rawGates {
		w = vals
	}
	bg := one("Gather", []string{one("Reshape", []string{w, ints(-1)}), perm}, graph.IntAttr("axis", 0))
	xs := one("Gather", []string{x2, tok}, graph.IntAttr("axis", 0))
	groups := func(v string) []string {
		if o.sliceGroups == "" {
			return add("Split", []string{v, split}, E, graph.IntAttr("axis", 0))
		}
		var offs string
		bound := func(b int) string { // rows of experts 0..b-1
			switch {
			case b == 0:
				return ints(0)
			case b == E:
				return ints(1<<62 + 1)
			case o.sliceGroups == "traced": // the trace input's group sizes, baked in
				return ints(int64(b * o.B * o.S * K / E))
			case o.sliceGroups == "exclusive" || o.sliceGroups == "sub":
				return one("Slice", []string{offs, ints(int64(b)), ints(int64(b + 1))})
			case o.sliceGroups == "padded":
				return one("Unsqueeze", []string{one("Gather", []string{offs, scalarI(int64(b))}, graph.IntAttr("axis", 0)), ints(0)})
			}
			return one("Slice", []string{offs, ints(int64(b - 1)), ints(int64(b))})
		}
		switch o.sliceGroups {
		case "exclusive":
			offs = one("CumSum", []string{split, scalarI(0)}, graph.IntAttr("exclusive", 1))
		case "padded":
			offs = one("Concat", []string{ints(0), one("CumSum", []string{split, scalarI(0)})}, graph.IntAttr("axis", 0))
		case "sub": // exclusive sums as inclusive sums less the counts
			offs = one("Sub", []string{one("CumSum", []string{split, scalarI(0)}), split})
		default:
			offs = one("CumSum", []string{split, scalarI(0)})
		}
		out := make([]string, E)
		for e := range E {
			end := e + 1
			if o.breakSlice && e == 0 {
				end = 2 // the first two experts' rows
			}
			out[e] = one("Slice", []string{v, bound(e), bound(end), ints(0)})
		}
		return out
	}
	segs := groups(xs)
	tr := graph.IntsAttr("perm", 1, 0)
	perExpert := func(wName string, e int, in string) string {
		we := one("Gather", []string{wName, scalarI(int64(e))}, graph.IntAttr("axis", 0))
		if o.gemmBias {
			var dims []int64
			for _, t := range inits {
				if t.GetName() == wName {
					dims = t.GetDims()
				}
			}
			bias := floats([]int64{dims[0], dims[1]}, rnd(int(dims[0]*dims[1]), 0.5))
			be := one("Gather", []string{bias, scalarI(int64(e))}, graph.IntAttr("axis", 0))
			return one("Gemm", []string{in, we, be}, graph.IntAttr("transB", 1))
		}
		return one("MatMul", []string{in, one("Transpose", []string{we}, tr)})
	}
	silu := func(g string) string { return one("Mul", []string{g, one("Sigmoid", []string{g})}) }
	wOut := floats([]int64{int64(E), int64(H), int64(I)}, rnd(E*H*I, 0.5))
	var outs []string
	if o.gelu {
		w1 := floats([]int64{int64(E), int64(I), int64(H)}, rnd(E*I*H, 0.5))
		var hs []string
		for e := range E {
			hs = append(hs, perExpert(w1, e, segs[e]))
		}
		h := one("Concat", hs, graph.IntAttr("axis", 0))
		var a string
		if o.act != nil {
			a = spelled(h, h)
		} else {
			erf := one("Erf", []string{one("Mul", []string{h, floats(nil, []float32{0.70710678})})})
			a = one("Mul", []string{one("Mul", []string{h, floats(nil, []float32{0.5})}), one("Add", []string{erf, floats(nil, []float32{1})})})
		}
		as := groups(a)
		for e := range E {
			outs = append(outs, perExpert(wOut, e, as[e]))
		}
	} else if o.separate {
		wG := floats([]int64{int64(E), int64(I), int64(H)}, rnd(E*I*H, 0.5))
		wU := floats([]int64{int64(E), int64(I), int64(H)}, rnd(E*I*H, 0.5))
		for e := range E {
			a := one("Mul", []string{silu(perExpert(wG, e, segs[e])), perExpert(wU, e, segs[e])})
			outs = append(outs, perExpert(wOut, e, a))
		}
	} else {
		wIn := floats([]int64{int64(E), int64(2 * I), int64(H)}, rnd(E*2*I*H, 0.5))
		var hs []string
		for e := range E {
			hs = append(hs, perExpert(wIn, e, segs[e]))
		}
		h := one("Concat", hs, graph.IntAttr("axis", 0))
		if o.perPair { // back to pair order and sorted again, as a mixture of attention does
			zp := one("ConstantOfShape", []string{one("Shape", []string{h})}, zeroF)
			pairs := one("ScatterND", []string{zp, one("Unsqueeze", []string{perm, ints(1)}), h})
			h = one("Gather", []string{pairs, perm}, graph.IntAttr("axis", 0))
		}
		ch := add("Split", []string{h, ints(int64(I), int64(I))}, 2, graph.IntAttr("axis", -1))
		g, u := ch[0], ch[1]
		if o.gateSecond {
			g, u = u, g
		}
		if o.halveUp {
			u = one("Mul", []string{u, floats(nil, []float32{0.5})})
		}
		a := ""
		if o.act != nil {
			a = spelled(g, u)
		} else {
			a = one("Mul", []string{silu(g), u})
		}
		as := groups(a)
		for e := range E {
			outs = append(outs, perExpert(wOut, e, as[e]))
		}
	}
	var ow, out string
	if o.gatesPerGroup {
		gs := groups(one("Unsqueeze", []string{bg, ints(1)}))
		for e := range outs {
			outs[e] = one("Mul", []string{gs[e], outs[e]})
		}
		ow = one("Concat", outs, graph.IntAttr("axis", 0))
	} else {
		out = one("Concat", outs, graph.IntAttr("axis", 0))
		ow = one("Mul", []string{out, one("Unsqueeze", []string{bg, ints(1)})})
	}
	zTH := one("ConstantOfShape", []string{one("Shape", []string{x2})}, zeroF)
	back := tok
	switch o.breakScatter {
	case "perm":
		back = perm
	case "identity": // the pairs' tokens in unsorted order
		n := one("Squeeze", []string{one("Shape", []string{flat}), ints(0)})
		back = one("Div", []string{one("Range", []string{scalarI(0), n, scalarI(1)}), scalarI(int64(K))})
	}
	var sc string
	if o.unsort != "" {
		rows := out
		if o.unsortWeighted {
			rows = ow
		}
		var pairs string
		if o.unsort == "gather" {
			inv := add("TopK", []string{perm, one("Shape", []string{perm})}, 2, graph.IntAttr("axis", 0), graph.IntAttr("largest", 0))[1]
			pairs = one("Gather", []string{rows, inv}, graph.IntAttr("axis", 0))
		} else {
			zN := one("ConstantOfShape", []string{one("Shape", []string{rows})}, zeroF)
			pairs = one("ScatterND", []string{zN, one("Unsqueeze", []string{perm, ints(1)}), rows})
		}
		p3 := one("Reshape", []string{pairs, ints(-1, int64(K), int64(H))})
		if !o.unsortWeighted {
			p3 = one("Mul", []string{p3, one("Unsqueeze", []string{w, ints(-1)})})
		}
		sc = one("ReduceSum", []string{p3, ints(1)}, graph.IntAttr("keepdims", 0))
	} else if o.scatterElements {
		ix := one("Expand", []string{one("Unsqueeze", []string{back, ints(1)}), one("Shape", []string{ow})})
		sc = one("ScatterElements", []string{zTH, ix, ow}, graph.IntAttr("axis", 0), graph.StringAttr("reduction", "add"))
	} else {
		sc = one("ScatterND", []string{zTH, one("Unsqueeze", []string{back, ints(1)}), ow}, graph.StringAttr("reduction", "add"))
	}
	if o.shared || o.sharedFused {
		Is := int64(2 * I)
		mm := func(in string, r, c int64) string {
			return one("MatMul", []string{in, floats([]int64{r, c}, rnd(int(r*c), 0.5))})
		}
		var g, u string
		if o.sharedFused { // one [H, 2·Is] projection, chunked: gate first
			gu := add("Split", []string{mm(x2, int64(H), 2*Is), ints(Is, Is)}, 2, graph.IntAttr("axis", -1))
			g, u = gu[0], gu[1]
		} else {
			g, u = mm(x2, int64(H), Is), mm(x2, int64(H), Is)
		}
		a := one("Mul", []string{silu(g), u})
		sc = one("Add", []string{sc, mm(a, Is, int64(H))})
	}
	y := one("Reshape", []string{sc, one("Shape", []string{"x"})})
	if o.bias {
		y = one("Add", []string{y, floats([]int64{int64(H)}, rnd(H, 1))})
	}
	io := pb.TensorProto_FLOAT
	if o.half {
		io = pb.TensorProto_FLOAT16
		y = one("Cast", []string{y}, graph.IntAttr("to", int64(io)))
	}
	nodes = append(nodes, graph.NewNode("Identity", "", "out", []string{y}, []string{"y"}))
	vi := func(n string, dims ...int64) *pb.ValueInfoProto {
		var ds []*pb.TensorShapeProto_Dimension
		for _, d := range dims {
			ds = append(ds, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: d}})
		}
		return &pb.ValueInfoProto{Name: proto.String(n), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
			ElemType: proto.Int32(int32(io)), Shape: &pb.TensorShapeProto{Dim: ds}}}}}
	}
	dims := []int64{int64(o.B), int64(o.S), int64(H)}
	opsets := []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}}
	if o.act != nil && o.act.Opset > 18 {
		opsets[0].Version = proto.Int64(o.act.Opset)
	}
	if o.act != nil && o.act.MS {
		opsets = append(opsets, &pb.OperatorSetIdProto{Domain: proto.String("com.microsoft"), Version: proto.Int64(1)})
	}
	mp := &pb.ModelProto{IrVersion: proto.Int64(10), OpsetImport: opsets,
		Graph: &pb.GraphProto{Name: proto.String("sorted"), Node: nodes, Initializer: inits,
			Input: []*pb.ValueInfoProto{vi("x", dims...)}, Output: []*pb.ValueInfoProto{vi("y", dims...)}}}
	return &graph.Model{Proto: mp, Dir: "."}
}

// runBoth runs m on feeds through the fused node's reference kernel and
// through its function body, and compares each with want.
func runBoth(t *testing.T, m *graph.Model, feeds map[string]*eval.Tensor, want *eval.Tensor) {
	t.Helper()
	for _, body := range []bool{false, true} {
		out, err := eval.Run(context.Background(), m, feeds, eval.Options{PreferFunctions: body})
		if err != nil {
			t.Fatal(err)
		}
		d, err := eval.Compare(out[m.Proto.Graph.Output[0].GetName()], want, 1e-4, 1e-5)
		if err != nil {
			t.Fatal(err)
		}
		if !d.OK() {
			t.Errorf("function body %v: differs from the original graph: %+v", body, d)
		}
	}
}

// TestSortedSynthetic fuses synthetic sort-based blocks of several shapes
// and checks the fused node, through the reference kernel and the function
// body, against the original graph evaluated op by op.
func TestSortedSynthetic(t *testing.T) {
	base := sortedOpts{E: 4, K: 2, H: 16, I: 8, B: 2, S: 5}
	cases := []struct {
		name    string
		mod     func(o *sortedOpts)
		variant string
	}{
		{"jetmoe", func(o *sortedOpts) { o.bias = true }, "softmax_topk_act_swiglu"},
		{"gate second", func(o *sortedOpts) { o.gateSecond = true }, "softmax_topk_act_swiglu"},
		{"separate gate and up", func(o *sortedOpts) { o.separate = true; o.bias = true }, "softmax_topk_act_swiglu"},
		{"softmax then top-k", func(o *sortedOpts) { o.actThenTopK = true }, "softmax_act_topk_swiglu"},
		{"ScatterElements back", func(o *sortedOpts) { o.scatterElements = true }, "softmax_topk_act_swiglu"},
		{"listed counts", func(o *sortedOpts) { o.listCounts = true }, "softmax_topk_act_swiglu"},
		{"one-hot counts", func(o *sortedOpts) { o.oneHot = true }, "softmax_topk_act_swiglu"},
		{"one-hot counts, two sums", func(o *sortedOpts) { o.oneHot, o.oneHotTwice = true, true }, "softmax_topk_act_swiglu"},
		{"top-1 of 8", func(o *sortedOpts) { o.E, o.K = 8, 1 }, "softmax_topk_act_swiglu"},
		{"top-1, no division", func(o *sortedOpts) { o.E, o.K, o.noDiv = 8, 1, true }, "softmax_topk_act_swiglu"},
		{"groups sliced by running sums", func(o *sortedOpts) { o.sliceGroups = "inclusive" }, "softmax_topk_act_swiglu"},
		{"groups sliced by exclusive sums", func(o *sortedOpts) { o.sliceGroups = "exclusive"; o.separate = true; o.gatesPerGroup = true }, "softmax_topk_act_swiglu"},
		{"groups sliced by sums less the counts", func(o *sortedOpts) { o.sliceGroups = "sub" }, "softmax_topk_act_swiglu"},
		{"groups sliced by padded sums", func(o *sortedOpts) { o.sliceGroups = "padded"; o.gelu = true }, "softmax_topk_act_gelu"},
		{"Gemm biases, fused gate_up", func(o *sortedOpts) { o.gemmBias = true; o.gateSecond = true }, "softmax_topk_act_swiglu_ebias"},
		{"Gemm biases, separate gate and up", func(o *sortedOpts) { o.gemmBias = true; o.separate = true }, "softmax_topk_act_swiglu_ebias"},
		{"float16 input and output", func(o *sortedOpts) { o.half = true }, "softmax_topk_act_swiglu_f16io"},
		{"shared expert", func(o *sortedOpts) { o.shared = true; o.bias = true }, "softmax_topk_act_swiglu_shared"},
		{"shared expert, fused gate_up", func(o *sortedOpts) { o.sharedFused = true }, "softmax_topk_act_swiglu_shared"},
		{"unbound counts", func(o *sortedOpts) { o.unbindCounts = true }, "softmax_topk_act_swiglu"},
		{"counts by comparison", func(o *sortedOpts) { o.equalCounts = true }, "softmax_topk_act_swiglu"},
		{"unsorted by ScatterND, weighted per pair", func(o *sortedOpts) { o.unsort = "scatter"; o.bias = true }, "softmax_topk_act_swiglu"},
		{"unsorted by the inverse permutation", func(o *sortedOpts) { o.unsort = "gather"; o.E, o.K = 6, 3 }, "softmax_topk_act_swiglu"},
		{"weighted, then unsorted", func(o *sortedOpts) { o.unsort = "scatter"; o.unsortWeighted = true }, "softmax_topk_act_swiglu"},
		{"tokens of the pairs, constant", func(o *sortedOpts) { o.tokGather = "const"; o.unsort = "gather"; o.unsortWeighted = true }, "softmax_topk_act_swiglu"},
		{"tokens of the pairs, arange", func(o *sortedOpts) { o.tokGather = "range"; o.bias = true }, "softmax_topk_act_swiglu"},
		{"counts of the sorted ids", func(o *sortedOpts) { o.equalCounts, o.countSorted = true, true }, "softmax_topk_act_swiglu"},
		{"GELU MLP", func(o *sortedOpts) { o.gelu = true }, "softmax_topk_act_gelu"},
		{"weights per group", func(o *sortedOpts) { o.gatesPerGroup = true; o.separate = true }, "softmax_topk_act_swiglu"},
		{"top-3 of 6, wide", func(o *sortedOpts) { o.E, o.K, o.H, o.I = 6, 3, 24, 12 }, "softmax_topk_act_swiglu"},
		{"tokens by a float product with 1/k", func(o *sortedOpts) { o.floatMulDiv = true }, "softmax_topk_act_swiglu"},
		{"tokens by a float product with 1/3", func(o *sortedOpts) { o.floatMulDiv = true; o.E, o.K = 6, 3 }, "softmax_topk_act_swiglu"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.mod(&o)
			fb := fuseSorted(t, o, int64(i+1))
			if fb.Variant != tc.variant {
				t.Fatalf("fused as %s, want %s", fb.Variant, tc.variant)
			}
		})
	}
}

// fuseSorted builds sortedModel(o, seed), rewrites it with the numerical
// check, expects one sort-based block of o's sizes with no dispatch op
// left, and compares the fused model (reference kernel and function body)
// with the original on random inputs.
func fuseSorted(t *testing.T, o sortedOpts, seed int64) Fused {
	t.Helper()
	m := sortedModel(o, seed)
	orig := sortedModel(o, seed)
	xs := make([]float32, o.B*o.S*o.H)
	r := rand.New(rand.NewSource(99 + seed))
	for j := range xs {
		xs[j] = r.Float32()*2 - 1
	}
	x := eval.NewFloat32([]int{o.B, o.S, o.H}, xs)
	if o.half {
		x = eval.NewFloatAs(pb.TensorProto_FLOAT16, []int{o.B, o.S, o.H}, xs)
	}
	feeds := map[string]*eval.Tensor{"x": x}
	ref, err := eval.Run(context.Background(), orig, feeds, eval.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fb := fuseOnly(t, m)
	sp := fb.Block.Spec
	if fb.Block.Kind != KindSorted || sp.NumExperts != o.E || sp.TopK != o.K || sp.Hidden != o.H || sp.Inter != o.I {
		t.Fatalf("fused kind %s E=%d k=%d H=%d I=%d, want %s E=%d k=%d H=%d I=%d", fb.Block.Kind, sp.NumExperts, sp.TopK, sp.Hidden, sp.Inter,
			KindSorted, o.E, o.K, o.H, o.I)
	}
	for _, n := range m.Proto.Graph.Node {
		if n.GetOpType() == "TopK" || n.GetOpType() == "ScatterND" || n.GetOpType() == "Split" {
			t.Fatalf("%s %q left after fusion", n.GetOpType(), n.GetName())
		}
	}
	runBoth(t, m, feeds, ref["y"])
	return fb
}

// fuseOnly rewrites m with the numerical check and expects one fused block.
func fuseOnly(t *testing.T, m *graph.Model) Fused {
	t.Helper()
	rep, err := Rewrite(m, Options{Check: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Fused) != 1 {
		t.Fatalf("fused %d blocks, want 1", len(rep.Fused))
	}
	return rep.Fused[0]
}

// TestSortedActivations: a sort-based block fuses with every activation of
// the table in each of its spellings (models.ActivationCases; gated ones
// between the halves of the fused gate_up, the others in a two-layer MLP),
// identified as that row with its parameters, and the fused model
// reproduces the original.
func TestSortedActivations(t *testing.T) {
	for ci, cs := range models.ActivationCases {
		def := moe.LookupActivation(cs.Act)
		for si := range cs.Spellings {
			sp := cs.Spellings[si]
			t.Run(cs.Act+"/"+sp.Name, func(t *testing.T) {
				o := sortedOpts{E: 4, K: 2, H: 16, I: 8, B: 2, S: 5, act: &sp, gelu: !def.Gated}
				fb := fuseSorted(t, o, int64(10*ci+si+1))
				checkActSpec(t, &fb.Block.Spec, cs)
			})
		}
	}
}

// TestSortedRefused breaks one link of the dispatch and expects the block
// refused: by the matcher, or else by the numerical check.
func TestSortedRefused(t *testing.T) {
	base := sortedOpts{E: 4, K: 2, H: 16, I: 8, B: 2, S: 5}
	cases := []struct {
		name, reason string
		mod          func(o *sortedOpts)
	}{
		{"scatter back by the permutation", "does not reshape the pairs to [tokens, 2, 16]", func(o *sortedOpts) { o.breakScatter = "perm" }},
		{"scatter back by the permutation (ScatterElements)", "unexpected Expand", func(o *sortedOpts) { o.breakScatter = "perm"; o.scatterElements = true }},
		{"scatter back in unsorted order", "rows other than the sorted pairs' tokens", func(o *sortedOpts) { o.breakScatter = "identity" }},
		{"weights without the softmax", "no router activation", func(o *sortedOpts) { o.rawGates = true }},
		{"a group sliced over two experts", "other than from one expert group's start to its end", func(o *sortedOpts) { o.sliceGroups = "inclusive"; o.breakSlice = true }},
		{"counts of twos", "not a one-hot of the top-k indices", func(o *sortedOpts) { o.breakOnes = true }},
		{"pairs given the next pair's token", "does not give the pairs' tokens", func(o *sortedOpts) { o.tokGather, o.breakTok = "const", true }},
		{"up half scaled", "expert activation is not a known function (made of Mul, Sigmoid)", func(o *sortedOpts) { o.halveUp = true }},
		{"groups sliced at constant rows", "slices the sorted rows at constant bounds", func(o *sortedOpts) { o.sliceGroups = "traced" }},
		{"per-pair outputs", "before the experts' down projections", func(o *sortedOpts) { o.perPair = true }},
		{"split by constant sizes", "a trace baked in the group sizes", func(o *sortedOpts) { o.breakSplit = "const" }},
		{"tokens by the wrong division", "not by top_k", func(o *sortedOpts) { o.breakDiv = 3 }},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.mod(&o)
			m := sortedModel(o, int64(i+1))
			n := len(m.Proto.Graph.Node)
			rep, err := Rewrite(m, Options{Check: true})
			if err == nil || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("want a refusal containing %q, got %v", tc.reason, err)
			}
			if rep == nil || len(rep.Fused) != 0 || len(m.Proto.Graph.Node) != n {
				t.Fatal("a refused rewrite edited the model")
			}
			// one block, one report: the sort is not a candidate of its own
			if got := len(rep.NearMiss) + len(rep.Refused); got != 1 {
				t.Fatalf("%d reports, want 1: %+v %+v", got, rep.NearMiss, rep.Refused)
			}
		})
	}
}

// TestSortedSyntheticInvariance rewrites synthetic sort-based blocks of
// every dispatch form under random valid node orders and renamings: each
// gives the same fused node (see fusedSummary) as the builder's order.
func TestSortedSyntheticInvariance(t *testing.T) {
	base := sortedOpts{E: 4, K: 2, H: 16, I: 8, B: 2, S: 5}
	variants := []func(o *sortedOpts){
		func(o *sortedOpts) { o.bias = true },
		func(o *sortedOpts) { o.separate, o.gatesPerGroup, o.sliceGroups = true, true, "exclusive" },
		func(o *sortedOpts) { o.unsort, o.tokGather = "gather", "range" },
		func(o *sortedOpts) { o.unsort, o.unsortWeighted, o.listCounts = "scatter", true, true },
		func(o *sortedOpts) { o.oneHot, o.oneHotTwice, o.scatterElements, o.gemmBias = true, true, true, true },
	}
	for i, mod := range variants {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			o := base
			mod(&o)
			m := sortedModel(o, int64(i+1))
			rep, err := Rewrite(m, Options{Check: true})
			if err != nil || len(rep.Fused) != 1 {
				t.Fatalf("builder order: %v, %+v", err, rep)
			}
			want := fusedSummary(t, m, rep, err, nil)
			rng := rand2.New(rand2.NewPCG(uint64(i), 11))
			for trial := range 5 {
				m := sortedModel(o, int64(i+1))
				shuffleOrder(m.Proto.Graph, rng)
				back := renameAll(m.Proto.Graph, rng)
				rep, err := Rewrite(m, Options{Check: true})
				if got := fusedSummary(t, m, rep, err, back); got != want {
					t.Fatalf("trial %d: %v\n got %.400s\nwant %.400s", trial, err, got, want)
				}
			}
		})
	}
}
