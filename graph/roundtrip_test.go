package graph

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/mokopt/mokopt/internal/fixtures"
	"github.com/mokopt/mokopt/internal/testtools"
	"google.golang.org/protobuf/proto"
)

// fixtureDir holds the exported MoE fixtures (testdata/fixtures).
var fixtureDir = fixtures.Dir()

func roundTrip(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Parse(b, path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	out, err := m.Marshal()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if !bytes.Equal(b, out) {
		t.Errorf("%s: re-encoded bytes differ (%d vs %d bytes)", path, len(b), len(out))
	}
	// Load's streaming decoder and Save's streaming encoder, every message
	// and bytes field streamed.
	defer func(v int) { streamBig = v }(streamBig)
	streamBig = 1
	lm, err := Load(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer lm.Close()
	if !proto.Equal(lm.Proto, m.Proto) {
		t.Errorf("%s: Load decodes another model than Parse", path)
	}
	var buf bytes.Buffer
	if err := marshalTo(&buf, lm.Proto, proto.Size(lm.Proto)); err != nil || !bytes.Equal(b, buf.Bytes()) {
		t.Errorf("%s: streamed encoding differs (%d vs %d bytes; %v)", path, len(b), buf.Len(), err)
	}
}

func TestRoundTripFixtures(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(fixtureDir, "*.onnx"))
	if len(files) == 0 {
		t.Fatalf("no fixtures in %s", fixtureDir)
	}
	for _, f := range files {
		roundTrip(t, f)
	}
	t.Logf("%d fixtures round-tripped byte for byte", len(files))
}

func TestRoundTripLibonnxTestdata(t *testing.T) {
	var files []string
	filepath.WalkDir("/usr/share/libonnx-testdata/data", func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == "model.onnx" {
			files = append(files, p)
		}
		return nil
	})
	testtools.NeedONNXTestdata(t, len(files))
	for _, f := range files {
		roundTrip(t, f)
	}
	t.Logf("%d libonnx-testdata models round-tripped byte for byte", len(files))
}
