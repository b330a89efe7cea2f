package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

func vi(name string) *pb.ValueInfoProto {
	return &pb.ValueInfoProto{Name: proto.String(name), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{
		TensorType: &pb.TypeProto_Tensor{ElemType: proto.Int32(int32(pb.TensorProto_FLOAT)),
			Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: 4}}}}}}}}
}

// smallModel is y = Relu(x + w) with a 4-float initializer w; edit it to
// make it hostile.
func smallModel() *pb.ModelProto {
	w := &pb.TensorProto{Name: proto.String("w"), Dims: []int64{4}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), RawData: make([]byte, 16)}
	return &pb.ModelProto{IrVersion: proto.Int64(8), OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}},
		Graph: &pb.GraphProto{Name: proto.String("g"),
			Node: []*pb.NodeProto{
				graph.NewNode("Add", "", "add", []string{"x", "w"}, []string{"s"}),
				graph.NewNode("Relu", "", "relu", []string{"s"}, []string{"y"}),
			},
			Initializer: []*pb.TensorProto{w},
			Input:       []*pb.ValueInfoProto{vi("x")}, Output: []*pb.ValueInfoProto{vi("y")}}}
}

// external points w at a side file.
func external(mp *pb.ModelProto, loc string, kv ...string) {
	w := mp.Graph.Initializer[0]
	w.RawData = nil
	w.DataLocation = pb.TensorProto_EXTERNAL.Enum()
	w.ExternalData = []*pb.StringStringEntryProto{{Key: proto.String("location"), Value: proto.String(loc)}}
	for i := 0; i+1 < len(kv); i += 2 {
		w.ExternalData = append(w.ExternalData, &pb.StringStringEntryProto{Key: proto.String(kv[i]), Value: proto.String(kv[i+1])})
	}
}

