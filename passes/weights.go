package passes

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// Parts of a projection's output rows taken from a fused gate_up weight.
const (
	PartWhole = iota
	PartFirstHalf
	PartSecondHalf
	PartEven
	PartOdd
)

// Proj says where one expert's matrix (or bias vector) lives in the source
// model: an initializer, the expert's index along its first axis (-1 when
// the initializer holds one expert only), whether it is stored [in, out]
// rather than [out, in], and which rows of the output axis it covers.
type Proj struct {
	Init   *pb.TensorProto
	Expert int
	InOut  bool
	Part   int
}

// ExpertProj are the sources of one routed expert's weights.
type ExpertProj struct {
	Gate, Up, Down    *Proj
	GateB, UpB, DownB *Proj
}

// WeightPlan lists every weight source of a block.
type WeightPlan struct {
	Router        Proj
	RouterB, Corr *Proj
	Experts       []ExpertProj // indexed by expert id
	SharedGate    *Proj
	SharedUp      *Proj
	SharedDown    *Proj
	SharedGateW   *Proj
}

// Inits lists the source initializers the plan reads (for provenance).
func (p *WeightPlan) Inits() []*pb.TensorProto {
	seen := map[*pb.TensorProto]bool{}
	var out []*pb.TensorProto
	add := func(q *Proj) {
		if q != nil && q.Init != nil && !seen[q.Init] {
			seen[q.Init] = true
			out = append(out, q.Init)
		}
	}
	add(&p.Router)
	add(p.RouterB)
	add(p.Corr)
	for i := range p.Experts {
		e := &p.Experts[i]
		for _, q := range []*Proj{e.Gate, e.Up, e.Down, e.GateB, e.UpB, e.DownB} {
			add(q)
		}
	}
	for _, q := range []*Proj{p.SharedGate, p.SharedUp, p.SharedDown, p.SharedGateW} {
		add(q)
	}
	return out
}

// matrix extracts the [out, in] matrix (rows x cols = out x in) of a
// projection as float32, with out rows before taking Part.
func (q *Proj) matrix(m *graph.Model, cache map[*pb.TensorProto][]float32) (data []float32, out, in int, err error) {
	all, err := floats(m, q.Init, cache)
	if err != nil {
		return nil, 0, 0, err
	}
	d := q.Init.GetDims()
	var r, cc int
	off := 0
	switch {
	case q.Expert >= 0 && len(d) == 3:
		r, cc = int(d[1]), int(d[2])
		off = q.Expert * r * cc
	case q.Expert < 0 && len(d) == 2:
		r, cc = int(d[0]), int(d[1])
	default:
		return nil, 0, 0, fmt.Errorf("initializer %q has dims %v, not a matrix per expert", q.Init.GetName(), d)
	}
	if q.Expert >= 0 && int64(q.Expert) >= d[0] || off+r*cc > len(all) {
		return nil, 0, 0, fmt.Errorf("initializer %q has dims %v: no matrix for expert %d", q.Init.GetName(), d, q.Expert)
	}
	outM, rows, cols := canonical(all[off:off+r*cc], r, cc, q.InOut, q.Part)
	return outM, rows, cols, nil
}

// vector extracts one expert's bias vector (with Part applied).
func (q *Proj) vector(m *graph.Model, cache map[*pb.TensorProto][]float32) ([]float32, error) {
	all, err := floats(m, q.Init, cache)
	if err != nil {
		return nil, err
	}
	d := q.Init.GetDims()
	if len(d) == 0 {
		return nil, fmt.Errorf("bias %q is a scalar, not a vector", q.Init.GetName())
	}
	n := int(d[len(d)-1])
	off := 0
	if q.Expert >= 0 {
		if len(d) != 2 {
			return nil, fmt.Errorf("bias %q has dims %v, want [experts, n]", q.Init.GetName(), d)
		}
		off = q.Expert * n
	}
	if q.Expert >= 0 && int64(q.Expert) >= d[0] || off+n > len(all) {
		return nil, fmt.Errorf("bias %q has dims %v: no vector for expert %d", q.Init.GetName(), d, q.Expert)
	}
	src := all[off : off+n]
	var out []float32
	for _, i := range partRows(q.Part, n) {
		out = append(out, src[i])
	}
	return out, nil
}

// partLen is len(partRows(part, r)).
func partLen(part, r int) int {
	switch part {
	case PartFirstHalf, PartOdd:
		return r / 2
	case PartSecondHalf:
		return r - r/2
	case PartEven:
		return (r + 1) / 2
	}
	return r
}

func partRows(part, r int) []int {
	rows := make([]int, 0, partLen(part, r))
	switch part {
	case PartFirstHalf:
		for i := 0; i < r/2; i++ {
			rows = append(rows, i)
		}
	case PartSecondHalf:
		for i := r / 2; i < r; i++ {
			rows = append(rows, i)
		}
	case PartEven:
		for i := 0; i < r; i += 2 {
			rows = append(rows, i)
		}
	case PartOdd:
		for i := 1; i < r; i += 2 {
			rows = append(rows, i)
		}
	default:
		for i := 0; i < r; i++ {
			rows = append(rows, i)
		}
	}
	return rows
}

