// Command loadsave is the baseline of the scale benchmarks (bench/scale.sh):
// it loads an ONNX model with mokopt's graph package and saves it unchanged,
// exactly as `mokopt rewrite` loads and saves (external data kept: the side
// file's bytes are streamed to the output's side file), so that the rewrite
// can be reported as a ratio to the cost of merely reading and writing the
// same model in the same run.
//
// Usage: go run ./bench/loadsave IN OUT
package main

import (
	"fmt"
	"os"

	"github.com/mokopt/mokopt/graph"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: loadsave IN OUT")
		os.Exit(2)
	}
	m, err := graph.Load(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer m.Close()
	if err := m.Save(os.Args[2], graph.SaveOptions{External: graph.ExternalKeep}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
