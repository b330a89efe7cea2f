package mxfp8

import (
	"bytes"
	"errors"
	"math"
	"math/rand"
	"strings"
	"testing"
)

// randomTensor returns values with a wide dynamic range: each 32-block gets its
// own magnitude 2^U(-40, 40), elements within it spread over 2^-12..1 of that,
// some exact zeros and negative zeros.
func randomTensor(rng *rand.Rand, size int) []float32 {
	x := make([]float32, size)
	var mag float64
	for i := range x {
		if i%BlockSize == 0 {
			mag = math.Ldexp(1, rng.Intn(81)-40)
		}
		switch rng.Intn(50) {
		case 0:
			x[i] = 0
		case 1:
			x[i] = float32(math.Copysign(0, -1))
		default:
			x[i] = float32(rng.NormFloat64() * mag * math.Ldexp(1, -rng.Intn(12)))
		}
	}
	return x
}

func transpose(x []float32, e, n, k int) []float32 {
	out := make([]float32, len(x))
	for ex := 0; ex < e; ex++ {
		for i := 0; i < n; i++ {
			for j := 0; j < k; j++ {
				out[(ex*k+j)*n+i] = x[(ex*n+i)*k+j]
			}
		}
	}
	return out
}

func TestQuantizeShapeErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		e, n, k int
		length  int
		want    string
	}{
		{"N not multiple of 128", 1, 64, 128, 64 * 128, "N=64"},
		{"K not multiple of 128", 1, 128, 100, 12800, "K=100"},
		{"zero experts", 0, 128, 128, 0, "must be positive"},
		{"negative K", 1, 128, -128, 0, "must be positive"},
		{"length mismatch", 2, 128, 128, 128 * 128, "has 16384 elements, want"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := make([]float32, tc.length)
			for _, f := range []func(string, []float32, int, int, int) (*Tensor, error){Quantize, QuantizeTransposed} {
				_, err := f("w_up", x, tc.e, tc.n, tc.k)
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"w_up"`) {
					t.Errorf("error %v, want one naming the tensor and containing %q", err, tc.want)
				}
			}
		})
	}
}

func TestQuantizeRefusesNonFinite(t *testing.T) {
	const e, n, k = 2, 128, 256
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, tc := range []struct {
		name  string
		put   map[int]float32
		first int
	}{
		{"NaN at 0", map[int]float32{0: nan}, 0},
		{"Inf in second expert", map[int]float32{e*n*k - 1: inf}, e*n*k - 1},
		{"-Inf mid-row", map[int]float32{12345: -inf}, 12345},
		{"several: first wins", map[int]float32{50000: nan, 40000: inf, 60000: -inf}, 40000},
		{"several in different tiles and rows", map[int]float32{n*k + 5: nan, 3*k + 200: inf}, 3*k + 200},
	} {
		for _, transposed := range []bool{false, true} {
			for _, workers := range []int{1, 7} {
				x := randomTensor(rand.New(rand.NewSource(3)), e*n*k)
				for i, v := range tc.put {
					x[i] = v
				}
				q := Quantizer{Workers: workers}
				var err error
				if transposed {
					_, err = q.QuantizeTransposed("w_gate", x, e, n, k)
				} else {
					_, err = q.Quantize("w_gate", x, e, n, k)
				}
				var nf *NonFiniteError
				if !errors.As(err, &nf) {
					t.Fatalf("%s (transposed=%v): error %v, want *NonFiniteError", tc.name, transposed, err)
				}
				if nf.Tensor != "w_gate" || nf.Index != tc.first || !sameFloat(nf.Value, x[tc.first]) {
					t.Errorf("%s (transposed=%v, workers=%d): got %+v, want index %d", tc.name, transposed, workers, nf, tc.first)
				}
				if !strings.Contains(err.Error(), `"w_gate"`) || !strings.Contains(err.Error(), "flat index") {
					t.Errorf("message %q does not name the tensor and the index", err)
				}
			}
		}
	}
}

func TestQuantizeDeterministicAcrossWorkers(t *testing.T) {
	const e, n, k = 3, 256, 512
	x := randomTensor(rand.New(rand.NewSource(11)), e*n*k)
	var ref, refT *Tensor
	for _, w := range []int{1, 2, 3, 8, 64, 0} {
		q := Quantizer{Workers: w}
		a, err := q.Quantize("x", x, e, n, k)
		if err != nil {
			t.Fatal(err)
		}
		b, err := q.QuantizeTransposed("x", x, e, n, k)
		if err != nil {
			t.Fatal(err)
		}
		if ref == nil {
			ref, refT = a, b
			continue
		}
		if !bytes.Equal(a.Data, ref.Data) || !bytes.Equal(a.Scales, ref.Scales) {
			t.Errorf("workers=%d: output differs from workers=1", w)
		}
		if !bytes.Equal(b.Data, refT.Data) || !bytes.Equal(b.Scales, refT.Scales) {
			t.Errorf("workers=%d: transposed output differs from workers=1", w)
		}
	}
}

func TestQuantizeTransposedIsQuantizeOfTranspose(t *testing.T) {
	const e, n, k = 2, 384, 256
	x := randomTensor(rand.New(rand.NewSource(5)), e*n*k)
	got, err := QuantizeTransposed("x", x, e, n, k)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Quantize("x", transpose(x, e, n, k), e, k, n)
	if err != nil {
		t.Fatal(err)
	}
	if got.E != e || got.N != k || got.K != n || !got.Transposed {
		t.Errorf("shape %d,%d,%d transposed=%v", got.E, got.N, got.K, got.Transposed)
	}
	if !bytes.Equal(got.Data, want.Data) || !bytes.Equal(got.Scales, want.Scales) {
		t.Error("QuantizeTransposed differs from Quantize of the explicit transpose")
	}
	if got.ScaleShape() != [4]int{e * k / 128, n / 128, 32, 16} {
		t.Errorf("ScaleShape = %v", got.ScaleShape())
	}
}

func TestQuantizeExpertStreaming(t *testing.T) {
	const e, n, k = 3, 128, 384
	x := randomTensor(rand.New(rand.NewSource(9)), e*n*k)
	whole, err := Quantize("w_down", x, e, n, k)
	if err != nil {
		t.Fatal(err)
	}
	wholeT, err := QuantizeTransposed("w_down", x, e, n, k)
	if err != nil {
		t.Fatal(err)
	}
	var data, scales, dataT, scalesT []byte
	for ex := 0; ex < e; ex++ {
		slab := append([]float32(nil), x[ex*n*k:(ex+1)*n*k]...) // as if read from disk
		d, s := make([]uint8, n*k), make([]uint8, ScaleLen(1, n, k))
		if err := QuantizeExpert("w_down", ex, slab, n, k, d, s); err != nil {
			t.Fatal(err)
		}
		data, scales = append(data, d...), append(scales, s...)
		if err := QuantizeExpertTransposed("w_down", ex, slab, n, k, d, s); err != nil {
			t.Fatal(err)
		}
		dataT, scalesT = append(dataT, d...), append(scalesT, s...)
	}
	if !bytes.Equal(data, whole.Data) || !bytes.Equal(scales, whole.Scales) {
		t.Error("concatenated per-expert output differs from whole-tensor Quantize")
	}
	if !bytes.Equal(dataT, wholeT.Data) || !bytes.Equal(scalesT, wholeT.Scales) {
		t.Error("concatenated per-expert transposed output differs from QuantizeTransposed")
	}

	// Errors report the flat index in the whole tensor.
	slab := append([]float32(nil), x[n*k:2*n*k]...)
	slab[77] = float32(math.NaN())
	err = QuantizeExpert("w_down", 1, slab, n, k, make([]uint8, n*k), make([]uint8, ScaleLen(1, n, k)))
	var nf *NonFiniteError
	if !errors.As(err, &nf) || nf.Index != n*k+77 {
		t.Errorf("streaming NaN: error %v, want flat index %d", err, n*k+77)
	}
	if err := QuantizeExpert("w_down", 0, slab, n, k, make([]uint8, 10), make([]uint8, 1)); err == nil {
		t.Error("short output buffers accepted")
	}
}

// errorBound is the MXFP8 rounding bound for one element: with y = x·2^-e, E4M3
// keeps 3 mantissa bits, so in its normal range (|y| >= 2^-6) the error is at most
// half an ulp, 2^(floor(log2|y|)-4); in its subnormal range the quantum is 2^-9
// and the error at most 2^-10. Scaled back: bound = 2^e · that. (Saturation can
// only trim a value within float32 rounding of 448, far inside the bound.)
func errorBound(x float32, e int) float64 {
	y := math.Abs(float64(x)) * math.Ldexp(1, -e)
	if y >= math.Ldexp(1, -6) {
		_, ex := math.Frexp(y) // y = f·2^ex, 0.5 <= f < 1, so floor(log2 y) = ex-1
		return math.Ldexp(1, e+ex-1-4)
	}
	return math.Ldexp(1, e-10)
}

func TestDequantizeWithinErrorBound(t *testing.T) {
	const e, n, k = 2, 256, 256
	x := randomTensor(rand.New(rand.NewSource(13)), e*n*k)
	for _, transposed := range []bool{false, true} {
		var qt *Tensor
		var err error
		src := x
		if transposed {
			qt, err = QuantizeTransposed("x", x, e, n, k)
			src = transpose(x, e, n, k)
		} else {
			qt, err = Quantize("x", x, e, n, k)
		}
		if err != nil {
			t.Fatal(err)
		}
		d := qt.Dequantize()
		worstRel := 0.0
		for i, v := range src {
			row, kb := i/qt.K, (i%qt.K)/BlockSize
			sc := int(qt.Scales[ScaleIndex(row, kb, qt.K)]) - ScaleBias
			diff := math.Abs(float64(v) - float64(d[i]))
			if b := errorBound(v, sc); diff > b {
				t.Fatalf("transposed=%v element %d: x=%v dequantized=%v, |diff|=%g > bound %g (e=%d)", transposed, i, v, d[i], diff, b, sc)
			}
			if ay := math.Abs(float64(v)) * math.Ldexp(1, -sc); ay >= math.Ldexp(1, -6) {
				worstRel = math.Max(worstRel, diff/math.Abs(float64(v)))
			}
		}
		if worstRel > 1.0/16 {
			t.Errorf("worst relative error in the E4M3 normal range %g > 2^-4", worstRel)
		}
	}
}

func TestDequantizeExactOnGrid(t *testing.T) {
	// Values that are E4M3 values times a power of two, with the block amax 448·2^e,
	// survive a round trip exactly.
	const n, k = 128, 128
	rng := rand.New(rand.NewSource(17))
	x := make([]float32, n*k)
	for i := range x {
		e := (i / BlockSize) % 50
		c := uint8(rng.Intn(0x7F))
		if i%BlockSize == 0 {
			c = 0x7E
		}
		if rng.Intn(2) == 0 {
			c |= 0x80
		}
		x[i] = DecodeE4M3(c) * float32(math.Ldexp(1, e-25))
	}
	qt, err := Quantize("grid", x, 1, n, k)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range qt.Dequantize() {
		if !sameFloat(v, x[i]) {
			t.Fatalf("element %d: %v -> %v", i, x[i], v)
		}
	}
}
