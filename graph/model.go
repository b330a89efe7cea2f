// Package graph loads and saves ONNX models with full fidelity and offers a
// mutable index over a model's graph (producers, consumers, initializers,
// topological order, dead-code removal, validation). It holds no MoE
// knowledge.
//
// Models are kept as the generated protobuf messages (package onnxpb) and are
// edited in place, so every field, including unknown ones, rides along. The
// bytes of externally stored initializers are read lazily, with ranged reads
// of the side files, and are streamed to the output on save.
package graph

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"unsafe"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// MaxIRVersion is the newest ONNX IR version this build understands (onnx.proto v1.22.0).
const MaxIRVersion = 13

// Model is a loaded ONNX model: the protobuf message plus what is needed to
// reach its external data.
type Model struct {
	// Proto is the model message; edit it in place.
	Proto *pb.ModelProto
	// Path is the file the model was loaded from ("" when loaded from bytes).
	Path string
	// Dir is the folder external data locations are resolved against.
	Dir string

	ext *externalStore
	// borrowed: ext is another model's (a fork's), which Close leaves open.
	borrowed bool
	deferred *deferredSet
	// ext0 is what the model's weights came in (see ExternalOrigin).
	ext0 *externalOrigin
	// srcID identifies the file the model was loaded from (srcOK: known),
	// so that Save can tell an in-place save from any other.
	srcID FileID
	srcOK bool
	// labels names the tensors held in node attributes (Constant values,
	// sparse values) for messages; Check fills it.
	labels map[*pb.TensorProto]string
	// spare is the index Check built, handed to the next Graph call (see
	// Graph) when the graph's node, initializer, input and output lists
	// are still the ones it indexed.
	spare    *Graph
	spareSig graphSig
	// mu guards labels, spare and spareSig, which read-only entry points
	// (Check, Graph) set, so that goroutines can share a model, and the
	// deferred pointer, made on first use.
	mu sync.Mutex
}

// labelMap returns the labels Check recorded, to share with a copy (the
// map is never written once published).
func (m *Model) labelMap() map[*pb.TensorProto]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.labels
}

// label returns the label Check recorded for a tensor held in an
// attribute, or "".
func (m *Model) label(t *pb.TensorProto) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.labels[t]
}

// graphSig identifies the lists of a GraphProto: its message and the
// backing arrays and lengths of its node, initializer, input and output
// lists.
type graphSig struct {
	gp                  *pb.GraphProto
	node, init, in, out uintptr
	nNode, nInit        int
	nIn, nOut           int
}

func sigOf(gp *pb.GraphProto) graphSig {
	return graphSig{gp: gp,
		node: uintptr(unsafe.Pointer(unsafe.SliceData(gp.Node))), init: uintptr(unsafe.Pointer(unsafe.SliceData(gp.Initializer))),
		in: uintptr(unsafe.Pointer(unsafe.SliceData(gp.Input))), out: uintptr(unsafe.Pointer(unsafe.SliceData(gp.Output))),
		nNode: len(gp.Node), nInit: len(gp.Initializer), nIn: len(gp.Input), nOut: len(gp.Output)}
}

// DeferredData produces the raw little-endian bytes of an initializer at
// save time, so that large tensors built by a pass (for example experts
// stacked from per-expert side-file tensors) stream to the output instead of
// being held in memory. Size must be the exact number of bytes Write writes.
// Saved with ExternalKeep, a deferred tensor goes to the side file (from the
// threshold's size) unless Inline says that its sources were stored inside
// the model file, where it then stays too. Range, when set, writes bytes
// [off, off+n) alone, doing only the work those bytes need: readers of a
// range (CopyTensorRange, ReadTensorAt) use it instead of running Write and
// dropping the rest, which for a tensor read a part at a time (a stack of
// experts, an expert at a time) would make the whole tensor once per part.
type DeferredData struct {
	Size   int64
	Write  func(w io.Writer) error
	Inline bool
	Range  func(w io.Writer, off, n int64) error
}

