package passes

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// refusalDir holds exports of producers beyond torch.onnx's defaults
// (testdata/producers/README.md), each case described in manifest.json.
const refusalDir = "../testdata/producers"

// manifestCase is one case of testdata/producers/manifest.json.
type manifestCase struct {
	Name     string         `json:"name"`
	Class    string         `json:"class"`
	OK       bool           `json:"ok"`
	Kept     *bool          `json:"kept"`
	Sizes    map[string]any `json:"sizes"`
	Expected struct {
		Verdict  string `json:"verdict"`
		Capacity int64  `json:"capacity"`
		// RunTime: the capacity is computed from the token count in the
		// graph (dynamic shapes); Capacity is its value at the traced size.
		RunTime bool `json:"capacity_at_run_time"`
		// Blocks is the number of MoE blocks (0 read as 1).
		Blocks int `json:"blocks"`
		// E (a number, or a note where it varies), K and Shared are
		// what a fused block must read.
		E      json.RawMessage `json:"E"`
		K      int             `json:"k"`
		Shared bool            `json:"shared"`
	} `json:"expected"`
	// Sets is the number of golden test data sets.
	Sets int `json:"test_data_sets"`
}

// manifestCases returns the committed cases of the manifest of the given
// producer classes (all when none are named).
func manifestCases(t *testing.T, classes ...string) []manifestCase {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(refusalDir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var man struct {
		Cases []manifestCase `json:"cases"`
	}
	if err := json.Unmarshal(b, &man); err != nil {
		t.Fatal(err)
	}
	var out []manifestCase
	for _, c := range man.Cases {
		if !c.OK || c.Kept != nil && !*c.Kept || len(classes) > 0 && !slices.Contains(classes, c.Class) {
			continue
		}
		out = append(out, c)
	}
	return out
}

// nodeByName returns the node of m named name, or nil.
func nodeByName(m *graph.Model, name string) *pb.NodeProto {
	for _, n := range m.Proto.GetGraph().GetNode() {
		if graph.NodeLabel(n) == name {
			return n
		}
	}
	return nil
}

// classNearMiss returns the near-misses of class cls.
func classNearMiss(nm []NearMiss, cls string) []NearMiss {
	var out []NearMiss
	for _, n := range nm {
		if n.Class == cls {
			out = append(out, n)
		}
	}
	return out
}

// TestCapacityRoutersRefused: every capacity-limited export is reported, by
// inspect's detection and by rewrite, as a near-miss that names the
// capacity the export was made with (from the manifest, not the graph), a
// selection node and a comparison node of the model; nothing is fused and
// rewrite refuses to write the model as if it had no MoE.
func TestCapacityRoutersRefused(t *testing.T) {
	cases := manifestCases(t, "capacity")
	if len(cases) < 6 {
		t.Fatalf("%d capacity cases in the manifest, want at least 6", len(cases))
	}
	quoted := regexp.MustCompile(`(Less|LessOrEqual|Greater|GreaterOrEqual) "([^"]+)"`)
	for _, pc := range cases {
		t.Run(pc.Name, func(t *testing.T) {
			capWant := pc.Expected.Capacity
			if pc.Expected.Verdict != "refuse" || capWant <= 0 {
				t.Fatalf("manifest: verdict %q capacity %d", pc.Expected.Verdict, capWant)
			}
			m, err := graph.Load(filepath.Join(refusalDir, pc.Name+".onnx"))
			if err != nil {
				t.Fatal(err)
			}
			d, err := Detect(m)
			if err != nil {
				t.Fatal(err)
			}
			if len(d.Blocks) != 0 {
				t.Fatalf("fused %d block(s) of a capacity-limited router", len(d.Blocks))
			}
			nm := classNearMiss(d.NearMiss, ClassCapacity)
			if len(nm) != 1 {
				t.Fatalf("capacity near-misses %+v (all: %+v), want 1", nm, d.NearMiss)
			}
			n := nm[0]
			capText := "expert_capacity " + strconv.FormatInt(capWant, 10) + ":"
			if pc.Expected.RunTime {
				capWant, capText = 0, "computed at run time"
				if len(n.Capacity) != 0 || !strings.Contains(n.Reason, capText) {
					t.Fatalf("capacity %v, reason %q; want one computed at run time", n.Capacity, n.Reason)
				}
			} else if !slices.Equal(n.Capacity, []int64{capWant}) || !strings.Contains(n.Reason, capText) {
				t.Fatalf("capacity %v, reason %q; want %d", n.Capacity, n.Reason, capWant)
			}
			if sel := nodeByName(m, n.Node); sel == nil || (sel.GetOpType() != "ArgMax" && sel.GetOpType() != "TopK") {
				t.Fatalf("near-miss node %q is not a selection of the model", n.Node)
			}
			ms := quoted.FindAllStringSubmatch(n.Reason, -1)
			if len(ms) == 0 {
				t.Fatalf("reason names no comparison: %q", n.Reason)
			}
			for _, mm := range ms {
				if cmp := nodeByName(m, mm[2]); cmp == nil || cmp.GetOpType() != mm[1] {
					t.Fatalf("reason names %s %q, not a node of the model", mm[1], mm[2])
				}
			}
			if !strings.Contains(n.Reason, "never drops tokens") {
				t.Fatalf("reason does not say why: %q", n.Reason)
			}
			// rewrite: all-or-nothing refuses with the reason; Partial writes
			// nothing fused and keeps the near-miss in its report.
			_, err = Rewrite(m, Options{Check: true})
			if !errors.Is(err, ErrNotFused) || !strings.Contains(err.Error(), capText) {
				t.Fatalf("rewrite: %v", err)
			}
			rep, err := Rewrite(m, Options{Check: true, Partial: true})
			if err != nil || len(rep.Fused) != 0 || len(classNearMiss(rep.NearMiss, ClassCapacity)) != 1 {
				t.Fatalf("partial rewrite: err %v report %v", err, rep)
			}
		})
	}
}

// TestQuantizedBlocksRefused: every dynamically int8-quantized export is
// refused with a near-miss that says the block is int8-quantized and names
// integer linears of the model (MatMulInteger fed by a DynamicQuantizeLinear,
// or the contrib ops ONNX Runtime fuses them into).
func TestQuantizedBlocksRefused(t *testing.T) {
	cases := manifestCases(t, "int8_dyn")
	if len(cases) < 4 {
		t.Fatalf("%d int8 cases in the manifest, want at least 4", len(cases))
	}
	for _, pc := range cases {
		t.Run(pc.Name, func(t *testing.T) {
			m, err := graph.Load(filepath.Join(refusalDir, pc.Name+".onnx"))
			if err != nil {
				t.Fatal(err)
			}
			d, err := Detect(m)
			if err != nil {
				t.Fatal(err)
			}
			if len(d.Blocks) != 0 {
				t.Fatalf("fused %d quantized block(s)", len(d.Blocks))
			}
			nm := classNearMiss(d.NearMiss, ClassQuantized)
			if want := max(1, pc.Expected.Blocks); len(nm) != want {
				t.Fatalf("quantized near-misses %+v (all %+v), want %d", nm, d.NearMiss, want)
			}
			for _, n := range nm {
				checkQuantNearMiss(t, m, n)
			}
			if _, err := Rewrite(m, Options{Check: true}); !errors.Is(err, ErrNotFused) || !strings.Contains(err.Error(), "int8-quantized") {
				t.Fatalf("rewrite: %v", err)
			}
		})
	}
}

// checkQuantNearMiss checks that an int8 near-miss says so and names a
// selection (a TopK, or the ArgMax of a top-1 router) and integer linears of
// m.
// TestQDQBlocksRefused: exports quantized statically into the QDQ form
// (integer weights and activations dequantized around float linears) are
// never fused nor silently passed over: each block is one quantized
// near-miss at its selection, naming the router linear and the
// DequantizeLinear of its integer weight, and Rewrite refuses.
func TestQDQBlocksRefused(t *testing.T) {
	cases := manifestCases(t, "int8_qdq")
	if len(cases) < 3 {
		t.Fatalf("%d QDQ cases in the manifest, want at least 3", len(cases))
	}
	named := regexp.MustCompile(`router linear is (Gemm|MatMul) "([^"]+)" \(weight "([^"]+)" int8 \[[0-9 ]+\] through DequantizeLinear "([^"]+)"\)`)
	for _, pc := range cases {
		t.Run(pc.Name, func(t *testing.T) {
			m, err := graph.Load(filepath.Join(refusalDir, pc.Name+".onnx"))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			d, err := Detect(m)
			if err != nil {
				t.Fatal(err)
			}
			nm := classNearMiss(d.NearMiss, ClassQuantized)
			if len(d.Blocks) != 0 || len(nm) != max(1, pc.Expected.Blocks) {
				t.Fatalf("%d blocks, quantized near-misses %+v (all %+v)", len(d.Blocks), nm, d.NearMiss)
			}
			n := nm[0]
			if !strings.Contains(n.Reason, "QDQ quantization") {
				t.Fatalf("reason %q", n.Reason)
			}
			if tk := nodeByName(m, n.Node); tk == nil || tk.GetOpType() != "TopK" && tk.GetOpType() != "ArgMax" {
				t.Fatalf("near-miss node %q is not a TopK or ArgMax of the model", n.Node)
			}
			mm := named.FindStringSubmatch(n.Reason)
			if mm == nil {
				t.Fatalf("reason names no dequantized router weight: %q", n.Reason)
			}
			lin, dq := nodeByName(m, mm[2]), nodeByName(m, mm[4])
			if lin == nil || lin.GetOpType() != mm[1] || dq == nil || dq.GetOpType() != "DequantizeLinear" || dq.Input[0] != mm[3] {
				t.Fatalf("reason names %s %q over %q, not the model's", mm[1], mm[2], mm[4])
			}
			if _, err := Rewrite(m, Options{Check: true}); !errors.Is(err, ErrNotFused) || !strings.Contains(err.Error(), "int8-quantized") {
				t.Fatalf("rewrite: %v", err)
			}
		})
	}
}

func checkQuantNearMiss(t *testing.T, m *graph.Model, n NearMiss) {
	t.Helper()
	quoted := regexp.MustCompile(`(MatMulInteger|MatMulIntegerToFloat|DynamicQuantizeMatMul) "([^"]+)"`)
	if !strings.Contains(n.Reason, "int8-quantized MoE block (dynamic quantization)") || !regexp.MustCompile(`router linear is `+quoted.String()).MatchString(n.Reason) {
		t.Fatalf("reason %q", n.Reason)
	}
	if tk := nodeByName(m, n.Node); tk == nil || tk.GetOpType() != "TopK" && tk.GetOpType() != "ArgMax" {
		t.Fatalf("near-miss node %q is not a TopK or ArgMax of the model", n.Node)
	}
	ms := quoted.FindAllStringSubmatch(n.Reason, -1)
	if len(ms) == 0 {
		t.Fatalf("reason names no integer linear: %q", n.Reason)
	}
	for _, mm := range ms {
		q := nodeByName(m, mm[2])
		if q == nil || q.GetOpType() != mm[1] {
			t.Fatalf("reason names %s %q, not a node of the model", mm[1], mm[2])
		}
		if mm[1] == "DynamicQuantizeMatMul" {
			continue // quantizes its float input itself
		}
		if p := m.Graph().Producer(q.Input[0]); p == nil || p.GetOpType() != "DynamicQuantizeLinear" {
			t.Fatalf("%q is not fed by a DynamicQuantizeLinear", mm[2])
		}
	}
}

// TestRefusalClassesOnlyWhereDue: no float, uncapped export (every other
// producer case, and the exported families) is reported as
// capacity-limited or quantized.
func TestRefusalClassesOnlyWhereDue(t *testing.T) {
	var files []string
	for _, pc := range manifestCases(t) {
		if pc.Class != "capacity" && pc.Class != "int8_dyn" && pc.Class != "int8_qdq" {
			files = append(files, filepath.Join(refusalDir, pc.Name+".onnx"))
		}
	}
	more, _ := filepath.Glob(filepath.Join(exportedDir, "*.onnx"))
	files = append(files, more...)
	if len(files) < 40 {
		t.Fatalf("%d models", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			m, err := graph.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			d, err := Detect(m)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range d.NearMiss {
				if n.Class != "" {
					t.Fatalf("near-miss of class %s: %+v", n.Class, n)
				}
			}
		})
	}
}

