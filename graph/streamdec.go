package graph

import (
	"bufio"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// errNotStreamed says that unmarshalFrom met something it leaves to
// proto.Unmarshal (malformed or unexpected input, a group, a file that
// changed while read): the caller decodes the whole file instead, which
// gives the exact error.
var errNotStreamed = errors.New("not decoded as a stream")

// unmarshalFrom decodes a ModelProto of exactly size bytes from r into m,
// with the result proto.Unmarshal gives for the same bytes, without holding
// the encoding in memory: a large bytes field (a tensor's raw_data) is read
// from r straight into its own slice, a large message is decoded field by
// field, and the small fields between them are gathered and unmarshalled
// (merged, in file order) together. Anything it does not expect, and any
// read error, returns errNotStreamed, its only error.
func unmarshalFrom(r io.Reader, size int64, m proto.Message) error {
	// A large payload is read past the buffer, straight into its slice.
	d := &streamDec{r: bufio.NewReaderSize(r, 64<<10)}
	if err := d.message(m.ProtoReflect(), size, 0); err != nil {
		return err
	}
	// The file must end where its size said (it did not grow meanwhile).
	if _, err := d.r.ReadByte(); err != io.EOF {
		return errNotStreamed
	}
	return nil
}

// unmarshalStream decodes a ModelProto from r, a stream whose size is not
// known (a pipe), up to its end, as unmarshalFrom does a file: the
// encoding is never held in memory whole. A stream longer than limit bytes
// is refused with ErrTooBig, bad input with an error wrapping errMalformed
// that says where (a stream cannot be read again: it is not
// proto.Unmarshal's), and a read error is returned as it is.
func unmarshalStream(r io.Reader, limit int64, m proto.Message) error {
	d := &streamDec{r: bufio.NewReaderSize(r, 64<<10), limit: limit}
	err := d.message(m.ProtoReflect(), -1, 0)
	switch {
	case err == nil:
		return nil
	case d.tooBig:
		return ErrTooBig
	case d.readErr != nil:
		return d.readErr
	}
	return fmt.Errorf("%w near byte %d", errMalformed, d.n)
}

// errMalformed is wrapped by unmarshalStream's error for input that is no
// protobuf message (or is cut short).
var errMalformed = errors.New("malformed or truncated protobuf message")

// streamDec is the state of unmarshalFrom and unmarshalStream.
type streamDec struct {
	r    *bufio.Reader
	n    int64    // bytes consumed
	pend [][]byte // the gathered small fields of each nesting level
	// For a stream of unknown size: the most bytes it may hold, whether it
	// held more, and the read error (not an end) that ended it.
	limit   int64
	tooBig  bool
	readErr error
}

// pastLimit is met when a field of a stream of unknown size claims to run
// past d.limit: the stream is too big if it really holds that many bytes,
// truncated (or corrupt) if it ends first. It reads on to the limit (as
// reading the stream whole would have) to tell which.
func (d *streamDec) pastLimit() {
	want := d.limit + 1 - d.n
	got, err := io.CopyN(io.Discard, d.r, want)
	d.n += got
	switch {
	case got == want:
		d.tooBig = true
	case err != nil:
		d.failed(err)
	}
}

// failed records a read error err (not an end of input) and returns
// errNotStreamed.
func (d *streamDec) failed(err error) error {
	if err != io.EOF && err != io.ErrUnexpectedEOF && d.readErr == nil {
		d.readErr = err
	}
	return errNotStreamed
}

// byte reads one byte.
func (d *streamDec) byte() (byte, error) {
	c, err := d.r.ReadByte()
	if err != nil {
		return 0, d.failed(err)
	}
	d.n++
	return c, nil
}

// varint reads a varint, appending its bytes, as they are, to *raw.
func (d *streamDec) varint(raw *[]byte) (uint64, error) {
	var v uint64
	for shift := uint(0); shift < 64; shift += 7 {
		c, err := d.byte()
		if err != nil {
			return 0, err
		}
		*raw = append(*raw, c)
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v, nil
		}
	}
	return 0, errNotStreamed
}

