package kernel

import (
	"fmt"
	"sort"
)

// Target is a machine a lowering can aim at.
type Target struct {
	// Name is the identifier used on the command line, e.g. "gb300-nvl72".
	Name string
	// GPU is the GPU model, e.g. "B300".
	GPU string
	// SM is the compute capability as an integer: 100 for SM100, 103 for SM103.
	SM int
	// SMCount is the number of streaming multiprocessors per GPU (the C of the
	// minibatch rule of thumb; the comm SMs are taken from these).
	SMCount int
	// DomainGPUs is the number of GPUs in one NVLink domain; an EP group must fit
	// inside it.
	DomainGPUs int
	// Supported reports whether MoK runs on this target at all.
	Supported bool
	// Note says where the figures come from or why the target is refused.
	Note string
}

// Arch returns the CUDA architecture name, e.g. "sm_103".
func (t Target) Arch() string { return fmt.Sprintf("sm_%d", t.SM) }

// The known targets.
var (
	// GB200NVL72 is a GB200 NVL72 rack: 72 B200 GPUs (SM100) in one NVLink domain.
	// 148 SMs per GPU is the C of docs/kernel.md's minibatch rule of thumb.
	GB200NVL72 = Target{Name: "gb200-nvl72", GPU: "B200", SM: 100, SMCount: 148, DomainGPUs: 72, Supported: true,
		Note: "SM100; MoK supports it"}
	// GB300NVL72 is a GB300 NVL72 rack: 72 B300 GPUs (SM103) in one NVLink domain.
	// docs/kernel.md's rule of thumb uses C = 148 SMs; that is used here too.
	GB300NVL72 = Target{Name: "gb300-nvl72", GPU: "B300", SM: 103, SMCount: 148, DomainGPUs: 72, Supported: true,
		Note: "SM103; MoK supports it; the vendor's benchmarks ran on one GB300 NVL72 rack"}
	// H200 is an HGX H200 node (SM90, 132 SMs, 8 GPUs per NVLink domain, public
	// NVIDIA figures, not from docs/kernel.md). MoK does not run on it.
	H200 = Target{Name: "h200", GPU: "H200", SM: 90, SMCount: 132, DomainGPUs: 8, Supported: false,
		Note: "SM90: MoK needs SM100 (GB200) or SM103 (GB300); keep the unfused MoE"}
)

// Targets returns the known targets, sorted by name.
func Targets() []Target {
	ts := []Target{GB200NVL72, GB300NVL72, H200}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	return ts
}

// LookupTarget returns the target with the given name.
func LookupTarget(name string) (Target, error) {
	for _, t := range Targets() {
		if t.Name == name {
			return t, nil
		}
	}
	names := make([]string, 0, 3)
	for _, t := range Targets() {
		names = append(names, t.Name)
	}
	return Target{}, fmt.Errorf("kernel: unknown target %q (known: %v)", name, names)
}
