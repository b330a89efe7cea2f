package graph

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/fixtures"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// filled returns n bytes counting up from seed.
func filled(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i)
	}
	return b
}

// withUnknown gives m unknown fields: one whose number lies between the
// known ones and one a known number of the wrong wire type, which the
// marshaller must place after every known field.
func withUnknown[M proto.Message](m M, num protowire.Number) M {
	var u []byte
	u = protowire.AppendTag(u, num, protowire.VarintType)
	u = protowire.AppendVarint(u, 7)
	u = protowire.AppendTag(u, 1000, protowire.BytesType)
	u = protowire.AppendBytes(u, []byte("unknown"))
	m.ProtoReflect().SetUnknown(u)
	return m
}

func bigTensor(name string, n int, seed byte) *pb.TensorProto {
	return &pb.TensorProto{Name: proto.String(name), Dims: []int64{int64(n)}, DataType: proto.Int32(int32(pb.TensorProto_UINT8)),
		RawData: filled(n, seed), DocString: proto.String("after raw_data"),
		MetadataProps: []*pb.StringStringEntryProto{{Key: proto.String("k"), Value: proto.String("v")}}}
}

// streamModels are synthetic models covering what the streaming encoder
// splits: raw_data of every size (absent, empty, small, large), the fields
// before and after it, tensors in attributes, subgraphs, functions, sparse
// initializers, training_info, external-data references, typed values with
// oneofs, and unknown fields at every level.
func streamModels() map[string]*pb.ModelProto {
	vi := func(name string) *pb.ValueInfoProto {
		return &pb.ValueInfoProto{Name: proto.String(name), Type: &pb.TypeProto{Denotation: proto.String("d"),
			Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: proto.Int32(1),
				Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{
					{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: 3}},
					{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "n"}}}}}}}}
	}
	sub := func(seed byte) *pb.GraphProto {
		return withUnknown(&pb.GraphProto{Name: proto.String("body"),
			Node:        []*pb.NodeProto{NewNode("Identity", "", "i", []string{"b"}, []string{"o"})},
			Initializer: []*pb.TensorProto{bigTensor("b", 200<<10, seed), {Name: proto.String("small"), RawData: []byte{1, 2}}},
			Output:      []*pb.ValueInfoProto{vi("o")}}, 3)
	}
	full := &pb.ModelProto{
		IrVersion: proto.Int64(10), ProducerName: proto.String("p"), ProducerVersion: proto.String("1"),
		Domain: proto.String("dom"), ModelVersion: proto.Int64(2), DocString: proto.String("doc"),
		OpsetImport:   []*pb.OperatorSetIdProto{{Version: proto.Int64(18)}, {Domain: proto.String("com.x"), Version: proto.Int64(1)}},
		MetadataProps: []*pb.StringStringEntryProto{{Key: proto.String("a"), Value: proto.String("b")}},
		Graph: withUnknown(&pb.GraphProto{
			Name: proto.String("main"), DocString: proto.String("graph doc"),
			Node: []*pb.NodeProto{
				{OpType: proto.String("Constant"), Output: []string{"c"}, Attribute: []*pb.AttributeProto{
					{Name: proto.String("value"), Type: pb.AttributeProto_TENSOR.Enum(), T: bigTensor("cv", 300<<10, 9)}}},
				{OpType: proto.String("If"), Input: []string{"x"}, Output: []string{"y"}, Attribute: []*pb.AttributeProto{
					{Name: proto.String("then_branch"), Type: pb.AttributeProto_GRAPH.Enum(), G: sub(1)},
					{Name: proto.String("else_branch"), Type: pb.AttributeProto_GRAPH.Enum(), G: sub(2)}}},
				{OpType: proto.String("Custom"), Domain: proto.String("com.x"), Attribute: []*pb.AttributeProto{
					{Name: proto.String("gs"), Type: pb.AttributeProto_GRAPHS.Enum(), Graphs: []*pb.GraphProto{sub(3), sub(4)}},
					{Name: proto.String("ts"), Type: pb.AttributeProto_TENSORS.Enum(), Tensors: []*pb.TensorProto{bigTensor("t1", 70<<10, 5), {Name: proto.String("t2")}}},
					{Name: proto.String("s"), Type: pb.AttributeProto_STRING.Enum(), S: filled(100<<10, 3)},
					{Name: proto.String("f"), F: proto.Float32(1.5), Floats: []float32{1, 2}, Ints: []int64{-1, 5}}}},
			},
			Initializer: []*pb.TensorProto{
				withUnknown(bigTensor("w0", 1<<20, 0), 15),
				{Name: proto.String("empty"), RawData: []byte{}, DataType: proto.Int32(2)},
				{Name: proto.String("floats"), DataType: proto.Int32(1), Dims: []int64{3}, FloatData: []float32{1, 2, 3}},
				{Name: proto.String("big_floats"), DataType: proto.Int32(1), Dims: []int64{1 << 15}, FloatData: make([]float32, 1<<15)},
				{Name: proto.String("strs"), DataType: proto.Int32(8), StringData: [][]byte{[]byte("a"), filled(80<<10, 1)}},
				{Name: proto.String("i64"), DataType: proto.Int32(7), Int64Data: []int64{-1, 1 << 40}, DoubleData: []float64{0.5}, Uint64Data: []uint64{3}, Int32Data: []int32{-4}},
				{Name: proto.String("ext"), DataType: proto.Int32(1), Dims: []int64{4}, DataLocation: pb.TensorProto_EXTERNAL.Enum(),
					ExternalData: []*pb.StringStringEntryProto{{Key: proto.String("location"), Value: proto.String("m.data")},
						{Key: proto.String("offset"), Value: proto.String("0")}, {Key: proto.String("length"), Value: proto.String("16")}}},
				{Name: proto.String("seg"), Segment: &pb.TensorProto_Segment{Begin: proto.Int64(0), End: proto.Int64(4)}, RawData: filled(64<<10, 7)},
				bigTensor("w1", (64<<10)-1, 4),
			},
			SparseInitializer: []*pb.SparseTensorProto{{Values: bigTensor("sv", 128<<10, 8),
				Indices: &pb.TensorProto{Name: proto.String("si"), Int64Data: []int64{1, 2}}, Dims: []int64{1 << 20}}},
			Input: []*pb.ValueInfoProto{vi("x")}, Output: []*pb.ValueInfoProto{vi("y")}, ValueInfo: []*pb.ValueInfoProto{vi("c")},
			QuantizationAnnotation: []*pb.TensorAnnotation{{TensorName: proto.String("w0")}},
			MetadataProps:          []*pb.StringStringEntryProto{{Key: proto.String("g"), Value: proto.String("h")}},
		}, 3),
		TrainingInfo: []*pb.TrainingInfoProto{{Initialization: sub(5), Algorithm: sub(6)}},
		Functions: []*pb.FunctionProto{{Name: proto.String("fn"), Domain: proto.String("com.x"), Input: []string{"a"}, Output: []string{"b"},
			Node: []*pb.NodeProto{{OpType: proto.String("Constant"), Output: []string{"b"}, Attribute: []*pb.AttributeProto{
				{Name: proto.String("value"), T: bigTensor("fc", 90<<10, 6)}}}}}},
	}
	withUnknown(full, 9)
	return map[string]*pb.ModelProto{
		"empty":        {},
		"graph only":   {Graph: &pb.GraphProto{}},
		"no raw data":  {IrVersion: proto.Int64(8), Graph: &pb.GraphProto{Initializer: []*pb.TensorProto{{Name: proto.String("f"), FloatData: []float32{1}}}}},
		"one big":      {IrVersion: proto.Int64(8), Graph: &pb.GraphProto{Initializer: []*pb.TensorProto{bigTensor("w", 1<<20, 1)}}},
		"unknown only": withUnknown(&pb.ModelProto{}, 3),
		"full":         full,
	}
}

