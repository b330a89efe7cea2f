package ortmoe

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// weightInputs are the input positions of a node's expert weights (and
// QMoE's scales), which the kernel reads one expert at a time when the run
// streams them.
func (a *Attrs) weightInputs() []int {
	if a.Quantized {
		return []int{QFC1, QFC1Scales, QFC2, QFC2Scales, QFC3, QFC3Scales}
	}
	return []int{MoEFC1, MoEFC2, MoEFC3}
}

// streamedWeights reports whether some expert weight of the node came
// streamed (eval.Tensor.Streamed): its values are read by ranges.
func streamedWeights(a *Attrs, in []*eval.Tensor) bool {
	for _, p := range a.weightInputs() {
		if p < len(in) && in[p].Streamed() {
			return true
		}
	}
	return false
}

// streamedWeight is one of fc1, fc2, fc3 read one expert at a time: rows
// × cols values per expert in the current layout, stored transposed when
// legacy; for QMoE packed codes with scales (groups per row) and the
// node's zero points (nil: the default).
type streamedWeight struct {
	t          *eval.Tensor
	rows, cols int
	legacy     bool
	sc         *eval.Tensor
	groups     int
	zp         []int64
	buf        []float32 // one expert's values as stored
	q          []int64
	scales     []float32
	out        []float32
}

// codeChunk bounds the QMoE codes read and widened at a time (a variable
// for the tests).
var codeChunk = 1 << 20

// read returns expert e's [rows, cols] values (in a buffer the next read
// of this weight reuses).
func (w *streamedWeight) read(a *Attrs, e int) ([]float32, error) {
	if w.t == nil {
		return nil, nil
	}
	n := w.rows * w.cols
	if w.out == nil {
		w.out = make([]float32, n)
	}
	if w.sc != nil { // QMoE: packed codes, their scales, the zero points
		pack := 8 / a.Bits
		rowCodes := w.cols / pack
		chunk := max(1, codeChunk/rowCodes) // rows decoded at a time
		if w.buf == nil {
			k := min(chunk, w.rows) * rowCodes
			w.buf, w.q, w.scales = make([]float32, k), make([]int64, k), make([]float32, w.rows*w.groups)
		}
		if err := w.sc.ReadFloat32(w.scales, e*w.rows*w.groups); err != nil {
			return nil, err
		}
		for r := 0; r < w.rows; r += chunk {
			k := min(chunk, w.rows-r)
			codes := w.buf[:k*rowCodes]
			if err := w.t.ReadFloat32(codes, (e*w.rows+r)*rowCodes); err != nil {
				return nil, err
			}
			q := w.q[:len(codes)]
			for i, v := range codes {
				q[i] = int64(v)
			}
			a.dequantRows(w.out[r*w.cols:], q, w.scales[r*w.groups:], w.zp, e*w.rows+r, k, w.cols, w.groups)
		}
		return w.out, nil
	}
	if !w.legacy {
		if err := w.t.ReadFloat32(w.out, e*n); err != nil {
			return nil, err
		}
		return w.out, nil
	}
	if w.buf == nil {
		w.buf = make([]float32, n)
	}
	if err := w.t.ReadFloat32(w.buf, e*n); err != nil {
		return nil, err
	}
	// stored [cols, rows]: transposed as transposeStack does
	r, c := w.cols, w.rows
	for i := 0; i < r; i++ {
		for j := 0; j < c; j++ {
			w.out[j*r+i] = w.buf[i*c+j]
		}
	}
	return w.out, nil
}

// streamedExperts is a node's experts read one at a time.
type streamedExperts struct {
	E, H, I, f    int
	fc1, fc2, fc3 streamedWeight
	fc1b, fc2b    []float32
	fc3b          []float32
}

