package graph

import (
	"fmt"
	"io"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// lateInline stores tensors inline in an encoded model without holding
// their bytes: each large one gets a placeholder raw_data of its length
// (zero pages that are never touched), so that sizes are right, and the
// stream encoder writes its real bytes from its producer (a deferred
// tensor's writer, or a ranged read of its side file) when it reaches it.
// Small tensors are read into memory as they are.
type lateInline struct {
	producers map[*pb.TensorProto]func(io.Writer) error
	release   []func()
}

// inlineLate makes ts (deferred or external tensors) inline for the next
// encoding; undo restores them and frees the placeholders.
func (m *Model) inlineLate(ts []*pb.TensorProto) (li *lateInline, undo func(), err error) {
	li = &lateInline{producers: map[*pb.TensorProto]func(io.Writer) error{}}
	var restore []func()
	undo = func() {
		for i := len(restore) - 1; i >= 0; i-- {
			restore[i]()
		}
		for _, r := range li.release {
			r()
		}
	}
	type late struct {
		t *pb.TensorProto
		n int64
		p func(io.Writer) error
	}
	var big []late
	var most int64
	for _, t := range ts {
		n, err := m.tensorSize(t)
		if err != nil {
			undo()
			return nil, nil, err
		}
		if n < int64(streamBig) || n > MaxTensorBytes {
			b, err := m.TensorBytes(t)
			if err != nil {
				undo()
				return nil, nil, err
			}
			restore = append(restore, swapToInline(t, b))
			continue
		}
		var p func(io.Writer) error
		if d, ok := m.Deferred(t); ok {
			p = d.Write
		} else {
			r, _, err := m.TensorReader(t) // a ranged reader of the side file, opened now
			if err != nil {
				undo()
				return nil, nil, err
			}
			p = func(w io.Writer) error { _, err := io.CopyN(w, r, n); return err }
		}
		big = append(big, late{t, n, p})
		most = max(most, n)
	}
	if len(big) > 0 {
		ph, free, err := zeroPages(int(most))
		if err != nil {
			undo()
			return nil, nil, err
		}
		li.release = append(li.release, free)
		for _, l := range big {
			restore = append(restore, swapToInline(l.t, ph[:l.n]))
			n, p := l.n, l.p
			li.producers[l.t] = func(w io.Writer) error {
				cw := &countWriter{w: w}
				if err := p(cw); err != nil {
					return err
				}
				if cw.n != n {
					return fmt.Errorf("initializer %q: its data came to %d bytes, want %d", l.t.GetName(), cw.n, n)
				}
				return nil
			}
		}
	}
	return li, undo, nil
}
