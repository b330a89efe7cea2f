package lowering

import (
	"bytes"
	"encoding/json"
	"math"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/kernel"
)

// TestPlanJSON: the plan has, per layer, shapes, placement, workspace and
// schedule capacity, weight bytes, knobs and the predicted times against the
// DeepEP baseline, and the vendor section with the four benchmark shapes.
func TestPlanJSON(t *testing.T) {
	cases := []struct {
		name     string
		cfg      blockCfg
		ep, T    int
		wantT    int
		assumed  bool
		wantRows int // T·k·max(2, ceil(EP·0.5))
	}{
		{"EP 8, T given", blockCfg{E: 8, K: 2, H: 256, I: 256, Is: 256}, 8, 4096, 4096, false, 4096 * 2 * 4},
		{"EP 1, T assumed", blockCfg{E: 8, K: 2, H: 256, I: 256, Is: 256}, 1, 0, DefaultPlanTokensPerRank, true, 2048 * 2 * 2},
		{"EP 4, gated shared", blockCfg{E: 8, K: 3, H: 512, I: 256, Is: 256, Gated: true}, 4, 1024, 1024, false, 1024 * 3 * 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, _, _ := buildFused(t, tc.cfg)
			rep, err := Lower(cloneModel(t, m), Options{Target: kernel.GB300NVL72, EP: tc.ep, TokensPerRank: tc.T})
			if err != nil {
				t.Fatal(err)
			}
			js, err := json.Marshal(rep.Plan)
			if err != nil {
				t.Fatal(err)
			}
			var p map[string]any
			if err := json.Unmarshal(js, &p); err != nil {
				t.Fatal(err)
			}
			num := func(v any, path string) float64 {
				t.Helper()
				cur := v
				for _, k := range strings.Split(path, ".") {
					obj, ok := cur.(map[string]any)
					if !ok {
						t.Fatalf("%s: %q is not an object", path, k)
					}
					if cur, ok = obj[k]; !ok {
						t.Fatalf("plan has no %s", path)
					}
				}
				f, ok := cur.(float64)
				if !ok {
					t.Fatalf("%s = %v is not a number", path, cur)
				}
				return f
			}
			if p["target"] != "gb300-nvl72" || num(p, "ep") != float64(tc.ep) || num(p, "tokens_per_rank") != float64(tc.wantT) || p["tokens_per_rank_assumed"] != tc.assumed {
				t.Errorf("plan header %v %v %v %v", p["target"], p["ep"], p["tokens_per_rank"], p["tokens_per_rank_assumed"])
			}
			layers := p["layers"].([]any)
			if len(layers) != 1 {
				t.Fatalf("%d layers", len(layers))
			}
			l := layers[0].(map[string]any)
			if l["lowered"] != true {
				t.Fatalf("layer not lowered: %v", l["reason"])
			}
			c := tc.cfg
			for path, want := range map[string]float64{
				"shapes.E": float64(c.E), "shapes.k": float64(c.K), "shapes.H": float64(c.H), "shapes.I": float64(c.I), "shapes.shared_I": float64(c.Is),
				"placement.ep": float64(tc.ep), "placement.experts_per_rank": float64(c.E / tc.ep), "placement.expert_offset": 0,
				"memory.schedule_rows":              float64(tc.wantRows),
				"memory.schedule_capacity_bytes":    float64(8 * tc.wantRows),
				"memory.mxfp8_data_bytes_per_rank":  float64(3 * (c.E / tc.ep) * c.I * c.H),
				"memory.mxfp8_scale_bytes_per_rank": float64(3 * (c.E / tc.ep) * c.I * c.H / 32),
				"memory.mxfp8_bytes_per_rank":       float64(3 * (c.E / tc.ep) * c.I * c.H * 33 / 32),
				"memory.bf16_bytes_per_rank":        float64(3 * c.I * c.H * 2),
				"knobs.fwd_num_comm_sms":            40, "knobs.bwd_num_comm_sms": 28, "knobs.minibatch_size": 4096,
				"knobs.macrobatch_size": 131072, "knobs.schedule_capacity_multiplier": 0.5, "knobs.all_gather_top_experts_chunk_bytes": 2048,
			} {
				if got := num(l, path); got != want {
					t.Errorf("%s = %v, want %v", path, got, want)
				}
			}
			if ws := num(l, "memory.workspace_bytes"); ws <= num(l, "memory.schedule_capacity_bytes") {
				t.Errorf("workspace %v does not exceed the schedule", ws)
			}
			ranges := l["placement"].(map[string]any)["ranges"].([]any)
			next := 0.0
			for r, rr := range ranges {
				x := rr.(map[string]any)
				if x["rank"] != float64(r) || x["first_expert"] != next || x["last_expert"] != next+float64(c.E/tc.ep)-1 {
					t.Errorf("rank range %v", x)
				}
				next += float64(c.E / tc.ep)
			}
			if len(ranges) != tc.ep || next != float64(c.E) {
				t.Errorf("%d ranges covering %v experts", len(ranges), next)
			}
			for _, pass := range []string{"fwd", "bwd"} {
				mok, base, ratio := num(l, "perf."+pass+"_mok_us"), num(l, "perf."+pass+"_deepep_baseline_us"), num(l, "perf."+pass+"_ratio")
				if !(mok > 0) || !(base > 0) || math.Abs(ratio-base/mok) > 1e-9*ratio {
					t.Errorf("%s: MoK %v us, baseline %v us, ratio %v", pass, mok, base, ratio)
				}
			}
			v := p["vendor_shapes"].(map[string]any)
			rows := v["rows"].([]any)
			if len(rows) != 8 {
				t.Fatalf("%d vendor rows, want 4 shapes x 2 precisions", len(rows))
			}
			reported := map[string][2]float64{"mxfp8": {2.37, 1.78}, "bf16": {1.92, 1.58}}
			for _, r := range rows {
				x := r.(map[string]any)
				want := reported[x["precision"].(string)]
				if num(x, "vendor_reported_fwd_ratio_max") != want[0] || num(x, "vendor_reported_bwd_ratio_max") != want[1] {
					t.Errorf("vendor row %v", x)
				}
				if num(x, "predicted_fwd_ratio") <= 0 || num(x, "predicted_bwd_ratio") <= 0 {
					t.Errorf("vendor row %v has no prediction", x)
				}
			}
			if s := v["summary"].([]any); len(s) != 2 {
				t.Errorf("vendor summary %v", s)
			}
			sum := rep.Summary()
			for _, want := range []string{"1 of 1 MoE block(s) lowered", "predicted fwd", "vendor shapes, mxfp8"} {
				if !strings.Contains(sum, want) {
					t.Errorf("summary lacks %q:\n%s", want, sum)
				}
			}
		})
	}
}

