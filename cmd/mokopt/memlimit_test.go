package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

func TestParseByteSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"1000000", 1000000, true}, {"4GiB", 4 << 30, true}, {"4gib", 4 << 30, true},
		{"512MB", 512e6, true}, {"1.5KiB", 1536, true}, {"2T", 2 << 40, true}, {" 8 MiB ", 8 << 20, true}, {"7B", 7, true},
		{"", 0, false}, {"4x", 0, false}, {"-1GiB", 0, false}, {"GiB", 0, false}, {"NaN", 0, false}, {"1e30", 0, false},
	} {
		got, err := parseByteSize(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("parseByteSize(%q) = %d, %v; want %d, ok %v", c.in, got, err, c.want, c.ok)
		}
	}
}

// TestMemLimitFlag: --mem-limit reaches the interpreter of verify and run:
// a limit below the example's working set fails with exit 1 naming the
// limit, a generous one passes, and a malformed one is a usage error.
func TestMemLimitFlag(t *testing.T) {
	data := "../../testdata/example/mixtral_block_dynamo_batched_mm_data/test_data_set_0"
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"verify", exampleModel, exampleModel, "--mem-limit", "64KiB"}, 1, "memory limit exceeded"},
		{[]string{"verify", exampleModel, exampleModel, "--mem-limit", "1GiB"}, 0, ""},
		{[]string{"run", exampleModel, "--data", data, "--mem-limit", "10KB"}, 1, "(limit 10000)"},
		{[]string{"run", exampleModel, "--data", data, "--mem-limit", "1GiB"}, 0, ""},
		{[]string{"run", exampleModel, "--data", data, "--mem-limit", "4x"}, 2, `invalid argument "4x" for "--mem-limit"`},
	} {
		code, msg, _ := runCLI(context.Background(), c.args)
		if code != c.code || !strings.Contains(msg, c.want) {
			t.Errorf("%v: exit %d %q; want %d and %q", c.args, code, msg, c.code, c.want)
		}
	}
}

// bombModel wraps nodes into a model with float input x [4] (unless
// inputs is set) and output y.
func bombModel(nodes []*pb.NodeProto, inits []*pb.TensorProto, inputs ...*pb.ValueInfoProto) *pb.ModelProto {
	if len(inputs) == 0 {
		inputs = []*pb.ValueInfoProto{vi("x")}
	}
	return &pb.ModelProto{IrVersion: proto.Int64(10), OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}},
		Graph: &pb.GraphProto{Name: proto.String("g"), Node: nodes, Initializer: inits, Input: inputs,
			Output: []*pb.ValueInfoProto{{Name: proto.String("y")}}}}
}

func i64Init(name string, v ...int64) *pb.TensorProto {
	return &pb.TensorProto{Name: proto.String(name), Dims: []int64{int64(len(v))}, DataType: proto.Int32(int32(pb.TensorProto_INT64)), Int64Data: v}
}

func scalarI64(name string, v int64) *pb.TensorProto {
	return &pb.TensorProto{Name: proto.String(name), DataType: proto.Int32(int32(pb.TensorProto_INT64)), Int64Data: []int64{v}}
}

// nestedFunctions is a model whose node calls f0, each fi calling f(i+1)
// twice, depth levels deep: 2^depth calls of the innermost function.
func nestedFunctions(depth int) *pb.ModelProto {
	mp := bombModel([]*pb.NodeProto{graph.NewNode("f0", "local", "call", []string{"x"}, []string{"y"})}, nil)
	mp.OpsetImport = append(mp.OpsetImport, &pb.OperatorSetIdProto{Domain: proto.String("local"), Version: proto.Int64(1)})
	for i := 0; i < depth; i++ {
		f := &pb.FunctionProto{Name: proto.String(fmt.Sprintf("f%d", i)), Domain: proto.String("local"), Input: []string{"a"}, Output: []string{"b"},
			OpsetImport: mp.OpsetImport}
		if i == depth-1 {
			f.Node = []*pb.NodeProto{graph.NewNode("Relu", "", "r", []string{"a"}, []string{"b"})}
		} else {
			next := fmt.Sprintf("f%d", i+1)
			f.Node = []*pb.NodeProto{
				graph.NewNode(next, "local", "c1", []string{"a"}, []string{"t"}),
				graph.NewNode(next, "local", "c2", []string{"t"}, []string{"b"}),
			}
		}
		mp.Functions = append(mp.Functions, f)
	}
	return mp
}

