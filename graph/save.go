package graph

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// ExternalMode says where initializer bytes go when a model is saved.
type ExternalMode int

const (
	// ExternalKeep keeps external tensors external (their bytes are streamed
	// into the output's side file) and inline tensors inline.
	ExternalKeep ExternalMode = iota
	// ExternalRepack moves every initializer of at least Threshold bytes into
	// the output's side file.
	ExternalRepack
	// ExternalInline stores every initializer inside the model file.
	ExternalInline
)

// ParseExternalMode maps "keep", "repack" or "inline" to an ExternalMode.
func ParseExternalMode(s string) (ExternalMode, error) {
	switch s {
	case "keep", "":
		return ExternalKeep, nil
	case "repack":
		return ExternalRepack, nil
	case "inline":
		return ExternalInline, nil
	}
	return 0, fmt.Errorf("unknown external-data mode %q (want keep, repack or inline)", s)
}

// SaveOptions control Save.
type SaveOptions struct {
	External ExternalMode
	// Threshold is the smallest initializer, in bytes, that ExternalRepack
	// moves out (default 1024).
	Threshold int64
	// DataName is the side file's name, relative to the output's folder
	// (default: the output's base name + ".data").
	DataName string
	// Context cancels the save between and inside tensors (deferred
	// tensors such as lowering's quantized weights are computed while they
	// are written); nil means context.Background(). A cancelled save
	// returns the context's error and leaves no output or temporary file.
	Context context.Context
	// Progress, when set, is called as initializer bytes are written, with
	// the bytes written so far and the total to write (at most about once
	// per MiB, and once at the end).
	Progress func(written, total int64)
}

// ctxWriter fails a write once its context is done, and reports progress.
type ctxWriter struct {
	ctx      context.Context
	w        io.Writer
	n, total int64
	last     int64
	progress func(written, total int64)
}

// Write writes p unless the context is done.
func (c *ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	if c.progress != nil && (c.n-c.last >= 1<<20 || c.n == c.total) {
		c.last = c.n
		c.progress(c.n, c.total)
	}
	return n, err
}

// MaxProtoSize is protobuf's 2 GiB limit on one serialized message; Save
// and Encode refuse, before encoding, a model whose inline form would exceed
// it. It is a variable only so that tests can lower it.
var MaxProtoSize int64 = 1<<31 - 1

// writeHook, when set (by tests), wraps every file Save and WriteFileAtomic
// write, to inject write failures.
var writeHook func(w io.Writer) io.Writer

// hooked returns the writer for f: f itself, or f through writeHook.
func hooked(f *os.File) io.Writer {
	if writeHook != nil {
		return writeHook(f)
	}
	return f
}