// Load reads an ONNX model file. External data is not read; it is opened
// lazily when a tensor's bytes are asked for. The file is decoded as it is
// read, its tensors' bytes read straight into the model (no copy of the
// whole file is held), with the result Parse gives for the file's bytes. It
// may be a pipe or a device (as /dev/stdin), read to its end (see Read); a
// regular file larger than protobuf's 2 GiB limit is refused from its
// size.
func Load(path string) (*Model, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &InputError{File: path, Msg: "cannot read model", Err: err}
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, &InputError{File: path, Msg: "cannot read model", Err: err}
	}
	switch {
	case fi.IsDir():
		return nil, badInput(path, "", "is a directory, not a model file")
	case fi.Mode().IsRegular() && fi.Size() > MaxReadSize:
		return nil, &InputError{File: path, Msg: fmt.Sprintf("%d bytes, more than protobuf's 2 GiB limit on one model file (%d bytes)", fi.Size(), MaxReadSize), Err: ErrTooBig}
	}
	var m *Model
	if fi.Mode().IsRegular() {
		m, err = loadStream(f, fi.Size(), path)
		if err != nil {
			return nil, err
		}
	}
	if !fi.Mode().IsRegular() {
		// A pipe or a device: decoded as it is read, to its end.
		if m, err = Read(f, path); err != nil {
			return nil, err
		}
	}
	if m == nil {
		// A file the streaming decoder left to proto.Unmarshal (which
		// gives the exact error): read it whole.
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return nil, &InputError{File: path, Msg: "cannot read model", Err: err}
		}
		b, err := ReadModelBytes(f, path)
		if err != nil {
			return nil, err
		}
		if m, err = Parse(b, path); err != nil {
			return nil, err
		}
	}
	m.srcID, m.srcOK = fileIDOf(fi)
	return m, nil
}

// Read decodes a model from r, a stream (a pipe, standard input) read to
// its end; name is used in messages. The stream is decoded as it is read,
// its tensors' bytes read straight into the model, so that the encoding is
// never held in memory whole; more than protobuf's 2 GiB limit is refused.
// The garbage collector is paused while it reads (see Parse), however slow
// the stream's writer.
// External data is resolved against name's folder ("." for "-" or "").
func Read(r io.Reader, name string) (*Model, error) {
	head, err := readHead(r, name)
	if err != nil {
		return nil, err
	}
	mp := &pb.ModelProto{}
	defer pauseGC()() // as in Parse
	switch err := unmarshalStream(io.MultiReader(bytes.NewReader(head), r), MaxReadSize, mp); {
	case errors.Is(err, ErrTooBig):
		return nil, &InputError{File: name, Msg: fmt.Sprintf("more than %d bytes (protobuf's 2 GiB limit on one message)", MaxReadSize), Err: ErrTooBig}
	case errors.Is(err, errMalformed):
		return nil, &InputError{File: name, Msg: "not a valid ONNX protobuf (truncated or corrupt)", Err: err}
	case err != nil:
		return nil, &InputError{File: name, Msg: "cannot read model", Err: err}
	}
	return newModel(mp, name)
}

// loadStream decodes the regular file f of size bytes with unmarshalFrom,
// so that tensor bytes go from the file straight into the model, never
// into a copy of the whole file. It returns a nil model, and no error,
// where unmarshalFrom gave up.
func loadStream(f *os.File, size int64, path string) (*Model, error) {
	mp := &pb.ModelProto{}
	if size >= 1<<20 {
		defer pauseGC()() // as in Parse
	}
	if unmarshalFrom(f, size, mp) != nil {
		return nil, nil
	}
	return newModel(mp, path)
}

