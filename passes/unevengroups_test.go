package passes

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
)

// TestUnevenGroupsRefused: a real DeepSeek-V3 export whose config puts 5
// experts in 2 groups (transformers then reshapes the scores of several
// tokens into one row of groups) is refused, naming the reshape and why,
// not fused and not passed over.
func TestUnevenGroupsRefused(t *testing.T) {
	m, err := graph.Load(filepath.Join(producersDir, "m_uneven_groups_deepseek_v3.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Rewrite(m, Options{Check: true})
	if err == nil || !errors.Is(err, ErrNotFused) {
		t.Fatalf("want a refusal, got %v", err)
	}
	for _, want := range []string{"uneven groups", "5 scores as 2 groups of 2", "Reshape"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
}
