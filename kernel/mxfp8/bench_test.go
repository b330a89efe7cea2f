package mxfp8

import (
	"math/rand"
	"testing"
)

// The two benchmarks below move the same number of input bytes (64 MiB of
// float32), so throughput(Quantize)/throughput(Memcpy) is the ratio of their MB/s.
const benchE, benchN, benchK = 4, 2048, 2048 // 16 Mi float32 = 64 MiB

func benchInput() []float32 {
	return randomTensor(rand.New(rand.NewSource(1)), benchE*benchN*benchK)
}

func BenchmarkQuantize(b *testing.B) {
	x := benchInput()
	b.SetBytes(int64(len(x)) * 4)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Quantize("bench", x, benchE, benchN, benchK); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkQuantizeTransposed(b *testing.B) {
	x := benchInput()
	b.SetBytes(int64(len(x)) * 4)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := QuantizeTransposed("bench", x, benchE, benchN, benchK); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkQuantizeOneWorker(b *testing.B) {
	x := benchInput()
	q := Quantizer{Workers: 1}
	b.SetBytes(int64(len(x)) * 4)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := q.Quantize("bench", x, benchE, benchN, benchK); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkQuantizeStreaming quantizes the same tensor one expert at a time
// into preallocated buffers (QuantizeExpert), so no allocation is timed.
func BenchmarkQuantizeStreaming(b *testing.B) {
	x := benchInput()
	per := benchN * benchK
	data, scales := make([]uint8, len(x)), make([]uint8, ScaleLen(benchE, benchN, benchK))
	b.SetBytes(int64(len(x)) * 4)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for e := 0; e < benchE; e++ {
			err := QuantizeExpert("bench", e, x[e*per:(e+1)*per], benchN, benchK,
				data[e*per:(e+1)*per], scales[e*per/BlockSize:(e+1)*per/BlockSize])
			if err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkMemcpy copies 64 MiB, the byte size of the quantizers' input, between
// two preallocated buffers: the memory-bandwidth yardstick for the ratio.
func BenchmarkMemcpy(b *testing.B) {
	src := make([]byte, benchE*benchN*benchK*4)
	dst := make([]byte, len(src))
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault the pages in before timing
	b.SetBytes(int64(len(src)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		copy(dst, src)
	}
}
