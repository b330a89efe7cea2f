package mxfp8

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
)

// Tensor is an MXFP8 tensor as the MoK kernel consumes it: E4M3 codes of logical
// shape [E, N, K] (K contiguous) and UE8M0 scales, one per 1×32 block along K, in
// the tcgen05 layout uint8 [E·N/128, K/128, 32, 16] (see ScaleIndex).
type Tensor struct {
	// Name is the tensor's name, used in error messages.
	Name string
	// E, N and K are the shape of Data: E matrices of N rows by K contiguous columns.
	E, N, K int
	// Transposed is true when the tensor was quantized from the [E, K, N] transpose
	// of the source (QuantizeTransposed); E, N, K then describe the transposed data.
	Transposed bool
	// Data holds the E·N·K E4M3 codes, row-major.
	Data []uint8
	// Scales holds the E·N·K/32 UE8M0 scale bytes in the tcgen05 layout.
	Scales []uint8
}

// ScaleShape returns the shape of t.Scales, [E·N/128, K/128, 32, 16].
func (t *Tensor) ScaleShape() [4]int { return ScaleShape(t.E, t.N, t.K) }

// BlockScale returns the scale byte of K-block kblock of row `row` of matrix
// `expert` (0 ≤ row < N, 0 ≤ kblock < K/32).
func (t *Tensor) BlockScale(expert, row, kblock int) uint8 {
	return t.Scales[ScaleIndex(expert*t.N+row, kblock, t.K)]
}

// Dequantize returns the float32 values the tensor stands for, shape [E, N, K]:
// DecodeE4M3(code)·2^(scale−127) per element (see DequantizeBlock).
func (t *Tensor) Dequantize() []float32 {
	out := make([]float32, len(t.Data))
	kBlocks := t.K / BlockSize
	for row := 0; row < t.E*t.N; row++ {
		base := row * t.K
		for kb := 0; kb < kBlocks; kb++ {
			o := base + kb*BlockSize
			DequantizeBlock(out[o:o+BlockSize], t.Data[o:o+BlockSize], t.Scales[ScaleIndex(row, kb, t.K)])
		}
	}
	return out
}

// NonFiniteError reports a NaN or infinite value in a tensor given to a quantizer.
type NonFiniteError struct {
	// Tensor is the name the caller gave the tensor.
	Tensor string
	// Index is the flat (row-major) index of the first non-finite value in the
	// caller's [E, N, K] source tensor (for the streaming API: in the whole tensor,
	// counting the expert index given).
	Index int
	// Value is the offending value.
	Value float32
}

// Error implements error.
func (e *NonFiniteError) Error() string {
	return fmt.Sprintf("mxfp8: tensor %q: non-finite value %v at flat index %d", e.Tensor, e.Value, e.Index)
}

// Quantizer quantizes tensors in parallel. Its zero value is ready to use.
// The output is byte-identical whatever the number of workers.
type Quantizer struct {
	// Workers is the number of goroutines; 0 (or less) means runtime.GOMAXPROCS(0).
	Workers int
}

// Quantize quantizes the [e, n, k] float32 tensor x (k contiguous) with
// Quantizer{} (GOMAXPROCS workers). See Quantizer.Quantize.
func Quantize(name string, x []float32, e, n, k int) (*Tensor, error) {
	return Quantizer{}.Quantize(name, x, e, n, k)
}

// QuantizeTransposed quantizes the [e, k, n] transpose of the [e, n, k] tensor x
// with Quantizer{}. See Quantizer.QuantizeTransposed.
func QuantizeTransposed(name string, x []float32, e, n, k int) (*Tensor, error) {
	return Quantizer{}.QuantizeTransposed(name, x, e, n, k)
}

// QuantizeExpert quantizes one expert's [n, k] slab with Quantizer{}.
// See Quantizer.QuantizeExpert.
func QuantizeExpert(name string, expert int, slab []float32, n, k int, data, scales []uint8) error {
	return Quantizer{}.QuantizeExpert(name, expert, slab, n, k, data, scales)
}

// QuantizeExpertTransposed quantizes the [k, n] transpose of one expert's [n, k]
// slab with Quantizer{}. See Quantizer.QuantizeExpertTransposed.
func QuantizeExpertTransposed(name string, expert int, slab []float32, n, k int, data, scales []uint8) error {
	return Quantizer{}.QuantizeExpertTransposed(name, expert, slab, n, k, data, scales)
}

