package main

import (
	"fmt"
	"os"

	"github.com/mokopt/mokopt/graph"
)

func main() {
	m, err := graph.Load(os.Args[1])
	if err != nil {
		panic(err)
	}
	g := m.Proto.Graph
	for _, t := range g.Initializer {
		fmt.Println("init", t.GetName(), graph.DataType(t), t.GetDims())
	}
	for _, n := range g.Node {
		extra := ""
		for _, a := range n.Attribute {
			if a.GetName() == "to" {
				extra = fmt.Sprint(" to=", a.GetI())
			}
		}
		fmt.Println(n.GetOpType(), n.Input, "->", n.Output, extra)
	}
}
