// Package kernel encodes the contract of the Mixture-of-Kittens (MoK) MoE
// megakernel for GB200/GB300 NVL72 racks as data and checks: the per-rank tensor
// table (names, dtypes, shape formulas, layouts), the kernel knobs with their
// defaults and validity rules, the targets (gb200-nvl72, gb300-nvl72, and h200,
// which is refused), the hard constraints a lowering must verify (Check), the
// schedule capacity rule and a workspace estimate.
//
// Every number and rule comes from the public MoK sources and is written down,
// with those sources, in the repository's docs/kernel.md; where this package
// goes beyond them, the doc comment says so. The MXFP8 codec lives in the sub-package kernel/mxfp8 and
// the analytic NVL72 performance model in kernel/perf.
package kernel
