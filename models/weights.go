package models

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"runtime"
	"sync"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/ortmoe"
	"github.com/mokopt/mokopt/moe"
)

// Roles of a block's logical weight tensors. Each (seed, layer, role) names
// one stream of pseudo-random values, indexed in the canonical layout of
// moe.Weights.
const (
	roleRouter     = iota + 1 // [E, H]
	roleGate                  // [E, I, H]
	roleUp                    // [E, I, H]
	roleDown                  // [E, H, I]
	roleSharedGate            // [Is, H]
	roleSharedUp              // [Is, H]
	roleSharedDown            // [H, Is]
)

const golden = 0x9E3779B97F4A7C15 // splitmix64's increment

// mix64 is splitmix64's output function (Stafford's variant 13).
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// streamKey is the splitmix64 state that starts the value stream of one
// logical tensor.
func streamKey(seed int64, layer, role int) uint64 {
	k := mix64(uint64(seed) ^ 0x6D6F6B6F70742D67) // "mokopt-g"
	k = mix64(k + uint64(layer+1)*golden)
	return mix64(k + uint64(role)*0xD1B54A32D192ED03)
}

// value is element idx of the stream starting at key: the idx-th output of
// splitmix64 seeded with key, whose top 24 bits become an integer q in
// [-2^23, 2^23) and the weight q*step. The one rounding of that product is
// the only float operation, so values are bit-identical on every platform.
func value(key uint64, idx int64, step float32) float32 {
	q := int32(mix64(key+uint64(idx+1)*golden)>>40) - 1<<23
	return float32(q) * step
}

// valueStep is the weight quantum of a projection with fanIn inputs: values
// lie in [-1, 1) / sqrt(fanIn), PyTorch nn.Linear's default bound, so a
// block's output is of the order of its input (with [-0.05, 0.05) / sqrt(H)
// it would be ~1e-5 of the residual, below float32's resolution of h + MoE(h)).
func valueStep(fanIn int) float32 {
	return float32(1 / math.Sqrt(float64(fanIn)) / (1 << 23))
}

// source describes how a stored (physical) tensor's elements map onto the
// logical streams: the tensor is rows x rowLen elements, and element j of
// row r is element start+j*stride of the stream keyed key, where
// (key, start, stride) = row(r), scaled by step.
type source struct {
	rows, rowLen int64
	step         float32
	row          func(r int64) (key uint64, start, stride int64)
	// enc, when set, stores each element as the 16 bits it returns (a
	// float16 or bfloat16 rounding) instead of as float32.
	enc func(float32) uint16
}

func (s *source) numel() int64 { return s.rows * s.rowLen }

// elemBytes is the stored size of one element: 4, or 2 with enc.
func (s *source) elemBytes() int64 {
	if s.enc != nil {
		return 2
	}
	return 4
}

// in returns s storing its elements in element type dt: float32 as is,
// float16 or bfloat16 rounded to nearest even.
func (s *source) in(dt pb.TensorProto_DataType) *source {
	switch dt {
	case pb.TensorProto_FLOAT16:
		s.enc = graph.Float32ToHalf
	case pb.TensorProto_BFLOAT16:
		s.enc = graph.Float32ToBFloat16
	}
	return s
}

// fill writes physical elements off .. off+len(dst)-1 into dst.
func (s *source) fill(dst []float32, off int64) {
	s.walk(off, int64(len(dst)), func(i int, key uint64, idx, stride int64, n int) {
		out := dst[i : i+n]
		for t := range out {
			out[t] = value(key, idx, s.step)
			idx += stride
		}
	})
}

// fillBytes writes physical elements off .. off+len(dst)/elemBytes-1 into
// dst as little-endian float32, or as 16-bit floats with enc.
func (s *source) fillBytes(dst []byte, off int64) {
	if s.enc != nil {
		s.walk(off, int64(len(dst)/2), func(i int, key uint64, idx, stride int64, n int) {
			out := dst[2*i : 2*(i+n)]
			for t := 0; t < len(out); t += 2 {
				binary.LittleEndian.PutUint16(out[t:], s.enc(value(key, idx, s.step)))
				idx += stride
			}
		})
		return
	}
	s.walk(off, int64(len(dst)/4), func(i int, key uint64, idx, stride int64, n int) {
		out := dst[4*i : 4*(i+n)]
		for t := 0; t < len(out); t += 4 {
			binary.LittleEndian.PutUint32(out[t:], math.Float32bits(value(key, idx, s.step)))
			idx += stride
		}
	})
}

