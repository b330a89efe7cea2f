// Package kernel encodes the contract of the Mixture-of-Kittens (MoK) MoE
// megakernel for GB200/GB300 NVL72 racks as data and checks: the per-rank tensor
// table (names, dtypes, shape formulas, layouts), the kernel knobs with their
// defaults and validity rules, the targets (gb200-nvl72, gb300-nvl72, and h200,
// which is refused), the hard constraints a lowering must verify (Check), the
// schedule capacity rule and a workspace estimate.
//
// The source of every number and rule is /work/shared/docs/MOK_KERNEL.md (facts
// gathered from the public MoK sources); where this package goes beyond it, the
// doc comment says so. The MXFP8 codec lives in the sub-package kernel/mxfp8 and
// the analytic NVL72 performance model in kernel/perf.
package kernel
