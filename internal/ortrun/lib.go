package ortrun

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// EnvLib is the environment variable naming the ONNX Runtime shared library.
const EnvLib = "ONNXRUNTIME_LIB"

// LibraryNames returns the file names of the ONNX Runtime shared library on
// this operating system, preferred first.
func LibraryNames() []string {
	switch runtime.GOOS {
	case "darwin":
		return []string{"libonnxruntime.dylib"}
	case "windows":
		return []string{"onnxruntime.dll"}
	}
	return []string{"libonnxruntime.so.1", "libonnxruntime.so"}
}

// systemLibDirs are the folders searched after the ones beside the
// executable and the checkout.
var systemLibDirs = []string{"/usr/local/lib", "/usr/local/lib64", "/usr/lib", "/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/opt/homebrew/lib", "/opt/onnxruntime/lib"}

// SearchDirs returns, in order, the folders FindLibrary looks in when
// $ONNXRUNTIME_LIB is unset: the executable's folder and its .ortlib and
// ../lib; .ortlib in the working directory and each folder above it (a
// source checkout, where .ci/fetch-ort.sh puts the library); the folders of
// $LD_LIBRARY_PATH (DYLD_LIBRARY_PATH on macOS, PATH on Windows); then the
// usual system library folders.
func SearchDirs() []string {
	var dirs []string
	if exe, err := os.Executable(); err == nil {
		if r, err := filepath.EvalSymlinks(exe); err == nil {
			exe = r
		}
		d := filepath.Dir(exe)
		dirs = append(dirs, d, filepath.Join(d, ".ortlib"), filepath.Join(d, "..", "lib"))
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; {
			dirs = append(dirs, filepath.Join(d, ".ortlib"))
			up := filepath.Dir(d)
			if up == d {
				break
			}
			d = up
		}
	}
	env := "LD_LIBRARY_PATH"
	switch runtime.GOOS {
	case "darwin":
		env = "DYLD_LIBRARY_PATH"
	case "windows":
		env = "PATH"
	}
	for _, d := range filepath.SplitList(os.Getenv(env)) {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	if runtime.GOOS != "windows" {
		dirs = append(dirs, systemLibDirs...)
	}
	seen := map[string]bool{}
	out := dirs[:0]
	for _, d := range dirs {
		d = filepath.Clean(d)
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out
}

// ErrNoLibrary is wrapped by FindLibrary's error when no ONNX Runtime
// library is found.
var ErrNoLibrary = errors.New("ONNX Runtime shared library not found")

// FindLibrary returns the ONNX Runtime shared library to load: the file
// $ONNXRUNTIME_LIB names when it is set (an error if it does not exist),
// else the first of LibraryNames found in SearchDirs. The error lists where
// it looked and how to provide the library.
func FindLibrary() (string, error) {
	if p := os.Getenv(EnvLib); p != "" {
		if st, err := os.Stat(p); err != nil || st.IsDir() {
			return "", fmt.Errorf("%w: $%s is %s, which is not a file", ErrNoLibrary, EnvLib, p)
		}
		return p, nil
	}
	dirs := SearchDirs()
	for _, d := range dirs {
		for _, n := range LibraryNames() {
			p := filepath.Join(d, n)
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("%w: looked for %s beside the executable, in .ortlib of the working directory and its parents, and in the library paths (%s); install ONNX Runtime 1.30 (in a checkout: bash .ci/fetch-ort.sh) or set %s to the library's path",
		ErrNoLibrary, strings.Join(LibraryNames(), " or "), strings.Join(dirs, ", "), EnvLib)
}

// LibraryPath returns the library FindLibrary finds, or "" when there is none.
func LibraryPath() string {
	p, _ := FindLibrary()
	return p
}
