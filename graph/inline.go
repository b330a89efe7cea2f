package graph

import (
	"google.golang.org/protobuf/proto"
)

// MarshalInline encodes the model deterministically with every initializer's
// bytes inside the protobuf: external and deferred tensors are read (ranged
// reads of their side files) for the encoding and left as they were after.
// It is for handing a model to a runtime in memory; the result must stay
// under protobuf's 2 GiB limit.
func (m *Model) MarshalInline() ([]byte, error) {
	var restore []func()
	defer func() {
		for i := len(restore) - 1; i >= 0; i-- {
			restore[i]()
		}
	}()
	for _, t := range allInitializers(m.Proto) {
		if _, ok := m.deferred[t]; !ok && !IsExternal(t) {
			continue
		}
		b, err := m.TensorBytes(t)
		if err != nil {
			return nil, err
		}
		restore = append(restore, swapToInline(t, b))
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m.Proto)
	if err != nil {
		return nil, &InputError{File: m.Name(), Msg: "encoding the model", Err: err}
	}
	return b, nil
}