// streamCheck compares marshalTo's bytes with the deterministic marshaller's
// at several thresholds (0 and 1 stream every message field by field).
func streamCheck(t *testing.T, name string, mp *pb.ModelProto) {
	t.Helper()
	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(mp)
	if err != nil {
		t.Fatal(err)
	}
	defer func(v int) { streamBig = v }(streamBig)
	for _, big := range []int{64 << 10, 1000, 1, 0} {
		streamBig = big
		var buf bytes.Buffer
		if err := marshalTo(&buf, mp, proto.Size(mp)); err != nil {
			t.Fatalf("%s (threshold %d): %v", name, big, err)
		}
		if !bytes.Equal(buf.Bytes(), want) {
			t.Fatalf("%s (threshold %d): streamed %d bytes differ from the %d marshalled", name, big, buf.Len(), len(want))
		}
	}
}

func TestMarshalToMatchesDeterministicMarshal(t *testing.T) {
	for name, mp := range streamModels() {
		streamCheck(t, name, mp)
	}
	for _, dir := range []string{fixtures.Dir(), fixtures.Path("exported")} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.onnx"))
		if len(files) == 0 {
			t.Fatalf("no models in %s", dir)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			m, err := Parse(b, f)
			if err != nil {
				t.Fatal(err)
			}
			streamCheck(t, f, m.Proto)
		}
	}
}

