// Package mokopt is the library API of mokopt, for export pipelines that
// want to fuse Mixture-of-Experts blocks without shelling out to the CLI.
//
// The flow mirrors the command line:
//
//	m, err := mokopt.Load("model.onnx")        // or "-" for standard input
//	rep, err := mokopt.Rewrite(ctx, m, mokopt.RewriteOptions{})
//	err = mokopt.Save(ctx, m, "fused.onnx", mokopt.SaveOptions{})
//	lrep, err := mokopt.Lower(ctx, m, mokopt.TargetGB300NVL72, mokopt.LowerOptions{EP: 8})
//	vrep, err := mokopt.Verify(ctx, a, b, mokopt.VerifyOptions{}) // the CLI's defaults
//	res, err := mokopt.Diff(a, b)
//
// Long work takes a context.Context: detection, the numerical check,
// the rewrite, saving (where external weights are streamed and lowering's
// MXFP8 quantization runs) and the reference interpreter stop promptly when
// it is cancelled, returning an error for which errors.Is(err,
// context.Canceled) holds; a cancelled Save leaves no output or temporary
// file.
//
// Errors are typed, for errors.As and errors.Is:
//
//   - *InputError (errors.Is(err, ErrBadInput)): a malformed or unreadable
//     input, naming the file and the node or tensor;
//   - *UnsupportedPatternError (ErrUnsupportedPattern): Rewrite refused MoE
//     candidates, each with its reason;
//   - *KernelConstraintError (ErrKernelConstraint): Lower with Strict
//     refused the model, listing the violated kernel constraints with
//     their codes and numbers;
//   - *MismatchError (ErrMismatch): Verify found outputs that differ.
//
// Options carry an optional Progress callback, which the mokopt command
// turns into a progress bar (or periodic lines on stderr).
package mokopt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/mokopt/mokopt/graph"
)

// Model is a loaded ONNX model. Close it to release the side files of
// its external data.
//
// Inspect, InspectWith, Verify, Run and Diff only read a Model:
// goroutines may call them on one Model at once. Rewrite, Lower,
// SplitRanks, Save and Write edit it or its index, and need it to
// themselves; Close must come after every other call.
type Model struct {
	g *graph.Model
}

// Graph returns the underlying model, for lower-level packages
// (graph, passes, lowering, verify, diff).
func (m *Model) Graph() *graph.Model { return m.g }

// Name returns the file the model was loaded from ("-" for standard input).
func (m *Model) Name() string { return m.g.Name() }

// Close releases the side files opened for external data.
func (m *Model) Close() error { return m.g.Close() }

// Wrap makes a Model of a graph.Model (for example one built by the models
// package).
func Wrap(g *graph.Model) *Model { return &Model{g: g} }

// Stdio is the file name that stands for standard input (Load) or standard
// output (Save).
const Stdio = "-"

// Load reads an ONNX model file; its external data is read lazily, when
// needed. The name "-" reads standard input, which must hold a
// self-contained model (see Read).
func Load(path string) (*Model, error) {
	if path == Stdio {
		return Read(os.Stdin, Stdio)
	}
	g, err := graph.Load(path)
	if err != nil {
		return nil, err
	}
	return &Model{g: g}, nil
}

// Read reads a self-contained model (no external data) from r; name is
// used in messages. A model whose initializers refer to side files is
// refused with an *InputError naming the tensor, since a stream has no
// folder to find them in.
func Read(r io.Reader, name string) (*Model, error) {
	g, err := graph.Read(r, name)
	if err != nil {
		return nil, err
	}
	if t := g.FirstExternal(); t != nil {
		ref, _ := graph.External(t)
		return nil, &InputError{File: name, Object: fmt.Sprintf("initializer %q", t.GetName()),
			Msg: fmt.Sprintf("stored in the external data file %q, which a model read from a stream cannot reach; pass the model's file path instead", ref.Location)}
	}
	return &Model{g: g}, nil
}

// ExternalMode says where initializer bytes go when a model is saved.
type ExternalMode = graph.ExternalMode

// External data modes for SaveOptions.External.
const (
	// ExternalKeep keeps external tensors external and inline ones inline.
	ExternalKeep = graph.ExternalKeep
	// ExternalRepack moves every initializer of 1 KiB or more to the side file.
	ExternalRepack = graph.ExternalRepack
	// ExternalInline stores every initializer inside the model file.
	ExternalInline = graph.ExternalInline
)

// ParseExternalMode maps "keep", "repack" or "inline" to an ExternalMode.
func ParseExternalMode(s string) (ExternalMode, error) { return graph.ParseExternalMode(s) }

// ErrNeedsSideFile is wrapped by Save's error when a model with external
// data is written to standard output (or another stream) without
// ExternalInline.
var ErrNeedsSideFile = graph.ErrNeedsSideFile

// SaveOptions control Save.
type SaveOptions struct {
	// External says where initializer bytes go (default ExternalKeep).
	External ExternalMode
	// Progress, when set, receives "save" events counting bytes written to
	// the side file (where lowered weights are quantized).
	Progress Progress
}