// expert returns expert e's matrices and biases.
func (s *streamedExperts) expert(a *Attrs, e int) (expertMats, error) {
	var m expertMats
	var err error
	if m.fc1, err = s.fc1.read(a, e); err != nil {
		return m, fmt.Errorf("fc1 of expert %d: %w", e, err)
	}
	if m.fc2, err = s.fc2.read(a, e); err != nil {
		return m, fmt.Errorf("fc2 of expert %d: %w", e, err)
	}
	if m.fc3, err = s.fc3.read(a, e); err != nil {
		return m, fmt.Errorf("fc3 of expert %d: %w", e, err)
	}
	m.fc1b, m.fc2b, m.fc3b = part(s.fc1b, e, s.f*s.I), part(s.fc2b, e, s.H), part(s.fc3b, e, s.I)
	return m, nil
}

// numel is the number of values of a tensor of shape d.
func numel(d []int64) int64 {
	n := int64(1)
	for _, v := range d {
		n *= v
	}
	return n
}

// floatInput checks that input pos is float (held or streamed).
func floatInput(in TensorSource, pos int) error {
	t := in.get(pos)
	if t != nil && t.F32 == nil && !(t.Streamed() && graph.ElemBits(t.DType) >= 16) {
		return fmt.Errorf("input %d has type %s, want a float type", pos, t.DType)
	}
	return nil
}

// streamedMoE checks a com.microsoft::MoE node's weights as ReadExperts
// does, without reading them.
func (a *Attrs) streamedMoE(in TensorSource) (*streamedExperts, error) {
	d1, d2 := in.Dims(MoEFC1), in.Dims(MoEFC2)
	if len(d1) != 3 || len(d2) != 3 {
		return nil, fmt.Errorf("fc1_experts_weights dims %v and fc2_experts_weights dims %v are not both [E, N, K]", d1, d2)
	}
	E := int(d2[0])
	r, x := in.Dims(MoERouter), in.Dims(MoEInput)
	if len(r) == 0 || len(x) == 0 {
		return nil, fmt.Errorf("router_probs or input is missing")
	}
	H := int(x[len(x)-1])
	if H == 0 || int(d2[1]*d2[2])%H != 0 {
		return nil, fmt.Errorf("fc2_experts_weights dims %v do not fit hidden size %d", d2, H)
	}
	I := int(d2[1]*d2[2]) / H
	f := 1
	if a.fused() {
		f = 2
	}
	legacy := (H != I && int(d2[1]) == I) || (H == I && a.fused() && d1[1] == int64(H))
	s := &streamedExperts{E: E, H: H, I: I, f: f}
	for _, w := range []struct {
		pos        int
		rows, cols int
		dst        *streamedWeight
	}{{MoEFC1, f * I, H, &s.fc1}, {MoEFC2, H, I, &s.fc2}, {MoEFC3, I, H, &s.fc3}} {
		if in.get(w.pos) == nil {
			continue
		}
		if err := floatInput(in, w.pos); err != nil {
			return nil, err
		}
		d := in.Dims(w.pos)
		want := []int64{int64(E), int64(w.rows), int64(w.cols)}
		if legacy {
			want = []int64{int64(E), int64(w.cols), int64(w.rows)}
		}
		if len(d) != 3 || d[0] != want[0] || d[1] != want[1] || d[2] != want[2] {
			return nil, fmt.Errorf("input %d has dims %v, want %v (legacy layout %v)", w.pos, d, want, legacy)
		}
		*w.dst = streamedWeight{t: in.get(w.pos), rows: w.rows, cols: w.cols, legacy: legacy}
	}
	var err error
	if s.fc1b, err = in.Floats(MoEFC1Bias); err != nil {
		return nil, err
	}
	if s.fc2b, err = in.Floats(MoEFC2Bias); err != nil {
		return nil, err
	}
	if s.fc3b, err = in.Floats(MoEFC3Bias); err != nil {
		return nil, err
	}
	if r[len(r)-1] != int64(E) {
		return nil, fmt.Errorf("router_probs dims %v do not end in %d experts", r, E)
	}
	return s, a.checkStreamed(s)
}

