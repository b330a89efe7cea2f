// Command mokopt finds Mixture-of-Experts blocks in exported ONNX models,
// fuses each into one ai.mok::MoE node, lowers fused nodes to the
// Mixture-of-Kittens megakernel, and verifies and diffs the results.
//
// Exit codes: 0 ok, 1 a check failed (verify mismatch, refused fusion, a
// kernel constraint), 2 bad usage or unreadable input, 130 interrupted
// (SIGINT, SIGTERM, SIGHUP or SIGQUIT: temporary files are removed, no
// output is written).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/mokopt/mokopt/internal/gctune"
)

// exitInterrupted is the exit code after SIGINT, SIGTERM, SIGHUP or SIGQUIT
// (128 + SIGINT, whichever signal it was).
const exitInterrupted = 130

func main() {
	// SIGHUP (terminal closed) and SIGQUIT stop the command the same way:
	// temporary files are removed and nothing is written.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C kills at once
	}()
	stopProfile := startProfile()
	// The garbage between collections is bounded by bytes, not by a
	// fraction of the live heap: a command holding one expert's matrices
	// would otherwise peak near two of them (see internal/gctune).
	stopTuner := gctune.Start()
	code := executeContext(ctx, os.Args[1:])
	stopTuner()
	stopProfile()
	os.Exit(code)
}

// startProfile writes a CPU profile (go tool pprof) to the file that
// MOKOPT_CPUPROFILE names, for the scale benchmarks in bench/; it returns
// the function that ends it. Unset, it does nothing.
func startProfile() func() {
	path := os.Getenv("MOKOPT_CPUPROFILE")
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mokopt: MOKOPT_CPUPROFILE:", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintln(os.Stderr, "mokopt: MOKOPT_CPUPROFILE:", err)
		f.Close()
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

// execute runs the CLI with args and returns the process exit code.
func execute(args []string) int { return executeContext(context.Background(), args) }

// executeContext runs the CLI with args under ctx, whose cancellation stops
// the command, prints the error, if any, and returns the process exit code.
func executeContext(ctx context.Context, args []string) int {
	code, msg, _ := runCLI(ctx, args)
	if msg != "" {
		// Every line after the first is indented: a newline in a name the
		// message quotes cannot start a line that looks like output.
		fmt.Fprintln(stderrSafe(), "mokopt:", strings.ReplaceAll(msg, "\n", "\n  "))
	}
	return code
}

// runCLI runs the CLI with args under ctx and returns the exit code, the
// message to print ("" for none) and the error itself.
func runCLI(ctx context.Context, args []string) (int, string, error) {
	root := newRootCmd()
	root.SetOut(stdoutSafe())
	root.SetErr(stderrSafe())
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0, "", nil
	}
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return exitInterrupted, "interrupted; no output written", err
	}
	var ex *exitError
	if errors.As(err, &ex) {
		return ex.code, ex.msg, err
	}
	return exitCode(err), err.Error(), err
}
