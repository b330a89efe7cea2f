package eval

import (
	vec "github.com/mokopt/mokopt/internal/f32"
	"slices"
	"sync"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// gemmF32Cols computes the output columns [c0, c1) of c[M,N] += a[M,K] *
// b[K,N] (row-major), blocked over K and N so the touched rows of b stay in
// cache.
func gemmF32Cols(a, b, c []float32, M, K, N, c0, c1 int) {
	const kb, nb = 256, 512
	for k0 := 0; k0 < K; k0 += kb {
		k1 := min(k0+kb, K)
		for n0 := c0; n0 < c1; n0 += nb {
			n1 := min(n0+nb, c1)
			for i := 0; i < M; i++ {
				crow := c[i*N+n0 : i*N+n1]
				arow := a[i*K : i*K+K]
				k := k0
				for ; k+4 <= k1; k += 4 {
					a0, a1, a2, a3 := arow[k], arow[k+1], arow[k+2], arow[k+3]
					b0 := b[k*N+n0 : k*N+n1]
					b1 := b[(k+1)*N+n0 : (k+1)*N+n1]
					b2 := b[(k+2)*N+n0 : (k+2)*N+n1]
					b3 := b[(k+3)*N+n0 : (k+3)*N+n1]
					b0, b1, b2, b3 = b0[:len(crow)], b1[:len(crow)], b2[:len(crow)], b3[:len(crow)]
					for j := range crow {
						crow[j] += a0*b0[j] + a1*b1[j] + a2*b2[j] + a3*b3[j]
					}
				}
				for ; k < k1; k++ {
					av := arow[k]
					brow := b[k*N+n0 : k*N+n1]
					brow = brow[:len(crow)]
					for j := range crow {
						crow[j] += av * brow[j]
					}
				}
			}
		}
	}
}

// gemvF32 computes c[i] += a[i,:]·b for the rows of a[len(c), K]: the
// product with one column, as a batched-experts export multiplies each
// gathered expert matrix by one token.
func gemvF32(a, b, c []float32, K int) {
	vec.DotRows(a, K, b, c)
}

// gemvMultiF32 is gemvF32 for several vectors bs[v] into cs[v]: a's rows
// go by blocks of about 16 KiB, each multiplied by every vector while it
// sits in the first-level cache (a 512×512 matrix by 256 vectors: 3.0–3.2
// ms against 3.9–4.3 ms for a whole pass over a per vector, go test
// ./graph/eval -bench GemvMulti), and every element is summed exactly as
// gemvF32 sums it.
func gemvMultiF32(a []float32, bs, cs [][]float32, K int) {
	rows := len(cs[0])
	per := max(8, 4096/K)
	for r := 0; r < rows; r += per {
		e := min(rows, r+per)
		for v, b := range bs {
			vec.DotRows(a[r*K:e*K], K, b, cs[v][r:e])
		}
	}
}

// gemmGeneric computes columns [c0, c1) of c += a*b for float64 and int64.
func gemmGeneric[T float64 | int64](a, b, c []T, M, K, N, c0, c1 int) {
	for i := 0; i < M; i++ {
		crow := c[i*N+c0 : i*N+c1]
		for k := 0; k < K; k++ {
			av := a[i*K+k]
			brow := b[k*N+c0 : k*N+c1]
			for j := range crow {
				crow[j] += av * brow[j]
			}
		}
	}
}

// matmulJob is one 2-D product inside a batched MatMul, restricted to the
// output rows [r0, r1) and columns [c0, c1).
// matmulJob is one batch's product (rows [r0, r1), columns [c0, c1)) at
// offsets ao, bo, co; more lists further (bo, co) vector products with the
// same left matrix (N = 1), computed in the same pass over its rows.
type matmulJob struct {
	ao, bo, co, r0, r1, c0, c1 int
	more                       [][2]int
}

// matmul multiplies a[..., M, K] by b[..., K, N] with broadcast batch dims.
// 1-D operands are promoted as numpy does.
func matmul(c *OpContext, a, b *Tensor) (*Tensor, error) {
	if a.kind() != b.kind() {
		return nil, errf("MatMul operand types differ: %s and %s", a.DType, b.DType)
	}
	if a.Rank() == 0 || b.Rank() == 0 {
		return nil, errf("MatMul operands must have rank >= 1")
	}
	ash, bsh := a.Shape, b.Shape
	if a.Rank() == 1 {
		ash = []int{1, ash[0]}
	}
	if b.Rank() == 1 {
		bsh = []int{bsh[0], 1}
	}
	M, K := ash[len(ash)-2], ash[len(ash)-1]
	K2, N := bsh[len(bsh)-2], bsh[len(bsh)-1]
	if K != K2 {
		return nil, errf("MatMul shapes %v and %v do not match", a.Shape, b.Shape)
	}
	batch, err := BroadcastShapes(ash[:len(ash)-2], bsh[:len(bsh)-2])
	if err != nil {
		return nil, errf("MatMul batch dims: %v", err)
	}
	// A lazy operand is read in place when each of its batch matrices is
	// one gathered slab; otherwise it is materialized.
	if a.lazy != nil && (len(ash) < 3 || a.lazy.slab != M*K) {
		if a, err = c.materialize(a); err != nil {
			return nil, err
		}
	}
	if b.lazy != nil && (len(bsh) < 3 || b.lazy.slab != K*N) {
		if b, err = c.materialize(b); err != nil {
			return nil, err
		}
	}
	shape := append(append([]int{}, batch...), M, N)
	if (a.lazy != nil && a.lazy.src.src != nil) || (b.lazy != nil && b.lazy.src.src != nil) {
		return matmulStreamed(c, a, b, ash, bsh, batch, shape)
	}
	if out, ok, err := matmulDistinctRows(c, a, b, ash, bsh, shape); ok || err != nil {
		return out, err
	}
	out, err := c.alloc(a.DType, shape)
	if err != nil {
		return nil, err
	}
	// batch offsets per operand
	ab := bcastIndex(ash[:len(ash)-2], batch)
	bb := bcastIndex(bsh[:len(bsh)-2], batch)
	nb := numel(batch)
	aoff := func(ai int) int { return ai * M * K }
	boff := func(bi int) int { return bi * K * N }
	abuf, bbuf := a.F32, b.F32
	if a.lazy != nil {
		abuf, aoff = a.lazy.src.F32, func(ai int) int { return a.lazy.offs[ai] }
	}
	if b.lazy != nil {
		bbuf, boff = b.lazy.src.F32, func(bi int) int { return b.lazy.offs[bi] }
	}
	// Batches whose two matrices equal an earlier batch's (the same
	// gathered slab, the same bits) are computed once and copied.
	var akey, bkey []int
	if nb > 1 && a.kind() == kF32 {
		akey = batchKeys(a, numel(ash[:len(ash)-2]), M*K)
		bkey = batchKeys(b, numel(bsh[:len(bsh)-2]), K*N)
	}
	var dups [][2]int // (batch, batch it copies)
	var seen map[[2]int]int
	if akey != nil || bkey != nil {
		seen = make(map[[2]int]int, nb)
	}
	jobs := make([]matmulJob, 0, nb)
	for i := 0; i < nb; i++ {
		ai, bi := i, i
		if ab != nil {
			ai = ab[i]
		}
		if bb != nil {
			bi = bb[i]
		}
		if akey != nil || bkey != nil {
			k := [2]int{-1, -1}
			if akey != nil {
				k[0] = akey[ai]
			}
			if bkey != nil {
				k[1] = bkey[bi]
			}
			if j, ok := seen[k]; ok {
				dups = append(dups, [2]int{i, j})
				continue
			}
			seen[k] = i
		}
		jobs = append(jobs, matmulJob{ao: aoff(ai), bo: boff(bi), co: i * M * N, r0: 0, r1: M, c0: 0, c1: N})
	}
	// Matrix-vector products with the same left matrix (a gathered expert
	// slab chosen by several tokens) share one pass over its rows.
	if N == 1 && a.kind() == kF32 && len(jobs) > 1 {
		first := make(map[int]int, len(jobs))
		grouped := jobs[:0]
		for _, j := range jobs {
			if g, ok := first[j.ao]; ok {
				grouped[g].more = append(grouped[g].more, [2]int{j.bo, j.co})
				continue
			}
			first[j.ao] = len(grouped)
			grouped = append(grouped, j)
		}
		jobs = grouped
	}
	// split rows (then columns, in blocks of 64) when there are fewer
	// batches than threads and the work is worth it.
	threads := defaultThreads()
	if c != nil && c.r != nil {
		threads = c.r.threads
	}
	work := nb * M * K * N
	if threads > 1 && work >= parallelWork && len(jobs) < threads {
		want := 2 * threads / len(jobs)
		rp := min(want, M)
		cp := min(max(want/rp, 1), max(N/64, 1))
		var split []matmulJob
		for _, j := range jobs {
			for p := 0; p < rp; p++ {
				r0, r1 := M*p/rp, M*(p+1)/rp
				for q := 0; q < cp; q++ {
					c0, c1 := N*q/cp, N*(q+1)/cp
					if r0 < r1 && c0 < c1 {
						split = append(split, matmulJob{ao: j.ao, bo: j.bo, co: j.co, r0: r0, r1: r1, c0: c0, c1: c1, more: j.more})
					}
				}
			}
		}
		jobs = split
	}
	run := func(j matmulJob) {
		rows := j.r1 - j.r0
		switch a.kind() {
		case kF32:
			if N == 1 && len(j.more) > 0 {
				bs := [][]float32{bbuf[j.bo : j.bo+K]}
				cs := [][]float32{out.F32[j.co+j.r0 : j.co+j.r1]}
				for _, m := range j.more {
					bs = append(bs, bbuf[m[0]:m[0]+K])
					cs = append(cs, out.F32[m[1]+j.r0:m[1]+j.r1])
				}
				gemvMultiF32(abuf[j.ao+j.r0*K:j.ao+j.r1*K], bs, cs, K)
				break
			}
			if N == 1 {
				gemvF32(abuf[j.ao+j.r0*K:j.ao+j.r1*K], bbuf[j.bo:j.bo+K], out.F32[j.co+j.r0:j.co+j.r1], K)
				break
			}
			gemmF32Cols(abuf[j.ao+j.r0*K:j.ao+j.r1*K], bbuf[j.bo:j.bo+K*N], out.F32[j.co+j.r0*N:j.co+j.r1*N], rows, K, N, j.c0, j.c1)
		case kF64:
			gemmGeneric(a.F64[j.ao+j.r0*K:j.ao+j.r1*K], b.F64[j.bo:j.bo+K*N], out.F64[j.co+j.r0*N:j.co+j.r1*N], rows, K, N, j.c0, j.c1)
		case kI64:
			gemmGeneric(a.I64[j.ao+j.r0*K:j.ao+j.r1*K], b.I64[j.bo:j.bo+K*N], out.I64[j.co+j.r0*N:j.co+j.r1*N], rows, K, N, j.c0, j.c1)
		}
	}
	switch a.kind() {
	case kF32, kF64, kI64:
	default:
		return nil, errf("MatMul is not defined for %s", a.DType)
	}
	if threads <= 1 || work < parallelWork || len(jobs) == 1 {
		for _, j := range jobs {
			run(j)
		}
	} else {
		var wg sync.WaitGroup
		ch := make(chan matmulJob)
		for w := 0; w < min(threads, len(jobs)); w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range ch {
					run(j)
				}
			}()
		}
		for _, j := range jobs {
			ch <- j
		}
		close(ch)
		wg.Wait()
	}
	for _, d := range dups {
		copy(out.F32[d[0]*M*N:(d[0]+1)*M*N], out.F32[d[1]*M*N:(d[1]+1)*M*N])
	}
	// drop promoted dims of 1-D operands
	final := append([]int{}, batch...)
	if a.Rank() != 1 {
		final = append(final, M)
	}
	if b.Rank() != 1 {
		final = append(final, N)
	}
	out.Shape = final
	return out, nil
}

