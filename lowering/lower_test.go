package lowering

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/fixtures"
	"github.com/mokopt/mokopt/kernel"
	"github.com/mokopt/mokopt/moe"
	"github.com/mokopt/mokopt/passes"
	"google.golang.org/protobuf/proto"
)

var fixtureDir = fixtures.Dir()

// TestFixtureRefusal: the DeepSeek-V3 fixture (H=64, I=32) fuses but the
// kernel cannot take it: --strict refuses the model naming H % 256, and
// without --strict the block stays unlowered with a warning.
func TestFixtureRefusal(t *testing.T) {
	path := filepath.Join(fixtureDir, "deepseek_v3_block_dynamo_batched_mm.onnx")
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	fused := func(t *testing.T) *graph.Model {
		m, err := graph.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		if _, err := passes.Rewrite(m, passes.Options{}); err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		strict bool
	}{{"strict", true}, {"lenient", false}} {
		t.Run(tc.name, func(t *testing.T) {
			m := fused(t)
			before := proto.Clone(m.Proto)
			opt := defaultOpts()
			opt.Strict = tc.strict
			rep, err := Lower(m, opt)
			if tc.strict {
				if !errors.Is(err, ErrRefused) {
					t.Fatalf("err = %v, want ErrRefused", err)
				}
				for _, want := range []string{"#8 H_MOD_256", "H % 256 == 0", "H=64"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not name %q", err, want)
					}
				}
				if !proto.Equal(before, m.Proto) {
					t.Error("a refused model was edited")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Blocks) != 1 || rep.Blocks[0].Lowered {
				t.Fatalf("blocks = %+v, want one unlowered", rep.Blocks)
			}
			warns := strings.Join(rep.Warnings(), "\n")
			if !strings.Contains(warns, "H_MOD_256") || !strings.Contains(warns, "kept unlowered") {
				t.Errorf("warnings %q do not name H_MOD_256", warns)
			}
			if !proto.Equal(before, m.Proto) {
				t.Error("an unlowerable model was edited")
			}
			if l := rep.Plan.Layers; len(l) != 1 || l[0].Lowered || l[0].Shapes == nil || l[0].Shapes.H != 64 {
				t.Errorf("plan layers %+v", l)
			}
		})
	}
}

