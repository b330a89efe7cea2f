package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/kernel"
	"github.com/mokopt/mokopt/lowering"
	"github.com/mokopt/mokopt/models"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
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

Exit codes (every command): 0 ok; 1 a check failed (verify found a mismatch,
rewrite or lower refused a block, diff found differences); 2 bad usage (unknown
command or flag, missing or extra arguments, a bad flag value) or an input that
cannot be read or run; 130 interrupted (nothing written).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.SetVersionTemplate("mokopt {{.Version}}\n")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageErr(err) })
	// Negative counts and unwritable outputs are refused before any work (files.go).
	// So is a flag that the command's mode or target does not use (unused.go).
	root.PersistentPreRunE = func(c *cobra.Command, _ []string) error {
		if err := checkUnused(c); err != nil {
			return err
		}
		return checkFlagValues(c)
	}
	root.PersistentFlags().BoolP("quiet", "q", false, "no progress reports on stderr")
	// --version has no shorthand: -v is --verbose where a command has it.
	root.Flags().Bool("version", false, "print mokopt's version")
	root.AddCommand(newVersionCmd())
	for _, f := range subcommands {
		root.AddCommand(f())
	}
	root.SetHelpCommand(newHelpCmd())
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	usageArgs(root)
	registerCompletions(root)
	setExamples(root)
	return root
}

// usageArgs makes every argument error of c and its subcommands a usage
// error (exit 2): wrong argument counts, unknown commands and unknown
// subcommands. A command that only groups subcommands (the root,
// completion) becomes runnable so that an unknown subcommand reaches its
// argument check instead of printing help with exit 0; without arguments
// it prints its help.
func usageArgs(c *cobra.Command) {
	check := c.Args
	if c.HasSubCommands() {
		if !c.Runnable() {
			c.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
		}
		check = unknownCommand
	} else if check == nil {
		check = cobra.ArbitraryArgs
	}
	c.Args = func(c *cobra.Command, args []string) error {
		err := check(c, args)
		var ex *exitError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &ex):
			return err
		case c.HasSubCommands() || strings.HasPrefix(err.Error(), "unknown command"):
			return usageErr(err)
		}
		// The command's path without the program's name, which the printed
		// message already starts with ("mokopt: verify: …").
		path := strings.TrimPrefix(c.CommandPath(), c.Root().Name()+" ")
		return usageErr(fmt.Errorf("%s: %w (usage: %s)", path, err, c.UseLine()))
	}
	for _, s := range c.Commands() {
		usageArgs(s)
	}
}

// unknownCommand refuses any argument of a command that only groups
// subcommands, suggesting close subcommand names.
func unknownCommand(c *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], c.CommandPath())
	if s := c.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return fmt.Errorf("%s (see %s --help)", msg, c.CommandPath())
}

// newHelpCmd is `mokopt help [command]`; an unknown topic is a usage error.
func newHelpCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "help [command]",
		Short:   "Help about any command",
		Example: "  mokopt help rewrite\n  mokopt help completion bash",
		ValidArgsFunction: func(c *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			cmd, rest, err := c.Root().Find(args)
			if err != nil || len(rest) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var out []cobra.Completion
			for _, s := range cmd.Commands() {
				if s.IsAvailableCommand() && strings.HasPrefix(s.Name(), toComplete) {
					out = append(out, cobra.CompletionWithDesc(s.Name(), s.Short))
				}
			}
			return out, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(c *cobra.Command, args []string) error {
			cmd, rest, err := c.Root().Find(args)
			if err == nil && len(rest) > 0 {
				err = fmt.Errorf("unknown help topic %q", strings.Join(args, " "))
			}
			if err != nil {
				return usageErr(err)
			}
			return cmd.Help()
		},
	}
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
	return saveModelError(m, mokopt.Save(c.Context(), m, out, mokopt.SaveOptions{External: mode, Progress: progress}))
}

