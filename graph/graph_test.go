package graph

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

func vinfo(n string) *pb.ValueInfoProto {
	return &pb.ValueInfoProto{Name: proto.String(n), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: proto.Int32(1)}}}}
}

func f32Init(name string, n int) *pb.TensorProto {
	return &pb.TensorProto{Name: proto.String(name), Dims: []int64{int64(n)}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), RawData: make([]byte, 4*n)}
}

func TestValidateNamesProblems(t *testing.T) {
	cases := []struct {
		name  string
		nodes []*pb.NodeProto
		want  string
	}{
		{"dangling input", []*pb.NodeProto{NewNode("Relu", "", "r", []string{"nowhere"}, []string{"y"})}, `node "r" (Relu) reads "nowhere"`},
		{"cycle", []*pb.NodeProto{
			NewNode("Add", "", "a", []string{"x", "c"}, []string{"b"}),
			NewNode("Relu", "", "loop", []string{"b"}, []string{"c"}),
			NewNode("Identity", "", "out", []string{"b"}, []string{"y"}),
		}, "cycle through node"},
		{"duplicate output", []*pb.NodeProto{
			NewNode("Relu", "", "first", []string{"x"}, []string{"y"}),
			NewNode("Relu", "", "second", []string{"x"}, []string{"y"}),
		}, `value "y" is produced by more than one node`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewGraph(&pb.GraphProto{Node: tc.nodes, Input: []*pb.ValueInfoProto{vinfo("x")}, Output: []*pb.ValueInfoProto{vinfo("y")}})
			errs := g.Validate()
			var msgs []string
			for _, e := range errs {
				msgs = append(msgs, e.Error())
			}
			if !strings.Contains(strings.Join(msgs, "\n"), tc.want) {
				t.Fatalf("errors %q do not contain %q", msgs, tc.want)
			}
		})
	}
	var ce *CycleError
	g := NewGraph(&pb.GraphProto{Node: cases[1].nodes, Input: []*pb.ValueInfoProto{vinfo("x")}, Output: []*pb.ValueInfoProto{vinfo("y")}})
	if _, err := g.TopoSort(); !errors.As(err, &ce) {
		t.Fatalf("TopoSort: %v, want a CycleError", err)
	}
}

func TestIROperations(t *testing.T) {
	gp := &pb.GraphProto{
		Node: []*pb.NodeProto{
			NewNode("Relu", "", "late", []string{"a"}, []string{"b"}), // file order: consumer first
			NewNode("Neg", "", "early", []string{"x"}, []string{"a"}),
			NewNode("Abs", "", "dead", []string{"x"}, []string{"unused"}),
			NewNode("Identity", "", "out", []string{"b"}, []string{"y"}),
		},
		Initializer: []*pb.TensorProto{f32Init("w_unused", 4)},
		Input:       []*pb.ValueInfoProto{vinfo("x")},
		Output:      []*pb.ValueInfoProto{vinfo("y")},
	}
	g := NewGraph(gp)
	if p := g.Producer("a"); p.GetName() != "early" {
		t.Fatalf("producer of a = %q", p.GetName())
	}
	if c := g.Consumers("x"); len(c) != 2 {
		t.Fatalf("x has %d consumers, want 2", len(c))
	}
	if err := g.Sort(); err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, n := range gp.Node {
		order = append(order, n.GetName())
	}
	if got := strings.Join(order, ","); got != "early,late,dead,out" {
		t.Fatalf("topological order %s", got)
	}
	if n := g.UniqueName("a"); n == "a" || g.UniqueName("a") == n {
		t.Fatalf("UniqueName returned a used name %q", n)
	}
	g.ReplaceAllUses("b", "a")
	if len(g.Consumers("a")) != 2 || gp.Node[3].Input[0] != "a" {
		t.Fatalf("ReplaceAllUses did not rewire: %v", gp.Node[3].Input)
	}
	nodes, inits := g.RemoveDeadCode()
	if nodes != 2 || inits != 1 { // "late" (now unused) and "dead"; "w_unused"
		t.Fatalf("dead code removed %d nodes, %d initializers; want 2, 1", nodes, inits)
	}
	if errs := g.Validate(); len(errs) != 0 {
		t.Fatalf("valid graph reported %v", errs)
	}
}

