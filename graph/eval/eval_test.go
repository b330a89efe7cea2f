package eval

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

func node(op string, in, out []string, a ...*pb.AttributeProto) *pb.NodeProto {
	return graph.NewNode(op, "", "", in, out, a...)
}

func TestUnsupportedOpError(t *testing.T) {
	n := graph.NewNode("FancyOp", "my.domain", "fancy_1", []string{"x"}, []string{"y"})
	m := modelOf(18, []*pb.NodeProto{n}, []string{"x"}, ins(f32(sh(1), 1)), []string{"y"})
	_, err := Run(context.Background(), m, map[string]*Tensor{"x": f32(sh(1), 1)}, Options{})
	var u *UnsupportedOpError
	if !errors.As(err, &u) {
		t.Fatalf("want UnsupportedOpError, got %v", err)
	}
	if want := "unsupported op my.domain::FancyOp (node fancy_1)"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if got := UnsupportedOps(m); len(got) != 1 || got[0] != "my.domain::FancyOp" {
		t.Errorf("UnsupportedOps = %v", got)
	}
}

func TestRunInputs(t *testing.T) {
	initW := &pb.TensorProto{Name: proto.String("w"), DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), Dims: []int64{2}, FloatData: []float32{10, 20}}
	build := func() *graph.Model {
		m := modelOf(18, []*pb.NodeProto{node("Add", []string{"x", "w"}, []string{"y"})}, []string{"x", "w"}, ins(f32(sh(2), 0, 0), f32(sh(2), 0, 0)), []string{"y"})
		m.Proto.Graph.Initializer = []*pb.TensorProto{initW}
		return m
	}
	cases := []struct {
		name    string
		feeds   map[string]*Tensor
		want    *Tensor
		wantErr string
	}{
		{"initializer default", map[string]*Tensor{"x": f32(sh(2), 1, 2)}, f32(sh(2), 11, 22), ""},
		{"feed overrides initializer", map[string]*Tensor{"x": f32(sh(2), 1, 2), "w": f32(sh(2), 1, 1)}, f32(sh(2), 2, 3), ""},
		{"missing input", map[string]*Tensor{}, nil, "not fed"},
		{"unknown feed", map[string]*Tensor{"x": f32(sh(2), 1, 2), "z": f32(sh(1), 1)}, nil, "not a graph input"},
		{"wrong dtype", map[string]*Tensor{"x": i64(sh(2), 1, 2)}, nil, "model declares FLOAT"},
		{"wrong shape", map[string]*Tensor{"x": f32(sh(3), 1, 2, 3)}, nil, "declares dim 0 = 2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := Run(context.Background(), build(), c.feeds, Options{})
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) || !errors.Is(err, graph.ErrBadInput) {
					t.Fatalf("error %v, want one containing %q wrapping ErrBadInput", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			expectTensor(t, out["y"], c.want)
		})
	}
}

// chain builds x -> Neg -> Neg -> ... (n nodes) -> y.
func chain(n, size int) (*graph.Model, *Tensor) {
	var nodes []*pb.NodeProto
	prev := "x"
	for i := 0; i < n; i++ {
		out := fmt.Sprintf("v%d", i)
		if i == n-1 {
			out = "y"
		}
		nodes = append(nodes, node("Neg", []string{prev}, []string{out}))
		prev = out
	}
	x := New(pb.TensorProto_FLOAT, sh(size))
	return modelOf(18, nodes, []string{"x"}, ins(x), []string{"y"}), x
}

