package passes

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/models"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// routerSurgery rewrites the router of a synthetic batched block: the
// nodes between the router logits and the top-k (values, indices) are
// replaced by what form emits.
type routerSurgery struct {
	g      *pb.GraphProto
	n      int
	logits string // the router Gemm's output
	extra  int    // router outputs added to the Gemm's weight (not experts)
}

// node appends a node and returns its first output.
func (r *routerSurgery) node(op string, in []string, attrs ...*pb.AttributeProto) string {
	return r.nodeN(op, in, 1, attrs...)[0]
}

// nodeN appends a node with n outputs.
func (r *routerSurgery) nodeN(op string, in []string, n int, attrs ...*pb.AttributeProto) []string {
	r.n++
	outs := make([]string, n)
	for i := range outs {
		outs[i] = fmt.Sprintf("rf%d_%d", r.n, i)
	}
	r.g.Node = append(r.g.Node, graph.NewNode(op, "", fmt.Sprintf("rf_node%d", r.n), in, outs, attrs...))
	return outs
}

// ints and float add constants.
func (r *routerSurgery) ints(v ...int64) string {
	r.n++
	name := fmt.Sprintf("rf_c%d", r.n)
	r.g.Initializer = append(r.g.Initializer, moe.Int64Tensor(name, []int64{int64(len(v))}, v))
	return name
}

func (r *routerSurgery) float(v float32) string {
	r.n++
	name := fmt.Sprintf("rf_f%d", r.n)
	r.g.Initializer = append(r.g.Initializer, moe.Float32Tensor(name, nil, []float32{v}))
	return name
}

// vector adds a constant float vector.
func (r *routerSurgery) vector(v ...float32) string {
	r.n++
	name := fmt.Sprintf("rf_v%d", r.n)
	r.g.Initializer = append(r.g.Initializer, moe.Float32Tensor(name, []int64{int64(len(v))}, v))
	return name
}

// topk emits TopK(x, k) on the last axis.
func (r *routerSurgery) topk(x string, k int, largest int64) (string, string) {
	o := r.nodeN("TopK", []string{x, r.ints(int64(k))}, 2, graph.IntAttr("axis", -1), graph.IntAttr("largest", largest), graph.IntAttr("sorted", 1))
	return o[0], o[1]
}

// softmax emits Softmax on the last axis.
func (r *routerSurgery) softmax(x string) string {
	return r.node("Softmax", []string{x}, graph.IntAttr("axis", -1))
}

// sum emits ReduceSum over the last axis, kept.
func (r *routerSurgery) sum(x string) string {
	return r.node("ReduceSum", []string{x, r.ints(-1)}, graph.IntAttr("keepdims", 1))
}

// routerForm is one row of the router-form table.
type routerForm struct {
	name  string
	k     int
	extra int // non-expert router outputs (Gemm weight rows added)
	form  func(r *routerSurgery, k int) (w, idx string)
	// want: the spec read, or the refusal's substring
	act, order string
	norm, corr bool
	scale      float32
	refused    string // alternatives separated by |
}

