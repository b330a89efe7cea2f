package graph

import (
	"fmt"
	"io"
	"slices"
	"sync"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// streamBig is the size from which a message is written field by field and
// a bytes field (a tensor's raw_data) is written straight from its slice;
// anything smaller is encoded whole into the pending buffer. It is a
// variable only so that tests can lower it.
var streamBig = 64 << 10

// streamFlush is the pending buffer's size from which it is written out.
const streamFlush = 1 << 20

// marshalTo writes m to w exactly as
// proto.MarshalOptions{Deterministic: true}.Marshal encodes it, without
// building the encoding in memory: large bytes fields (raw_data) are written
// from the message's own slices and only the small parts around them are
// encoded, through a reused buffer. Like that marshaller it emits the known
// fields of each message in field-number order (those of a oneof last)
// followed by its unknown fields (the ONNX messages have no extensions).
// size is proto.Size(m), just computed: the sizes that call cached in every
// message are reused, so nothing may change m in between. The bytes written
// must add up to size, or an error is returned. Large payloads are written
// in pieces of at most 4 MiB so that a context-checking w notices a
// cancellation.
func marshalTo(w io.Writer, m proto.Message, size int) error {
	return marshalLate(w, m, size, nil)
}

// marshalLate is marshalTo where the raw_data of the tensors li holds (see
// inlineLate) is written by their producers in place of their placeholders.
func marshalLate(w io.Writer, m proto.Message, size int, li *lateInline) error {
	e := &streamEnc{w: w}
	if li != nil {
		e.late = li.producers
	}
	if err := e.message(m.ProtoReflect()); err != nil {
		return err
	}
	if err := e.flush(); err != nil {
		return err
	}
	if e.n != int64(size) {
		return fmt.Errorf("encoded %d bytes where the model's size is %d", e.n, size)
	}
	return nil
}

// streamEnc is the state of marshalTo.
type streamEnc struct {
	w   io.Writer
	buf []byte // encoded bytes not yet written
	n   int64  // bytes written to w
	// late writes the raw_data of tensors whose placeholder it replaces.
	late map[*pb.TensorProto]func(io.Writer) error
}

// encWriter writes through the encoder.
type encWriter struct{ e *streamEnc }

func (w encWriter) Write(p []byte) (int, error) {
	if err := w.e.write(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

var (
	cachedOpts = proto.MarshalOptions{Deterministic: true, UseCachedSize: true}
	freshOpts  = proto.MarshalOptions{Deterministic: true}
)

// flush writes the pending buffer.
func (e *streamEnc) flush() error {
	if len(e.buf) == 0 {
		return nil
	}
	err := e.writeOut(e.buf)
	e.buf = e.buf[:0]
	return err
}

// smallWrite is the size below which write gathers bytes in the buffer:
// a write call per tensor header or per expert's rows costs a file system
// more than the copy (14,000 writes took 0.56 s where 2,000 of the same
// bytes took 0.19 s, on ext4).
const smallWrite = 256 << 10

// write writes b after the buffer: small pieces are appended to it, large
// ones written out after it.
func (e *streamEnc) write(b []byte) error {
	if len(b) < smallWrite {
		e.buf = append(e.buf, b...)
		return e.maybeFlush()
	}
	if err := e.flush(); err != nil {
		return err
	}
	return e.writeOut(b)
}

// writeOut writes b to w in pieces of at most 4 MiB, counting into e.n.
func (e *streamEnc) writeOut(b []byte) error {
	for len(b) > 0 {
		k := min(len(b), 4<<20)
		n, err := e.w.Write(b[:k])
		e.n += int64(n)
		if err != nil {
			return err
		}
		b = b[k:]
	}
	return nil
}

// maybeFlush writes the pending buffer once it is large.
func (e *streamEnc) maybeFlush() error {
	if len(e.buf) >= streamFlush {
		return e.flush()
	}
	return nil
}

// wireFields caches each message type's fields in the order the
// deterministic marshaller emits them.
var wireFields sync.Map // protoreflect.FullName -> []protoreflect.FieldDescriptor

// fieldsInWireOrder returns md's fields in the order the marshaller emits
// them.
func fieldsInWireOrder(md protoreflect.MessageDescriptor) []protoreflect.FieldDescriptor {
	if v, ok := wireFields.Load(md.FullName()); ok {
		return v.([]protoreflect.FieldDescriptor)
	}
	fs := md.Fields()
	out := make([]protoreflect.FieldDescriptor, fs.Len())
	for i := range out {
		out[i] = fs.Get(i)
	}
	// The marshaller's order: fields outside oneofs by number, then the
	// oneofs' fields by oneof declaration, then by number.
	oneof := func(fd protoreflect.FieldDescriptor) int {
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() {
			return 1 + od.Index()
		}
		return 0
	}
	slices.SortFunc(out, func(a, b protoreflect.FieldDescriptor) int {
		if c := oneof(a) - oneof(b); c != 0 {
			return c
		}
		return int(a.Number()) - int(b.Number())
	})
	wireFields.Store(md.FullName(), out)
	return out
}

// message encodes m's fields (not its tag or length). Runs of small fields
// are gathered in a scratch message of m's type and encoded together;
// lists of messages go element by element, a large element or singular
// message recursively, and a large bytes field straight from its slice.
func (e *streamEnc) message(m protoreflect.Message) error {
	var scratch protoreflect.Message
	var held []protoreflect.FieldDescriptor
	flushScratch := func() error {
		if len(held) == 0 {
			return nil
		}
		var err error
		e.buf, err = freshOpts.MarshalAppend(e.buf, scratch.Interface())
		for _, fd := range held {
			scratch.Clear(fd)
		}
		held = held[:0]
		if err != nil {
			return err
		}
		return e.maybeFlush()
	}
	for _, fd := range fieldsInWireOrder(m.Descriptor()) {
		if !m.Has(fd) {
			continue
		}
		v := m.Get(fd)
		big, size := false, 0
		switch {
		case fd.IsMap():
		case fd.IsList():
			big = fd.Kind() == protoreflect.MessageKind
		case fd.Kind() == protoreflect.MessageKind:
			size = cachedOpts.Size(v.Message().Interface())
			big = size >= streamBig
		case fd.Kind() == protoreflect.BytesKind:
			big = len(v.Bytes()) >= streamBig
		}
		if !big {
			if scratch == nil {
				scratch = m.Type().New()
			}
			scratch.Set(fd, v)
			held = append(held, fd)
			continue
		}
		if err := flushScratch(); err != nil {
			return err
		}
		var err error
		switch {
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				el := l.Get(i).Message()
				if err = e.element(fd.Number(), el, cachedOpts.Size(el.Interface())); err != nil {
					break
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			err = e.element(fd.Number(), v.Message(), size)
		default:
			b := v.Bytes()
			e.buf = protowire.AppendTag(e.buf, fd.Number(), protowire.BytesType)
			e.buf = protowire.AppendVarint(e.buf, uint64(len(b)))
			if p := e.lateProducer(m, fd); p != nil {
				err = p(encWriter{e})
			} else {
				err = e.write(b)
			}
		}
		if err != nil {
			return err
		}
	}
	if err := flushScratch(); err != nil {
		return err
	}
	e.buf = append(e.buf, m.GetUnknown()...)
	return e.maybeFlush()
}

// lateProducer returns the producer of m's field fd when fd is the
// raw_data of a tensor written late.
func (e *streamEnc) lateProducer(m protoreflect.Message, fd protoreflect.FieldDescriptor) func(io.Writer) error {
	if e.late == nil || fd.Name() != "raw_data" {
		return nil
	}
	t, ok := m.Interface().(*pb.TensorProto)
	if !ok {
		return nil
	}
	return e.late[t]
}

// element encodes a length-delimited message field of sz bytes (its
// cached size): whole when small, field by field when large.
func (e *streamEnc) element(num protowire.Number, m protoreflect.Message, sz int) error {
	e.buf = protowire.AppendTag(e.buf, num, protowire.BytesType)
	e.buf = protowire.AppendVarint(e.buf, uint64(sz))
	if sz >= streamBig {
		return e.message(m)
	}
	var err error
	e.buf, err = cachedOpts.MarshalAppend(e.buf, m.Interface())
	if err != nil {
		return err
	}
	return e.maybeFlush()
}
