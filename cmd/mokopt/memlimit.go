package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
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

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

// Set parses a size for pflag.
func (b *byteSize) Set(s string) error {
	n, err := parseByteSize(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

// Type names the flag's value in help.
func (b *byteSize) Type() string { return "bytes" }
