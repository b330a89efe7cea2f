package perf

import (
	"fmt"
	"math"

	"github.com/mokopt/mokopt/kernel"
)

// Shape is an MoE layer shape: E routed experts, hidden H, intermediate I, top-k K,
// plus one shared expert of intermediate size I.
type Shape struct {
	// Name labels the shape in reports.
	Name string
	// E is the number of routed experts.
	E int
	// H is the hidden size.
	H int
	// I is the intermediate size.
	I int
	// K is top-k.
	K int
}

// VendorShapes returns the four layer shapes of the vendor's benchmarks
// (docs/kernel.md "Reported results"), each with one shared expert.
func VendorShapes() []Shape {
	return []Shape{
		{Name: "E384 H7168 I2048 k8", E: 384, H: 7168, I: 2048, K: 8},
		{Name: "E256 H6144 I2048 k8", E: 256, H: 6144, I: 2048, K: 8},
		{Name: "E512 H4096 I1024 k10", E: 512, H: 4096, I: 1024, K: 10},
		{Name: "E384 H7168 I3072 k6", E: 384, H: 7168, I: 3072, K: 6},
	}
}

// Params are the model's efficiency assumptions.
type Params struct {
	// GEMMEfficiency is the fraction of the dense peak that grouped GEMMs reach,
	// for MoK's and the baseline's alike.
	GEMMEfficiency float64
	// HBMEfficiency is the fraction of HBM bandwidth that memory-bound kernels
	// (permutes, activations, quantizers, epilogues) reach.
	HBMEfficiency float64
	// KernelOverhead is the launch-and-tail cost of each separate kernel, seconds.
	KernelOverhead float64
}

// DefaultParams returns the assumptions used unless told otherwise: GEMMs at 70%
// of peak, memory-bound kernels at 80% of HBM bandwidth, 5 µs per kernel.
func DefaultParams() Params {
	return Params{GEMMEfficiency: 0.70, HBMEfficiency: 0.80, KernelOverhead: 5e-6}
}

// Scenario is one layer on one rack configuration.
type Scenario struct {
	// Hardware is the GPU.
	Hardware Hardware
	// Shape is the layer.
	Shape Shape
	// EP is the expert-parallel group size.
	EP int
	// TokensPerRank is T.
	TokensPerRank int
	// Precision is the routed experts' precision (the shared expert is BF16).
	Precision kernel.Precision
	// Knobs are MoK's knobs (comm SMs and minibatch size matter here).
	Knobs kernel.Knobs
	// Params are the efficiency assumptions.
	Params Params
}

// Breakdown is the predicted time of one pass, in seconds, by component. Total
// is not the plain sum where components overlap (see Predict).
type Breakdown struct {
	// Compute is GEMM time (for MoK: on the SMs left after the comm SMs).
	Compute float64
	// Dispatch and Combine are the all-to-all transfer times.
	Dispatch, Combine float64
	// Fill and Drain are the exposed parts of the pipeline's first dispatch and
	// last combine (MoK only).
	Fill, Drain float64
	// HBM is the time of memory-bound kernels between the GEMMs (baseline), or of
	// the epilogue (MoK).
	HBM float64
	// Overhead is kernel launch and tail time.
	Overhead float64
	// Total is the predicted wall time of the pass.
	Total float64
}

// Prediction is the model's answer for a scenario.
type Prediction struct {
	// Scenario is the input.
	Scenario Scenario
	// EffectiveFLOPs is the vendor's count, 6·T·(k+1)·H·I per pass.
	EffectiveFLOPs float64
	// FwdMoK, FwdBaseline, BwdMoK and BwdBaseline are the four predicted passes.
	FwdMoK, FwdBaseline, BwdMoK, BwdBaseline Breakdown
	// FwdSpeedup and BwdSpeedup are baseline time over MoK time.
	FwdSpeedup, BwdSpeedup float64
}

// EffectiveTFLOPS returns the vendor-convention throughput of a pass taking
// seconds: EffectiveFLOPs / seconds / 1e12 (the same count for both passes).
func (p Prediction) EffectiveTFLOPS(seconds float64) float64 {
	return p.EffectiveFLOPs / seconds / 1e12
}