// TestCapacityArithmetic reads the capacity from comparisons written in
// the different ways routers write them, on a minimal capacity router:
// logits = x W; idx = ArgMax(Softmax(logits)); mask = OneHot(idx);
// pos = CumSum(mask) + off; keep = pos CMP limit (or limit CMP pos).
func TestCapacityArithmetic(t *testing.T) {
	cases := []struct {
		name       string
		off, limit int64
		cmp        string
		posLeft    bool
		want       int64
		onehot     string // how the expert mask is made: OneHot (default), Equal, Gather, ScatterElements
		reduce     bool   // the position is summed over the experts before the comparison
	}{
		{"count <= C (Switch)", 0, 3, "LessOrEqual", true, 3, "", false},
		{"count-1 < C (NLLB)", -1, 5, "Less", true, 5, "", false},
		{"count < C", 0, 4, "Less", true, 3, "", false},
		{"C > count-1", -1, 2, "Greater", false, 2, "", false},
		{"C >= count", 0, 7, "GreaterOrEqual", false, 7, "", false},
		{"count+1 <= C", 1, 6, "LessOrEqual", true, 5, "", false},
		{"one-hot as indices == arange", -1, 4, "Less", true, 4, "Equal", false},
		{"one-hot as eye(E)[indices]", -1, 4, "Less", true, 4, "Gather", false},
		{"one-hot by scatter", 0, 4, "LessOrEqual", true, 4, "ScatterElements", false},
		{"position summed over experts", -1, 3, "Less", true, 3, "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nodes := []*pb.NodeProto{
				graph.NewNode("MatMul", "", "router", []string{"x", "w"}, []string{"logits"}),
				graph.NewNode("Softmax", "", "sm", []string{"logits"}, []string{"p"}),
				graph.NewNode("ArgMax", "", "pick", []string{"p"}, []string{"idx"}, graph.IntAttr("axis", -1), graph.IntAttr("keepdims", 1)),
			}
			switch tc.onehot {
			case "":
				nodes = append(nodes, graph.NewNode("OneHot", "", "onehot", []string{"idx", "depth", "vals"}, []string{"mask"}))
			case "Equal":
				nodes = append(nodes, graph.NewNode("Equal", "", "onehot", []string{"idx", "arange"}, []string{"mask"}))
			case "Gather":
				nodes = append(nodes, graph.NewNode("Gather", "", "onehot", []string{"eye", "idx"}, []string{"mask"}))
			case "ScatterElements":
				nodes = append(nodes, graph.NewNode("ScatterElements", "", "onehot", []string{"zeros", "idx", "ones"}, []string{"mask"}, graph.IntAttr("axis", 1)))
			}
			nodes = append(nodes,
				graph.NewNode("CumSum", "", "count", []string{"mask", "axis0"}, []string{"c"}),
				graph.NewNode("Add", "", "shift", []string{"c", "off"}, []string{"pos0"}))
			if tc.reduce {
				nodes = append(nodes,
					graph.NewNode("Mul", "", "own", []string{"pos0", "mask"}, []string{"posm"}),
					graph.NewNode("ReduceSum", "", "pertoken", []string{"posm", "axes"}, []string{"pos"}))
			} else {
				nodes = append(nodes, graph.NewNode("Identity", "", "same", []string{"pos0"}, []string{"pos"}))
			}
			in := []string{"pos", "limit"}
			if !tc.posLeft {
				in = []string{"limit", "pos"}
			}
			nodes = append(nodes,
				graph.NewNode(tc.cmp, "", "cap", in, []string{"keep"}),
				graph.NewNode("Cast", "", "tofloat", []string{"keep"}, []string{"kf"}),
				graph.NewNode("Cast", "", "maskf", []string{"mask"}, []string{"mf"}),
				graph.NewNode("Mul", "", "kept", []string{"mf", "kf"}, []string{"y"}))
			inits := []*pb.TensorProto{
				moe.Float32Tensor("w", []int64{8, 4}, make([]float32, 32)),
				moe.Int64Tensor("depth", nil, []int64{4}),
				moe.Int64Tensor("vals", []int64{2}, []int64{0, 1}),
				moe.Int64Tensor("axis0", nil, []int64{0}),
				moe.Int64Tensor("off", nil, []int64{tc.off}),
				moe.Int64Tensor("limit", nil, []int64{tc.limit}),
				moe.Int64Tensor("arange", []int64{4}, []int64{0, 1, 2, 3}),
				moe.Int64Tensor("eye", []int64{4, 4}, []int64{1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}),
				moe.Int64Tensor("zeros", []int64{4, 4}, make([]int64, 16)),
				moe.Int64Tensor("ones", []int64{4, 1}, []int64{1, 1, 1, 1}),
				moe.Int64Tensor("axes", []int64{1}, []int64{-1}),
			}
			d, err := Detect(tinyModel(nodes, inits, "x", "y"))
			if err != nil {
				t.Fatal(err)
			}
			nm := classNearMiss(d.NearMiss, ClassCapacity)
			if len(nm) != 1 || !slices.Equal(nm[0].Capacity, []int64{tc.want}) || nm[0].Node != "pick" {
				t.Fatalf("near-misses %+v, want capacity %d at pick", d.NearMiss, tc.want)
			}
		})
	}
	// The same count compared with something else than a constant, and a
	// one-hot that is not a router's (ArgMax of the input): not reported
	// as a capacity, or reported without inventing a number.
	t.Run("no router", func(t *testing.T) {
		nodes := []*pb.NodeProto{
			graph.NewNode("ArgMax", "", "pick", []string{"x"}, []string{"idx"}, graph.IntAttr("axis", -1), graph.IntAttr("keepdims", 0)),
			graph.NewNode("OneHot", "", "onehot", []string{"idx", "depth", "vals"}, []string{"mask"}),
			graph.NewNode("CumSum", "", "count", []string{"mask", "axis0"}, []string{"c"}),
			graph.NewNode("LessOrEqual", "", "cap", []string{"c", "limit"}, []string{"keep"}),
			graph.NewNode("Cast", "", "tofloat", []string{"keep"}, []string{"y"}),
		}
		inits := []*pb.TensorProto{
			moe.Int64Tensor("depth", nil, []int64{4}), moe.Int64Tensor("vals", []int64{2}, []int64{0, 1}),
			moe.Int64Tensor("axis0", nil, []int64{0}), moe.Int64Tensor("limit", nil, []int64{2}),
		}
		d, err := Detect(tinyModel(nodes, inits, "x", "y"))
		if err != nil {
			t.Fatal(err)
		}
		if nm := classNearMiss(d.NearMiss, ClassCapacity); len(nm) != 0 {
			t.Fatalf("reported %+v without a router linear", nm)
		}
	})
}