func marshal(t *testing.T, mp *pb.ModelProto) []byte {
	t.Helper()
	b, err := proto.Marshal(mp)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBadInputs feeds each class of malformed or hostile model to
// `mokopt rewrite` in-process and checks the exit code, the error class,
// that the message names the file and the offending node or tensor, and that
// neither the output nor a temporary file appears.
func TestBadInputs(t *testing.T) {
	example, err := os.ReadFile(exampleModel)
	if err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "w.bin"), make([]byte, 16), 0o644)
	type tc struct {
		name  string
		model func(t *testing.T, dir string) []byte // written to dir/in.onnx
		code  int
		bad   bool     // errors.Is(err, graph.ErrBadInput)
		want  []string // substrings of the message besides the file name
		check func(t *testing.T, err error)
	}
	cases := []tc{
		{name: "truncated protobuf", code: 2, bad: true, want: []string{"not a valid ONNX protobuf"},
			model: func(t *testing.T, dir string) []byte { return example[:len(example)/3] }},
		{name: "garbage bytes", code: 2, bad: true, want: []string{"not a valid ONNX protobuf"},
			model: func(t *testing.T, dir string) []byte { return []byte("\xff\xff\xff\xffGIF89a garbage") }},
		{name: "protobuf without a graph", code: 2, bad: true, want: []string{"not an ONNX model", "no graph"},
			model: func(t *testing.T, dir string) []byte {
				return marshal(t, &pb.ModelProto{IrVersion: proto.Int64(8), ProducerName: proto.String("not a model")})
			}},
		{name: "tensor file instead of a model", code: 2, bad: true, want: []string{"not a valid ONNX protobuf"},
			model: func(t *testing.T, dir string) []byte {
				b, err := os.ReadFile("../../testdata/example/mixtral_block_dynamo_batched_mm_data/test_data_set_0/input_0.pb")
				if err != nil {
					t.Fatal(err)
				}
				return b
			}},
		{name: "unsupported IR version", code: 2, bad: true, want: []string{"unsupported IR version 99"},
			model: func(t *testing.T, dir string) []byte {
				mp := smallModel()
				mp.IrVersion = proto.Int64(99)
				return marshal(t, mp)
			}},
		{name: "missing IR version", code: 2, bad: true, want: []string{"unsupported IR version 0"},
			model: func(t *testing.T, dir string) []byte {
				mp := smallModel()
				mp.IrVersion = nil
				return marshal(t, mp)
			}},
		{name: "cycle", code: 2, bad: true, want: []string{`cycle through node "add"`},
			model: func(t *testing.T, dir string) []byte {
				mp := smallModel()
				mp.Graph.Node[0].Input[1] = "s2"
				mp.Graph.Node = append(mp.Graph.Node, graph.NewNode("Neg", "", "neg", []string{"s"}, []string{"s2"}))
				return marshal(t, mp)
			},
			check: func(t *testing.T, err error) {
				var ce *graph.CycleError
				if !errors.As(err, &ce) {
					t.Errorf("error is not a *graph.CycleError: %v", err)
				}
			}},
		{name: "duplicate value name", code: 2, bad: true, want: []string{`value "s" is produced by more than one node`, `"dup"`},
			model: func(t *testing.T, dir string) []byte {
				mp := smallModel()
				mp.Graph.Node = append(mp.Graph.Node, graph.NewNode("Neg", "", "dup", []string{"x"}, []string{"s"}))
				return marshal(t, mp)
			}},
		{name: "duplicate initializer", code: 2, bad: true, want: []string{`initializer "w" is defined more than once`},
			model: func(t *testing.T, dir string) []byte {
				mp := smallModel()
				mp.Graph.Initializer = append(mp.Graph.Initializer, proto.Clone(mp.Graph.Initializer[0]).(*pb.TensorProto))
				return marshal(t, mp)
			}},
		{name: "dangling input", code: 2, bad: true, want: []string{`node "relu" (Relu) reads "nowhere"`},
			model: func(t *testing.T, dir string) []byte {
				mp := smallModel()
				mp.Graph.Node[1].Input[0] = "nowhere"
				return marshal(t, mp)
			}},
		{name: "node with too few inputs", code: 2, bad: true, want: []string{`node "add" (Add) has 1 inputs; Add (opset 18) needs at least 2`},
			model: func(t *testing.T, dir string) []byte {
				mp := smallModel()
				mp.Graph.Node[0].Input = mp.Graph.Node[0].Input[:1]
				return marshal(t, mp)
			}},
		{name: "raw_data length mismatch", code: 2, bad: true, want: []string{`initializer "w"`, "raw_data holds 15 bytes", "need 16"},
			model: func(t *testing.T, dir string) []byte {
				mp := smallModel()
				mp.Graph.Initializer[0].RawData = make([]byte, 15)
				return marshal(t, mp)
			}},
		{name: "dims overflow int64", code: 2, bad: true, want: []string{`initializer "w"`, "overflow int64"},
			model: func(t *testing.T, dir string) []byte {
				mp := smallModel()
				mp.Graph.Initializer[0].Dims = []int64{1 << 40, 1 << 40}
				return marshal(t, mp)
			}},
		{name: "dims overflow int64 bytes", code: 2, bad: true, want: []string{`initializer "w"`, "overflow int64 bytes"},
			model: func(t *testing.T, dir string) []byte {
				mp := smallModel()
				mp.Graph.Initializer[0].Dims = []int64{1 << 62}
				return marshal(t, mp)
			}},
		{name: "negative dims", code: 2, bad: true, want: []string{`initializer "w"`, "negative dimension -4"},
			model: func(t *testing.T, dir string) []byte {
				mp := smallModel()
				mp.Graph.Initializer[0].Dims = []int64{-4}
				return marshal(t, mp)
			}},
		{name: "typed data claims 1 TiB", code: 2, bad: true, want: []string{`initializer "w"`, "typed data holds 4 bytes", "need 1099511627776"},
			model: func(t *testing.T, dir string) []byte {
				mp := smallModel()
				w := mp.Graph.Initializer[0]
				w.RawData, w.FloatData, w.Dims = nil, []float32{1}, []int64{1 << 38}
				return marshal(t, mp)
			}},
		{name: "external location with ..", code: 2, bad: true, want: []string{`initializer "w"`, `"../w.bin" escapes the model's folder`},
			model: func(t *testing.T, dir string) []byte {
				mp := smallModel()
				external(mp, "../w.bin")
				return marshal(t, mp)
			}},
		{name: "external absolute path", code: 2, bad: true, want: []string{`initializer "w"`, "is an absolute path"},
			model: func(t *testing.T, dir string) []byte {
				mp := smallModel()
				external(mp, filepath.Join(outside, "w.bin"))
				return marshal(t, mp)
			}},
		{name: "external symlink out of the folder", code: 2, bad: true, want: []string{`initializer "w"`, "through a symbolic link"},
			model: func(t *testing.T, dir string) []byte {
				if err := os.Symlink(filepath.Join(outside, "w.bin"), filepath.Join(dir, "link.bin")); err != nil {
					t.Skip("no symlinks:", err)
				}
				mp := smallModel()
				external(mp, "link.bin")
				return marshal(t, mp)
			}},
		{name: "external offset past end", code: 2, bad: true, want: []string{`initializer "w"`, "offset 64 + length 16 is past the end", "(16 bytes)"},
			model: func(t *testing.T, dir string) []byte {
				os.WriteFile(filepath.Join(dir, "w.bin"), make([]byte, 16), 0o644)
				mp := smallModel()
				external(mp, "w.bin", "offset", "64", "length", "16")
				return marshal(t, mp)
			}},
		{name: "external length past end", code: 2, bad: true, want: []string{`initializer "w"`, "offset 8 + length 16 is past the end"},
			model: func(t *testing.T, dir string) []byte {
				os.WriteFile(filepath.Join(dir, "w.bin"), make([]byte, 16), 0o644)
				mp := smallModel()
				external(mp, "w.bin", "offset", "8", "length", "16")
				return marshal(t, mp)
			}},
		{name: "external tensor claims 1 TiB", code: 2, bad: true, want: []string{`initializer "w"`, "length 16 does not match dims [274877906944]", "1099511627776 bytes"},
			model: func(t *testing.T, dir string) []byte {
				os.WriteFile(filepath.Join(dir, "w.bin"), make([]byte, 16), 0o644)
				mp := smallModel()
				external(mp, "w.bin")
				mp.Graph.Initializer[0].Dims = []int64{1 << 38}
				return marshal(t, mp)
			}},
		{name: "external bad offset", code: 2, bad: true, want: []string{`initializer "w"`, `offset "-1" is not a non-negative integer`},
			model: func(t *testing.T, dir string) []byte {
				os.WriteFile(filepath.Join(dir, "w.bin"), make([]byte, 16), 0o644)
				mp := smallModel()
				external(mp, "w.bin", "offset", "-1")
				return marshal(t, mp)
			}},
		{name: "missing side file", code: 2, bad: true, want: []string{`initializer "w"`, `"gone.bin"`, "no such file"},
			model: func(t *testing.T, dir string) []byte {
				mp := smallModel()
				external(mp, "gone.bin")
				return marshal(t, mp)
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			in, out := filepath.Join(dir, "in.onnx"), filepath.Join(dir, "out.onnx")
			if err := os.WriteFile(in, c.model(t, dir), 0o644); err != nil {
				t.Fatal(err)
			}
			before := listDir(t, dir)
			code, msg, err := runCLI(context.Background(), []string{"rewrite", in, "-o", out})
			t.Logf("exit %d: mokopt: %s", code, strings.ReplaceAll(msg, dir, "DIR"))
			if code != c.code {
				t.Fatalf("exit %d, want %d (%s)", code, c.code, msg)
			}
			if errors.Is(err, graph.ErrBadInput) != c.bad {
				t.Errorf("errors.Is(err, graph.ErrBadInput) = %v, want %v: %v", !c.bad, c.bad, err)
			}
			for _, w := range append([]string{in}, c.want...) {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q does not contain %q", msg, w)
				}
			}
			if strings.Contains(msg, "goroutine ") || strings.Contains(msg, "panic") {
				t.Errorf("message looks like a panic: %q", msg)
			}
			if c.check != nil {
				c.check(t, err)
			}
			if after := listDir(t, dir); after != before {
				t.Errorf("files changed: before %s, after %s", before, after)
			}
		})
	}
}