// writeChunked writes b in 4 MiB pieces so that a cancellation is noticed
// while a large model file is written.
func writeChunked(w io.Writer, b []byte) error {
	for len(b) > 0 {
		n := min(len(b), 4<<20)
		if _, err := w.Write(b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// ReadFrom copies r in chunks of at most 64 MiB, checking the context and
// reporting progress between chunks. A chunk of a file-backed limited reader
// reaches the underlying writer's ReadFrom, where the kernel copies it.
func (c *ctxWriter) ReadFrom(r io.Reader) (int64, error) {
	lr, ok := r.(*io.LimitedReader)
	if !ok {
		return io.Copy(struct{ io.Writer }{c}, r)
	}
	var total int64
	for lr.N > 0 {
		if err := c.ctx.Err(); err != nil {
			return total, err
		}
		k, err := io.Copy(c.w, &io.LimitedReader{R: lr.R, N: min(lr.N, 64<<20)})
		lr.N -= k
		total += k
		c.n += k
		if c.progress != nil && (c.n-c.last >= 1<<20 || c.n == c.total) {
			c.last = c.n
			c.progress(c.n, c.total)
		}
		if err != nil || k == 0 {
			return total, err
		}
	}
	return total, nil
}

// ErrTooLarge is returned when a model without external data would exceed
// protobuf's 2 GiB limit.
var ErrTooLarge = errors.New("model exceeds protobuf's 2 GiB limit; save with external data (SaveOptions.External ExternalRepack, mokopt --external-data repack)")

const sideAlign = 64

// Save writes the model to path atomically: the model and its side file are
// written to temporary files in the target folder, synced, and renamed into
// place only when everything succeeded. A failure leaves any previous file at
// path untouched. A side file already at the target (as when a model is
// rewritten in place) is kept as a backup until the model file has been
// renamed into place, and restored if that fails.
func (m *Model) Save(path string, opt SaveOptions) error {
	if opt.Threshold <= 0 {
		opt.Threshold = 1024
	}
	if opt.DataName == "" {
		opt.DataName = filepath.Base(path) + ".data"
	}
	ctx := opt.Context
	if ctx == nil {
		ctx = context.Background()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	dir := filepath.Dir(path)
	moved, err := m.planExternal(opt)
	if err != nil {
		return err
	}
	var side *atomicFile
	var restore []func()
	defer func() {
		for _, r := range restore {
			r()
		}
	}()
	if len(moved) > 0 {
		side, err = createAtomic(filepath.Join(dir, opt.DataName))
		if err != nil {
			return err
		}
		defer side.abort()
		bw := bufio.NewWriterSize(hooked(side.f), 1<<20)
		cw := &ctxWriter{ctx: ctx, w: bw, progress: opt.Progress}
		for _, t := range moved {
			n, err := m.tensorSize(t)
			if err != nil {
				return err
			}
			cw.total += n
		}
		var off int64
		for _, t := range moved {
			if err := ctx.Err(); err != nil {
				return err
			}
			n, err := m.tensorSize(t)
			if err != nil {
				return err
			}
			if pad := (sideAlign - off%sideAlign) % sideAlign; pad > 0 {
				if _, err := bw.Write(make([]byte, pad)); err != nil {
					return err
				}
				off += pad
			}
			if err := m.writeTensor(cw, t, n); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("writing initializer %q to %s: %w", t.GetName(), opt.DataName, err)
			}
			restore = append(restore, swapToExternal(t, opt.DataName, off, n))
			off += n
		}
		if err := bw.Flush(); err != nil {
			return err
		}
	}
	// Inline what must be inline.
	for t := range m.deferred {
		if t.GetDataLocation() == pb.TensorProto_EXTERNAL {
			continue
		}
		b, err := m.TensorBytes(t)
		if err != nil {
			return err
		}
		t.RawData = b
		tt := t
		restore = append(restore, func() { tt.RawData = nil })
	}
	if opt.External == ExternalInline {
		for _, t := range allInitializers(m.Proto) {
			if IsExternal(t) {
				b, err := m.TensorBytes(t)
				if err != nil {
					return err
				}
				restore = append(restore, swapToInline(t, b))
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sz := proto.Size(m.Proto)
	if int64(sz) > MaxProtoSize {
		return fmt.Errorf("%s: %w (%d bytes)", path, ErrTooLarge, sz)
	}
	b, err := marshalSized(m.Proto, sz)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	mf, err := createAtomic(path)
	if err != nil {
		return err
	}
	defer mf.abort()
	if err := writeChunked(&ctxWriter{ctx: ctx, w: hooked(mf.f)}, b); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := mf.finish(); err != nil {
		return err
	}
	if side != nil {
		if err := side.finish(); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if side == nil {
		return mf.commit()
	}
	// Keep the side file already at the target (an in-place rewrite's
	// input weights) until the model file is in place.
	bak := ""
	if _, err := os.Lstat(side.path); err == nil {
		bak = filepath.Join(dir, "."+filepath.Base(side.path)+".bak-"+strconv.Itoa(os.Getpid()))
		if err := os.Rename(side.path, bak); err != nil {
			return fmt.Errorf("keeping a backup of %s: %w", side.path, err)
		}
	}
	restoreSide := func() {
		if bak != "" {
			os.Rename(bak, side.path)
		}
	}
	if err := side.rename(); err != nil {
		restoreSide()
		return err
	}
	if err := mf.rename(); err != nil {
		os.Remove(side.path)
		restoreSide()
		return err
	}
	if bak != "" {
		os.Remove(bak)
	}
	syncDir(dir)
	return nil
}

// marshalSized encodes mp deterministically into a buffer of the size
// proto.Size just returned for it, reusing the sizes that call cached
// instead of walking the model a second time to compute them again.
func marshalSized(mp *pb.ModelProto, sz int) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true, UseCachedSize: true}.MarshalAppend(make([]byte, 0, sz), mp)
	if err == nil && len(b) != sz {
		// Not expected (nothing edits the model in between); encode afresh.
		return proto.MarshalOptions{Deterministic: true}.Marshal(mp)
	}
	return b, err
}

// ErrNeedsSideFile is wrapped by the error Encode returns for a model whose
// initializers live in an external data file: a stream carries one file only.
var ErrNeedsSideFile = errors.New("the model keeps initializers in an external data file, which a single stream cannot carry")

// FirstExternal returns the first initializer (of the main graph, subgraphs
// or training_info) stored in an external data file, or nil if there is none.
func (m *Model) FirstExternal() *pb.TensorProto {
	for _, t := range allInitializers(m.Proto) {
		if IsExternal(t) {
			return t
		}
	}
	return nil
}

// Encode writes the model as one self-contained file to w (for example
// standard output), deterministically. Deferred tensors (such as lowering's
// quantized weights) are computed and stored inline. External tensors are
// read and stored inline when opt.External is ExternalInline; otherwise a
// model with external data is refused with an error wrapping
// ErrNeedsSideFile, before anything is written. opt.Context cancels the
// encoding before anything is written; opt.DataName, Threshold and Progress
// are ignored.
func (m *Model) Encode(w io.Writer, opt SaveOptions) error {
	ctx := opt.Context
	if ctx == nil {
		ctx = context.Background()
	}
	if t := m.FirstExternal(); t != nil && opt.External != ExternalInline {
		loc := ""
		if ref, err := External(t); err == nil {
			loc = " (" + ref.Location + ")"
		}
		return fmt.Errorf("initializer %q is stored externally%s: %w; write to a file, or inline the weights (SaveOptions.External ExternalInline, mokopt --external-data inline)", t.GetName(), loc, ErrNeedsSideFile)
	}
	var restore []func()
	defer func() {
		for _, r := range restore {
			r()
		}
	}()
	for _, t := range allInitializers(m.Proto) {
		if err := ctx.Err(); err != nil {
			return err
		}
		_, deferred := m.deferred[t]
		if !deferred && !IsExternal(t) {
			continue
		}
		b, err := m.TensorBytes(t)
		if err != nil {
			return err
		}
		restore = append(restore, swapToInline(t, b))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sz := proto.Size(m.Proto)
	if int64(sz) > MaxProtoSize {
		return fmt.Errorf("%w (%d bytes)", ErrTooLarge, sz)
	}
	b, err := marshalSized(m.Proto, sz)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", m.Name(), err)
	}
	_, err = w.Write(b)
	return err
}

// writeTensor streams t's n bytes to w: a deferred producer writes straight
// into w (no pipe), side-file bytes go through CopyTensorRange.
func (m *Model) writeTensor(w io.Writer, t *pb.TensorProto, n int64) error {
	if d, ok := m.deferred[t]; ok {
		cw := &countWriter{w: w}
		if err := d.Write(cw); err != nil {
			return err
		}
		if cw.n != n {
			return fmt.Errorf("deferred data wrote %d bytes, want %d", cw.n, n)
		}
		return nil
	}
	if IsExternal(t) {
		if _, err := m.tensorSection(t); err != nil {
			return err
		}
		return m.CopyTensorRange(w, t, 0, n)
	}
	r, _, err := m.TensorReader(t)
	if err != nil {
		return err
	}
	_, err = io.CopyN(w, r, n)
	return err
}

// countWriter counts the bytes written through it and passes ReadFrom on,
// so that kernel copies into the side file stay possible.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	k, err := c.w.Write(p)
	c.n += int64(k)
	return k, err
}

func (c *countWriter) ReadFrom(r io.Reader) (int64, error) {
	k, err := io.Copy(c.w, r)
	c.n += k
	return k, err
}

// Marshal encodes the model, which must hold no external data, deterministically.
func (m *Model) Marshal() ([]byte, error) {
	for _, t := range allInitializers(m.Proto) {
		if IsExternal(t) {
			return nil, fmt.Errorf("initializer %q is stored externally; save to a file instead", t.GetName())
		}
	}
	if len(m.deferred) > 0 {
		return nil, errors.New("model has deferred initializers; save to a file instead")
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(m.Proto)
}

// planExternal lists, in a deterministic order, the tensors whose bytes go to
// the output's side file.
func (m *Model) planExternal(opt SaveOptions) ([]*pb.TensorProto, error) {
	if opt.External == ExternalInline {
		return nil, nil
	}
	var out []*pb.TensorProto
	for _, t := range allInitializers(m.Proto) {
		_, deferred := m.deferred[t]
		switch {
		case IsExternal(t):
			out = append(out, t)
		case opt.External == ExternalRepack || deferred:
			n, err := m.tensorSize(t)
			if err != nil {
				return nil, err
			}
			if n >= opt.Threshold || deferred && opt.External == ExternalKeep && n >= opt.Threshold {
				out = append(out, t)
			}
		}
	}
	return out, nil
}

func (m *Model) tensorSize(t *pb.TensorProto) (int64, error) {
	if d, ok := m.deferred[t]; ok {
		return d.Size, nil
	}
	if t.RawData != nil {
		return int64(len(t.RawData)), nil
	}
	if DataType(t) == pb.TensorProto_STRING {
		return 0, nil
	}
	n, err := ByteSize(DataType(t), t.GetDims())
	if err != nil {
		return 0, &InputError{File: m.Name(), Object: fmt.Sprintf("initializer %q", t.GetName()), Msg: err.Error()}
	}
	return n, nil
}

// swapToExternal points t at the side file and returns a function that undoes it.
func swapToExternal(t *pb.TensorProto, loc string, off, n int64) func() {
	oldLoc, oldExt, oldRaw := t.DataLocation, t.ExternalData, t.RawData
	oldF, oldD, oldI32, oldI64, oldU64 := t.FloatData, t.DoubleData, t.Int32Data, t.Int64Data, t.Uint64Data
	t.DataLocation = pb.TensorProto_EXTERNAL.Enum()
	t.ExternalData = []*pb.StringStringEntryProto{
		{Key: proto.String("location"), Value: proto.String(loc)},
		{Key: proto.String("offset"), Value: proto.String(strconv.FormatInt(off, 10))},
		{Key: proto.String("length"), Value: proto.String(strconv.FormatInt(n, 10))},
	}
	t.RawData, t.FloatData, t.DoubleData, t.Int32Data, t.Int64Data, t.Uint64Data = nil, nil, nil, nil, nil, nil
	return func() {
		t.DataLocation, t.ExternalData, t.RawData = oldLoc, oldExt, oldRaw
		t.FloatData, t.DoubleData, t.Int32Data, t.Int64Data, t.Uint64Data = oldF, oldD, oldI32, oldI64, oldU64
	}
}

func swapToInline(t *pb.TensorProto, b []byte) func() {
	oldLoc, oldExt, oldRaw := t.DataLocation, t.ExternalData, t.RawData
	t.DataLocation, t.ExternalData, t.RawData = nil, nil, b
	return func() { t.DataLocation, t.ExternalData, t.RawData = oldLoc, oldExt, oldRaw }
}

// allInitializers lists the initializers of the main graph, of nested
// subgraphs and of training_info, in file order.
func allInitializers(mp *pb.ModelProto) []*pb.TensorProto { return initializers(mp, true) }

// initializers is allInitializers; with mainSub false (no node of the main
// graph has a subgraph, as an index of it found), the main graph's nodes
// are not searched for subgraphs.
func initializers(mp *pb.ModelProto, mainSub bool) []*pb.TensorProto {
	var out []*pb.TensorProto
	var walk func(g *pb.GraphProto)
	walk = func(g *pb.GraphProto) {
		if g == nil {
			return
		}
		out = append(out, g.Initializer...)
		if g == mp.Graph && !mainSub {
			return
		}
		for _, n := range g.Node {
			for _, a := range n.Attribute {
				walk(a.G)
				for _, sg := range a.Graphs {
					walk(sg)
				}
			}
		}
	}
	walk(mp.Graph)
	for _, ti := range mp.TrainingInfo {
		walk(ti.Algorithm)
		walk(ti.Initialization)
	}
	return out
}

// atomicFile is a temporary file that becomes path on commit.
type atomicFile struct {
	f      *os.File
	path   string
	closed bool
	done   bool
}

func createAtomic(path string) (*atomicFile, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("cannot create output next to %s: %w", path, err)
	}
	return &atomicFile{f: f, path: path}, nil
}

// commit syncs, closes and renames the temporary file to its path, then
// syncs the folder.
func (a *atomicFile) commit() error {
	if err := a.finish(); err != nil {
		return err
	}
	if err := a.rename(); err != nil {
		return err
	}
	syncDir(filepath.Dir(a.path))
	return nil
}

// finish syncs the data to disk and closes the temporary file.
func (a *atomicFile) finish() error {
	if a.closed {
		return nil
	}
	a.closed = true
	if err := a.f.Sync(); err != nil {
		a.f.Close()
		return fmt.Errorf("writing %s: %w", a.path, err)
	}
	if err := a.f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", a.path, err)
	}
	return os.Chmod(a.f.Name(), 0o644)
}

// rename moves the finished temporary file to its path.
func (a *atomicFile) rename() error {
	if err := os.Rename(a.f.Name(), a.path); err != nil {
		return fmt.Errorf("writing %s: %w", a.path, err)
	}
	a.done = true
	return nil
}

func (a *atomicFile) abort() {
	if !a.done {
		if !a.closed {
			a.f.Close()
		}
		os.Remove(a.f.Name())
		a.done = true
	}
}

// syncDir flushes a folder's entries (the renames) to disk, where the
// platform allows it.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// WriteFileAtomic writes data to path via a temporary file in the same
// folder, synced, then renamed into place; on failure the previous file at
// path is untouched and no temporary file is left.
func WriteFileAtomic(path string, data []byte) error {
	a, err := createAtomic(path)
	if err != nil {
		return err
	}
	defer a.abort()
	if err := writeChunked(hooked(a.f), data); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return a.commit()
}