// TestRefusalOrderInvariant: the capacity and int8 near-misses (node,
// reason, class, capacity) do not depend on the order of the graph's nodes.
func TestRefusalOrderInvariant(t *testing.T) {
	for _, pc := range manifestCases(t, "capacity", "int8_dyn", "int8_qdq") {
		t.Run(pc.Name, func(t *testing.T) {
			f := filepath.Join(refusalDir, pc.Name+".onnx")
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			summary := func(shuffle *rand.Rand) string {
				m, err := graph.Parse(raw, f)
				if err != nil {
					t.Fatal(err)
				}
				if shuffle != nil {
					shuffleOrder(m.Proto.Graph, shuffle)
				}
				d, err := Detect(m)
				if err != nil {
					t.Fatal(err)
				}
				var out []string
				for _, n := range d.NearMiss {
					if n.Class != "" {
						out = append(out, fmt.Sprintf("%s|%s|%s|%v", n.Node, n.Reason, n.Class, n.Capacity))
					}
				}
				return strings.Join(out, "\n")
			}
			want := summary(nil)
			if want == "" {
				t.Fatal("no capacity or int8 near-miss in file order")
			}
			rng := rand.New(rand.NewPCG(uint64(len(raw)), 11))
			for trial := range 8 {
				if got := summary(rng); got != want {
					t.Fatalf("trial %d:\n got %s\nwant %s", trial, got, want)
				}
			}
		})
	}
}

