package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/internal/diff"
	"github.com/mokopt/mokopt/models"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/protobuf/proto"
)

// outFile is one file a command writes.
type outFile struct {
	path string
	// what names it in messages ("the output model", "the --report file").
	what string
	// model: a model file, which may come with a side file NAME.data.
	model bool
}

// maxNameBytes is the longest file name (one path element) the common
// file systems take.
const maxNameBytes = 255

// sidePath is the side file a model written to path gets (Save's default).
func sidePath(path string) string { return path + ".data" }

// preflightOutputs checks, before any work, that every output can be
// written: its folder exists, is a folder and is writable, and the output
// is not a folder. "-" (standard output) is always fine; an existing
// character device or named pipe is written directly (see docs/safety.md).
// A failure is a usage error (exit 2) naming the path.
func preflightOutputs(outs []outFile) error {
	for _, o := range outs {
		if o.path == "" || o.path == mokopt.Stdio {
			continue
		}
		if strings.HasSuffix(o.path, string(filepath.Separator)) {
			return usageErr(fmt.Errorf("%s %s names a folder, not a file", o.what, o.path))
		}
		_, mode, exists, err := graph.IdentifyFile(o.path)
		if errors.Is(err, syscall.ENOTDIR) {
			err = nil // writableDir names the file that is not a folder
		}
		if err != nil {
			return usageErr(fmt.Errorf("cannot write %s %s: %w", o.what, o.path, err))
		}
		if direct, err := graph.WritableMode(mode); exists && err != nil {
			return usageErr(fmt.Errorf("cannot write %s %s: %w", o.what, o.path, err))
		} else if exists && direct {
			continue // written directly, no temporary file
		}
		if err := writableDir(filepath.Dir(o.path)); err != nil {
			return usageErr(fmt.Errorf("cannot write %s %s: %w", o.what, o.path, err))
		}
	}
	return nil
}

// writableDir checks that dir is an existing folder in which files can be
// created, by creating and removing an empty temporary file there.
func writableDir(dir string) error {
	fi, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("the folder %s does not exist", dir)
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a folder", dir)
	}
	f, err := os.CreateTemp(dir, ".mokopt-probe-*")
	if err != nil {
		return fmt.Errorf("the folder %s is not writable: %w", dir, errors.Unwrap(err))
	}
	name := f.Name()
	f.Close()
	os.Remove(name)
	return nil
}

// inputRef is a file a command reads, with what it is for messages.
type inputRef struct {
	graph.FileRef
	what string
}

// modelInputs lists the files the loaded models were read from: each model
// file and the side files its check opened.
func modelInputs(ms ...*mokopt.Model) []inputRef {
	var out []inputRef
	for _, m := range ms {
		if m == nil {
			continue
		}
		for i, r := range m.Graph().InputFiles() {
			what := "the input model"
			if i > 0 || r.Path != m.Name() {
				what = "a side file of the input model " + m.Name()
			}
			out = append(out, inputRef{r, what})
		}
	}
	return out
}

// fileInputs identifies other files a command reads (an --ep-ops table);
// paths that do not exist are left out (reading them fails later).
func fileInputs(what string, paths ...string) []inputRef {
	var out []inputRef
	for _, p := range paths {
		if p == "" || p == mokopt.Stdio {
			continue
		}
		if id, mode, ok, err := graph.IdentifyFile(p); err == nil && ok && mode.IsRegular() {
			out = append(out, inputRef{graph.FileRef{Path: p, ID: id}, what})
		}
	}
	return out
}

// checkSameFiles refuses (usage error, exit 2, naming both paths) an
// output that is the same file as an input or as another output, compared
// by device and inode after following links, so that "./m.onnx", an
// absolute path, "sub/../m.onnx", a symbolic link and a hard link are all
// caught. A model output's side file (NAME.data) counts as an output too.
// With inPlace, the output model may be the input model it replaces, and
// its side file one of that model's side files (Save switches the pair
// atomically).
func checkSameFiles(inputs []inputRef, outs []outFile, inPlace bool) error {
	type entry struct {
		path, what string
		side       bool
	}
	var written []entry
	for _, o := range outs {
		if o.path == "" || o.path == mokopt.Stdio {
			continue
		}
		written = append(written, entry{o.path, o.what, false})
		if o.model {
			written = append(written, entry{sidePath(o.path), "the side file of " + o.what, true})
		}
	}
	for _, w := range written {
		// A side file is written only for a model with external weights:
		// its name is checked when it is made.
		if b := filepath.Base(w.path); !w.side && len(b) > maxNameBytes {
			return usageErr(fmt.Errorf("cannot write %s %s: its name is %d bytes, more than the %d a file name may have", w.what, diff.Printable(w.path), len(b), maxNameBytes))
		}
	}
	seen := map[graph.FileID]entry{}
	for _, w := range written {
		id, mode, exists, err := graph.IdentifyFile(w.path)
		if err != nil || !exists || !mode.IsRegular() {
			continue // nothing there to lose; devices are written directly
		}
		for _, in := range inputs {
			if in.ID != id {
				continue
			}
			if inPlace && (!w.side && in.what == "the input model" || w.side && in.what != "the input model") {
				continue
			}
			hint := ""
			if !inPlace && in.what == "the input model" && !w.side {
				hint = "; use --in-place to replace the input"
			}
			return usageErr(fmt.Errorf("refusing to write %s %s: it is the same file as %s (%s)%s", w.what, w.path, in.Path, in.what, hint))
		}
		if prev, dup := seen[id]; dup {
			return usageErr(fmt.Errorf("refusing to write %s %s: it is the same file as %s (%s)", w.what, w.path, prev.path, prev.what))
		}
		seen[id] = w
	}
	// Outputs that do not exist yet can still coincide by name.
	names := map[string]entry{}
	for _, w := range written {
		abs, err := filepath.Abs(w.path)
		if err != nil {
			continue
		}
		if prev, dup := names[abs]; dup {
			return usageErr(fmt.Errorf("refusing to write %s %s: it is the same file as %s (%s)", w.what, w.path, prev.path, prev.what))
		}
		names[abs] = w
	}
	return nil
}

