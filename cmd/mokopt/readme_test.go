package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the README's example outputs from the binary's")

// readmeExample matches one checked example of the README: a marker, a sh
// block of mokopt command lines, the block of their output, the end marker.
var readmeExample = regexp.MustCompile("(?s)(<!-- readme-example:[^\n]*-->\n```sh\n)(.*?)(\n```\n\n```\n)(.*?)(```\n<!-- /readme-example -->)")

// unstable matches what differs between runs: timings and progress lines.
var unstable = regexp.MustCompile(`(?m)(\b\d+\.\d+s\b)|(^mokopt: [a-z]+ \d+/\d+.*\n)`)

// TestREADMEExamples runs the command lines of each marked example of the
// README, in order and sharing their files, and compares their output
// (stdout, then stderr, then "(exit N)" when not 0) with the block below
// them, timings and progress aside; -update writes the outputs instead.
func TestREADMEExamples(t *testing.T) {
	const readme = "../../README.md"
	src, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	// The README's paths are the repository root's and /tmp.
	toHere := strings.NewReplacer("testdata/", "../../testdata/", "/tmp/", tmp+"/")
	toREADME := strings.NewReplacer("../../testdata/", "testdata/", tmp+"/", "/tmp/")
	n := 0
	out := readmeExample.ReplaceAllFunc(src, func(block []byte) []byte {
		m := readmeExample.FindSubmatch(block)
		var got strings.Builder
		for _, line := range strings.Split(string(m[2]), "\n") {
			args := strings.Fields(line)
			if len(args) == 0 || args[0] != "mokopt" {
				t.Errorf("example line %q is not a mokopt command", line)
				continue
			}
			for i := range args {
				args[i] = toHere.Replace(args[i])
			}
			code, stdout, stderr := run(t, nil, args[1:]...)
			got.WriteString(toREADME.Replace(string(stdout) + stderr))
			if code != 0 {
				fmt.Fprintf(&got, "(exit %d)\n", code)
			}
		}
		n++
		if *update {
			return []byte(string(m[1]) + string(m[2]) + string(m[3]) + unstable.ReplaceAllStringFunc(got.String(), dropProgress) + string(m[5]))
		}
		if g, w := unstable.ReplaceAllString(got.String(), ""), unstable.ReplaceAllString(string(m[4]), ""); g != w {
			t.Errorf("README example %d (%s): the binary prints\n%s\nthe README says\n%s\n(go test ./cmd/mokopt -run TestREADMEExamples -update rewrites it)", n, m[2], g, w)
		}
		return block
	})
	if n == 0 {
		t.Fatal("no marked example in the README")
	}
	if *update {
		if err := os.WriteFile(filepath.Clean(readme), out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// dropProgress removes a progress line and keeps a timing.
func dropProgress(s string) string {
	if strings.HasPrefix(s, "mokopt: ") {
		return ""
	}
	return s
}