func kMatMul(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	a, b, err := need2(in)
	if err != nil {
		return nil, err
	}
	return one(matmul(c, a, b))
}

// kFusedMatMul is com.microsoft::FusedMatMul: alpha · op(A) · op(B), op a
// transpose of the last two axes where transA / transB is set (the batch
// transposes transBatchA / transBatchB are refused).
func kFusedMatMul(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	a, b, err := need2(in)
	if err != nil {
		return nil, err
	}
	if attrInt(n, "transBatchA", 0) != 0 || attrInt(n, "transBatchB", 0) != 0 {
		return nil, errf("FusedMatMul with transBatchA or transBatchB is not supported")
	}
	last2 := func(t *Tensor) (*Tensor, error) {
		r := t.Rank()
		if r < 2 {
			return nil, errf("FusedMatMul transposes a tensor of rank %d", r)
		}
		perm := make([]int, r)
		for i := range perm {
			perm[i] = i
		}
		perm[r-2], perm[r-1] = r-1, r-2
		return transpose(t, perm), nil
	}
	if attrInt(n, "transA", 0) != 0 {
		if a, err = last2(a); err != nil {
			return nil, err
		}
	}
	if attrInt(n, "transB", 0) != 0 {
		if b, err = last2(b); err != nil {
			return nil, err
		}
	}
	y, err := matmul(c, a, b)
	if err != nil {
		return nil, err
	}
	if alpha := attrFloat(n, "alpha", 1); alpha != 1 {
		scale(y, float64(alpha))
	}
	return []*Tensor{y}, nil
}