func floats(m *graph.Model, t *pb.TensorProto, cache map[*pb.TensorProto][]float32) ([]float32, error) {
	if f, ok := cache[t]; ok {
		return f, nil
	}
	b, err := m.TensorBytes(t)
	if err != nil {
		return nil, err
	}
	if graph.IsExternal(t) && graph.DataType(t) == pb.TensorProto_FLOAT {
		if f, ok := eval.Float32View(b); ok { // external data is read into a fresh buffer
			cache[t] = f
			return f, nil
		}
	}
	f, err := graph.DecodeFloat32(graph.DataType(t), b)
	if err != nil {
		return nil, fmt.Errorf("initializer %q: %w", t.GetName(), err)
	}
	cache[t] = f
	return f, nil
}

// values returns a fused tensor's float32 contents in memory: from w when
// the block's weights were materialized, else read now.
func (ft *fusedTensor) values(m *graph.Model, w *moe.Weights, cache map[*pb.TensorProto][]float32) ([]float32, error) {
	if w != nil {
		switch ft.role {
		case "router_weight":
			return w.RouterW, nil
		case "router_bias":
			return w.RouterB, nil
		case "router_correction_bias":
			return w.CorrectionBias, nil
		case "gate":
			return w.Gate, nil
		case "up":
			return w.Up, nil
		case "down":
			return w.Down, nil
		case "gate_bias":
			return w.GateB, nil
		case "up_bias":
			return w.UpB, nil
		case "down_bias":
			return w.DownB, nil
		case "shared_gate":
			return w.SharedGate, nil
		case "shared_up":
			return w.SharedUp, nil
		case "shared_down":
			return w.SharedDown, nil
		case "shared_gate_weight":
			return w.SharedGateW, nil
		}
	}
	var out []float32
	for _, q := range ft.projs {
		var v []float32
		var err error
		if ft.isVec {
			v, err = q.vector(m, cache)
		} else {
			v, _, _, err = q.matrix(m, cache)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v...)
	}
	return out, nil
}

// Materialize reads the plan's sources and returns the block's weights in
// canonical layout.
func (p *WeightPlan) Materialize(m *graph.Model, s *moe.Spec) (*moe.Weights, error) {
	cache := map[*pb.TensorProto][]float32{}
	w := &moe.Weights{}
	var err error
	if w.RouterW, _, _, err = p.Router.matrix(m, cache); err != nil {
		return nil, err
	}
	vec := func(q *Proj) ([]float32, error) {
		if q == nil {
			return nil, nil
		}
		return q.vector(m, cache)
	}
	if w.RouterB, err = vec(p.RouterB); err != nil {
		return nil, err
	}
	if w.CorrectionBias, err = vec(p.Corr); err != nil {
		return nil, err
	}
	E, H, I := s.StoredExperts(), s.Hidden, s.Inter
	if len(p.Experts) != E {
		return nil, fmt.Errorf("weight plan has %d experts, spec %d", len(p.Experts), E)
	}
	stack := func(get func(e *ExpertProj) *Proj, rows, cols int, isVec bool) ([]float32, error) {
		if get(&p.Experts[0]) == nil {
			return nil, nil
		}
		out := make([]float32, 0, E*rows*max(cols, 1))
		for e := range p.Experts {
			q := get(&p.Experts[e])
			if q == nil {
				return nil, fmt.Errorf("expert %d lacks a weight the others have", e)
			}
			if isVec {
				v, err := q.vector(m, cache)
				if err != nil {
					return nil, err
				}
				if len(v) != rows {
					return nil, fmt.Errorf("expert %d bias %q has %d values, want %d", e, q.Init.GetName(), len(v), rows)
				}
				out = append(out, v...)
				continue
			}
			d, r, cc, err := q.matrix(m, cache)
			if err != nil {
				return nil, err
			}
			if r != rows || cc != cols {
				return nil, fmt.Errorf("expert %d weight %q is [%d, %d] (out, in), want [%d, %d]", e, q.Init.GetName(), r, cc, rows, cols)
			}
			out = append(out, d...)
		}
		return out, nil
	}
	if w.Gate, err = stack(func(e *ExpertProj) *Proj { return e.Gate }, I, H, false); err != nil {
		return nil, err
	}
	if w.Up, err = stack(func(e *ExpertProj) *Proj { return e.Up }, I, H, false); err != nil {
		return nil, err
	}
	if w.Down, err = stack(func(e *ExpertProj) *Proj { return e.Down }, H, I, false); err != nil {
		return nil, err
	}
	if w.GateB, err = stack(func(e *ExpertProj) *Proj { return e.GateB }, I, 0, true); err != nil {
		return nil, err
	}
	if w.UpB, err = stack(func(e *ExpertProj) *Proj { return e.UpB }, I, 0, true); err != nil {
		return nil, err
	}
	if w.DownB, err = stack(func(e *ExpertProj) *Proj { return e.DownB }, H, 0, true); err != nil {
		return nil, err
	}
	if s.SharedInter > 0 {
		if w.SharedGate, _, _, err = p.SharedGate.matrix(m, cache); err != nil {
			return nil, err
		}
		if w.SharedUp, _, _, err = p.SharedUp.matrix(m, cache); err != nil {
			return nil, err
		}
		if w.SharedDown, _, _, err = p.SharedDown.matrix(m, cache); err != nil {
			return nil, err
		}
		if p.SharedGateW != nil {
			if w.SharedGateW, _, _, err = p.SharedGateW.matrix(m, cache); err != nil {
				return nil, err
			}
		}
	}
	return w, nil
}
