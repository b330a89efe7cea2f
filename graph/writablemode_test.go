package graph

import (
	"os"
	"strings"
	"testing"
)

// TestWritableMode: the one rule for an existing output: a regular file is
// replaced, a character device or named pipe is written directly, any
// other kind is refused naming it.
func TestWritableMode(t *testing.T) {
	for _, tc := range []struct {
		mode   os.FileMode
		direct bool
		err    string
	}{
		{0o644, false, ""},
		{os.ModeCharDevice | os.ModeDevice | 0o666, true, ""},
		{os.ModeNamedPipe | 0o644, true, ""},
		{os.ModeDir | 0o755, false, "it is a directory"},
		{os.ModeDevice | 0o660, false, "it is a block device"},
		{os.ModeSocket | 0o755, false, "it is a socket"},
		{os.ModeSymlink | 0o777, false, "it is a symbolic link"},
	} {
		direct, err := WritableMode(tc.mode)
		if direct != tc.direct || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%v: direct %v, %v; want %v, %q", tc.mode, direct, err, tc.direct, tc.err)
		}
	}
}
