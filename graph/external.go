package graph

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// externalStore opens side files on first use and serves ranged reads.
// Each side file is opened once, through the model's folder (os.Root: no
// component may lead out of it, even through a link swapped in meanwhile),
// and every later read goes through that descriptor or a reopening of it
// that is checked to be the same file.
type externalStore struct {
	dir, model string
	mu         sync.Mutex
	root       *os.Root
	files      map[string]*sideFile
	// BytesRead counts bytes read from side files (for tests and reports).
	bytesRead int64
}

// sideFile is one opened side file: the shared handle for positional reads,
// its resolved path, identity and size (taken when it was opened), and
// spare handles of its own for kernel copies, which read from the file
// position.
type sideFile struct {
	loc   string
	f     *os.File
	path  string
	id    FileID
	size  int64
	spare []*os.File
}

func newExternalStore(dir, model string) *externalStore {
	return &externalStore{dir: dir, model: model, files: map[string]*sideFile{}}
}

func (s *externalStore) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var first error
	for k, sf := range s.files {
		if err := sf.f.Close(); err != nil && first == nil {
			first = err
		}
		for _, f := range sf.spare {
			f.Close()
		}
		delete(s.files, k)
	}
	if s.root != nil {
		s.root.Close()
		s.root = nil
	}
	return first
}

// ExternalRef is where an externally stored tensor's bytes live.
type ExternalRef struct {
	Location string // as written in the model, relative to the model's folder
	Offset   int64
	Length   int64 // -1 when not given: to the end of the file
}

// IsExternal reports whether t's data is stored in a side file.
func IsExternal(t *pb.TensorProto) bool {
	return t.GetDataLocation() == pb.TensorProto_EXTERNAL
}

// External parses t's external_data entries.
func External(t *pb.TensorProto) (ExternalRef, error) {
	r := ExternalRef{Length: -1}
	for _, kv := range t.ExternalData {
		switch kv.GetKey() {
		case "location":
			r.Location = kv.GetValue()
		case "offset", "length":
			v, err := strconv.ParseInt(kv.GetValue(), 10, 64)
			if err != nil || v < 0 {
				return r, fmt.Errorf("external data %s %q is not a non-negative integer", kv.GetKey(), kv.GetValue())
			}
			if kv.GetKey() == "offset" {
				r.Offset = v
			} else {
				r.Length = v
			}
		}
	}
	if r.Location == "" {
		return r, errors.New("external data has no location")
	}
	return r, nil
}

