package passes

import (
	"bytes"
	"fmt"
	"io"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// fusedTensor is one weight input of a fused node: the projections whose
// canonical rows it concatenates, in order (one per expert for the routed
// experts, one for the router and the shared expert).
type fusedTensor struct {
	role  string
	dims  []int64
	projs []*Proj
	isVec bool
	// rows, cols: the canonical shape each projection must have (0: not checked).
	rows, cols int
	// dt is the element type the tensor is stored in: FLOAT, or the half
	// type its sources share (keepHalfWeights); 0 means FLOAT.
	dt pb.TensorProto_DataType
}

// dtype is the element type the fused tensor is stored in.
func (ft *fusedTensor) dtype() pb.TensorProto_DataType {
	if ft.dt == pb.TensorProto_UNDEFINED {
		return pb.TensorProto_FLOAT
	}
	return ft.dt
}

// halfMatrixRoles are the fused tensors that keep their sources' half
// type: the routed and shared expert matrices, which are copied, never
// computed on (the router and the biases are float32 in the contract).
var halfMatrixRoles = map[string]bool{"gate": true, "up": true, "down": true, "shared_gate": true, "shared_up": true, "shared_down": true}

// keepHalfWeights stores the expert matrices of ts in the half type that
// every one of their sources has (FLOAT16 or BFLOAT16), as they were
// exported, instead of widening them to float32, and returns the
// Spec.WeightType that says so ("" when the sources are float32 or mixed:
// the matrices are then float32).
func keepHalfWeights(ts []fusedTensor) string {
	dt := pb.TensorProto_UNDEFINED
	for i := range ts {
		if !halfMatrixRoles[ts[i].role] {
			continue
		}
		for _, q := range ts[i].projs {
			switch d := graph.DataType(q.Init); {
			case d != pb.TensorProto_FLOAT16 && d != pb.TensorProto_BFLOAT16, dt != pb.TensorProto_UNDEFINED && d != dt:
				return ""
			default:
				dt = d
			}
		}
	}
	wt, _ := moe.IOTypeOf(dt)
	if dt == pb.TensorProto_UNDEFINED || wt == "" {
		return ""
	}
	for i := range ts {
		if halfMatrixRoles[ts[i].role] {
			ts[i].dt = dt
		}
	}
	return wt
}

// fusedTensors lists the fused node's weight inputs in the order emit adds
// them; absent optional inputs have no projections.
func (p *WeightPlan) fusedTensors(s *moe.Spec) ([]fusedTensor, error) {
	E, H, I, Is := s.StoredExperts(), s.Hidden, s.Inter, s.SharedInter
	if len(p.Experts) != E {
		return nil, fmt.Errorf("weight plan has %d experts, spec %d", len(p.Experts), E)
	}
	one := func(q *Proj) []*Proj {
		if q == nil {
			return nil
		}
		return []*Proj{q}
	}
	perExpert := func(get func(e *ExpertProj) *Proj) ([]*Proj, error) {
		if get(&p.Experts[0]) == nil {
			return nil, nil
		}
		out := make([]*Proj, E)
		for e := range p.Experts {
			if out[e] = get(&p.Experts[e]); out[e] == nil {
				return nil, fmt.Errorf("expert %d lacks a weight the others have", e)
			}
		}
		return out, nil
	}
	e64, h64, i64, is64 := int64(E), int64(H), int64(I), int64(Is)
	er := int64(s.NumExperts) // the router always scores every expert
	ts := []fusedTensor{
		{role: "router_weight", dims: []int64{er, h64}, projs: []*Proj{&p.Router}},
		{role: "router_bias", dims: []int64{er}, projs: one(p.RouterB), isVec: true},
		{role: "router_correction_bias", dims: []int64{er}, projs: one(p.Corr), isVec: true},
	}
	for _, r := range []struct {
		role       string
		dims       []int64
		get        func(e *ExpertProj) *Proj
		rows, cols int
		isVec      bool
	}{
		{"gate", []int64{e64, i64, h64}, func(e *ExpertProj) *Proj { return e.Gate }, I, H, false},
		{"up", []int64{e64, i64, h64}, func(e *ExpertProj) *Proj { return e.Up }, I, H, false},
		{"down", []int64{e64, h64, i64}, func(e *ExpertProj) *Proj { return e.Down }, H, I, false},
		{"gate_bias", []int64{e64, i64}, func(e *ExpertProj) *Proj { return e.GateB }, I, 0, true},
		{"up_bias", []int64{e64, i64}, func(e *ExpertProj) *Proj { return e.UpB }, I, 0, true},
		{"down_bias", []int64{e64, h64}, func(e *ExpertProj) *Proj { return e.DownB }, H, 0, true},
	} {
		projs, err := perExpert(r.get)
		if err != nil {
			return nil, err
		}
		ts = append(ts, fusedTensor{role: r.role, dims: r.dims, projs: projs, isVec: r.isVec, rows: r.rows, cols: r.cols})
	}
	if Is > 0 {
		ts = append(ts,
			fusedTensor{role: "shared_gate", dims: []int64{is64, h64}, projs: one(p.SharedGate)},
			fusedTensor{role: "shared_up", dims: []int64{is64, h64}, projs: one(p.SharedUp)},
			fusedTensor{role: "shared_down", dims: []int64{h64, is64}, projs: one(p.SharedDown)},
			fusedTensor{role: "shared_gate_weight", dims: []int64{1, h64}, projs: one(p.SharedGateW)})
	}
	return ts, nil
}

// shape returns the canonical [out, in] shape of a projection's matrix (or
// the length of its vector, cols 0) from the initializer's dims alone, with
// Materialize's errors.
func (q *Proj) shape(isVec bool) (rows, cols int, err error) {
	d := q.Init.GetDims()
	if isVec {
		if len(d) == 0 {
			return 0, 0, fmt.Errorf("bias %q is a scalar, not a vector", q.Init.GetName())
		}
		n := int(d[len(d)-1])
		if q.Expert >= 0 && len(d) != 2 {
			return 0, 0, fmt.Errorf("bias %q has dims %v, want [experts, n]", q.Init.GetName(), d)
		}
		if q.Expert >= 0 && int64(q.Expert) >= d[0] {
			return 0, 0, fmt.Errorf("bias %q has dims %v: no vector for expert %d", q.Init.GetName(), d, q.Expert)
		}
		return partLen(q.Part, n), 0, nil
	}
	var r, cc int
	switch {
	case q.Expert >= 0 && len(d) == 3:
		if int64(q.Expert) >= d[0] {
			return 0, 0, fmt.Errorf("initializer %q has dims %v: no matrix for expert %d", q.Init.GetName(), d, q.Expert)
		}
		r, cc = int(d[1]), int(d[2])
	case q.Expert < 0 && len(d) == 2:
		r, cc = int(d[0]), int(d[1])
	default:
		return 0, 0, fmt.Errorf("initializer %q has dims %v, not a matrix per expert", q.Init.GetName(), d)
	}
	if q.InOut {
		r, cc = cc, r
	}
	return partLen(q.Part, r), cc, nil
}

// check validates a fused tensor without reading weight bytes: shapes,
// element types, that external data lies inside its file and that inline
// data fits its dims, once per source tensor. A deferred source is not
// run: its size was given when it was registered.
func (ft *fusedTensor) check(m *graph.Model) error {
	seen := map[*pb.TensorProto]bool{}
	for e, q := range ft.projs {
		r, cc, err := q.shape(ft.isVec)
		if err != nil {
			return err
		}
		switch {
		case ft.isVec && ft.rows > 0 && r != ft.rows:
			return fmt.Errorf("expert %d bias %q has %d values, want %d", e, q.Init.GetName(), r, ft.rows)
		case !ft.isVec && ft.rows > 0 && (r != ft.rows || cc != ft.cols):
			return fmt.Errorf("expert %d weight %q is [%d, %d] (out, in), want [%d, %d]", e, q.Init.GetName(), r, cc, ft.rows, ft.cols)
		}
		if _, err := graph.DecodeFloat32(graph.DataType(q.Init), nil); err != nil {
			return fmt.Errorf("initializer %q: %w", q.Init.GetName(), err)
		}
		if _, deferred := m.Deferred(q.Init); deferred || seen[q.Init] {
			continue
		}
		seen[q.Init] = true
		if graph.IsExternal(q.Init) {
			if _, _, err := m.TensorReader(q.Init); err != nil {
				return err
			}
		} else if _, err := m.TensorBytes(q.Init); err != nil {
			return err
		}
	}
	return nil
}

// external reports whether any source of the tensor is stored in a side
// file, itself or through the deferred producer that makes it (weights
// dequantized from a side file's codes): then the fused tensor is
// streamed into the output's side file when the model is saved instead of
// being built in memory.
func (ft *fusedTensor) external(m *graph.Model) bool {
	for _, q := range ft.projs {
		if d, ok := m.Deferred(q.Init); ok && !d.Inline || graph.IsExternal(q.Init) {
			return true
		}
	}
	return false
}

// size is the number of bytes the tensor holds.
func (ft *fusedTensor) size() int64 {
	var n int64
	elem := int64(graph.ElemBits(ft.dtype()) / 8)
	for _, q := range ft.projs {
		r, cc, _ := q.shape(ft.isVec)
		n += elem * int64(r) * int64(max(cc, 1))
	}
	return n
}

// deferTo adds the tensor to g as an initializer named name whose bytes
// are produced while m is saved: projection by projection, each a ranged
// read of its source (a plain range copy when the source already holds
// float32 [out, in] rows), so memory stays bounded by one expert's matrix.
func (ft *fusedTensor) deferTo(m *graph.Model, g *graph.Graph, name string) {
	t := &pb.TensorProto{Dims: ft.dims, DataType: proto.Int32(int32(ft.dtype())), Name: proto.String(name)}
	// The sources as they are now: a source that other nodes still read
	// may be moved to the output's side file while the model is saved,
	// before this tensor is written.
	projs, isVec, dt := make([]*Proj, len(ft.projs)), ft.isVec, ft.dtype()
	for i, q := range ft.projs {
		c := *q
		c.Init = sourceSnapshot(m, q.Init)
		projs[i] = &c
	}
	write := func(w io.Writer) error {
		for _, q := range projs {
			if err := q.writeCanonical(m, w, isVec, dt); err != nil {
				return err
			}
		}
		return nil
	}
	g.AddInitializer(t)
	m.SetDeferred(t, graph.DeferredData{Size: ft.size(), Write: write, Inline: !ft.external(m)})
}

// sourceSnapshot returns a shallow copy of t that keeps naming its data
// where it is now (its raw or typed data slices, or its side-file location),
// whatever a save does to t itself; a deferred t is its own snapshot.
func sourceSnapshot(m *graph.Model, t *pb.TensorProto) *pb.TensorProto {
	if _, ok := m.Deferred(t); ok {
		return t
	}
	return &pb.TensorProto{
		Name: t.Name, Dims: t.Dims, DataType: t.DataType, Segment: t.Segment,
		RawData: t.RawData, FloatData: t.FloatData, Int32Data: t.Int32Data, StringData: t.StringData,
		Int64Data: t.Int64Data, DoubleData: t.DoubleData, Uint64Data: t.Uint64Data,
		DataLocation: t.DataLocation, ExternalData: t.ExternalData,
	}
}

// writeCanonical writes the projection's canonical rows (what matrix or
// vector return) as little-endian values of type out (FLOAT, or the
// source's own half type), reading only its expert's slab.
func (q *Proj) writeCanonical(m *graph.Model, w io.Writer, isVec bool, out pb.TensorProto_DataType) error {
	dt := graph.DataType(q.Init)
	elem := int64(graph.ElemBits(dt) / 8)
	d := q.Init.GetDims()
	if isVec {
		n := d[len(d)-1]
		off := int64(0)
		if q.Expert >= 0 {
			off = int64(q.Expert) * n
		}
		src, err := readFloats(m, q.Init, off*elem, n*elem)
		if err != nil {
			return err
		}
		start, step, k := partRange(q.Part, int(n))
		v := make([]float32, k)
		for i := range v {
			v[i] = src[start+i*step]
		}
		return writeFloatsAs(w, v, out)
	}
	var r, cc int64
	off := int64(0)
	if q.Expert >= 0 {
		r, cc = d[1], d[2]
		off = int64(q.Expert) * r * cc
	} else {
		r, cc = d[0], d[1]
	}
	if dt == out && !q.InOut {
		// [out, in] rows of the output's type: the kept rows are byte
		// ranges of the source, copied as they are (one range for a whole
		// matrix or a half of it).
		start, step, k := partRange(q.Part, int(r))
		if step == 1 {
			return m.CopyTensorRange(w, q.Init, elem*(off+int64(start)*cc), elem*int64(k)*cc)
		}
		// Interleaved rows: one read of the slab, its kept rows written.
		var buf bytes.Buffer
		buf.Grow(int(elem * r * cc))
		if err := m.CopyTensorRange(&buf, q.Init, elem*off, elem*r*cc); err != nil {
			return err
		}
		src, rowBytes := buf.Bytes(), int(elem*cc)
		rows := make([]byte, 0, k*rowBytes)
		for i := 0; i < k; i++ {
			row := start + i*step
			rows = append(rows, src[row*rowBytes:(row+1)*rowBytes]...)
		}
		_, err := w.Write(rows)
		return err
	}
	src, err := readFloats(m, q.Init, off*elem, r*cc*elem)
	if err != nil {
		return err
	}
	return writeFloatsAs(w, appendRows(nil, src, int(r), int(cc), q.InOut, q.Part), out)
}

func readFloats(m *graph.Model, t *pb.TensorProto, off, n int64) ([]float32, error) {
	var buf bytes.Buffer
	buf.Grow(int(n))
	if err := m.CopyTensorRange(&buf, t, off, n); err != nil {
		return nil, err
	}
	f, err := graph.DecodeFloat32(graph.DataType(t), buf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("initializer %q: %w", t.GetName(), err)
	}
	return f, nil
}

// writeFloatsAs writes v as little-endian values of type dt: FLOAT, or
// FLOAT16 or BFLOAT16 (exact for values read from that type).
func writeFloatsAs(w io.Writer, v []float32, dt pb.TensorProto_DataType) error {
	const chunk = 1 << 16
	width := graph.ElemBits(dt) / 8
	buf := make([]byte, width*min(len(v), chunk))
	for len(v) > 0 {
		k := min(len(v), chunk)
		if err := graph.EncodeFloat32Into(dt, buf[:width*k], v[:k]); err != nil {
			return fmt.Errorf("fused weights: %w", err)
		}
		if _, err := w.Write(buf[:width*k]); err != nil {
			return err
		}
		v = v[k:]
	}
	return nil
}
