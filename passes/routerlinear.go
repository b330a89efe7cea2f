package passes

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// The router linear is found by structure, whatever lies between it and the
// selection: the TopK's scores are computed, through ops that are no
// matmul, from exactly one MatMul or Gemm with a constant weight (the
// router linear), constants and nothing else. What those ops compute is
// then decided by evaluation (routereval.go), not by their spelling.

// routerByStructure finds the router linear behind the selection tk by
// structure (see above), for routers the op walk of router does not read.
// The returned routerInfo carries the linear, its input and weight, with
// the affine steps that directly follow it (a bias, a constant temperature,
// a selection of its output columns) folded into the weight and bias. Its
// activation, order, correction bias and groups are left to evaluation.
func (c *ctx) routerByStructure(tk *pb.NodeProto) (*routerInfo, error) {
	// A Shape or Size reads its input's shape, not its values: scores
	// made from a router's shape alone do not depend on the hidden state.
	cone := c.backwardTo(tk.Input[0], func(n *pb.NodeProto) bool {
		return isLinear(n) || n.GetOpType() == "Shape" || n.GetOpType() == "Size"
	})
	var lins, computed []*pb.NodeProto
	for n := range cone {
		if !isLinear(n) {
			continue
		}
		if c.linearWeight(n) != nil {
			lins = append(lins, n)
		} else {
			computed = append(computed, n)
		}
	}
	c.sortByOrder(lins)
	c.sortByOrder(computed)
	switch {
	case len(lins) == 0 && len(computed) > 0:
		return nil, rejectf("the router's linear layer %q has no constant weight", graph.NodeLabel(computed[0]))
	case len(lins) == 0:
		return nil, rejectf("routing does not depend on the hidden state: the TopK ranks scores computed from %s, with no linear layer of the hidden state, which ai.mok::MoE cannot express (its router is a linear layer of the block input)", c.scoreSources(cone))
	case len(lins) > 1:
		names := make([]string, len(lins))
		for i, n := range lins {
			names[i] = fmt.Sprintf("%q", graph.NodeLabel(n))
		}
		return nil, rejectf("the TopK's scores combine %d linear layers (%s); ai.mok::MoE routes by one", len(lins), strings.Join(names, ", "))
	}
	lin := lins[0]
	if c.isConst(lin.Input[0]) {
		return nil, rejectf("routing does not depend on the hidden state: the router linear %q reads a constant, which ai.mok::MoE cannot express (its router is a linear layer of the block input)", graph.NodeLabel(lin))
	}
	ri := &routerInfo{linear: lin, x: lin.Input[0], nGroup: 1, topkGroup: 1, generic: true}
	lw := c.linearWeight(lin)
	ri.w, ri.wInOut = lw.t, lw.inOut
	f := &routerFold{scale: 1, logits: lin.Output[0]}
	if lin.GetOpType() == "Gemm" {
		f.scale = graph.AttrFloat(lin, "alpha", 1)
		if len(lin.Input) > 2 && lin.Input[2] != "" {
			b := c.constTensor(lin.Input[2])
			if b == nil || !vectorLike(b) {
				return nil, rejectf("router Gemm %q has a bias that is not a constant vector", graph.NodeLabel(lin))
			}
			if err := f.addBias(c, b, graph.AttrFloat(lin, "beta", 1)); err != nil {
				return nil, err
			}
		}
	}
	if err := c.foldRouter(ri, f, cone); err != nil {
		return nil, err
	}
	return ri, nil
}

// linearW is a linear layer's constant weight and its layout.
type linearW struct {
	t     *pb.TensorProto
	inOut bool // stored [in, out]
}

