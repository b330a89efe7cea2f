package kernel

import (
	"sort"
	"strings"
	"testing"
)

// deepseekLike is the vendor's first benchmark shape with one shared expert.
func deepseekLike() LayerSpec {
	return LayerSpec{E: 384, K: 8, H: 7168, I: 2048, SharedI: 2048, Activation: ActivationSwiGLU, NumShared: 1}
}

func codes(vs []Violation) []string {
	var cs []string
	for _, v := range vs {
		cs = append(cs, v.Code)
	}
	sort.Strings(cs)
	return cs
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mutate    func(*LayerSpec)
		target    Target
		ep, T     int
		want      []string // sorted codes
		inMessage string   // must appear in the first violation's message
		errors    bool
	}{
		{name: "vendor shape passes", target: GB300NVL72, ep: 64, T: 2048},
		{name: "GB200 passes", target: GB200NVL72, ep: 32, T: 4096},
		{name: "T unknown skips T rules", target: GB300NVL72, ep: 64, T: 0},
		{name: "EP 1", target: GB300NVL72, ep: 1, T: 512},
		{name: "H200 refused", target: H200, ep: 8, T: 2048, want: []string{CodeGPUArch}, inMessage: "sm_90", errors: true},
		{name: "H200 EP 16 beyond its domain", target: H200, ep: 16, T: 2048, want: []string{CodeEPDomain, CodeGPUArch}, errors: true},
		{name: "EP 72 not allowed", target: GB300NVL72, ep: 72, T: 2048, want: []string{CodeEModEP, CodeEPSize}, inMessage: "72", errors: true},
		{name: "EP 2 not allowed", target: GB300NVL72, ep: 2, T: 2048, want: []string{CodeEPSize}, inMessage: "EP size 2", errors: true},
		{name: "E not divisible by EP", mutate: func(s *LayerSpec) { s.E = 100 }, target: GB300NVL72, ep: 64, T: 2048,
			want: []string{CodeEModEP}, inMessage: "E=100", errors: true},
		{name: "T below 512", target: GB300NVL72, ep: 64, T: 256, want: []string{CodeTMin}, inMessage: "T=256", errors: true},
		{name: "T not multiple of 256", target: GB300NVL72, ep: 64, T: 1000, want: []string{CodeTMod}, inMessage: "T=1000", errors: true},
		{name: "T 300 fails both", target: GB300NVL72, ep: 64, T: 300, want: []string{CodeTMin, CodeTMod}, errors: true},
		{name: "negative T", target: GB300NVL72, ep: 64, T: -1, want: []string{CodeDimPositive}, errors: true},
		{name: "H 64", mutate: func(s *LayerSpec) { s.H = 64 }, target: GB300NVL72, ep: 64, T: 2048,
			want: []string{CodeHMod}, inMessage: "hidden size H=64 is not a multiple of 256", errors: true},
		{name: "I 1408", mutate: func(s *LayerSpec) { s.I, s.SharedI = 1408, 1408 }, target: GB300NVL72, ep: 64, T: 2048,
			want: []string{CodeIMod}, inMessage: "I=1408", errors: true},
		{name: "zero H", mutate: func(s *LayerSpec) { s.H = 0 }, target: GB300NVL72, ep: 64, T: 2048, want: []string{CodeDimPositive}, errors: true},
		{name: "k 0", mutate: func(s *LayerSpec) { s.K = 0 }, target: GB300NVL72, ep: 64, T: 2048, want: []string{CodeTopKRange}, inMessage: "k=0", errors: true},
		{name: "k 256", mutate: func(s *LayerSpec) { s.K = 256; s.E = 512 }, target: GB300NVL72, ep: 64, T: 2048, want: []string{CodeTopKRange}, errors: true},
		{name: "k above E", mutate: func(s *LayerSpec) { s.E, s.K = 4, 8 }, target: GB300NVL72, ep: 4, T: 2048, want: []string{CodeTopKExceedsE}, errors: true},
		{name: "clamped swiglu ok", mutate: func(s *LayerSpec) { s.Activation, s.SwiGLULimit = ActivationSwiGLUClamped, 7 }, target: GB300NVL72, ep: 64, T: 2048},
		{name: "negative limit", mutate: func(s *LayerSpec) { s.Activation, s.SwiGLULimit = ActivationSwiGLUClamped, -1 }, target: GB300NVL72, ep: 64, T: 2048,
			want: []string{CodeSwiGLULimit}, errors: true},
		{name: "gelu", mutate: func(s *LayerSpec) { s.Activation = ActivationGELU }, target: GB300NVL72, ep: 64, T: 2048,
			want: []string{CodeActivation}, inMessage: `"gelu"`, errors: true},
		{name: "no activation", mutate: func(s *LayerSpec) { s.Activation = "" }, target: GB300NVL72, ep: 64, T: 2048, want: []string{CodeActivation}, errors: true},
		{name: "gpt-oss form", mutate: func(s *LayerSpec) { s.Activation = ActivationSwiGLUOAI }, target: GB300NVL72, ep: 64, T: 2048,
			want: []string{CodeActivationGPTOSS}, errors: true},
		{name: "expert bias", mutate: func(s *LayerSpec) { s.ExpertBias = true }, target: GB300NVL72, ep: 64, T: 2048, want: []string{CodeExpertBias}, errors: true},
		{name: "no shared expert is a warning", mutate: func(s *LayerSpec) { s.NumShared, s.SharedI = 0, 0 }, target: GB300NVL72, ep: 64, T: 2048,
			want: []string{CodeNoShared}, inMessage: "1/9"},
		{name: "two shared experts", mutate: func(s *LayerSpec) { s.NumShared = 2 }, target: GB300NVL72, ep: 64, T: 2048,
			want: []string{CodeMultipleShared}, inMessage: "4096", errors: true},
		{name: "wider shared expert", mutate: func(s *LayerSpec) { s.SharedI = 4096 }, target: GB300NVL72, ep: 64, T: 2048,
			want: []string{CodeSharedIMismatch}, inMessage: "4096", errors: true},
		{name: "gated shared expert", mutate: func(s *LayerSpec) { s.SharedGated = true }, target: GB300NVL72, ep: 64, T: 2048,
			want: []string{CodeSharedGated}, errors: true},
		{name: "SharedI without NumShared", mutate: func(s *LayerSpec) { s.NumShared = 0 }, target: GB300NVL72, ep: 64, T: 2048,
			want: []string{CodeSharedInconsistent}, errors: true},
		{name: "small shape gets the minibatch warning", mutate: func(s *LayerSpec) {
			*s = LayerSpec{E: 512, K: 10, H: 4096, I: 1024, SharedI: 1024, Activation: "swiglu", NumShared: 1}
		},
			target: GB300NVL72, ep: 64, T: 2048, want: []string{CodeMinibatchRuleOfThumb}, inMessage: "4736"},
		{name: "everything wrong at once", mutate: func(s *LayerSpec) {
			*s = LayerSpec{E: 6, K: 300, H: 100, I: 100, SharedI: 200, SharedGated: true, Activation: "relu", ExpertBias: true, NumShared: 1}
		}, target: H200, ep: 4, T: 100, errors: true, want: []string{CodeActivation, CodeEModEP, CodeExpertBias, CodeGPUArch, CodeHMod, CodeIMod,
			CodeSharedGated, CodeSharedIMismatch, CodeTMin, CodeTMod, CodeTopKRange}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := deepseekLike()
			if tc.mutate != nil {
				tc.mutate(&spec)
			}
			vs := Check(spec, tc.target, tc.ep, tc.T)
			want := append([]string(nil), tc.want...)
			sort.Strings(want)
			if got := codes(vs); strings.Join(got, ",") != strings.Join(want, ",") {
				t.Fatalf("codes %v, want %v\n%v", got, tc.want, vs)
			}
			if HasErrors(vs) != tc.errors {
				t.Errorf("HasErrors = %v, want %v", HasErrors(vs), tc.errors)
			}
			if tc.inMessage != "" && !strings.Contains(vs[0].Message, tc.inMessage) {
				t.Errorf("message %q does not contain %q", vs[0].Message, tc.inMessage)
			}
			for _, v := range vs {
				c, ok := constraintByCode[v.Code]
				if !ok || v.Constraint != c.Text || v.Severity != c.Severity || v.Message == "" {
					t.Errorf("violation %+v does not match its constraint %+v", v, c)
				}
				if !strings.Contains(v.String(), v.Code) {
					t.Errorf("String() = %q", v.String())
				}
			}
		})
	}
}