// Quantize quantizes the [e, n, k] float32 tensor x (k contiguous, the
// contraction axis) into E4M3 codes [e, n, k] and scales [e·n/128, k/128, 32, 16].
// n and k must be multiples of 128. A NaN or ±Inf anywhere in x is refused with a
// *NonFiniteError naming the tensor and the flat index of the first one.
func (q Quantizer) Quantize(name string, x []float32, e, n, k int) (*Tensor, error) {
	if err := checkInput(name, len(x), e, n, k); err != nil {
		return nil, err
	}
	t := &Tensor{Name: name, E: e, N: n, K: k, Data: make([]uint8, len(x)), Scales: make([]uint8, ScaleLen(e, n, k))}
	ok := q.run(e*n/TileRows, func(tile int) bool { return quantizeTile(t.Data, t.Scales, x, tile, k) })
	if !ok {
		return nil, firstNonFinite(name, x, 0)
	}
	return t, nil
}

// QuantizeTransposed quantizes the [e, k, n] transpose of the [e, n, k] tensor x:
// the "transposed copy" MoK's backward pass needs, with 1×32 blocks running along
// n. The result has E=e, N=k, K=n and Transposed set; its Data is [e, k, n] and its
// Scales [e·k/128, n/128, 32, 16]. Errors are as for Quantize, with flat indices
// into x (the untransposed source).
func (q Quantizer) QuantizeTransposed(name string, x []float32, e, n, k int) (*Tensor, error) {
	if err := checkInput(name, len(x), e, n, k); err != nil {
		return nil, err
	}
	t := &Tensor{Name: name, E: e, N: k, K: n, Transposed: true, Data: make([]uint8, len(x)), Scales: make([]uint8, ScaleLen(e, n, k))}
	ok := q.run(e*k/TileRows, func(tile int) bool { return quantizeTileT(t.Data, t.Scales, x, tile, n, k) })
	if !ok {
		return nil, firstNonFinite(name, x, 0)
	}
	return t, nil
}

// QuantizeExpert quantizes one expert's [n, k] slab, for callers that stream
// experts (from disk, say) instead of holding the whole [E, n, k] tensor. data
// (n·k bytes) receives the codes and scales (n·k/32 bytes) the scales, in the
// tcgen05 layout; these are exactly the bytes data[expert·n·k:][:n·k] and
// scales[expert·n·k/32:][:n·k/32] of Quantize on the whole tensor, so a caller
// can concatenate the experts' outputs (or pass sub-slices of whole-tensor
// buffers). expert is used only to report flat indices in errors.
func (q Quantizer) QuantizeExpert(name string, expert int, slab []float32, n, k int, data, scales []uint8) error {
	if err := checkExpert(name, expert, len(slab), n, k, len(data), len(scales)); err != nil {
		return err
	}
	if !q.run(n/TileRows, func(tile int) bool { return quantizeTile(data, scales, slab, tile, k) }) {
		return firstNonFinite(name, slab, expert*n*k)
	}
	return nil
}

// QuantizeExpertTransposed is QuantizeExpert for the transposed copy: it
// quantizes the [k, n] transpose of one expert's [n, k] slab, writing the n·k
// codes (row-major [k, n]) to data and the scales ([k/128, n/128, 32, 16]) to
// scales. These are expert `expert`'s bytes of QuantizeTransposed's output.
func (q Quantizer) QuantizeExpertTransposed(name string, expert int, slab []float32, n, k int, data, scales []uint8) error {
	if err := checkExpert(name, expert, len(slab), n, k, len(data), len(scales)); err != nil {
		return err
	}
	if !q.run(k/TileRows, func(tile int) bool { return quantizeTileT(data, scales, slab, tile, n, k) }) {
		return firstNonFinite(name, slab, expert*n*k)
	}
	return nil
}

func checkInput(name string, length, e, n, k int) error {
	if err := CheckShape(e, n, k); err != nil {
		return fmt.Errorf("mxfp8: tensor %q: %v", name, err)
	}
	if length != e*n*k {
		return fmt.Errorf("mxfp8: tensor %q: has %d elements, want E·N·K = %d·%d·%d = %d", name, length, e, n, k, e*n*k)
	}
	return nil
}

func checkExpert(name string, expert, length, n, k, dataLen, scalesLen int) error {
	if expert < 0 {
		return fmt.Errorf("mxfp8: tensor %q: expert index %d is negative", name, expert)
	}
	if err := checkInput(name, length, 1, n, k); err != nil {
		return err
	}
	if dataLen != n*k || scalesLen != ScaleLen(1, n, k) {
		return fmt.Errorf("mxfp8: tensor %q: expert %d: output buffers have %d and %d bytes, want %d codes and %d scales",
			name, expert, dataLen, scalesLen, n*k, ScaleLen(1, n, k))
	}
	return nil
}

