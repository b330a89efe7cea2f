package passes

import (
	"context"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/models"
	"github.com/mokopt/mokopt/moe"
	"github.com/mokopt/mokopt/passes/internal/canon"
	"google.golang.org/protobuf/proto"
)

// actModel is a model computing a = emit(g, u) from inputs g and u (u only
// when not gated), as canonicalization leaves it, and the model as written
// when the interpreter runs every op of it (nil otherwise).
func actModel(t *testing.T, gated bool, opset int64, ms bool, emit func(b *moe.Builder, g, u string) string) (*graph.Model, *graph.Model) {
	return actModelW(t, gated, opset, ms, func(b *moe.Builder, g, u string, _ int64) string { return emit(b, g, u) })
}

// actModelW is actModel for a spelling that takes the intermediate size.
func actModelW(t *testing.T, gated bool, opset int64, ms bool, emit func(b *moe.Builder, g, u string, inter int64) string) (*graph.Model, *graph.Model) {
	t.Helper()
	if opset == 0 {
		opset = 13
	}
	b := &moe.Builder{Prefix: "t"}
	g := ""
	vi := func(n string) *pb.ValueInfoProto {
		return &pb.ValueInfoProto{Name: proto.String(n), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
			ElemType: proto.Int32(int32(pb.TensorProto_FLOAT)), Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "n"}}}}}}}}
	}
	gp := &pb.GraphProto{Name: proto.String("act")}
	if gated {
		g = "g"
		gp.Input = append(gp.Input, vi("g"))
	}
	gp.Input = append(gp.Input, vi("u"))
	out := emit(b, g, "u", 8)
	gp.Node = append(b.Nodes, graph.NewNode("Identity", "", "out", []string{out}, []string{"a"}))
	gp.Output = []*pb.ValueInfoProto{vi("a")}
	mp := &pb.ModelProto{IrVersion: proto.Int64(10), Graph: gp, OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(opset)}}}
	if ms {
		mp.OpsetImport = append(mp.OpsetImport, &pb.OperatorSetIdProto{Domain: proto.String("com.microsoft"), Version: proto.Int64(1)})
	}
	raw, err := proto.Marshal(mp)
	if err != nil {
		t.Fatal(err)
	}
	m, err := graph.Parse(raw, "act.onnx")
	if err != nil {
		t.Fatal(err)
	}
	var runnable *graph.Model
	if len(eval.UnsupportedOps(m)) == 0 {
		runnable, err = graph.Parse(raw, "act.onnx")
		if err != nil {
			t.Fatal(err)
		}
	}
	cm, res, err := canon.Canonicalize(context.Background(), m, canon.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Changed() {
		return m, runnable
	}
	return cm, runnable
}

// identifyIn runs the identifier on m's subgraph from ins to "a".
func identifyIn(t *testing.T, m *graph.Model, ins ...string) (*actID, error) {
	t.Helper()
	c, err := newCtx(m, m.Graph())
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.actSubgraph("a", ins, pb.TensorProto_FLOAT)
	if err != nil {
		return nil, err
	}
	return c.identifyAct(a, nil)
}

// TestIdentifyActivation: every row of moe.Activations is identified, with
// its parameters, from each of its spellings (models.ActivationCases: the
// function body's, hand-written algebraic variants, fused contrib ops),
// both with the inputs in gate, up order and swapped (gated rows).
func TestIdentifyActivation(t *testing.T) {
	for _, row := range moe.Activations {
		if models.ActivationCase(row.Name) == nil {
			t.Errorf("activation %s has no case in models.ActivationCases", row.Name)
		}
	}
	for _, cs := range models.ActivationCases {
		def := moe.LookupActivation(cs.Act)
		if def == nil {
			t.Fatalf("case %s is not in the table", cs.Act)
		}
		want := cs.Params
		if want.Alpha == 0 {
			want.Alpha = 1
		}
		for _, sp := range cs.Spellings {
			t.Run(cs.Act+"/"+sp.Name, func(t *testing.T) {
				m, raw := actModelW(t, def.Gated, sp.Opset, sp.MS, sp.Write)
				orders := [][]string{{"u"}}
				if def.Gated {
					orders = [][]string{{"g", "u"}, {"u", "g"}}
				}
				for _, m := range []*graph.Model{m, raw} {
					if m == nil {
						continue
					}
					for i, ins := range orders {
						id, err := identifyIn(t, m, ins...)
						if err != nil {
							t.Fatalf("inputs %v: %v", ins, err)
						}
						// a symmetric row (bilinear) takes the first input as the gate
						swap := i == 1 && def.Eval(-0.3, 1.7, want) != def.Eval(1.7, -0.3, want)
						if id.def.Name != cs.Act || id.p != want || id.swap != swap {
							t.Fatalf("inputs %v: identified %s %+v swap %v, want %s %+v swap %v", ins, id.def.Name, id.p, id.swap, cs.Act, want, swap)
						}
					}
				}
			})
		}
	}
}

