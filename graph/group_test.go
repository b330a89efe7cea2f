package graph

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
)

func TestGroupProblems(t *testing.T) {
	missing := func(name string) error {
		return &InputError{Object: fmt.Sprintf("initializer %q", name), Msg: "cannot open external data", Err: fmt.Errorf("external data file %q: %w", "m.onnx.data", fs.ErrNotExist)}
	}
	var many []error
	for i := range 6165 {
		many = append(many, missing(fmt.Sprintf("w%d", i)))
	}
	cases := []struct {
		name string
		errs []error
		max  int
		want []string // the lines, in order
	}{
		{"distinct kept", []error{errors.New(`node "a" has 1 inputs`), errors.New(`value "x" is defined twice`)}, 20,
			[]string{`node "a" has 1 inputs`, `value "x" is defined twice`}},
		{"alike grouped with names", many, 20,
			[]string{`initializer "w0": cannot open external data: external data file "m.onnx.data": file does not exist (and 6164 more like it: "w1", "w2", "w3", ...)`}},
		{"two alike, no ellipsis", []error{errors.New(`node "a" (Gemm) is odd`), errors.New(`node "b" (Gemm) is odd`)}, 20,
			[]string{`node "a" (Gemm) is odd (and 1 more like it: "b")`}},
		{"groups past max counted", []error{errors.New("one"), errors.New("two"), errors.New(`x "a"`), errors.New(`x "b"`)}, 1,
			[]string{"one", "and 3 more problems"}},
		{"escaped quote inside a name", []error{errors.New(`node "a\"q" bad`), errors.New(`node "b" bad`)}, 20,
			[]string{`node "a\"q" bad (and 1 more like it: "b")`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := groupProblems(tc.errs, tc.max)
			var lines []string
			for _, e := range got {
				lines = append(lines, e.Error())
			}
			if strings.Join(lines, "\n") != strings.Join(tc.want, "\n") {
				t.Fatalf("got\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
	// A group still matches its problems' causes.
	if g := groupProblems(many, 20); !errors.Is(g[0], fs.ErrNotExist) || !errors.Is(g[0], ErrBadInput) {
		t.Fatal("a group hides its cause")
	}
}
