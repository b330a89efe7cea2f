// Package perf is an analytic performance model of one MoE layer on an NVL72
// rack: the fused MoK megakernel against an unfused DeepEP + grouped-GEMM
// baseline, forward and backward, per rank.
//
// It is a first-order model (roofline compute and bandwidth terms, documented
// overlap rules, a handful of efficiency parameters), meant to rank lowering
// choices and to explain where time goes, not to reproduce measured numbers. The
// hardware figures are vendor and third-party published figures, collected in
// the repository's docs/kernel.md; treat them as leads, not measurements.
package perf

import (
	"fmt"

	"github.com/mokopt/mokopt/kernel"
)

// Hardware holds the per-GPU figures of a target.
type Hardware struct {
	// Target is the kernel target these figures describe.
	Target kernel.Target
	// BF16FLOPS is the dense BF16 tensor-core rate, FLOP/s.
	BF16FLOPS float64
	// FP8FLOPS is the dense FP8 rate, FLOP/s; MXFP8 is assumed to run at it.
	FP8FLOPS float64
	// HBMBytes is the HBM capacity, bytes.
	HBMBytes float64
	// HBMBandwidth is the HBM bandwidth, bytes/s.
	HBMBandwidth float64
	// NVLinkBandwidth is the NVLink bandwidth per GPU per direction, bytes/s.
	NVLinkBandwidth float64
	// DeepEPDispatch and DeepEPCombine are DeepEP's measured NVLink bandwidths,
	// bytes/s (0: no measurement known).
	DeepEPDispatch, DeepEPCombine float64
}

const (
	tera = 1e12
	peta = 1e15
	giga = 1e9
)

// GB300 is one GPU of a GB300 NVL72 rack. Sources (docs/kernel.md "Hardware
// figures", third-party leads): dense BF16 ≈ 2.5 PFLOP/s, FP8/MXFP8 ≈ 5 PFLOP/s
// ("MXFP8 = FP8 rate (?)"), HBM3e 288 GB at 8 TB/s, NVLink 5 1.8 TB/s
// bidirectional = 900 GB/s each way; DeepEP v2.1.0 on SM100 NVLink (EP 8, 64 SMs):
// ≈ 726 GB/s dispatch, 740 GB/s combine.
var GB300 = Hardware{
	Target:          kernel.GB300NVL72,
	BF16FLOPS:       2.5 * peta,
	FP8FLOPS:        5 * peta,
	HBMBytes:        288 * giga,
	HBMBandwidth:    8 * tera,
	NVLinkBandwidth: 900 * giga,
	DeepEPDispatch:  726 * giga,
	DeepEPCombine:   740 * giga,
}

// GB200 is one GPU of a GB200 NVL72 rack. Sources (docs/kernel.md): dense BF16 ≈
// 2.5 PFLOP/s, FP8 ≈ 5 PFLOP/s, 192 GB at 8 TB/s, NVLink 5 900 GB/s each way; the
// DeepEP SM100 figures (726/740 GB/s) are used for it as well.
var GB200 = Hardware{
	Target:          kernel.GB200NVL72,
	BF16FLOPS:       2.5 * peta,
	FP8FLOPS:        5 * peta,
	HBMBytes:        192 * giga,
	HBMBandwidth:    8 * tera,
	NVLinkBandwidth: 900 * giga,
	DeepEPDispatch:  726 * giga,
	DeepEPCombine:   740 * giga,
}

// H200 is one GPU of an HGX H200 node, from NVIDIA's public H200 datasheet (not
// from docs/kernel.md): dense BF16 ≈ 0.99 PFLOP/s, FP8 ≈ 1.98 PFLOP/s, 141 GB
// HBM3e at 4.8 TB/s, NVLink 4 900 GB/s bidirectional. No DeepEP figure is
// recorded, and MoK does not run on SM90, so Predict refuses it.
var H200 = Hardware{
	Target:          kernel.H200,
	BF16FLOPS:       0.989 * peta,
	FP8FLOPS:        1.979 * peta,
	HBMBytes:        141 * giga,
	HBMBandwidth:    4.8 * tera,
	NVLinkBandwidth: 450 * giga,
}

// HardwareFor returns the figures of a target.
func HardwareFor(t kernel.Target) (Hardware, error) {
	for _, h := range []Hardware{GB300, GB200, H200} {
		if h.Target.Name == t.Name {
			return h, nil
		}
	}
	return Hardware{}, fmt.Errorf("perf: no hardware figures for target %q", t.Name)
}
