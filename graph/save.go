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
	"strings"
	"syscall"

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
	// Ready, when set, is called once the output is written (to temporary
	// files, synced) and before anything is renamed into place; an error
	// from it aborts the save, which leaves no output and no temporary file
	// and returns that error. A caller that must first confirm the model it
	// is writing (a check running while the model is written) blocks here.
	// For a character device or named pipe, which is written directly, it
	// is called before the first byte is written.
	Ready func() error
}

// ready calls opt.Ready, if set.
func (opt *SaveOptions) ready() error {
	if opt.Ready == nil {
		return nil
	}
	return opt.Ready()
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

// saveStep, when set (by tests), is called between the renames of Save;
// an error stops Save there, as a crash would (only temporary files are
// removed afterwards).
var saveStep func(step string) error

func stepHook(step string) error {
	if saveStep != nil {
		return saveStep(step)
	}
	return nil
}

// hooked returns the writer for f, a new output file written from its
// start: f, or f through writeHook when that is set, starting the
// writeback of each writebackEvery bytes as they come (startWriteback).
func hooked(f *os.File) io.Writer {
	var w io.Writer = f
	if writeHook != nil {
		w = writeHook(f)
	}
	return &writingBack{w: w, start: func(off, n int64) { startWriteback(f, off, n) }}
}

// writebackEvery is how many bytes written make writingBack start their
// writeback.
const writebackEvery = 8 << 20

// writingBack writes to w and starts (start) the writeback of every
// writebackEvery bytes written, so that the data goes to disk while the
// rest is encoded, not all in the final fsync.
type writingBack struct {
	w                io.Writer
	start            func(off, n int64)
	written, flushed int64
}

func (w *writingBack) Write(b []byte) (int, error) {
	n, err := w.w.Write(b)
	w.wrote(int64(n))
	return n, err
}

// ReadFrom copies r to w's writer as io.Copy does, so that a file-backed
// reader still reaches the output file's own ReadFrom, where the kernel
// copies the bytes (copy_file_range), without passing through memory.
func (w *writingBack) ReadFrom(r io.Reader) (int64, error) {
	n, err := io.Copy(w.w, r)
	w.wrote(n)
	return n, err
}

// wrote counts n more bytes written and starts the writeback of what has
// piled up since the last.
func (w *writingBack) wrote(n int64) {
	w.written += n
	if w.written-w.flushed >= writebackEvery {
		w.start(w.flushed, w.written-w.flushed)
		w.flushed = w.written
	}
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
var ErrTooLarge = errors.New("model exceeds protobuf's 2 GiB limit; save to a file with external data (SaveOptions.External ExternalKeep or ExternalRepack, mokopt --external-data keep or repack)")

const sideAlign = 64

// Save writes the model to path atomically: the model and its side file are
// written to temporary files in the target folder (".NAME.tmp-PID-RANDOM",
// see CleanStaleTemps), synced, and renamed into place only when
// everything succeeded. A failure leaves any previous file at path
// untouched.
//
// The model is checked first (CheckOutput): a model that would fail the
// checker is never written, and the error wraps ErrInvalidOutput.
//
// Save refuses (with a *SameFileError) to write the model over one of the
// side files it reads, or its side file over one of them unless path is
// the file the model was loaded from. When a side file is already at the
// target (as when a model is saved over the file it was loaded from), the
// pair is switched so that the model file always names a complete side
// file: the new side file is written under another name
// (NAME.1.data), the model naming it is renamed into place, and only then
// is the side file moved to its own name (a hard link renamed over it)
// and the model rewritten to name it.
//
// A path that is a character device or a named pipe (/dev/null,
// /dev/stdout, a FIFO) is written directly, as one self-contained stream
// (see Encode), without a temporary file or rename; a directory or any
// other kind of file is refused.
func (m *Model) Save(path string, opt SaveOptions) error {
	path = ResolveOutput(path)
	dir := filepath.Dir(path)
	free := freeBytes(dir)
	err := m.save(path, opt)
	if errors.Is(err, syscall.ENOSPC) {
		return &DiskFullError{Path: path, Dir: dir, Need: m.saveBytes(opt), Free: free, Err: err}
	}
	return err
}

// saveBytes is about how many bytes Save(opt) writes: the model file and
// its side file (what was planned to go there).
func (m *Model) saveBytes(opt SaveOptions) int64 {
	n := int64(proto.Size(m.Proto))
	if opt.Threshold <= 0 {
		opt.Threshold = 1024
	}
	moved, err := m.planExternal(opt)
	if err != nil {
		return n
	}
	for _, t := range moved {
		if k, err := m.tensorSize(t); err == nil {
			n += k - int64(len(t.GetRawData())) // an inline tensor's bytes are in proto.Size already
		}
	}
	return n
}

// save is Save, with path resolved.
func (m *Model) save(path string, opt SaveOptions) error {
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
	if err := m.CheckOutput(); err != nil {
		return fmt.Errorf("refusing to write %s: %w", path, err)
	}
	tid, tmode, texists, err := IdentifyFile(path)
	if err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	}
	sides := m.sideIDs()
	if texists {
		if direct, err := WritableMode(tmode); err != nil {
			return fmt.Errorf("cannot write %s: %w", path, err)
		} else if direct {
			return m.saveStream(path, opt)
		}
		if p, ok := sides[tid]; ok {
			return &SameFileError{Output: path, Input: p, What: "a side file of the model being written"}
		}
	}
	inPlace := texists && m.srcOK && tid == m.srcID
	dir := filepath.Dir(path)
	sidePath := filepath.Join(dir, opt.DataName)
	sid, smode, sexists, err := IdentifyFile(sidePath)
	if err != nil {
		return fmt.Errorf("cannot write %s: %w", sidePath, err)
	}
	if direct, err := WritableMode(smode); sexists && (err != nil || direct) {
		if err == nil {
			err = fmt.Errorf("it is %s", describeMode(smode)) // a side file is renamed into place, never streamed
		}
		return fmt.Errorf("cannot write the side file %s: %w", sidePath, err)
	}
	if sexists && texists && sid == tid {
		return &SameFileError{Output: sidePath, Input: path, What: "the model file itself"}
	}
	if p, ok := sides[sid]; sexists && ok && !inPlace {
		return &SameFileError{Output: sidePath, Input: p, What: "a side file of the model being written"}
	}
	moved, err := m.planExternal(opt)
	if err != nil {
		return err
	}
	// Switch the pair in two steps when a model file and a side file are
	// both at the target already (the old model names the old side file).
	dataName := opt.DataName
	if len(moved) > 0 && sexists && texists {
		dataName = m.altDataName(dir, opt.DataName, sides)
	}
	var side *atomicFile
	var restore []func()
	defer func() {
		for _, r := range restore {
			r()
		}
	}()
	if len(moved) > 0 {
		side, err = createAtomic(filepath.Join(dir, dataName))
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
				return fmt.Errorf("writing %s to %s: %w", m.tensorLabel(t), dataName, err)
			}
			restore = append(restore, swapToExternal(t, dataName, off, n))
			off += n
		}
		if err := bw.Flush(); err != nil {
			return err
		}
	}
	// Inline what must be inline: deferred tensors that stay in the model
	// file, and side-file tensors when inlining. Their bytes are written
	// as the model file is encoded, not gathered first.
	var inline []*pb.TensorProto
	for _, t := range allTensors(m.Proto) {
		_, deferred := m.Deferred(t)
		if deferred && t.GetDataLocation() != pb.TensorProto_EXTERNAL || opt.External == ExternalInline && IsExternal(t) {
			inline = append(inline, t)
		}
	}
	li, undo, err := m.inlineLate(inline)
	if err != nil {
		return err
	}
	restore = append(restore, undo)
	mf, err := m.writeModelTemp(ctx, path, li)
	if err != nil {
		return err
	}
	defer mf.abort()
	if side != nil {
		if err := side.finish(); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := opt.ready(); err != nil {
		return err
	}
	if side == nil {
		return mf.commit()
	}
	// One writer at a time renames a pair into this folder.
	unlock := lockFolder(dir)
	defer unlock()
	if err := side.rename(); err != nil {
		return err
	}
	if err := stepHook("side renamed"); err != nil {
		return err
	}
	if err := mf.rename(); err != nil {
		os.Remove(side.path)
		return err
	}
	syncDir(dir)
	if dataName == opt.DataName {
		return nil
	}
	if err := stepHook("model renamed"); err != nil {
		return err
	}
	// The model names the new side file under its other name; move it to
	// its own name. Every step leaves a model that names a complete side
	// file; a failure here only leaves the other name in use.
	m.moveSide(ctx, path, dir, dataName, opt.DataName, moved, li)
	return nil
}

