package ep

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// oneOp builds a model that applies one node (domain::op with attrs) to
// float input "x" (and optional int64 "i", float "w") and outputs all of its outputs.
func oneOp(domain, op string, ins []string, outs []string, attrs ...*pb.AttributeProto) *graph.Model {
	g := &pb.GraphProto{Name: proto.String("t")}
	for _, in := range ins {
		et := pb.TensorProto_FLOAT
		if in == "i" {
			et = pb.TensorProto_INT64
		}
		g.Input = append(g.Input, &pb.ValueInfoProto{Name: proto.String(in), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: proto.Int32(int32(et))}}}})
	}
	for _, o := range outs {
		g.Output = append(g.Output, &pb.ValueInfoProto{Name: proto.String(o)})
	}
	g.Node = []*pb.NodeProto{graph.NewNode(op, domain, "n", ins, outs, attrs...)}
	mp := &pb.ModelProto{IrVersion: proto.Int64(10), Graph: g, OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(18)}, {Domain: proto.String(domain), Version: proto.Int64(1)}}}
	return &graph.Model{Proto: mp}
}

func f32(shape []int, v ...float32) *eval.Tensor { return eval.NewFloat32(shape, v) }

func TestCollectives(t *testing.T) {
	G := 2
	x := func(r int) *eval.Tensor { // [4, 1]: rows 10r+0..3
		return f32([]int{4, 1}, float32(10*r), float32(10*r+1), float32(10*r+2), float32(10*r+3))
	}
	gs := graph.IntAttr("group_size", int64(G))
	for _, tc := range []struct {
		name string
		m    *graph.Model
		want [][]float32
	}{
		{"all_to_all", oneOp("com.microsoft", "AllToAll", []string{"x"}, []string{"y"}, gs), [][]float32{{0, 1, 10, 11}, {2, 3, 12, 13}}},
		{"all_gather", oneOp("com.microsoft", "AllGather", []string{"x"}, []string{"y"}, gs), [][]float32{{0, 1, 2, 3, 10, 11, 12, 13}, {0, 1, 2, 3, 10, 11, 12, 13}}},
		{"all_reduce", oneOp("com.microsoft", "AllReduce", []string{"x"}, []string{"y"}, gs), [][]float32{{10, 12, 14, 16}, {10, 12, 14, 16}}},
		{"combine", oneOp("deep_ep", "combine", []string{"x"}, []string{"y"}, graph.IntAttr("num_ranks", 2)), [][]float32{{10, 12}, {14, 16}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outs, err := RunRanks(context.Background(), nil, []*graph.Model{tc.m, tc.m}, []map[string]*eval.Tensor{{"x": x(0)}, {"x": x(1)}}, eval.Options{})
			if err != nil {
				t.Fatal(err)
			}
			for r, o := range outs {
				if !slices.Equal(o["y"].F32, tc.want[r]) {
					t.Errorf("rank %d: got %v, want %v", r, o["y"].F32, tc.want[r])
				}
			}
		})
	}
}