func routerForms() []routerForm {
	const E = 8
	return []routerForm{
		{name: "softmax as exp/sum", k: 2, act: moe.Softmax, order: moe.ActivationThenTopK, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				e := r.node("Exp", []string{r.logits})
				return r.topk(r.node("Div", []string{e, r.sum(e)}), k, 1)
			}},
		{name: "softmax as exp(x-max)/sum", k: 2, act: moe.Softmax, order: moe.ActivationThenTopK, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				m := r.node("ReduceMax", []string{r.logits, r.ints(-1)}, graph.IntAttr("keepdims", 1))
				e := r.node("Exp", []string{r.node("Sub", []string{r.logits, m})})
				return r.topk(r.node("Div", []string{e, r.sum(e)}), k, 1)
			}},
		{name: "softmax as exp(log_softmax)", k: 3, act: moe.Softmax, order: moe.ActivationThenTopK, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				return r.topk(r.node("Exp", []string{r.node("LogSoftmax", []string{r.logits}, graph.IntAttr("axis", -1))}), k, 1)
			}},
		{name: "top-k on negated scores", k: 2, act: moe.Softmax, order: moe.ActivationThenTopK, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				v, i := r.topk(r.node("Neg", []string{r.softmax(r.logits)}), k, 0)
				return r.node("Neg", []string{v}), i
			}},
		{name: "sigmoid renormalised with eps", k: 2, act: moe.Sigmoid, order: moe.ActivationThenTopK, norm: true, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				v, i := r.topk(r.node("Sigmoid", []string{r.logits}), k, 1)
				return r.node("Div", []string{v, r.node("Add", []string{r.sum(v), r.float(1e-20)})}), i
			}},
		{name: "sigmoid written out, renormalised", k: 2, act: moe.Sigmoid, order: moe.ActivationThenTopK, norm: true, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				one := r.float(1)
				s := r.node("Div", []string{one, r.node("Add", []string{one, r.node("Exp", []string{r.node("Neg", []string{r.logits})})})})
				v, i := r.topk(s, k, 1)
				return r.node("Div", []string{v, r.sum(v)}), i
			}},
		{name: "softmax renormalised with eps", k: 2, act: moe.Softmax, order: moe.ActivationThenTopK, norm: true, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				v, i := r.topk(r.softmax(r.logits), k, 1)
				return r.node("Div", []string{v, r.node("Max", []string{r.sum(v), r.float(1e-6)})}), i
			}},
		{name: "weights gathered from the probabilities", k: 2, act: moe.Softmax, order: moe.ActivationThenTopK, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				p := r.softmax(r.logits)
				_, i := r.topk(p, k, 1)
				return r.node("GatherElements", []string{p, i}, graph.IntAttr("axis", -1)), i
			}},
		{name: "softmax over the k selected logits", k: 2, act: moe.Softmax, order: moe.TopKThenActivation, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				v, i := r.topk(r.logits, k, 1)
				return r.softmax(v), i
			}},
		// Seven nodes from the TopK to the weights, none of which a
		// canonical rule removes: the evaluation reaches them all.
		{name: "renormalised and scaled through a long chain", k: 2, act: moe.Sigmoid, order: moe.ActivationThenTopK, norm: true, scale: 2.5,
			form: func(r *routerSurgery, k int) (string, string) {
				v, i := r.topk(r.node("Sigmoid", []string{r.logits}), k, 1)
				a := r.node("Abs", []string{v})
				inv := r.node("Pow", []string{r.node("Add", []string{r.sum(a), r.float(1e-20)}), r.float(-1.5)})
				n := r.node("Mul", []string{a, r.node("Mul", []string{inv, r.node("Sqrt", []string{r.sum(a)})})})
				return r.node("Mul", []string{n, r.float(2.5)}), i
			}},
		{name: "scaled by division", k: 2, act: moe.Sigmoid, order: moe.ActivationThenTopK, norm: true, scale: 2.5,
			form: func(r *routerSurgery, k int) (string, string) {
				v, i := r.topk(r.node("Sigmoid", []string{r.logits}), k, 1)
				n := r.node("Div", []string{v, r.sum(v)})
				return r.node("Div", []string{n, r.float(0.4)}), i
			}},
		{name: "correction bias, sigmoid written out", k: 2, act: moe.Sigmoid, order: moe.ActivationThenTopK, norm: true, scale: 1, corr: true,
			form: func(r *routerSurgery, k int) (string, string) {
				one := r.float(1)
				s := r.node("Reciprocal", []string{r.node("Add", []string{r.node("Exp", []string{r.node("Neg", []string{r.logits})}), one})})
				r.n++
				bias := fmt.Sprintf("rf_b%d", r.n)
				r.g.Initializer = append(r.g.Initializer, moe.Float32Tensor(bias, []int64{E}, []float32{0.5, -0.3, 0.1, 0.9, -0.7, 0.2, 0, 0.4}))
				_, i := r.topk(r.node("Add", []string{s, bias}), k, 1)
				w := r.node("GatherElements", []string{s, i}, graph.IntAttr("axis", 1))
				return r.node("Div", []string{w, r.node("Add", []string{r.sum(w), r.float(1e-20)})}), i
			}},
		{name: "constant temperature", k: 2, act: moe.Softmax, order: moe.ActivationThenTopK, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				return r.topk(r.softmax(r.node("Div", []string{r.logits, r.float(0.7)})), k, 1)
			}},
		{name: "constant temperature, multiplied", k: 2, act: moe.Softmax, order: moe.ActivationThenTopK, norm: true, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				v, i := r.topk(r.softmax(r.node("Mul", []string{r.float(1.6), r.logits})), k, 1)
				return r.node("Div", []string{v, r.sum(v)}), i
			}},
		{name: "per-expert temperature", k: 2, act: moe.Softmax, order: moe.ActivationThenTopK, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				return r.topk(r.softmax(r.node("Mul", []string{r.logits, r.vector(0.5, 1.5, 1, 2, 0.8, 1.2, 3, 0.25)})), k, 1)
			}},
		{name: "per-expert temperature divided, after a bias, then scaled", k: 2, act: moe.Sigmoid, order: moe.ActivationThenTopK, norm: true, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				l := r.node("Add", []string{r.logits, r.vector(0.5, -0.3, 0.1, 0.9, -0.7, 0.2, 0, 0.4)})
				l = r.node("Div", []string{l, r.vector(0.7, 1.3, 2, 0.9, 1, 0.6, 1.1, 4)})
				l = r.node("Mul", []string{l, r.float(1.5)})
				v, i := r.topk(r.node("Sigmoid", []string{l}), k, 1)
				return r.node("Div", []string{v, r.sum(v)}), i
			}},
		{name: "per-expert temperature of the sliced logits", k: 2, extra: 3, act: moe.Softmax, order: moe.ActivationThenTopK, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				l := r.node("Slice", []string{r.logits, r.ints(0), r.ints(E), r.ints(-1)})
				return r.topk(r.softmax(r.node("Mul", []string{l, r.vector(0.5, 1.5, 1, 2, 0.8, 1.2, 3, 0.25)})), k, 1)
			}},
		{name: "extra router columns sliced off", k: 2, extra: 3, act: moe.Softmax, order: moe.ActivationThenTopK, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				l := r.node("Slice", []string{r.logits, r.ints(0), r.ints(E), r.ints(-1)})
				return r.topk(r.softmax(l), k, 1)
			}},
		{name: "softmax over extra router columns", k: 2, extra: 3, refused: "columns that are not experts",
			form: func(r *routerSurgery, k int) (string, string) {
				p := r.node("Slice", []string{r.softmax(r.logits), r.ints(0), r.ints(E), r.ints(-1)})
				return r.topk(p, k, 1)
			}},
		{name: "softmax over extra router columns, renormalised", k: 2, extra: 3, act: moe.Softmax, order: moe.ActivationThenTopK, norm: true, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				p := r.node("Slice", []string{r.softmax(r.logits), r.ints(0), r.ints(E), r.ints(-1)})
				v, i := r.topk(p, k, 1)
				return r.node("Div", []string{v, r.sum(v)}), i
			}},
		{name: "sigmoid over extra router columns", k: 2, extra: 3, act: moe.Sigmoid, order: moe.ActivationThenTopK, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				p := r.node("Slice", []string{r.node("Sigmoid", []string{r.logits}), r.ints(2), r.ints(E + 2), r.ints(-1)})
				return r.topk(p, k, 1)
			}},
		{name: "null experts", k: 2, extra: 2, refused: "null experts|router outputs without expert weights",
			form: func(r *routerSurgery, k int) (string, string) {
				v, i := r.topk(r.softmax(r.logits), k, 1)
				real := r.node("Cast", []string{r.node("Less", []string{i, r.ints(E)})}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT)))
				return r.node("Mul", []string{v, real}), i
			}},
		{name: "squared probabilities", k: 2, refused: "none of ai.mok::MoE's",
			form: func(r *routerSurgery, k int) (string, string) {
				v, i := r.topk(r.softmax(r.logits), k, 1)
				return r.node("Mul", []string{v, v}), i
			}},
		{name: "top-k of the magnitudes", k: 2, refused: "not those of any router",
			form: func(r *routerSurgery, k int) (string, string) {
				_, i := r.topk(r.node("Abs", []string{r.logits}), k, 1)
				return r.node("GatherElements", []string{r.softmax(r.logits), i}, graph.IntAttr("axis", -1)), i
			}},
		{name: "top-1 as ArgMax and ReduceMax (Switch)", k: 1, act: moe.Softmax, order: moe.ActivationThenTopK, scale: 1,
			form: func(r *routerSurgery, _ int) (string, string) {
				p := r.softmax(r.logits)
				return r.node("ReduceMax", []string{p, r.ints(-1)}, graph.IntAttr("keepdims", 1)),
					r.node("ArgMax", []string{p}, graph.IntAttr("axis", -1), graph.IntAttr("keepdims", 1))
			}},
		{name: "top-1 as ArgMax, weight the max of p times its one-hot", k: 1, act: moe.Softmax, order: moe.ActivationThenTopK, scale: 1,
			form: func(r *routerSurgery, _ int) (string, string) {
				p := r.softmax(r.logits)
				i := r.node("ArgMax", []string{p}, graph.IntAttr("axis", -1), graph.IntAttr("keepdims", 1))
				r.n++
				rng := fmt.Sprintf("rf_range%d", r.n)
				r.g.Initializer = append(r.g.Initializer, moe.Int64Tensor(rng, []int64{E}, []int64{0, 1, 2, 3, 4, 5, 6, 7}))
				oh := r.node("Cast", []string{r.node("Equal", []string{i, rng})}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT)))
				return r.node("ReduceMax", []string{r.node("Mul", []string{p, oh}), r.ints(-1)}, graph.IntAttr("keepdims", 1)), i
			}},
		{name: "softmax as exp(x - logsumexp)", k: 2, act: moe.Softmax, order: moe.ActivationThenTopK, norm: true, scale: 1,
			form: func(r *routerSurgery, k int) (string, string) {
				lse := r.node("ReduceLogSumExp", []string{r.logits, r.ints(-1)}, graph.IntAttr("keepdims", 1))
				v, i := r.topk(r.node("Exp", []string{r.node("Sub", []string{r.logits, lse})}), k, 1)
				return r.node("Div", []string{v, r.sum(v)}), i
			}},
		{name: "routing ignores the hidden state", k: 2, refused: "routing does not depend on the hidden state",
			form: func(r *routerSurgery, k int) (string, string) {
				r.n++
				bias := fmt.Sprintf("rf_b%d", r.n)
				r.g.Initializer = append(r.g.Initializer, moe.Float32Tensor(bias, []int64{1, E}, []float32{3, 1, 4, 1, 5, 9, 2, 6}))
				shape := r.node("Shape", []string{r.logits})
				return r.topk(r.softmax(r.node("Expand", []string{bias, shape})), k, 1)
			}},
	}
}