func TestCaptureAndKeepAll(t *testing.T) {
	m, x := chain(4, 3)
	out, err := Run(context.Background(), m, map[string]*Tensor{"x": x}, Options{Capture: func(n string) bool { return n == "v1" }})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out["v1"] == nil || out["y"] == nil {
		t.Errorf("captured %v, want y and v1", keys(out))
	}
	out, err = Run(context.Background(), m, map[string]*Tensor{"x": x}, Options{KeepAll: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 5 {
		t.Errorf("KeepAll returned %v, want x, v0..v2, y", keys(out))
	}
}

func keys(m map[string]*Tensor) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestMemLimit(t *testing.T) {
	m, x := chain(20, 256) // 1 KiB per value
	feeds := map[string]*Tensor{"x": x}
	// Freeing after last use keeps at most input + two values alive.
	if _, err := Run(context.Background(), m, feeds, Options{MemLimit: 3 * 1024}); err != nil {
		t.Fatalf("chain within limit: %v", err)
	}
	if _, err := Run(context.Background(), m, feeds, Options{MemLimit: 3 * 1024, KeepAll: true}); !errors.Is(err, ErrMemLimit) {
		t.Fatalf("keeping everything must exceed the limit, got %v", err)
	}
	big := modelOf(18, []*pb.NodeProto{node("ConstantOfShape", []string{"s"}, []string{"y"})}, []string{"s"}, ins(i64(sh(2), 0, 0)), []string{"y"})
	_, err := Run(context.Background(), big, map[string]*Tensor{"s": i64(sh(2), 1<<20, 1<<10)}, Options{MemLimit: 1 << 20})
	if !errors.Is(err, ErrMemLimit) {
		t.Fatalf("huge ConstantOfShape: want ErrMemLimit before allocating, got %v", err)
	}
}

func TestCancellation(t *testing.T) {
	m, x := chain(3, 4)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, m, map[string]*Tensor{"x": x}, Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled, got %v", err)
	}
}

// funcModel builds a model calling local function my::Scale(X) = X * alpha
// (alpha bound by reference to the call's "alpha" attribute, default 3).
func funcModel(callAttrs ...*pb.AttributeProto) *graph.Model {
	alphaRef := &pb.AttributeProto{Name: proto.String("value_float"), RefAttrName: proto.String("alpha"), Type: pb.AttributeProto_FLOAT.Enum()}
	f := &pb.FunctionProto{
		Name: proto.String("Scale"), Domain: proto.String("my"),
		Input: []string{"X"}, Output: []string{"Y"}, Attribute: []string{},
		AttributeProto: []*pb.AttributeProto{graph.FloatAttr("alpha", 3)},
		Node: []*pb.NodeProto{
			node("Constant", nil, []string{"a"}, alphaRef),
			node("Mul", []string{"X", "a"}, []string{"Y"}),
		},
		OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}},
	}
	call := graph.NewNode("Scale", "my", "call", []string{"x"}, []string{"y"}, callAttrs...)
	m := modelOf(18, []*pb.NodeProto{call}, []string{"x"}, ins(f32(sh(2), 0, 0)), []string{"y"})
	m.Proto.Functions = []*pb.FunctionProto{f}
	m.Proto.OpsetImport = append(m.Proto.OpsetImport, &pb.OperatorSetIdProto{Domain: proto.String("my"), Version: proto.Int64(1)})
	return m
}

func TestFunctionsAndRegistry(t *testing.T) {
	x := f32(sh(2), 1, 2)
	run := func(m *graph.Model, opt Options) *Tensor {
		t.Helper()
		out, err := Run(context.Background(), m, map[string]*Tensor{"x": x}, opt)
		if err != nil {
			t.Fatal(err)
		}
		return out["y"]
	}
	expectTensor(t, run(funcModel(), Options{}), f32(sh(2), 3, 6))
	expectTensor(t, run(funcModel(graph.FloatAttr("alpha", 0.5)), Options{}), f32(sh(2), 0.5, 1))
	if u := UnsupportedOps(funcModel()); len(u) != 0 {
		t.Errorf("function-backed op reported unsupported: %v", u)
	}

	// A registered kernel wins over the function unless PreferFunctions.
	Register("my", "Scale", func(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
		out := in[0].Clone()
		for i := range out.F32 {
			out.F32[i] *= 100
		}
		return []*Tensor{out}, nil
	})
	defer Register("my", "Scale", nil)
	if !Supported("my", "Scale") {
		t.Error("registered kernel not reported as supported")
	}
	expectTensor(t, run(funcModel(), Options{}), f32(sh(2), 100, 200))
	expectTensor(t, run(funcModel(), Options{PreferFunctions: true}), f32(sh(2), 3, 6))

	// Registering a standard op replaces the built-in kernel.
	Register("ai.onnx", "Neg", func(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
		return []*Tensor{f32(sh(1), 42)}, nil
	})
	m, cx := chain(1, 1)
	out, err := Run(context.Background(), m, map[string]*Tensor{"x": cx}, Options{})
	Register("", "Neg", nil)
	if err != nil {
		t.Fatal(err)
	}
	expectTensor(t, out["y"], f32(sh(1), 42))

	// A panicking kernel becomes an error naming the node.
	Register("", "Neg", func(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
		var s []float32
		return []*Tensor{f32(sh(1), s[3])}, nil
	})
	_, err = Run(context.Background(), m, map[string]*Tensor{"x": cx}, Options{})
	Register("", "Neg", nil)
	if err == nil || !strings.Contains(err.Error(), "kernel panicked") || !strings.Contains(err.Error(), "Neg") {
		t.Errorf("panic not turned into an error: %v", err)
	}
}