// saveModelError is the command's error for saving m failing with err: a
// usage error where the output needs a side file it cannot have.
func saveModelError(m *mokopt.Model, err error) error {
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

// lowerTargets returns the names --target accepts: the machines the MoK
// kernel runs on, then ONNX Runtime.
func lowerTargets() []string {
	var out []string
	for _, t := range kernel.Targets() {
		if t.Supported {
			out = append(out, t.Name)
		}
	}
	return append(out, lowering.TargetORT)
}

// flagValues lists the values shell completion offers for each enumerated
// flag, by flag name (the same name means the same values in every command).
var flagValues = map[string]func() []string{
	"target":        lowerTargets,
	"format":        func() []string { return []string{"text", "json", "markdown", "dot", "html"} },
	"color":         func() []string { return []string{"auto", "always", "never"} },
	"engine":        engineNames,
	"quant":         func() []string { return []string{"int8", "int4"} },
	"external-data": func() []string { return []string{"keep", "repack", "inline"} },
	"shape":         func() []string { return models.Shapes },
	"router":        func() []string { return []string{"softmax", "sigmoid"} },
	"ep-form":       func() []string { return models.EPForms },
	"placement":     func() []string { return []string{models.BeforeCombine, models.AfterCombine} },
}

// dirFlags are the flags whose value is a folder.
var dirFlags = map[string]bool{"data": true, "check-data": true}

// registerCompletions registers the completion of every enumerated flag
// (flagValues) and folder flag of c and its subcommands.
func registerCompletions(c *cobra.Command) {
	c.LocalFlags().VisitAll(func(f *pflag.Flag) {
		if values, ok := flagValues[f.Name]; ok {
			_ = c.RegisterFlagCompletionFunc(f.Name, func(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
				return values(), cobra.ShellCompDirectiveNoFileComp
			})
		}
		if dirFlags[f.Name] {
			_ = c.MarkFlagDirname(f.Name)
		}
	})
	for _, s := range c.Commands() {
		registerCompletions(s)
	}
}

// examples holds the Example: section of every command, by command path.
var examples = map[string]string{
	"mokopt": `  mokopt rewrite model.onnx -o fused.onnx
  mokopt verify fused.onnx model.onnx
  mokopt lower fused.onnx -o lowered.onnx --target gb300-nvl72`,
	"mokopt rewrite": `  # fuse every MoE block; exit 1 and write nothing if one cannot be fused
  mokopt rewrite model.onnx -o fused.onnx
  # fuse what can be fused, keep the JSON report
  mokopt rewrite model.onnx -o fused.onnx --partial --report rewrite.json
  # a pipe: the model on standard input and output
  cat model.onnx | mokopt rewrite - -o - > fused.onnx
  # expert-parallel rank files into one global model
  mokopt rewrite --merge-ranks m.rank0.onnx m.rank1.onnx m.rank2.onnx m.rank3.onnx -o global.onnx`,
	"mokopt inspect": `  mokopt inspect model.onnx
  mokopt inspect --json fused.onnx`,
	"mokopt verify": `  # the fused model against the original, on random inputs of 1, 7 and 64 tokens
  mokopt verify fused.onnx model.onnx
  # on the export's own test data, in ONNX Runtime (binaries built with -tags ort)
  mokopt verify --engine ort --data model_data/test_data_set_0 fused.onnx model.onnx
  # a lowered model against its fused one (MXFP8 weights: compared against the MXFP8 bound)
  mokopt verify lowered.onnx fused.onnx`,
	"mokopt run": `  mokopt run model.onnx --data model_data/test_data_set_0
  mokopt run --json --rtol 1e-3 model.onnx --data model_data`,
	"mokopt lower": `  # the MoK megakernel on a GB300 NVL72 rack, EP 8, with the launch plan
  mokopt lower fused.onnx -o lowered.onnx --target gb300-nvl72 --ep 8 --plan plan.json
  # refuse the model if any block violates the kernel contract
  mokopt lower fused.onnx -o lowered.onnx --target gb200-nvl72 --strict
  # ONNX Runtime's com.microsoft::QMoE with int8 experts
  mokopt lower fused.onnx -o ort.onnx --target ort --quant int8`,
	"mokopt diff": `  mokopt diff model.onnx fused.onnx
  mokopt diff --stat model.onnx fused.onnx
  mokopt diff --format html -o diff.html model.onnx fused.onnx
  mokopt diff --format markdown model.onnx fused.onnx > comment.md`,
	"mokopt gen": `  mokopt gen -o synth.onnx --shape unrolled --layers 2 --experts 8 --top-k 2
  mokopt gen -o ort.onnx --shape ort --quant int4 --quant-block-size 32
  mokopt gen -o ep.onnx --ep-form deepep --ep 4   # writes ep.rank0.onnx .. ep.rank3.onnx`,
	"mokopt version": `  mokopt version
  mokopt version --json`,
	"mokopt completion": `  source <(mokopt completion bash)
  mokopt completion zsh > "${fpath[1]}/_mokopt"
  mokopt completion fish > ~/.config/fish/completions/mokopt.fish`,
	"mokopt completion bash":       `  source <(mokopt completion bash)`,
	"mokopt completion zsh":        `  mokopt completion zsh > "${fpath[1]}/_mokopt"`,
	"mokopt completion fish":       `  mokopt completion fish > ~/.config/fish/completions/mokopt.fish`,
	"mokopt completion powershell": `  mokopt completion powershell | Out-String | Invoke-Expression`,
}

// setExamples sets the Example: section of c and its subcommands from
// examples (a command's own Example wins).
func setExamples(c *cobra.Command) {
	if c.Example == "" {
		c.Example = examples[c.CommandPath()]
	}
	for _, s := range c.Commands() {
		setExamples(s)
	}
}