// writeModelTemp encodes the model into a finished temporary file next to
// path, to be renamed into place.
func (m *Model) writeModelTemp(ctx context.Context, path string, li *lateInline) (*atomicFile, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sz := proto.Size(m.Proto)
	if int64(sz) > MaxProtoSize {
		return nil, fmt.Errorf("%s: %w (%d bytes)", path, ErrTooLarge, sz)
	}
	mf, err := createAtomic(path)
	if err != nil {
		return nil, err
	}
	if err := marshalLate(&ctxWriter{ctx: ctx, w: hooked(mf.f)}, m.Proto, sz, li); err != nil {
		mf.abort()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	if err := mf.finish(); err != nil {
		mf.abort()
		return nil, err
	}
	return mf, nil
}

// moveSide gives the side file written as tmpName its own name: a hard
// link to it is renamed over name, a model naming name is renamed over
// path, and tmpName is removed. It gives up quietly (the model then keeps
// naming tmpName, which is complete) where hard links are not available.
func (m *Model) moveSide(ctx context.Context, path, dir, tmpName, name string, moved []*pb.TensorProto, li *lateInline) {
	from, to := filepath.Join(dir, tmpName), filepath.Join(dir, name)
	link := filepath.Join(dir, tempPrefix(to)+strconv.Itoa(os.Getpid())+"-link")
	os.Remove(link)
	if err := os.Link(from, link); err != nil {
		return
	}
	if err := os.Rename(link, to); err != nil {
		os.Remove(link)
		return
	}
	if stepHook("side moved") != nil {
		return
	}
	for _, t := range moved {
		for _, kv := range t.ExternalData {
			if kv.GetKey() == "location" {
				kv.Value = proto.String(name)
			}
		}
	}
	mf, err := m.writeModelTemp(ctx, path, li)
	if err != nil {
		return
	}
	if err := mf.rename(); err != nil {
		mf.abort()
		return
	}
	os.Remove(from)
	syncDir(dir)
}

// altDataName returns the name the side file is first written under when
// one is at the target already: NAME.1.data (NAME.2.data, ... when that
// one is a side file the model reads).
func (m *Model) altDataName(dir, name string, sides map[FileID]string) string {
	stem, ext := name, ""
	if strings.HasSuffix(name, ".data") {
		stem, ext = strings.TrimSuffix(name, ".data"), ".data"
	}
	for i := 1; ; i++ {
		alt := stem + "." + strconv.Itoa(i) + ext
		id, _, exists, err := IdentifyFile(filepath.Join(dir, alt))
		if err != nil {
			continue
		}
		if _, reads := sides[id]; !exists || !reads {
			return alt
		}
	}
}

// saveStream writes the model as one self-contained stream (Encode) to a
// character device or named pipe, opened for writing without creating or
// truncating anything. The stream is opened when Encode writes its first
// byte, after every check that can refuse the model: a refused model never
// opens it (a FIFO's reader sees no writer), and the encoding is never
// held in memory.
func (m *Model) saveStream(path string, opt SaveOptions) error {
	if t := m.FirstExternal(); t != nil && opt.External != ExternalInline {
		return m.Encode(io.Discard, opt) // the ErrNeedsSideFile error
	}
	if err := opt.ready(); err != nil {
		return err
	}
	w := &openOnWrite{path: path}
	err := m.Encode(w, opt)
	if w.f == nil && err == nil {
		_, err = w.Write(nil) // nothing to write: open it all the same
	}
	if w.f == nil {
		return err
	}
	if cerr := w.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("writing %s: %w", path, cerr)
	}
	return err
}