// listDir names a folder's entries, hidden temporaries included.
func listDir(t *testing.T, dir string) string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return strings.Join(names, ",")
}

// TestUnknownDomainKept: a node in a domain mokopt does not know is not an
// error; rewrite fuses the MoE block and keeps the node as it was.
func TestUnknownDomainKept(t *testing.T) {
	m, err := graph.Load(exampleModel)
	if err != nil {
		t.Fatal(err)
	}
	g := m.Proto.Graph
	x := g.Input[0].GetName()
	frob := graph.NewNode("Frobnicate", "com.example.secret", "frob", []string{x}, []string{"frob_out"}, graph.IntAttr("level", 7))
	g.Node = append(g.Node, frob)
	g.Output = append(g.Output, &pb.ValueInfoProto{Name: proto.String("frob_out")})
	m.SetOpset("com.example.secret", 3)
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.onnx"), filepath.Join(dir, "out.onnx")
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(in, b, 0o644)
	code, msg, _ := runCLI(context.Background(), []string{"rewrite", in, "-o", out})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, msg)
	}
	r, err := graph.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	var kept *pb.NodeProto
	fused := 0
	for _, n := range r.Proto.Graph.Node {
		if n.GetOpType() == "Frobnicate" {
			kept = n
		}
		if n.GetDomain() == "ai.mok" && n.GetOpType() == "MoE" {
			fused++
		}
	}
	if kept == nil || !proto.Equal(kept, frob) {
		t.Fatalf("unknown-domain node not kept as it was: %v", kept)
	}
	if fused != 1 {
		t.Fatalf("%d fused nodes, want 1", fused)
	}
	if r.Opset("com.example.secret") != 3 {
		t.Fatal("opset import of the unknown domain dropped")
	}
}