func TestRecursiveFunction(t *testing.T) {
	f := &pb.FunctionProto{Name: proto.String("R"), Domain: proto.String("my"), Input: []string{"X"}, Output: []string{"Y"},
		Node: []*pb.NodeProto{graph.NewNode("R", "my", "", []string{"X"}, []string{"Y"})}}
	m := modelOf(18, []*pb.NodeProto{graph.NewNode("R", "my", "", []string{"x"}, []string{"y"})}, []string{"x"}, ins(f32(sh(1), 0)), []string{"y"})
	m.Proto.Functions = []*pb.FunctionProto{f}
	_, err := Run(context.Background(), m, map[string]*Tensor{"x": f32(sh(1), 1)}, Options{})
	if err == nil || !strings.Contains(err.Error(), "nest deeper") {
		t.Fatalf("want recursion error, got %v", err)
	}
}

func TestControlFlow(t *testing.T) {
	branch := func(v float32) *pb.GraphProto {
		return &pb.GraphProto{
			Node:   []*pb.NodeProto{node("Mul", []string{"x", "k"}, []string{"o"})},
			Output: []*pb.ValueInfoProto{untypedValue("o")},
			Initializer: []*pb.TensorProto{{Name: proto.String("k"), DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), Dims: []int64{},
				FloatData: []float32{v}}},
		}
	}
	ifNode := node("If", []string{"c"}, []string{"y"},
		&pb.AttributeProto{Name: proto.String("then_branch"), Type: pb.AttributeProto_GRAPH.Enum(), G: branch(2)},
		&pb.AttributeProto{Name: proto.String("else_branch"), Type: pb.AttributeProto_GRAPH.Enum(), G: branch(-1)})
	m := modelOf(18, []*pb.NodeProto{ifNode}, []string{"c", "x"}, ins(bl(nil, true), f32(sh(2), 0, 0)), []string{"y"})
	for _, c := range []struct {
		cond bool
		want *Tensor
	}{{true, f32(sh(2), 2, 4)}, {false, f32(sh(2), -1, -2)}} {
		out, err := Run(context.Background(), m, map[string]*Tensor{"c": bl(nil, c.cond), "x": f32(sh(2), 1, 2)}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		expectTensor(t, out["y"], c.want)
	}

	// Loop: acc += i for i in 0..M-1, scan output collects acc.
	body := &pb.GraphProto{
		Input: []*pb.ValueInfoProto{untypedValue("i"), untypedValue("cin"), untypedValue("acc")},
		Node: []*pb.NodeProto{
			node("Add", []string{"acc", "i"}, []string{"acc2"}),
			node("Identity", []string{"cin"}, []string{"cout"}),
			node("Identity", []string{"acc2"}, []string{"scan"}),
		},
		Output: []*pb.ValueInfoProto{untypedValue("cout"), untypedValue("acc2"), untypedValue("scan")},
	}
	loop := node("Loop", []string{"M", "", "a0"}, []string{"acc", "scans"}, &pb.AttributeProto{Name: proto.String("body"), Type: pb.AttributeProto_GRAPH.Enum(), G: body})
	lm := modelOf(18, []*pb.NodeProto{loop}, []string{"M", "a0"}, ins(i64(nil, 0), i64(nil, 0)), []string{"acc", "scans"})
	out, err := Run(context.Background(), lm, map[string]*Tensor{"M": i64(nil, 4), "a0": i64(nil, 10)}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	expectTensor(t, out["acc"], i64(nil, 16))
	expectTensor(t, out["scans"], i64(sh(4), 10, 11, 13, 16))
}

func TestProtoRoundTrip(t *testing.T) {
	dir := t.TempDir()
	cases := []*Tensor{
		f32(sh(2, 2), 1, -2, 3.5, 0),
		f64(sh(1), 1e300),
		i64(sh(3), -1, 0, 1<<40),
		typed(pb.TensorProto_INT32, sh(2), -5, 7),
		typed(pb.TensorProto_UINT8, sh(2), 0, 255),
		typed(pb.TensorProto_INT8, sh(2), -128, 127),
		typed(pb.TensorProto_UINT16, sh(1), 65535),
		bl(sh(3), true, false, true),
		{DType: pb.TensorProto_FLOAT16, Shape: sh(2), F32: []float32{1.5, -0.25}},
		{DType: pb.TensorProto_BFLOAT16, Shape: sh(2), F32: []float32{1.5, -256}},
		{DType: pb.TensorProto_STRING, Shape: sh(2), Str: []string{"a", ""}},
		f32(nil, 7),
	}
	for i, want := range cases {
		p, err := ToProto(want, "t")
		if err != nil {
			t.Fatal(err)
		}
		got, err := FromProto(p, nil)
		if err != nil {
			t.Fatal(err)
		}
		expectTensor(t, got, want)
		path := filepath.Join(dir, fmt.Sprintf("input_%d.pb", i))
		if err := WriteTensorFile(path, want, fmt.Sprintf("in%d", i)); err != nil {
			t.Fatal(err)
		}
		back, name, err := ReadTensorFile(path)
		if err != nil || name != fmt.Sprintf("in%d", i) {
			t.Fatalf("ReadTensorFile: %v %q", err, name)
		}
		expectTensor(t, back, want)
	}
	ds, err := ReadDataSet(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds.Inputs) != len(cases) || ds.InputNames[10] != "in10" || ds.InputNames[2] != "in2" {
		t.Errorf("data set order wrong: %v", ds.InputNames)
	}
	// typed fields
	p := &pb.TensorProto{DataType: proto.Int32(int32(pb.TensorProto_INT32)), Dims: []int64{2}, Int32Data: []int32{-3, 4}}
	got, err := FromProto(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	expectTensor(t, got, typed(pb.TensorProto_INT32, sh(2), -3, 4))
	// bad inputs
	if _, err := FromProto(&pb.TensorProto{DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), Dims: []int64{3}, RawData: []byte{1, 2}}, nil); !errors.Is(err, graph.ErrBadInput) {
		t.Errorf("short raw data: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "output_0.pb"), []byte{0xff, 0xff}, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadDataSet(dir); !errors.Is(err, graph.ErrBadInput) {
		t.Errorf("corrupt tensor file: %v", err)
	}
}

func TestCompare(t *testing.T) {
	nan := float32(0)
	nan = nan / nan
	cases := []struct {
		name       string
		got, want  *Tensor
		mismatches int
		worst      int
		wantErr    bool
	}{
		{"equal", f32(sh(2), 1, 2), f32(sh(2), 1, 2), 0, 0, false},
		{"within rtol", f32(sh(2), 1000.05, 2), f32(sh(2), 1000, 2), 0, 0, false},
		{"beyond", f32(sh(3), 1, 2.1, 3), f32(sh(3), 1, 2, 3), 1, 1, false},
		{"nan equal", f32(sh(1), nan), f32(sh(1), nan), 0, 0, false},
		{"nan vs number", f32(sh(2), 0, nan), f32(sh(2), 0, 1), 1, 1, false},
		{"shape", f32(sh(2), 1, 2), f32(sh(1, 2), 1, 2), 0, -1, true},
	}
	for _, c := range cases {
		d, err := Compare(c.got, c.want, 1e-4, 1e-5)
		if (err != nil) != c.wantErr {
			t.Fatalf("%s: err %v", c.name, err)
		}
		if err == nil && (d.Mismatches != c.mismatches || (c.mismatches > 0 && d.Worst != c.worst)) {
			t.Errorf("%s: %+v", c.name, d)
		}
	}
}
