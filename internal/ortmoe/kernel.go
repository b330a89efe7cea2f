package ortmoe

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// AddKernels adds the kernels of com.microsoft::MoE and QMoE to k and
// returns k. Nothing is registered on import.
//
// The experts' weights (fc1, fc2, fc3, and QMoE's codes and scales) are
// read one expert at a time where the run streams them
// (eval.Kernels.Streams): a node whose weights lie in a side file is
// evaluated holding one expert's matrices, not the node's, and computes
// the same numbers bit for bit.
func AddKernels(k *eval.Kernels) *eval.Kernels {
	return k.Add(Domain, OpMoE, evalKernel).Streams(Domain, OpMoE, MoEFC1, MoEFC2, MoEFC3).
		Add(Domain, OpQMoE, evalKernel).Streams(Domain, OpQMoE, QFC1, QFC1Scales, QFC2, QFC2Scales, QFC3, QFC3Scales)
}

// Register registers the MoE and QMoE kernels process-wide with graph/eval
// (eval.Register), for code that runs models without eval.Options.Kernels.
func Register() { AddKernels(eval.NewKernels()).Register() }

// Source gives a node's inputs by position: dims (nil when absent) and data
// as float32 (FLOAT/FLOAT16/BFLOAT16) or as integers (UINT8).
type Source interface {
	Dims(pos int) []int64
	Floats(pos int) ([]float32, error)
	Ints(pos int) ([]int64, error)
}

// TensorSource reads the inputs of an interpreter kernel call by position
// (nil entries are absent inputs).
type TensorSource []*eval.Tensor

func (s TensorSource) get(pos int) *eval.Tensor {
	if pos < len(s) {
		return s[pos]
	}
	return nil
}

func (s TensorSource) Dims(pos int) []int64 {
	t := s.get(pos)
	if t == nil {
		return nil
	}
	d := make([]int64, len(t.Shape))
	for i, v := range t.Shape {
		d[i] = int64(v)
	}
	return d
}

func (s TensorSource) Floats(pos int) ([]float32, error) {
	t := s.get(pos)
	if t == nil {
		return nil, nil
	}
	if t.F32 == nil {
		return nil, fmt.Errorf("input %d has type %s, want a float type", pos, t.DType)
	}
	return t.F32, nil
}

func (s TensorSource) Ints(pos int) ([]int64, error) {
	t := s.get(pos)
	if t == nil {
		return nil, nil
	}
	if t.DType != pb.TensorProto_UINT8 {
		return nil, fmt.Errorf("input %d has type %s, want uint8", pos, t.DType)
	}
	return t.I64, nil
}

func evalKernel(_ *eval.OpContext, n *pb.NodeProto, in []*eval.Tensor) ([]*eval.Tensor, error) {
	a, err := ParseAttrs(n)
	if err != nil {
		return nil, err
	}
	src := TensorSource(in)
	if streamedWeights(a, in) {
		return a.evalStreamed(n, in)
	}
	w, err := a.ReadExperts(src)
	if err != nil {
		return nil, fmt.Errorf("%s node %q: %w", n.GetOpType(), graph.NodeLabel(n), err)
	}
	x, r := src.get(0), src.get(1)
	if x == nil || r == nil || x.F32 == nil || r.F32 == nil || len(x.Shape) < 2 || x.Shape[len(x.Shape)-1] != w.H {
		return nil, fmt.Errorf("%s node %q: input must be float [..., %d] and router_probs float [T, %d]", n.GetOpType(), graph.NodeLabel(n), w.H, w.E)
	}
	if a.Quantized && len(in) > QRouterWeights && in[QRouterWeights] != nil {
		return nil, fmt.Errorf("QMoE node %q: the router_weights input is not supported", graph.NodeLabel(n))
	}
	T := len(x.F32) / w.H
	y, err := a.Forward(w, x.F32, r.F32, T)
	if err != nil {
		return nil, fmt.Errorf("%s node %q: %w", n.GetOpType(), graph.NodeLabel(n), err)
	}
	return []*eval.Tensor{eval.NewFloat32(append([]int(nil), x.Shape...), y)}, nil
}