// Save writes m to path atomically (temporary files in the target folder,
// synced, renamed; a failure or cancellation leaves no output and no
// temporary file). External data goes to path + ".data". The path "-"
// writes a self-contained model to standard output (see Write).
func Save(ctx context.Context, m *Model, path string, opt SaveOptions) error {
	return save(ctx, m, path, opt, nil)
}

// save is Save, calling ready (when not nil) before it commits anything
// (graph.SaveOptions.Ready).
func save(ctx context.Context, m *Model, path string, opt SaveOptions, ready func() error) error {
	if path == Stdio {
		return write(ctx, m, os.Stdout, opt, ready)
	}
	so := graph.SaveOptions{External: opt.External, Context: ctx, Ready: ready}
	if opt.Progress != nil {
		so.Progress = func(written, total int64) {
			opt.Progress(Event{Stage: StageSave, Done: written, Total: total, Bytes: true})
		}
	}
	return m.g.Save(path, so)
}

// Write writes m as one self-contained model file to w. Deferred weights
// (lowering's) are computed inline; a model with external data is refused
// with an error wrapping ErrNeedsSideFile unless opt.External is
// ExternalInline. Nothing is written to w unless the whole model encodes:
// the encoding is held until then, in memory up to 16 MiB and beyond that
// in an unnamed temporary file (in os.TempDir), so that memory stays
// bounded for any model.
func Write(ctx context.Context, m *Model, w io.Writer, opt SaveOptions) error {
	return write(ctx, m, w, opt, nil)
}

// write is Write, calling ready (when not nil) once the model is encoded
// and before anything is written to w; an error from it writes nothing.
func write(ctx context.Context, m *Model, w io.Writer, opt SaveOptions, ready func() error) error {
	sp := &spool{limit: spoolMemory}
	defer sp.close()
	if err := m.g.Encode(sp, graph.SaveOptions{External: opt.External, Context: ctx}); err != nil {
		return err
	}
	if ready != nil {
		if err := ready(); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return sp.copyTo(w)
}

// spoolMemory is the most of an encoding Write holds in memory; a
// variable so that tests can lower it.
var spoolMemory = 16 << 20

// spool holds what is written to it: in memory up to limit bytes, then in
// a temporary file, removed from its folder as soon as it is created.
type spool struct {
	limit int
	mem   []byte
	f     *os.File
}

func (s *spool) Write(p []byte) (n int, err error) {
	if s.f == nil && len(s.mem)+len(p) <= s.limit {
		s.mem = append(s.mem, p...)
		return len(p), nil
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("holding the encoding until it is complete: %w", err)
		}
	}()
	if s.f == nil {
		f, err := os.CreateTemp("", "mokopt-spool-*.onnx")
		if err != nil {
			return 0, err
		}
		os.Remove(f.Name()) // the open file lives on, nameless (close removes it where this fails)
		s.f = f
		if _, err := f.Write(s.mem); err != nil {
			return 0, err
		}
		s.mem = nil
	}
	return s.f.Write(p)
}

// copyTo writes what the spool holds to w.
func (s *spool) copyTo(w io.Writer) error {
	if s.f == nil {
		_, err := w.Write(s.mem)
		return err
	}
	if _, err := s.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	_, err := io.Copy(w, s.f)
	return err
}

// close frees the spool's temporary file.
func (s *spool) close() {
	if s.f != nil {
		s.f.Close()
		os.Remove(s.f.Name()) // gone already where an open file can be removed
	}
}

// Progress receives progress events of long work. It is called on the
// goroutine doing the work and must return quickly.
type Progress func(Event)

// serialize wraps the progress functions ps point to (nil ones stay nil)
// so that calls from several goroutines reach them one at a time, under
// one lock for all of them.
func serialize(ps ...*Progress) {
	var mu sync.Mutex
	for _, p := range ps {
		if f := *p; f != nil {
			*p = func(e Event) {
				mu.Lock()
				defer mu.Unlock()
				f(e)
			}
		}
	}
}

// Stages reported in Event.Stage.
const (
	StageDetect  = "detect"  // MoE candidates examined
	StageWeights = "weights" // blocks whose weights were read
	StageCheck   = "check"   // blocks numerically checked
	StageFuse    = "fuse"    // blocks fused
	StageSave    = "save"    // bytes written to the side file
	StageVerify  = "verify"  // interpreter runs done
	StageLower   = "lower"   // blocks lowered
)

// Event is one progress report: Done of Total units of Stage.
type Event struct {
	Stage       string
	Done, Total int64
	// Bytes is true when Done and Total count bytes.
	Bytes bool
}

func (p Progress) report(stage string, done, total int) {
	if p != nil {
		p(Event{Stage: stage, Done: int64(done), Total: int64(total)})
	}
}

// errCtx returns ctx's error when it is done.
func errCtx(ctx context.Context) error {
	if ctx == nil {
		return errors.New("mokopt: nil context")
	}
	return ctx.Err()
}
