// Package testtools is where a test that needs a tool from outside the
// module (Graphviz dot, Chromium, Debian's libonnx-testdata, the ONNX
// Runtime library) learns whether it is there. Without it the test is
// skipped, saying what to install; when the environment variable
// MOKOPT_REQUIRE_TOOLS is 1, as .ci/run sets it after installing them, a
// missing tool fails the test instead, so that CI never passes by skipping.
package testtools

import (
	"os"
	"os/exec"
	"testing"
)

// RequireEnv names the environment variable that turns a missing tool
// from a skip into a failure.
const RequireEnv = "MOKOPT_REQUIRE_TOOLS"

// Required reports whether missing tools fail tests (RequireEnv is 1).
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// Missing ends t for a missing tool: a skip naming the tool, why it is
// missing and how to install it, or, when Required, a failure saying the
// same.
func Missing(t testing.TB, tool, install string, why any) {
	t.Helper()
	if Required() {
		t.Fatalf("%s is missing (%v) and %s=1: %s", tool, why, RequireEnv, install)
	}
	t.Skipf("%s is missing (%v): %s", tool, why, install)
}

// LookPath returns the path of the program name, or ends t as Missing.
func LookPath(t testing.TB, name, install string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, name, install, err)
	}
	return p
}

// Dot returns the path of Graphviz dot, or ends t as Missing.
func Dot(t testing.TB) string {
	t.Helper()
	return LookPath(t, "dot", "apt-get install graphviz")
}

// Chromium is where .ci/run's Debian package installs the browser.
const Chromium = "/usr/bin/chromium"

// NeedChromium ends t as Missing unless Chromium is installed.
func NeedChromium(t testing.TB) string {
	t.Helper()
	if _, err := os.Stat(Chromium); err != nil {
		Missing(t, "chromium", "apt-get install chromium", err)
	}
	return Chromium
}

// NeedONNXTestdata ends t as Missing when found is zero: the number of
// files or folders of Debian's libonnx-testdata the test found.
func NeedONNXTestdata(t testing.TB, found int) {
	t.Helper()
	if found == 0 {
		Missing(t, "libonnx-testdata", "apt-get install libonnx-testdata", "no test data under /usr/share/libonnx-testdata")
	}
}
