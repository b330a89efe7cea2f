package kernel

import (
	"math"
	"strings"
	"testing"
)

func TestDefaultKnobs(t *testing.T) {
	k := DefaultKnobs()
	if k.FwdNumCommSMs != 40 || k.BwdNumCommSMs != 28 || k.MinibatchSize != 4096 || k.MacrobatchSize != 131072 ||
		k.ScheduleCapacityMultiplier != 0.5 || k.AllGatherTopExpertsChunkBytes != 2048 {
		t.Errorf("defaults %+v", k)
	}
	for _, tg := range []Target{GB200NVL72, GB300NVL72} {
		if vs := k.Validate(tg, 0, 0); len(vs) != 0 {
			t.Errorf("%s: defaults invalid: %v", tg.Name, vs)
		}
	}
	if len(KnobSpecs()) != 6 {
		t.Errorf("KnobSpecs has %d entries", len(KnobSpecs()))
	}
}

func TestKnobsValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Knobs)
		want   string
		msg    string
	}{
		{"odd fwd comm SMs", func(k *Knobs) { k.FwdNumCommSMs = 41 }, CodeFwdCommSMs, "41"},
		{"zero bwd comm SMs", func(k *Knobs) { k.BwdNumCommSMs = 0 }, CodeBwdCommSMs, "0"},
		{"all SMs for comm", func(k *Knobs) { k.FwdNumCommSMs = 148 }, CodeFwdCommSMs, "148"},
		{"minibatch 1000", func(k *Knobs) { k.MinibatchSize = 1000 }, CodeMinibatch, "1000"},
		{"macrobatch not multiple", func(k *Knobs) { k.MacrobatchSize = 6144 }, CodeMacrobatch, "6144"},
		{"capacity 0", func(k *Knobs) { k.ScheduleCapacityMultiplier = 0 }, CodeCapacityMultiplier, "0"},
		{"capacity NaN", func(k *Knobs) { k.ScheduleCapacityMultiplier = math.NaN() }, CodeCapacityMultiplier, "NaN"},
		{"capacity Inf", func(k *Knobs) { k.ScheduleCapacityMultiplier = math.Inf(1) }, CodeCapacityMultiplier, "Inf"},
		{"chunk 0", func(k *Knobs) { k.AllGatherTopExpertsChunkBytes = 0 }, CodeAllGatherChunk, "0"},
	} {
		k := DefaultKnobs()
		tc.mutate(&k)
		vs := k.Validate(GB300NVL72, 0, 0)
		if len(vs) == 0 || vs[0].Code != tc.want || !strings.Contains(vs[0].Message, tc.msg) {
			t.Errorf("%s: got %v, want %s mentioning %q", tc.name, vs, tc.want, tc.msg)
		}
	}
}

func TestMinibatchRuleOfThumb(t *testing.T) {
	for _, tc := range []struct{ h, i, want int }{
		{7168, 2048, 2368}, // min(4096, 7168) = 4096
		{4096, 1024, 4736}, // min(2048, 4096) = 2048
		{6144, 2048, 2368},
		{7168, 3072, 1579}, // min(6144, 7168): 9699328 / 6144 = 1578.7, rounded up
	} {
		if got := MinibatchRuleOfThumb(tc.h, tc.i, GB300NVL72); got != tc.want {
			t.Errorf("H=%d I=%d: %d, want %d", tc.h, tc.i, got, tc.want)
		}
	}
}

func TestScheduleRows(t *testing.T) {
	for _, tc := range []struct {
		T, k, ep int
		m        float64
		want     int
	}{
		{2048, 8, 64, 0.5, 2048 * 8 * 32},
		{2048, 8, 8, 0.5, 2048 * 8 * 4},
		{2048, 8, 4, 0.5, 2048 * 8 * 2},
		{2048, 8, 1, 0.5, 2048 * 8 * 2}, // max(2, 1)
		{512, 1, 16, 0.3, 512 * 5},      // ceil(4.8) = 5
		{512, 2, 32, 1, 512 * 2 * 32},
	} {
		if got := ScheduleRows(tc.T, tc.k, tc.ep, tc.m); got != tc.want {
			t.Errorf("ScheduleRows(%d, %d, %d, %v) = %d, want %d", tc.T, tc.k, tc.ep, tc.m, got, tc.want)
		}
		if got := ScheduleRows(tc.T, tc.k, tc.ep, tc.m); got%256 != 0 && tc.T%256 == 0 {
			t.Errorf("schedule rows %d not a multiple of 256 (MoK requires it)", got)
		}
	}
}
