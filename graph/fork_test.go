package graph

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"unsafe"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// TestFork: a fork equals its model, shares the tensors' bytes but no
// message (editing one leaves the other as it was), reads the model's side
// files, and closing it leaves the model's side files open.
func TestFork(t *testing.T) {
	for _, tc := range []struct {
		name string
		load func(t *testing.T, dir string) *Model
	}{
		{"inline", func(t *testing.T, dir string) *Model { return faultModel() }},
		{"side file", func(t *testing.T, dir string) *Model { return sideSaved(t, filepath.Join(dir, "m.onnx")) }},
		{"constant attribute", func(t *testing.T, dir string) *Model {
			m := faultModel()
			c := &pb.TensorProto{Name: proto.String("c"), Dims: []int64{4}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), RawData: []byte("0123456789abcdef")}
			m.Proto.Graph.Node = append(m.Proto.Graph.Node, NewNode("Constant", "", "k", nil, []string{"c"},
				&pb.AttributeProto{Name: proto.String("value"), Type: pb.AttributeProto_TENSOR.Enum(), T: c}))
			return m
		}},
		{"every node field, value infos, a subgraph", func(t *testing.T, dir string) *Model {
			m := faultModel()
			n := m.Proto.Graph.Node[0]
			n.DocString, n.Overload = proto.String("doc"), proto.String("ov")
			n.MetadataProps = []*pb.StringStringEntryProto{{Key: proto.String("k"), Value: proto.String("v")}}
			n.Attribute = append(n.Attribute, IntAttr("plain", 3))
			m.Proto.Graph.ValueInfo = []*pb.ValueInfoProto{vinfo("y")}
			m.Proto.Graph.DocString = proto.String("graph doc")
			body := &pb.GraphProto{Name: proto.String("then"), Initializer: []*pb.TensorProto{f32Init("inner", 8)},
				Node:   []*pb.NodeProto{NewNode("Identity", "", "i", []string{"inner"}, []string{"o"})},
				Output: []*pb.ValueInfoProto{vinfo("o")}}
			m.Proto.Graph.Node = append(m.Proto.Graph.Node, NewNode("If", "", "if", []string{"cond"}, []string{"z"},
				&pb.AttributeProto{Name: proto.String("then_branch"), Type: pb.AttributeProto_GRAPH.Enum(), G: body},
				&pb.AttributeProto{Name: proto.String("else_branch"), Type: pb.AttributeProto_GRAPH.Enum(), G: proto.Clone(body).(*pb.GraphProto)}))
			m.Proto.Functions = []*pb.FunctionProto{{Name: proto.String("f"), Domain: proto.String("d"),
				Node: []*pb.NodeProto{NewNode("Constant", "", "c", nil, []string{"c"},
					&pb.AttributeProto{Name: proto.String("value"), Type: pb.AttributeProto_TENSOR.Enum(), T: f32Init("fc", 8)})}}}
			return m
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.load(t, t.TempDir())
			defer m.Close()
			want, err := proto.Marshal(m.Proto)
			if err != nil {
				t.Fatal(err)
			}
			// Forking only reads m: another goroutine reads it meanwhile
			// (go test -race tells a write apart).
			stop := make(chan struct{})
			var readers sync.WaitGroup
			readers.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
						if _, err := proto.Marshal(m.Proto); err != nil {
							t.Error(err)
							return
						}
					}
				}
			})
			for range 5 {
				if _, err := m.Fork(); err != nil {
					t.Fatal(err)
				}
			}
			close(stop)
			readers.Wait()
			f, err := m.Fork()
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(f.Proto, m.Proto) {
				t.Fatal("the fork differs from the model")
			}
			mt, ft := allTensors(m.Proto), allTensors(f.Proto)
			for i := range mt {
				if mt[i] == ft[i] {
					t.Fatalf("tensor %s is shared", mt[i].GetName())
				}
				if len(mt[i].RawData) > 0 && unsafe.SliceData(mt[i].RawData) != unsafe.SliceData(ft[i].RawData) {
					t.Fatalf("tensor %s's bytes were copied", mt[i].GetName())
				}
			}
			for i, n := range f.Proto.Graph.Node {
				if n == m.Proto.Graph.Node[i] {
					t.Fatalf("node %d is shared", i)
				}
			}
			// Edit the fork the way passes and writers do: rename outputs,
			// drop nodes, swap a tensor's data out.
			f.Proto.Graph.Node[0].Output[0] = "renamed"
			f.Proto.Graph.Node[0].Attribute = append(f.Proto.Graph.Node[0].Attribute, IntAttr("new", 1))
			f.Proto.Graph.Initializer[0].RawData = nil
			f.Proto.Graph.Initializer[0].Name = proto.String("other")
			f.Proto.Graph.Node = f.Proto.Graph.Node[:0]
			f.Proto.OpsetImport[0].Version = proto.Int64(1)
			got, err := proto.Marshal(m.Proto)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("editing the fork changed the model")
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			for _, x := range m.Proto.Graph.Initializer {
				if _, err := m.TensorBytes(x); err != nil {
					t.Fatalf("after the fork was closed: %v", err)
				}
			}
		})
	}
}

