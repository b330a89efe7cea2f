package ortmoe_test

import (
	"os"
	"testing"

	"github.com/mokopt/mokopt"
)

// TestMain registers mokopt's Go kernels process-wide for this package's
// tests, which run models through graph/eval without eval.Options.Kernels
// (nothing registers kernels on import).
func TestMain(m *testing.M) {
	mokopt.Kernels().Register()
	os.Exit(m.Run())
}