// firstNonFinite scans x in order and reports its first NaN or Inf, with flat
// index offset+i. Only called after a worker saw one, so it always finds one.
func firstNonFinite(name string, x []float32, offset int) error {
	for i, v := range x {
		if math.Float32bits(v)&0x7F800000 == 0x7F800000 {
			return &NonFiniteError{Tensor: name, Index: offset + i, Value: v}
		}
	}
	return fmt.Errorf("mxfp8: tensor %q: internal error: non-finite value reported but not found", name)
}

// run calls fn(t) for t in [0, tiles) on q's workers and reports whether every
// call returned true. Tiles write disjoint bytes, so the result is independent of
// the schedule.
func (q Quantizer) run(tiles int, fn func(tile int) bool) bool {
	workers := q.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	if workers > tiles {
		workers = tiles
	}
	if workers <= 1 {
		for t := 0; t < tiles; t++ {
			if !fn(t) {
				return false
			}
		}
		return true
	}
	var next atomic.Int64
	var bad atomic.Bool
	var wg sync.WaitGroup
	wg.Add(workers)
	for w := 0; w < workers; w++ {
		go func() {
			defer wg.Done()
			for !bad.Load() {
				t := int(next.Add(1) - 1)
				if t >= tiles {
					return
				}
				if !fn(t) {
					bad.Store(true)
					return
				}
			}
		}()
	}
	wg.Wait()
	return !bad.Load()
}

// blockMaxBits returns the largest |v| of blk as float32 bits; a result
// >= 0x7F800000 means the block holds a NaN or Inf (float32 magnitudes order like
// their bit patterns).
func blockMaxBits(blk []float32) uint32 {
	var m uint32
	for _, v := range blk {
		if a := math.Float32bits(v) & 0x7FFFFFFF; a > m {
			m = a
		}
	}
	return m
}

// quantizeTile quantizes rows [tile·128, tile·128+128) of the row-major
// [rows, k] matrix src. It returns false on a NaN or Inf.
func quantizeTile(dst, scales []uint8, src []float32, tile, k int) bool {
	kTiles := k / TileCols
	kBlocks := k / BlockSize
	for r := 0; r < TileRows; r++ {
		row := tile*TileRows + r
		s := src[row*k : row*k+k]
		d := dst[row*k : row*k+k]
		rowOff := (r%32)*16 + (r/32)*4
		for kb := 0; kb < kBlocks; kb++ {
			blk := s[kb*BlockSize : kb*BlockSize+BlockSize]
			m := blockMaxBits(blk)
			if m >= 0x7F800000 {
				return false
			}
			b := uint8(ScaleExponent(math.Float32frombits(m)) + ScaleBias)
			encodeScaled(d[kb*BlockSize:kb*BlockSize+BlockSize], blk, int(b)-ScaleBias)
			scales[(tile*kTiles+kb/4)*ScaleTileBytes+rowOff+kb%4] = b
		}
	}
	return true
}

// quantizeTileT quantizes transposed rows [tile·128, tile·128+128) of the
// transpose of src, which is row-major [experts, n, k]; the transposed matrix is
// [experts·k, n]. It returns false on a NaN or Inf.
func quantizeTileT(dst, scales []uint8, src []float32, tile, n, k int) bool {
	kTiles := k / TileRows
	nTiles := n / TileCols
	expert := tile / kTiles
	k0 := (tile % kTiles) * TileRows
	var buf [TileRows * BlockSize]float32 // buf[i*32+j] = src[expert][n0+j][k0+i]
	for nb := 0; nb < n/BlockSize; nb++ {
		n0 := nb * BlockSize
		for j := 0; j < BlockSize; j++ {
			o := (expert*n+n0+j)*k + k0
			for i, v := range src[o : o+TileRows] {
				buf[i*BlockSize+j] = v
			}
		}
		for i := 0; i < TileRows; i++ {
			blk := buf[i*BlockSize : i*BlockSize+BlockSize]
			m := blockMaxBits(blk)
			if m >= 0x7F800000 {
				return false
			}
			b := uint8(ScaleExponent(math.Float32frombits(m)) + ScaleBias)
			o := (tile*TileRows+i)*n + n0
			encodeScaled(dst[o:o+BlockSize], blk, int(b)-ScaleBias)
			scales[(tile*nTiles+nb/4)*ScaleTileBytes+(i%32)*16+(i/32)*4+nb%4] = b
		}
	}
	return true
}