// TestForkDeferred: a model holding deferred tensors is not forked.
func TestForkDeferred(t *testing.T) {
	m, _ := deferredModel(4, nil)
	if _, err := m.Fork(); !errors.Is(err, ErrForkDeferred) {
		t.Fatalf("got %v, want ErrForkDeferred", err)
	}
}

// TestSaveReady: Save calls Ready once the output is written to temporary
// files and before anything is renamed into place; an error from it leaves
// no output and no temporary file and is returned; nil commits.
func TestSaveReady(t *testing.T) {
	errNo := errors.New("check failed")
	for _, mode := range []ExternalMode{ExternalKeep, ExternalRepack} {
		for _, fail := range []bool{false, true} {
			dir := t.TempDir()
			path := filepath.Join(dir, "out.onnx")
			m := faultModel()
			calls := 0
			err := m.Save(path, SaveOptions{External: mode, Ready: func() error {
				calls++
				es, err := os.ReadDir(dir)
				if err != nil {
					return err
				}
				if len(es) == 0 {
					t.Errorf("mode %v: nothing written before Ready", mode)
				}
				for _, e := range es {
					if e.Name() == "out.onnx" || e.Name() == "out.onnx.data" {
						t.Errorf("mode %v: %s in place before Ready", mode, e.Name())
					}
				}
				if fail {
					return errNo
				}
				return nil
			}})
			if calls != 1 {
				t.Fatalf("mode %v fail %v: Ready called %d times", mode, fail, calls)
			}
			left := snapshot(t, dir)
			if fail {
				if !errors.Is(err, errNo) || len(left) != 0 {
					t.Fatalf("mode %v: error %v, files left %v", mode, err, names(left))
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			back, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := back.Check(); err != nil {
				t.Fatal(err)
			}
			back.Close()
		}
	}
}

// TestMapFork pairs each node and tensor of a model with its fork's, keeps
// what is not the model's as it is, and refuses a model that is not the
// fork's.
func TestMapFork(t *testing.T) {
	m := faultModel()
	f, err := m.Fork()
	if err != nil {
		t.Fatal(err)
	}
	fm, err := MapFork(m, f)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range m.Proto.Graph.Node {
		if fm.Node(n) != f.Proto.Graph.Node[i] {
			t.Fatalf("node %d not paired", i)
		}
	}
	for i, x := range m.Proto.Graph.Initializer {
		if fm.Tensor(x) != f.Proto.Graph.Initializer[i] {
			t.Fatalf("initializer %d not paired", i)
		}
	}
	other := NewNode("Relu", "", "other", []string{"a"}, []string{"b"})
	if fm.Node(other) != other || fm.Node(nil) != nil {
		t.Fatal("a node that is not the model's was not kept")
	}
	f.Proto.Graph.Node = f.Proto.Graph.Node[:0]
	if _, err := MapFork(m, f); err == nil {
		t.Fatal("a fork with other nodes was paired")
	}
}

// TestCopyTensorEveryField: copyTensor copies every field of a tensor (set
// through reflection, so that a field added to TensorProto is covered),
// with lists and messages of its own and the raw data shared.
func TestCopyTensorEveryField(t *testing.T) {
	src := &pb.TensorProto{}
	r := src.ProtoReflect()
	fields := r.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := r.Mutable(fd).List()
			e := l.NewElement()
			setScalars(e.Message())
			l.Append(e)
		case fd.IsList():
			r.Mutable(fd).List().Append(sampleValue(fd))
		case fd.Message() != nil:
			setScalars(r.Mutable(fd).Message())
		default:
			r.Set(fd, sampleValue(fd))
		}
	}
	src.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 999, protowire.VarintType), 5))
	c := copyTensor(src)
	if !proto.Equal(c, src) {
		t.Fatalf("copy differs:\n%v\nwant\n%v", c, src)
	}
	if unsafe.SliceData(c.RawData) != unsafe.SliceData(src.RawData) {
		t.Fatal("raw data was copied")
	}
	if &c.Dims[0] == &src.Dims[0] || c.ExternalData[0] == src.ExternalData[0] || c.Segment == src.Segment {
		t.Fatal("a list or message is shared")
	}
}

// setScalars sets every scalar field of m to a sample value.
func setScalars(m protoreflect.Message) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		if fd := fields.Get(i); !fd.IsList() && fd.Message() == nil {
			m.Set(fd, sampleValue(fd))
		}
	}
}

// sampleValue is a value of fd's kind other than the default.
func sampleValue(fd protoreflect.FieldDescriptor) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString("s")
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte("bytes"))
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(1)
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(1.5)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(2.5)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(3)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(4)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(5)
	default:
		return protoreflect.ValueOfUint64(6)
	}
}