// withRouterForm builds a one-block synthetic model (E=8) of the given
// shape whose router post-processing is f's.
func withRouterForm(t *testing.T, f routerForm, shape string) *graph.Model {
	return withRouterFormTokens(t, f, shape, 0)
}

// withRouterFormTokens is withRouterForm with a static token count (0:
// symbolic).
func withRouterFormTokens(t *testing.T, f routerForm, shape string, tokens int) *graph.Model {
	t.Helper()
	cfg := models.Config{Shape: shape, Layers: 1, Experts: 8, TopK: f.k, Hidden: 16, Inter: 8, Seed: 7, Tokens: tokens}
	m, err := models.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g := m.Proto.Graph
	var tk, act, gemm *pb.NodeProto
	for _, n := range g.Node {
		switch n.GetOpType() {
		case "TopK":
			tk = n
		case "Softmax":
			act = n
		}
	}
	for _, n := range g.Node {
		if act != nil && n.GetOpType() == "Gemm" && n.Output[0] == act.Input[0] {
			gemm = n
		}
	}
	if tk == nil || act == nil || gemm == nil {
		t.Fatal("no router in the synthetic block")
	}
	r := &routerSurgery{g: g, logits: act.Input[0], extra: f.extra}
	if f.extra > 0 {
		extendRouter(t, g, gemm.Input[1], f.extra)
	}
	return replaceRouter(t, m, f, r, []*pb.NodeProto{tk, act}, tk.Output[0], tk.Output[1])
}