// nestedIf is a model of depth If nodes, each the then-branch of the one
// above, the innermost returning Relu(x).
func nestedIf(depth int) *pb.ModelProto {
	body := &pb.GraphProto{Name: proto.String("b"), Node: []*pb.NodeProto{graph.NewNode("Relu", "", "r", []string{"x"}, []string{"o"})},
		Output: []*pb.ValueInfoProto{{Name: proto.String("o")}}}
	for i := 0; i < depth; i++ {
		n := graph.NewNode("If", "", fmt.Sprintf("if%d", i), []string{"c"}, []string{"o"})
		n.Attribute = []*pb.AttributeProto{
			{Name: proto.String("then_branch"), Type: pb.AttributeProto_GRAPH.Enum(), G: body},
			{Name: proto.String("else_branch"), Type: pb.AttributeProto_GRAPH.Enum(), G: &pb.GraphProto{Name: proto.String("e"),
				Node: []*pb.NodeProto{graph.NewNode("Identity", "", "id", []string{"x"}, []string{"o"})}, Output: []*pb.ValueInfoProto{{Name: proto.String("o")}}}},
		}
		body = &pb.GraphProto{Name: proto.String(fmt.Sprintf("b%d", i)), Node: []*pb.NodeProto{n}, Output: []*pb.ValueInfoProto{{Name: proto.String("o")}}}
	}
	body.Node[0].Output = []string{"y"}
	c := &pb.TensorProto{Name: proto.String("c"), DataType: proto.Int32(int32(pb.TensorProto_BOOL)), Int32Data: []int32{1}}
	return bombModel(body.Node, []*pb.TensorProto{c})
}

