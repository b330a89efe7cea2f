package diff

import (
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	fx "github.com/mokopt/mokopt/internal/fixtures"
	"github.com/mokopt/mokopt/passes"
	"google.golang.org/protobuf/proto"
)

// fixtureDir holds the exported MoE fixtures (testdata/fixtures).
var fixtureDir = fx.Dir()

func fixtures(t testing.TB) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(fixtureDir, "*.onnx"))
	if len(files) == 0 {
		t.Fatalf("no fixtures in %s", fixtureDir)
	}
	return files
}

func fixture(t testing.TB, name string) string {
	t.Helper()
	fixtures(t)
	p := filepath.Join(fixtureDir, name)
	return p
}

func load(t testing.TB, path string) *graph.Model {
	t.Helper()
	m, err := graph.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// rewritten loads path, fuses it with passes.Rewrite, saves the result to a
// temporary folder and loads it back. When the whole model does not rewrite
// (for example a TorchScript trace that lost experts) it fuses the blocks
// that pass (Partial); ok is false when nothing fuses.
func rewritten(t *testing.T, path string) (b *graph.Model, rep *passes.Report, ok bool) {
	t.Helper()
	m := load(t, path)
	rep, err := passes.Rewrite(m, passes.Options{})
	if err != nil {
		m = load(t, path)
		if rep, err = passes.Rewrite(m, passes.Options{Partial: true}); err != nil {
			return nil, nil, false
		}
	}
	if len(rep.Fused) == 0 {
		return nil, nil, false
	}
	out := filepath.Join(t.TempDir(), "rewritten.onnx")
	if err := m.Save(out, graph.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	return load(t, out), rep, true
}

// stripProvenance deletes the provenance records from m's metadata.
func stripProvenance(m *graph.Model) {
	var keep []*pb.StringStringEntryProto
	for _, p := range m.Proto.MetadataProps {
		if !strings.HasPrefix(p.GetKey(), passes.ProvenanceKey) {
			keep = append(keep, p)
		}
	}
	m.Proto.MetadataProps = keep
}

// renameAll renames every node, value and initializer of m consistently and
// stores the nodes in another valid topological order (depth-first from the
// outputs), as a different exporter might.
func renameAll(m *graph.Model) {
	g := m.Proto.Graph
	ren := map[string]string{}
	name := func(s string) string {
		if s == "" {
			return ""
		}
		if r, ok := ren[s]; ok {
			return r
		}
		r := fmt.Sprintf("t%d", (len(ren)*7919+13)%1000003)
		ren[s] = r
		return r
	}
	for _, v := range g.Input {
		v.Name = proto.String(name(v.GetName()))
	}
	for _, t := range g.Initializer {
		t.Name = proto.String(name(t.GetName()))
	}
	for i, n := range g.Node {
		n.Name = proto.String(fmt.Sprintf("renamed_node_%d", (i*31+7)%100003))
		for j := range n.Input {
			n.Input[j] = name(n.Input[j])
		}
		for j := range n.Output {
			n.Output[j] = name(n.Output[j])
		}
	}
	for _, v := range g.Output {
		v.Name = proto.String(name(v.GetName()))
	}
	for _, v := range g.ValueInfo {
		v.Name = proto.String(name(v.GetName()))
	}
	// Depth-first post-order from the outputs, last output first.
	prod := map[string]*pb.NodeProto{}
	for _, n := range g.Node {
		for _, o := range n.Output {
			prod[o] = n
		}
	}
	seen := map[*pb.NodeProto]bool{}
	var order []*pb.NodeProto
	var visit func(n *pb.NodeProto)
	visit = func(n *pb.NodeProto) {
		if seen[n] {
			return
		}
		seen[n] = true
		for k := len(n.Input) - 1; k >= 0; k-- {
			if p := prod[n.Input[k]]; p != nil {
				visit(p)
			}
		}
		order = append(order, n)
	}
	for k := len(g.Output) - 1; k >= 0; k-- {
		if p := prod[g.Output[k].GetName()]; p != nil {
			visit(p)
		}
	}
	for _, n := range g.Node {
		visit(n)
	}
	g.Node = order
}

// Synthetic models.

func floatTensor(name string, dims []int64, vals ...float32) *pb.TensorProto {
	raw := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
	}
	return &pb.TensorProto{Name: proto.String(name), Dims: dims, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), RawData: raw}
}