func kGemm(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	a, b, err := need2(in)
	if err != nil {
		return nil, err
	}
	if a.Rank() != 2 || b.Rank() != 2 {
		if c.Opset("") >= 7 || a.Rank() != 2 {
			return nil, errf("Gemm needs 2-D A and B, got %v and %v", a.Shape, b.Shape)
		}
	}
	if attrInt(n, "transA", 0) == 1 {
		a = transpose(a, []int{1, 0})
	}
	if attrInt(n, "transB", 0) == 1 {
		b = transpose(b, []int{1, 0})
	}
	y, err := matmul(c, a, b)
	if err != nil {
		return nil, err
	}
	alpha := float64(attrFloat(n, "alpha", 1))
	beta := float64(attrFloat(n, "beta", 1))
	if alpha != 1 {
		scale(y, alpha)
	}
	if cc := opt(in, 2); cc != nil && beta != 0 {
		if c.Opset("") < 7 && attrInt(n, "broadcast", 0) == 0 && !slices.Equal(cc.Shape, y.Shape) {
			return nil, errf("C shape %v does not match %v without broadcast", cc.Shape, y.Shape)
		}
		if _, err := BroadcastShapes(cc.Shape, y.Shape); err != nil {
			return nil, errf("C shape %v does not broadcast to %v", cc.Shape, y.Shape)
		}
		cb := expandTo(cc, y.Shape)
		if beta != 1 {
			scale(cb, beta)
		}
		if y, err = applyArith(arithOps["Add"], y, cb); err != nil {
			return nil, err
		}
	}
	return []*Tensor{y}, nil
}

