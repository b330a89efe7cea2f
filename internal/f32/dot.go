// Package f32 holds the float32 vector kernels that the reference
// interpreter and the fused op's reference semantics share.
//
// Dot sums in one fixed order on every machine, so that results do not
// depend on the instructions available: 32 running sums (four vectors of
// eight lanes; sum j, lane l takes the elements i with i mod 32 = 8j + l
// of the leading multiple of 32 elements), each product rounded to float32
// before it is added, as Go computes a*b + c on float32 values; the four
// vectors added pairwise ((v0 + v1) + (v2 + v3)), the eight lanes halved
// twice (lane l plus lane l+4, then l plus l+2) and the last two added;
// then the remaining elements one after another. On amd64 with AVX the
// whole sum runs in AVX instructions with exactly those roundings (DotRows
// reduces eight rows' lanes at once by shuffles, each row in its own order).
package f32

import "unsafe"

// Dot returns the dot product of a and b[:len(a)], summed in the order the
// package documents.
func Dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s float32
	if len(a) >= 32 {
		dotRows(&a[0], &b[0], len(a), len(a), 1, &s, false) // one row
		return s
	}
	for i, x := range a {
		s += float32(x * b[i])
	}
	return s
}

// reduce adds eight lanes: lane l plus lane l+4, then l plus l+2, then the
// last two.
func reduce(v *[8]float32) float32 {
	h0, h1, h2, h3 := v[0]+v[4], v[1]+v[5], v[2]+v[6], v[3]+v[7]
	return (h0 + h2) + (h1 + h3)
}

// dot32Generic is the vector loop in Go: len(a) is a multiple of 32, and
// lanes receives (v0 + v1) + (v2 + v3) of the four vectors of sums.
func dot32Generic(a, b []float32, lanes *[8]float32) {
	var acc [4][8]float32
	for i := 0; i+32 <= len(a); i += 32 {
		x, y := a[i:i+32], b[i:i+32]
		for j := range 4 {
			for l := range 8 {
				acc[j][l] += float32(x[8*j+l] * y[8*j+l]) // the conversion forbids fusing
			}
		}
	}
	for l := range 8 {
		lanes[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l])
	}
}

// DotRows adds to out[i], for each i < len(out), the dot product of row i
// of a (rows of k values, one after another) with b[:k], each computed
// exactly as Dot computes it; one call covers every row, so that short rows
// do not pay a call each.
func DotRows(a []float32, k int, b []float32, out []float32) {
	if len(out) == 0 {
		return
	}
	b = b[:k]
	a = a[:len(out)*k]
	if k >= 32 {
		dotRows(&a[0], &b[0], k, k, len(out), &out[0], true)
		return
	}
	for i := range out {
		out[i] += Dot(a[i*k:i*k+k], b)
	}
}

// dotRowsGeneric is dotRows in Go.
func dotRowsGeneric(a, b *float32, n, stride, rows int, sums *float32, add bool) {
	out := unsafe.Slice(sums, rows)
	y := unsafe.Slice(b, n)
	n32 := n &^ 31
	for r := range rows {
		x := unsafe.Slice((*float32)(unsafe.Add(unsafe.Pointer(a), 4*r*stride)), n)
		var lanes [8]float32
		dot32Generic(x[:n32], y[:n32], &lanes)
		s := reduce(&lanes)
		for i := n32; i < n; i++ {
			s += float32(x[i] * y[i])
		}
		if add {
			out[r] += s
		} else {
			out[r] = s
		}
	}
}