// TestIdentifyActivationRefuses: functions no row computes, near-misses of
// rows (a GELU with another cubic coefficient, a scaled SwiGLU, a clamp on
// one side only) and non-elementwise subgraphs are refused, naming the ops.
func TestIdentifyActivationRefuses(t *testing.T) {
	cases := []struct {
		name   string
		gated  bool
		emit   func(b *moe.Builder, g, u string) string
		reason string
	}{
		{"x·tanh(x²)+1", false, func(b *moe.Builder, _, u string) string {
			return b.Op("Add", []string{b.Op("Mul", []string{u, b.Op("Tanh", []string{b.Op("Pow", []string{u, b.Scalar(2)})})}), b.Scalar(1)})
		}, "expert activation is not a known function (made of Pow, Tanh, Mul, Add)"},
		{"tanh GELU with 0.045", false, func(b *moe.Builder, _, u string) string {
			c := b.Op("Mul", []string{b.Scalar(0.045), b.Op("Pow", []string{u, b.Scalar(3)})})
			th := b.Op("Tanh", []string{b.Op("Mul", []string{b.Scalar(0.7978845608), b.Op("Add", []string{u, c})})})
			return b.Op("Mul", []string{b.Op("Mul", []string{b.Scalar(0.5), u}), b.Op("Add", []string{b.Scalar(1), th})})
		}, "expert activation is not a known function (made of Pow, Mul, Add, Tanh)"},
		{"GELU by erf of x/1.4", false, func(b *moe.Builder, _, u string) string {
			e := b.Op("Erf", []string{b.Op("Div", []string{u, b.Scalar(1.4)})})
			return b.Op("Mul", []string{b.Op("Mul", []string{u, b.Scalar(0.5)}), b.Op("Add", []string{e, b.Scalar(1)})})
		}, "not a known function"},
		{"half SwiGLU", true, func(b *moe.Builder, g, u string) string {
			return b.Op("Mul", []string{b.Op("Mul", []string{b.Op("Mul", []string{g, b.Op("Sigmoid", []string{g})}), u}), b.Scalar(0.5)})
		}, "expert activation is not a known function (made of Sigmoid, Mul)"},
		{"gate clamped, up not", true, func(b *moe.Builder, g, u string) string {
			g = b.Op("Min", []string{g, b.Scalar(7)})
			return b.Op("Mul", []string{b.Op("Mul", []string{g, b.Op("Sigmoid", []string{g})}), u})
		}, "not a known function (made of Min, Sigmoid, Mul)"},
		{"product g·u²", true, func(b *moe.Builder, g, u string) string { return b.Op("Mul", []string{b.Op("Mul", []string{g, u}), u}) }, "not a known function (made of Mul)"},
		{"softmax between", false, func(b *moe.Builder, _, u string) string {
			return b.Op("Mul", []string{u, b.Op("Softmax", []string{u}, graph.IntAttr("axis", -1))})
		}, "not elementwise (ops: Softmax)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := actModel(t, tc.gated, 13, false, tc.emit)
			ins := []string{"u"}
			if tc.gated {
				ins = []string{"g", "u"}
			}
			id, err := identifyIn(t, m, ins...)
			if err == nil {
				t.Fatalf("identified as %s %+v, want a refusal", id.def.Name, id.p)
			}
			if !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("refusal %q does not contain %q", err, tc.reason)
			}
		})
	}
}