// Predict evaluates a scenario. The model, per rank, with R = T·k routed rows
// (balanced routing: each rank sends and receives R rows) of which a fraction
// (EP−1)/EP crosses NVLink:
//
// FLOPs. A SwiGLU expert costs 3 GEMMs of 2·H·I FLOPs per row, so the forward
// pass is 6·T·(k+1)·H·I FLOPs (k routed rows and one shared row per token):
// exactly the vendor's "effective FLOPs per pass", which this model therefore
// reads as the forward count. Backward (dgrad + wgrad) is twice that. Routed
// GEMMs run at the FP8 rate for MXFP8 (weights, activations and gradients are
// E4M3 in MoK) and at the BF16 rate otherwise; the shared expert is always BF16.
// Both sides reach Params.GEMMEfficiency of peak.
//
// Bytes. A dispatched row is H·2 bytes (BF16) or H·(1+1/32) (E4M3 plus UE8M0
// scales); a combined row is H·2 bytes (MoK's combine buffer is bf16 [T·k, H]).
// Backward moves the same volume (dispatch of dy, combine of dx). Both sides
// send one row per (token, expert) pair (DeepEP's per-rank deduplication, a few
// percent at EP 64, is ignored) and reach DeepEP's measured bandwidths: MoK's
// comm SMs are assumed to do as well as DeepEP's 64 SMs.
//
// MoK (fused): the GEMMs run on the SMs not reserved for communication
// (fwd_num_comm_sms / bwd_num_comm_sms of the target's SM count) while the comm
// SMs dispatch and combine, so the body takes max(compute, dispatch+combine).
// The pipeline cannot hide the first minibatch's dispatch (minus the shared
// expert's GEMMs, which need no dispatch and run meanwhile) nor the last
// minibatch's combine; each is min(1, minibatch/R) of the transfer. Then the
// epilogue kernel reads k+1 bf16 rows per token and writes one (T·H·2·(k+2) bytes
// at HBM speed) plus one kernel overhead.
//
// Baseline (unfused DeepEP + grouped GEMM, serialized): dispatch + GEMMs on all
// SMs + combine, plus the HBM round trips of activations between its kernels,
// plus one kernel overhead per kernel. Forward: for MXFP8 a quantizer of x before
// dispatch; a permute of the received rows into expert order (read + write); the
// gate/up GEMM output read by the SwiGLU kernel, which writes the hidden rows;
// the down GEMM output read, weighted and un-permuted (read + write) before
// combine; the shared expert's SwiGLU; the final add of shared and routed. Backward
// doubles every forward round trip, and for MXFP8 adds the transposed (column-wise)
// quantization of x, hidden and dy for the wgrads. Kernel counts: forward 11
// (+1 for MXFP8), backward 20 (+3 for MXFP8).
func Predict(s Scenario) (Prediction, error) {
	if err := s.validate(); err != nil {
		return Prediction{}, err
	}
	hw, sh, pr := s.Hardware, s.Shape, s.Params
	T, H, I, k := float64(s.TokensPerRank), float64(sh.H), float64(sh.I), float64(sh.K)
	R := T * k
	remote := float64(s.EP-1) / float64(s.EP)

	// FLOPs and GEMM time on a whole GPU.
	routedRate := hw.BF16FLOPS
	rowBytes := 2 * H // dispatched row
	elem := 2.0       // bytes per routed activation element between baseline kernels
	if s.Precision == kernel.MXFP8 {
		routedRate = hw.FP8FLOPS
		rowBytes = H * (1 + 1.0/32)
		elem = 1 + 1.0/32
	}
	fwdRouted := 6 * R * H * I / (routedRate * pr.GEMMEfficiency)
	fwdShared := 6 * T * H * I / (hw.BF16FLOPS * pr.GEMMEfficiency)
	dispatch := R * remote * rowBytes / hw.DeepEPDispatch
	combine := R * remote * 2 * H / hw.DeepEPCombine
	hbm := hw.HBMBandwidth * pr.HBMEfficiency
	mbFrac := math.Min(1, float64(s.Knobs.MinibatchSize)/R)
	sms := float64(hw.Target.SMCount)

	mok := func(passes float64, commSMs int) Breakdown {
		frac := (sms - float64(commSMs)) / sms
		routed, shared := passes*fwdRouted/frac, passes*fwdShared/frac
		b := Breakdown{Compute: routed + shared, Dispatch: dispatch, Combine: combine}
		b.Fill = math.Max(0, mbFrac*dispatch-shared)
		b.Drain = mbFrac * combine
		b.HBM = T * H * 2 * (k + 2) / hbm
		b.Overhead = pr.KernelOverhead
		b.Total = b.Fill + math.Max(b.Compute, dispatch+combine) + b.Drain + b.HBM + b.Overhead
		return b
	}

	// Baseline HBM traffic, forward, bytes.
	fwdBytes := 2*R*H*elem + // permute received rows (read + write)
		R*2*I*2 + R*I*elem + // SwiGLU: read gate/up (bf16), write hidden
		2*R*H*2 + // weight and un-permute the down output (read + write)
		T*2*I*2 + T*I*2 + // shared SwiGLU
		3*T*H*2 // out = shared + routed (read two, write one)
	fwdKernels := 11.0
	bwdBytes := 2 * fwdBytes
	bwdKernels := 20.0
	if s.Precision == kernel.MXFP8 {
		fwdBytes += T * H * (2 + elem) // quantize x before dispatch
		fwdKernels++
		bwdBytes += (R*H + R*I + R*H) * (2 + elem) // transposed quantization of x, hidden, dy
		bwdKernels += 3
	}
	base := func(passes float64, bytes, kernels float64) Breakdown {
		b := Breakdown{Compute: passes * (fwdRouted + fwdShared), Dispatch: dispatch, Combine: combine}
		b.HBM = bytes / hbm
		b.Overhead = kernels * pr.KernelOverhead
		b.Total = b.Dispatch + b.Compute + b.Combine + b.HBM + b.Overhead
		return b
	}

	p := Prediction{Scenario: s, EffectiveFLOPs: 6 * T * (k + 1) * H * I}
	p.FwdMoK = mok(1, s.Knobs.FwdNumCommSMs)
	p.BwdMoK = mok(2, s.Knobs.BwdNumCommSMs)
	p.FwdBaseline = base(1, fwdBytes, fwdKernels)
	p.BwdBaseline = base(2, bwdBytes, bwdKernels)
	p.FwdSpeedup = p.FwdBaseline.Total / p.FwdMoK.Total
	p.BwdSpeedup = p.BwdBaseline.Total / p.BwdMoK.Total
	return p, nil
}

