package mokopt

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/models"
)

// TestWriteSpools: an encoding larger than what Write holds in memory goes
// through a temporary file that has no name (the temporary folder stays
// empty) and comes out byte for byte as the in-memory one; when no
// temporary file can be made, nothing is written and the error says why.
func TestWriteSpools(t *testing.T) {
	src := filepath.Join(t.TempDir(), "m.onnx")
	if err := models.Write(models.Config{Shape: models.ShapeBatched, Layers: 2, Experts: 4, TopK: 2, Hidden: 64, Inter: 64, Router: "softmax", Normalize: true}, src); err != nil {
		t.Fatal(err)
	}
	m, err := Load(src)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var inMemory bytes.Buffer
	if err := Write(context.Background(), m, &inMemory, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	if inMemory.Len() < 10000 {
		t.Fatalf("only %d bytes: too small a model to spool", inMemory.Len())
	}
	defer func(v int) { spoolMemory = v }(spoolMemory)
	spoolMemory = 1000
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	var spooled bytes.Buffer
	if err := Write(context.Background(), m, &spooled, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(spooled.Bytes(), inMemory.Bytes()) {
		t.Fatalf("spooled through a file: %d bytes, not the %d of the in-memory encoding", spooled.Len(), inMemory.Len())
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Fatalf("the temporary folder holds %d entries after Write", len(left))
	}
	t.Setenv("TMPDIR", filepath.Join(tmp, "missing"))
	var none bytes.Buffer
	err = Write(context.Background(), m, &none, SaveOptions{})
	if err == nil || !strings.Contains(err.Error(), "holding the encoding") || none.Len() != 0 {
		t.Fatalf("no temporary folder: %v with %d bytes written, want an error saying why and nothing written", err, none.Len())
	}
}
