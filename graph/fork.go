package graph

import (
	"errors"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// ErrForkDeferred is returned by Fork for a model holding deferred tensors,
// whose producers may read messages of the model itself.
var ErrForkDeferred = errors.New("a model with deferred tensors cannot be forked")

// Fork returns a copy of m that shares no message with it, so that m and
// the copy can be read and edited on separate goroutines: every message is
// cloned except the bytes of the tensors' raw data, which both share (no
// pass or writer edits tensor bytes in place: they replace a tensor's data
// instead). Forking thus costs time linear in the number of messages and
// copies no weight.
//
// The copy reads m's side files through m's handles: it stays valid as long
// as m is open, and closing it does nothing. m must not be used by another
// goroutine while it is forked.
func (m *Model) Fork() (*Model, error) {
	if len(m.deferred) > 0 {
		return nil, ErrForkDeferred
	}
	ts := allTensors(m.Proto)
	raw := make([][]byte, len(ts))
	for i, t := range ts {
		raw[i], t.RawData = t.RawData, nil
	}
	mp := proto.Clone(m.Proto).(*pb.ModelProto)
	for i, t := range ts {
		t.RawData = raw[i]
	}
	fs := allTensors(mp)
	if len(fs) != len(ts) {
		// allTensors walks both messages the same way; differing counts
		// would mean the clone is not the model.
		return nil, errors.New("fork: the copy's tensors differ from the model's")
	}
	for i, t := range fs {
		t.RawData = raw[i]
	}
	return &Model{Proto: mp, Path: m.Path, Dir: m.Dir, ext: m.ext, borrowed: true, srcID: m.srcID, srcOK: m.srcOK}, nil
}