// maxTokensPerRank bounds --tokens-per-rank: the kernel indexes tokens and
// schedule rows with int32.
const maxTokensPerRank = 1<<31 - 1

// checkFlagValues runs before every command: it refuses a negative count
// (any integer flag given a negative value, except seeds and the -1 that
// means "unset" where that is the default), a --tokens-per-rank past the
// kernel's int32 indices, and outputs that cannot be written (see
// preflightOutputs), all as usage errors (exit 2) before any work.
func checkFlagValues(c *cobra.Command) error {
	var err error
	var outs []outFile
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if err != nil {
			return
		}
		switch f.Value.Type() {
		case "int", "int64", "int32":
			if !f.Changed || f.Name == "seed" {
				return
			}
			v, perr := strconv.ParseInt(f.Value.String(), 10, 64)
			if perr != nil {
				return
			}
			if v < 0 && !(v == -1 && f.DefValue == "-1") {
				err = usageErr(fmt.Errorf("--%s %d is negative", f.Name, v))
			}
			if f.Name == "tokens-per-rank" && v > maxTokensPerRank {
				err = usageErr(fmt.Errorf("--tokens-per-rank %d is larger than the kernel's int32 token indices allow (%d)", v, int64(maxTokensPerRank)))
			}
		case "float64":
			if v, perr := strconv.ParseFloat(f.Value.String(), 64); f.Changed && perr == nil && (v < 0 || math.IsNaN(v)) {
				err = usageErr(fmt.Errorf("--%s %s: want a number >= 0", f.Name, f.Value.String()))
			}
		case "string":
			switch f.Name {
			case "output":
				outs = append(outs, outFile{f.Value.String(), "the output", true})
			case "report":
				outs = append(outs, outFile{f.Value.String(), "the --report file", false})
			case "plan":
				outs = append(outs, outFile{f.Value.String(), "the --plan file", false})
			}
		}
	})
	if err != nil {
		return err
	}
	return preflightOutputs(outs)
}

// genPrecheck refuses, before anything is built, a gen configuration whose
// sizes overflow or whose model file would exceed protobuf's 2 GiB limit:
// the weights when they are stored inline (or quantized, which gen keeps in
// memory), and the graph itself, measured on one and two layers and
// extrapolated to --layers.
func genPrecheck(cfg models.Config) error {
	e, h, i, s, l := int64(cfg.Experts), int64(cfg.Hidden), int64(cfg.Inter), int64(cfg.SharedInter), int64(cfg.Layers)
	if e < 1 || h < 1 || i < 1 || l < 1 || s < 0 {
		return nil // Validate names the bad value
	}
	perLayer, ok := int64(0), true
	add := func(factors ...int64) {
		p := int64(4)
		for _, f := range factors {
			if f != 0 && p > math.MaxInt64/f {
				ok = false
				return
			}
			p *= f
		}
		if perLayer > math.MaxInt64-p {
			ok = false
			return
		}
		perLayer += p
	}
	add(h, e)       // router
	add(e, 3, i, h) // gate, up and down of every expert
	add(3, s, h)    // shared expert
	if ok && perLayer > math.MaxInt64/l {
		ok = false
	}
	if !ok {
		return usageErr(fmt.Errorf("gen: %d layers of E=%d H=%d I=%d: the weight sizes overflow int64", l, e, h, i))
	}
	total := perLayer * l
	if !cfg.External && total > graph.MaxProtoSize {
		return usageErr(fmt.Errorf("gen: %d layers of E=%d H=%d I=%d hold about %d bytes of weights, more than protobuf's 2 GiB limit on a model file with its weights inside (drop --inline)", l, e, h, i, total))
	}
	if l <= 2 {
		return nil
	}
	size := func(layers int) (int64, error) {
		c := cfg
		c.Layers, c.External = layers, true
		m, err := models.Build(c)
		if err != nil {
			return 0, err
		}
		return int64(proto.Size(m.Proto)), nil
	}
	one, err := size(1)
	if err != nil {
		return nil // Build reports it
	}
	two, err := size(2)
	if err != nil {
		return nil
	}
	if d := two - one; d > 0 && (l-1) > (graph.MaxProtoSize-one)/d {
		return usageErr(fmt.Errorf("gen: --layers %d would make a model file of about %d bytes (%d per layer), more than protobuf's 2 GiB limit; nothing was built", l, one+(l-1)*d, d))
	}
	return nil
}

// rewriteOutputs lists what rewrite writes: the model (or, with
// --split-ranks N, its N rank files) and the report.
func rewriteOutputs(out, report string, split int) []outFile {
	outs := []outFile{{report, "the --report file", false}}
	if split <= 0 {
		return append(outs, outFile{out, "the output model", true})
	}
	for r := 0; r < split; r++ {
		outs = append(outs, outFile{rankPath(out, r), "the rank file", true})
	}
	return outs
}
