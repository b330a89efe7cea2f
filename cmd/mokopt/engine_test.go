package main

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"google.golang.org/protobuf/proto"
)

func TestVerifyEngineFlag(t *testing.T) {
	example := "../../testdata/example/mixtral_block_dynamo_batched_mm.onnx"
	if code := execute([]string{"verify", "--engine", "nosuch", example, example}); code != 2 {
		t.Errorf("unknown engine: exit %d, want 2", code)
	}
	if _, ok := engines["ort"]; !ok {
		if code := execute([]string{"verify", "--engine", "ort", example, example}); code != 2 {
			t.Errorf("--engine ort without ONNX Runtime support: exit %d, want 2", code)
		}
		if _, err := engineRunner("ort"); err == nil || !strings.Contains(err.Error(), "-tags ort") {
			t.Errorf("the error does not say how to get ONNX Runtime support: %v", err)
		}
	}
	if code := execute([]string{"verify", "--engine", "ref", example, example}); code != 0 {
		t.Errorf("--engine ref on a model against itself: exit %d, want 0", code)
	}
}

// TestUnrunnableModelExitCode: a model an engine cannot run exits 2 with
// every engine (one cause, one code), and the message names the cause.
func TestUnrunnableModelExitCode(t *testing.T) {
	dir := t.TempDir()
	m, err := graph.Load(exampleModel)
	if err != nil {
		t.Fatal(err)
	}
	m.Proto.Graph.Node[len(m.Proto.Graph.Node)-1].OpType = proto.String("NoSuchOp")
	bad := filepath.Join(dir, "bad.onnx")
	if err := m.Save(bad, graph.SaveOptions{External: graph.ExternalInline}); err != nil {
		t.Fatal(err)
	}
	engines["failing"] = func(context.Context, *graph.Model, map[string]*eval.Tensor) (map[string]*eval.Tensor, error) {
		return nil, errors.New("this engine has no kernel for NoSuchOp")
	}
	defer delete(engines, "failing")
	for _, engine := range []string{"ref", "failing"} {
		code, _, stderr := run(t, nil, "verify", "--engine", engine, bad, exampleModel)
		if code != 2 || !strings.Contains(stderr, "NoSuchOp") {
			t.Errorf("--engine %s on an unrunnable model: exit %d, %q; want 2 naming the cause", engine, code, stderr)
		}
	}
}