// ReadExperts reads (and for QMoE dequantizes) the expert weights of a node
// from src, resolving the legacy [E, in, out] MoE layout by ONNX Runtime's
// own rule, and returns them in the current [E, out, in] layout.
func (a *Attrs) ReadExperts(src Source) (*Experts, error) {
	if a.Quantized {
		return a.readQuantized(src)
	}
	d1, d2 := src.Dims(MoEFC1), src.Dims(MoEFC2)
	if len(d1) != 3 || len(d2) != 3 {
		return nil, fmt.Errorf("fc1_experts_weights dims %v and fc2_experts_weights dims %v are not both [E, N, K]", d1, d2)
	}
	E := int(d2[0])
	r := src.Dims(MoERouter)
	if len(r) == 0 {
		return nil, fmt.Errorf("router_probs is missing")
	}
	x := src.Dims(MoEInput)
	if len(x) == 0 {
		return nil, fmt.Errorf("input is missing")
	}
	H := int(x[len(x)-1])
	if H == 0 || int(d2[1]*d2[2])%H != 0 {
		return nil, fmt.Errorf("fc2_experts_weights dims %v do not fit hidden size %d", d2, H)
	}
	I := int(d2[1]*d2[2]) / H
	f := int64(1)
	if a.fused() {
		f = 2
	}
	legacy := (H != I && int(d2[1]) == I) || (H == I && a.fused() && d1[1] == int64(H))
	w := &Experts{E: E, H: H, I: I}
	var err error
	read := func(pos int, rows, cols int64) ([]float32, error) {
		v, err := src.Floats(pos)
		if v == nil || err != nil {
			return v, err
		}
		d := src.Dims(pos)
		want := []int64{int64(E), rows, cols}
		if legacy {
			want = []int64{int64(E), cols, rows}
		}
		if len(d) != 3 || d[0] != want[0] || d[1] != want[1] || d[2] != want[2] {
			return nil, fmt.Errorf("input %d has dims %v, want %v (legacy layout %v)", pos, d, want, legacy)
		}
		if legacy {
			v = transposeStack(v, E, int(cols), int(rows))
		}
		return v, nil
	}
	if w.FC1, err = read(MoEFC1, f*int64(I), int64(H)); err != nil {
		return nil, err
	}
	if w.FC2, err = read(MoEFC2, int64(H), int64(I)); err != nil {
		return nil, err
	}
	if w.FC3, err = read(MoEFC3, int64(I), int64(H)); err != nil {
		return nil, err
	}
	if w.FC1B, err = src.Floats(MoEFC1Bias); err != nil {
		return nil, err
	}
	if w.FC2B, err = src.Floats(MoEFC2Bias); err != nil {
		return nil, err
	}
	if w.FC3B, err = src.Floats(MoEFC3Bias); err != nil {
		return nil, err
	}
	if r[len(r)-1] != int64(E) {
		return nil, fmt.Errorf("router_probs dims %v do not end in %d experts", r, E)
	}
	return w, a.Check(w)
}

// transposeStack turns [E, r, c] into [E, c, r].
func transposeStack(v []float32, E, r, c int) []float32 {
	out := make([]float32, len(v))
	for e := 0; e < E; e++ {
		s, d := v[e*r*c:(e+1)*r*c], out[e*r*c:(e+1)*r*c]
		for i := 0; i < r; i++ {
			for j := 0; j < c; j++ {
				d[j*r+i] = s[i*c+j]
			}
		}
	}
	return out
}

// readQuantized dequantizes QMoE's fc1/fc2/fc3.
func (a *Attrs) readQuantized(src Source) (*Experts, error) {
	x := src.Dims(QInput)
	d2 := src.Dims(QFC2)
	if len(x) == 0 || len(d2) != 3 {
		return nil, fmt.Errorf("input dims %v / fc2_experts_weights dims %v", x, d2)
	}
	pack := int64(8 / a.Bits)
	E, H, I := int(d2[0]), int(x[len(x)-1]), int(d2[2]*pack)
	if int(d2[1]) != H {
		return nil, fmt.Errorf("fc2_experts_weights dims %v: want [%d, %d, I/%d]", d2, E, H, pack)
	}
	f := 1
	if a.fused() {
		f = 2
	}
	w := &Experts{E: E, H: H, I: I}
	var err error
	if w.FC1, err = a.Dequantize(src, QFC1, QFC1Scales, QFC1Zero, E, f*I, H); err != nil {
		return nil, fmt.Errorf("fc1: %w", err)
	}
	if w.FC2, err = a.Dequantize(src, QFC2, QFC2Scales, QFC2Zero, E, H, I); err != nil {
		return nil, fmt.Errorf("fc2: %w", err)
	}
	if src.Dims(QFC3) != nil {
		if w.FC3, err = a.Dequantize(src, QFC3, QFC3Scales, QFC3Zero, E, I, H); err != nil {
			return nil, fmt.Errorf("fc3: %w", err)
		}
	}
	for _, b := range []struct {
		pos int
		dst *[]float32
	}{{QFC1Bias, &w.FC1B}, {QFC2Bias, &w.FC2B}, {QFC3Bias, &w.FC3B}} {
		if *b.dst, err = src.Floats(b.pos); err != nil {
			return nil, err
		}
	}
	return w, a.Check(w)
}