// modernModel builds an IR 10 model with the features a modern exporter
// writes, plus fields this build does not know (unknown fields).
func modernModel() *pb.ModelProto {
	fn := &pb.FunctionProto{Name: proto.String("F"), Domain: proto.String("custom"), Overload: proto.String("v2"),
		Input: []string{"a"}, Output: []string{"b"}, AttributeProto: []*pb.AttributeProto{FloatAttr("alpha", 0.5)},
		Node:        []*pb.NodeProto{NewNode("Relu", "", "", []string{"a"}, []string{"b"})},
		OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(21)}}}
	n := NewNode("F", "custom", "call", []string{"x"}, []string{"y"})
	n.Overload = proto.String("v2")
	typed := func(name string, dt pb.TensorProto_DataType, dims []int64, raw []byte) *pb.TensorProto {
		return &pb.TensorProto{Name: proto.String(name), Dims: dims, DataType: proto.Int32(int32(dt)), RawData: raw}
	}
	mp := &pb.ModelProto{
		IrVersion:     proto.Int64(10),
		ProducerName:  proto.String("test"),
		OpsetImport:   []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(21)}, {Domain: proto.String("custom"), Version: proto.Int64(1)}},
		MetadataProps: []*pb.StringStringEntryProto{{Key: proto.String("k"), Value: proto.String("v")}},
		Functions:     []*pb.FunctionProto{fn},
		Graph: &pb.GraphProto{Name: proto.String("g"), Node: []*pb.NodeProto{n},
			Input: []*pb.ValueInfoProto{vinfo("x")}, Output: []*pb.ValueInfoProto{vinfo("y")},
			Initializer: []*pb.TensorProto{
				typed("f8", pb.TensorProto_FLOAT8E4M3FN, []int64{4}, []byte{1, 2, 3, 4}),
				typed("i4", pb.TensorProto_INT4, []int64{4}, []byte{0x21, 0x43}),
				typed("bf16", pb.TensorProto_BFLOAT16, []int64{2}, []byte{0x80, 0x3f, 0, 0x40}),
			},
			SparseInitializer: []*pb.SparseTensorProto{{Values: typed("sv", pb.TensorProto_FLOAT, []int64{1}, make([]byte, 4)),
				Indices: &pb.TensorProto{Name: proto.String("si"), Dims: []int64{1}, DataType: proto.Int32(int32(pb.TensorProto_INT64)), Int64Data: []int64{3}}, Dims: []int64{8}}},
		},
		TrainingInfo: []*pb.TrainingInfoProto{{Algorithm: &pb.GraphProto{Name: proto.String("train")}}},
	}
	// Unknown fields: field 99 on the model and field 77 on the node.
	mp.ProtoReflect().SetUnknown(protowire.AppendString(protowire.AppendTag(nil, 99, protowire.BytesType), "future"))
	n.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 77, protowire.VarintType), 5))
	return mp
}

func TestModernModelSurvives(t *testing.T) {
	mp := modernModel()
	b, err := proto.Marshal(mp)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Parse(b, "modern.onnx")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "modern.onnx")
	if err := m.Save(path, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	back, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(mp, back.Proto) {
		t.Fatal("model changed through load and save")
	}
	if len(back.Proto.ProtoReflect().GetUnknown()) == 0 || len(back.Proto.Graph.Node[0].ProtoReflect().GetUnknown()) == 0 {
		t.Fatal("unknown fields were dropped")
	}
}

func TestExternalDataRoundTripAndLazy(t *testing.T) {
	dir := t.TempDir()
	mp := &pb.ModelProto{IrVersion: proto.Int64(10), OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}},
		Graph: &pb.GraphProto{Name: proto.String("g"), Node: []*pb.NodeProto{NewNode("Add", "", "add", []string{"x", "big"}, []string{"y"})},
			Input: []*pb.ValueInfoProto{vinfo("x")}, Output: []*pb.ValueInfoProto{vinfo("y")}}}
	for i, n := range []int{1 << 18, 1 << 16, 3} {
		t0 := f32Init([]string{"big", "mid", "tiny"}[i], n)
		for j := range t0.RawData {
			t0.RawData[j] = byte(j*7 + i)
		}
		mp.Graph.Initializer = append(mp.Graph.Initializer, t0)
	}
	src := &Model{Proto: mp, Dir: dir}
	path := filepath.Join(dir, "m.onnx")
	if err := src.Save(path, SaveOptions{External: ExternalRepack}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + ".data"); err != nil {
		t.Fatal("no side file written")
	}
	m, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !IsExternal(m.Proto.Graph.Initializer[0]) || IsExternal(m.Proto.Graph.Initializer[2]) {
		t.Fatal("repack should move the big initializers out and keep the tiny one inline")
	}
	// Summaries and graph walks read no weight bytes.
	m.Graph().OpCensus()
	for _, t0 := range m.Proto.Graph.Initializer {
		ByteSize(DataType(t0), t0.GetDims())
	}
	if n := m.ExternalBytesRead(); n != 0 {
		t.Fatalf("loading and summarising read %d external bytes", n)
	}
	got, err := m.TensorBytes(m.Proto.Graph.Initializer[1])
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(mp.Graph.Initializer[1].RawData) {
		t.Fatal("external bytes differ")
	}
	if n := m.ExternalBytesRead(); n != int64(len(got)) {
		t.Fatalf("reading one tensor read %d bytes, want exactly %d (a ranged read)", n, len(got))
	}
	// Inline again and compare with the original.
	out := filepath.Join(dir, "inline.onnx")
	if err := m.Save(out, SaveOptions{External: ExternalInline}); err != nil {
		t.Fatal(err)
	}
	m2, err := Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(m2.Proto, mp) {
		t.Fatal("external -> inline did not restore the original model")
	}
}

func TestExternalLocationEscapes(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "w.bin"), make([]byte, 16), 0o644)
	os.Symlink(filepath.Join(outside, "w.bin"), filepath.Join(dir, "link.bin"))
	for _, loc := range []string{"../w.bin", "/etc/passwd", "link.bin", "missing.bin"} {
		tp := &pb.TensorProto{Name: proto.String("w"), Dims: []int64{4}, DataType: proto.Int32(1), DataLocation: pb.TensorProto_EXTERNAL.Enum(),
			ExternalData: []*pb.StringStringEntryProto{{Key: proto.String("location"), Value: proto.String(loc)}}}
		m := &Model{Proto: &pb.ModelProto{}, Path: filepath.Join(dir, "m.onnx"), Dir: dir, ext: newExternalStore(dir, "m.onnx")}
		_, err := m.TensorBytes(tp)
		if err == nil || !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), `"w"`) {
			t.Errorf("location %q: %v; want a bad-input error naming the tensor", loc, err)
		}
	}
}