// TestIdentifyGELUExactVsTanh: the exact and the tanh GELU, which differ
// by at most about 2e-4, are told apart in both directions (each spelling
// identifies as its own row and fails the other's tolerance).
func TestIdentifyGELUExactVsTanh(t *testing.T) {
	for _, pair := range [][2]string{{moe.GELU, moe.GELUTanh}, {moe.GELUTanh, moe.GELU}, {moe.GeGLU, moe.GeGLUTanh}, {moe.GeGLUTanh, moe.GeGLU}} {
		cs := models.ActivationCase(pair[0])
		def := moe.LookupActivation(pair[0])
		other := moe.LookupActivation(pair[1])
		for _, sp := range cs.Spellings {
			m, _ := actModelW(t, def.Gated, sp.Opset, sp.MS, sp.Write)
			ins := []string{"u"}
			if def.Gated {
				ins = []string{"g", "u"}
			}
			c, err := newCtx(m, m.Graph())
			if err != nil {
				t.Fatal(err)
			}
			a, err := c.actSubgraph("a", ins, pb.TensorProto_FLOAT)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.identifyAct(a, &actID{def: other, p: moe.ActParams{Alpha: 1}}); err == nil {
				t.Errorf("%s spelled %s passes as %s", pair[0], sp.Name, pair[1])
			}
			if _, err := c.identifyAct(a, &actID{def: def, p: moe.ActParams{Alpha: 1}}); err != nil {
				t.Errorf("%s spelled %s: %v", pair[0], sp.Name, err)
			}
		}
	}
}

// halfConstants stores every float constant of m's Constant nodes as dt.
func halfConstants(t *testing.T, m *graph.Model, dt pb.TensorProto_DataType) {
	t.Helper()
	for _, n := range m.Proto.Graph.Node {
		if n.GetOpType() != "Constant" {
			continue
		}
		v := graph.AttrTensor(n, "value")
		if v == nil || graph.DataType(v) != pb.TensorProto_FLOAT {
			continue
		}
		b, err := m.TensorBytes(v)
		if err != nil {
			t.Fatal(err)
		}
		f, err := graph.DecodeFloat32(pb.TensorProto_FLOAT, b)
		if err != nil {
			t.Fatal(err)
		}
		raw := make([]byte, 2*len(f))
		for i, x := range f {
			h := graph.Float32ToHalf(x)
			if dt == pb.TensorProto_BFLOAT16 {
				h = graph.Float32ToBFloat16(x)
			}
			raw[2*i], raw[2*i+1] = byte(h), byte(h>>8)
		}
		v.DataType, v.RawData, v.FloatData = proto.Int32(int32(dt)), raw, nil
	}
}

// TestIdentifyActivationHalf: with its constants stored in float16 or
// bfloat16 (a half-precision export), every spelling of the GELU family
// and of the other rows with constants is still identified as its own row:
// the subgraph is evaluated for what it means, in float32, so the exact
// and the tanh GELU stay apart (their tails differ by far more than the
// constants' rounding).
func TestIdentifyActivationHalf(t *testing.T) {
	for _, dt := range []pb.TensorProto_DataType{pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16} {
		for _, cs := range models.ActivationCases {
			def := moe.LookupActivation(cs.Act)
			for _, sp := range cs.Spellings {
				t.Run(dt.String()+"/"+cs.Act+"/"+sp.Name, func(t *testing.T) {
					m, _ := actModelW(t, def.Gated, sp.Opset, sp.MS, sp.Write)
					halfConstants(t, m, dt)
					ins := []string{"u"}
					if def.Gated {
						ins = []string{"g", "u"}
					}
					c, err := newCtx(m, m.Graph())
					if err != nil {
						t.Fatal(err)
					}
					a, err := c.actSubgraph("a", ins, dt)
					if err != nil {
						t.Fatal(err)
					}
					id, err := c.identifyAct(a, nil)
					if err != nil {
						t.Fatal(err)
					}
					if id.def.Name != cs.Act {
						t.Fatalf("identified as %s %+v", id.def.Name, id.p)
					}
				})
			}
		}
	}
}