// Parse decodes a serialized ModelProto. name is used in error messages and,
// when it is a file path, to resolve external data. While a model of 1 MiB
// or more is decoded the garbage collector is paused (process-wide, as
// debug.SetGCPercent(-1); a memory limit still applies) and the previous
// setting is restored afterwards.
func Parse(b []byte, name string) (*Model, error) {
	mp := &pb.ModelProto{}
	// Nearly everything decoding allocates is the model itself, which stays
	// live: collecting meanwhile would only mark it again and again (three
	// or four cycles for a big graph). The collector resumes, and catches
	// up once, when decoding is done; a memory limit still applies.
	if len(b) >= 1<<20 {
		defer pauseGC()()
	}
	if err := (proto.UnmarshalOptions{}).Unmarshal(b, mp); err != nil {
		return nil, &InputError{File: name, Msg: "not a valid ONNX protobuf (truncated or corrupt)", Err: err}
	}
	return newModel(mp, name)
}

// newModel vets a decoded ModelProto and makes it a Model.
func newModel(mp *pb.ModelProto, name string) (*Model, error) {
	if mp.Graph == nil {
		return nil, badInput(name, "", "not an ONNX model: the ModelProto has no graph")
	}
	if v := mp.GetIrVersion(); v < 1 || v > MaxIRVersion {
		return nil, badInput(name, "", "unsupported IR version %d (this build reads 1..%d)", v, MaxIRVersion)
	}
	dir := "."
	if name != "" && name != "-" {
		dir = filepath.Dir(name)
	}
	m := &Model{Proto: mp, Path: name, Dir: dir}
	m.ext = newExternalStore(dir, name)
	m.ext0 = originOf(mp)
	return m, nil
}

// externalOrigin records that a model's weights came in external data, and
// which initializers were stored inside its file all the same.
type externalOrigin struct {
	inline map[string]bool
}

// originOf is the origin of a model as decoded: nil when none of its
// tensors is stored externally.
func originOf(mp *pb.ModelProto) *externalOrigin {
	ext := false
	for _, t := range allTensors(mp) {
		if IsExternal(t) {
			ext = true
			break
		}
	}
	if !ext {
		return nil
	}
	o := &externalOrigin{inline: map[string]bool{}}
	for _, t := range allInitializers(mp) {
		if !IsExternal(t) {
			o.inline[t.GetName()] = true
		}
	}
	return o
}

// ExternalOrigin reports whether m's weights came in external data: some
// tensor of the file it was loaded from was stored in a side file (or
// SetExternalOrigin said so). Saved with ExternalKeep, such a model writes
// every initializer of the threshold's size or more to the output's side
// file, except those its file stored inside: the weights a pass made (a
// lowering's, a merge's) go where the weights they came from were.
func (m *Model) ExternalOrigin() bool { return m.ext0 != nil }

// SetExternalOrigin marks m as a model whose weights came in external data
// when from's did (a model built from another, such as a merge of rank
// files, whose initializers are all its own).
func (m *Model) SetExternalOrigin(from *Model) {
	if from != nil && from.ext0 != nil && m.ext0 == nil {
		m.ext0 = &externalOrigin{inline: map[string]bool{}}
	}
}

// gcPause counts the decodings in progress that paused the collector, so
// that concurrent ones restore the setting found by the first only when the
// last is done.
var gcPause struct {
	sync.Mutex
	n    int
	prev int
}

// pauseGC turns the collector off until the returned function is called.
func pauseGC() func() {
	gcPause.Lock()
	if gcPause.n == 0 {
		gcPause.prev = debug.SetGCPercent(-1)
	}
	gcPause.n++
	gcPause.Unlock()
	return func() {
		gcPause.Lock()
		if gcPause.n--; gcPause.n == 0 {
			debug.SetGCPercent(gcPause.prev)
		}
		gcPause.Unlock()
	}
}

// Close releases the side files opened for external data.
func (m *Model) Close() error {
	if m == nil || m.ext == nil || m.borrowed {
		return nil
	}
	return m.ext.close()
}

