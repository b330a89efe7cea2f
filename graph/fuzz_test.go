package graph

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// fuzzSeedModel is a small valid model with inline, typed and external
// initializers (the external one in side.bin).
func fuzzSeedModel(external bool) []byte {
	mp := &pb.ModelProto{IrVersion: proto.Int64(10), OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}},
		Graph: &pb.GraphProto{Name: proto.String("g"),
			Node: []*pb.NodeProto{
				NewNode("Add", "", "add", []string{"x", "w"}, []string{"s"}),
				NewNode("MatMul", "", "mm", []string{"s", "m"}, []string{"t"}),
				NewNode("If", "", "if", []string{"c"}, []string{"y"}, &pb.AttributeProto{Name: proto.String("then_branch"), Type: pb.AttributeProto_GRAPH.Enum(),
					G: &pb.GraphProto{Node: []*pb.NodeProto{NewNode("Identity", "", "id", []string{"t"}, []string{"o"})}, Output: []*pb.ValueInfoProto{vinfo("o")}}}),
			},
			Initializer: []*pb.TensorProto{
				f32Init("w", 4),
				{Name: proto.String("m"), Dims: []int64{4, 4}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), FloatData: make([]float32, 16)},
				{Name: proto.String("c"), Dims: []int64{}, DataType: proto.Int32(int32(pb.TensorProto_BOOL)), Int32Data: []int32{1}},
			},
			Input: []*pb.ValueInfoProto{vinfo("x")}, Output: []*pb.ValueInfoProto{vinfo("y")}}}
	if external {
		mp.Graph.Initializer[1] = &pb.TensorProto{Name: proto.String("m"), Dims: []int64{4, 4}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)),
			DataLocation: pb.TensorProto_EXTERNAL.Enum(), ExternalData: []*pb.StringStringEntryProto{
				{Key: proto.String("location"), Value: proto.String("side.bin")},
				{Key: proto.String("offset"), Value: proto.String("64")},
				{Key: proto.String("length"), Value: proto.String("64")}}}
	}
	b, _ := proto.Marshal(mp)
	return b
}

// FuzzParse feeds arbitrary bytes to the loader and, when they parse, to
// Check, TensorBytes of every initializer, the graph index and a
// marshal/parse round trip. Every failure must be a bad-input error; nothing
// may panic.
func FuzzParse(f *testing.F) {
	dir := f.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "side.bin"), bytes.Repeat([]byte{1, 2, 3, 4}, 64), 0o644); err != nil {
		f.Fatal(err)
	}
	f.Add(fuzzSeedModel(false))
	f.Add(fuzzSeedModel(true))
	f.Add([]byte{})
	f.Add([]byte("\x08\x0a\x3a\x00"))
	if b, err := os.ReadFile("../testdata/example/mixtral_block_dynamo_batched_mm.onnx"); err == nil {
		f.Add(b)
	}
	name := filepath.Join(dir, "fuzz.onnx")
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Parse(b, name)
		if err != nil {
			if !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), name) {
				t.Fatalf("Parse error is not a bad-input error naming the file: %v", err)
			}
			return
		}
		defer m.Close()
		g := m.Graph()
		g.OpCensus()
		if _, err := g.TopoSort(); err != nil {
			var ce *CycleError
			if !errors.As(err, &ce) {
				t.Fatalf("TopoSort: %v", err)
			}
		}
		checkErr := m.Check()
		if checkErr != nil && !errors.Is(checkErr, ErrBadInput) {
			t.Fatalf("Check error is not a bad-input error: %v", checkErr)
		}
		external := false
		for _, tp := range allInitializers(m.Proto) {
			external = external || IsExternal(tp)
			_, err := m.TensorBytes(tp)
			if err != nil && !errors.Is(err, ErrBadInput) {
				t.Fatalf("TensorBytes(%q): not a bad-input error: %v", tp.GetName(), err)
			}
			if err != nil && checkErr == nil && DataType(tp) != pb.TensorProto_STRING && ElemBits(DataType(tp)) > 0 && (ElemBits(DataType(tp)) >= 4 || len(tp.RawData) > 0) {
				t.Fatalf("Check passed but TensorBytes(%q) fails: %v", tp.GetName(), err)
			}
		}
		if external {
			return
		}
		b2, err := m.Marshal()
		if err != nil {
			t.Fatalf("Marshal of a parsed model: %v", err)
		}
		m2, err := Parse(b2, name)
		if err != nil {
			t.Fatalf("re-parse of a marshalled model: %v", err)
		}
		if !proto.Equal(m.Proto, m2.Proto) {
			t.Fatal("marshal/parse round trip changed the model")
		}
	})
}

