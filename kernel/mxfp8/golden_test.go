package mxfp8

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"strconv"
	"testing"
)

// golden mirrors testdata/golden.json, written by testdata/gen_golden.py with
// PyTorch (float8_e4m3fn cast; CPU and CUDA casts cross-checked).
type golden struct {
	TorchVersion   string   `json:"torch_version"`
	CUDACrosscheck bool     `json:"cuda_crosscheck"`
	CUDADevice     string   `json:"cuda_device"`
	Decode         []string `json:"e4m3_decode"`
	Scale          []string `json:"ue8m0_scale"`
	Reciprocal     []string `json:"ue8m0_reciprocal"`
	Encode         []struct {
		Input string `json:"input"`
		Code  int    `json:"code"`
	} `json:"encode"`
	Blocks []struct {
		Name     string   `json:"name"`
		Input    []string `json:"input"`
		Scale    int      `json:"scale"`
		Elements []int    `json:"elements"`
	} `json:"blocks"`
	Tensor struct {
		E, N, K      int
		Input        []string `json:"input"`
		Elements     string   `json:"elements_hex"`
		BlockScales  string   `json:"block_scales_hex"`
		TElements    string   `json:"t_elements_hex"`
		TBlockScales string   `json:"t_block_scales_hex"`
	} `json:"tensor"`
}

func loadGolden(t *testing.T) *golden {
	t.Helper()
	raw, err := os.ReadFile("testdata/golden.json")
	if err != nil {
		t.Fatalf("golden vectors: %v (regenerate with testdata/gen_golden.py)", err)
	}
	var g golden
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatalf("golden.json: %v", err)
	}
	if len(g.Decode) != 256 || len(g.Scale) != 256 || len(g.Reciprocal) != 256 {
		t.Fatalf("golden.json: tables have %d/%d/%d entries, want 256", len(g.Decode), len(g.Scale), len(g.Reciprocal))
	}
	return &g
}

func bitsOf(t *testing.T, s string) uint32 {
	t.Helper()
	if len(s) < 3 || s[:2] != "0x" {
		t.Fatalf("bad bit pattern %q", s)
	}
	v, err := strconv.ParseUint(s[2:], 16, 32)
	if err != nil {
		t.Fatalf("bad bit pattern %q: %v", s, err)
	}
	return uint32(v)
}

func floatsOf(t *testing.T, ss []string) []float32 {
	t.Helper()
	out := make([]float32, len(ss))
	for i, s := range ss {
		out[i] = math.Float32frombits(bitsOf(t, s))
	}
	return out
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex: %v", err)
	}
	return b
}

// sameFloat compares bit patterns, treating any two NaNs as equal.
func sameFloat(a, b float32) bool {
	if a != a || b != b {
		return a != a && b != b
	}
	return math.Float32bits(a) == math.Float32bits(b)
}

func TestGoldenProvenance(t *testing.T) {
	g := loadGolden(t)
	t.Logf("golden vectors from torch %s, CUDA cross-check %v (%s)", g.TorchVersion, g.CUDACrosscheck, g.CUDADevice)
	if g.TorchVersion == "" {
		t.Error("golden.json does not record the torch version that produced it")
	}
}

func TestGoldenDecodeTable(t *testing.T) {
	g := loadGolden(t)
	for c := 0; c < 256; c++ {
		want := math.Float32frombits(bitsOf(t, g.Decode[c]))
		if got := DecodeE4M3(uint8(c)); !sameFloat(got, want) {
			t.Errorf("DecodeE4M3(0x%02x) = %v (0x%08x), torch says %v (%s)", c, got, math.Float32bits(got), want, g.Decode[c])
		}
	}
}

func TestGoldenScaleTables(t *testing.T) {
	g := loadGolden(t)
	for b := 0; b < 256; b++ {
		want := math.Float32frombits(bitsOf(t, g.Scale[b]))
		if got := ScaleValue(uint8(b)); !sameFloat(got, want) {
			t.Errorf("ScaleValue(%d) = 0x%08x, want %s", b, math.Float32bits(got), g.Scale[b])
		}
		want = math.Float32frombits(bitsOf(t, g.Reciprocal[b]))
		if got := ScaleReciprocal(uint8(b)); !sameFloat(got, want) {
			t.Errorf("ScaleReciprocal(%d) = 0x%08x, want %s", b, math.Float32bits(got), g.Reciprocal[b])
		}
	}
}

func TestGoldenEncode(t *testing.T) {
	g := loadGolden(t)
	if len(g.Encode) < 1000 {
		t.Fatalf("only %d encode vectors", len(g.Encode))
	}
	bad := 0
	for _, v := range g.Encode {
		x := math.Float32frombits(bitsOf(t, v.Input))
		if got := EncodeE4M3(x); int(got) != v.Code {
			if bad++; bad <= 20 {
				t.Errorf("EncodeE4M3(%v = %s) = 0x%02x, torch says 0x%02x", x, v.Input, got, v.Code)
			}
		}
	}
}

func TestGoldenBlocks(t *testing.T) {
	g := loadGolden(t)
	for _, c := range g.Blocks {
		t.Run(c.Name, func(t *testing.T) {
			x := floatsOf(t, c.Input)
			got := make([]uint8, len(x))
			s := QuantizeBlock(got, x)
			if int(s) != c.Scale {
				t.Errorf("scale byte %d, torch says %d", s, c.Scale)
			}
			for i := range got {
				if int(got[i]) != c.Elements[i] {
					t.Errorf("element %d (x=%v): code 0x%02x, torch says 0x%02x", i, x[i], got[i], c.Elements[i])
				}
			}
		})
	}
}

func TestGoldenTensor(t *testing.T) {
	g := loadGolden(t)
	gt := g.Tensor
	x := floatsOf(t, gt.Input)
	for _, tc := range []struct {
		name       string
		transposed bool
		elements   string
		scales     string
	}{
		{"normal", false, gt.Elements, gt.BlockScales},
		{"transposed", true, gt.TElements, gt.TBlockScales},
	} {
		for _, workers := range []int{1, 4} {
			t.Run(tc.name+"/workers="+strconv.Itoa(workers), func(t *testing.T) {
				q := Quantizer{Workers: workers}
				var qt *Tensor
				var err error
				if tc.transposed {
					qt, err = q.QuantizeTransposed("golden", x, gt.E, gt.N, gt.K)
				} else {
					qt, err = q.Quantize("golden", x, gt.E, gt.N, gt.K)
				}
				if err != nil {
					t.Fatal(err)
				}
				if want := unhex(t, tc.elements); !bytes.Equal(qt.Data, want) {
					t.Errorf("codes differ from torch")
				}
				// torch's block scales are row-major [rows, cols/32]; place them with
				// the layout formula and compare element by element.
				want := unhex(t, tc.scales)
				kb := qt.K / BlockSize
				for row := 0; row < qt.E*qt.N; row++ {
					for b := 0; b < kb; b++ {
						if got := qt.Scales[layoutOffset(row, b, qt.K)]; got != want[row*kb+b] {
							t.Errorf("row %d block %d: scale %d, torch says %d", row, b, got, want[row*kb+b])
						}
					}
				}
			})
		}
	}
}