// walk splits physical elements off .. off+n-1 into row pieces and calls
// run(i, key, idx, stride, len) for each, where i is the piece's position
// from off and idx the stream index of its first element.
func (s *source) walk(off, n int64, run func(i int, key uint64, idx, stride int64, n int)) {
	r, j := off/s.rowLen, off%s.rowLen
	for i := int64(0); i < n; {
		key, start, stride := s.row(r)
		c := min(n-i, s.rowLen-j)
		run(int(i), key, start+j*stride, stride, int(c))
		i += c
		r, j = r+1, 0
	}
}

// chunkBytes is how many bytes a deferred writer generates per Write.
const chunkBytes = 1 << 16

var chunkPool = sync.Pool{New: func() any { b := make([]byte, chunkBytes); return &b }}

// writeTo streams the tensor's little-endian float32 bytes to w in chunks of
// at most chunkBytes. Chunks are generated ahead on other goroutines (at most
// GOMAXPROCS+1 pooled buffers per tensor) while earlier ones are written, so
// generation overlaps the writes and uses every core.
func (s *source) writeTo(w io.Writer) error {
	n, eb := s.numel(), s.elemBytes()
	per := chunkBytes / eb
	chunks := (n + per - 1) / per
	size := func(c int64) int { return int(eb * min(per, n-c*per)) }
	if chunks <= 1 {
		bp := chunkPool.Get().(*[]byte)
		defer chunkPool.Put(bp)
		c := (*bp)[:size(0)]
		s.fillBytes(c, 0)
		_, err := w.Write(c)
		return err
	}
	depth := min(chunks, int64(runtime.GOMAXPROCS(0))+1, 16)
	bufs := make([]*[]byte, depth)
	done := make([]chan struct{}, depth)
	for i := range bufs {
		bufs[i] = chunkPool.Get().(*[]byte)
		done[i] = make(chan struct{}, 1)
	}
	start := func(c int64) {
		buf, ch := (*bufs[c%depth])[:size(c)], done[c%depth]
		go func() {
			s.fillBytes(buf, c*per)
			ch <- struct{}{}
		}()
	}
	for c := int64(0); c < depth; c++ {
		start(c)
	}
	var err error
	c := int64(0)
	for ; c < chunks; c++ {
		<-done[c%depth]
		if _, err = w.Write((*bufs[c%depth])[:size(c)]); err != nil {
			break
		}
		if c+depth < chunks {
			start(c + depth)
		}
	}
	if err != nil { // wait for the chunks still being generated
		for d := c + 1; d < min(c+depth, chunks); d++ {
			<-done[d%depth]
		}
	}
	for _, b := range bufs {
		chunkPool.Put(b)
	}
	return err
}

// bytes generates the whole tensor's raw data.
func (s *source) bytes() []byte {
	raw := make([]byte, s.elemBytes()*s.numel())
	s.fillBytes(raw, 0)
	return raw
}

// contiguous is a logical tensor slice stored as is: n elements of the
// stream from offset start, viewed as rows of rowLen, for fan-in fanIn.
func contiguous(key uint64, start, n, rowLen int64, fanIn int) *source {
	return &source{rows: n / rowLen, rowLen: rowLen, step: valueStep(fanIn), row: func(r int64) (uint64, int64, int64) {
		return key, start + r*rowLen, 1
	}}
}

// transposedStack stores a logical [E, R, C] stack (fan-in C) as [E, C, R].
func transposedStack(key uint64, e, r, c int64) *source {
	return &source{rows: e * c, rowLen: r, step: valueStep(int(c)), row: func(row int64) (uint64, int64, int64) {
		ex, ci := row/c, row%c
		return key, ex*r*c + ci, c
	}}
}

