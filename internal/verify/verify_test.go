package verify

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	fx "github.com/mokopt/mokopt/internal/fixtures"
	"google.golang.org/protobuf/proto"
)

// fixtureDir holds the exported MoE fixtures (testdata/fixtures).
var fixtureDir = fx.Dir()

func fixtures(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(fixtureDir, "*.onnx"))
	if len(files) == 0 {
		t.Fatalf("no fixtures in %s", fixtureDir)
	}
	return files
}

func load(t *testing.T, path string) *graph.Model {
	t.Helper()
	m, err := graph.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// clone deep-copies a model (same path, so messages stay readable).
func clone(m *graph.Model) *graph.Model {
	return &graph.Model{Proto: proto.Clone(m.Proto).(*pb.ModelProto), Path: m.Path + " (copy)", Dir: m.Dir}
}

// perturbRouter adds delta to element 0 of the weight read by the first
// MatMul or Gemm whose weight is an initializer (the router in the MoE
// fixtures), returning the initializer's name.
func perturbRouter(t *testing.T, m *graph.Model, delta float32) string {
	t.Helper()
	inits := map[string]int{}
	for i, ini := range m.Proto.Graph.Initializer {
		inits[ini.GetName()] = i
	}
	for _, n := range m.Proto.Graph.Node {
		if n.GetOpType() != "MatMul" && n.GetOpType() != "Gemm" {
			continue
		}
		i, ok := inits[n.Input[1]]
		if !ok {
			continue
		}
		ini := m.Proto.Graph.Initializer[i]
		w, err := eval.FromProto(ini, m.TensorBytes)
		if err != nil {
			t.Fatal(err)
		}
		w.F32[0] += delta
		p, err := eval.ToProto(w, ini.GetName())
		if err != nil {
			t.Fatal(err)
		}
		m.Proto.Graph.Initializer[i] = p
		return ini.GetName()
	}
	t.Fatal("no MatMul/Gemm weight initializer")
	return ""
}

func TestCompareFixtureWithItself(t *testing.T) {
	for _, f := range fixtures(t) {
		m := load(t, f)
		name := filepath.Base(f)
		data := strings.TrimSuffix(f, ".onnx") + "_data"
		for _, opt := range []Options{{DataDir: data}, {Tokens: []int{4, 8}, Seed: 7}} {
			r, err := Compare(context.Background(), m, clone(m), opt)
			if err != nil {
				// TorchScript traces bake the trace input's routing into
				// Split sizes, so random inputs may not run through them.
				if opt.DataDir == "" && strings.Contains(name, "torchscript") && strings.Contains(err.Error(), "use a data dir") {
					t.Logf("%s: random inputs do not run through the trace: %v", name, err)
					continue
				}
				t.Fatalf("%s: %v", name, err)
			}
			if !r.Pass || len(r.Cases) != 1 {
				t.Fatalf("%s: %s", name, r.Summary())
			}
			for _, o := range r.Cases[0].Outputs {
				if o.MaxAbsErr != 0 || o.Mismatches != 0 || o.Elements == 0 {
					t.Errorf("%s: output %q not exact: %+v", name, o.NameA, o)
				}
			}
			if opt.DataDir == "" && (r.Cases[0].Name != "fixed_shapes" || !strings.Contains(strings.Join(r.Notes, "\n"), "token counts [4 8] are ignored")) {
				t.Errorf("%s: report does not say the fixed dims were used: %v", name, r.Notes)
			}
		}
	}
}

func TestComparePerturbedFails(t *testing.T) {
	path := filepath.Join(fixtureDir, "dense_topk_block_dynamo.onnx")
	fixtures(t)
	a := load(t, path)
	b := clone(a)
	name := perturbRouter(t, b, 1e-2)
	r, err := Compare(context.Background(), a, b, Options{RTol: DefaultRTol, ATol: DefaultATol, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if r.Pass {
		t.Fatalf("perturbing %q went unnoticed:\n%s", name, r.Summary())
	}
	c := r.Cases[0]
	if !strings.Contains(c.Message, `"moe_out"`) || c.Outputs[0].Pass || c.Outputs[0].NameA != "moe_out" {
		t.Errorf("failure does not name the output: %q %+v", c.Message, c.Outputs[0])
	}
	o := c.Outputs[0]
	if len(o.WorstMultiIndex) != 3 || o.WorstIndex < 0 || o.MaxAbsErr <= 0 {
		t.Errorf("worst element not reported: %+v", o)
	}
	if s := r.Summary(); !strings.HasPrefix(s, "FAIL") || !strings.Contains(s, "moe_out") {
		t.Errorf("summary: %s", s)
	}
	// the same data through RunAndCheck: the copy fails, the original passes.
	data := filepath.Join(fixtureDir, "dense_topk_block_dynamo_data")
	rb, err := RunAndCheck(context.Background(), b, data, Options{RTol: DefaultRTol, ATol: DefaultATol})
	if err != nil {
		t.Fatal(err)
	}
	if rb.Pass {
		t.Errorf("perturbed model matches the stored outputs:\n%s", rb.Summary())
	}
}

func TestRunAndCheckFixtures(t *testing.T) {
	for _, f := range fixtures(t) {
		m := load(t, f)
		data := strings.TrimSuffix(f, ".onnx") + "_data"
		for _, dir := range []string{data, filepath.Join(data, "test_data_set_0")} {
			r, err := RunAndCheck(context.Background(), m, dir, Options{RTol: DefaultRTol, ATol: DefaultATol})
			if err != nil {
				t.Fatalf("%s: %v", dir, err)
			}
			if !r.Pass || len(r.Cases) != 1 || r.Inputs != "data" {
				t.Errorf("%s:\n%s", dir, r.Summary())
			}
		}
	}
}

func TestCompareDataDir(t *testing.T) {
	fixtures(t)
	m := load(t, filepath.Join(fixtureDir, "qwen2_moe_full_dynamo_batched_mm.onnx"))
	r, err := Compare(context.Background(), m, clone(m), Options{DataDir: filepath.Join(fixtureDir, "qwen2_moe_full_dynamo_batched_mm_data")})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Pass || r.Inputs != "data" || r.Cases[0].Name != "test_data_set_0" || r.Cases[0].Inputs[0].Name != "input_ids" {
		t.Errorf("%+v", r)
	}
}

// embedModel is a dynamic-shape model: input_ids [batch, seq] -> Gather on a
// [50, 4] embedding -> MatMul by w [4, 3] -> y [batch, seq, 3].
func embedModel(w []float32) *graph.Model {
	dim := func(p string) *pb.TensorShapeProto_Dimension {
		return &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: p}}
	}
	emb, _ := eval.ToProto(eval.NewFloat32([]int{50, 4}, make([]float32, 200)), "emb")
	for i := 0; i < 200; i++ {
		emb.RawData[4*i+3] = byte(0x3c + i%3) // small positive floats
	}
	wt, _ := eval.ToProto(eval.NewFloat32([]int{4, 3}, w), "w")
	g := &pb.GraphProto{
		Name: proto.String("embed"),
		Node: []*pb.NodeProto{
			graph.NewNode("Gather", "", "embed", []string{"emb", "input_ids"}, []string{"h"}),
			graph.NewNode("MatMul", "", "proj", []string{"h", "w"}, []string{"y"}),
		},
		Initializer: []*pb.TensorProto{emb, wt},
		Input: []*pb.ValueInfoProto{{Name: proto.String("input_ids"), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
			ElemType: proto.Int32(int32(pb.TensorProto_INT64)), Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{dim("batch"), dim("sequence")}}}}}}},
		Output: []*pb.ValueInfoProto{{Name: proto.String("y")}},
	}
	return &graph.Model{Proto: &pb.ModelProto{IrVersion: proto.Int64(8), Graph: g,
		OpsetImport: []*pb.OperatorSetIdProto{{Version: proto.Int64(18)}}}, Path: "embed.onnx"}
}

