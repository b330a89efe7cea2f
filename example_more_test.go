package mokopt_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/models"
)

// exampleData is the ONNX test data set of the bundled example (inputs and
// ONNX Runtime's outputs).
const exampleData = "testdata/example/mixtral_block_dynamo_batched_mm_data"

func ExampleLoad() {
	m, err := mokopt.Load(exampleModel)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	fmt.Println(m.Name(), len(m.Graph().Proto.Graph.Node), "nodes")
	// Output:
	// testdata/example/mixtral_block_dynamo_batched_mm.onnx 31 nodes
}

func ExampleRead() {
	f, err := os.Open(exampleModel)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer f.Close()
	m, err := mokopt.Read(f, "stream")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(m.Name(), len(m.Graph().Proto.Graph.Initializer), "initializers")
	// Output:
	// stream 12 initializers
}

func ExampleWrap() {
	g, err := models.Build(models.Config{Shape: models.ShapeUnrolled, Layers: 1, Experts: 4, TopK: 2, Hidden: 32, Inter: 64, Router: "softmax", Normalize: true, Seed: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	in, err := mokopt.Inspect(context.Background(), mokopt.Wrap(g))
	if err != nil {
		fmt.Println(err)
		return
	}
	b := in.MoE.Blocks[0]
	fmt.Printf("%s: E=%d k=%d\n", b.Kind, b.Spec.NumExperts, b.Spec.TopK)
	// Output:
	// unrolled: E=4 k=2
}

func ExampleInspectWith() {
	m, _ := mokopt.Load(exampleModel)
	defer m.Close()
	in, err := mokopt.InspectWith(context.Background(), m, mokopt.InspectOptions{EPTable: nil}) // nil: the default EP ops
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(in.MoE.Blocks), "block,", len(in.MoE.NearMisses), "near-misses")
	// Output:
	// 1 block, 0 near-misses
}

func ExampleSave() {
	ctx := context.Background()
	m, _ := mokopt.Load(exampleModel)
	defer m.Close()
	dir, _ := os.MkdirTemp("", "mokopt-example")
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "repacked.onnx")
	// ExternalRepack moves every initializer of 1 KiB or more to out + ".data".
	if err := mokopt.Save(ctx, m, out, mokopt.SaveOptions{External: mokopt.ExternalRepack}); err != nil {
		fmt.Println(err)
		return
	}
	back, _ := mokopt.Load(out)
	defer back.Close()
	in, _ := mokopt.Inspect(ctx, back)
	fmt.Println("external data:", in.Model.ExternalBytes > 0)
	// Output:
	// external data: true
}

func ExampleParseExternalMode() {
	for _, s := range []string{"keep", "inline", "sideways"} {
		_, err := mokopt.ParseExternalMode(s)
		fmt.Println(s, err == nil)
	}
	// Output:
	// keep true
	// inline true
	// sideways false
}

