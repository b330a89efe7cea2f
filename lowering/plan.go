package lowering

import (
	"fmt"
	"strings"

	"github.com/mokopt/mokopt/kernel"
	"github.com/mokopt/mokopt/kernel/mxfp8"
	"github.com/mokopt/mokopt/kernel/perf"
)

// Plan is the launch plan of a lowered model: one entry per fused layer and
// the performance model's view of the vendor's benchmarks.
type Plan struct {
	// SchemaVersion is 1.
	SchemaVersion int `json:"schema_version"`
	// Target and GPU name the rack and its GPU.
	Target string `json:"target"`
	GPU    string `json:"gpu"`
	// EP is the expert-parallel group size.
	EP int `json:"ep"`
	// TokensPerRank is the T the figures assume; TokensPerRankAssumed is true
	// when the lowering was not told T (DefaultPlanTokensPerRank then).
	TokensPerRank        int  `json:"tokens_per_rank"`
	TokensPerRankAssumed bool `json:"tokens_per_rank_assumed"`
	// Knobs are the kernel knobs of every layer.
	Knobs KnobValues `json:"knobs"`
	// Layers has one entry per fused node, lowered or not, in graph order.
	Layers []LayerPlan `json:"layers"`
	// VendorShapes is the model's view of the vendor's benchmarks.
	VendorShapes VendorPlan `json:"vendor_shapes"`
}

// KnobValues are the kernel knobs written on every kernel node, under MoK's
// names (see kernel.Knobs).
type KnobValues struct {
	FwdNumCommSMs                 int     `json:"fwd_num_comm_sms"`
	BwdNumCommSMs                 int     `json:"bwd_num_comm_sms"`
	MinibatchSize                 int     `json:"minibatch_size"`
	MacrobatchSize                int     `json:"macrobatch_size"`
	ScheduleCapacityMultiplier    float64 `json:"schedule_capacity_multiplier"`
	AllGatherTopExpertsChunkBytes int     `json:"all_gather_top_experts_chunk_bytes"`
}

// LayerShapes are a layer's dimensions.
type LayerShapes struct {
	// E routed experts, top-K, hidden H, routed intermediate I, shared
	// expert intermediate SharedI (0: none).
	E       int `json:"E"`
	K       int `json:"k"`
	H       int `json:"H"`
	I       int `json:"I"`
	SharedI int `json:"shared_I"`
	// SharedGated is true for a sigmoid-gated shared expert.
	SharedGated bool `json:"shared_gated"`
}

// RankRange is the contiguous block of global expert ids one rank holds.
type RankRange struct {
	// Rank holds experts First..Last (inclusive).
	Rank  int `json:"rank"`
	First int `json:"first_expert"`
	Last  int `json:"last_expert"`
}

// Placement is a layer's expert-parallel placement.
type Placement struct {
	// EP ranks hold ExpertsPerRank experts each, rank r the contiguous ids
	// ExpertOffset + r·ExpertsPerRank onwards.
	EP             int `json:"ep"`
	ExpertsPerRank int `json:"experts_per_rank"`
	ExpertOffset   int `json:"expert_offset"`
	// Ranges lists each rank's experts.
	Ranges []RankRange `json:"ranges"`
}

// Memory are a layer's per-rank device-memory figures, bytes.
type Memory struct {
	// ScheduleRows is T·k·max(2, ceil(EP·schedule_capacity_multiplier)).
	ScheduleRows int `json:"schedule_rows"`
	// ScheduleCapacityBytes is the schedule itself: int32 peer rank and int32
	// peer token index per row.
	ScheduleCapacityBytes int64 `json:"schedule_capacity_bytes"`
	// WorkspaceBytes is kernel.EstimateWorkspace's total (forward, MXFP8),
	// which includes the schedule.
	WorkspaceBytes int64 `json:"workspace_bytes"`
	// WorkspaceItems are the estimate's buffers.
	WorkspaceItems []kernel.WorkspaceItem `json:"workspace_items"`
	// MXFP8 bytes of the routed weights held by one rank (E_l experts) and by
	// the whole EP group: E4M3 codes plus UE8M0 scales.
	MXFP8DataBytesPerRank  int64 `json:"mxfp8_data_bytes_per_rank"`
	MXFP8ScaleBytesPerRank int64 `json:"mxfp8_scale_bytes_per_rank"`
	MXFP8BytesPerRank      int64 `json:"mxfp8_bytes_per_rank"`
	MXFP8BytesTotal        int64 `json:"mxfp8_bytes_total"`
	// BF16SharedBytesPerRank is the shared expert's BF16 weights (every rank
	// holds a copy).
	BF16SharedBytesPerRank int64 `json:"bf16_bytes_per_rank"`
	// WeightBytesPerRankTotal is MXFP8 plus BF16 weight bytes per rank.
	WeightBytesPerRankTotal int64 `json:"weight_bytes_per_rank"`
}

