package graph

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

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
	for f, b := range fixtureFiles(t) {
		m, err := Parse(b, f)
		if err != nil {
			t.Fatal(err)
		}
		streamCheck(t, f, m.Proto)
	}
}

// fixtureFiles returns the bytes of the repository's real exports
// (testdata/fixtures and testdata/exported) by path.
func fixtureFiles(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
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
			out[f] = b
		}
	}
	return out
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

// nonCanonical is an encoding no marshaller writes but a decoder must take
// as proto.Unmarshal does: fields out of order, a singular message given
// twice (merged), raw_data given twice (the last wins, large or small),
// nodes between initializers, overlong varints, unknown fields of every
// wire type, and a known field of the wrong wire type.
func nonCanonical() []byte {
	tensor := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	field := func(num protowire.Number, b []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), b)
	}
	varint := func(num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), v)
	}
	node := func(op string) []byte { return field(1, field(4, []byte(op))) }
	t1 := tensor(field(9, filled(100<<10, 1)), field(8, []byte("t1")), varint(2, 2), field(9, []byte{1, 2, 3}))
	t2 := tensor(field(9, []byte{4}), field(8, []byte("t2")), field(9, filled(90<<10, 2)), varint(1, 5), varint(1, 6))
	t3 := tensor(field(8, []byte("t3")), field(9, []byte{}), protowire.AppendFixed32(protowire.AppendTag(nil, 77, protowire.Fixed32Type), 9),
		protowire.AppendFixed64(protowire.AppendTag(nil, 78, protowire.Fixed64Type), 10), varint(8, 3))
	g1 := tensor(node("A"), field(5, t1), node("B"), field(5, t3), field(2, []byte("g")), field(5, t2), field(1000, filled(70<<10, 3)))
	g2 := tensor(field(2, []byte("g2")), node("C"), field(5, t1))
	overlong := []byte{0x08, 0x88, 0x80, 0x80, 0x00} // ir_version 8 in five bytes
	return tensor(field(7, g1), varint(2, 1), overlong, field(7, g2), varint(7, 4), field(8, tensor(varint(2, 18))))
}

// TestUnmarshalFromMatchesUnmarshal decodes models with unmarshalFrom at
// several thresholds and compares the result with proto.Unmarshal's.
func TestUnmarshalFromMatchesUnmarshal(t *testing.T) {
	inputs := map[string][]byte{"non-canonical": nonCanonical()}
	for name, mp := range streamModels() {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(mp)
		if err != nil {
			t.Fatal(err)
		}
		inputs[name] = b
	}
	maps.Copy(inputs, fixtureFiles(t))
	defer func(v int) { streamBig = v }(streamBig)
	for name, b := range inputs {
		want := &pb.ModelProto{}
		if err := proto.Unmarshal(b, want); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, big := range []int{64 << 10, 1000, 1, 0} {
			streamBig = big
			got := &pb.ModelProto{}
			if err := unmarshalFrom(bytes.NewReader(b), int64(len(b)), got); err != nil {
				t.Fatalf("%s (threshold %d): %v", name, big, err)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("%s (threshold %d): decoded model differs from proto.Unmarshal's", name, big)
			}
			// The same bytes from a stream of unknown size.
			got = &pb.ModelProto{}
			if err := unmarshalStream(iotest.OneByteReader(bytes.NewReader(b)), MaxReadSize, got); err != nil {
				t.Fatalf("%s (threshold %d), streamed: %v", name, big, err)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("%s (threshold %d): model decoded from a stream differs from proto.Unmarshal's", name, big)
			}
		}
		if strings.HasSuffix(name, ".onnx") {
			m, err := Load(name)
			if err != nil || !proto.Equal(m.Proto, want) {
				t.Fatalf("%s: Load gives another model than proto.Unmarshal (%v)", name, err)
			}
		}
	}
}

