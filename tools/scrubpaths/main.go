// Command scrubpaths makes the file paths that PyTorch's dynamo exporter
// records in node metadata (the pkg.torch.onnx.stack_trace entries) relative,
// so that exported test models carry no absolute path of the machine that
// exported them. Only metadata values change; the graph, its weights and its
// semantics are untouched.
//
//	go run ./tools/scrubpaths FILE.onnx...
//
// An absolute path inside a Python installation becomes the part after
// "site-packages/" (e.g. transformers/models/olmoe/modeling_olmoe.py); any
// other absolute path becomes its base name (export_moe.py); relative paths
// are kept. Files are rewritten in place only when something changed. Models
// with external data are refused.
package main

import (
	"fmt"
	"os"
	"path"
	"regexp"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// fileRef matches the file of one Python traceback line.
var fileRef = regexp.MustCompile(`File "([^"]+)"`)

// relative returns the scrubbed form of one traceback path.
func relative(p string) string {
	if !strings.HasPrefix(p, "/") && !(len(p) > 2 && p[1] == ':' && (p[2] == '\\' || p[2] == '/')) {
		return p
	}
	if i := strings.LastIndex(p, "site-packages/"); i >= 0 {
		return p[i+len("site-packages/"):]
	}
	return path.Base(strings.ReplaceAll(p, "\\", "/"))
}

// scrub rewrites the paths in one metadata value and reports whether it changed.
func scrub(v string) (string, bool) {
	out := fileRef.ReplaceAllStringFunc(v, func(m string) string {
		p := fileRef.FindStringSubmatch(m)[1]
		return `File "` + relative(p) + `"`
	})
	return out, out != v
}

// scrubProps scrubs a list of metadata entries.
func scrubProps(props []*pb.StringStringEntryProto) int {
	n := 0
	for _, e := range props {
		if v, ok := scrub(e.GetValue()); ok {
			e.Value = &v
			n++
		}
	}
	return n
}

// scrubNodes scrubs nodes and, recursively, the subgraphs in their attributes.
func scrubNodes(nodes []*pb.NodeProto) int {
	n := 0
	for _, node := range nodes {
		n += scrubProps(node.GetMetadataProps())
		for _, a := range node.GetAttribute() {
			if a.GetG() != nil {
				n += scrubNodes(a.GetG().GetNode())
			}
			for _, g := range a.GetGraphs() {
				n += scrubNodes(g.GetNode())
			}
		}
	}
	return n
}

// scrubModel scrubs every metadata value of m (model, graph nodes,
// functions) and returns how many changed.
func scrubModel(m *graph.Model) int {
	n := scrubProps(m.Proto.GetMetadataProps()) + scrubNodes(m.Proto.GetGraph().GetNode())
	for _, f := range m.Proto.GetFunctions() {
		n += scrubProps(f.GetMetadataProps()) + scrubNodes(f.GetNode())
	}
	return n
}

func run(file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	m, err := graph.Parse(b, file)
	if err != nil {
		return err
	}
	n := scrubModel(m)
	if n == 0 {
		return nil
	}
	out, err := m.Marshal()
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	st, err := os.Stat(file)
	if err != nil {
		return err
	}
	if err := os.WriteFile(file, out, st.Mode().Perm()); err != nil {
		return err
	}
	fmt.Printf("%s: %d metadata values scrubbed\n", file, n)
	return nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: scrubpaths FILE.onnx...")
		os.Exit(2)
	}
	for _, f := range os.Args[1:] {
		if err := run(f); err != nil {
			fmt.Fprintln(os.Stderr, "scrubpaths:", err)
			os.Exit(1)
		}
	}
}