// gateUp stores logical gate and up [E, I, H] as one fused [E, 2I, H]
// tensor: gate rows then up rows per expert, or, interleaved, gate row i at
// 2i and up row i at 2i+1.
func gateUp(gate, up uint64, e, i, h int64, interleaved bool) *source {
	return &source{rows: e * 2 * i, rowLen: h, step: valueStep(int(h)), row: func(row int64) (uint64, int64, int64) {
		ex, ri := row/(2*i), row%(2*i)
		key := gate
		if interleaved {
			if ri%2 == 1 {
				key = up
			}
			ri /= 2
		} else if ri >= i {
			key, ri = up, ri-i
		}
		return key, (ex*i + ri) * h, 1
	}}
}

// roundTo rounds v in place to element type dt (float16 or bfloat16, to
// nearest even; float32 leaves it as is): the values a model storing them
// in dt computes with.
func roundTo(dt pb.TensorProto_DataType, v []float32) {
	switch dt {
	case pb.TensorProto_FLOAT16:
		for i, x := range v {
			v[i] = graph.HalfToFloat32(graph.Float32ToHalf(x))
		}
	case pb.TensorProto_BFLOAT16:
		for i, x := range v {
			v[i] = graph.BFloat16ToFloat32(graph.Float32ToBFloat16(x))
		}
	}
}

// keys of one layer's logical tensors.
type layerKeys struct{ router, gate, up, down, sGate, sUp, sDown uint64 }

func keysFor(cfg Config, layer int) layerKeys {
	k := func(role int) uint64 { return streamKey(cfg.Seed, layer, role) }
	return layerKeys{k(roleRouter), k(roleGate), k(roleUp), k(roleDown), k(roleSharedGate), k(roleSharedUp), k(roleSharedDown)}
}

// Weights returns the weights of block layer of cfg's model in the
// canonical layout of moe.Weights (RouterW [E, H]; Gate, Up [E, I, H]; Down
// [E, H, I]; SharedGate, SharedUp [Is, H]; SharedDown [H, Is]), whatever
// Shape stores them as. It holds them all in memory; use it for small
// configs and tests.
func Weights(cfg Config, layer int) (*moe.Weights, error) {
	cfg, err := cfg.normalized()
	if err != nil {
		return nil, err
	}
	if layer < 0 || layer >= cfg.Layers {
		return nil, fmt.Errorf("layer %d not in 0..%d", layer, cfg.Layers-1)
	}
	E, H, I, Is := int64(cfg.Experts), int64(cfg.Hidden), int64(cfg.Inter), int64(cfg.SharedInter)
	k := keysFor(cfg, layer)
	gen := func(key uint64, n, fanIn int64) []float32 {
		f := make([]float32, n)
		contiguous(key, 0, n, fanIn, int(fanIn)).fill(f, 0)
		roundTo(cfg.elemType(), f)
		return f
	}
	w := &moe.Weights{
		RouterW: gen(k.router, E*H, H),
		Gate:    gen(k.gate, E*I*H, H),
		Up:      gen(k.up, E*I*H, H),
		Down:    gen(k.down, E*H*I, I),
	}
	if bits := cfg.quantBits(); bits > 0 {
		// What the QMoE model computes with: each row (or block) quantized
		// on its own, so quantizing gate, up and down separately gives the
		// same values as quantizing the interleaved fc1.
		deq := func(v []float32, N, K int) []float32 {
			q, s, err := ortmoe.Quantize(v, int(E), N, K, bits, cfg.QuantBlockSize)
			if err != nil {
				panic(err) // sizes were validated by normalized()
			}
			return ortmoe.Dequantized(q, s, int(E), N, K, bits, cfg.QuantBlockSize)
		}
		w.Gate, w.Up, w.Down = deq(w.Gate, int(I), int(H)), deq(w.Up, int(I), int(H)), deq(w.Down, int(H), int(I))
	}
	if Is > 0 {
		w.SharedGate = gen(k.sGate, Is*H, H)
		w.SharedUp = gen(k.sUp, Is*H, H)
		w.SharedDown = gen(k.sDown, H*Is, Is)
	}
	return w, nil
}