func tensorValue(name string, elem pb.TensorProto_DataType, dims ...int64) *pb.ValueInfoProto {
	var ds []*pb.TensorShapeProto_Dimension
	for _, d := range dims {
		ds = append(ds, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: d}})
	}
	return &pb.ValueInfoProto{Name: proto.String(name), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{
		TensorType: &pb.TypeProto_Tensor{ElemType: proto.Int32(int32(elem)), Shape: &pb.TensorShapeProto{Dim: ds}}}}}
}

// modelOf wraps a graph in a model and parses it, as if read from a file.
func modelOf(t testing.TB, g *pb.GraphProto, meta map[string]string) *graph.Model {
	t.Helper()
	mp := &pb.ModelProto{IrVersion: proto.Int64(10), ProducerName: proto.String("test"),
		OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}}, Graph: g}
	for k, v := range meta {
		mp.MetadataProps = append(mp.MetadataProps, &pb.StringStringEntryProto{Key: proto.String(k), Value: proto.String(v)})
	}
	b, err := proto.Marshal(mp)
	if err != nil {
		t.Fatal(err)
	}
	m, err := graph.Parse(b, "synthetic.onnx")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// mlp is x -> MatMul(W1) -> Add(B1) -> Relu -> Softmax(axis=-1) -> MatMul(W2) -> y.
func mlp() *pb.GraphProto {
	return &pb.GraphProto{
		Name:  proto.String("mlp"),
		Input: []*pb.ValueInfoProto{tensorValue("x", pb.TensorProto_FLOAT, 2, 2)},
		Initializer: []*pb.TensorProto{
			floatTensor("W1", []int64{2, 2}, 1, 2, 3, 4),
			floatTensor("B1", []int64{2}, 0.5, -0.5),
			floatTensor("W2", []int64{2, 2}, 5, 6, 7, 8),
		},
		Node: []*pb.NodeProto{
			graph.NewNode("MatMul", "", "mm1", []string{"x", "W1"}, []string{"h1"}),
			graph.NewNode("Add", "", "add1", []string{"h1", "B1"}, []string{"h2"}),
			graph.NewNode("Relu", "", "relu", []string{"h2"}, []string{"h3"}),
			graph.NewNode("Softmax", "", "sm", []string{"h3"}, []string{"h4"}, graph.IntAttr("axis", -1)),
			graph.NewNode("MatMul", "", "mm2", []string{"h4", "W2"}, []string{"y"}),
		},
		Output: []*pb.ValueInfoProto{tensorValue("y", pb.TensorProto_FLOAT, 2, 2)},
	}
}

func nodeNamed(g *pb.GraphProto, name string) *pb.NodeProto {
	for _, n := range g.Node {
		if n.GetName() == name {
			return n
		}
	}
	return nil
}

func names(refs []NodeRef) []string {
	out := []string{}
	for _, r := range refs {
		out = append(out, r.Name)
	}
	return out
}

func initNames(ts []Init) []string {
	out := []string{}
	for _, t := range ts {
		out = append(out, t.Name)
	}
	return out
}

// chain builds a synthetic model of n nodes: x -> (MatMul W_i -> Add B_i)*
// -> y, with distinct weights. changeAt >= 0 turns that Add into a Sub.
func chain(t testing.TB, n, changeAt int) *graph.Model {
	g := &pb.GraphProto{Name: proto.String("chain"),
		Input:  []*pb.ValueInfoProto{tensorValue("x", pb.TensorProto_FLOAT, 1, 4)},
		Output: []*pb.ValueInfoProto{tensorValue(fmt.Sprintf("v%d", n), pb.TensorProto_FLOAT, 1, 4)}}
	g.Node = make([]*pb.NodeProto, 0, n)
	prev := "x"
	for i := 0; i < n; i++ {
		out := fmt.Sprintf("v%d", i+1)
		w := fmt.Sprintf("w%d", i)
		if i%2 == 0 {
			vals := make([]float32, 16)
			for k := range vals {
				vals[k] = float32(i*16 + k)
			}
			g.Initializer = append(g.Initializer, floatTensor(w, []int64{4, 4}, vals...))
			g.Node = append(g.Node, graph.NewNode("MatMul", "", fmt.Sprintf("n%d", i), []string{prev, w}, []string{out}))
		} else {
			g.Initializer = append(g.Initializer, floatTensor(w, []int64{4}, float32(i), float32(i+1), float32(i+2), float32(i+3)))
			op := "Add"
			if i == changeAt {
				op = "Sub"
			}
			g.Node = append(g.Node, graph.NewNode(op, "", fmt.Sprintf("n%d", i), []string{prev, w}, []string{out}))
		}
		prev = out
	}
	return modelOf(t, g, nil)
}
