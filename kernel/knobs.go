package kernel

import (
	"fmt"
	"math"
)

// Knobs are the MoK kernel's tuning parameters.
type Knobs struct {
	// FwdNumCommSMs is the number of SMs the forward kernel devotes to
	// communication (dispatch/combine). Even, positive, below the SM count.
	FwdNumCommSMs int
	// BwdNumCommSMs is the same for the backward kernel.
	BwdNumCommSMs int
	// MinibatchSize is the number of schedule rows per pipeline step; a positive
	// multiple of 256.
	MinibatchSize int
	// MacrobatchSize is the number of schedule rows per macrobatch (the row count
	// of the activation buffers the forward returns); a positive multiple of
	// MinibatchSize.
	MacrobatchSize int
	// ScheduleCapacityMultiplier sets the schedule capacity; see ScheduleRows.
	ScheduleCapacityMultiplier float64
	// AllGatherTopExpertsChunkBytes is the chunk size of the all-gather of the
	// routing decisions. docs/kernel.md gives only its default; this package
	// requires it to be positive and nothing more.
	AllGatherTopExpertsChunkBytes int
}

// DefaultKnobs returns MoK's defaults: 40/28 comm SMs, minibatch 4096,
// macrobatch 131072, capacity multiplier 0.5, all-gather chunk 2048 bytes.
func DefaultKnobs() Knobs {
	return Knobs{
		FwdNumCommSMs:                 40,
		BwdNumCommSMs:                 28,
		MinibatchSize:                 4096,
		MacrobatchSize:                131072,
		ScheduleCapacityMultiplier:    0.5,
		AllGatherTopExpertsChunkBytes: 2048,
	}
}

// KnobSpec documents one knob.
type KnobSpec struct {
	// Name is MoK's name for the knob.
	Name string
	// Default is the default value, as text.
	Default string
	// Rule is the validity rule, as text.
	Rule string
}

// KnobSpecs returns the knob table of docs/kernel.md "Kernel knobs".
func KnobSpecs() []KnobSpec {
	return []KnobSpec{
		{"fwd_num_comm_sms", "40", "positive, even, < SM count"},
		{"bwd_num_comm_sms", "28", "positive, even, < SM count"},
		{"minibatch_size", "4096", "positive multiple of 256; rule of thumb T_mb ≥ 2·C·128·256 / min(2I, H), C = SM count"},
		{"macrobatch_size", "131072", "positive multiple of minibatch_size"},
		{"schedule_capacity_multiplier", "0.5", "positive, finite; schedule rows = T·k·max(2, ceil(EP·multiplier))"},
		{"all_gather_top_experts_chunk_bytes", "2048", "positive (no further rule known)"},
	}
}

// MinibatchRuleOfThumb returns MoK's suggested lower bound on the minibatch size,
// 2·C·128·256 / min(2I, H) rows (rounded up), with C the target's SM count: enough
// 128×256 output tiles for two waves over all SMs.
func MinibatchRuleOfThumb(h, i int, target Target) int {
	m := 2 * i
	if h < m {
		m = h
	}
	if m <= 0 {
		return 0
	}
	num := 2 * target.SMCount * 128 * 256
	return (num + m - 1) / m
}

// Validate checks the knobs against their rules for a target. H and I, when
// positive, enable the minibatch rule of thumb (a warning).
func (k Knobs) Validate(target Target, h, i int) []Violation {
	var vs []Violation
	for _, c := range []struct {
		code, name string
		v          int
	}{{CodeFwdCommSMs, "fwd_num_comm_sms", k.FwdNumCommSMs}, {CodeBwdCommSMs, "bwd_num_comm_sms", k.BwdNumCommSMs}} {
		switch {
		case c.v <= 0 || c.v%2 != 0:
			vs = append(vs, violation(c.code, "%s=%d is not a positive even number", c.name, c.v))
		case target.SMCount > 0 && c.v >= target.SMCount:
			vs = append(vs, violation(c.code, "%s=%d leaves no compute SMs on %s (%d SMs)", c.name, c.v, target.Name, target.SMCount))
		}
	}
	if k.MinibatchSize <= 0 || k.MinibatchSize%256 != 0 {
		vs = append(vs, violation(CodeMinibatch, "minibatch_size=%d is not a positive multiple of 256", k.MinibatchSize))
	}
	if k.MacrobatchSize <= 0 || k.MinibatchSize <= 0 || k.MacrobatchSize%k.MinibatchSize != 0 {
		vs = append(vs, violation(CodeMacrobatch, "macrobatch_size=%d is not a positive multiple of minibatch_size=%d", k.MacrobatchSize, k.MinibatchSize))
	}
	if !(k.ScheduleCapacityMultiplier > 0) || math.IsInf(k.ScheduleCapacityMultiplier, 0) {
		vs = append(vs, violation(CodeCapacityMultiplier, "schedule_capacity_multiplier=%v is not a positive finite number", k.ScheduleCapacityMultiplier))
	}
	if k.AllGatherTopExpertsChunkBytes <= 0 {
		vs = append(vs, violation(CodeAllGatherChunk, "all_gather_top_experts_chunk_bytes=%d is not positive", k.AllGatherTopExpertsChunkBytes))
	}
	if h > 0 && i > 0 && k.MinibatchSize > 0 {
		if want := MinibatchRuleOfThumb(h, i, target); k.MinibatchSize < want {
			vs = append(vs, violation(CodeMinibatchRuleOfThumb,
				"minibatch_size=%d is below the rule of thumb 2·%d·128·256/min(2I=%d, H=%d) = %d rows: the GEMMs of one minibatch fill fewer than two waves of %d SMs",
				k.MinibatchSize, target.SMCount, 2*i, h, want, target.SMCount))
		}
	}
	return vs
}

// ScheduleRows returns the schedule capacity in rows: T·k·max(2, ceil(EP·m)),
// computed as MoK's Python does (IEEE double product, then ceil). An overflow of
// this capacity at run time traps (aborts); MoK never drops tokens.
func ScheduleRows(tokensPerRank, topK, ep int, capacityMultiplier float64) int {
	f := int(math.Ceil(float64(ep) * capacityMultiplier))
	if f < 2 {
		f = 2
	}
	return tokensPerRank * topK * f
}

func violation(code string, format string, args ...any) Violation {
	c := constraintByCode[code]
	return Violation{Code: code, Severity: c.Severity, Message: fmt.Sprintf(format, args...), Constraint: c.Text}
}
