package passes

import (
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// fixedRoutingModel builds T=8 tokens x [8, 4] through E=4 two-layer
// experts (relu), each taking the tokens idx(b, e) selects and scattered
// back by ScatterND (reduction add) into a zero [8, 4]. idx returns the
// value holding expert e's token indices ([n, 1] int64).
func fixedRoutingModel(t *testing.T, extraInputs []*pb.ValueInfoProto, idx func(b *fixedBuilder, e int) string) *graph.Model {
	t.Helper()
	const T, H, I, E = 8, 4, 6, 4
	b := &fixedBuilder{g: &pb.GraphProto{Name: proto.String("fixed_routing")}, r: rand.New(rand.NewSource(1))}
	b.g.Input = append([]*pb.ValueInfoProto{tensorVI("x", pb.TensorProto_FLOAT, T, H)}, extraInputs...)
	acc := b.init(moe.Float32Tensor("", []int64{T, H}, make([]float32, T*H)))
	for e := 0; e < E; e++ {
		ix := idx(b, e)
		rows := b.node("GatherND", "x", ix)
		h := b.node("Relu", b.node("MatMul", rows, b.weight(H, I)))
		y := b.node("MatMul", h, b.weight(I, H))
		acc = b.nodeA("ScatterND", []string{acc, ix, y}, graph.StringAttr("reduction", "add"))
	}
	b.g.Node = append(b.g.Node, graph.NewNode("Identity", "", "out", []string{acc}, []string{"y"}))
	b.g.Output = []*pb.ValueInfoProto{tensorVI("y", pb.TensorProto_FLOAT, T, H)}
	mp := &pb.ModelProto{IrVersion: proto.Int64(8), Graph: b.g, OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}}}
	raw, err := proto.Marshal(mp)
	if err != nil {
		t.Fatal(err)
	}
	m, err := graph.Parse(raw, "fixed.onnx")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// fixedBuilder appends nodes and initializers to a graph.
type fixedBuilder struct {
	g *pb.GraphProto
	n int
	r *rand.Rand
}

func (b *fixedBuilder) name(p string) string { b.n++; return fmt.Sprintf("%s%d", p, b.n) }

func (b *fixedBuilder) nodeA(op string, in []string, attrs ...*pb.AttributeProto) string {
	out := b.name("v")
	b.g.Node = append(b.g.Node, graph.NewNode(op, "", b.name("n_"+op), in, []string{out}, attrs...))
	return out
}

func (b *fixedBuilder) node(op string, in ...string) string { return b.nodeA(op, in) }

func (b *fixedBuilder) init(t *pb.TensorProto) string {
	t.Name = proto.String(b.name("c"))
	b.g.Initializer = append(b.g.Initializer, t)
	return t.GetName()
}

func (b *fixedBuilder) ints(dims []int64, v ...int64) string {
	return b.init(moe.Int64Tensor("", dims, v))
}

func (b *fixedBuilder) weight(in, out int) string {
	v := make([]float32, in*out)
	for i := range v {
		v[i] = float32(b.r.NormFloat64() * 0.5)
	}
	return b.init(moe.Float32Tensor("", []int64{int64(in), int64(out)}, v))
}

func tensorVI(name string, dt pb.TensorProto_DataType, dims ...int64) *pb.ValueInfoProto {
	var d []*pb.TensorShapeProto_Dimension
	for _, x := range dims {
		d = append(d, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: x}})
	}
	return &pb.ValueInfoProto{Name: proto.String(name), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
		ElemType: proto.Int32(int32(dt)), Shape: &pb.TensorShapeProto{Dim: d}}}}}
}

// TestFixedRoutingRefused: experts whose tokens are chosen by indices that
// are not computed from the hidden state — a constant table (what a trace
// of position-hashed routing folds to), or expert ids hashed from the
// token ids through a constant table — are refused as routing that does
// not depend on the hidden state, not left alone with nothing fused.
func TestFixedRoutingRefused(t *testing.T) {
	const want = "routing does not depend on the hidden state: 4 expert branches"
	t.Run("constant table", func(t *testing.T) {
		m := fixedRoutingModel(t, nil, func(b *fixedBuilder, e int) string {
			return b.ints([]int64{2, 1}, int64(e), int64(e+4)) // token t goes to expert t mod 4
		})
		_, err := Rewrite(m, Options{Check: true})
		if err == nil || !errors.Is(err, ErrNotFused) || !strings.Contains(err.Error(), want) {
			t.Fatalf("want a refusal containing %q, got %v", want, err)
		}
	})
	t.Run("hashed token ids", func(t *testing.T) {
		ids := tensorVI("input_ids", pb.TensorProto_INT64, 8)
		var expertOf string
		m := fixedRoutingModel(t, []*pb.ValueInfoProto{ids}, func(b *fixedBuilder, e int) string {
			if expertOf == "" { // expert = table[input_ids mod 16]
				table := b.ints([]int64{16}, 3, 1, 0, 2, 2, 0, 1, 3, 0, 0, 1, 2, 3, 3, 1, 2)
				expertOf = b.nodeA("Gather", []string{table, b.node("Mod", "input_ids", b.ints(nil, 16))})
			}
			hit := b.node("Equal", expertOf, b.ints(nil, int64(e)))
			return b.nodeA("Transpose", []string{b.node("NonZero", hit)}, graph.IntsAttr("perm", 1, 0))
		})
		_, err := Rewrite(m, Options{Check: true})
		if err == nil || !errors.Is(err, ErrNotFused) || !strings.Contains(err.Error(), want) {
			t.Fatalf("want a refusal containing %q, got %v", want, err)
		}
	})
}

// TestFixedRoutingNotMisread: constant selections of the hidden state that
// are no experts — one pooled row through a head, or several rows through
// one shared weight — are no near-miss: nothing fused, no error.
func TestFixedRoutingNotMisread(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(b *fixedBuilder) string
	}{
		{"one pooled row", func(b *fixedBuilder) string {
			return b.node("MatMul", b.nodeA("Gather", []string{"x", b.ints([]int64{1}, 0)}, graph.IntAttr("axis", 0)), b.weight(4, 4))
		}},
		{"two rows through one weight", func(b *fixedBuilder) string {
			w := b.weight(4, 4)
			a := b.node("MatMul", b.nodeA("Gather", []string{"x", b.ints([]int64{1}, 0)}, graph.IntAttr("axis", 0)), w)
			c := b.node("MatMul", b.nodeA("Gather", []string{"x", b.ints([]int64{1}, 7)}, graph.IntAttr("axis", 0)), w)
			return b.node("Add", a, c)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &fixedBuilder{g: &pb.GraphProto{Name: proto.String("heads")}, r: rand.New(rand.NewSource(2))}
			b.g.Input = []*pb.ValueInfoProto{tensorVI("x", pb.TensorProto_FLOAT, 8, 4)}
			out := tc.build(b)
			b.g.Node = append(b.g.Node, graph.NewNode("Identity", "", "out", []string{out}, []string{"y"}))
			b.g.Output = []*pb.ValueInfoProto{tensorVI("y", pb.TensorProto_FLOAT, 1, 4)}
			raw, err := proto.Marshal(&pb.ModelProto{IrVersion: proto.Int64(8), Graph: b.g,
				OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}}})
			if err != nil {
				t.Fatal(err)
			}
			m, err := graph.Parse(raw, "heads.onnx")
			if err != nil {
				t.Fatal(err)
			}
			rep, err := Rewrite(m, Options{Check: true})
			if err != nil || len(rep.Fused) != 0 {
				t.Fatalf("want nothing fused without error, got %v, %v", rep, err)
			}
		})
	}
}
