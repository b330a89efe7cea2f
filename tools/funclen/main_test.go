package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const sample = `package p

func short() int { return 1 }

func branchy(a, b int) int {
	if a > 0 && b > 0 {
		return 1
	}
	for i := 0; i < a; i++ {
		switch i {
		case 1, 2:
			b++
		case 3:
			b--
		default:
		}
	}
	for range b {
		if a > 1 || b > 1 {
			a++
		}
	}
	return a
}

type T[K any] struct{}

func (t *T[K]) method() {
	f := func() {
		_ = 1
	}
	f()
}
`

func writeSample(t *testing.T, dir, name, src string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestMeasureFile(t *testing.T) {
	p := writeSample(t, t.TempDir(), "p.go", sample)
	fns, err := measureFile(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []Func{
		{Line: 3, Name: "short", Lines: 1, Complexity: 1},
		// 1 + if + && + for + 2 cases + range + if + ||
		{Line: 5, Name: "branchy", Lines: 20, Complexity: 9},
		{Line: 28, Name: "T.method", Lines: 6, Complexity: 1},
	}
	if len(fns) != len(want) {
		t.Fatalf("got %d functions, want %d: %+v", len(fns), len(want), fns)
	}
	for i, w := range want {
		g := fns[i]
		if g.Line != w.Line || g.Name != w.Name || g.Lines != w.Lines || g.Complexity != w.Complexity {
			t.Errorf("function %d: got %+v, want %+v", i, g, w)
		}
	}
}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	writeSample(t, dir, "a/p.go", sample)
	writeSample(t, dir, "a/b/q.go", "package q\n\nfunc long() {\n\n\n\n\n}\n")
	writeSample(t, dir, "a/p_test.go", "package p\n\nfunc TestX() {\n\n\n\n\n\n\n\n\n\n}\n")
	writeSample(t, dir, "a/testdata/r.go", "package r\n\nfunc skipped() {\n\n\n\n\n\n\n\n\n\n\n\n}\n")
	for _, tc := range []struct {
		args     []string
		code     int
		contains []string
		absent   []string
	}{
		{[]string{"-max", "5", dir + "/a/..."}, 1, []string{"branchy 20 lines, complexity 9", "T.method 6 lines", "q.go:3: long 6 lines"}, []string{"short", "TestX", "skipped"}},
		{[]string{"-max", "5", dir + "/a"}, 1, []string{"branchy", "method"}, []string{"long", "TestX"}},
		{[]string{"-max", "8", "-tests", dir + "/a/..."}, 1, []string{"branchy", "TestX 11 lines"}, []string{"method", "skipped"}},
		{[]string{"-max", "20", dir + "/a/..."}, 0, nil, []string{"branchy"}},
		{[]string{}, 2, nil, nil},
		{[]string{dir + "/missing"}, 2, nil, nil},
	} {
		var out, errb bytes.Buffer
		code := run(tc.args, &out, &errb)
		if code != tc.code {
			t.Errorf("%v: exit %d, want %d (stderr %q)", tc.args, code, tc.code, errb.String())
		}
		for _, s := range tc.contains {
			if !strings.Contains(out.String(), s) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, s, out.String())
			}
		}
		for _, s := range tc.absent {
			if strings.Contains(out.String(), s) {
				t.Errorf("%v: output has %q:\n%s", tc.args, s, out.String())
			}
		}
	}
	// Longest first.
	var out bytes.Buffer
	run([]string{"-max", "1", dir + "/a/..."}, &out, &bytes.Buffer{})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) < 2 || !strings.Contains(lines[0], "branchy") {
		t.Errorf("not longest first:\n%s", out.String())
	}
}

func TestBadFile(t *testing.T) {
	dir := t.TempDir()
	writeSample(t, dir, "bad.go", "package p\nfunc {")
	if code := run([]string{dir}, &bytes.Buffer{}, &bytes.Buffer{}); code != 2 {
		t.Errorf("unparsable file: exit %d, want 2", code)
	}
}

// TestPassesUnderLimit keeps every function of the passes packages (test
// files aside) at most passesLimit lines long, as
// go run ./tools/funclen -max 100 ./passes/... checks.
func TestPassesUnderLimit(t *testing.T) {
	const passesLimit = 100
	files, err := goFiles("../../passes/...", false)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no Go files under ../../passes")
	}
	for _, f := range files {
		fns, err := measureFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, fn := range fns {
			if fn.Lines > passesLimit {
				t.Errorf("%s:%d: %s is %d lines (complexity %d), over %d: split it into smaller functions", fn.File, fn.Line, fn.Name, fn.Lines, fn.Complexity, passesLimit)
			}
		}
	}
}
