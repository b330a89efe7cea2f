package ortmoe

import (
	"fmt"
	"math"
)

// Quantize quantizes w, float32 [E, N, K] (rows of K inputs), symmetrically
// to bits (8 or 4) with ONNX Runtime QMoE's default zero point 2^(bits-1):
// one scale per row, or per block of blockSize inputs when blockSize > 0,
// scale = max|w| / (2^(bits-1) - 1). It returns the packed uint8 weights
// [E, N, K/pack] (4-bit: element 2j in the low nibble) and the scales
// [E, N] or [E, N, K/blockSize].
func Quantize(w []float32, E, N, K, bits, blockSize int) (q []byte, scales []float32, err error) {
	if bits != 8 && bits != 4 {
		return nil, nil, fmt.Errorf("quantize: %d bits (want 8 or 4)", bits)
	}
	if len(w) != E*N*K {
		return nil, nil, fmt.Errorf("quantize: %d values, want %d x %d x %d", len(w), E, N, K)
	}
	pack := 8 / bits
	if K%pack != 0 {
		return nil, nil, fmt.Errorf("quantize: K %d is not a multiple of %d", K, pack)
	}
	block := K
	if blockSize > 0 {
		if K%blockSize != 0 {
			return nil, nil, fmt.Errorf("quantize: K %d is not a multiple of block_size %d", K, blockSize)
		}
		block = blockSize
	}
	zero := 1 << (bits - 1)
	qmax := float64(zero - 1)
	q = make([]byte, E*N*K/pack)
	scales = make([]float32, E*N*K/block)
	for g := range scales {
		src := w[g*block : (g+1)*block]
		s := groupScale(src, qmax)
		scales[g] = s
		for j, v := range src {
			iv := int(math.Round(float64(v/s))) + zero
			iv = max(0, min(iv, 2*zero-1))
			i := g*block + j
			if pack == 1 {
				q[i] = byte(iv)
			} else {
				q[i/2] |= byte(iv) << (4 * (i % 2))
			}
		}
	}
	return q, scales, nil
}

// groupScale is the scale of one group of values: max|v| / qmax, or 1
// for a group of zeros.
func groupScale(v []float32, qmax float64) float32 {
	var m float64
	for _, x := range v {
		m = max(m, math.Abs(float64(x)))
	}
	s := float32(m / qmax)
	if s == 0 {
		s = 1
	}
	return s
}

// QuantizeScales returns the scales Quantize returns for w, without
// quantizing the values.
func QuantizeScales(w []float32, E, N, K, bits, blockSize int) ([]float32, error) {
	if bits != 8 && bits != 4 {
		return nil, fmt.Errorf("quantize: %d bits (want 8 or 4)", bits)
	}
	if len(w) != E*N*K {
		return nil, fmt.Errorf("quantize: %d values, want %d x %d x %d", len(w), E, N, K)
	}
	block := K
	if blockSize > 0 {
		if K%blockSize != 0 {
			return nil, fmt.Errorf("quantize: K %d is not a multiple of block_size %d", K, blockSize)
		}
		block = blockSize
	}
	qmax := float64(int(1)<<(bits-1) - 1)
	scales := make([]float32, E*N*K/block)
	for g := range scales {
		scales[g] = groupScale(w[g*block:(g+1)*block], qmax)
	}
	return scales, nil
}

// Dequantized returns what Quantize's output stands for: float32 [E, N, K].
func Dequantized(q []byte, scales []float32, E, N, K, bits, blockSize int) []float32 {
	a := &Attrs{Quantized: true, Bits: bits, BlockSize: blockSize}
	src := rawSource{dims: map[int][]int64{
		0: {int64(E), int64(N), int64(K * bits / 8)},
	}, ints: map[int][]int64{0: bytesToInts(q)}, floats: map[int][]float32{1: scales}}
	out, err := a.Dequantize(src, 0, 1, 2, E, N, K)
	if err != nil {
		panic(err) // the shapes come from Quantize
	}
	return out
}

func bytesToInts(b []byte) []int64 {
	out := make([]int64, len(b))
	for i, v := range b {
		out[i] = int64(v)
	}
	return out
}

// rawSource is a Source over plain slices.
type rawSource struct {
	dims   map[int][]int64
	ints   map[int][]int64
	floats map[int][]float32
}

func (s rawSource) Dims(pos int) []int64 {
	if d, ok := s.dims[pos]; ok {
		return d
	}
	if f, ok := s.floats[pos]; ok {
		return []int64{int64(len(f))}
	}
	return nil
}
func (s rawSource) Floats(pos int) ([]float32, error) { return s.floats[pos], nil }
func (s rawSource) Ints(pos int) ([]int64, error)     { return s.ints[pos], nil }