// streamedQMoE checks a com.microsoft::QMoE node's weights as
// readQuantized and Dequantize do, without reading them.
func (a *Attrs) streamedQMoE(in TensorSource) (*streamedExperts, error) {
	x, d2 := in.Dims(QInput), in.Dims(QFC2)
	if len(x) == 0 || len(d2) != 3 {
		return nil, fmt.Errorf("input dims %v / fc2_experts_weights dims %v", x, d2)
	}
	pack := 8 / a.Bits
	E, H, I := int(d2[0]), int(x[len(x)-1]), int(d2[2])*pack
	if int(d2[1]) != H {
		return nil, fmt.Errorf("fc2_experts_weights dims %v: want [%d, %d, I/%d]", d2, E, H, pack)
	}
	f := 1
	if a.fused() {
		f = 2
	}
	s := &streamedExperts{E: E, H: H, I: I, f: f}
	for _, w := range []struct {
		name             string
		wPos, sPos, zPos int
		N, K             int
		dst              *streamedWeight
	}{{"fc1", QFC1, QFC1Scales, QFC1Zero, f * I, H, &s.fc1}, {"fc2", QFC2, QFC2Scales, QFC2Zero, H, I, &s.fc2},
		{"fc3", QFC3, QFC3Scales, QFC3Zero, I, H, &s.fc3}} {
		t := in.get(w.wPos)
		if t == nil {
			if w.name != "fc3" {
				return nil, fmt.Errorf("%s: weights are missing", w.name)
			}
			continue
		}
		if t.DType != pb.TensorProto_UINT8 {
			return nil, fmt.Errorf("%s: input %d has type %s, want uint8", w.name, w.wPos, t.DType)
		}
		if d := in.Dims(w.wPos); len(d) != 3 || d[0] != int64(E) || d[1] != int64(w.N) || d[2]*int64(pack) != int64(w.K) {
			return nil, fmt.Errorf("%s: weights have dims %v, want [%d, %d, %d]", w.name, d, E, w.N, w.K/pack)
		}
		sc := in.get(w.sPos)
		if sc == nil {
			return nil, fmt.Errorf("%s: scales are missing", w.name)
		}
		if err := floatInput(in, w.sPos); err != nil {
			return nil, fmt.Errorf("%s: %w", w.name, err)
		}
		groups := 1
		if a.BlockSize > 0 {
			if w.K%a.BlockSize != 0 {
				return nil, fmt.Errorf("%s: input size K %d is not a multiple of block_size %d", w.name, w.K, a.BlockSize)
			}
			groups = w.K / a.BlockSize
		}
		if n := numel(in.Dims(w.sPos)); n != int64(E*w.N*groups) {
			return nil, fmt.Errorf("%s: scales have %d values (dims %v), want %d", w.name, n, in.Dims(w.sPos), E*w.N*groups)
		}
		zp, err := in.Ints(w.zPos)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", w.name, err)
		}
		if zp != nil && len(zp)*pack != E*w.N*groups {
			return nil, fmt.Errorf("%s: zero points have %d bytes, want %d", w.name, len(zp), E*w.N*groups/pack)
		}
		*w.dst = streamedWeight{t: t, rows: w.N, cols: w.K, sc: sc, groups: groups, zp: zp}
	}
	var err error
	for _, b := range []struct {
		pos int
		dst *[]float32
	}{{QFC1Bias, &s.fc1b}, {QFC2Bias, &s.fc2b}, {QFC3Bias, &s.fc3b}} {
		if *b.dst, err = in.Floats(b.pos); err != nil {
			return nil, err
		}
	}
	return s, a.checkStreamed(s)
}