// PerfPlan is kernel/perf's prediction for a layer (MXFP8 routed experts).
type PerfPlan struct {
	// Precision is the routed experts' precision ("mxfp8").
	Precision string `json:"precision"`
	// Times in microseconds, per pass, per rank.
	FwdMoKUs      float64 `json:"fwd_mok_us"`
	FwdBaselineUs float64 `json:"fwd_deepep_baseline_us"`
	FwdRatio      float64 `json:"fwd_ratio"`
	BwdMoKUs      float64 `json:"bwd_mok_us"`
	BwdBaselineUs float64 `json:"bwd_deepep_baseline_us"`
	BwdRatio      float64 `json:"bwd_ratio"`
	// FwdMoKTFLOPS is the vendor-convention throughput, 6·T·(k+1)·H·I per pass.
	FwdMoKTFLOPS float64 `json:"fwd_mok_effective_tflops"`
	// Note qualifies the prediction.
	Note string `json:"note,omitempty"`
}

// LayerPlan is one fused layer of the plan.
type LayerPlan struct {
	// Node is the fused node, KernelNode the kernel node that replaced it.
	Node       string `json:"node"`
	KernelNode string `json:"kernel_node,omitempty"`
	// Lowered, Reason and SharedExpert are as in Block.
	Lowered      bool   `json:"lowered"`
	Reason       string `json:"reason,omitempty"`
	SharedExpert string `json:"shared_expert,omitempty"`
	// Shapes are the layer's dimensions (nil if the node could not be read).
	Shapes *LayerShapes `json:"shapes,omitempty"`
	// Placement, Memory, Knobs and Perf are set for lowered layers only.
	Placement *Placement  `json:"placement,omitempty"`
	Memory    *Memory     `json:"memory,omitempty"`
	Knobs     *KnobValues `json:"knobs,omitempty"`
	Perf      *PerfPlan   `json:"perf,omitempty"`
}

// VendorRow is the model's prediction for one of the vendor's benchmarks.
type VendorRow struct {
	// Shape names the benchmark; E, H, I, K are its dimensions.
	Shape string `json:"shape"`
	E     int    `json:"E"`
	H     int    `json:"H"`
	I     int    `json:"I"`
	K     int    `json:"k"`
	// Precision is the routed precision, "mxfp8" or "bf16".
	Precision string `json:"precision"`
	// PredictedFwdRatio and PredictedBwdRatio are baseline over MoK time.
	PredictedFwdRatio float64 `json:"predicted_fwd_ratio"`
	PredictedBwdRatio float64 `json:"predicted_bwd_ratio"`
	// VendorFwdRatio and VendorBwdRatio are the vendor's reported "up to"
	// ratios for the precision (the vendor gives maxima over the four shapes,
	// not per-shape figures).
	VendorFwdRatio float64 `json:"vendor_reported_fwd_ratio_max"`
	VendorBwdRatio float64 `json:"vendor_reported_bwd_ratio_max"`
}

// VendorSummary compares, per precision, the best predicted ratios with the
// vendor's reported maxima.
type VendorSummary struct {
	// Precision is the routed precision.
	Precision string `json:"precision"`
	// PredictedMaxFwd and PredictedMaxBwd are the best predicted ratios over
	// the four shapes.
	PredictedMaxFwd float64 `json:"predicted_max_fwd_ratio"`
	PredictedMaxBwd float64 `json:"predicted_max_bwd_ratio"`
	// VendorReportedFwd and VendorReportedBwd are the vendor's "up to" ratios.
	VendorReportedFwd float64 `json:"vendor_reported_fwd_ratio"`
	VendorReportedBwd float64 `json:"vendor_reported_bwd_ratio"`
	// FwdPredictedVendor and BwdPredictedVendor are predicted over reported.
	FwdPredictedVendor float64 `json:"fwd_predicted_over_reported"`
	BwdPredictedVendor float64 `json:"bwd_predicted_over_reported"`
}

// VendorPlan is the vendor benchmark section.
type VendorPlan struct {
	// Setup states the benchmark configuration.
	Setup string `json:"setup"`
	// Rows has one row per (shape, precision), MXFP8 first.
	Rows []VendorRow `json:"rows"`
	// Summary has one entry per precision.
	Summary []VendorSummary `json:"summary"`
}

