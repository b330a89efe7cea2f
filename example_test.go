package mokopt_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/mokopt/mokopt"
)

// The bundled example: one Mixtral MoE block exported by torch.onnx dynamo
// (transformers' batched_mm shape).
const exampleModel = "testdata/example/mixtral_block_dynamo_batched_mm.onnx"

func ExampleInspect() {
	m, err := mokopt.Load(exampleModel)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	in, err := mokopt.Inspect(context.Background(), m)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, b := range in.MoE.Blocks {
		s := b.Spec
		fmt.Printf("%s (%s): E=%d k=%d H=%d I=%d %s router, %s\n", b.Name, b.Kind, s.NumExperts, s.TopK, s.Hidden, s.Inter, s.RouterActivation, s.Activation)
	}
	// Output:
	// m (batched): E=8 k=2 H=64 I=128 softmax router, swiglu
}

func ExampleRewrite() {
	ctx := context.Background()
	m, err := mokopt.Load(exampleModel)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	rep, err := mokopt.Rewrite(ctx, m, mokopt.RewriteOptions{})
	var unsupported *mokopt.UnsupportedPatternError
	switch {
	case errors.As(err, &unsupported):
		for _, c := range unsupported.Candidates {
			fmt.Printf("not fused %s: %s\n", c.Node, c.Reason)
		}
		return
	case err != nil:
		fmt.Println(err)
		return
	}
	for _, f := range rep.Fused {
		fmt.Printf("%s: %d nodes -> ai.mok::MoE [%s]\n", f.Node, f.NodesRemoved, f.Variant)
	}
	dir, _ := os.MkdirTemp("", "mokopt-example")
	defer os.RemoveAll(dir)
	if err := mokopt.Save(ctx, m, filepath.Join(dir, "fused.onnx"), mokopt.SaveOptions{}); err != nil {
		fmt.Println(err)
	}
	// Output:
	// m/MoE: 31 nodes -> ai.mok::MoE [softmax_act_topk_norm_swiglu]
}

func ExampleVerify() {
	ctx := context.Background()
	orig, _ := mokopt.Load(exampleModel)
	fused, _ := mokopt.Load(exampleModel)
	if _, err := mokopt.Rewrite(ctx, fused, mokopt.RewriteOptions{}); err != nil {
		fmt.Println(err)
		return
	}
	rep, err := mokopt.Verify(ctx, fused, orig, mokopt.VerifyOptions{})
	var mismatch *mokopt.MismatchError
	if errors.As(err, &mismatch) {
		fmt.Println(mismatch)
		return
	} else if err != nil {
		fmt.Println(err)
		return
	}
	for _, c := range rep.Cases {
		for _, o := range c.Outputs {
			fmt.Printf("%s %s: pass=%v, within %.0e\n", c.Name, o.NameA, o.Pass, mokopt.DefaultATol)
		}
	}
	// Output:
	// fixed_shapes moe_out: pass=true, within 1e-05
}

func ExampleLower() {
	ctx := context.Background()
	m, _ := mokopt.Load(exampleModel)
	if _, err := mokopt.Rewrite(ctx, m, mokopt.RewriteOptions{}); err != nil {
		fmt.Println(err)
		return
	}
	// The example is small (H=64, I=128): strict lowering refuses it, naming
	// every violated kernel constraint.
	_, err := mokopt.Lower(ctx, m, mokopt.TargetGB300NVL72, mokopt.LowerOptions{EP: 8, Strict: true})
	var kc *mokopt.KernelConstraintError
	if errors.As(err, &kc) {
		for _, v := range kc.Violations {
			fmt.Printf("%s: #%d %s\n", v.Node, v.Number, v.Code)
		}
	}
	// With Partial the block stays unlowered and the plan is still made.
	rep, err := mokopt.Lower(ctx, m, mokopt.TargetGB300NVL72, mokopt.LowerOptions{EP: 8, Partial: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d of %d blocks lowered, plan for %s\n", rep.Lowered(), len(rep.Blocks), rep.Plan.Target)
	// Output:
	// m/MoE: #8 H_MOD_256
	// m/MoE: #9 I_MOD_256
	// 0 of 1 blocks lowered, plan for gb300-nvl72
}

func ExampleDiff() {
	ctx := context.Background()
	orig, _ := mokopt.Load(exampleModel)
	fused, _ := mokopt.Load(exampleModel)
	if _, err := mokopt.Rewrite(ctx, fused, mokopt.RewriteOptions{}); err != nil {
		fmt.Println(err)
		return
	}
	r, err := mokopt.Diff(orig, fused)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("same:", r.Same())
	_ = mokopt.WriteDiff(os.Stdout, r, mokopt.DiffWriteOptions{Stat: true})
	// Output:
	// same: false
	// 1 fused region: 31 nodes, 12 initializers -> 1 ai.mok::MoE; 0 other changes
	// fused regions:  1 (31 nodes, 12 initializers replaced; 4 initializers new)
	// nodes:          0 removed, 0 added, 0 changed (0 matched, 0 renamed)
	// initializers:   0 removed, 0 added, 0 changed (0 renamed)
	// graph I/O:      0 changes
	// model:          0 function, 0 opset, 0 metadata, 0 field changes
}

// A self-contained model goes through a stream (standard input and output
// in the CLI's "-"): Write encodes it, Read decodes it.
func ExampleWrite() {
	ctx := context.Background()
	m, _ := mokopt.Load(exampleModel)
	if _, err := mokopt.Rewrite(ctx, m, mokopt.RewriteOptions{}); err != nil {
		fmt.Println(err)
		return
	}
	var stream bytes.Buffer
	if err := mokopt.Write(ctx, m, &stream, mokopt.SaveOptions{}); err != nil {
		fmt.Println(err)
		return
	}
	back, err := mokopt.Read(&stream, "-")
	if err != nil {
		fmt.Println(err)
		return
	}
	in, _ := mokopt.Inspect(ctx, back)
	for _, op := range in.Model.Ops {
		fmt.Println(op.Op, op.Count)
	}
	// Output:
	// ai.mok::MoE 1
}
