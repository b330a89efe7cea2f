package moe

import (
	"fmt"
	"math"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// MaxOutputs is the number of outputs a fused node may have: output and
// the optional router_logits (see OutRouterLogits).
const MaxOutputs = NumOutputs

// attrTypes is every attribute of the fused node's contract with its type.
var attrTypes = map[string]pb.AttributeProto_AttributeType{
	"num_experts": pb.AttributeProto_INT, "top_k": pb.AttributeProto_INT,
	"router_activation": pb.AttributeProto_STRING, "router_order": pb.AttributeProto_STRING,
	"normalize_topk": pb.AttributeProto_INT, "routed_scaling_factor": pb.AttributeProto_FLOAT,
	"n_group": pb.AttributeProto_INT, "topk_group": pb.AttributeProto_INT, "group_score": pb.AttributeProto_STRING,
	"weights_on_input": pb.AttributeProto_INT, "activation": pb.AttributeProto_STRING,
	"swiglu_alpha": pb.AttributeProto_FLOAT, "swiglu_limit": pb.AttributeProto_FLOAT,
	"gate_up_interleaved": pb.AttributeProto_INT, "shared_expert_gated": pb.AttributeProto_INT,
	"ep_size": pb.AttributeProto_INT, "expert_offset": pb.AttributeProto_INT,
	"sparsemixer_threshold": pb.AttributeProto_FLOAT, "io_type": pb.AttributeProto_STRING, "weight_type": pb.AttributeProto_STRING,
}

// flagAttrs are the attributes that hold a flag: 0 or 1.
var flagAttrs = []string{"normalize_topk", "weights_on_input", "gate_up_interleaved", "shared_expert_gated"}

// required are the inputs every fused node has.
var required = []int{InHidden, InRouterW, InUp, InDown}

// CheckNodeForm checks what the fused node's contract states beyond its
// spec's consistency: one to MaxOutputs outputs with the first named, at
// most NumInputs inputs with the required ones present, and every attribute
// one the contract defines, of its type, given once, flags 0 or 1 and
// floats finite. SpecFromNode calls it first, so every command that reads
// a fused node refuses the same malformed ones.
func CheckNodeForm(n *pb.NodeProto) error {
	var errs []string
	if len(n.Output) < 1 || len(n.Output) > MaxOutputs || n.Output[0] == "" {
		errs = append(errs, fmt.Sprintf("has %d outputs %q; the contract needs 1 to %d, the first named", len(n.Output), n.Output, MaxOutputs))
	}
	if len(n.Input) > NumInputs {
		errs = append(errs, fmt.Sprintf("has %d inputs; the contract defines %d", len(n.Input), NumInputs))
	}
	for _, pos := range required {
		if pos >= len(n.Input) || n.Input[pos] == "" {
			errs = append(errs, fmt.Sprintf("input %s is missing", InputNames[pos]))
		}
	}
	seen := map[string]bool{}
	for _, a := range n.Attribute {
		name := a.GetName()
		want, known := attrTypes[name]
		switch {
		case !known:
			errs = append(errs, fmt.Sprintf("attribute %q is not in the contract", name))
		case seen[name]:
			errs = append(errs, fmt.Sprintf("attribute %q is given more than once", name))
		case a.GetType() != want:
			errs = append(errs, fmt.Sprintf("attribute %q is %v, the contract needs %v", name, a.GetType(), want))
		case want == pb.AttributeProto_FLOAT && (math.IsNaN(float64(a.GetF())) || math.IsInf(float64(a.GetF()), 0)):
			errs = append(errs, fmt.Sprintf("attribute %q is %v; it must be finite", name, a.GetF()))
		}
		seen[name] = true
	}
	for _, name := range flagAttrs {
		if v := graph.AttrInt(n, name, 0); v != 0 && v != 1 {
			errs = append(errs, fmt.Sprintf("attribute %q is %d; it is a flag, 0 or 1", name, v))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("node %q: malformed %s::%s node: %s", graph.NodeLabel(n), Domain, OpType, strings.Join(errs, "; "))
	}
	return nil
}