// replaceRouter drops the nodes old from m, appends what f emits through r,
// and binds its weights and indices to the values w and idx the old nodes
// produced.
func replaceRouter(t *testing.T, m *graph.Model, f routerForm, r *routerSurgery, old []*pb.NodeProto, w, idx string) *graph.Model {
	t.Helper()
	g := m.Proto.Graph
	g.Node = slices.DeleteFunc(g.Node, func(n *pb.NodeProto) bool { return slices.Contains(old, n) })
	fw, fi := f.form(r, f.k)
	g.Node = append(g.Node,
		graph.NewNode("Identity", "", "rf_w", []string{fw}, []string{w}),
		graph.NewNode("Identity", "", "rf_i", []string{fi}, []string{idx}))
	sorted, err := m.Graph().TopoSort()
	if err != nil {
		t.Fatal(err)
	}
	g.Node = sorted
	return &graph.Model{Proto: m.Proto, Dir: "."}
}

// extendRouter appends extra rows of weights to the router weight [E, H].
func extendRouter(t *testing.T, g *pb.GraphProto, name string, extra int) {
	t.Helper()
	for i, init := range g.Initializer {
		if init.GetName() != name {
			continue
		}
		d := init.GetDims()
		add := make([]byte, 4*extra*int(d[1]))
		for j := range add {
			add[j] = byte(j*37 + 11)
		}
		for j := 3; j < len(add); j += 4 {
			add[j] = 0x3c // small positive and negative floats
		}
		nt := proto.Clone(init).(*pb.TensorProto)
		nt.Dims = []int64{d[0] + int64(extra), d[1]}
		nt.RawData = append(append([]byte{}, init.GetRawData()...), add...)
		g.Initializer[i] = nt
		return
	}
	t.Fatalf("no router weight %q", name)
}