// FuzzExternalLocation resolves arbitrary external-data locations, offsets
// and lengths against a model folder that holds a side file, a subfolder, a
// symlink inside and symlinks leading out. A read either fails with a
// bad-input error or returns bytes from inside the folder, never from the
// file outside (all 0xEE bytes), whatever the location says.
func FuzzExternalLocation(f *testing.F) {
	root := f.TempDir()
	modelDir := filepath.Join(root, "model")
	os.MkdirAll(filepath.Join(modelDir, "sub"), 0o755)
	inside := make([]byte, 256)
	for i := range inside {
		inside[i] = byte(i % 200)
	}
	os.WriteFile(filepath.Join(root, "outside.bin"), bytes.Repeat([]byte{0xEE}, 256), 0o644)
	os.WriteFile(filepath.Join(modelDir, "w.bin"), inside, 0o644)
	os.WriteFile(filepath.Join(modelDir, "sub", "v.bin"), inside, 0o644)
	os.Symlink("../outside.bin", filepath.Join(modelDir, "out_link.bin"))
	os.Symlink(filepath.Join(root, "outside.bin"), filepath.Join(modelDir, "abs_link.bin"))
	os.Symlink("w.bin", filepath.Join(modelDir, "in_link.bin"))
	os.Symlink("..", filepath.Join(modelDir, "up"))
	os.Symlink("sub", filepath.Join(modelDir, "sub_link"))
	for _, s := range []struct {
		loc, off, length string
		n                uint8
	}{
		{"w.bin", "0", "16", 16}, {"sub/v.bin", "8", "", 0}, {"in_link.bin", "", "", 255}, {"../outside.bin", "", "", 16},
		{"out_link.bin", "", "", 16}, {"abs_link.bin", "0", "16", 16}, {"up/outside.bin", "", "", 16}, {"sub_link/../../outside.bin", "", "", 16},
		{root + "/outside.bin", "", "", 16}, {"sub/../w.bin", "250", "6", 6}, {`..\outside.bin`, "", "", 16}, {"./w.bin", "9223372036854775807", "1", 1},
	} {
		f.Add(s.loc, s.off, s.length, s.n)
	}
	f.Fuzz(func(t *testing.T, loc, off, length string, n uint8) {
		kv := []*pb.StringStringEntryProto{{Key: proto.String("location"), Value: proto.String(loc)}}
		if off != "" {
			kv = append(kv, &pb.StringStringEntryProto{Key: proto.String("offset"), Value: proto.String(off)})
		}
		if length != "" {
			kv = append(kv, &pb.StringStringEntryProto{Key: proto.String("length"), Value: proto.String(length)})
		}
		tp := &pb.TensorProto{Name: proto.String("w"), Dims: []int64{int64(n)}, DataType: proto.Int32(int32(pb.TensorProto_UINT8)),
			DataLocation: pb.TensorProto_EXTERNAL.Enum(), ExternalData: kv}
		m := &Model{Proto: &pb.ModelProto{}, Path: filepath.Join(modelDir, "m.onnx"), Dir: modelDir, ext: newExternalStore(modelDir, "m.onnx")}
		defer m.Close()
		b, err := m.TensorBytes(tp)
		if err != nil {
			if !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), `initializer "w"`) {
				t.Fatalf("location %q: error is not a bad-input error naming the tensor: %v", loc, err)
			}
			return
		}
		if len(b) != int(n) {
			t.Fatalf("location %q: %d bytes for dims [%d]", loc, len(b), n)
		}
		if bytes.IndexByte(b, 0xEE) >= 0 {
			t.Fatalf("location %q (offset %q, length %q) read the file outside the model folder", loc, off, length)
		}
		if !bytes.Contains(inside, b) {
			t.Fatalf("location %q: bytes that are in no side file", loc)
		}
	})
}
