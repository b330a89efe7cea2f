package graph

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// FileID identifies a file by device and inode number: two paths name the
// same file exactly when their FileIDs are equal, whatever their spelling
// ("./m.onnx", an absolute path, "sub/../m.onnx", a symbolic link or a hard
// link).
type FileID struct {
	Dev, Ino uint64
}

// fileIDOf returns fi's identity; ok is false where the platform gives none.
func fileIDOf(fi os.FileInfo) (FileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st == nil {
		return FileID{}, false
	}
	return FileID{Dev: uint64(st.Dev), Ino: uint64(st.Ino)}, true
}

// IdentifyFile returns the identity of the file path names after following
// symbolic links, and its mode. exists is false when nothing is there (a
// dangling link counts as nothing); err reports any other failure.
func IdentifyFile(path string) (id FileID, mode os.FileMode, exists bool, err error) {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return FileID{}, 0, false, nil
	}
	if err != nil {
		return FileID{}, 0, false, err
	}
	id, _ = fileIDOf(fi)
	return id, fi.Mode(), true, nil
}

// FileRef is a file a command reads: the path it was given by and its
// identity.
type FileRef struct {
	Path string
	ID   FileID
}

// InputFiles lists the files the model was read from: the model file
// itself (unless it came from a stream) and every side file opened for its
// external data so far (Check opens them all). The identities are those of
// the open descriptors, so a path swapped for another file since does not
// change them.
func (m *Model) InputFiles() []FileRef {
	var out []FileRef
	if m.srcOK {
		out = append(out, FileRef{Path: m.Path, ID: m.srcID})
	}
	if m.ext == nil {
		return out
	}
	m.ext.mu.Lock()
	defer m.ext.mu.Unlock()
	for _, sf := range m.ext.files {
		out = append(out, FileRef{Path: sf.path, ID: sf.id})
	}
	return out
}

// sideIDs returns the identities of the side files opened so far.
func (m *Model) sideIDs() map[FileID]string {
	out := map[FileID]string{}
	if m.ext == nil {
		return out
	}
	m.ext.mu.Lock()
	defer m.ext.mu.Unlock()
	for _, sf := range m.ext.files {
		out[sf.id] = sf.path
	}
	return out
}

// tempPrefix is the start of the name of every temporary file written for
// target: a hidden ".NAME.tmp-" in target's folder, followed by the writing
// process's id, "-" and a random part, so that a later run can tell the
// temporary files of a process that died from those of one still writing.
//
// A long name is shortened to its first bytes and a hash of the whole, so
// that a legal target name (up to the file system's 255 bytes) never makes
// a temporary name too long.
func tempPrefix(target string) string {
	base := filepath.Base(target)
	if len(base) > maxTempBase {
		h := fnv.New64a()
		h.Write([]byte(base))
		cut := base[:maxTempBase/2]
		for !utf8.ValidString(cut) {
			cut = cut[:len(cut)-1]
		}
		base = fmt.Sprintf("%s~%016x", cut, h.Sum64())
	}
	return "." + base + ".tmp-"
}

// maxTempBase is the longest target name a temporary name holds whole.
const maxTempBase = 128

// CleanStaleTemps removes the temporary files left next to target by
// earlier runs that were killed before they could remove them (".NAME.tmp-
// PID-RANDOM" whose process PID no longer runs) and returns how many it
// removed. Files of running processes and any other file are left alone.
func CleanStaleTemps(target string) int {
	dir := filepath.Dir(target)
	prefix := tempPrefix(target)
	es, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range es {
		name := e.Name()
		if !strings.HasPrefix(name, prefix) || !e.Type().IsRegular() {
			continue
		}
		pidStr, _, ok := strings.Cut(name[len(prefix):], "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 || pid == os.Getpid() || processAlive(pid) {
			continue
		}
		if os.Remove(filepath.Join(dir, name)) == nil {
			n++
		}
	}
	return n
}

// processAlive reports whether a process pid exists (signal 0 reaches it,
// or it exists but belongs to another user).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// MaxReadSize bounds the bytes read for one model file: protobuf's 2 GiB
// limit on one message. It is a variable only so that tests can lower it.
var MaxReadSize int64 = 1<<31 - 1

// ErrTooBig is wrapped by the error of a read that would exceed its limit.
var ErrTooBig = errors.New("larger than the format allows")

// ReadLimited reads all of r, refusing with an error wrapping ErrTooBig
// (and ErrBadInput) as soon as more than limit bytes arrive, so that an
// endless stream (/dev/zero, a pipe) costs at most limit bytes. name is
// used in messages; what names the format's limit.
//
// When r is a regular file the buffer is allocated once, from the length
// left to read (plus one byte, which shows that the end is reached),
// instead of growing, with copies, as the bytes arrive.
func ReadLimited(r io.Reader, limit int64, name, what string) ([]byte, error) {
	return readLimited(nil, r, limit, name, what)
}