// TestRouterForms fuses each router form of the table, reads the right
// router spec, and computes what the original graph computes (the
// interpreter on the original against the fused node's function body, on
// random inputs); or refuses it naming what the router computes that the
// contract cannot express.
func TestRouterForms(t *testing.T) {
	for _, shape := range []string{models.ShapeBatched, models.ShapeUnrolled, models.ShapeDense} {
		for _, f := range routerForms() {
			if shape == models.ShapeDense && f.extra > 0 {
				continue // its zeros take the logits' shape: no valid original
			}
			t.Run(shape+"/"+f.name, func(t *testing.T) {
				checkRouterForm(t, f, func() *graph.Model { return withRouterForm(t, f, shape) })
			})
		}
	}
	for _, f := range routerForms() {
		t.Run(KindSorted+"/"+f.name, func(t *testing.T) {
			checkRouterForm(t, f, func() *graph.Model { return sortedWithRouterForm(t, f) })
		})
	}
}

// sortedWithRouterForm is a sort-based block (sortedModel, E=8) whose
// router post-processing, top-k then softmax, is replaced by f's.
func sortedWithRouterForm(t *testing.T, f routerForm) *graph.Model {
	t.Helper()
	m := sortedModel(sortedOpts{E: 8, K: f.k, H: 16, I: 8, B: 2, S: 5}, 7)
	g := m.Proto.Graph
	var tk, act, mm *pb.NodeProto
	for _, n := range g.Node {
		if n.GetOpType() == "MatMul" && mm == nil {
			mm = n // the router's, the first
		}
		if n.GetOpType() == "TopK" && mm != nil && tk == nil && n.Input[0] == mm.Output[0] {
			tk = n
		}
		if n.GetOpType() == "Softmax" && tk != nil && n.Input[0] == tk.Output[0] {
			act = n
		}
	}
	if tk == nil || act == nil {
		t.Fatal("no router in the synthetic sort-based block")
	}
	if f.extra > 0 {
		extendRouterColumns(t, g, mm.Input[1], f.extra)
	}
	r := &routerSurgery{g: g, logits: mm.Output[0], extra: f.extra}
	return replaceRouter(t, m, f, r, []*pb.NodeProto{tk, act}, act.Output[0], tk.Output[1])
}