// resolve maps a location to a path inside the model's folder, refusing
// absolute paths, paths that climb out with "..", and symlinks that lead out.
func (s *externalStore) resolve(loc string) (string, error) {
	if filepath.IsAbs(loc) || strings.HasPrefix(loc, "/") || strings.HasPrefix(loc, `\`) {
		return "", fmt.Errorf("external data location %q is an absolute path; it must be relative to the model's folder", loc)
	}
	clean := filepath.Clean(filepath.FromSlash(loc))
	if clean == ".." || strings.HasPrefix(clean, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("external data location %q escapes the model's folder", loc)
	}
	p := filepath.Join(s.dir, clean)
	realDir, err := filepath.EvalSymlinks(s.dir)
	if err != nil {
		return "", err
	}
	realP, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("external data file %q: %w", loc, err)
	}
	rel, err := filepath.Rel(realDir, realP)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("external data location %q leads out of the model's folder through a symbolic link", loc)
	}
	return realP, nil
}

func (s *externalStore) open(loc string) (*sideFile, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sf, ok := s.files[loc]; ok {
		return sf, nil
	}
	p, err := s.resolve(loc)
	if err != nil {
		return nil, err
	}
	if s.root == nil {
		if s.root, err = os.OpenRoot(s.dir); err != nil {
			return nil, err
		}
	}
	// Through the root, no component can lead out of the folder (a link
	// swapped in since resolve is refused), and O_NONBLOCK keeps a FIFO
	// from blocking the open; anything but a regular file is then refused.
	f, err := s.root.OpenFile(filepath.Clean(filepath.FromSlash(loc)), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		if strings.Contains(err.Error(), "escapes") {
			return nil, fmt.Errorf("external data location %q leads out of the model's folder through a symbolic link", loc)
		}
		return nil, fmt.Errorf("external data file %q: %w", loc, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("cannot stat external data: %w", err)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("external data file %q (%s) is %s, not a regular file", loc, p, describeMode(st.Mode()))
	}
	id, _ := fileIDOf(st)
	sf := &sideFile{loc: loc, f: f, path: p, id: id, size: st.Size()}
	s.files[loc] = sf
	return sf, nil
}

// WritableMode is the one rule for an output path that exists already,
// by its file mode: a regular file is replaced (direct false); a character
// device or named pipe (/dev/stdout, a FIFO) is written directly, without
// a temporary file or rename (direct true); anything else is refused, the
// error naming its kind ("it is a directory").
func WritableMode(m os.FileMode) (direct bool, err error) {
	switch {
	case m.IsRegular():
		return false, nil
	case m&(os.ModeCharDevice|os.ModeNamedPipe) != 0:
		return true, nil
	}
	return false, fmt.Errorf("it is %s", describeMode(m))
}

// describeMode names the kind of a file that is not a regular one.
func describeMode(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a block device"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "not a regular file"
}

// handle returns a handle of sf's file with a file position of its own,
// to give back with release. It reopens the descriptor taken when the file
// was checked (not the path, which may name another file by now) and
// refuses a handle that is not that same file.
func (s *externalStore) handle(sf *sideFile) (*os.File, error) {
	s.mu.Lock()
	if n := len(sf.spare); n > 0 {
		f := sf.spare[n-1]
		sf.spare = sf.spare[:n-1]
		s.mu.Unlock()
		return f, nil
	}
	s.mu.Unlock()
	f, err := os.Open("/proc/self/fd/" + strconv.Itoa(int(sf.f.Fd())))
	if err != nil {
		// No /proc: reopen through the folder's root.
		s.mu.Lock()
		root := s.root
		s.mu.Unlock()
		if root == nil {
			return nil, fmt.Errorf("external data file %q: store closed", sf.loc)
		}
		if f, err = root.OpenFile(filepath.Clean(filepath.FromSlash(sf.loc)), os.O_RDONLY|syscall.O_NONBLOCK, 0); err != nil {
			return nil, fmt.Errorf("external data file %q: %w", sf.loc, err)
		}
	}
	st, err := f.Stat()
	if err == nil {
		if id, _ := fileIDOf(st); id != sf.id {
			err = fmt.Errorf("external data file %q was replaced by another file after it was checked", sf.loc)
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// release gives back a handle from handle; it is kept for the next copy,
// or closed if the store was closed meanwhile.
func (s *externalStore) release(sf *sideFile, f *os.File) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.files[sf.loc] != sf {
		f.Close()
		return
	}
	sf.spare = append(sf.spare, f)
}

// tensorSection returns a reader over the side-file bytes of an external
// tensor, after checking that offset and length lie inside the file and that
// the length matches the tensor's dims.
func (m *Model) tensorSection(t *pb.TensorProto) (*io.SectionReader, error) {
	sf, off, length, err := m.section(t)
	if err != nil {
		return nil, err
	}
	return io.NewSectionReader(sf.f, off, length), nil
}

// section is tensorSection's check: the side file, offset and length of
// an external tensor's bytes.
func (m *Model) section(t *pb.TensorProto) (*sideFile, int64, int64, error) {
	obj := func() string { return m.tensorLabel(t) }
	ref, err := External(t)
	if err != nil {
		return nil, 0, 0, &InputError{File: m.Name(), Object: obj(), Msg: "bad external data", Err: err}
	}
	sf, err := m.ext.open(ref.Location)
	if err != nil {
		return nil, 0, 0, &InputError{File: m.Name(), Object: obj(), Msg: "cannot open external data", Err: err}
	}
	size := sf.size
	want, err := ByteSize(DataType(t), t.GetDims())
	if err != nil {
		return nil, 0, 0, &InputError{File: m.Name(), Object: obj(), Msg: err.Error()}
	}
	length := ref.Length
	if length < 0 {
		length = size - ref.Offset
	}
	if ref.Offset > size || length > size-ref.Offset {
		return nil, 0, 0, badInput(m.Name(), obj(), "external data offset %d + length %d is past the end of %q (%d bytes)", ref.Offset, length, ref.Location, size)
	}
	if length != want {
		return nil, 0, 0, badInput(m.Name(), obj(), "external data length %d does not match dims %v of %s (%d bytes)", length, t.GetDims(), DataType(t), want)
	}
	return sf, ref.Offset, length, nil
}

// MaxTensorBytes bounds the bytes TensorBytes loads into memory for one
// tensor (64 GiB); larger tensors can still be streamed with TensorReader.
// A side file that really is that large (or a sparse one) is thus refused
// with an error instead of exhausting memory.
var MaxTensorBytes int64 = 64 << 30

// ExternalBytesRead reports how many bytes of external data have been read
// through this model so far.
func (m *Model) ExternalBytesRead() int64 {
	m.ext.mu.Lock()
	defer m.ext.mu.Unlock()
	return m.ext.bytesRead
}

type countingReader struct {
	r io.Reader
	s *externalStore
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.s.mu.Lock()
	c.s.bytesRead += int64(n)
	c.s.mu.Unlock()
	return n, err
}

// TensorReader returns a reader over t's raw little-endian bytes and their
// count, wherever they are stored (raw_data, typed fields, a side file, or a
// deferred producer). Side-file bytes are streamed, not loaded.
func (m *Model) TensorReader(t *pb.TensorProto) (io.Reader, int64, error) {
	if d, ok := m.Deferred(t); ok {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(d.Write(pw)) }()
		return pr, d.Size, nil
	}
	if IsExternal(t) {
		sec, err := m.tensorSection(t)
		if err != nil {
			return nil, 0, err
		}
		return countingReader{sec, m.ext}, sec.Size(), nil
	}
	b, err := m.TensorBytes(t)
	if err != nil {
		return nil, 0, err
	}
	return bytes.NewReader(b), int64(len(b)), nil
}

// TensorBytes returns t's raw little-endian bytes, reading a side file with a
// ranged read when the tensor is external. The length is checked against the
// tensor's dims and data type.
func (m *Model) TensorBytes(t *pb.TensorProto) ([]byte, error) {
	obj := func() string { return fmt.Sprintf("initializer %q", t.GetName()) } // for errors only
	if _, ok := m.Deferred(t); ok || IsExternal(t) {
		r, n, err := m.TensorReader(t)
		if err != nil {
			return nil, err
		}
		if n > MaxTensorBytes {
			if c, ok := r.(io.Closer); ok {
				c.Close()
			}
			return nil, badInput(m.Name(), obj(), "tensor of %d bytes is larger than the %d bytes one tensor may take in memory", n, MaxTensorBytes)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, &InputError{File: m.Name(), Object: obj(), Msg: "reading external data", Err: err}
		}
		return b, nil
	}
	want, err := ByteSize(DataType(t), t.GetDims())
	if err != nil {
		return nil, &InputError{File: m.Name(), Object: obj(), Msg: err.Error()}
	}
	if t.RawData != nil {
		if int64(len(t.RawData)) != want {
			return nil, badInput(m.Name(), obj(), "raw_data holds %d bytes but dims %v of %s need %d", len(t.RawData), t.GetDims(), DataType(t), want)
		}
		return t.RawData, nil
	}
	b, err := typedFieldBytes(t, want)
	if err != nil {
		return nil, &InputError{File: m.Name(), Object: obj(), Msg: err.Error()}
	}
	return b, nil
}

// typedFieldBytes converts the typed repeated fields of a TensorProto into
// little-endian raw bytes.
func typedFieldBytes(t *pb.TensorProto, want int64) ([]byte, error) {
	dt := DataType(t)
	// Compare before allocating: dims may claim far more than the fields hold.
	if have, ok := typedFieldLen(t); ok && have != want {
		return nil, fmt.Errorf("typed data holds %d bytes but dims %v of %s need %d", have, t.GetDims(), dt, want)
	}
	out := make([]byte, 0, want)
	var n int
	switch dt {
	case pb.TensorProto_FLOAT:
		for _, v := range t.FloatData {
			out = binary.LittleEndian.AppendUint32(out, math.Float32bits(v))
		}
		n = len(t.FloatData)
	case pb.TensorProto_COMPLEX64:
		for _, v := range t.FloatData {
			out = binary.LittleEndian.AppendUint32(out, math.Float32bits(v))
		}
		n = len(t.FloatData) / 2
	case pb.TensorProto_DOUBLE, pb.TensorProto_COMPLEX128:
		for _, v := range t.DoubleData {
			out = binary.LittleEndian.AppendUint64(out, math.Float64bits(v))
		}
		n = len(t.DoubleData)
		if dt == pb.TensorProto_COMPLEX128 {
			n /= 2
		}
	case pb.TensorProto_INT64:
		for _, v := range t.Int64Data {
			out = binary.LittleEndian.AppendUint64(out, uint64(v))
		}
		n = len(t.Int64Data)
	case pb.TensorProto_UINT64, pb.TensorProto_UINT32:
		for _, v := range t.Uint64Data {
			if dt == pb.TensorProto_UINT32 {
				out = binary.LittleEndian.AppendUint32(out, uint32(v))
			} else {
				out = binary.LittleEndian.AppendUint64(out, v)
			}
		}
		n = len(t.Uint64Data)
	case pb.TensorProto_INT32:
		for _, v := range t.Int32Data {
			out = binary.LittleEndian.AppendUint32(out, uint32(v))
		}
		n = len(t.Int32Data)
	case pb.TensorProto_INT16, pb.TensorProto_UINT16, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16:
		for _, v := range t.Int32Data {
			out = binary.LittleEndian.AppendUint16(out, uint16(v))
		}
		n = len(t.Int32Data)
	case pb.TensorProto_INT8, pb.TensorProto_UINT8, pb.TensorProto_BOOL, pb.TensorProto_FLOAT8E4M3FN,
		pb.TensorProto_FLOAT8E4M3FNUZ, pb.TensorProto_FLOAT8E5M2, pb.TensorProto_FLOAT8E5M2FNUZ, pb.TensorProto_FLOAT8E8M0:
		for _, v := range t.Int32Data {
			out = append(out, byte(v))
		}
		n = len(t.Int32Data)
	case pb.TensorProto_INT4, pb.TensorProto_UINT4, pb.TensorProto_FLOAT4E2M1:
		// int32_data holds packed pairs already, one byte per entry.
		for _, v := range t.Int32Data {
			out = append(out, byte(v))
		}
		if int64(len(out)) != want {
			return nil, fmt.Errorf("int32_data holds %d packed bytes but dims %v need %d", len(out), t.GetDims(), want)
		}
		return out, nil
	default:
		return nil, fmt.Errorf("data type %s has no raw form", dt)
	}
	if int64(len(out)) != want {
		return nil, fmt.Errorf("holds %d elements but dims %v need %d", n, t.GetDims(), want*8/int64(max(ElemBits(dt), 1)))
	}
	return out, nil
}

// CopyTensorRange writes bytes [off, off+n) of t's raw little-endian data to
// w. Side-file bytes are copied in bounded chunks, or by the kernel
// (copy_file_range) when w is, or buffers, an *os.File; they are never
// loaded whole (a range of at most 64 KiB is read with one positioned read
// into a reused buffer, which costs fewer system calls). It is the building
// block of deferred tensors that concatenate ranges of source tensors.
func (m *Model) CopyTensorRange(w io.Writer, t *pb.TensorProto, off, n int64) error {
	if off < 0 || n < 0 {
		return fmt.Errorf("initializer %q: bad range %d+%d", t.GetName(), off, n)
	}
	if d, ok := m.Deferred(t); ok {
		if off+n > d.Size {
			return fmt.Errorf("initializer %q: range %d+%d past its %d bytes", t.GetName(), off, n, d.Size)
		}
		// A producer of ranges writes the range; another writes the
		// whole tensor, of which the range is kept.
		rw := &rangeWriter{w: w, left: n}
		var err error
		if d.Range != nil {
			err = d.Range(rw, off, n)
		} else {
			rw.skip = off
			err = d.Write(rw)
		}
		if err == nil && rw.left > 0 {
			err = fmt.Errorf("initializer %q: %w", t.GetName(), io.ErrUnexpectedEOF)
		}
		return err
	}
	if !IsExternal(t) {
		b, err := m.TensorBytes(t) // the tensor's own bytes: no copy
		if err != nil {
			return err
		}
		if off+n > int64(len(b)) {
			return fmt.Errorf("initializer %q: range %d+%d past its %d bytes", t.GetName(), off, n, len(b))
		}
		_, err = w.Write(b[off : off+n])
		return err
	}
	sf, base, size, err := m.section(t)
	if err != nil {
		return err
	}
	if off+n > size {
		return fmt.Errorf("initializer %q: range %d+%d past its %d bytes", t.GetName(), off, n, size)
	}
	// A handle of its own: the kernel copy reads from the file position.
	f, err := m.ext.handle(sf)
	if err != nil {
		return err
	}
	defer m.ext.release(sf, f)
	var k int64
	if n <= smallRange {
		k, err = copySmall(w, f, base+off, n)
	} else {
		if _, err := f.Seek(base+off, io.SeekStart); err != nil {
			return err
		}
		k, err = io.Copy(w, &io.LimitedReader{R: f, N: n})
	}
	m.ext.mu.Lock()
	m.ext.bytesRead += k
	m.ext.mu.Unlock()
	if err == nil && k != n {
		err = fmt.Errorf("initializer %q: %w", t.GetName(), io.ErrUnexpectedEOF)
	}
	return err
}

// smallRange is the largest side-file range CopyTensorRange reads into a
// buffer (smallBufs) instead of having it copied by the kernel.
const smallRange = 64 << 10

// smallBufs holds the buffers of copySmall.
var smallBufs = sync.Pool{New: func() any { return new([smallRange]byte) }}

// copySmall writes the n <= smallRange bytes of f at pos to w, through one
// positioned read, and returns how many it wrote: fewer than n, without
// error, when the file ends first (as io.Copy from a LimitedReader).
func copySmall(w io.Writer, f *os.File, pos, n int64) (int64, error) {
	buf := smallBufs.Get().(*[smallRange]byte)
	defer smallBufs.Put(buf)
	k, err := f.ReadAt(buf[:n], pos)
	if err == io.EOF {
		err = nil
	}
	if err != nil {
		return 0, err
	}
	k, err = w.Write(buf[:k])
	return int64(k), err
}

// rangeWriter passes on the bytes [skip, skip+left) of what is written to
// it and drops the rest.
type rangeWriter struct {
	w          io.Writer
	skip, left int64
}

func (r *rangeWriter) Write(p []byte) (int, error) {
	n := len(p)
	if r.skip > 0 {
		k := min(r.skip, int64(len(p)))
		p, r.skip = p[k:], r.skip-k
	}
	if k := min(r.left, int64(len(p))); k > 0 {
		if _, err := r.w.Write(p[:k]); err != nil {
			return 0, err
		}
		r.left -= k
	}
	return n, nil
}

// fillWriter copies what is written to it into p, in order; bytes past
// its end are an error.
type fillWriter struct{ p []byte }

func (f *fillWriter) Write(b []byte) (int, error) {
	if len(b) > len(f.p) {
		return 0, io.ErrShortBuffer
	}
	f.p = f.p[copy(f.p, b):]
	return len(b), nil
}

// ReadTensorAt fills p with the raw little-endian bytes of t from byte
// offset off on, for a tensor whose bytes lie in a side file or in its
// raw_data, or are made by a deferred producer that makes ranges
// (DeferredData.Range); it reads only that range. It is how a weight is streamed, a
// slice at a time, instead of being loaded whole (TensorBytes).
func (m *Model) ReadTensorAt(t *pb.TensorProto, p []byte, off int64) error {
	if d, ok := m.Deferred(t); ok {
		if d.Range == nil {
			return badInput(m.Name(), m.tensorLabel(t), "its bytes are produced when the model is saved and cannot be read by range")
		}
		return m.CopyTensorRange(&fillWriter{p: p}, t, off, int64(len(p)))
	}
	if !IsExternal(t) {
		raw := t.GetRawData()
		if off < 0 || off > int64(len(raw)) || int64(len(p)) > int64(len(raw))-off {
			return badInput(m.Name(), m.tensorLabel(t), "range %d+%d is outside its %d bytes of raw_data", off, len(p), len(raw))
		}
		copy(p, raw[off:])
		return nil
	}
	sf, base, length, err := m.section(t)
	if err != nil {
		return err
	}
	if off < 0 || off > length || int64(len(p)) > length-off {
		return badInput(m.Name(), m.tensorLabel(t), "range %d+%d is outside its %d bytes of external data", off, len(p), length)
	}
	if _, err := sf.f.ReadAt(p, base+off); err != nil {
		return &InputError{File: m.Name(), Object: m.tensorLabel(t), Msg: "reading external data", Err: err}
	}
	m.ext.mu.Lock()
	m.ext.bytesRead += int64(len(p))
	m.ext.mu.Unlock()
	return nil
}