// TestUnmarshalFromGivesUp checks that malformed or changing input is left
// to proto.Unmarshal (errNotStreamed), and that Load then reports what
// reading the file whole and parsing it reports.
func TestUnmarshalFromGivesUp(t *testing.T) {
	good, err := proto.MarshalOptions{Deterministic: true}.Marshal(streamModels()["full"])
	if err != nil {
		t.Fatal(err)
	}
	group := protowire.AppendTag(nil, 3, protowire.StartGroupType)
	group = protowire.AppendTag(group, 3, protowire.EndGroupType)
	cases := map[string]struct {
		b    []byte
		size int64
	}{
		"truncated in a large field": {good[:len(good)/2], int64(len(good) / 2)},
		"truncated in a tag":         {append(good[:len(good):len(good)], 0x80), int64(len(good) + 1)},
		"shorter than its size":      {good, int64(len(good) + 1)},
		"longer than its size":       {good, int64(len(good) - 1)},
		"length past the end":        {protowire.AppendVarint(protowire.AppendTag(nil, 7, protowire.BytesType), 1<<40), 11},
		"field number 0":             {[]byte{0x02, 0x00}, 2},
		"group":                      {group, int64(len(group))},
		"invalid wire type":          {[]byte{0x0f}, 1},
		"bad small field":            {[]byte{0x3a, 0x02, 0x0a, 0x05}, 4}, // a graph whose node overruns it
	}
	dir := t.TempDir()
	for name, c := range cases {
		if err := unmarshalFrom(bytes.NewReader(c.b), c.size, &pb.ModelProto{}); !errors.Is(err, errNotStreamed) {
			t.Errorf("%s: %v, want errNotStreamed", name, err)
		}
		if int64(len(c.b)) != c.size {
			continue
		}
		path := filepath.Join(dir, "m.onnx")
		if err := os.WriteFile(path, c.b, 0o644); err != nil {
			t.Fatal(err)
		}
		_, lerr := Load(path)
		// What Load said before it streamed: the bytes read, then parsed.
		b, perr := ReadModelBytes(bytes.NewReader(c.b), path)
		if perr == nil {
			_, perr = Parse(b, path)
		}
		if lerr == nil || perr == nil || lerr.Error() != perr.Error() {
			t.Errorf("%s: Load says %v, reading and parsing says %v", name, lerr, perr)
		}
	}
}

// FuzzUnmarshalFrom: whatever the bytes, unmarshalFrom (every message and
// bytes field streamed) either gives up or decodes what proto.Unmarshal
// decodes, and marshalTo writes back the deterministic encoding.
func FuzzUnmarshalFrom(f *testing.F) {
	f.Add(fuzzSeedModel(false))
	f.Add(fuzzSeedModel(true))
	f.Add(nonCanonical()[:4000])
	f.Fuzz(func(t *testing.T, b []byte) {
		defer func(v int) { streamBig = v }(streamBig)
		streamBig = 1
		want := &pb.ModelProto{}
		werr := proto.Unmarshal(b, want)
		got := &pb.ModelProto{}
		err := unmarshalFrom(bytes.NewReader(b), int64(len(b)), got)
		sgot := &pb.ModelProto{}
		serr := unmarshalStream(bytes.NewReader(b), MaxReadSize, sgot)
		if (serr == nil) != (err == nil) || serr != nil && !errors.Is(serr, errMalformed) {
			t.Fatalf("from a stream: %v; from a file: %v", serr, err)
		}
		if serr == nil && !proto.Equal(sgot, got) {
			t.Fatal("decoded from a stream, another model than from a file")
		}
		if err != nil {
			if !errors.Is(err, errNotStreamed) {
				t.Fatalf("error %v, want errNotStreamed", err)
			}
			return
		}
		if werr != nil {
			t.Fatalf("streamed decoding took what proto.Unmarshal refuses (%v)", werr)
		}
		if !proto.Equal(got, want) {
			t.Fatal("decoded model differs from proto.Unmarshal's")
		}
		enc, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if err := marshalTo(&buf, want, proto.Size(want)); err != nil || !bytes.Equal(buf.Bytes(), enc) {
			t.Fatalf("marshalTo: %v, or bytes differ from the deterministic encoding", err)
		}
	})
}

// nested is a model whose graphs nest through If-like attributes until
// levels messages are nested below the ModelProto.
func nested(levels int) []byte {
	field := func(num protowire.Number, b []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), b)
	}
	var b []byte // the innermost message, empty
	// Below the model: graph, node, attribute, graph, node, ... (the
	// field that holds each level in the one above it).
	holder := []protowire.Number{1, 5, 6} // node in graph, attribute in node, graph in attribute
	for level := levels; level > 1; level-- {
		b = field(holder[(level-2)%3], b)
	}
	return field(7, b)
}

// TestUnmarshalFromNestingLimit: nesting allowed by proto.Unmarshal decodes
// alike, nesting beyond its limit is left to it, at every threshold.
func TestUnmarshalFromNestingLimit(t *testing.T) {
	defer func(v int) { streamBig = v }(streamBig)
	for _, levels := range []int{protowire.DefaultRecursionLimit - 1, protowire.DefaultRecursionLimit, protowire.DefaultRecursionLimit + 5} {
		b := nested(levels)
		want := &pb.ModelProto{}
		werr := proto.Unmarshal(b, want)
		for _, big := range []int{64 << 10, 1000, 0} {
			streamBig = big
			got := &pb.ModelProto{}
			err := unmarshalFrom(bytes.NewReader(b), int64(len(b)), got)
			switch {
			case werr != nil && !errors.Is(err, errNotStreamed):
				t.Errorf("%d levels (threshold %d): proto.Unmarshal says %v, unmarshalFrom %v", levels, big, werr, err)
			case werr == nil && (err != nil || !proto.Equal(got, want)):
				t.Errorf("%d levels (threshold %d): %v, or another model than proto.Unmarshal's", levels, big, err)
			}
		}
	}
}

