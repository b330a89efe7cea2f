package main

import (
	"strings"
	"testing"
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