// parallelWork is the multiply-adds from which a MatMul's batches (or
// its rows, when there are fewer batches than threads) are spread over
// threads: a few hundred microseconds of work on one core. Below that,
// starting and waking goroutines costs about what the other cores save,
// and more when they are busy anyway, as they are while the numerical
// check runs beside the rewrite: the check of 100 directly chained blocks,
// whose products are 8×16×64×64, takes 34 ms at 1<<17 and 20 ms at 1<<20
// (go test ./passes -bench CheckChain). Every output element is computed
// the same way whichever thread computes it.
const parallelWork = 1 << 20

// scale multiplies a numeric tensor by s in place.
func scale(t *Tensor, s float64) {
	switch t.kind() {
	case kF32:
		f := float32(s)
		for i := range t.F32 {
			t.F32[i] *= f
		}
	case kF64:
		for i := range t.F64 {
			t.F64[i] *= s
		}
	case kI64:
		for i := range t.I64 {
			t.I64[i] = int64(float64(t.I64[i]) * s)
		}
	}
}

func init() {
	builtin("", kMatMul, "MatMul")
	builtin("com.microsoft", kFusedMatMul, "FusedMatMul")
	builtin("", kGemm, "Gemm")
}

// batchKeys names each of the n batch matrices (size elements) of a float
// operand so that equal keys mean equal matrices: a lazy operand's slab
// offset, else its content class (slabClasses). It returns nil for one
// batch (broadcast) or non-float data.
func batchKeys(t *Tensor, n, size int) []int {
	if n <= 1 || t.kind() != kF32 {
		return nil
	}
	if t.lazy != nil {
		return t.lazy.offs
	}
	cls, _ := slabClasses(n, size, func(i int) []float32 { return t.F32[i*size : (i+1)*size] })
	return cls
}

