package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestUsageExitCodes is the table of exit codes of every command's usage
// errors: each is 2, writes nothing on standard output and no output file,
// and says what was wrong.
func TestUsageExitCodes(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out.onnx")
	m := exampleModel
	cases := []struct {
		args []string
		want string // part of the message
	}{
		{[]string{"bogus"}, `unknown command "bogus"`},
		{[]string{"rewrit"}, "did you mean rewrite"},
		{[]string{"--bogus"}, "unknown flag"},
		{[]string{"-v"}, "unknown shorthand flag"},
		{[]string{"help", "bogus"}, "unknown help topic"},
		{[]string{"completion", "bogus"}, `unknown command "bogus"`},
		{[]string{"completion", "bash", "x"}, `unknown command "x"`},
		{[]string{"version", "x"}, `unknown command "x"`},
		{[]string{"version", "--bogus"}, "unknown flag"},

		{[]string{"rewrite"}, "usage: mokopt rewrite"},
		{[]string{"rewrite", m}, "needs -o OUT"},
		{[]string{"rewrite", m, m, "-o", out}, "takes one model"},
		{[]string{"rewrite", "--bogus", m, "-o", out}, "unknown flag: --bogus"},
		{[]string{"rewrite", m, "-o", out, "--external-data", "sideways"}, "external-data"},
		{[]string{"rewrite", m, "-o", out, "--ep-rank", "x"}, `invalid argument "x"`},
		{[]string{"rewrite", m, "-o", m}, "without --in-place"},
		{[]string{"rewrite", "-", "-o", "-", "--json"}, "share standard output"},
		{[]string{"rewrite", "--merge-ranks", m, m}, "needs -o OUT"},

		{[]string{"inspect"}, "usage: mokopt inspect"},
		{[]string{"inspect", m, m}, "usage: mokopt inspect"},
		{[]string{"inspect", "--bogus", m}, "unknown flag"},
		{[]string{"inspect", "--json=maybe", m}, `invalid argument "maybe"`},

		{[]string{"run"}, "usage: mokopt run"},
		{[]string{"run", m}, "needs --data"},
		{[]string{"run", m, "--rtol", "x", "--data", dir}, `invalid argument "x"`},
		{[]string{"run", m, "--mem-limit", "4x", "--data", dir}, "mem-limit"},

		{[]string{"lower"}, "usage: mokopt lower"},
		{[]string{"lower", m}, "needs -o OUT"},
		{[]string{"lower", m, "-o", out}, "needs --target (gb200-nvl72, gb300-nvl72, ort)"},
		{[]string{"lower", m, "-o", out, "--target", "gb999"}, `unknown target "gb999" (targets: gb200-nvl72, gb300-nvl72, ort)`},
		{[]string{"lower", m, "-o", out, "--target", "h200"}, "does not run there"},
		{[]string{"lower", m, "-o", out, "--target", "gb300-nvl72", "--ep", "x"}, `invalid argument "x"`},
		{[]string{"lower", m, "-o", out, "--target", "gb300-nvl72", "--quant", "int8"}, "--quant does not apply to the MoK kernel's targets: it is for ONNX Runtime's QMoE (--target ort)"},
		{[]string{"lower", m, "-o", out, "--target", "ort", "--quant", "fp3"}, "int8 or int4"},
		{[]string{"lower", m, "-o", out, "--target", "gb300-nvl72", "--tokens-per-rank", "-1"}, "negative"},
		{[]string{"lower", m, "-o", m, "--target", "ort"}, "overwrite the input"},

		{[]string{"verify"}, "usage: mokopt verify"},
		{[]string{"verify", m}, "usage: mokopt verify"},
		{[]string{"verify", m, m, m}, "usage: mokopt verify"},
		{[]string{"verify", "--engine", "bogus", m, m}, "unknown engine"},
		{[]string{"verify", "--tokens", "0", m, m}, "not a positive integer"},
		{[]string{"verify", "--seed", "x", m, m}, `invalid argument "x"`},
		{[]string{"verify", "-", "-"}, "standard input"},

		{[]string{"diff"}, "usage: mokopt diff"},
		{[]string{"diff", m}, "usage: mokopt diff"},
		{[]string{"diff", "--format", "pdf", m, m}, "unknown --format"},
		{[]string{"diff", "--color", "pink", m, m}, "unknown --color"},
		{[]string{"diff", "--stat", "--format", "html", m, m}, "--stat works with"},
		{[]string{"diff", "--json", "--format", "dot", m, m}, "--json and --format dot disagree"},

		{[]string{"gen"}, "needs -o FILE"},
		{[]string{"gen", "x", "-o", out}, `unknown command "x"`},
		{[]string{"gen", "-o", out, "--experts", "x"}, `invalid argument "x"`},
		{[]string{"gen", "-o", out, "--shape", "weird"}, "shape"},
		{[]string{"gen", "-o", out, "--dtype", "fp8"}, `dtype "fp8" (want fp32, fp16 or bf16`},
		{[]string{"gen", "-o", out, "--shape", "ort", "--dtype", "bf16"}, "float and float16 only"},
		{[]string{"gen", "-o", "-", "--json"}, "share standard output"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := run(t, nil, tc.args...)
			if code != 2 {
				t.Errorf("exit %d, want 2 (stderr %q)", code, stderr)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr %q lacks %q", stderr, tc.want)
			}
			if len(stdout) != 0 {
				t.Errorf("%d bytes on standard output: %q", len(stdout), stdout)
			}
			if _, err := os.Stat(out); err == nil {
				t.Errorf("%s written", out)
			}
		})
	}
}