// TestDecisions: what happens to blocks the kernel takes only in part or
// not at all, with and without --strict.
func TestDecisions(t *testing.T) {
	base := blockCfg{E: 8, K: 2, H: 256, I: 256, Is: 256}
	with := func(f func(*blockCfg)) blockCfg { c := base; f(&c); return c }
	cases := []struct {
		name     string
		cfg      blockCfg
		opt      func(*Options)
		lowered  bool
		shared   string
		codes    []string // error codes expected
		warnOnly bool     // strict accepts
	}{
		{"ungated shared", base, nil, true, SharedInKernel, nil, true},
		{"no shared expert", with(func(c *blockCfg) { c.Is = 0 }), nil, true, SharedNone, nil, true},
		{"gated shared kept outside", with(func(c *blockCfg) { c.Gated = true }), nil, true, SharedOutside, []string{kernel.CodeSharedGated}, false},
		{"wider shared kept outside", with(func(c *blockCfg) { c.Is = 512 }), nil, true, SharedOutside, []string{kernel.CodeSharedIMismatch}, false},
		{"gelu", with(func(c *blockCfg) { c.Act = moe.GELU }), nil, false, "", []string{kernel.CodeActivation}, false},
		{"gpt-oss swiglu", with(func(c *blockCfg) { c.Act = moe.SwiGLUOAI; c.Limit = 7 }), nil, false, "", []string{kernel.CodeActivationGPTOSS}, false},
		{"expert biases", with(func(c *blockCfg) { c.ExpertBias = true }), nil, false, "", []string{kernel.CodeExpertBias}, false},
		{"weights on input", with(func(c *blockCfg) { c.WeightsOnInput = true; c.K = 1 }), nil, false, "", []string{CodeWeightsOnInput}, false},
		{"I not multiple of 256", with(func(c *blockCfg) { c.I, c.Is = 384, 384 }), nil, false, "", []string{kernel.CodeIMod}, false},
		{"EP 3", base, func(o *Options) { o.EP = 3 }, false, "", []string{kernel.CodeEPSize, kernel.CodeEModEP}, false},
		{"EP 16 > E", base, func(o *Options) { o.EP = 16 }, false, "", []string{kernel.CodeEModEP}, false},
		{"T 300", base, func(o *Options) { o.TokensPerRank = 300 }, false, "", []string{kernel.CodeTMin, kernel.CodeTMod}, false},
		{"h200", base, func(o *Options) { o.Target = kernel.H200 }, false, "", []string{kernel.CodeGPUArch}, false},
		{"gb200 T 1024", base, func(o *Options) { o.Target = kernel.GB200NVL72; o.TokensPerRank = 1024 }, true, SharedInKernel, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, _, _ := buildFused(t, tc.cfg)
			for _, strict := range []bool{false, true} {
				opt := defaultOpts()
				if tc.opt != nil {
					tc.opt(&opt)
				}
				opt.Strict = strict
				c := cloneModel(t, m)
				rep, err := Lower(c, opt)
				var got []string
				for _, v := range rep.Blocks[0].Violations {
					if v.Severity == kernel.SeverityError {
						got = append(got, v.Code)
						if v.Number <= 0 || v.Constraint == "" {
							t.Errorf("violation %+v has no number or constraint text", v)
						}
					}
				}
				if strings.Join(got, ",") != strings.Join(tc.codes, ",") {
					t.Errorf("strict=%v: error codes %v, want %v", strict, got, tc.codes)
				}
				if strict && !tc.warnOnly {
					if !errors.Is(err, ErrRefused) {
						t.Errorf("strict: err = %v, want ErrRefused", err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("strict=%v: %v", strict, err)
				}
				b := rep.Blocks[0]
				if b.Lowered != tc.lowered || b.SharedExpert != tc.shared {
					t.Errorf("strict=%v: lowered=%v shared=%q, want %v %q (reason %q)", strict, b.Lowered, b.SharedExpert, tc.lowered, tc.shared, b.Reason)
				}
				nMoE, nKernel := 0, 0
				for _, n := range c.Proto.Graph.Node {
					switch {
					case n.GetDomain() == moe.Domain && n.GetOpType() == moe.OpType:
						nMoE++
					case n.GetDomain() == Domain && n.GetOpType() == OpType:
						nKernel++
					}
				}
				if tc.lowered != (nKernel == 1 && nMoE == 0) || !tc.lowered && nMoE != 1 {
					t.Errorf("graph has %d MoE and %d kernel nodes", nMoE, nKernel)
				}
				if errs := c.Graph().Validate(); len(errs) > 0 {
					t.Errorf("lowered graph is invalid: %v", errs)
				}
				if !tc.lowered && !strings.Contains(strings.Join(rep.Warnings(), "\n"), tc.codes[0]) {
					t.Errorf("warnings %q do not name %s", rep.Warnings(), tc.codes[0])
				}
			}
		})
	}
}

// buildTwoLayers chains two fused blocks: hidden_states -> layer0 -> mid ->
// layer1 -> y.
func buildTwoLayers(t *testing.T, c0, c1 blockCfg) *graph.Model {
	t.Helper()
	m0, _, _ := buildFused(t, c0)
	m1, _, _ := buildFused(t, c1)
	g0, g1 := m0.Proto.Graph, m1.Proto.Graph
	g0.Node[0].Output[0] = "mid"
	n1 := g1.Node[0]
	n1.Name = proto.String("layer1/MoE")
	for i, in := range n1.Input {
		if strings.HasPrefix(in, "w/") {
			n1.Input[i] = "w1/" + in[2:]
		}
	}
	n1.Input[moe.InHidden] = "mid"
	for _, tp := range g1.Initializer {
		tp.Name = proto.String("w1/" + tp.GetName()[2:])
	}
	g0.Node = append(g0.Node, n1)
	g0.Initializer = append(g0.Initializer, g1.Initializer...)
	m0.Proto.Functions = append(m0.Proto.Functions, m1.Proto.Functions...)
	return cloneModel(t, m0)
}

// TestMixedModel: of two layers, the SwiGLU one lowers and the GELU one
// stays fused; the kept layer's function follows the raised opset, and the
// model still computes the same thing.
func TestMixedModel(t *testing.T) {
	// The kept layer comes first: routing is discontinuous, so a layer that
	// routes on another layer's MXFP8 output may pick other experts.
	m := buildTwoLayers(t, blockCfg{E: 8, K: 2, H: 256, I: 256, Act: moe.GELU, Seed: 70}, blockCfg{E: 8, K: 2, H: 256, I: 256, Is: 256, Seed: 71})
	x := randInput(testTokens, 256, 72)
	if _, err := Lower(cloneModel(t, m), Options{Target: kernel.GB300NVL72, EP: 8, Strict: true}); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "layer0/MoE") {
		t.Fatalf("strict: err = %v, want a refusal naming layer0/MoE", err)
	}
	rep, path := lowerAndSave(t, m, Options{Target: kernel.GB300NVL72, EP: 8}, t.TempDir(), "mixed")
	if len(rep.Blocks) != 2 || rep.Blocks[0].Lowered || !rep.Blocks[1].Lowered {
		t.Fatalf("blocks %+v", rep.Blocks)
	}
	low := loadForEval(t, path)
	if v := low.Opset(""); v != fp8Opset {
		t.Errorf("default opset %d, want %d", v, fp8Opset)
	}
	var kinds []string
	for _, f := range low.Proto.Functions {
		kinds = append(kinds, f.GetName()+"/"+f.GetOverload())
		for _, o := range f.OpsetImport {
			if o.GetDomain() == "" && o.GetVersion() != fp8Opset {
				t.Errorf("function %s imports opset %d", f.GetName(), o.GetVersion())
			}
		}
	}
	if got := strings.Join(kinds, ","); got != "MoE/"+rep.Blocks[0].Spec.Overload()+","+OpType+"/"+overloadSwiGLU {
		t.Errorf("functions %s", got)
	}
	if _, ok := low.Metadata(MetadataKey + rep.Blocks[1].KernelNode); !ok {
		t.Error("no lowering record in metadata_props")
	}
	// The fused model runs through moe's reference kernel only: it holds two
	// ai.mok::MoE overloads, and the interpreter looks functions up by domain
	// and name, not overload.
	_, want := run(t, m, x, testTokens, 256, eval.Options{})
	for _, via := range []eval.Options{{}, {PreferFunctions: true}} {
		_, got := run(t, low, x, testTokens, 256, via)
		s := compare(got, want)
		t.Logf("mixed model (PreferFunctions=%v): rel L2 %.2f%%, mean rel %.2f%%", via.PreferFunctions, 100*s.RelL2, 100*s.MeanRel)
		if s.MaxAbs > 0.1*s.MaxRef || s.MeanRel > 0.08 {
			t.Errorf("mixed model error %+v", s)
		}
	}
}