// failWriter fails every write after the first n bytes.
type failWriter struct{ n int }

var errWriteFull = errors.New("device full")

func (w *failWriter) Write(p []byte) (int, error) {
	if len(p) > w.n {
		k := w.n
		w.n = 0
		return k, errWriteFull
	}
	w.n -= len(p)
	return len(p), nil
}

func TestMarshalToErrors(t *testing.T) {
	mp := streamModels()["full"]
	size := proto.Size(mp)
	for _, n := range []int{0, 10, 100 << 10, size - 1} {
		if err := marshalTo(&failWriter{n: n}, mp, size); !errors.Is(err, errWriteFull) {
			t.Errorf("write failing after %d bytes: %v, want the writer's error", n, err)
		}
	}
	if err := marshalTo(&failWriter{n: size}, mp, size); err != nil {
		t.Errorf("write of exactly %d bytes: %v", size, err)
	}
	// A size that does not match what is encoded is an error, not a
	// silently different file.
	if err := marshalTo(&bytes.Buffer{}, mp, size+1); err == nil {
		t.Error("size mismatch not reported")
	}
}

// TestSaveStreamsCanonicalBytes checks what Save and Encode write for models
// whose tensors are swapped while writing (deferred, external, inlined):
// the files decode to the expected model and are its deterministic encoding.
func TestSaveStreamsCanonicalBytes(t *testing.T) {
	dir := t.TempDir()
	canonical := func(path string, b []byte) *pb.ModelProto {
		t.Helper()
		mp := &pb.ModelProto{}
		if err := proto.Unmarshal(b, mp); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(mp)
		if err != nil || !bytes.Equal(want, b) {
			t.Fatalf("%s: %d bytes written are not the deterministic encoding of what they hold (%v)", path, len(b), err)
		}
		return mp
	}
	m, _ := deferredModel(100<<10, nil) // 400 KiB produced at save time
	for _, mode := range []ExternalMode{ExternalKeep, ExternalRepack, ExternalInline} {
		path := filepath.Join(dir, "m.onnx")
		if err := m.Save(path, SaveOptions{External: mode, Threshold: 1 << 20}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got := canonical(path, b)
		if raw := got.Graph.Initializer[0].RawData; len(raw) != 400<<10 {
			t.Fatalf("mode %d: deferred tensor saved with %d inline bytes", mode, len(raw))
		}
	}
	// Repacked to a side file, then inlined again through Encode.
	path := filepath.Join(dir, "ext.onnx")
	if err := m.Save(path, SaveOptions{External: ExternalRepack}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := canonical(path, b); !IsExternal(got.Graph.Initializer[0]) {
		t.Fatal("repacked tensor is not external")
	}
	ext, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ext.Close()
	var buf bytes.Buffer
	if err := ext.Encode(&buf, SaveOptions{External: ExternalInline}); err != nil {
		t.Fatal(err)
	}
	if got := canonical("stream", buf.Bytes()); len(got.Graph.Initializer[0].RawData) != 400<<10 {
		t.Fatal("inlined stream lost the tensor's bytes")
	}
}
