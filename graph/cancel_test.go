package graph

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// deferredModel is a model with one graph output fed by an Identity of a
// deferred initializer of n float32s; produced reports each Write's return.
func deferredModel(n int64, produced chan<- error) (*Model, *pb.TensorProto) {
	t := &pb.TensorProto{Name: proto.String("w"), Dims: []int64{n}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT))}
	mp := &pb.ModelProto{IrVersion: proto.Int64(10), OpsetImport: []*pb.OperatorSetIdProto{{Version: proto.Int64(18)}},
		Graph: &pb.GraphProto{Name: proto.String("g"), Initializer: []*pb.TensorProto{t},
			Node:   []*pb.NodeProto{NewNode("Identity", "", "id", []string{"w"}, []string{"y"})},
			Output: []*pb.ValueInfoProto{{Name: proto.String("y")}}}}
	m := &Model{Proto: mp, Path: "mem", Dir: "."}
	m.ext = newExternalStore(".", "mem")
	m.SetDeferred(t, DeferredData{Size: 4 * n, Write: func(w io.Writer) error {
		chunk := make([]byte, 1<<16)
		var err error
		for left := 4 * n; left > 0 && err == nil; left -= int64(len(chunk)) {
			_, err = w.Write(chunk[:min(int64(len(chunk)), left)])
		}
		if produced != nil {
			produced <- err
		}
		return err
	}})
	return m, t
}

func files(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestSaveCancelledStopsDeferredProducer(t *testing.T) {
	dir := t.TempDir()
	produced := make(chan error, 1)
	m, _ := deferredModel(16<<20, produced) // 64 MiB
	ctx, cancel := context.WithCancel(context.Background())
	var at, total int64
	err := m.Save(filepath.Join(dir, "m.onnx"), SaveOptions{Context: ctx, Progress: func(w, n int64) {
		if at == 0 {
			at, total = w, n
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("save cancelled at %d of %d bytes: %v, want context.Canceled", at, total, err)
	}
	if total != 64<<20 || at >= total {
		t.Fatalf("progress: cancelled at %d of %d bytes", at, total)
	}
	// The producer was told to stop (its write failed) instead of blocking.
	if perr := <-produced; perr == nil {
		t.Fatal("the deferred producer wrote everything after the cancellation")
	}
	if left := files(t, dir); len(left) != 0 {
		t.Fatalf("files left behind: %v", left)
	}
	// An already cancelled context writes nothing at all.
	m2, _ := deferredModel(16, nil)
	if err := m2.Save(filepath.Join(dir, "m2.onnx"), SaveOptions{Context: ctx}); !errors.Is(err, context.Canceled) {
		t.Fatalf("save with a cancelled context: %v", err)
	}
	if left := files(t, dir); len(left) != 0 {
		t.Fatalf("files left behind: %v", left)
	}
}

func TestEncode(t *testing.T) {
	// Deferred tensors are computed inline.
	m, w := deferredModel(1000, nil)
	var buf bytes.Buffer
	if err := m.Encode(&buf, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	back, err := Parse(buf.Bytes(), "-")
	if err != nil {
		t.Fatal(err)
	}
	got := back.Proto.Graph.Initializer[0]
	if len(got.RawData) != 4000 || IsExternal(got) {
		t.Fatalf("deferred tensor encoded with %d raw bytes (external %v), want 4000 inline", len(got.RawData), IsExternal(got))
	}
	if w.RawData != nil {
		t.Fatal("Encode left the inlined bytes on the model")
	}
	// A model saved with a side file cannot go to a stream unless inlined.
	dir := t.TempDir()
	path := filepath.Join(dir, "ext.onnx")
	if err := m.Save(path, SaveOptions{External: ExternalRepack}); err != nil {
		t.Fatal(err)
	}
	ext, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ext.Close()
	if ext.FirstExternal() == nil {
		t.Fatal("repacked model has no external tensor")
	}
	buf.Reset()
	if err := ext.Encode(&buf, SaveOptions{}); !errors.Is(err, ErrNeedsSideFile) || buf.Len() != 0 {
		t.Fatalf("Encode of a model with side files: %v, %d bytes written", err, buf.Len())
	}
	if err := ext.Encode(&buf, SaveOptions{External: ExternalInline}); err != nil {
		t.Fatal(err)
	}
	back, err = Parse(buf.Bytes(), "-")
	if err != nil || back.FirstExternal() != nil || len(back.Proto.Graph.Initializer[0].RawData) != 4000 {
		t.Fatalf("inlined stream: %v", err)
	}
	if !IsExternal(ext.Proto.Graph.Initializer[0]) {
		t.Fatal("Encode left the model's tensor inline")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	buf.Reset()
	if err := ext.Encode(&buf, SaveOptions{External: ExternalInline, Context: ctx}); !errors.Is(err, context.Canceled) || buf.Len() != 0 {
		t.Fatalf("Encode with a cancelled context: %v, %d bytes", err, buf.Len())
	}
}
