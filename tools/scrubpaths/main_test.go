package main

import "testing"

func TestScrub(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		changed  bool
	}{
		{`File "/home/u/x/.gen/export_moe.py", line 128, in forward`, `File "export_moe.py", line 128, in forward`, true},
		{`  File "/opt/torch/.venv/lib/python3.12/site-packages/transformers/models/olmoe/modeling_olmoe.py", line 357, in forward`,
			`  File "transformers/models/olmoe/modeling_olmoe.py", line 357, in forward`, true},
		{`File "exporter/repo/.tools/fixtures/export_moe.py", line 124`, `File "exporter/repo/.tools/fixtures/export_moe.py", line 124`, false},
		{`File "transformers/activations.py", line 103`, `File "transformers/activations.py", line 103`, false},
		{`File "C:\\work\\export_moe.py", line 9`, `File "export_moe.py", line 9`, true},
		{`File "export_moe.py", line 1`, `File "export_moe.py", line 1`, false},
		{`['', 'm', 'm.gate', 'linear']`, `['', 'm', 'm.gate', 'linear']`, false},
		{"File \"/a/b.py\", line 1\n  File \"/c/site-packages/d/e.py\", line 2", "File \"b.py\", line 1\n  File \"d/e.py\", line 2", true},
	} {
		got, changed := scrub(tc.in)
		if got != tc.want || changed != tc.changed {
			t.Errorf("scrub(%q) = %q, %v; want %q, %v", tc.in, got, changed, tc.want, tc.changed)
		}
	}
}
