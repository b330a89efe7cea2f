package main

import (
	"context"
	"strings"
	"testing"
)

func TestParseByteSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"1000000", 1000000, true}, {"4GiB", 4 << 30, true}, {"4gib", 4 << 30, true},
		{"512MB", 512e6, true}, {"1.5KiB", 1536, true}, {"2T", 2 << 40, true}, {" 8 MiB ", 8 << 20, true}, {"7B", 7, true},
		{"", 0, false}, {"4x", 0, false}, {"-1GiB", 0, false}, {"GiB", 0, false}, {"NaN", 0, false}, {"1e30", 0, false},
	} {
		got, err := parseByteSize(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("parseByteSize(%q) = %d, %v; want %d, ok %v", c.in, got, err, c.want, c.ok)
		}
	}
}

// TestMemLimitFlag: --mem-limit reaches the interpreter of verify and run:
// a limit below the example's working set fails with exit 1 naming the
// limit, a generous one passes, and a malformed one is a usage error.
func TestMemLimitFlag(t *testing.T) {
	data := "../../testdata/example/mixtral_block_dynamo_batched_mm_data/test_data_set_0"
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"verify", exampleModel, exampleModel, "--mem-limit", "64KiB"}, 1, "memory limit exceeded"},
		{[]string{"verify", exampleModel, exampleModel, "--mem-limit", "1GiB"}, 0, ""},
		{[]string{"run", exampleModel, "--data", data, "--mem-limit", "10KB"}, 1, "(limit 10000)"},
		{[]string{"run", exampleModel, "--data", data, "--mem-limit", "1GiB"}, 0, ""},
		{[]string{"run", exampleModel, "--data", data, "--mem-limit", "4x"}, 2, `invalid argument "4x" for "--mem-limit"`},
	} {
		code, msg, _ := runCLI(context.Background(), c.args)
		if code != c.code || !strings.Contains(msg, c.want) {
			t.Errorf("%v: exit %d %q; want %d and %q", c.args, code, msg, c.code, c.want)
		}
	}
}