// TestIdentifyActivationToldApart: rows that share a form are told apart
// by what the subgraph computes, whatever op writes it: x·σ(β·x) is SiLU
// for β = 1, QuickGELU for 1.702 and Swish otherwise (gated: SwiGLU,
// QuickGeGLU, SwishGLU); CELU with α = 1 is ELU; ELU, CELU and SELU with
// other parameters stay apart.
func TestIdentifyActivationToldApart(t *testing.T) {
	op := func(b *moe.Builder, o string, in ...string) string { return b.Op(o, in) }
	swish := func(beta float32) func(b *moe.Builder, g, u string) string {
		return func(b *moe.Builder, _, u string) string {
			return op(b, "Mul", u, op(b, "Sigmoid", op(b, "Mul", u, b.Scalar(beta))))
		}
	}
	swishGLU := func(beta float32) func(b *moe.Builder, g, u string) string {
		return func(b *moe.Builder, g, u string) string {
			return op(b, "Mul", op(b, "Mul", g, op(b, "Sigmoid", op(b, "Mul", b.Scalar(beta), g))), u)
		}
	}
	attrOp := func(o string, attrs ...*pb.AttributeProto) func(b *moe.Builder, g, u string) string {
		return func(b *moe.Builder, _, u string) string { return b.Op(o, []string{u}, attrs...) }
	}
	cases := []struct {
		name  string
		gated bool
		emit  func(b *moe.Builder, g, u string) string
		act   string
		alpha float32
	}{
		{"swish β=1", false, swish(1), moe.SiLU, 1},
		{"swish β=1.702", false, swish(1.702), moe.QuickGELU, 1},
		{"swish β=1.25", false, swish(1.25), moe.Swish, 1.25},
		{"swish β=0.5", false, swish(0.5), moe.Swish, 0.5},
		{"swish β=-1 (x·σ(−x))", false, swish(-1), moe.Swish, -1},
		{"gated swish β=1", true, swishGLU(1), moe.SwiGLU, 1},
		{"gated swish β=1.702", true, swishGLU(1.702), moe.QuickGeGLU, 1},
		{"gated swish β=2", true, swishGLU(2), moe.SwishGLU, 2},
		{"Elu default", false, attrOp("Elu"), moe.ELU, 1},
		{"Elu α=2", false, attrOp("Elu", graph.FloatAttr("alpha", 2)), moe.ELU, 2},
		{"Celu α=1", false, attrOp("Celu", graph.FloatAttr("alpha", 1)), moe.ELU, 1},
		{"Celu α=2", false, attrOp("Celu", graph.FloatAttr("alpha", 2)), moe.CELU, 2},
		{"Celu α=0.5", false, attrOp("Celu", graph.FloatAttr("alpha", 0.5)), moe.CELU, 0.5},
		{"Selu", false, attrOp("Selu"), moe.SELU, 1},
		{"Softplus", false, attrOp("Softplus"), moe.Softplus, 1},
		{"Mish", false, func(b *moe.Builder, _, u string) string { return op(b, "Mul", u, op(b, "Tanh", op(b, "Softplus", u))) }, moe.Mish, 1},
		{"Tanh", false, attrOp("Tanh"), moe.Tanh, 1},
		{"Sigmoid", false, attrOp("Sigmoid"), moe.SigmoidAct, 1},
		{"LeakyRelu α=0.1", false, attrOp("LeakyRelu", graph.FloatAttr("alpha", 0.1)), moe.LeakyReLU, 0.1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := actModel(t, tc.gated, 13, false, tc.emit)
			ins := []string{"u"}
			if tc.gated {
				ins = []string{"g", "u"}
			}
			id, err := identifyIn(t, m, ins...)
			if err != nil {
				t.Fatal(err)
			}
			if id.def.Name != tc.act || id.p.Alpha != tc.alpha {
				t.Fatalf("identified as %s α %v, want %s α %v", id.def.Name, id.p.Alpha, tc.act, tc.alpha)
			}
		})
	}
}