// linearWeight returns the constant 2-D weight of a MatMul or Gemm that
// could be a router linear (not transposing its input), or nil.
func (c *ctx) linearWeight(n *pb.NodeProto) *linearW {
	switch n.GetOpType() {
	case "Gemm":
		if w := c.constTensor(n.Input[1]); w != nil && graph.AttrInt(n, "transA", 0) == 0 && len(w.GetDims()) == 2 {
			return &linearW{t: w, inOut: graph.AttrInt(n, "transB", 0) == 0}
		}
	case "MatMul":
		if w := c.matmulWeight(n.Input[1]); w != nil && w.sel == selNone && len(w.t.GetDims()) == 2 {
			return &linearW{t: w.t, inOut: !w.swapped}
		}
	}
	return nil
}

// scoreSources names what a router cone without a linear layer reads: the
// graph inputs among its nodes' inputs, or "constants only".
func (c *ctx) scoreSources(cone map[*pb.NodeProto]bool) string {
	var ins []string
	for n := range cone {
		for _, in := range n.Input {
			if in != "" && c.g.Producer(in) == nil && c.g.Initializer(in) == nil && !slices.Contains(ins, in) {
				ins = append(ins, in)
			}
		}
	}
	if len(ins) == 0 {
		return "constants only"
	}
	slices.Sort(ins)
	return fmt.Sprintf("the graph input(s) %q", ins)
}

// routerFold is the affine map from the router linear's product x·W to the
// logits the routing reads: logits[j] = scale·vscale[j]·(x·W[cols[j]]) +
// bias[j]. cols nil is every column in order; vscale nil is all ones; bias
// nil is zero.
type routerFold struct {
	scale  float32
	cols   []int
	vscale []float32 // a per-expert scale (logits · v, v of shape [E])
	bias   []float32
	width  int    // the linear's output width
	logits string // the value holding the folded logits
}

// addBias adds beta times the constant vector b to the fold's bias.
func (f *routerFold) addBias(c *ctx, b *pb.TensorProto, beta float32) error {
	v := c.floatsOf(b, mustBytes(c, b))
	if v == nil {
		return rejectf("router bias %q cannot be read", b.GetName())
	}
	n := f.curWidth()
	if len(v) == 1 && n > 0 {
		v = slices.Repeat(v, n)
	}
	if f.bias == nil {
		f.bias = make([]float32, len(v))
	}
	if len(v) != len(f.bias) || n > 0 && len(v) != n {
		return rejectf("router bias %q has %d values for %d router outputs", b.GetName(), len(v), max(n, len(f.bias)))
	}
	for i := range v {
		f.bias[i] += beta * v[i]
	}
	return nil
}

// curWidth is the number of logits after the selections folded so far
// (0 when not known yet).
func (f *routerFold) curWidth() int {
	if f.cols != nil {
		return len(f.cols)
	}
	return f.width
}

// mustBytes returns t's bytes, or nil when they cannot be read.
func mustBytes(c *ctx, t *pb.TensorProto) []byte {
	b, err := c.m.TensorBytes(t)
	if err != nil {
		return nil
	}
	return b
}

// foldRouter walks on from the router linear's output through the affine
// steps a router may take before its activation — an Add or Sub of a
// constant vector (a bias), a Mul or Div by a constant scalar (a
// temperature) and a Slice of the last axis (router outputs that are not
// experts) — each the only consumer of the value before it but for
// Shape/Size reads, and folds them into a derived router weight and bias
// (exactly: the same products, up to float32 rounding of the scaled
// weight).
func (c *ctx) foldRouter(ri *routerInfo, f *routerFold, cone map[*pb.NodeProto]bool) error {
	d := ri.w.GetDims()
	f.width = int(d[0])
	if ri.wInOut {
		f.width = int(d[1])
	}
	if f.bias != nil && len(f.bias) != f.width {
		return rejectf("router bias has %d values for %d router outputs", len(f.bias), f.width)
	}
	for steps := 0; steps < 16; steps++ {
		// Other consumers may read the logits' shape (a routing matrix
		// of zeros like them), never their values.
		var cons []*pb.NodeProto
		for _, n := range c.g.Consumers(f.logits) {
			if op := n.GetOpType(); op != "Shape" && op != "Size" {
				cons = append(cons, n)
			}
		}
		if len(cons) != 1 || c.g.IsOutput(f.logits) || !cone[cons[0]] {
			break
		}
		ok, err := c.foldStep(cons[0], f)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		f.logits = cons[0].Output[0]
	}
	return c.applyFold(ri, f)
}