// Dequantize reads the quantized [E, N, K/pack] weight at position wPos
// with its scales ([E, N], or [E, N, K/block_size]) and optional zero
// points, and returns (q - zero) · scale as float32 [E, N, K]. 4-bit values
// are packed two per byte, element 2j in the low nibble; the default zero
// point is 2^(bits-1).
func (a *Attrs) Dequantize(src Source, wPos, sPos, zPos, E, N, K int) ([]float32, error) {
	pack := 8 / a.Bits
	q, err := src.Ints(wPos)
	if err != nil {
		return nil, err
	}
	if d := src.Dims(wPos); len(d) != 3 || d[0] != int64(E) || d[1] != int64(N) || d[2]*int64(pack) != int64(K) {
		return nil, fmt.Errorf("weights have dims %v, want [%d, %d, %d]", d, E, N, K/pack)
	}
	sc, err := src.Floats(sPos)
	if err != nil {
		return nil, err
	}
	if sc == nil {
		return nil, fmt.Errorf("scales are missing")
	}
	groups := 1
	if a.BlockSize > 0 {
		if K%a.BlockSize != 0 {
			return nil, fmt.Errorf("input size K %d is not a multiple of block_size %d", K, a.BlockSize)
		}
		groups = K / a.BlockSize
	}
	if len(sc) != E*N*groups {
		return nil, fmt.Errorf("scales have %d values (dims %v), want %d", len(sc), src.Dims(sPos), E*N*groups)
	}
	zp, err := src.Ints(zPos)
	if err != nil {
		return nil, err
	}
	if zp != nil && len(zp)*pack != E*N*groups {
		return nil, fmt.Errorf("zero points have %d bytes, want %d", len(zp), E*N*groups/pack)
	}
	out := make([]float32, E*N*K)
	a.dequantRows(out, q, sc, zp, 0, E*N, K, groups)
	return out, nil
}

// dequantRows writes into out [rows, K] rows r0 .. r0+rows of a quantized
// weight: (q − zero) · scale, where q holds those rows' packed values and
// sc their scales (groups per row), and zp, when not nil, all the weight's
// zero points (default 2^(bits−1)).
func (a *Attrs) dequantRows(out []float32, q []int64, sc []float32, zp []int64, r0, rows, K, groups int) {
	dequantize(a.Bits, out, q, sc, zp, r0*groups, rows, K, groups)
}

// DequantizeRows is Dequantize for len(out)/K rows of a weight of K values
// a row (expert e's N rows start at row e·N), from those rows' packed codes
// as stored (codes), their scales (groups a row) and, when the weight has
// them, packed zero points zp whose value zOff is the first row's first
// (nil: the default): what a reader of one expert at a time needs, with no
// more than its rows in memory.
func (a *Attrs) DequantizeRows(out []float32, codes []byte, sc []float32, zp []byte, zOff, K, groups int) {
	dequantize(a.Bits, out, codes, sc, zp, zOff, len(out)/K, K, groups)
}

// dequantize writes rows of (q − zero) · scale into out [rows, K], where q
// holds those rows' packed values and sc their scales (groups per row),
// and zp, when not nil, packed zero points, the rows' first at value zOff
// (default 2^(bits−1)).
func dequantize[Q, Z int64 | byte](bits int, out []float32, q []Q, sc []float32, zp []Z, zOff, rows, K, groups int) {
	pack := 8 / bits
	def := int64(1) << (bits - 1)
	for r := 0; r < rows; r++ {
		for k := 0; k < K; k++ {
			g := r*groups + k*groups/K
			z := def
			if zp != nil {
				z = nibble(zp, zOff+g, pack)
			}
			out[r*K+k] = float32(nibble(q, r*K+k, pack)-z) * sc[g]
		}
	}
}

// nibble is value i of b, which packs pack values a byte (element 2j in
// the low nibble when two).
func nibble[Q int64 | byte](b []Q, i, pack int) int64 {
	if pack == 1 {
		return int64(b[i])
	}
	v := int64(b[i/2])
	if i%2 == 1 {
		v >>= 4
	}
	return v & 15
}