func TestConstraintsCoverCodes(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range Constraints() {
		if seen[c.Code] {
			t.Errorf("duplicate code %s", c.Code)
		}
		seen[c.Code] = true
		if c.Text == "" || (c.Severity != SeverityError && c.Severity != SeverityWarning) {
			t.Errorf("bad constraint %+v", c)
		}
	}
	// Every hard-constraint topic of docs/kernel.md has a code.
	for _, code := range []string{CodeGPUArch, CodeEPSize, CodeEModEP, CodeTMin, CodeTMod, CodeHMod, CodeIMod, CodeTopKRange,
		CodeActivation, CodeActivationGPTOSS, CodeExpertBias, CodeNoShared, CodeMultipleShared, CodeSharedIMismatch, CodeSharedGated,
		CodeCUDAVersion, CodePyTorchVersion, CodePythonVersion} {
		if !seen[code] {
			t.Errorf("no constraint for %s", code)
		}
	}
}

func TestCheckEnvironment(t *testing.T) {
	for _, tc := range []struct {
		env  Environment
		want []string
	}{
		{Environment{CUDA: "13.0", PyTorch: "2.10.0+cu130", Python: "3.12.3"}, nil},
		{Environment{CUDA: "13.1", PyTorch: "2.11.0", Python: "3.13"}, nil},
		{Environment{}, nil},
		{Environment{CUDA: "12.8", PyTorch: "2.9.1", Python: "3.11.9"}, []string{CodeCUDAVersion, CodePyTorchVersion, CodePythonVersion}},
		{Environment{CUDA: "thirteen"}, []string{CodeCUDAVersion}},
		{Environment{PyTorch: "v2.10rc1"}, nil},
	} {
		want := append([]string(nil), tc.want...)
		sort.Strings(want)
		if got := codes(CheckEnvironment(tc.env)); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%+v: codes %v, want %v", tc.env, got, tc.want)
		}
	}
}