func knobValues(k kernel.Knobs) KnobValues {
	return KnobValues{k.FwdNumCommSMs, k.BwdNumCommSMs, k.MinibatchSize, k.MacrobatchSize, k.ScheduleCapacityMultiplier, k.AllGatherTopExpertsChunkBytes}
}

func buildPlan(rep *Report, opt *Options, knobs kernel.Knobs, params perf.Params) (*Plan, error) {
	T := opt.TokensPerRank
	p := &Plan{SchemaVersion: 1, Target: opt.Target.Name, GPU: opt.Target.GPU, EP: opt.EP, TokensPerRank: T, Knobs: knobValues(knobs), Layers: []LayerPlan{}}
	if T <= 0 {
		T = opt.PlanTokensPerRank
		p.TokensPerRank, p.TokensPerRankAssumed = T, true
	}
	for _, b := range rep.Blocks {
		lp := LayerPlan{Node: b.Node, KernelNode: b.KernelNode, Lowered: b.Lowered, Reason: b.Reason, SharedExpert: b.SharedExpert}
		if s := b.Spec; s != nil {
			lp.Shapes = &LayerShapes{E: s.NumExperts, K: s.TopK, H: s.Hidden, I: s.Inter, SharedI: s.SharedInter, SharedGated: s.SharedGated}
		}
		if !b.Lowered {
			p.Layers = append(p.Layers, lp)
			continue
		}
		s := b.Spec
		el := s.NumExperts / opt.EP
		pl := &Placement{EP: opt.EP, ExpertsPerRank: el, ExpertOffset: s.ExpertOffset}
		for r := 0; r < opt.EP; r++ {
			first := s.ExpertOffset + r*el
			pl.Ranges = append(pl.Ranges, RankRange{Rank: r, First: first, Last: first + el - 1})
		}
		lp.Placement = pl
		ws := kernel.EstimateWorkspace(LayerSpec(s), opt.EP, T, kernel.MXFP8, knobs)
		mem := &Memory{ScheduleRows: ws.ScheduleRows, WorkspaceBytes: ws.Total, WorkspaceItems: ws.Items}
		for _, it := range ws.Items {
			if strings.HasPrefix(it.Name, "schedule_") {
				mem.ScheduleCapacityBytes += it.Bytes
			}
		}
		H, I := s.Hidden, s.Inter
		data := int64(3) * int64(el) * int64(I) * int64(H)
		scales := int64(mxfp8.ScaleLen(el, I, H) + mxfp8.ScaleLen(el, I, H) + mxfp8.ScaleLen(el, H, I))
		mem.MXFP8DataBytesPerRank, mem.MXFP8ScaleBytesPerRank = data, scales
		mem.MXFP8BytesPerRank = data + scales
		mem.MXFP8BytesTotal = mem.MXFP8BytesPerRank * int64(opt.EP)
		mem.BF16SharedBytesPerRank = 3 * int64(I) * int64(H) * 2
		mem.WeightBytesPerRankTotal = mem.MXFP8BytesPerRank + mem.BF16SharedBytesPerRank
		lp.Memory = mem
		kv := knobValues(knobs)
		lp.Knobs = &kv
		hw, err := perf.HardwareFor(opt.Target)
		if err != nil {
			return nil, err
		}
		pred, err := perf.Predict(perf.Scenario{Hardware: hw, Shape: perf.Shape{Name: b.Node, E: s.NumExperts, H: H, I: I, K: s.TopK},
			EP: opt.EP, TokensPerRank: T, Precision: kernel.MXFP8, Knobs: knobs, Params: params})
		if err != nil {
			return nil, err
		}
		lp.Perf = &PerfPlan{Precision: string(kernel.MXFP8),
			FwdMoKUs: pred.FwdMoK.Total * 1e6, FwdBaselineUs: pred.FwdBaseline.Total * 1e6, FwdRatio: pred.FwdSpeedup,
			BwdMoKUs: pred.BwdMoK.Total * 1e6, BwdBaselineUs: pred.BwdBaseline.Total * 1e6, BwdRatio: pred.BwdSpeedup,
			FwdMoKTFLOPS: pred.EffectiveTFLOPS(pred.FwdMoK.Total)}
		if b.SharedExpert != SharedInKernel {
			lp.Perf.Note = "the kernel runs a zero shared expert of width I (modelled); the shared expert kept outside, if any, is not modelled"
		}
		p.Layers = append(p.Layers, lp)
	}
	cmp, err := perf.VendorComparison(params)
	if err != nil {
		return nil, err
	}
	p.VendorShapes.Setup = "one GB300 NVL72 rack, EP 64, 2048 tokens per GPU, default knobs, one shared expert; baseline: unfused DeepEP + grouped GEMM (kernel/perf)"
	for _, r := range cmp.Rows {
		vf, vb := perf.VendorReported(r.Precision)
		p.VendorShapes.Rows = append(p.VendorShapes.Rows, VendorRow{Shape: r.Shape.Name, E: r.Shape.E, H: r.Shape.H, I: r.Shape.I, K: r.Shape.K,
			Precision: string(r.Precision), PredictedFwdRatio: r.Prediction.FwdSpeedup, PredictedBwdRatio: r.Prediction.BwdSpeedup,
			VendorFwdRatio: vf, VendorBwdRatio: vb})
	}
	for _, s := range cmp.Summary {
		p.VendorShapes.Summary = append(p.VendorShapes.Summary, VendorSummary{Precision: string(s.Precision),
			PredictedMaxFwd: s.PredictedMaxFwd, PredictedMaxBwd: s.PredictedMaxBwd, VendorReportedFwd: s.VendorMaxFwd, VendorReportedBwd: s.VendorMaxBwd,
			FwdPredictedVendor: s.PredictedMaxFwd / s.VendorMaxFwd, BwdPredictedVendor: s.PredictedMaxBwd / s.VendorMaxBwd})
	}
	return p, nil
}