// matmulDistinctRows multiplies a [..., M, K] by a 2-D b [K, N] computing
// each distinct row of a (bit for bit) once: rows of a are independent, so
// equal rows give equal results. It returns ok false, and does nothing,
// when that does not apply or a has no repeated row.
func matmulDistinctRows(c *OpContext, a, b *Tensor, ash, bsh, shape []int) (*Tensor, bool, error) {
	if len(bsh) != 2 || a.kind() != kF32 || a.lazy != nil || b.lazy != nil || a.Rank() == 1 || b.Rank() == 1 {
		return nil, false, nil
	}
	K, N := bsh[0], bsh[1]
	rows := numel(ash[:len(ash)-1])
	if rows < 8 || N < 8 || K == 0 {
		return nil, false, nil
	}
	cls, d := slabClasses(rows, K, func(i int) []float32 { return a.F32[i*K : (i+1)*K] })
	if d == rows {
		return nil, false, nil
	}
	out, err := c.alloc(a.DType, shape)
	if err != nil {
		return nil, true, err
	}
	ca, err := c.alloc(a.DType, []int{d, K})
	if err != nil {
		return nil, true, err
	}
	from := make([]int, d)
	for i := rows - 1; i >= 0; i-- {
		from[cls[i]] = i
	}
	for j, i := range from {
		copy(ca.F32[j*K:(j+1)*K], a.F32[i*K:(i+1)*K])
	}
	cy, err := matmul(c, ca, b)
	if err != nil {
		return nil, true, err
	}
	for i, k := range cls {
		copy(out.F32[i*N:(i+1)*N], cy.F32[k*N:(k+1)*N])
	}
	return out, true, nil
}

// matmulStreamed is matmul where an operand's batch matrices are slabs
// gathered from a streamed weight (the stacked experts of a batched
// export, read from the model's file): the batches are computed slab by
// slab, each distinct slab read once and reused for every batch that
// gathered it, so that one expert's matrix is held at a time. Each batch
// is computed as matmul computes it.
func matmulStreamed(c *OpContext, a, b *Tensor, ash, bsh, batch, shape []int) (*Tensor, error) {
	M, K, N := ash[len(ash)-2], ash[len(ash)-1], bsh[len(bsh)-1]
	out, err := c.alloc(a.DType, shape)
	if err != nil {
		return nil, err
	}
	ab := bcastIndex(ash[:len(ash)-2], batch)
	bb := bcastIndex(bsh[:len(bsh)-2], batch)
	at := func(idx []int, i int) int {
		if idx != nil {
			return idx[i]
		}
		return i
	}
	nb := numel(batch)
	// the streamed side groups the batches; the other side's matrices
	// are gathered per group.
	sa := a.lazy != nil && a.lazy.src.src != nil
	key := func(i int) int {
		if sa {
			return a.lazy.offs[at(ab, i)]
		}
		return b.lazy.offs[at(bb, i)]
	}
	groups := map[int][]int{}
	var order []int
	for i := 0; i < nb; i++ {
		k := key(i)
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], i)
	}
	slices.Sort(order)
	slab := make([]float32, map[bool]int{true: M * K, false: K * N}[sa])
	matrix := func(t *Tensor, idx []int, i, size int, dst []float32) error {
		j := at(idx, i)
		switch {
		case t.lazy != nil && t.lazy.src.src != nil:
			return t.lazy.src.ReadFloat32(dst, t.lazy.offs[j])
		case t.lazy != nil:
			copy(dst, t.lazy.slabOf(j))
		default:
			copy(dst, t.F32[j*size:(j+1)*size])
		}
		return nil
	}
	for _, k := range order {
		is := groups[k]
		g := len(is)
		src := &Tensor{DType: a.DType, Shape: []int{len(slab)}}
		if sa {
			src.F32 = slab
			if err := a.lazy.src.ReadFloat32(slab, k); err != nil {
				return nil, err
			}
		} else {
			src.F32 = slab
			if err := b.lazy.src.ReadFloat32(slab, k); err != nil {
				return nil, err
			}
		}
		fixed := &Tensor{DType: a.DType, Shape: nil, lazy: &gathered{src: src, offs: make([]int, g), slab: len(slab)}}
		other := &Tensor{DType: a.DType, F32: make([]float32, 0, 1)}
		var A, B *Tensor
		if sa {
			fixed.Shape = []int{g, M, K}
			other.Shape, other.F32 = []int{g, K, N}, make([]float32, g*K*N)
			for q, i := range is {
				if err := matrix(b, bb, i, K*N, other.F32[q*K*N:(q+1)*K*N]); err != nil {
					return nil, err
				}
			}
			A, B = fixed, other
		} else {
			fixed.Shape = []int{g, K, N}
			other.Shape, other.F32 = []int{g, M, K}, make([]float32, g*M*K)
			for q, i := range is {
				if err := matrix(a, ab, i, M*K, other.F32[q*M*K:(q+1)*M*K]); err != nil {
					return nil, err
				}
			}
			A, B = other, fixed
		}
		part, err := matmul(c, A, B)
		if err != nil {
			return nil, err
		}
		for q, i := range is {
			copy(out.F32[i*M*N:(i+1)*M*N], part.F32[q*M*N:(q+1)*M*N])
		}
	}
	return out, nil
}