// TestResourceBombs: verify and run under the default memory budget end
// every memory or work bomb with exit 1 and a message saying what it needed
// and which flag helps (never a Go runtime crash or a run without end); a
// declared shape whose element count overflows is refused, not run on an
// empty tensor; If nesting costs linear time.
func TestResourceBombs(t *testing.T) {
	huge := &pb.ValueInfoProto{Name: proto.String("x"), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
		ElemType: proto.Int32(int32(pb.TensorProto_FLOAT)),
		Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{
			{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: 1 << 40}}, {Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: 1 << 40}}}}}}}}
	big := &pb.ValueInfoProto{Name: proto.String("x"), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
		ElemType: proto.Int32(int32(pb.TensorProto_FLOAT)),
		Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{
			{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: 1 << 20}}, {Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: 1 << 20}}}}}}}}
	loopBody := &pb.GraphProto{Name: proto.String("body"),
		Node:   []*pb.NodeProto{graph.NewNode("Identity", "", "keep", []string{"cond"}, []string{"cond_out"}), graph.NewNode("Relu", "", "r", []string{"v"}, []string{"v_out"})},
		Input:  []*pb.ValueInfoProto{{Name: proto.String("i")}, {Name: proto.String("cond")}, {Name: proto.String("v")}},
		Output: []*pb.ValueInfoProto{{Name: proto.String("cond_out")}, {Name: proto.String("v_out")}}}
	loop := graph.NewNode("Loop", "", "loop", []string{"trips", "", "x"}, []string{"y"})
	loop.Attribute = []*pb.AttributeProto{{Name: proto.String("body"), Type: pb.AttributeProto_GRAPH.Enum(), G: loopBody}}
	scanBody := &pb.GraphProto{Name: proto.String("body"),
		Node:   []*pb.NodeProto{graph.NewNode("Identity", "", "keep", []string{"cond"}, []string{"cond_out"}), graph.NewNode("Expand", "", "e", []string{"v", "shape"}, []string{"s_out"})},
		Input:  []*pb.ValueInfoProto{{Name: proto.String("i")}, {Name: proto.String("cond")}, {Name: proto.String("v")}},
		Output: []*pb.ValueInfoProto{{Name: proto.String("cond_out")}, {Name: proto.String("v")}, {Name: proto.String("s_out")}}}
	scanLoop := graph.NewNode("Loop", "", "loop", []string{"trips", "", "x"}, []string{"v_last", "y"})
	scanLoop.Attribute = []*pb.AttributeProto{{Name: proto.String("body"), Type: pb.AttributeProto_GRAPH.Enum(), G: scanBody}}
	for _, c := range []struct {
		name  string
		mp    *pb.ModelProto
		code  int
		want  []string
		flags []string
	}{
		{"Expand bomb", bombModel([]*pb.NodeProto{graph.NewNode("Expand", "", "bomb", []string{"x", "shape"}, []string{"y"})},
			[]*pb.TensorProto{i64Init("shape", 1<<20, 1<<18, 4)}), 1, []string{"memory limit exceeded", "--mem-limit"}, nil},
		{"ConstantOfShape bomb", bombModel([]*pb.NodeProto{graph.NewNode("ConstantOfShape", "", "bomb", []string{"shape"}, []string{"z"}), graph.NewNode("Add", "", "a", []string{"z", "x"}, []string{"y"})},
			[]*pb.TensorProto{i64Init("shape", 1<<20, 1<<20, 4)}), 1, []string{"memory limit exceeded", "--mem-limit"}, nil},
		{"Tile bomb", bombModel([]*pb.NodeProto{graph.NewNode("Tile", "", "bomb", []string{"x", "reps"}, []string{"y"})},
			[]*pb.TensorProto{i64Init("reps", 1<<40)}), 1, []string{"memory limit exceeded", "--mem-limit"}, nil},
		{"random input of huge declared dims", bombModel([]*pb.NodeProto{graph.NewNode("Relu", "", "r", []string{"x"}, []string{"y"})}, nil, big), 1, []string{"memory limit exceeded", "--mem-limit"}, nil},
		{"Loop scan outputs", bombModel([]*pb.NodeProto{scanLoop}, []*pb.TensorProto{scalarI64("trips", 1<<40), i64Init("shape", 1<<10, 1<<10, 4)}), 1, []string{"memory limit exceeded", "--mem-limit"},
			// Scan outputs grow one iteration at a time up to the budget:
			// a small budget keeps the test light.
			[]string{"--mem-limit", "256MiB"}},
		{"Loop trip count 1e15", bombModel([]*pb.NodeProto{loop}, []*pb.TensorProto{scalarI64("trips", 1e15)}), 1, []string{"work limit exceeded", "Loop"}, nil},
		{"functions 40 deep, fan-out 2", nestedFunctions(40), 1, []string{"work limit exceeded", "functions"}, nil},
		{"small model over a huge sparse side file", hugeSideFile(), 1, []string{"memory limit exceeded", `initializer "w"`, "--mem-limit"}, []string{"--mem-limit", "1GiB"}},
		{"declared dims [2^40, 2^40]", bombModel([]*pb.NodeProto{graph.NewNode("Relu", "", "r", []string{"x"}, []string{"y"})}, nil, huge), 2, []string{"too large", `"x"`}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			f := filepath.Join(dir, "bomb.onnx")
			if err := os.WriteFile(f, marshal(t, c.mp), 0o644); err != nil {
				t.Fatal(err)
			}
			if c.name == "small model over a huge sparse side file" {
				// 16 GiB of holes: the initializer's dims say so, no disk is used.
				sf, err := os.Create(filepath.Join(dir, "w.bin"))
				if err == nil {
					err = sf.Truncate(16 << 30)
					sf.Close()
				}
				if err != nil {
					t.Skipf("sparse side file: %v", err)
				}
			}
			for _, args := range [][]string{append([]string{"verify", f, f}, c.flags...)} {
				code, msg, err := runCLI(context.Background(), args)
				if code != c.code {
					t.Fatalf("%v: exit %d (%v), want %d", args, code, msg, c.code)
				}
				for _, w := range c.want {
					if !strings.Contains(msg, w) {
						t.Errorf("%v: message %q lacks %q", args, msg, w)
					}
				}
				_ = err
			}
		})
	}
}

