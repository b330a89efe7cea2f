package mxfp8

import (
	"math"
	"math/rand"
	"testing"
)

func TestEncodeE4M3Cases(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	for _, tc := range []struct {
		name string
		x    float32
		want uint8
	}{
		{"zero", 0, 0x00},
		{"negative zero", float32(math.Copysign(0, -1)), 0x80},
		{"one", 1, 0x38},
		{"minus one", -1, 0xB8},
		{"max", 448, 0x7E},
		{"minus max", -448, 0xFE},
		{"just above max saturates", 449, 0x7E},
		{"464 tie saturates", 464, 0x7E},
		{"480 saturates", 480, 0x7E},
		{"1e30 saturates", 1e30, 0x7E},
		{"+Inf saturates", inf, 0x7E},
		{"-Inf saturates", -inf, 0xFE},
		{"NaN", nan, 0x7F},
		{"negative NaN", float32(math.Copysign(math.NaN(), -1)), 0x7F},
		{"tie 1.0625 to even 1.0", 1.0625, 0x38},
		{"tie 1.1875 to even 1.25", 1.1875, 0x3A},
		{"above tie 1.0625 rounds up", math.Nextafter32(1.0625, 2), 0x39},
		{"below tie 1.1875 rounds down", math.Nextafter32(1.1875, 0), 0x39},
		{"tie 232 to even 224", 232, 0x76},
		{"tie 240+16 to even 256", 248, 0x78},
		{"min normal 2^-6", 1.0 / 64, 0x08},
		{"max subnormal 7*2^-9", 7.0 / 512, 0x07},
		{"min subnormal 2^-9", 1.0 / 512, 0x01},
		{"tie 2^-10 to zero", 1.0 / 1024, 0x00},
		{"just above 2^-10", math.Nextafter32(1.0/1024, 1), 0x01},
		{"tie 3*2^-10 to 2*2^-9", 3.0 / 1024, 0x02},
		{"tie 5*2^-10 to 2*2^-9", 5.0 / 1024, 0x02},
		{"tie 15*2^-10 to 2^-6", 15.0 / 1024, 0x08},
		{"negative tiny to -0", -1e-30, 0x80},
		{"float32 subnormal", math.Float32frombits(1), 0x00},
	} {
		if got := EncodeE4M3(tc.x); got != tc.want {
			t.Errorf("%s: EncodeE4M3(%v) = 0x%02x, want 0x%02x", tc.name, tc.x, got, tc.want)
		}
	}
}

func TestDecodeE4M3Cases(t *testing.T) {
	for _, tc := range []struct {
		c    uint8
		want float64
	}{
		{0x00, 0}, {0x01, 1.0 / 512}, {0x07, 7.0 / 512}, {0x08, 1.0 / 64}, {0x38, 1},
		{0x3A, 1.25}, {0x7E, 448}, {0xFE, -448}, {0xB8, -1}, {0x77, 240},
	} {
		if got := DecodeE4M3(tc.c); float64(got) != tc.want {
			t.Errorf("DecodeE4M3(0x%02x) = %v, want %v", tc.c, got, tc.want)
		}
	}
	for _, c := range []uint8{0x7F, 0xFF} {
		if got := DecodeE4M3(c); got == got {
			t.Errorf("DecodeE4M3(0x%02x) = %v, want NaN", c, got)
		}
	}
	if got := DecodeE4M3(0x80); got != 0 || !math.Signbit(float64(got)) {
		t.Errorf("DecodeE4M3(0x80) = %v, want -0", got)
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for c := 0; c < 256; c++ {
		if c&0x7F == 0x7F {
			continue
		}
		if got := EncodeE4M3(DecodeE4M3(uint8(c))); got != uint8(c) {
			t.Errorf("EncodeE4M3(DecodeE4M3(0x%02x)) = 0x%02x", c, got)
		}
	}
}

// referenceEncode is a slow, obviously-correct encoder: nearest finite E4M3 value
// by exhaustive search (in float64, exact), ties to the even code, saturating.
func referenceEncode(x float32) uint8 {
	if x != x {
		return E4M3NaN
	}
	ax := math.Abs(float64(x))
	best, bestD := -1, math.Inf(1)
	for c := 0; c < 0x7F; c++ {
		d := math.Abs(float64(DecodeE4M3(uint8(c))) - ax)
		if d < bestD || (d == bestD && c&1 == 0) {
			best, bestD = c, d
		}
	}
	if ax > 448 {
		best = 0x7E
	}
	if math.Signbit(float64(x)) {
		best |= 0x80
	}
	return uint8(best)
}

func TestEncodeMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 200000; i++ {
		var x float32
		switch i % 3 {
		case 0: // any float32 bit pattern with a moderate exponent
			x = math.Float32frombits(rng.Uint32()&0x807FFFFF | uint32(100+rng.Intn(40))<<23)
		case 1:
			x = float32(rng.Float64()*1000 - 500)
		default: // exact midpoints between neighbouring codes, nudged or not
			c := rng.Intn(0x7E)
			mid := (float64(DecodeE4M3(uint8(c))) + float64(DecodeE4M3(uint8(c+1)))) / 2
			x = float32(mid)
			switch rng.Intn(3) {
			case 0:
				x = math.Nextafter32(x, 0)
			case 1:
				x = math.Nextafter32(x, 1000)
			}
			if rng.Intn(2) == 0 {
				x = -x
			}
		}
		if got, want := EncodeE4M3(x), referenceEncode(x); got != want {
			t.Fatalf("EncodeE4M3(%v, bits 0x%08x) = 0x%02x, reference 0x%02x", x, math.Float32bits(x), got, want)
		}
	}
}

func TestEncodeMonotonic(t *testing.T) {
	prev := float32(math.Inf(-1))
	for x := float32(-500); x <= 500; x += 0.0625 {
		v := DecodeE4M3(EncodeE4M3(x))
		if v < prev {
			t.Fatalf("not monotonic at %v: %v < %v", x, v, prev)
		}
		prev = v
	}
}

func TestEncodeScaledMatchesMultiply(t *testing.T) {
	rng := rand.New(rand.NewSource(21))
	src := make([]float32, 4096)
	got := make([]uint8, len(src))
	for e := -39; e <= 120; e++ {
		recip := ScaleReciprocal(uint8(e + ScaleBias))
		limit := math.Min(float64(ScaleValue(uint8(e+ScaleBias)))*448, math.MaxFloat32)
		for i := range src {
			var v float32
			switch i % 4 {
			case 0: // arbitrary bit patterns below the block limit
				v = math.Float32frombits(rng.Uint32()&0x807FFFFF | uint32(rng.Intn(255))<<23)
			case 1: // near the limit
				v = float32(limit * (1 - rng.Float64()*0.01))
			case 2: // exact midpoints of the E4M3 grid at this scale
				c := rng.Intn(0x7E)
				v = float32((float64(DecodeE4M3(uint8(c))) + float64(DecodeE4M3(uint8(c+1)))) / 2 * math.Ldexp(1, e))
			default: // float32 subnormals and tiny values
				v = math.Float32frombits(rng.Uint32() & 0x80FFFFFF)
			}
			if math.Abs(float64(v)) > limit || math.IsInf(float64(v), 0) || v != v {
				v = float32(limit)
			}
			src[i] = v
		}
		encodeScaled(got, src, e)
		for i, v := range src {
			if want := EncodeE4M3(v * recip); got[i] != want {
				t.Fatalf("e=%d x=%v (0x%08x): encodeScaled 0x%02x, EncodeE4M3(x·2^-e) 0x%02x", e, v, math.Float32bits(v), got[i], want)
			}
		}
	}
}