// foldStep folds one affine step n (reading f.logits) into f, or reports
// that n is none.
func (c *ctx) foldStep(n *pb.NodeProto, f *routerFold) (bool, error) {
	other := func() string {
		if n.Input[0] == f.logits {
			return n.Input[1]
		}
		return n.Input[0]
	}
	switch n.GetOpType() {
	case "Add", "Sub":
		b := c.constTensor(other())
		if b == nil || !vectorLike(b) || n.GetOpType() == "Sub" && n.Input[0] != f.logits {
			return false, nil
		}
		beta := float32(1)
		if n.GetOpType() == "Sub" {
			beta = -1
		}
		return true, f.addBias(c, b, beta)
	case "Mul", "Div":
		if n.GetOpType() == "Div" && n.Input[0] != f.logits {
			return false, nil
		}
		a, ok := c.scalarFloat(other())
		if !ok {
			return c.foldVectorScale(n, other(), f), nil
		}
		if a == 0 {
			return false, nil
		}
		if n.GetOpType() == "Div" {
			a = 1 / a
		}
		f.scale *= a
		for i := range f.bias {
			f.bias[i] *= a
		}
		return true, nil
	case "Slice":
		return c.foldSlice(n, f), nil
	}
	return false, nil
}

// foldVectorScale folds a Mul or Div of the logits by a constant vector v
// with one value per router output (a per-expert temperature) into f:
// logits[j]·v[j] is x·(v[j]·W[j]) + v[j]·bias[j]. It reports whether n was
// one (a Div by a vector holding a zero is not).
func (c *ctx) foldVectorScale(n *pb.NodeProto, v string, f *routerFold) bool {
	t := c.constTensor(v)
	w := f.curWidth()
	if t == nil || !vectorLike(t) || w == 0 {
		return false
	}
	if r := c.rankOf(f.logits); r >= 0 && len(t.GetDims()) > r {
		return false // it would broadcast the logits to a higher rank
	}
	step := c.floatsOf(t, mustBytes(c, t))
	if len(step) != w {
		return false
	}
	step = slices.Clone(step)
	for i, x := range step {
		if n.GetOpType() == "Div" {
			if x == 0 {
				return false
			}
			step[i] = 1 / x
		}
	}
	if f.vscale == nil {
		f.vscale = slices.Repeat([]float32{1}, w)
	}
	for i, a := range step {
		f.vscale[i] *= a
		if f.bias != nil {
			f.bias[i] *= a
		}
	}
	return true
}

// foldSlice folds a Slice of the logits' last axis with constant bounds
// into f's column selection, or reports that n is none.
func (c *ctx) foldSlice(n *pb.NodeProto, f *routerFold) bool {
	if n.Input[0] != f.logits || len(n.Input) < 3 {
		return false
	}
	starts, ends := c.constInts(n.Input[1]), c.constInts(n.Input[2])
	axes, steps := []int64{-1}, []int64{1}
	if len(n.Input) > 3 && n.Input[3] != "" {
		axes = c.constInts(n.Input[3])
	}
	if len(n.Input) > 4 && n.Input[4] != "" {
		steps = c.constInts(n.Input[4])
	}
	r := c.rankOf(f.logits)
	if r < 0 {
		r = c.rankInfer(f.logits)
	}
	if len(starts) != 1 || len(ends) != 1 || len(axes) != 1 || len(steps) != 1 || steps[0] == 0 {
		return false
	}
	if ax := axes[0]; ax != -1 && (r < 1 || ax != int64(r-1)) {
		return false
	}
	w := int64(f.curWidth())
	clampIdx := func(v, lo, hi int64) int64 {
		if v < 0 {
			v += w
		}
		return min(max(v, lo), hi)
	}
	var sel []int
	if st := steps[0]; st > 0 {
		for i := clampIdx(starts[0], 0, w); i < clampIdx(ends[0], 0, w); i += st {
			sel = append(sel, int(i))
		}
	} else {
		for i := clampIdx(starts[0], 0, w-1); i > clampIdx(ends[0], -1, w-1); i += st {
			sel = append(sel, int(i))
		}
	}
	if len(sel) == 0 {
		return false
	}
	cols := make([]int, len(sel))
	for i, j := range sel {
		cols[i] = j
		if f.cols != nil {
			cols[i] = f.cols[j]
		}
	}
	f.bias, f.vscale = pickCols(f.bias, sel), pickCols(f.vscale, sel)
	f.cols = cols
	return true
}

