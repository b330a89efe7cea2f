package ortrun

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestFindLibrary(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("library search paths differ on Windows")
	}
	dir := t.TempDir()
	lib := filepath.Join(dir, LibraryNames()[0])
	if err := os.WriteFile(lib, []byte("not really a library"), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	// Run from a folder outside the checkout, whose .ortlib (where .ci/run
	// puts the library) would otherwise be found before the library path.
	t.Chdir(empty)
	cases := []struct {
		name       string
		env, ldDir string
		want       string // path found, or "" for an error
		msg        []string
	}{
		{"env names the file", lib, empty, lib, nil},
		{"env names a missing file", filepath.Join(empty, "nope.so"), dir, "", []string{EnvLib, "nope.so"}},
		{"env names a folder", dir, dir, "", []string{EnvLib, "not a file"}},
		{"found on the library path", "", dir, lib, nil},
		{"nowhere", "", empty, "", []string{"looked for " + LibraryNames()[0], empty, EnvLib, "fetch-ort.sh"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvLib, tc.env)
			t.Setenv("LD_LIBRARY_PATH", tc.ldDir)
			t.Setenv("DYLD_LIBRARY_PATH", tc.ldDir)
			got, err := FindLibrary()
			if tc.want != "" {
				if err != nil || got != tc.want {
					t.Fatalf("FindLibrary() = %q, %v; want %q", got, err, tc.want)
				}
				if LibraryPath() != tc.want {
					t.Fatalf("LibraryPath() = %q, want %q", LibraryPath(), tc.want)
				}
				return
			}
			if err == nil {
				if tc.env == "" {
					t.Skipf("an ONNX Runtime library is installed on this machine (%s)", got)
				}
				t.Fatalf("FindLibrary() = %q, want an error", got)
			}
			if !errors.Is(err, ErrNoLibrary) {
				t.Errorf("error %v does not wrap ErrNoLibrary", err)
			}
			for _, m := range tc.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q lacks %q", err, m)
				}
			}
			if strings.Contains(err.Error(), "ortrun:") || strings.Contains(err.Error(), "ortrun.") || strings.Contains(err.Error(), "()") {
				t.Errorf("error %q names Go identifiers", err)
			}
		})
	}
}

func TestSearchDirsOrder(t *testing.T) {
	ld := t.TempDir()
	t.Setenv("LD_LIBRARY_PATH", ld)
	t.Setenv("DYLD_LIBRARY_PATH", ld)
	dirs := SearchDirs()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if r, err := filepath.EvalSymlinks(exe); err == nil {
		exe = r
	}
	pos := func(d string) int {
		for i, x := range dirs {
			if x == filepath.Clean(d) {
				return i
			}
		}
		return -1
	}
	wd, _ := os.Getwd()
	beside, checkout, env := pos(filepath.Dir(exe)), pos(filepath.Join(wd, ".ortlib")), pos(ld)
	if beside < 0 || checkout < 0 || (runtime.GOOS != "windows" && env < 0) {
		t.Fatalf("dirs %q lack the executable's folder, .ortlib or $LD_LIBRARY_PATH", dirs)
	}
	if !(beside < checkout && (env < 0 || checkout < env)) {
		t.Fatalf("order beside %d, checkout %d, library path %d; want that order", beside, checkout, env)
	}
}