// TestFloatBlockBeforeQuantizedLinear: a float block whose output feeds a
// dynamically quantized linear (a partly quantized model) still fuses; only
// blocks that compute with integer linears are refused as quantized.
func TestFloatBlockBeforeQuantizedLinear(t *testing.T) {
	m, err := graph.Load(filepath.Join(exportedDir, "qwen3_moe_block_torchscript.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	gp := m.Proto.Graph
	out := gp.Output[0].GetName()
	w := &pb.TensorProto{Name: proto.String("wq"), Dims: []int64{64, 16}, DataType: proto.Int32(int32(pb.TensorProto_INT8)), RawData: make([]byte, 64*16)}
	gp.Initializer = append(gp.Initializer, w, moe.Float32Tensor("wscale", nil, []float32{0.01}))
	gp.Node = append(gp.Node,
		graph.NewNode("DynamicQuantizeLinear", "", "after/dql", []string{out}, []string{"q", "qs", "qz"}),
		graph.NewNode("MatMulInteger", "", "after/mmi", []string{"q", "wq", "qz"}, []string{"acc"}),
		graph.NewNode("Cast", "", "after/cast", []string{"acc"}, []string{"accf"}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT))),
		graph.NewNode("Mul", "", "after/scale", []string{"qs", "wscale"}, []string{"s"}),
		graph.NewNode("Mul", "", "after/deq", []string{"accf", "s"}, []string{"proj"}))
	gp.Output = append(gp.Output, &pb.ValueInfoProto{Name: proto.String("proj")})
	d, err := Detect(m)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Blocks) != 1 || len(d.NearMiss) != 0 {
		t.Fatalf("blocks %d, near-misses %+v; want the float block fused", len(d.Blocks), d.NearMiss)
	}
}