// TestProtoLimitOnSave: a model that would exceed protobuf's 2 GiB limit when
// saved inline is refused before encoding, with a hint, and nothing is
// written. The limit is lowered so that no 2 GiB buffer is needed.
func TestProtoLimitOnSave(t *testing.T) {
	old := graph.MaxProtoSize
	graph.MaxProtoSize = 64 << 10
	defer func() { graph.MaxProtoSize = old }()
	dir := t.TempDir()
	out := filepath.Join(dir, "out.onnx")
	code, msg, err := runCLI(context.Background(), []string{"rewrite", exampleModel, "-o", out, "--external-data", "inline"})
	if code != 1 || !errors.Is(err, graph.ErrTooLarge) {
		t.Fatalf("exit %d, err %v; want 1 and ErrTooLarge", code, err)
	}
	for _, w := range []string{out, "2 GiB limit", "--external-data keep or repack"} {
		if !strings.Contains(msg, w) {
			t.Errorf("message %q does not contain %q", msg, w)
		}
	}
	if l := listDir(t, dir); l != "" {
		t.Fatalf("files left: %s", l)
	}
	// The same model with its weights moved out fits.
	if code, msg, _ := runCLI(context.Background(), []string{"rewrite", exampleModel, "-o", out, "--external-data", "repack"}); code != 0 {
		t.Fatalf("repack: exit %d: %s", code, msg)
	}
	if l := listDir(t, dir); l != "out.onnx,out.onnx.data" {
		t.Fatalf("repack wrote %s", l)
	}
}
