package perf

import (
	"math"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/kernel"
)

func scenario(sh Shape, p kernel.Precision, T int) Scenario {
	return Scenario{Hardware: GB300, Shape: sh, EP: 64, TokensPerRank: T, Precision: p,
		Knobs: kernel.DefaultKnobs(), Params: DefaultParams()}
}

func TestFusedBeatsBaselineOnVendorSuite(t *testing.T) {
	c, err := VendorComparison(DefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", c)
	if len(c.Rows) != 8 || len(c.Summary) != 2 {
		t.Fatalf("%d rows, %d summaries", len(c.Rows), len(c.Summary))
	}
	for _, r := range c.Rows {
		p := r.Prediction
		if p.FwdMoK.Total > p.FwdBaseline.Total || p.BwdMoK.Total > p.BwdBaseline.Total {
			t.Errorf("%s %s: fused slower than baseline: %+v", r.Precision, r.Shape.Name, p)
		}
		for _, x := range []float64{p.FwdSpeedup, p.BwdSpeedup} {
			if !(x >= 1 && x <= 4) {
				t.Errorf("%s %s: speedup %.3f outside 1..4", r.Precision, r.Shape.Name, x)
			}
		}
	}
	for _, s := range c.Summary {
		vf, vb := VendorReported(s.Precision)
		if s.VendorMaxFwd != vf || s.VendorMaxBwd != vb {
			t.Errorf("summary %+v does not carry the vendor's numbers", s)
		}
		var mf, mb float64
		for _, r := range c.Rows {
			if r.Precision == s.Precision {
				mf, mb = math.Max(mf, r.Prediction.FwdSpeedup), math.Max(mb, r.Prediction.BwdSpeedup)
			}
		}
		if mf != s.PredictedMaxFwd || mb != s.PredictedMaxBwd {
			t.Errorf("summary %+v, row maxima %.3f/%.3f", s, mf, mb)
		}
	}
	if f, b := VendorReported(kernel.MXFP8); f != 2.37 || b != 1.78 {
		t.Errorf("MXFP8 vendor %v %v", f, b)
	}
	if f, b := VendorReported(kernel.BF16); f != 1.92 || b != 1.58 {
		t.Errorf("BF16 vendor %v %v", f, b)
	}
	if !strings.Contains(c.String(), "vendor reported up to 2.37x fwd") {
		t.Errorf("String() lacks the vendor figures:\n%s", c)
	}
}

func TestMonotonicInTokens(t *testing.T) {
	for _, sh := range VendorShapes() {
		for _, p := range []kernel.Precision{kernel.BF16, kernel.MXFP8} {
			var prev Prediction
			for T := 512; T <= 16384; T += 256 {
				cur, err := Predict(scenario(sh, p, T))
				if err != nil {
					t.Fatal(err)
				}
				if T > 512 {
					for _, pair := range [][2]float64{
						{prev.FwdMoK.Total, cur.FwdMoK.Total}, {prev.FwdBaseline.Total, cur.FwdBaseline.Total},
						{prev.BwdMoK.Total, cur.BwdMoK.Total}, {prev.BwdBaseline.Total, cur.BwdBaseline.Total},
					} {
						if !(pair[1] > pair[0]) {
							t.Fatalf("%s %s: time not increasing from T=%d to T=%d: %g -> %g", sh.Name, p, T-256, T, pair[0], pair[1])
						}
					}
				}
				prev = cur
			}
		}
	}
}

func TestPredictionInternals(t *testing.T) {
	sh := VendorShapes()[0]
	bf, err := Predict(scenario(sh, kernel.BF16, 2048))
	if err != nil {
		t.Fatal(err)
	}
	mx, err := Predict(scenario(sh, kernel.MXFP8, 2048))
	if err != nil {
		t.Fatal(err)
	}
	if want := 6.0 * 2048 * 9 * 7168 * 2048; bf.EffectiveFLOPs != want {
		t.Errorf("effective FLOPs %g, want %g", bf.EffectiveFLOPs, want)
	}
	if !(mx.FwdMoK.Total < bf.FwdMoK.Total && mx.BwdMoK.Total < bf.BwdMoK.Total) {
		t.Errorf("MXFP8 not faster than BF16: %g vs %g", mx.FwdMoK.Total, bf.FwdMoK.Total)
	}
	if !(mx.FwdMoK.Dispatch < bf.FwdMoK.Dispatch && mx.FwdMoK.Combine == bf.FwdMoK.Combine) {
		t.Errorf("MXFP8 dispatch should shrink, combine (bf16) stay: %+v vs %+v", mx.FwdMoK, bf.FwdMoK)
	}
	for _, p := range []Prediction{bf, mx} {
		for _, b := range []Breakdown{p.FwdMoK, p.BwdMoK} {
			if b.Total < math.Max(b.Compute, b.Dispatch+b.Combine) {
				t.Errorf("MoK total %g below its overlapped body", b.Total)
			}
		}
		for _, b := range []Breakdown{p.FwdBaseline, p.BwdBaseline} {
			sum := b.Dispatch + b.Compute + b.Combine + b.HBM + b.Overhead
			if math.Abs(b.Total-sum) > 1e-15 {
				t.Errorf("baseline total %g != serialized sum %g", b.Total, sum)
			}
		}
		if p.BwdMoK.Compute <= p.FwdMoK.Compute {
			t.Errorf("backward compute not larger than forward")
		}
		if got := p.EffectiveTFLOPS(p.FwdMoK.Total); got <= 0 || got > 5000 {
			t.Errorf("effective TFLOP/s %g", got)
		}
	}
	// Reserving more SMs for communication slows MoK's GEMMs.
	s := scenario(sh, kernel.BF16, 2048)
	s.Knobs.FwdNumCommSMs = 64
	more, err := Predict(s)
	if err != nil {
		t.Fatal(err)
	}
	if more.FwdMoK.Compute <= bf.FwdMoK.Compute {
		t.Errorf("64 comm SMs did not slow the GEMMs")
	}
	// EP 1: nothing crosses NVLink.
	s = scenario(sh, kernel.BF16, 2048)
	s.EP = 1
	one, err := Predict(s)
	if err != nil {
		t.Fatal(err)
	}
	if one.FwdMoK.Dispatch != 0 || one.FwdBaseline.Combine != 0 {
		t.Errorf("EP 1 has communication: %+v", one.FwdMoK)
	}
}

func TestPredictRefuses(t *testing.T) {
	sh := VendorShapes()[0]
	for _, tc := range []struct {
		name   string
		mutate func(*Scenario)
		want   string
	}{
		{"h200", func(s *Scenario) { s.Hardware = H200 }, "does not run on h200"},
		{"zero EP", func(s *Scenario) { s.EP = 0 }, "EP=0"},
		{"zero T", func(s *Scenario) { s.TokensPerRank = 0 }, "T=0"},
		{"bad precision", func(s *Scenario) { s.Precision = "fp4" }, "fp4"},
		{"bad shape", func(s *Scenario) { s.Shape.I = 0 }, "shape"},
		{"zero params", func(s *Scenario) { s.Params = Params{} }, "params"},
		{"all SMs comm", func(s *Scenario) { s.Knobs.BwdNumCommSMs = 148 }, "comm SMs"},
	} {
		s := scenario(sh, kernel.MXFP8, 2048)
		tc.mutate(&s)
		if _, err := Predict(s); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

func TestHardwareFor(t *testing.T) {
	for _, tc := range []struct {
		target kernel.Target
		bf16   float64
		hbm    float64
	}{
		{kernel.GB300NVL72, 2.5e15, 288e9},
		{kernel.GB200NVL72, 2.5e15, 192e9},
		{kernel.H200, 0.989e15, 141e9},
	} {
		hw, err := HardwareFor(tc.target)
		if err != nil {
			t.Fatal(err)
		}
		if hw.BF16FLOPS != tc.bf16 || hw.HBMBytes != tc.hbm || hw.Target.Name != tc.target.Name {
			t.Errorf("%s: %+v", tc.target.Name, hw)
		}
	}
	if GB300.FP8FLOPS != 2*GB300.BF16FLOPS || GB300.NVLinkBandwidth != 900e9 || GB300.DeepEPDispatch != 726e9 || GB300.DeepEPCombine != 740e9 {
		t.Errorf("GB300 figures %+v", GB300)
	}
	if _, err := HardwareFor(kernel.Target{Name: "tpu"}); err == nil {
		t.Error("unknown target accepted")
	}
}