// read appends the next k bytes to b.
func (d *streamDec) read(b []byte, k int) ([]byte, error) {
	b = append(b, make([]byte, k)...) // no allocation while b has room
	if _, err := io.ReadFull(d.r, b[len(b)-k:]); err != nil {
		return b, d.failed(err)
	}
	d.n += int64(k)
	return b, nil
}

// message decodes the next n bytes, the fields of m, into m; n < 0 reads
// to the end of the input, which may not pass d.limit. depth indexes the
// pending buffer of this level.
func (d *streamDec) message(m protoreflect.Message, n int64, depth int) error {
	if depth >= protowire.DefaultRecursionLimit {
		return errNotStreamed // proto.Unmarshal says it is nested too deeply
	}
	if len(d.pend) <= depth {
		d.pend = append(d.pend, nil)
	}
	pend := d.pend[depth][:0]
	defer func() { d.pend[depth] = pend[:0] }()
	flush := func() error {
		if len(pend) == 0 {
			return nil
		}
		// Nested as deeply as proto.Unmarshal allows from the top.
		opts := proto.UnmarshalOptions{Merge: true, RecursionLimit: protowire.DefaultRecursionLimit - depth}
		err := opts.Unmarshal(pend, m.Interface())
		pend = pend[:0]
		if err != nil {
			return errNotStreamed
		}
		return nil
	}
	fields := m.Descriptor().Fields()
	toEnd := n < 0
	end := d.n + n
	if toEnd {
		end = d.limit + 1 // no field may run past the limit
	}
	for toEnd || d.n < end {
		if toEnd {
			if d.n > d.limit {
				d.tooBig = true
				return errNotStreamed
			}
			if _, err := d.r.Peek(1); err == io.EOF {
				break
			} else if err != nil {
				return d.failed(err)
			}
		}
		start := len(pend)
		tag, err := d.varint(&pend)
		if err != nil {
			return err
		}
		num, typ := protowire.DecodeTag(tag)
		if num < protowire.MinValidNumber || num > protowire.MaxValidNumber {
			return errNotStreamed
		}
		switch typ {
		case protowire.VarintType:
			_, err = d.varint(&pend)
		case protowire.Fixed32Type:
			pend, err = d.read(pend, 4)
		case protowire.Fixed64Type:
			pend, err = d.read(pend, 8)
		case protowire.BytesType:
			var k uint64
			k, err = d.varint(&pend)
			if err != nil {
				return err
			}
			if k > uint64(end-d.n) {
				if toEnd {
					d.pastLimit()
				}
				return errNotStreamed
			}
			fd := fields.ByNumber(num)
			if k < uint64(streamBig) || fd == nil || fd.IsMap() ||
				!(fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.BytesKind && !fd.IsList()) {
				pend, err = d.read(pend, int(k))
				break
			}
			pend = pend[:start] // the tag and length are not unmarshalled
			if err := flush(); err != nil {
				return err
			}
			switch {
			case fd.Kind() == protoreflect.BytesKind:
				b := make([]byte, k) // the tensor's own slice, read into directly
				if _, err = io.ReadFull(d.r, b); err != nil {
					return d.failed(err)
				}
				d.n += int64(k)
				m.Set(fd, protoreflect.ValueOfBytes(b))
			case fd.IsList():
				l := m.Mutable(fd).List()
				el := l.NewElement()
				if err = d.message(el.Message(), int64(k), depth+1); err == nil {
					l.Append(el)
				}
			default:
				err = d.message(m.Mutable(fd).Message(), int64(k), depth+1)
			}
		default:
			return errNotStreamed // groups (not in ONNX) and invalid wire types
		}
		if err != nil {
			return err
		}
		if len(pend) >= streamFlush {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if !toEnd && d.n != end {
		return errNotStreamed
	}
	return flush()
}
