// Command mokopt finds Mixture-of-Experts blocks in exported ONNX models,
// fuses each into one ai.mok::MoE node, lowers fused nodes to the
// Mixture-of-Kittens megakernel, and verifies and diffs the results.
//
// Exit codes: 0 ok, 1 a check failed (verify mismatch, refused fusion, a
// kernel constraint), 2 bad usage or unreadable input.
package main

import (
	"errors"
	"fmt"
	"os"
)

func main() {
	os.Exit(execute(os.Args[1:]))
}

// execute runs the CLI with args and returns the process exit code.
func execute(args []string) int {
	root := newRootCmd()
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	var ex *exitError
	if errors.As(err, &ex) {
		if ex.msg != "" {
			fmt.Fprintln(os.Stderr, "mokopt:", ex.msg)
		}
		return ex.code
	}
	fmt.Fprintln(os.Stderr, "mokopt:", err)
	return exitCode(err)
}
