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
// leading part runs as vector instructions with exactly those roundings.
package f32

import "unsafe"

// Dot returns the dot product of a and b[:len(a)], summed in the order the
// package documents.
func Dot(a, b []float32) float32 {
	b = b[:len(a)]
	n32 := len(a) &^ 31
	var s float32
	if n32 > 0 {
		dotRows(&a[0], &b[0], n32, n32, 1, &s) // one row
	}
	for i := n32; i < len(a); i++ {
		s += float32(a[i] * b[i])
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
	n32 := k &^ 31
	if n32 == 0 {
		for i := range out {
			out[i] += Dot(a[i*k:i*k+k], b)
		}
		return
	}
	var sums [256]float32
	for r0 := 0; r0 < len(out); r0 += len(sums) {
		rows := min(len(sums), len(out)-r0)
		dotRows(&a[r0*k], &b[0], n32, k, rows, &sums[0])
		for i := range rows {
			s := sums[i]
			row := a[(r0+i)*k : (r0+i)*k+k]
			for j := n32; j < k; j++ {
				s += float32(row[j] * b[j])
			}
			out[r0+i] += s
		}
	}
}

// dotRowsGeneric is dotRows in Go.
func dotRowsGeneric(a, b *float32, n, stride, rows int, sums *float32) {
	out := unsafe.Slice(sums, rows)
	y := unsafe.Slice(b, n)
	for r := range rows {
		var lanes [8]float32
		dot32Generic(unsafe.Slice((*float32)(unsafe.Add(unsafe.Pointer(a), 4*r*stride)), n), y, &lanes)
		out[r] = reduce(&lanes)
	}
}