// readLimited is ReadLimited of prefix followed by r.
func readLimited(prefix []byte, r io.Reader, limit int64, name, what string) ([]byte, error) {
	tooBig := func() error {
		return &InputError{File: name, Msg: fmt.Sprintf("more than %d bytes (%s)", limit, what), Err: ErrTooBig}
	}
	if int64(len(prefix)) > limit {
		return nil, tooBig()
	}
	hint := int64(512)
	if n, ok := leftToRead(r); ok {
		hint = n
	}
	b := make([]byte, len(prefix), min(int64(len(prefix))+hint, limit)+1)
	copy(b, prefix)
	lr := &io.LimitedReader{R: r, N: limit + 1 - int64(len(prefix))}
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // grown as io.ReadAll grows
		}
		k, err := lr.Read(b[len(b):cap(b)])
		b = b[:len(b)+k]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, &InputError{File: name, Msg: "cannot read", Err: err}
		}
	}
	if int64(len(b)) > limit {
		return nil, tooBig()
	}
	return b, nil
}

// leftToRead returns the bytes between a regular file's offset and its
// end; ok is false for any other reader.
func leftToRead(r io.Reader) (n int64, ok bool) {
	f, isFile := r.(*os.File)
	if !isFile {
		return 0, false
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return 0, false
	}
	off, err := f.Seek(0, io.SeekCurrent)
	if err != nil || off > fi.Size() {
		return 0, false
	}
	return fi.Size() - off, true
}

// ReadFileLimited reads a file of at most limit bytes. A regular file
// larger than limit is refused from its size before anything is read;
// anything else (a pipe, a device) is read up to limit+1 bytes. A
// directory is refused. what describes the limit for the message (for
// example "protobuf's 2 GiB limit").
func ReadFileLimited(path string, limit int64, what string) ([]byte, error) {
	f, err := openNoWait(path)
	if err != nil {
		return nil, &InputError{File: path, Msg: "cannot read", Err: err}
	}
	defer f.Close()
	return readOpened(f, path, limit, what)
}

// openNoWait opens path for reading without waiting for a writer when it
// is a named pipe (O_NONBLOCK): a pipe nobody writes to reads as empty
// instead of hanging; reads from a pipe with a writer still wait for data.
func openNoWait(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}

func readOpened(f *os.File, path string, limit int64, what string) ([]byte, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, &InputError{File: path, Msg: "cannot read", Err: err}
	}
	switch {
	case fi.IsDir():
		return nil, badInput(path, "", "is a directory, not a file")
	case fi.Mode().IsRegular() && fi.Size() > limit:
		return nil, &InputError{File: path, Msg: fmt.Sprintf("%d bytes, more than %s (%d bytes)", fi.Size(), what, limit), Err: ErrTooBig}
	}
	return ReadLimited(f, limit, path, what)
}

// ReadModelBytes reads a serialized model from r, up to protobuf's 2 GiB
// limit (MaxReadSize), failing early on a stream whose first bytes cannot
// start a ModelProto (a zero tag, as /dev/zero gives) instead of reading
// it to the limit.
func ReadModelBytes(r io.Reader, name string) ([]byte, error) {
	head, err := readHead(r, name)
	if err != nil {
		return nil, err
	}
	if len(head) < headSize {
		return head, nil
	}
	return readLimited(head, r, MaxReadSize, name, "protobuf's 2 GiB limit on one message")
}

// headSize is how many bytes readHead reads.
const headSize = 16

// readHead reads the first headSize bytes of a model stream (fewer when it
// ends before) and checks that they can start a ModelProto, so that a
// stream that cannot (/dev/zero) is refused at once.
func readHead(r io.Reader, name string) ([]byte, error) {
	head := make([]byte, headSize)
	n, err := io.ReadFull(r, head)
	head = head[:n]
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return nil, &InputError{File: name, Msg: "cannot read model", Err: err}
	}
	if err := checkHead(head, n < headSize); err != nil {
		return nil, &InputError{File: name, Msg: "not a valid ONNX protobuf (truncated or corrupt)", Err: err}
	}
	return head, nil
}

// checkHead checks that b starts with a valid protobuf field tag.
func checkHead(b []byte, whole bool) error {
	if len(b) == 0 {
		return nil // an empty message; Parse says what is missing
	}
	num, typ, k := protowire.ConsumeTag(b)
	if k < 0 {
		if !whole && len(b) < 10 {
			return nil
		}
		return protowire.ParseError(k)
	}
	if num < 1 || typ > protowire.Fixed32Type || typ == protowire.StartGroupType || typ == protowire.EndGroupType {
		return fmt.Errorf("field %d of wire type %d cannot start a ModelProto", num, typ)
	}
	return nil
}

// ReadProtoFile reads one serialized protobuf message (a test_data_set's
// input_N.pb, say) from path, as Load reads a model: a directory is
// refused, a regular file larger than protobuf's 2 GiB limit is refused
// from its size, and a pipe or device is read up to that limit, failing
// early when its first bytes cannot start a message (/dev/zero).
func ReadProtoFile(path string) ([]byte, error) {
	f, err := openNoWait(path)
	if err != nil {
		return nil, &InputError{File: path, Msg: "cannot read", Err: err}
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, &InputError{File: path, Msg: "cannot read", Err: err}
	}
	switch {
	case fi.IsDir():
		return nil, badInput(path, "", "is a directory, not a file")
	case fi.Mode().IsRegular() && fi.Size() > MaxReadSize:
		return nil, &InputError{File: path, Msg: fmt.Sprintf("%d bytes, more than protobuf's 2 GiB limit (%d bytes)", fi.Size(), MaxReadSize), Err: ErrTooBig}
	}
	return ReadModelBytes(f, path)
}
