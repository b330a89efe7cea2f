package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/internal/fixtures"
)

// TestTestdataCarriesNoMachinePaths: no model under testdata records an
// absolute path of the machine that exported it (the dynamo exporter's
// stack traces in node metadata); `go run ./tools/scrubpaths FILE` makes
// them relative.
func TestTestdataCarriesNoMachinePaths(t *testing.T) {
	n := 0
	err := filepath.WalkDir(fixtures.Testdata(), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".onnx") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		m, err := graph.Parse(b, p)
		if err != nil {
			return nil // bad-input fixtures are not models
		}
		n++
		if k := scrubModel(m); k > 0 {
			t.Errorf("%s: %d metadata values hold absolute paths (run go run ./tools/scrubpaths %s)", p, k, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 100 {
		t.Fatalf("only %d models under testdata", n)
	}
}
