// Command funclen lists the functions of Go packages that are longer than a
// limit, with their cyclomatic complexity, longest first:
//
//	go run ./tools/funclen -max 100 ./passes/...
//
// A function's length is the number of source lines from its func keyword to
// its closing brace; function literals count towards the function that holds
// them. Its cyclomatic complexity is one plus the number of if, for and range
// statements, non-default case and select clauses, and && and || operators.
// A pattern ending in /... takes the directory and every directory below it
// (but testdata and directories starting with . or _); test files are skipped
// unless -tests is given. It exits 1 when some function is over the limit, 2
// on bad usage or a file that does not parse.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Func is one function declaration and its measures.
type Func struct {
	File       string
	Line       int
	Name       string // Recv.Name for a method
	Lines      int
	Complexity int
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command; it returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("funclen", flag.ContinueOnError)
	fl.SetOutput(stderr)
	limit := fl.Int("max", 100, "list functions longer than this many lines")
	tests := fl.Bool("tests", false, "measure _test.go files too")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if fl.NArg() == 0 {
		fmt.Fprintln(stderr, "usage: funclen [-max N] [-tests] DIR|DIR/... ...")
		return 2
	}
	var files []string
	for _, p := range fl.Args() {
		fs, err := goFiles(p, *tests)
		if err != nil {
			fmt.Fprintln(stderr, "funclen:", err)
			return 2
		}
		files = append(files, fs...)
	}
	var over []Func
	for _, f := range files {
		fns, err := measureFile(f)
		if err != nil {
			fmt.Fprintln(stderr, "funclen:", err)
			return 2
		}
		for _, fn := range fns {
			if fn.Lines > *limit {
				over = append(over, fn)
			}
		}
	}
	sort.SliceStable(over, func(i, j int) bool {
		if over[i].Lines != over[j].Lines {
			return over[i].Lines > over[j].Lines
		}
		if over[i].File != over[j].File {
			return over[i].File < over[j].File
		}
		return over[i].Line < over[j].Line
	})
	for _, fn := range over {
		fmt.Fprintf(stdout, "%s:%d: %s %d lines, complexity %d\n", fn.File, fn.Line, fn.Name, fn.Lines, fn.Complexity)
	}
	if len(over) > 0 {
		fmt.Fprintf(stderr, "funclen: %d function(s) over %d lines\n", len(over), *limit)
		return 1
	}
	return 0
}

// goFiles lists the Go files a pattern names, sorted.
func goFiles(pattern string, tests bool) ([]string, error) {
	root, recursive := strings.CutSuffix(pattern, "/...")
	if root == "" {
		root = "."
	}
	keep := func(name string) bool {
		return strings.HasSuffix(name, ".go") && (tests || !strings.HasSuffix(name, "_test.go"))
	}
	if !recursive {
		ents, err := os.ReadDir(root)
		if err != nil {
			return nil, err
		}
		var out []string
		for _, e := range ents {
			if !e.IsDir() && keep(e.Name()) {
				out = append(out, filepath.Join(root, e.Name()))
			}
		}
		return out, nil
	}
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			n := d.Name()
			if path != root && (n == "testdata" || strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if keep(d.Name()) {
			out = append(out, path)
		}
		return nil
	})
	return out, err
}

// measureFile parses one file and measures its function declarations.
func measureFile(path string) ([]Func, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []Func
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		start := fset.Position(fd.Pos())
		out = append(out, Func{
			File:       path,
			Line:       start.Line,
			Name:       funcName(fd),
			Lines:      fset.Position(fd.End()).Line - start.Line + 1,
			Complexity: complexity(fd.Body),
		})
	}
	return out, nil
}

// funcName is a declaration's name, Recv.Name for a method.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
			continue
		case *ast.IndexExpr:
			t = x.X
			continue
		case *ast.IndexListExpr:
			t = x.X
			continue
		}
		break
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// complexity is the cyclomatic complexity of a function body.
func complexity(body ast.Node) int {
	c := 1
	ast.Inspect(body, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if x.List != nil {
				c++
			}
		case *ast.CommClause:
			if x.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if x.Op == token.LAND || x.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}
