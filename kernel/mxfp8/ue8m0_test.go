package mxfp8

import (
	"math"
	"testing"
)

func TestScaleByte(t *testing.T) {
	inf := float32(math.Inf(1))
	for _, tc := range []struct {
		name string
		amax float32
		want uint8
	}{
		{"zero hits the 1e-12 floor: 2^-39", 0, 88},
		{"negative zero", float32(math.Copysign(0, -1)), 88},
		{"float32 subnormal", math.Float32frombits(1), 88},
		{"floor boundary 448*2^-39 exact", 448 * float32(math.Ldexp(1, -39)), 88},
		{"just above floor boundary", math.Nextafter32(448*float32(math.Ldexp(1, -39)), 1), 89},
		{"448 gives s=1", 448, 127},
		{"just above 448", math.Nextafter32(448, 1000), 128},
		{"just below 448", math.Nextafter32(448, 0), 127},
		{"one: ceil(log2(1/448)) = -8", 1, 119},
		{"sign ignored", -448, 127},
		{"896 gives s=2", 896, 128},
		{"1e30", 1e30, 218},
		{"float32 max", math.MaxFloat32, 247},
		{"NaN", float32(math.NaN()), ScaleNaN},
		{"Inf", inf, ScaleNaN},
	} {
		if got := ScaleByte(tc.amax); got != tc.want {
			t.Errorf("%s: ScaleByte(%v) = %d, want %d", tc.name, tc.amax, got, tc.want)
		}
	}
}

func TestScaleExponentMatchesLog2(t *testing.T) {
	// Against float64 ceil(log2(s)) for s = fl32(amax/448), away from exact powers
	// of two where log2 in float64 is exact anyway.
	for e := -140; e <= 127; e++ {
		for _, m := range []float64{0.51, 0.75, 0.999, 1} {
			amax := float32(math.Ldexp(m, e))
			if amax == 0 || math.IsInf(float64(amax), 0) {
				continue
			}
			s := float64(float32(amax / 448))
			if s < float64(ScaleFloor) {
				s = float64(ScaleFloor)
			}
			want := int(math.Ceil(math.Log2(s)))
			if got := ScaleExponent(amax); got != want {
				t.Errorf("ScaleExponent(%v) = %d, want %d", amax, got, want)
			}
		}
	}
}

func TestScaleReciprocalExact(t *testing.T) {
	for b := 0; b < 255; b++ {
		s, r := ScaleValue(uint8(b)), ScaleReciprocal(uint8(b))
		if float64(s) != math.Ldexp(1, b-127) || float64(r) != math.Ldexp(1, 127-b) {
			t.Errorf("byte %d: scale %v, reciprocal %v", b, s, r)
		}
		if s*r != 1 {
			t.Errorf("byte %d: scale·reciprocal = %v", b, s*r)
		}
	}
	if v := ScaleValue(255); v == v {
		t.Errorf("ScaleValue(255) = %v, want NaN", v)
	}
	if v := ScaleReciprocal(255); v == v {
		t.Errorf("ScaleReciprocal(255) = %v, want NaN", v)
	}
	tab, rtab := ScaleTable(), ReciprocalTable()
	for b := 0; b < 255; b++ {
		if tab[b] != ScaleValue(uint8(b)) || rtab[b] != ScaleReciprocal(uint8(b)) {
			t.Fatalf("tables disagree with functions at %d", b)
		}
	}
}
