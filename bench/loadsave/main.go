// Command loadsave is the baseline of the scale benchmarks (bench/scale.sh):
// it loads an ONNX model with mokopt's graph package and saves it unchanged,
// exactly as `mokopt rewrite` loads and saves: the model is decoded, vetted
// by graph.Model.Check (which every mokopt command runs on what it loads:
// graph index, validation, initializer bounds) and encoded, external data
// kept (the side file's bytes are streamed to the output's side file). The
// rewrite can thus be reported as a ratio to the cost of merely reading and
// writing the same model in the same run. With -no-check the model is only
// decoded and encoded: the floor of any tool that rewrites the file.
//
// Usage: go run ./bench/loadsave [-no-check] [-cpuprofile FILE] IN OUT
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/mokopt/mokopt/graph"
)

func main() {
	noCheck := flag.Bool("no-check", false, "decode and encode only, without graph.Model.Check")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the load and save to this file")
	flag.Parse()
	if flag.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: loadsave [-no-check] [-cpuprofile FILE] IN OUT")
		os.Exit(2)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	m, err := graph.Load(flag.Arg(0))
	if err == nil && !*noCheck {
		err = m.Check()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer m.Close()
	if err := m.Save(flag.Arg(1), graph.SaveOptions{External: graph.ExternalKeep}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}