// TestEveryCommandUsageErrors checks, for every command of the tree, that
// an unknown flag and (where the command fixes its argument count) a wrong
// number of arguments exit 2, and that help exits 0.
func TestEveryCommandUsageErrors(t *testing.T) {
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		path := strings.Fields(c.CommandPath())[1:]
		if !c.Hidden {
			n++
			t.Run(strings.Join(append([]string{"mokopt"}, path...), " "), func(t *testing.T) {
				if code, _, stderr := run(t, nil, append(append([]string{}, path...), "--no-such-flag")...); code != 2 {
					t.Errorf("unknown flag: exit %d (%s), want 2", code, stderr)
				}
				if code, _, _ := run(t, nil, append(append([]string{}, path...), "--help")...); code != 0 {
					t.Errorf("--help: exit %d, want 0", code)
				}
				tooMany := append(append([]string{}, path...), "a", "b", "c", "d")
				if c.Name() != "rewrite" && c.Name() != "help" {
					if code, _, stderr := run(t, nil, tooMany...); code != 2 {
						t.Errorf("%d arguments: exit %d (%s), want 2", 4, code, stderr)
					}
				}
				if c.Example == "" {
					t.Error("no Example: section")
				}
			})
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(newRootCmd())
	if n < 14 {
		t.Fatalf("walked %d commands, want every command (>= 14)", n)
	}
}

// TestCompletionValues checks that shell completion offers the values of
// the enumerated flags.
func TestCompletionValues(t *testing.T) {
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"lower", "--target", ""}, []string{"gb200-nvl72", "gb300-nvl72", "ort"}},
		{[]string{"lower", "--quant", ""}, []string{"int8", "int4"}},
		{[]string{"lower", "--external-data", ""}, []string{"keep", "repack", "inline"}},
		{[]string{"rewrite", "--external-data", ""}, []string{"keep", "repack", "inline"}},
		{[]string{"diff", "--format", ""}, []string{"text", "json", "markdown", "dot", "html"}},
		{[]string{"verify", "--engine", ""}, engineNames()},
		{[]string{"gen", "--quant", ""}, []string{"int8", "int4"}},
		{[]string{"gen", "--shape", ""}, []string{"batched", "unrolled", "dense", "ort"}},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := run(t, nil, append([]string{cobra.ShellCompRequestCmd}, tc.args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			var got []string
			for _, l := range strings.Split(string(stdout), "\n") {
				if l != "" && !strings.HasPrefix(l, ":") {
					got = append(got, strings.SplitN(l, "\t", 2)[0])
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("completions %q, want %q", got, tc.want)
			}
		})
	}
}

// TestHelpTexts: every document a help text cites exists in the
// repository (a README section as a heading of README.md), no flag's usage
// states a default that cobra prints after it again, and no error message
// carries the program's prefix twice.
func TestHelpTexts(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	docRef := regexp.MustCompile(`docs/[A-Za-z0-9_-]+\.md`)
	readmeRef := regexp.MustCompile(`README "([^"]+)"`)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		text := c.Long + "\n" + c.Short + "\n" + c.Example + "\n" + c.Flags().FlagUsages()
		for _, ref := range docRef.FindAllString(text, -1) {
			if _, err := os.Stat(filepath.Join("../..", ref)); err != nil {
				t.Errorf("%s: help cites %s, which does not exist", c.CommandPath(), ref)
			}
		}
		for _, m := range readmeRef.FindAllStringSubmatch(text, -1) {
			if !regexp.MustCompile(`(?m)^#+ ` + regexp.QuoteMeta(m[1]) + `\s*$`).Match(readme) {
				t.Errorf("%s: help cites README section %q, which README.md does not have", c.CommandPath(), m[1])
			}
		}
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if strings.Contains(f.Usage, "default") && f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "[]" {
				t.Errorf("%s --%s: usage %q states a default and cobra prints (default %s) after it", c.CommandPath(), f.Name, f.Usage, f.DefValue)
			}
		})
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(newRootCmd())
	for _, args := range [][]string{{"verify"}, {"rewrite"}, {"lower"}, {"diff", "a"}, {"inspect"}} {
		if _, msg, _ := runCLI(context.Background(), args); strings.HasPrefix(msg, "mokopt ") || strings.Contains(msg, "mokopt "+args[0]+":") {
			t.Errorf("%v: the message repeats the program's prefix: %s", args, msg)
		}
	}
}
