package eval

import (
	pb "github.com/mokopt/mokopt/graph/onnxpb"

	"github.com/mokopt/mokopt/graph"
)

// Sequence values (ONNX seq(tensor)) are Tensors whose Seq holds the
// elements; SplitToSequence, SequenceAt and the other sequence ops read
// and write them. They are what an unoptimized dynamo export writes for
// torch.split and torch.chunk.

// seq returns input i as a sequence.
func seq(in []*Tensor, i int) ([]*Tensor, error) {
	s, err := need(in, i)
	if err != nil {
		return nil, err
	}
	if s.Seq == nil {
		return nil, errf("input %d is a tensor, not a sequence", i)
	}
	return s.Seq, nil
}

// seqPos returns the position input i names in a sequence of n elements
// (negative counts from the end; end allows n, the insertion point after
// the last), or def when the input is absent.
func seqPos(in []*Tensor, i, n, def int, end bool) (int, error) {
	p := opt(in, i)
	if p == nil {
		return def, nil
	}
	v, err := intsOf(p)
	if err != nil || len(v) != 1 {
		return 0, errf("the position is not one integer")
	}
	pos := int(v[0])
	if pos < 0 {
		pos += n
	}
	hi := n - 1
	if end {
		hi = n
	}
	if pos < 0 || pos > hi {
		return 0, errf("position %d is out of a sequence of %d", v[0], n)
	}
	return pos, nil
}

// newSeq is a sequence of ts.
func newSeq(ts []*Tensor) *Tensor {
	if ts == nil {
		ts = []*Tensor{}
	}
	return &Tensor{Seq: ts}
}

func kSplitToSequence(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	axis, err := normAxis(attrInt(n, "axis", 0), x.Rank())
	if err != nil {
		return nil, err
	}
	dim := x.Shape[axis]
	var sizes []int64
	squeeze := false
	switch s := opt(in, 1); {
	case s == nil: // pieces of one, squeezed unless keepdims
		for range dim {
			sizes = append(sizes, 1)
		}
		squeeze = attrInt(n, "keepdims", 1) == 0
	case s.Rank() == 0:
		v, err := intsOf(s)
		if err != nil || v[0] <= 0 {
			return nil, errf("bad SplitToSequence chunk size")
		}
		for left := int64(dim); left > 0; left -= v[0] {
			sizes = append(sizes, min(v[0], left))
		}
	default:
		if sizes, err = intsOf(s); err != nil {
			return nil, err
		}
	}
	sn := graph.NewNode("Split", "", "", nil, make([]string, len(sizes)), graph.IntAttr("axis", int64(axis)))
	parts, err := kSplit(c, sn, []*Tensor{x, NewInt64([]int{len(sizes)}, sizes)})
	if err != nil {
		return nil, err
	}
	if squeeze {
		for i, p := range parts {
			q := *p
			q.Shape = append(append([]int{}, p.Shape[:axis]...), p.Shape[axis+1:]...)
			parts[i] = &q
		}
	}
	return []*Tensor{newSeq(parts)}, nil
}

func kSequenceAt(_ *OpContext, _ *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	s, err := seq(in, 0)
	if err != nil {
		return nil, err
	}
	if opt(in, 1) == nil {
		return nil, errf("SequenceAt needs a position")
	}
	p, err := seqPos(in, 1, len(s), 0, false)
	if err != nil {
		return nil, err
	}
	return []*Tensor{s[p]}, nil
}

func kSequenceConstruct(_ *OpContext, _ *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	return []*Tensor{newSeq(append([]*Tensor{}, in...))}, nil
}

func kSequenceEmpty(*OpContext, *pb.NodeProto, []*Tensor) ([]*Tensor, error) {
	return []*Tensor{newSeq(nil)}, nil
}

func kSequenceLength(_ *OpContext, _ *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	s, err := seq(in, 0)
	if err != nil {
		return nil, err
	}
	return []*Tensor{NewInt64(nil, []int64{int64(len(s))})}, nil
}

func kSequenceInsert(_ *OpContext, _ *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	s, err := seq(in, 0)
	if err != nil {
		return nil, err
	}
	t, err := need(in, 1)
	if err != nil {
		return nil, err
	}
	p, err := seqPos(in, 2, len(s), len(s), true)
	if err != nil {
		return nil, err
	}
	out := append(append(append([]*Tensor{}, s[:p]...), t), s[p:]...)
	return []*Tensor{newSeq(out)}, nil
}

func kSequenceErase(_ *OpContext, _ *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	s, err := seq(in, 0)
	if err != nil {
		return nil, err
	}
	if len(s) == 0 {
		return nil, errf("SequenceErase of an empty sequence")
	}
	p, err := seqPos(in, 1, len(s), len(s)-1, false)
	if err != nil {
		return nil, err
	}
	out := append(append([]*Tensor{}, s[:p]...), s[p+1:]...)
	return []*Tensor{newSeq(out)}, nil
}

func kConcatFromSequence(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	s, err := seq(in, 0)
	if err != nil {
		return nil, err
	}
	if len(s) == 0 {
		return nil, errf("ConcatFromSequence of an empty sequence")
	}
	axis := attrInt(n, "axis", 0)
	parts := s
	if attrInt(n, "new_axis", 0) != 0 { // stacked: each element gets the axis
		r := s[0].Rank() + 1
		a, err := normAxis(axis, r)
		if err != nil {
			return nil, err
		}
		parts = make([]*Tensor, len(s))
		for i, t := range s {
			q := *t
			q.Shape = append(append(append([]int{}, t.Shape[:a]...), 1), t.Shape[a:]...)
			parts[i] = &q
		}
		axis = int64(a)
	}
	return kConcat(c, graph.NewNode("Concat", "", "", nil, []string{""}, graph.IntAttr("axis", axis)), parts)
}

func init() {
	builtin("", kSplitToSequence, "SplitToSequence")
	builtin("", kSequenceAt, "SequenceAt")
	builtin("", kSequenceConstruct, "SequenceConstruct")
	builtin("", kSequenceEmpty, "SequenceEmpty")
	builtin("", kSequenceLength, "SequenceLength")
	builtin("", kSequenceInsert, "SequenceInsert")
	builtin("", kSequenceErase, "SequenceErase")
	builtin("", kConcatFromSequence, "ConcatFromSequence")
}
