package kernel

import "testing"

func TestTargets(t *testing.T) {
	for _, tc := range []struct {
		name      string
		sm        int
		arch      string
		supported bool
	}{
		{"gb200-nvl72", 100, "sm_100", true},
		{"gb300-nvl72", 103, "sm_103", true},
		{"h200", 90, "sm_90", false},
	} {
		tg, err := LookupTarget(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if tg.SM != tc.sm || tg.Arch() != tc.arch || tg.Supported != tc.supported || tg.SMCount <= 0 || tg.Note == "" {
			t.Errorf("%s: %+v", tc.name, tg)
		}
	}
	if _, err := LookupTarget("mi300x"); err == nil {
		t.Error("unknown target accepted")
	}
	if n := len(Targets()); n != 3 {
		t.Errorf("%d targets", n)
	}
}
