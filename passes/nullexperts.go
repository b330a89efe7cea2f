package passes

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// Null experts: router outputs that no expert computes and whose
// selections contribute nothing. The router scores E + Z columns, its
// top-k (and the renormalisation of the k weights) runs over all of them,
// and a token slot that chose one of the last Z contributes zero to the
// combine: the graph has branches for experts 0..E−1 only, and nothing of
// the block's input reaches the output through a selection but through an
// expert. ai.mok::MoE expresses that as Z experts with zero weights after
// the E real ones (num_experts E + Z): a zero down projection without a
// bias writes zero whatever the activation makes of its input, so the
// fused node computes exactly what the graph does, on every target (see
// fused-op.md for the choice). Experts without matmuls that pass their
// tokens through (LongCat-Flash's zero-computation experts, x times the
// routing weight) are not null: their selections reach the output.

// nullExperts returns Z when the experts missing from an unrolled block
// (seen: the expert ids its branches compute, of E router outputs) are
// null experts: exactly the last Z ids, at least one real expert before
// them, and no value of the block's input, selected by the router, that
// reaches the output without passing an expert's matmul (passesThrough).
// It returns 0 otherwise.
func (c *ctx) nullExperts(b *Block, tk *pb.NodeProto, seen map[int]bool, E int) int {
	z := 0
	for e := E - 1; e >= 0 && !seen[e]; e-- {
		z++
	}
	for e := 0; e < E-z; e++ {
		if !seen[e] {
			return 0
		}
	}
	if z == 0 || z == E || c.passesThrough(b, tk) {
		return 0
	}
	return z
}

// passesThrough reports whether a node of b's region computes on the
// block input's data (not only on its shape, and not only through a
// matmul with a constant weight: the router linear or an expert), depends
// on the selection tk, and leads to no matmul with a constant weight:
// data of the input that the routing picks and that reaches the output
// without expert compute.
func (c *ctx) passesThrough(b *Block, tk *pb.NodeProto) bool {
	ps, in := sortedSet(c.blockPos(b)) // sharedfront.go
	d := c.d
	xs := map[int32]bool{}
	for _, j := range c.valueIDs(b.Input, b.Router) {
		xs[j] = true
	}
	tkPos, _ := c.posOf(tk)
	data, sel := map[int32]bool{}, map[int32]bool{tkPos: true}
	for _, p := range ps {
		op := c.topo[p].GetOpType()
		shapeOnly := op == "Shape" || op == "Size" || op == "ConstantOfShape"
		for e := d.inOff[p]; e < d.inOff[p+1]; e++ {
			q := d.inPred[e]
			if q >= 0 && in[q] && sel[q] {
				sel[p] = true
			}
			if !shapeOnly && !c.weightMatMulAt(p) && (xs[d.inVal[e]] || q >= 0 && in[q] && data[q]) {
				data[p] = true
			}
		}
	}
	feeds := map[int32]bool{} // leads to a matmul with a constant weight
	for i := len(ps) - 1; i >= 0; i-- {
		p := ps[i]
		for _, o := range d.outVal[d.outOff[p]:d.outOff[p+1]] {
			if o < 0 {
				continue
			}
			for _, q := range d.consumers(o) {
				if in[q] && (c.weightMatMulAt(q) || feeds[q]) {
					feeds[p] = true
				}
			}
		}
		if data[p] && sel[p] && !feeds[p] {
			return true
		}
	}
	return false
}

// padNullExperts gives the last b.NullExperts experts of plan zero
// weights shaped as expert 0's: a zero matrix (or bias vector) for each
// projection expert 0 has, in its element type, read once for all of
// them. The zero tensors are no initializers of the model; the fused
// tensors are made from them as from any source.
func padNullExperts(plan *WeightPlan, z int) error {
	if z == 0 {
		return nil
	}
	e0 := &plan.Experts[0]
	zero := func(q *Proj, isVec bool) (*Proj, error) {
		if q == nil {
			return nil, nil
		}
		rows, cols, err := q.shape(isVec)
		if err != nil {
			return nil, err
		}
		dims := []int64{int64(rows), int64(cols)}
		if isVec {
			dims = dims[:1]
		}
		dt := graph.DataType(q.Init)
		n, err := graph.ByteSize(dt, dims)
		if err != nil {
			return nil, err
		}
		t := &pb.TensorProto{Name: proto.String(q.Init.GetName() + "/null_expert"), Dims: dims, DataType: proto.Int32(int32(dt)), RawData: make([]byte, n)}
		return &Proj{Init: t, Expert: -1}, nil
	}
	var pad ExpertProj
	var err error
	for _, r := range []struct {
		src   *Proj
		dst   **Proj
		isVec bool
	}{{e0.Gate, &pad.Gate, false}, {e0.Up, &pad.Up, false}, {e0.Down, &pad.Down, false}, {e0.GateB, &pad.GateB, true}, {e0.UpB, &pad.UpB, true}, {e0.DownB, &pad.DownB, true}} {
		if *r.dst, err = zero(r.src, r.isVec); err != nil {
			return err
		}
	}
	for e := len(plan.Experts) - z; e < len(plan.Experts); e++ {
		plan.Experts[e] = pad
	}
	return nil
}
