package mokopt_test

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/internal/verify"
)

// rootPackage parses the root package's files, tests included.
func rootPackage(t *testing.T) (*token.FileSet, map[string]*ast.File) {
	t.Helper()
	fset := token.NewFileSet()
	files := map[string]*ast.File{}
	ents, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".go") {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = f
	}
	return fset, files
}

// TestAliasDocsNameEveryField: `go doc` shows no fields of a type that
// is an alias of an internal package's, so the alias's own doc comment
// lists them; every exported field of the aliased types (and of the
// element types of VerifyReport's cases and outputs) must be named there.
func TestAliasDocsNameEveryField(t *testing.T) {
	_, files := rootPackage(t)
	docs := map[string]string{}
	for name, f := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, s := range g.Specs {
				ts := s.(*ast.TypeSpec)
				if sel, ok := ts.Type.(*ast.SelectorExpr); ok && ts.Assign.IsValid() {
					if x, ok := sel.X.(*ast.Ident); ok && isInternal(f, x.Name) {
						docs[ts.Name.Name] = g.Doc.Text()
					}
				}
			}
		}
	}
	types := map[string][]reflect.Type{
		"VerifyReport": {reflect.TypeOf(mokopt.VerifyReport{}), reflect.TypeOf(verify.Case{}), reflect.TypeOf(verify.OutputCheck{})},
		"DiffResult":   {reflect.TypeOf(mokopt.DiffResult{})},
		"EPTable":      {reflect.TypeOf(mokopt.EPTable{}), reflect.TypeOf(mokopt.EPTable{}.Ops).Elem()},
	}
	var names []string
	for n := range docs {
		names = append(names, n)
	}
	sort.Strings(names)
	if strings.Join(names, " ") != "DiffResult EPTable VerifyReport" {
		t.Fatalf("aliases of internal types: %v; add each new one to this test's table, or make it the package's own type", names)
	}
	for name, ts := range types {
		for _, typ := range ts {
			for i := 0; i < typ.NumField(); i++ {
				f := typ.Field(i)
				if f.IsExported() && !regexp.MustCompile(`\b`+f.Name+`\b`).MatchString(docs[name]) {
					t.Errorf("the doc comment of %s does not name %s.%s", name, typ.Name(), f.Name)
				}
			}
		}
	}
}

// isInternal reports whether the import named x in f is an internal package.
func isInternal(f *ast.File, x string) bool {
	for _, im := range f.Imports {
		p := strings.Trim(im.Path.Value, `"`)
		n := p[strings.LastIndex(p, "/")+1:]
		if im.Name != nil {
			n = im.Name.Name
		}
		if n == x {
			return strings.Contains(p, "/internal/")
		}
	}
	return false
}

// TestEveryEntryPointHasAnExample: each exported function of the package
// has an Example function (ExampleName or ExampleName_suffix), which go
// test runs and, with its // Output:, checks.
func TestEveryEntryPointHasAnExample(t *testing.T) {
	_, files := rootPackage(t)
	var srcs, tests []*ast.File
	for name, f := range files {
		if strings.HasSuffix(name, "_test.go") {
			tests = append(tests, f)
		} else {
			srcs = append(srcs, f)
		}
	}
	have := map[string]bool{}
	for _, ex := range doc.Examples(tests...) {
		have[strings.SplitN(ex.Name, "_", 2)[0]] = true
	}
	for _, f := range srcs {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Name.IsExported() && !have[fd.Name.Name] {
				t.Errorf("no Example%s", fd.Name.Name)
			}
		}
	}
}