func (s Scenario) validate() error {
	hw := s.Hardware
	switch {
	case !hw.Target.Supported:
		return fmt.Errorf("perf: MoK does not run on %s (%s)", hw.Target.Name, hw.Target.Arch())
	case hw.DeepEPDispatch <= 0 || hw.DeepEPCombine <= 0 || hw.BF16FLOPS <= 0 || hw.FP8FLOPS <= 0 || hw.HBMBandwidth <= 0:
		return fmt.Errorf("perf: incomplete hardware figures for %s", hw.Target.Name)
	case s.EP < 1 || s.TokensPerRank <= 0:
		return fmt.Errorf("perf: EP=%d and T=%d must be positive", s.EP, s.TokensPerRank)
	case s.Shape.E <= 0 || s.Shape.H <= 0 || s.Shape.I <= 0 || s.Shape.K <= 0:
		return fmt.Errorf("perf: shape %+v must be positive", s.Shape)
	case s.Precision != kernel.BF16 && s.Precision != kernel.MXFP8:
		return fmt.Errorf("perf: unknown precision %q", s.Precision)
	case s.Params.GEMMEfficiency <= 0 || s.Params.HBMEfficiency <= 0 || s.Params.KernelOverhead < 0:
		return fmt.Errorf("perf: bad params %+v", s.Params)
	case s.Knobs.MinibatchSize <= 0:
		return fmt.Errorf("perf: minibatch size %d must be positive", s.Knobs.MinibatchSize)
	case s.Knobs.FwdNumCommSMs < 0 || s.Knobs.BwdNumCommSMs < 0 ||
		s.Knobs.FwdNumCommSMs >= hw.Target.SMCount || s.Knobs.BwdNumCommSMs >= hw.Target.SMCount:
		return fmt.Errorf("perf: comm SMs %d/%d do not fit %d SMs", s.Knobs.FwdNumCommSMs, s.Knobs.BwdNumCommSMs, hw.Target.SMCount)
	}
	return nil
}