// TestDeterministic: the lowered model, its side file and the plan are
// byte-identical across runs and across GOMAXPROCS 1 and 4.
func TestDeterministic(t *testing.T) {
	cfg := blockCfg{E: 8, K: 3, H: 256, I: 512, Is: 256, Gated: true, RouterAct: "sigmoid", CBias: true, Norm: true, Scale: 2.5, NGroup: 4, TopKG: 2, Seed: 60}
	m, _, _ := buildFused(t, cfg)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	type result struct{ model, data, plan []byte }
	var results []result
	for i, procs := range []int{1, 4, 1, 4} {
		runtime.GOMAXPROCS(procs)
		dir := filepath.Join(t.TempDir(), "run")
		if err := mkdir(dir); err != nil {
			t.Fatal(err)
		}
		rep, path := lowerAndSave(t, m, Options{Target: kernel.GB200NVL72, EP: 4, TokensPerRank: 1024}, dir, "lowered")
		plan, err := json.MarshalIndent(rep.Plan, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		r := result{fileBytes(t, path), fileBytes(t, path+".data"), plan}
		if len(r.data) == 0 {
			t.Fatal("no side file written")
		}
		results = append(results, r)
		if i > 0 {
			p := results[0]
			if !bytes.Equal(p.model, r.model) || !bytes.Equal(p.data, r.data) || !bytes.Equal(p.plan, r.plan) {
				t.Fatalf("run %d (GOMAXPROCS %d) differs from run 0: model %v, data %v, plan %v", i, procs,
					bytes.Equal(p.model, r.model), bytes.Equal(p.data, r.data), bytes.Equal(p.plan, r.plan))
			}
		}
	}
}
