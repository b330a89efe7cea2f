// Command chain writes N directly chained copies of a one-block model: copy
// i+1 reads copy i's output, with no residual between (the graph that
// bench/chain.sh times mokopt rewrite on).
//
// Usage: go run ./bench/chain [-n N] [-perturb] IN OUT
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/internal/chain"
	"google.golang.org/protobuf/proto"
)

func main() {
	n := flag.Int("n", 500, "number of chained copies")
	perturb := flag.Bool("perturb", false, "give each copy float32 weight matrices of its own")
	flag.Parse()
	if flag.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: chain [-n N] [-perturb] IN OUT")
		os.Exit(2)
	}
	m, err := graph.Load(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	mp, err := chain.Compose(m, *n, chain.Options{Perturb: *perturb})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	b, err := proto.Marshal(mp)
	if err == nil {
		err = os.WriteFile(flag.Arg(1), b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