// TestRefusalMalformedNoPanic: nodes with missing inputs or outputs on the
// capacity and quantized paths give a result, never a panic.
func TestRefusalMalformedNoPanic(t *testing.T) {
	nodes := []*pb.NodeProto{
		graph.NewNode("MatMul", "", "router", []string{"x", "w"}, []string{"logits"}),
		graph.NewNode("Softmax", "", "sm", []string{"logits"}, []string{"p"}),
		graph.NewNode("ArgMax", "", "pick", []string{"p"}, []string{"idx"}),
		graph.NewNode("OneHot", "", "onehot", []string{"idx"}, []string{"mask"}),
		graph.NewNode("CumSum", "", "count", []string{"mask"}, []string{"c"}),
		graph.NewNode("CumSum", "", "nothing", []string{"mask"}, nil),
		graph.NewNode("Sub", "", "half", []string{"c"}, []string{"pos"}),
		graph.NewNode("Less", "", "cap", []string{"pos"}, []string{"keep"}),
		graph.NewNode("TopK", "", "tk", []string{"p"}, []string{"v", "i"}),
		graph.NewNode("MatMulInteger", "", "mmi", []string{"w"}, []string{"acc"}),
		graph.NewNode("Add", "", "y", []string{"keep", "acc", "i"}, []string{"y"}),
	}
	m := tinyModel(nodes, []*pb.TensorProto{moe.Float32Tensor("w", []int64{8, 4}, make([]float32, 32))}, "x", "y")
	d, err := Detect(m)
	if err == nil && d == nil {
		t.Fatal("no detection and no error")
	}
}
