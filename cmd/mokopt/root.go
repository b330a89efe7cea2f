package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/graph"
	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

// subcommands registers constructors of the commands each file adds.
var subcommands []func() *cobra.Command

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "mokopt",
		Short: "Fuse Mixture-of-Experts blocks in ONNX models for the MoK megakernel",
		Long: `mokopt loads exported ONNX models, finds every Mixture-of-Experts block
(router, experts, dispatch/combine, shared expert), replaces each with one fused
ai.mok::MoE node, and lowers fused nodes to the Mixture-of-Kittens megakernel
for GB200/GB300 NVL72 racks (routed experts in MXFP8, shared expert in BF16).

Exit codes: 0 ok, 1 a check failed, 2 bad usage or unreadable input.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.SetVersionTemplate("mokopt {{.Version}}\n")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageErr(err) })
	root.PersistentFlags().BoolP("quiet", "q", false, "no progress reports on stderr")
	root.AddCommand(newVersionCmd())
	for _, f := range subcommands {
		root.AddCommand(f())
	}
	return root
}

func newVersionCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "version",
		Short: "Print mokopt's version and the ONNX IR it reads",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if asJSON {
				return writeJSON(c.OutOrStdout(), map[string]any{"schema_version": 1, "version": version, "max_ir_version": graph.MaxIRVersion})
			}
			fmt.Fprintf(c.OutOrStdout(), "mokopt %s (ONNX IR up to %d)\n", version, graph.MaxIRVersion)
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "machine-readable output")
	return c
}

// exitError carries an exit code through cobra.
type exitError struct {
	code int
	msg  string
	err  error
}

func (e *exitError) Error() string { return e.msg }
func (e *exitError) Unwrap() error { return e.err }

func usageErr(err error) error { return &exitError{code: 2, msg: err.Error(), err: err} }

// checkFailed reports a failed check (exit 1).
func checkFailed(format string, args ...any) error {
	return &exitError{code: 1, msg: fmt.Sprintf(format, args...)}
}

// exitCode maps an error to an exit code: bad input is 2, anything else 1.
func exitCode(err error) int {
	if errors.Is(err, graph.ErrBadInput) {
		return 2
	}
	return 1
}

// loadModel loads ("-": standard input) and checks a model
// (graph.Model.Check), turning any failure into a bad-input error.
func loadModel(path string) (*mokopt.Model, error) {
	m, err := mokopt.Load(path)
	if err == nil {
		if err = m.Graph().Check(); err != nil {
			m.Close()
		}
	}
	if err != nil {
		return nil, &exitError{code: 2, msg: err.Error(), err: err}
	}
	return m, nil
}

// oneStdin refuses more than one "-" among model arguments: standard input
// holds one model.
// loadPair loads the two models A and B of a comparison (at most one from
// standard input); the caller closes both.
func loadPair(args []string) (a, b *mokopt.Model, err error) {
	if err := oneStdin(args); err != nil {
		return nil, nil, err
	}
	if a, err = loadModel(args[0]); err != nil {
		return nil, nil, err
	}
	if b, err = loadModel(args[1]); err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}

func oneStdin(args []string) error {
	n := 0
	for _, a := range args {
		if a == mokopt.Stdio {
			n++
		}
	}
	if n > 1 {
		return usageErr(errors.New("only one model can be read from standard input (\"-\")"))
	}
	return nil
}

// saveModel saves m to out ("-": standard output), mapping a model that
// needs side files on a stream to a usage error.
func saveModel(c *cobra.Command, m *mokopt.Model, out string, mode mokopt.ExternalMode, progress mokopt.Progress) error {
	err := mokopt.Save(c.Context(), m, out, mokopt.SaveOptions{External: mode, Progress: progress})
	if errors.Is(err, mokopt.ErrNeedsSideFile) {
		return usageErr(fmt.Errorf("%s: %w", m.Name(), err))
	}
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