// TestNestedIfLinear: If nodes nested 1,000 and 3,000 deep verify (exit 0,
// within the work bound), their times logged for comparison.
func TestNestedIfLinear(t *testing.T) {
	took := map[int]time.Duration{}
	for _, depth := range []int{1000, 3000} {
		f := filepath.Join(t.TempDir(), "if.onnx")
		if err := os.WriteFile(f, marshal(t, nestedIf(depth)), 0o644); err != nil {
			t.Fatal(err)
		}
		// the fastest of three runs: one slow run on a shared machine is
		// not the growth this test looks for (quadratic would be 9x)
		for range 3 {
			start := time.Now()
			code, msg, _ := runCLI(context.Background(), []string{"verify", f, f, "--tokens", "1"})
			if d := time.Since(start); took[depth] == 0 || d < took[depth] {
				took[depth] = d
			}
			if code != 0 {
				t.Fatalf("depth %d: exit %d %s", depth, code, msg)
			}
		}
	}
	// Timings are logged, not asserted (a shared machine makes them
	// noisy): a quadratic cost would show as 9x for 3x the depth.
	t.Logf("If nested 1000 deep: %v, 3000 deep: %v", took[1000], took[3000])
}

// TestRewriteOverBudget: a rewrite whose numerical check needs more than
// --mem-limit ends with exit 1, no output, and a message naming the budget
// and the flags that help, instead of a crash; a budget that holds fuses.
func TestRewriteOverBudget(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out.onnx")
	code, msg, _ := runCLI(context.Background(), []string{"rewrite", exampleModel, "-o", out, "--mem-limit", "64KiB", "-q"})
	if code != 1 {
		t.Fatalf("exit %d (%s), want 1", code, msg)
	}
	for _, w := range []string{"memory limit exceeded", "--mem-limit", "--no-check", "no output written"} {
		if !strings.Contains(msg, w) {
			t.Errorf("message %q lacks %q", msg, w)
		}
	}
	// The output is written while the check runs: nothing of it may stay.
	if es, err := os.ReadDir(dir); err != nil || len(es) != 0 {
		t.Fatalf("files left after the failed check: %v (%v)", es, err)
	}
	if code, msg, _ := runCLI(context.Background(), []string{"rewrite", exampleModel, "-o", out, "--mem-limit", "1GiB", "-q"}); code != 0 {
		t.Fatalf("within budget: exit %d %s", code, msg)
	}
}

// hugeSideFile is Relu(x) + w where w is a [2^16, 2^16] float initializer
// in the side file w.bin (16 GiB, made sparse by the test).
func hugeSideFile() *pb.ModelProto {
	w := &pb.TensorProto{Name: proto.String("w"), Dims: []int64{1 << 16, 1 << 16}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)),
		DataLocation: pb.TensorProto_EXTERNAL.Enum(), ExternalData: []*pb.StringStringEntryProto{{Key: proto.String("location"), Value: proto.String("w.bin")}}}
	return bombModel([]*pb.NodeProto{graph.NewNode("Relu", "", "r", []string{"x"}, []string{"rx"}), graph.NewNode("Add", "", "a", []string{"rx", "w"}, []string{"y"})},
		[]*pb.TensorProto{w})
}

// TestCgroupAvailable: the room a cgroup leaves, from cgroup v2 files and
// from cgroup v1's memory controller, and no limit where none is set.
func TestCgroupAvailable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  int64
		ok    bool
	}{
		{"v2 limit", map[string]string{"memory.max": "1073741824\n", "memory.current": "73741824\n"}, 1<<30 - 73741824, true},
		{"v2 no limit", map[string]string{"memory.max": "max\n", "memory.current": "5\n"}, 0, false},
		{"v2 over", map[string]string{"memory.max": "100\n", "memory.current": "200\n"}, 0, true},
		{"v1 limit", map[string]string{"memory/memory.limit_in_bytes": "2147483648\n", "memory/memory.usage_in_bytes": "147483648\n"}, 2000000000, true},
		{"v1 no limit", map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/memory.usage_in_bytes": "1\n"}, 0, false},
		{"none", map[string]string{}, 0, false},
	} {
		dir := t.TempDir()
		for name, body := range tc.files {
			os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755)
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if got, ok := cgroupAvailable(dir); got != tc.want || ok != tc.ok {
			t.Errorf("%s: %d, %v; want %d, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}