func ExampleRewriteAndSave() {
	m, _ := mokopt.Load(exampleModel)
	defer m.Close()
	dir, _ := os.MkdirTemp("", "mokopt-example")
	defer os.RemoveAll(dir)
	// The output is written while the numerical check runs, and renamed
	// into place only once it passed.
	rep, err := mokopt.RewriteAndSave(context.Background(), m, filepath.Join(dir, "fused.onnx"), mokopt.RewriteOptions{}, mokopt.SaveOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = os.Stat(filepath.Join(dir, "fused.onnx"))
	fmt.Println(len(rep.Fused), "fused, written:", err == nil)
	// Output:
	// 1 fused, written: true
}

func ExampleRun() {
	m, _ := mokopt.Load(exampleModel)
	defer m.Close()
	// The data set's inputs, compared with ONNX Runtime's stored outputs.
	rep, err := mokopt.Run(context.Background(), m, exampleData, mokopt.VerifyOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("pass:", rep.Pass, "cases:", len(rep.Cases))
	// Output:
	// pass: true cases: 1
}

func ExampleDefaultVerifyOptions() {
	o := mokopt.DefaultVerifyOptions()
	fmt.Println(o.Tokens, o.Seed, o.RTol, o.ATol)
	// Output:
	// [1 7 64] 1 0.0001 1e-05
}

func ExampleDefaultTokens() {
	fmt.Println(mokopt.DefaultTokens())
	// Output:
	// [1 7 64]
}

func ExampleTargets() {
	for _, t := range mokopt.Targets() {
		fmt.Println(t, t.IsMoK())
	}
	// Output:
	// gb200-nvl72 true
	// gb300-nvl72 true
	// ort false
}

func ExampleParseTarget() {
	for _, name := range []string{"gb300-nvl72", "ort", "h200"} {
		t, err := mokopt.ParseTarget(name)
		if err != nil {
			fmt.Println(strings.SplitN(err.Error(), " (", 2)[0])
			continue
		}
		fmt.Println(t)
	}
	// Output:
	// gb300-nvl72
	// ort
	// target "h200": the MoK kernel does not run there
}

// Lower to ONNX Runtime: the same call, another target.
func ExampleLower_ort() {
	ctx := context.Background()
	m, _ := mokopt.Load(exampleModel)
	defer m.Close()
	if _, err := mokopt.Rewrite(ctx, m, mokopt.RewriteOptions{}); err != nil {
		fmt.Println(err)
		return
	}
	rep, err := mokopt.Lower(ctx, m, mokopt.TargetORT, mokopt.LowerOptions{Quant: "int8"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(rep.Summary())
	// Output:
	// 1 of 1 fused nodes lowered to ONNX Runtime
	//   m/MoE -> com.microsoft::QMoE m/MoE/ort/QMoE
}

func ExampleSavePlan() {
	ctx := context.Background()
	m, _ := mokopt.Load(exampleModel)
	defer m.Close()
	mokopt.Rewrite(ctx, m, mokopt.RewriteOptions{})
	rep, err := mokopt.Lower(ctx, m, mokopt.TargetGB200NVL72, mokopt.LowerOptions{EP: 8, Partial: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	dir, _ := os.MkdirTemp("", "mokopt-example")
	defer os.RemoveAll(dir)
	if err := mokopt.SavePlan(filepath.Join(dir, "plan.json"), rep); err != nil {
		fmt.Println(err)
		return
	}
	b, _ := os.ReadFile(filepath.Join(dir, "plan.json"))
	fmt.Println(strings.Contains(string(b), `"target": "gb200-nvl72"`))
	// Output:
	// true
}

func ExamplePickEP() {
	ctx := context.Background()
	m, _ := mokopt.Load(exampleModel)
	defer m.Close()
	mokopt.Rewrite(ctx, m, mokopt.RewriteOptions{})
	ep, _, err := mokopt.PickEP(m, mokopt.TargetGB300NVL72)
	fmt.Println(ep, err)
	// Output:
	// 8 <nil>
}

func ExampleKernels() {
	k := mokopt.Kernels()
	fmt.Println(k != nil && k == mokopt.Kernels())
	// Output:
	// true
}

func ExampleWriteDiff() {
	ctx := context.Background()
	orig, _ := mokopt.Load(exampleModel)
	fused, _ := mokopt.Load(exampleModel)
	mokopt.Rewrite(ctx, fused, mokopt.RewriteOptions{})
	r, _ := mokopt.Diff(orig, fused)
	if err := mokopt.WriteDiff(os.Stdout, r, mokopt.DiffWriteOptions{Stat: true}); err != nil {
		fmt.Println(err)
	}
	fmt.Println(mokopt.WriteDiff(os.Stdout, r, mokopt.DiffWriteOptions{Format: mokopt.DiffDOT, Verbose: true}))
	// Output:
	// 1 fused region: 31 nodes, 12 initializers -> 1 ai.mok::MoE; 0 other changes
	// fused regions:  1 (31 nodes, 12 initializers replaced; 4 initializers new)
	// nodes:          0 removed, 0 added, 0 changed (0 matched, 0 renamed)
	// initializers:   0 removed, 0 added, 0 changed (0 renamed)
	// graph I/O:      0 changes
	// model:          0 function, 0 opset, 0 metadata, 0 field changes
	// diff: Color and Verbose are for the text format, not dot
}

func ExampleLoadEPTable() {
	dir, _ := os.MkdirTemp("", "mokopt-example")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "ops.json")
	os.WriteFile(path, []byte(`{"ops": [{"domain": "my.comm", "op": "A2A", "kind": "all_to_all", "group_attr": "world"}]}`), 0o644)
	tbl, err := mokopt.LoadEPTable(path)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, op := range tbl.Ops {
		if op.Domain == "my.comm" {
			fmt.Println(op.Domain, op.Name, op.Kind, op.GroupAttr)
		}
	}
	// Output:
	// my.comm A2A all_to_all world
}

// The rank files of one expert-parallel group (here generated, DeepEP
// style) merge into one global model, which SplitRanks cuts again.
func ExampleRewriteRanks() {
	cfg := models.EPConfig{Config: models.Config{Shape: models.ShapeBatched, Layers: 1, Experts: 4, TopK: 2, Hidden: 32, Inter: 64, Router: "softmax", Normalize: true, Seed: 3}, Form: "deepep", EP: 2, Placement: models.BeforeCombine}
	var ranks []*mokopt.Model
	for r := 0; r < cfg.EP; r++ {
		g, err := models.BuildRank(cfg, r)
		if err != nil {
			fmt.Println(err)
			return
		}
		ranks = append(ranks, mokopt.Wrap(g))
	}
	merged, mrep, _, err := mokopt.RewriteRanks(context.Background(), ranks, mokopt.RewriteOptions{}, 4)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer merged.Close()
	for _, n := range mrep.Nodes {
		fmt.Printf("%d ranks checked: %v; E=%d, %d per rank, k=%d\n", mrep.Ranks, mrep.Checked, n.NumExperts, n.LocalExperts, n.TopK)
	}
	// Output:
	// 2 ranks checked: true; E=4, 2 per rank, k=2
}

func ExampleSplitRanks() {
	ctx := context.Background()
	m, _ := mokopt.Load(exampleModel)
	defer m.Close()
	mokopt.Rewrite(ctx, m, mokopt.RewriteOptions{})
	parts, err := mokopt.SplitRanks(m, 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(parts), "rank models")
	// Output:
	// 2 rank models
}
