package testtools

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMissing: a missing tool skips the test without RequireEnv and fails
// it with RequireEnv=1, both naming the tool and how to install it (run
// in a child test process, whose verdict is read from its output).
func TestMissing(t *testing.T) {
	if os.Getenv("TESTTOOLS_CHILD") == "1" {
		LookPath(t, "mokopt-no-such-tool", "apt-get install no-such-tool")
		t.Fatal("LookPath returned for a missing tool")
	}
	for _, tc := range []struct {
		require string
		want    string
		fail    bool
	}{
		{"", "--- SKIP: TestMissing", false},
		{"0", "--- SKIP: TestMissing", false},
		{"1", "--- FAIL: TestMissing", true},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissing$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTTOOLS_CHILD=1", RequireEnv+"="+tc.require)
		out, err := cmd.CombinedOutput()
		if (err != nil) != tc.fail || !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "apt-get install no-such-tool") {
			t.Errorf("%s=%q: %v\n%s", RequireEnv, tc.require, err, out)
		}
	}
}