func TestRandomTokensDynamic(t *testing.T) {
	w := []float32{1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1}
	a := embedModel(w)
	r, err := Compare(context.Background(), a, embedModel(w), Options{Tokens: []int{3, 5, 3}, Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Pass || len(r.Cases) != 2 {
		t.Fatalf("%s", r.Summary())
	}
	for i, n := range []int{3, 5} {
		c := r.Cases[i]
		if c.Tokens != n || !slices.Equal(c.Inputs[0].Shape, []int{1, n}) || !slices.Equal(c.Outputs[0].ShapeA, []int{1, n, 3}) {
			t.Errorf("case %d: %+v", i, c)
		}
	}
	if notes := strings.Join(r.Notes, "\n"); !strings.Contains(notes, "[0, 50)") {
		t.Errorf("vocabulary not inferred from the embedding: %v", r.Notes)
	}
	specs, err := inputSpecs(a)
	if err != nil {
		t.Fatal(err)
	}
	x1, _, _ := randomInputs(a, specs, 64, 42, 0)
	x2, _, _ := randomInputs(a, specs, 64, 42, 0)
	x3, _, _ := randomInputs(a, specs, 64, 43, 0)
	same, diff := true, false
	for i, v := range x1[0].I64 {
		if v < 0 || v >= 50 {
			t.Fatalf("id %d out of [0, 50)", v)
		}
		same = same && v == x2[0].I64[i]
		diff = diff || v != x3[0].I64[i]
	}
	if !same || !diff {
		t.Errorf("inputs must be deterministic per seed (same %v, differ across seeds %v)", same, diff)
	}
	w2 := append([]float32{}, w...)
	w2[0] += 1e-2
	r, err = Compare(context.Background(), a, embedModel(w2), Options{Tokens: []int{4}, RTol: DefaultRTol, ATol: DefaultATol})
	if err != nil {
		t.Fatal(err)
	}
	if r.Pass || r.Cases[0].Outputs[0].Pass {
		t.Errorf("perturbed projection passed:\n%s", r.Summary())
	}
}

func TestResolveDims(t *testing.T) {
	fixed := func(v int64) dimSpec { return dimSpec{Value: v} }
	sym := func(p string) dimSpec { return dimSpec{Value: -1, Param: p} }
	cases := []struct {
		name  string
		specs []inputSpec
		want  [][]int
	}{
		{"fixed", []inputSpec{{Dims: []dimSpec{fixed(2), fixed(8), fixed(64)}}}, [][]int{{2, 8, 64}}},
		{"batch seq hidden", []inputSpec{{Dims: []dimSpec{sym("a"), sym("b"), fixed(64)}}}, [][]int{{1, 5, 64}}},
		{"unnamed", []inputSpec{{Dims: []dimSpec{sym(""), sym("")}}}, [][]int{{1, 5}}},
		{"rank 1", []inputSpec{{Dims: []dimSpec{sym("n")}}}, [][]int{{5}}},
		{"name hints", []inputSpec{{Dims: []dimSpec{sym("seq_len"), sym("batch_size")}}}, [][]int{{5, 1}}},
		{"shared names", []inputSpec{{Dims: []dimSpec{sym("b"), sym("s")}}, {Dims: []dimSpec{sym("s")}}}, [][]int{{1, 5}, {5}}},
		{"shared name keeps first value", []inputSpec{{Dims: []dimSpec{sym("x"), fixed(3)}}, {Dims: []dimSpec{fixed(2), sym("x")}}}, [][]int{{1, 3}, {2, 1}}},
	}
	for _, c := range cases {
		got := resolveDims(c.specs, 5)
		for i := range c.want {
			if !slices.Equal(got[i], c.want[i]) {
				t.Errorf("%s: got %v, want %v", c.name, got, c.want)
			}
		}
	}
}

// pairModel outputs y = Identity(x) and optionally extra outputs.
func pairModel(extra ...*pb.NodeProto) *graph.Model {
	x := &pb.ValueInfoProto{Name: proto.String("x"), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
		ElemType: proto.Int32(int32(pb.TensorProto_FLOAT)), Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{
			{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: 2}}, {Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: 3}}}}}}}}
	g := &pb.GraphProto{Node: []*pb.NodeProto{graph.NewNode("Identity", "", "", []string{"x"}, []string{"y"})}, Input: []*pb.ValueInfoProto{x},
		Output: []*pb.ValueInfoProto{{Name: proto.String("y")}}}
	for _, n := range extra {
		g.Node = append(g.Node, n)
		g.Output = append(g.Output, &pb.ValueInfoProto{Name: proto.String(n.Output[0])})
	}
	return &graph.Model{Proto: &pb.ModelProto{IrVersion: proto.Int64(8), Graph: g, OpsetImport: []*pb.OperatorSetIdProto{{Version: proto.Int64(18)}}}}
}