// checkStreamed is Check for weights read one expert at a time.
func (a *Attrs) checkStreamed(s *streamedExperts) error {
	E, H, I, f := s.E, s.H, s.I, s.f
	if a.K < 1 || a.K > E {
		return fmt.Errorf("k %d not in 1..%d experts", a.K, E)
	}
	if s.fc1.t == nil || s.fc2.t == nil {
		return fmt.Errorf("fc1_experts_weights or fc2_experts_weights is missing")
	}
	if s.fc3.t == nil && a.Activation == SwiGLU && a.Fusion == FusionNone {
		return fmt.Errorf("fc3_experts_weights is missing (activation_type %s, swiglu_fusion %d)", a.Activation, a.Fusion)
	}
	for _, b := range []struct {
		name string
		v    []float32
		n    int
	}{{"fc1_experts_bias", s.fc1b, E * f * I}, {"fc2_experts_bias", s.fc2b, E * H}, {"fc3_experts_bias", s.fc3b, E * I}} {
		if b.v != nil && len(b.v) != b.n {
			return fmt.Errorf("%s has %d values, want %d (E=%d H=%d I=%d)", b.name, len(b.v), b.n, E, H, I)
		}
	}
	return nil
}

// evalStreamed runs a node whose expert weights are streamed: the tokens
// are routed, then each expert that some token chose is read once and
// applied to its tokens, and each token's expert outputs are summed in
// the order Forward sums them, so the numbers are Forward's bit for bit.
func (a *Attrs) evalStreamed(n *pb.NodeProto, in []*eval.Tensor) ([]*eval.Tensor, error) {
	src := TensorSource(in)
	fail := func(err error) ([]*eval.Tensor, error) {
		return nil, fmt.Errorf("%s node %q: %w", n.GetOpType(), graph.NodeLabel(n), err)
	}
	var s *streamedExperts
	var err error
	if a.Quantized {
		s, err = a.streamedQMoE(src)
	} else {
		s, err = a.streamedMoE(src)
	}
	if err != nil {
		return fail(err)
	}
	x, r := src.get(0), src.get(1)
	if x == nil || r == nil || x.F32 == nil || r.F32 == nil || len(x.Shape) < 2 || x.Shape[len(x.Shape)-1] != s.H {
		return fail(fmt.Errorf("input must be float [..., %d] and router_probs float [T, %d]", s.H, s.E))
	}
	if a.Quantized && len(in) > QRouterWeights && in[QRouterWeights] != nil {
		return fail(fmt.Errorf("the router_weights input is not supported"))
	}
	T := len(x.F32) / s.H
	y, err := a.forwardStreamed(s, x.F32, r.F32, T)
	if err != nil {
		return fail(err)
	}
	return []*eval.Tensor{eval.NewFloat32(append([]int(nil), x.Shape...), y)}, nil
}

// forwardStreamed is Forward over experts read one at a time.
func (a *Attrs) forwardStreamed(s *streamedExperts, x, router []float32, T int) ([]float32, error) {
	E, H, K := s.E, s.H, a.K
	if len(x) != T*H || len(router) != T*E {
		return nil, fmt.Errorf("input has %d values and router_probs %d, want %d tokens x %d and x %d", len(x), len(router), T, H, E)
	}
	ws := make([][]float32, T)
	users := make([][]int, E) // for each expert, the (token, slot) t·K + j that chose it
	for t := 0; t < T; t++ {
		var ids []int
		ids, ws[t] = a.Route(router[t*E : (t+1)*E])
		for j, e := range ids {
			users[e] = append(users[e], t*K+j)
		}
	}
	contrib := make([]float32, T*K*H)
	bufs := newFFNBufs(s.f, s.I, H)
	for e, us := range users {
		if len(us) == 0 {
			continue
		}
		m, err := s.expert(a, e)
		if err != nil {
			return nil, err
		}
		for _, u := range us {
			t := u / K
			copy(contrib[u*H:(u+1)*H], a.ffn(m, x[t*H:(t+1)*H], bufs))
		}
	}
	out := make([]float32, T*H)
	acc := make([]float64, H)
	for t := 0; t < T; t++ {
		clear(acc)
		for j, w := range ws[t] {
			v := contrib[(t*K+j)*H : (t*K+j+1)*H]
			for c := range acc {
				acc[c] += float64(w) * float64(v[c])
			}
		}
		for c := range acc {
			out[t*H+c] = float32(acc[c])
		}
	}
	return out, nil
}