// Summary renders the report as a short human summary: per block what was
// done and why, and per lowered layer the plan's key figures.
func (r *Report) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d MoE block(s) lowered to %s::%s (target %s, EP %d", r.Lowered(), len(r.Blocks), Domain, OpType, r.Target, r.EP)
	if r.TokensPerRank > 0 {
		fmt.Fprintf(&b, ", T %d/rank", r.TokensPerRank)
	}
	b.WriteString(")\n")
	var layers map[string]LayerPlan
	if r.Plan != nil {
		layers = map[string]LayerPlan{}
		for _, l := range r.Plan.Layers {
			layers[l.Node] = l
		}
	}
	for _, blk := range r.Blocks {
		shape := ""
		if s := blk.Spec; s != nil {
			shape = fmt.Sprintf(" E=%d k=%d H=%d I=%d shared I=%d", s.NumExperts, s.TopK, s.Hidden, s.Inter, s.SharedInter)
			if s.SharedGated {
				shape += " (gated)"
			}
		}
		state := "kept unlowered"
		if blk.Lowered {
			state = "lowered: routed mxfp8, shared " + blk.SharedExpert
		}
		fmt.Fprintf(&b, "  %s%s: %s\n", blk.Node, shape, state)
		for _, v := range blk.Violations {
			fmt.Fprintf(&b, "    %s\n", v)
		}
		if blk.Reason != "" {
			fmt.Fprintf(&b, "    warning: %s\n", blk.Reason)
		}
		if l, ok := layers[blk.Node]; ok && l.Perf != nil {
			m := l.Memory
			fmt.Fprintf(&b, "    plan (T=%d/rank): %d experts/rank; weights %.1f MiB/rank (mxfp8 %.1f + bf16 %.1f); workspace %.1f MiB/rank, schedule %d rows (%.1f KiB)\n",
				r.Plan.TokensPerRank, l.Placement.ExpertsPerRank, mib(m.WeightBytesPerRankTotal), mib(m.MXFP8BytesPerRank), mib(m.BF16SharedBytesPerRank),
				mib(m.WorkspaceBytes), m.ScheduleRows, float64(m.ScheduleCapacityBytes)/1024)
			fmt.Fprintf(&b, "    predicted fwd %.1f us vs %.1f us DeepEP baseline (%.2fx), bwd %.1f us vs %.1f us (%.2fx)\n",
				l.Perf.FwdMoKUs, l.Perf.FwdBaselineUs, l.Perf.FwdRatio, l.Perf.BwdMoKUs, l.Perf.BwdBaselineUs, l.Perf.BwdRatio)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	if r.Plan != nil {
		for _, s := range r.Plan.VendorShapes.Summary {
			fmt.Fprintf(&b, "  vendor shapes, %s: predicted up to %.2fx fwd, %.2fx bwd; vendor reported up to %.2fx fwd, %.2fx bwd\n",
				s.Precision, s.PredictedMaxFwd, s.PredictedMaxBwd, s.VendorReportedFwd, s.VendorReportedBwd)
		}
	}
	return b.String()
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
