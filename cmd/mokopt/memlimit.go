package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/mokopt/mokopt/graph/eval"
)

// byteSize is a flag value holding a number of bytes, written as a plain
// integer or with a unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB,
// GiB, TiB (powers of 1024), case-insensitive, e.g. "4GiB" or "512MB".
type byteSize int64

var byteUnits = []struct {
	suffix string
	mult   float64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"b", 1},
}

// parseByteSize parses "4GiB", "512MB", "1e9" or "0" (no limit) into bytes.
func parseByteSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := 1.0
	for _, u := range byteUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%q is not a size in bytes (e.g. 4GiB, 512MB, 1000000)", s)
	}
	b := v * mult
	if b >= math.MaxInt64 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return int64(b), nil
}

func (b *byteSize) String() string {
	if *b == memLimitAuto {
		return "auto"
	}
	return strconv.FormatInt(int64(*b), 10)
}

// Set parses a size for pflag ("auto": the default budget).
func (b *byteSize) Set(s string) error {
	if strings.EqualFold(strings.TrimSpace(s), "auto") {
		*b = memLimitAuto
		return nil
	}
	n, err := parseByteSize(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

// Type names the flag's value in help.
func (b *byteSize) Type() string { return "bytes" }

// memLimitAuto is the --mem-limit value that stands for the default budget.
const memLimitAuto byteSize = -1

// memLimitHelp is the help of every command's --mem-limit flag.
const memLimitHelp = "memory budget of the reference interpreter's tensors, e.g. 4GiB; auto: 3/4 of the memory available (MemAvailable, or the cgroup's limit when lower); 0: none. A run that needs more stops with exit 1"

// memBudget resolves a --mem-limit value to bytes: auto gives
// defaultMemBudget, 0 no limit. The Go heap's soft limit is set to the
// budget, so that the garbage collector works to stay under it.
func memBudget(v byteSize) int64 {
	b := int64(v)
	if v == memLimitAuto {
		b = defaultMemBudget()
	}
	if b > 0 {
		debug.SetMemoryLimit(b)
	}
	return b
}

// defaultMemBudget is 3/4 of the memory this process can use: the
// MemAvailable of /proc/meminfo, lowered to the cgroup's memory.max minus
// memory.current where that is smaller; 4 GiB when neither can be read.
func defaultMemBudget() int64 {
	avail := int64(-1)
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		avail = meminfoAvailable(string(b))
	}
	if lim, ok := cgroupAvailable("/sys/fs/cgroup"); ok && (avail < 0 || lim < avail) {
		avail = lim
	}
	if avail <= 0 {
		return 4 << 30
	}
	return avail / 4 * 3
}

// meminfoAvailable returns MemAvailable in bytes from /proc/meminfo text,
// or -1.
func meminfoAvailable(text string) int64 {
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "MemAvailable:" {
			if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil && kb >= 0 {
				return kb << 10
			}
		}
	}
	return -1
}

// cgroupAvailable returns what the cgroup mounted at dir leaves this
// process when a limit is set: limit minus usage, from cgroup v2's
// memory.max and memory.current, or cgroup v1's memory controller
// (memory/memory.limit_in_bytes and memory.usage_in_bytes, where a limit
// of 2^60 or more means none). It reads the cgroup the mount shows (a
// container's own, under a cgroup namespace), not nested ones; see
// docs/numerical-check.md for why this is not automemlimit's FromCgroup.
func cgroupAvailable(dir string) (int64, bool) {
	for _, files := range [][2]string{{"memory.max", "memory.current"}, {"memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"}} {
		b, err := os.ReadFile(filepath.Join(dir, files[0]))
		if err != nil {
			continue
		}
		lim, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || lim >= 1<<60 { // "max", or v1's page-rounded MaxInt64: no limit
			return 0, false
		}
		cur := int64(0)
		if b, err := os.ReadFile(filepath.Join(dir, files[1])); err == nil {
			cur, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		}
		return max(lim-cur, 0), true
	}
	return 0, false
}

// memLimitError, for an error that hit the memory budget, says what the
// budget was and which flags help; other errors pass unchanged.
func memLimitError(err error, budget int64, skip string) error {
	if !errors.Is(err, eval.ErrMemLimit) {
		return err
	}
	how := "raise it with --mem-limit (e.g. --mem-limit 64GiB; 0: no limit)"
	if skip != "" {
		how += ", or " + skip
	}
	return fmt.Errorf("%w; the memory budget is %s: %s", err, humanBytes(budget), how)
}