func TestDispatch(t *testing.T) {
	// 2 ranks, 4 experts (2 per rank), T=2 tokens, k=2, H=1.
	m := oneOp("deep_ep", "dispatch", []string{"x", "i", "w"}, []string{"rx", "ri", "rw", "h"}, graph.IntAttr("num_ranks", 2), graph.IntAttr("num_experts", 4))
	feeds := []map[string]*eval.Tensor{
		{"x": f32([]int{2, 1}, 1, 2), "i": eval.NewInt64([]int{2, 2}, []int64{0, 1, 1, 3}), "w": f32([]int{2, 2}, .5, .5, .25, .75)},
		{"x": f32([]int{2, 1}, 3, 4), "i": eval.NewInt64([]int{2, 2}, []int64{2, 3, 0, 2}), "w": f32([]int{2, 2}, .6, .4, .3, .7)},
	}
	outs, err := RunRanks(context.Background(), nil, []*graph.Model{m, m}, feeds, eval.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// rank 0 owns experts 0,1: rows (rank0 t0: 0,1), (rank0 t1: 1,-), (rank1 t0: none), (rank1 t1: 0,-)
	want := []struct {
		rx []float32
		ri []int64
		rw []float32
		h  []int64
	}{
		{[]float32{1, 2, 0, 4}, []int64{0, 1, 1, -1, -1, -1, 0, -1}, []float32{.5, .5, .25, 0, 0, 0, .3, 0}, []int64{0, 1, -1, 1}},
		{[]float32{0, 2, 3, 4}, []int64{-1, -1, -1, 1, 0, 1, -1, 0}, []float32{0, 0, 0, .75, .6, .4, 0, .7}, []int64{-1, 1, 0, 1}},
	}
	for r, o := range outs {
		w := want[r]
		if !slices.Equal(o["rx"].F32, w.rx) || !slices.Equal(o["ri"].I64, w.ri) || !slices.Equal(o["rw"].F32, w.rw) || !slices.Equal(o["h"].I64, w.h) {
			t.Errorf("rank %d: rx %v ri %v rw %v h %v", r, o["rx"].F32, o["ri"].I64, o["rw"].F32, o["h"].I64)
		}
	}
}

func TestSimulatorErrors(t *testing.T) {
	a2a := oneOp("com.microsoft", "AllToAll", []string{"x"}, []string{"y"}, graph.IntAttr("group_size", 2))
	red := oneOp("com.microsoft", "AllReduce", []string{"x"}, []string{"y"}, graph.IntAttr("group_size", 2))
	x := map[string]*eval.Tensor{"x": f32([]int{2, 1}, 1, 2)}
	odd := map[string]*eval.Tensor{"x": f32([]int{3, 1}, 1, 2, 3)}
	for _, tc := range []struct {
		name  string
		ms    []*graph.Model
		feeds []map[string]*eval.Tensor
		want  string
	}{
		{"diverging graphs", []*graph.Model{a2a, red}, []map[string]*eval.Tensor{x, x}, "diverge"},
		{"group size attribute", []*graph.Model{a2a, a2a, a2a}, []map[string]*eval.Tensor{x, x, x}, "group_size=2 but the simulated group has 3"},
		{"uneven split", []*graph.Model{a2a, a2a}, []map[string]*eval.Tensor{x, odd}, "not a multiple"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := RunRanks(context.Background(), nil, tc.ms, tc.feeds, eval.Options{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	Install(DefaultTable())
	if _, err := eval.Run(context.Background(), a2a, x, eval.Options{}); err == nil || !errors.Is(err, ErrNoGroup) && !strings.Contains(err.Error(), "outside an EP simulation") {
		t.Fatalf("a collective outside a group: %v", err)
	}
}

func TestLoadTable(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, json, want string
		lookup           string // domain::op that must resolve
	}{
		{"add", `{"ops":[{"domain":"my_ep","op":"send","kind":"dispatch","group_attr":"world","experts_attr":"experts"}]}`, "", "my_ep::send"},
		{"defaults kept", `{"ops":[]}`, "", "deep_ep::dispatch"},
		{"bad kind", `{"ops":[{"domain":"x","op":"y","kind":"scatter","group_attr":"g"}]}`, "kind \"scatter\"", ""},
		{"dispatch without experts", `{"ops":[{"domain":"x","op":"y","kind":"dispatch","group_attr":"g"}]}`, "experts_attr", ""},
		{"not json", `{`, "EP op table", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name+".json")
			if err := os.WriteFile(p, []byte(tc.json), 0o644); err != nil {
				t.Fatal(err)
			}
			tb, err := LoadTable(p)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			d, op, _ := strings.Cut(tc.lookup, "::")
			if _, ok := tb.Lookup(d, op); !ok {
				t.Fatalf("%s not in the table", tc.lookup)
			}
		})
	}
	p := filepath.Join(dir, "replace.json")
	os.WriteFile(p, []byte(`{"replace_defaults":true,"ops":[{"domain":"my_ep","op":"recv","kind":"combine","group_attr":"world"}]}`), 0o644)
	tb, err := LoadTable(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tb.Lookup("deep_ep", "dispatch"); ok || len(tb.Ops) != 1 {
		t.Fatalf("replace_defaults kept the defaults: %+v", tb.Ops)
	}
}
