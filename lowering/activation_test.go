package lowering

import (
	"strings"
	"testing"

	"github.com/mokopt/mokopt/kernel"
	"github.com/mokopt/mokopt/moe"
)

// TestActivationTargets: for every row of the activation table, the MoK
// check refuses the activation by name exactly when the row says MoK lacks
// it, and the ONNX Runtime lowering maps it (ORTUnsupported silent about
// it) exactly when the row has a mapping, else refuses with the row's
// reason.
func TestActivationTargets(t *testing.T) {
	for _, def := range moe.Activations {
		t.Run(def.Name, func(t *testing.T) {
			s := &moe.Spec{NumExperts: 256, TopK: 8, Hidden: 7168, Inter: 2048, RouterActivation: moe.Softmax, RouterOrder: moe.ActivationThenTopK,
				NormalizeTopK: true, RoutedScalingFactor: 1, NGroup: 1, TopKGroup: 1, EPSize: 1, Activation: def.Name, SwiGLUAlpha: 1}
			if def.Limit == moe.LimitRequired {
				s.SwiGLULimit = 7
			}
			var act []string
			for _, v := range kernel.Check(LayerSpec(s), kernel.GB300NVL72, 8, 0) {
				if v.Code == kernel.CodeActivation || v.Code == kernel.CodeActivationGPTOSS {
					act = append(act, v.Message)
				}
			}
			if def.MoK != (len(act) == 0) {
				t.Fatalf("MoK: row says %v, check says %v", def.MoK, act)
			}
			if !def.MoK && !strings.Contains(act[0], def.Name) {
				t.Fatalf("MoK refusal %q does not name %s", act[0], def.Name)
			}
			_, why := def.ORT(s.ActParams())
			refusal := strings.Join(ORTUnsupported(s, ""), "; ")
			if (why == "") != (refusal == "") || why != "" && !strings.Contains(refusal, why) {
				t.Fatalf("ORT: row's reason %q, ORTUnsupported %q", why, refusal)
			}
		})
	}
}