// pickCols returns v's values at sel (nil for nil).
func pickCols(v []float32, sel []int) []float32 {
	if v == nil {
		return nil
	}
	out := make([]float32, len(sel))
	for i, j := range sel {
		out[i] = v[j]
	}
	return out
}

// applyFold writes the fold into ri: the router weight (a derived [E, H]
// tensor when a temperature or a column selection was folded, else the
// linear's own) and bias, and the logits value the routing reads.
func (c *ctx) applyFold(ri *routerInfo, f *routerFold) error {
	ri.logits = f.logits
	identity := f.scale == 1 && f.vscale == nil && (f.cols == nil || len(f.cols) == f.width && slices.IsSorted(f.cols))
	if !identity {
		w, err := c.foldedWeight(ri, f)
		if err != nil {
			return err
		}
		ri.w, ri.wInOut = w, false
	}
	if f.bias != nil {
		ri.bias = floatTensor(ri.w.GetName()+".folded_bias", []int64{int64(len(f.bias))}, f.bias)
	}
	return nil
}

// foldedWeight is the router weight with f's temperatures (one scalar, one
// per expert) and column selection applied: [len(cols), H], stored out-in.
func (c *ctx) foldedWeight(ri *routerInfo, f *routerFold) (*pb.TensorProto, error) {
	all, err := floats(c.m, ri.w, map[*pb.TensorProto][]float32{})
	if err != nil {
		return nil, rejectf("router weight %q: %v", ri.w.GetName(), err)
	}
	E := f.width
	H := len(all) / max(E, 1)
	cols := f.cols
	if cols == nil {
		cols = make([]int, E)
		for i := range cols {
			cols[i] = i
		}
	}
	out := make([]float32, len(cols)*H)
	for i, e := range cols {
		for h := 0; h < H; h++ {
			v := all[e*H+h]
			if ri.wInOut {
				v = all[h*E+e]
			}
			out[i*H+h] = f.scale * v
			if f.vscale != nil {
				out[i*H+h] *= f.vscale[i]
			}
		}
	}
	if (f.scale != 1 || f.vscale != nil) && !finite(out) {
		return nil, rejectf("router weight %q scaled by %g (per expert %v) overflows", ri.w.GetName(), f.scale, f.vscale)
	}
	return floatTensor(ri.w.GetName()+".folded", []int64{int64(len(cols)), int64(H)}, out), nil
}

// finite reports whether every value of v is finite.
func finite(v []float32) bool {
	for _, x := range v {
		if math.IsInf(float64(x), 0) || math.IsNaN(float64(x)) {
			return false
		}
	}
	return true
}

// floatTensor makes a float32 tensor holding v.
func floatTensor(name string, dims []int64, v []float32) *pb.TensorProto {
	raw := make([]byte, 4*len(v))
	for i, x := range v {
		b := math.Float32bits(x)
		raw[4*i], raw[4*i+1], raw[4*i+2], raw[4*i+3] = byte(b), byte(b>>8), byte(b>>16), byte(b>>24)
	}
	return &pb.TensorProto{Name: proto.String(name), Dims: dims, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), RawData: raw}
}