// extendRouterColumns appends extra columns to the router weight [H, E]
// of a MatMul router.
func extendRouterColumns(t *testing.T, g *pb.GraphProto, name string, extra int) {
	t.Helper()
	for i, init := range g.Initializer {
		if init.GetName() != name {
			continue
		}
		d := init.GetDims()
		raw := init.GetRawData()
		var out []byte
		for row := range int(d[0]) {
			out = append(out, raw[4*row*int(d[1]):4*(row+1)*int(d[1])]...)
			for j := range extra {
				out = append(out, byte(row*37+j*11), byte(row*13+j), byte(j*7+row), 0x3c)
			}
		}
		nt := proto.Clone(init).(*pb.TensorProto)
		nt.Dims = []int64{d[0], d[1] + int64(extra)}
		nt.RawData = out
		g.Initializer[i] = nt
		return
	}
	t.Fatalf("no router weight %q", name)
}

// checkRouterForm is one row of TestRouterForms on the model build makes
// (called twice: the original and the one rewritten).
func checkRouterForm(t *testing.T, f routerForm, build func() *graph.Model) {
	{
		{
			orig := build()
			m := build()
			rep, err := Rewrite(m, Options{Check: true})
			if f.refused != "" {
				if err == nil || !errors.Is(err, ErrNotFused) || !slices.ContainsFunc(strings.Split(f.refused, "|"), func(s string) bool { return strings.Contains(err.Error(), s) }) {
					t.Fatalf("want a refusal containing %q, got %v", f.refused, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Fused) != 1 {
				t.Fatalf("fused %d blocks, want 1", len(rep.Fused))
			}
			s := rep.Fused[0].Block.Spec
			if s.RouterActivation != f.act || s.RouterOrder != f.order || s.NormalizeTopK != f.norm || s.RoutedScalingFactor != f.scale || s.NumExperts != 8 || s.CorrectionBias != f.corr {
				t.Fatalf("spec %s %s norm=%v scale=%g E=%d corr=%v, want %s %s norm=%v scale=%g E=8 corr=%v", s.RouterActivation, s.RouterOrder, s.NormalizeTopK, s.RoutedScalingFactor, s.NumExperts, s.CorrectionBias, f.act, f.order, f.norm, f.scale, f.corr)
			}
			sameOnRandomInputs(t, orig, m, 3)
		}
	}
}

// TestRouterFormsHalf fuses the router forms in float16 and bfloat16
// models (every weight, constant and declared type in the half type) and
// compares the fused node with the original to the half type's precision.
func TestRouterFormsHalf(t *testing.T) {
	for _, dt := range []pb.TensorProto_DataType{pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16} {
		for _, f := range routerForms() {
			if f.refused != "" {
				continue
			}
			t.Run(dt.String()+"/"+f.name, func(t *testing.T) {
				orig := withRouterFormTokens(t, f, models.ShapeBatched, 16)
				toHalf(t, orig, dt)
				m := withRouterFormTokens(t, f, models.ShapeBatched, 16)
				toHalf(t, m, dt)
				rep, err := Rewrite(m, Options{Check: true})
				if err != nil {
					t.Fatal(err)
				}
				if len(rep.Fused) != 1 {
					t.Fatalf("fused %d blocks, want 1", len(rep.Fused))
				}
				s := rep.Fused[0].Block.Spec
				// The graph's factor is the half-precision constant's.
				if s.RouterActivation != f.act || s.RouterOrder != f.order || s.NormalizeTopK != f.norm || math.Abs(float64(s.RoutedScalingFactor/f.scale)-1) > 1e-2 {
					t.Fatalf("spec %s %s norm=%v scale=%g, want %s %s norm=%v scale=%g", s.RouterActivation, s.RouterOrder, s.NormalizeTopK, s.RoutedScalingFactor, f.act, f.order, f.norm, f.scale)
				}
				matchesHalf(t, orig, m, dt, s)
			})
		}
	}
}