// openOnWrite opens path for writing (without creating or truncating it)
// at the first Write.
type openOnWrite struct {
	path string
	f    *os.File
}

// Write opens the file if it is not open yet and writes p to it.
func (o *openOnWrite) Write(p []byte) (int, error) {
	if o.f == nil {
		f, err := os.OpenFile(o.path, os.O_WRONLY, 0)
		if err != nil {
			return 0, fmt.Errorf("cannot write %s: %w", o.path, err)
		}
		o.f = f
	}
	n, err := o.f.Write(p)
	if err != nil {
		err = fmt.Errorf("writing %s: %w", o.path, err)
	}
	return n, err
}

// SameFileError is returned when an output would replace a file the
// command reads.
type SameFileError struct {
	Output string // the path that would be written
	Input  string // the path of the file that would be replaced
	What   string // what Input is ("a side file of the model being written")
}

func (e *SameFileError) Error() string {
	return fmt.Sprintf("refusing to write %s: it is the same file as %s, %s", e.Output, e.Input, e.What)
}

// ErrInvalidOutput is wrapped by the error of Save and Encode for a model
// that fails the checker: nothing is written.
var ErrInvalidOutput = errors.New("the model to write fails the checker")

// CheckOutput checks a model about to be written as Check checks a loaded
// one (main graph and nested bodies, initializer names, every tensor's size
// against its data and side file), except that deferred tensors only need
// a producer of the right size. It returns an error wrapping
// ErrInvalidOutput listing the problems, or nil.
func (m *Model) CheckOutput() error {
	var errs []error
	// The main graph as a body without enclosing scope (a leaner pass than
	// building a Graph index): values produced once, nothing read that
	// nothing defines, no cycle, every output defined.
	gp := m.Proto.Graph
	local := make(map[string]bool, len(gp.Input)+len(gp.Initializer)+len(gp.Node))
	for _, t := range gp.Initializer {
		if local[t.GetName()] {
			errs = append(errs, fmt.Errorf("initializer %q is defined more than once", t.GetName()))
		}
		local[t.GetName()] = true
	}
	for _, v := range gp.Input {
		local[v.GetName()] = true // an input may also be an initializer (IR < 4)
	}
	errs = append(errs, checkNodeList(gp.Node, local, nil, "main graph")...)
	for _, v := range gp.Output {
		if nm := v.GetName(); !local[nm] {
			errs = append(errs, fmt.Errorf("graph output %q is not defined", nm))
		}
	}
	opset := m.Opset("")
	for _, n := range gp.Node {
		if err := checkArity(n, opset); err != nil {
			errs = append(errs, err)
		}
	}
	for _, t := range allInitializers(m.Proto) {
		if d, ok := m.Deferred(t); ok {
			if want, err := ByteSize(DataType(t), t.GetDims()); err != nil || want != d.Size {
				errs = append(errs, fmt.Errorf("initializer %q: deferred data of %d bytes for dims %v of %s", t.GetName(), d.Size, t.GetDims(), DataType(t)))
			}
			continue
		}
		if err := m.checkTensor(t); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, m.checkOthers()...)
	errs = append(errs, checkBodies(m.Proto)...)
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidOutput, joinProblems(errs, maxCheckErrors))
}