// Graph returns a mutable index over the model's main graph. The first call
// after a successful Check returns the index Check built instead of a new
// one, provided the graph's node, initializer, input and output lists were
// not replaced or resized in between (edit a loaded model through the
// returned index, or call Reindex on it after editing the message).
func (m *Model) Graph() *Graph {
	m.mu.Lock()
	g, sig := m.spare, m.spareSig
	m.spare = nil
	m.mu.Unlock()
	if g != nil && g.P == m.Proto.Graph && sig == sigOf(m.Proto.Graph) {
		return g
	}
	return NewGraph(m.Proto.Graph)
}

// SetDeferred registers a tensor whose bytes are produced at save time.
// The tensor must carry dims and data_type but no data.
func (m *Model) SetDeferred(t *pb.TensorProto, d DeferredData) {
	ds := m.deferredSet(true)
	ds.mu.Lock()
	ds.m[t] = d
	ds.mu.Unlock()
}

// deferredSet returns m's deferred tensors, made when create says so (nil
// otherwise when there are none).
func (m *Model) deferredSet(create bool) *deferredSet {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.deferred == nil && create {
		m.deferred = &deferredSet{m: map[*pb.TensorProto]DeferredData{}}
	}
	return m.deferred
}

// deferredSet holds a model's deferred tensors (see SetDeferred), shared
// by the models WithGraph makes of it. Its lock lets a goroutine read a
// deferred tensor of the model (a check running ahead on a fork) while
// another registers more.
type deferredSet struct {
	mu sync.RWMutex
	m  map[*pb.TensorProto]DeferredData
}

// hasDeferred reports whether m has a deferred tensor.
func (m *Model) hasDeferred() bool {
	ds := m.deferredSet(false)
	if ds == nil {
		return false
	}
	ds.mu.RLock()
	defer ds.mu.RUnlock()
	return len(ds.m) > 0
}

// ShareDeferred registers on m every deferred tensor of src that m lacks,
// with src's producers, which go on reading src's tensors: for a fork
// (Fork) taken before a pass registered tensors on src that the fork's
// readers need.
func (m *Model) ShareDeferred(src *Model) {
	ds := src.deferredSet(false)
	if ds == nil || ds == m.deferredSet(false) {
		return
	}
	ds.mu.RLock()
	defer ds.mu.RUnlock()
	for t, d := range ds.m {
		if _, ok := m.Deferred(t); !ok {
			m.SetDeferred(t, d)
		}
	}
}

// Opset returns the opset version the model imports for domain ("" or
// "ai.onnx" for the default domain), or 0 if it does not import it.
func (m *Model) Opset(domain string) int64 {
	for _, o := range m.Proto.OpsetImport {
		d := o.GetDomain()
		if d == domain || (domain == "" && d == "ai.onnx") || (domain == "ai.onnx" && d == "") {
			return o.GetVersion()
		}
	}
	return 0
}

// SetOpset declares domain at version in opset_import, replacing an existing entry.
func (m *Model) SetOpset(domain string, version int64) {
	for _, o := range m.Proto.OpsetImport {
		if o.GetDomain() == domain {
			o.Version = proto.Int64(version)
			return
		}
	}
	m.Proto.OpsetImport = append(m.Proto.OpsetImport, &pb.OperatorSetIdProto{Domain: proto.String(domain), Version: proto.Int64(version)})
}

// Metadata returns the value of a metadata_props key and whether it exists.
func (m *Model) Metadata(key string) (string, bool) {
	for _, p := range m.Proto.MetadataProps {
		if p.GetKey() == key {
			return p.GetValue(), true
		}
	}
	return "", false
}

// SetMetadata sets (or adds) a metadata_props entry.
func (m *Model) SetMetadata(key, value string) {
	for _, p := range m.Proto.MetadataProps {
		if p.GetKey() == key {
			p.Value = proto.String(value)
			return
		}
	}
	m.Proto.MetadataProps = append(m.Proto.MetadataProps, &pb.StringStringEntryProto{Key: proto.String(key), Value: proto.String(value)})
}

// Name returns a short name for messages: the file path or "model".
func (m *Model) Name() string {
	if m.Path == "" {
		return "model"
	}
	return m.Path
}