// TestSaveToFIFO: a model saved to a named pipe streams to its reader
// byte for byte as the deterministic marshaller encodes it; a save that
// fails before its first byte never opens the pipe (a writer's open would
// wait for a reader: the test would time out).
func TestSaveToFIFO(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "out")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip(err)
	}
	mp := streamModels()["one big"]
	mp.IrVersion, mp.OpsetImport = proto.Int64(10), []*pb.OperatorSetIdProto{{Version: proto.Int64(18)}}
	mp.Graph.Output = []*pb.ValueInfoProto{{Name: proto.String("w")}}
	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(mp)
	if err != nil {
		t.Fatal(err)
	}
	m := &Model{Proto: mp, Path: "mem", Dir: "."}
	m.ext = newExternalStore(".", "mem")
	got := make(chan []byte, 1)
	go func() {
		f, err := os.Open(fifo)
		if err != nil {
			got <- nil
			return
		}
		defer f.Close()
		b, _ := io.ReadAll(f)
		got <- b
	}()
	if err := m.Save(fifo, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the pipe's reader got %d bytes, want the %d-byte deterministic encoding", len(b), len(want))
	}
	// A deferred tensor whose producer fails fails the save after the
	// checks, while the tensors are gathered, before anything is written.
	bad, w := deferredModel(16, nil)
	errProducer := errors.New("producer failed")
	bad.SetDeferred(w, DeferredData{Size: 64, Write: func(io.Writer) error { return errProducer }})
	done := make(chan error, 1)
	go func() { done <- bad.Save(fifo, SaveOptions{}) }()
	select {
	case err := <-done:
		if !errors.Is(err, errProducer) {
			t.Fatalf("saving to a pipe with a failing producer: %v, want the producer's error", err)
		}
	case <-time.After(10 * time.Second):
		f, _ := os.Open(fifo) // let the blocked open go
		f.Close()
		t.Fatal("saving an invalid model opened the pipe")
	}
}

// TestRead: a model read from a stream of unknown size (a pipe) is the one
// its bytes parse to; a stream cut short, holding no model, failing while
// read, or longer than the limit gets an error saying which, naming the
// stream.
func TestRead(t *testing.T) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(streamModels()["full"])
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	go func() {
		pw.Write(b)
		pw.Close()
	}()
	m, err := Read(pr, "-")
	if err != nil {
		t.Fatal(err)
	}
	want, err := Parse(b, "-")
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(m.Proto, want.Proto) {
		t.Fatal("the model read from a pipe differs from the one its bytes parse to")
	}
	boom := errors.New("device gone")
	for _, c := range []struct {
		name string
		r    io.Reader
		msg  string
		is   error
	}{
		{"cut short", bytes.NewReader(b[:len(b)-3]), "not a valid ONNX protobuf", errMalformed},
		{"no model", bytes.NewReader([]byte{0x0f, 1, 2, 3}), "not a valid ONNX protobuf", nil},
		{"read error", io.MultiReader(bytes.NewReader(b[:len(b)/2]), iotest.ErrReader(boom)), "cannot read model", boom},
	} {
		_, err := Read(c.r, "in")
		var ie *InputError
		if !errors.As(err, &ie) || ie.File != "in" || !strings.Contains(err.Error(), c.msg) || c.is != nil && !errors.Is(err, c.is) {
			t.Errorf("%s: %v, want an input error on %q saying %q", c.name, err, "in", c.msg)
		}
	}
	for _, over := range []int{1, 100, len(b) / 2} {
		if err := unmarshalStream(bytes.NewReader(b), int64(len(b)-over), &pb.ModelProto{}); !errors.Is(err, ErrTooBig) {
			t.Errorf("%d bytes over the limit: %v, want ErrTooBig", over, err)
		}
	}
	// A stream cut short whose field claims to run past the limit is cut
	// short, not too big.
	if err := unmarshalStream(bytes.NewReader(b[:len(b)/4]), int64(len(b)/2), &pb.ModelProto{}); !errors.Is(err, errMalformed) {
		t.Errorf("cut short before the limit a field claims to pass: %v, want errMalformed", err)
	}
	if err := unmarshalStream(bytes.NewReader(b), int64(len(b)), &pb.ModelProto{}); err != nil {
		t.Errorf("at the limit: %v", err)
	}
}