// ErrNeedsSideFile is wrapped by the error Encode returns for a model whose
// initializers live in an external data file: a stream carries one file only.
var ErrNeedsSideFile = errors.New("the model keeps initializers in an external data file, which a single stream cannot carry")

// FirstExternal returns the first initializer (of the main graph, subgraphs
// or training_info) stored in an external data file, or nil if there is none.
func (m *Model) FirstExternal() *pb.TensorProto {
	for _, t := range allTensors(m.Proto) {
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
	if err := m.CheckOutput(); err != nil {
		return fmt.Errorf("refusing to write %s: %w", m.Name(), err)
	}
	var restore []func()
	defer func() {
		for _, r := range restore {
			r()
		}
	}()
	var inline []*pb.TensorProto
	for _, t := range allTensors(m.Proto) {
		if _, deferred := m.Deferred(t); deferred || IsExternal(t) {
			inline = append(inline, t)
		}
	}
	li, undo, err := m.inlineLate(inline)
	if err != nil {
		return err
	}
	restore = append(restore, undo)
	if err := ctx.Err(); err != nil {
		return err
	}
	sz := proto.Size(m.Proto)
	if int64(sz) > MaxProtoSize {
		return fmt.Errorf("%w (%d bytes)", ErrTooLarge, sz)
	}
	return marshalLate(w, m.Proto, sz, li)
}

// writeTensor streams t's n bytes to w: a deferred producer writes straight
// into w (no pipe), side-file bytes go through CopyTensorRange.
func (m *Model) writeTensor(w io.Writer, t *pb.TensorProto, n int64) error {
	if d, ok := m.Deferred(t); ok {
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
	for _, t := range allTensors(m.Proto) {
		if IsExternal(t) {
			return nil, fmt.Errorf("initializer %q is stored externally; save to a file instead", t.GetName())
		}
	}
	if m.hasDeferred() {
		return nil, errors.New("model has deferred initializers; save to a file instead")
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(m.Proto)
}

// planExternal lists, in a deterministic order, the tensors whose bytes go to
// the output's side file. With ExternalKeep: external tensors; deferred ones
// unless their sources were inside the model file; when the model's weights
// came in external data (ExternalOrigin), every other initializer of the
// threshold's size or more that its file did not store inside; and when
// the model file would still exceed protobuf's limit, every initializer of
// the threshold's size or more (as ExternalRepack).
func (m *Model) planExternal(opt SaveOptions) ([]*pb.TensorProto, error) {
	if opt.External == ExternalInline {
		return nil, nil
	}
	out, err := m.planWith(opt.External, opt.Threshold)
	if err != nil || opt.External != ExternalKeep {
		return out, err
	}
	if big, err := m.overLimit(out); err != nil || !big {
		return out, err
	}
	return m.planWith(ExternalRepack, opt.Threshold)
}

// planWith is planExternal's list for one mode.
func (m *Model) planWith(mode ExternalMode, threshold int64) ([]*pb.TensorProto, error) {
	var out []*pb.TensorProto
	for _, t := range allInitializers(m.Proto) {
		d, deferred := m.Deferred(t)
		switch {
		case IsExternal(t):
			out = append(out, t)
		case mode == ExternalRepack || deferred && !d.Inline || !deferred && m.ext0 != nil && !m.ext0.inline[t.GetName()]:
			n, err := m.tensorSize(t)
			if err != nil {
				return nil, err
			}
			if n >= threshold {
				out = append(out, t)
			}
		}
	}
	// Tensors in attributes (Constant values) that live in a side file
	// move to the output's side file too, so that no output names the
	// input's.
	for _, p := range otherTensors(m.Proto) {
		if IsExternal(p.t) {
			out = append(out, p.t)
		}
	}
	return out, nil
}

// overLimit reports whether the model file would exceed MaxProtoSize with
// the tensors of moved in the side file and every other one inside.
func (m *Model) overLimit(moved []*pb.TensorProto) (bool, error) {
	out := make(map[*pb.TensorProto]bool, len(moved))
	for _, t := range moved {
		out[t] = true
	}
	var inline int64
	for _, t := range allInitializers(m.Proto) {
		if out[t] {
			continue
		}
		n, err := m.tensorSize(t)
		if err != nil {
			return false, err
		}
		inline += n
	}
	if inline <= MaxProtoSize/2 {
		return false, nil // the rest of a model is far smaller than its weights
	}
	sz := int64(proto.Size(m.Proto))
	for _, t := range allInitializers(m.Proto) {
		_, deferred := m.Deferred(t)
		switch {
		case out[t] && !IsExternal(t):
			sz -= int64(len(t.RawData))
		case !out[t] && (deferred || IsExternal(t)):
			n, _ := m.tensorSize(t)
			sz += n
		}
	}
	return sz > MaxProtoSize, nil
}

func (m *Model) tensorSize(t *pb.TensorProto) (int64, error) {
	if d, ok := m.Deferred(t); ok {
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

// ResolveOutput returns the file an output path that is a symbolic link
// leads to, so that a writer replaces that file and keeps the link (as
// writing through the link would; /dev/stdout is such a link), or path
// itself when it is no link or its target cannot be resolved (a dangling
// link is then replaced by the new file).
func ResolveOutput(path string) string {
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		return path
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		return real
	}
	return path
}

func createAtomic(path string) (*atomicFile, error) {
	CleanStaleTemps(path)
	f, err := os.CreateTemp(filepath.Dir(path), tempPrefix(path)+strconv.Itoa(os.Getpid())+"-*")
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
//
// A path that is a character device or a named pipe (/dev/stdout, a FIFO)
// is written directly, without a temporary file or rename; a directory or
// any other kind of file is refused.
func WriteFileAtomic(path string, data []byte) error {
	path = ResolveOutput(path)
	if _, mode, exists, err := IdentifyFile(path); err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	} else if direct, err := WritableMode(mode); exists && err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	} else if exists && direct {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("cannot write %s: %w", path, err)
		}
		if err := writeChunked(f, data); err != nil {
			f.Close()
			return fmt.Errorf("writing %s: %w", path, err)
		}
		return f.Close()
	}
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