func TestStructuralMismatches(t *testing.T) {
	flat := graph.NewNode("Flatten", "", "", []string{"x"}, []string{"z"}, graph.IntAttr("axis", 0))
	same := graph.NewNode("Identity", "", "", []string{"x"}, []string{"z"})
	cast := graph.NewNode("Cast", "", "", []string{"x"}, []string{"z"}, graph.IntAttr("to", int64(pb.TensorProto_DOUBLE)))
	cases := []struct {
		name string
		a, b *graph.Model
		want string
	}{
		{"count", pairModel(), pairModel(same), "output count differs: a has 1 (y), b has 2 (y, z)"},
		{"shape", pairModel(same), pairModel(flat), "shape differs: a is [2 3], b is [1 6]"},
		{"type", pairModel(same), pairModel(cast), "type differs: a is FLOAT, b is DOUBLE"},
	}
	for _, c := range cases {
		r, err := Compare(context.Background(), c.a, c.b, Options{})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if r.Pass || !strings.Contains(r.Summary(), c.want) {
			t.Errorf("%s: want a failure saying %q:\n%s", c.name, c.want, r.Summary())
		}
	}
}

func TestReportJSON(t *testing.T) {
	r := &Report{SchemaVersion: SchemaVersion, Cases: []Case{{Name: "c", Outputs: []OutputCheck{{MaxAbsErr: Float(math.Inf(1)), MaxRelErr: Float(math.NaN()), WorstA: 1.5}}}}}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{`"schema_version":1`, `"max_abs_err":"Inf"`, `"max_rel_err":"NaN"`, `"worst_a":1.5`, `"worst_multi_index"`} {
		if !strings.Contains(s, want) {
			t.Errorf("JSON lacks %s: %s", want, s)
		}
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !math.IsInf(float64(back.Cases[0].Outputs[0].MaxAbsErr), 1) || !math.IsNaN(float64(back.Cases[0].Outputs[0].MaxRelErr)) {
		t.Errorf("round trip lost non-finite values: %+v", back.Cases[0].Outputs[0])
	}
}

func TestOptionErrors(t *testing.T) {
	m := pairModel()
	if _, err := Compare(context.Background(), m, m, Options{RTol: -1}); err == nil {
		t.Error("negative rtol accepted")
	}
	if _, err := Compare(context.Background(), m, m, Options{DataDir: t.TempDir()}); !errors.Is(err, graph.ErrBadInput) {
		t.Errorf("empty data dir: %v", err)
	}
	if _, err := RunAndCheck(context.Background(), m, filepath.Join(t.TempDir(), "missing"), Options{}); !errors.Is(err, graph.ErrBadInput) {
		t.Errorf("missing data dir: %v", err)
	}
	if _, err := Compare(context.Background(), embedModel(make([]float32, 12)), embedModel(make([]float32, 12)), Options{Tokens: []int{0}}); err == nil {
		t.Error("zero tokens accepted")
	}
}
