// Package models builds synthetic Mixture-of-Experts ONNX models, of any
// size, in the shapes real exporters produce: transformers' batched_mm
// export (stacked weights gathered by the top-k indices), the unrolled
// per-expert loop of transformers 4.x (one branch per expert, tokens picked
// with NonZero, ScatterND add), the dense form (every expert on every token,
// weighted by a routing matrix) and ONNX Runtime's com.microsoft::MoE
// contrib op.
//
// Models are deterministic: the same Config always gives the same graph and
// the same weight bytes. Every weight element is a pure function of the
// seed, the layer, the weight's role and the element's index in the
// canonical layout (see Weights): the idx-th output of a splitmix64 stream
// keyed by (seed, layer, role), mapped to a uniform value in
// [-1, 1)/sqrt(fan_in). So the same Config in another Shape computes the
// same function, and with Config.External the weights are generated on the
// fly, chunk by chunk, while the model is saved instead of being held in
// memory.
//
// The tests check that passes.Detect finds every block of the batched,
// unrolled and dense shapes with the right Spec and weights, and that
// moe.Forward on them matches an independent evaluation of the generator's
// math, and run the generated graphs in the graph/eval interpreter against
// that math too.
package models

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// Shapes a model's MoE blocks can be written in.
const (
	// ShapeBatched is transformers' batched_mm export: GatherND of stacked
	// weights (fused gate_up [E, 2I, H], down [E, H, I]) by the top-k
	// indices, batched MatMuls, weighted sum over the k slots.
	ShapeBatched = "batched"
	// ShapeUnrolled is the transformers 4.x expert loop as the dynamo
	// exporter unrolls it: per expert, w1/w3 [I, H] and w2 [H, I] Gemms on
	// the tokens routed to it, combined with ScatterND add.
	ShapeUnrolled = "unrolled"
	// ShapeDense runs every expert on every token with stacked [E, H, I] /
	// [E, I, H] MatMuls and weights the outputs by a [T, E] routing matrix.
	ShapeDense = "dense"
	// ShapeORT is one com.microsoft::MoE node per block (ONNX Runtime's
	// contrib op); see ORT_MOE.md for its layout.
	ShapeORT = "ort"
)

// Shapes lists the valid Config.Shape values.
var Shapes = []string{ShapeBatched, ShapeUnrolled, ShapeDense, ShapeORT}

// Config describes a synthetic model.
type Config struct {
	// Shape is how each MoE block is written: batched, unrolled, dense or ort.
	Shape string `json:"shape"`
	// Layers is the number of MoE blocks, chained as h = h + MoE(h).
	Layers int `json:"layers"`
	// Experts is the number of routed experts E.
	Experts int `json:"experts"`
	// TopK is the number of experts each token is routed to.
	TopK int `json:"top_k"`
	// Hidden is the hidden size H.
	Hidden int `json:"hidden"`
	// Inter is the intermediate size I of a routed expert.
	Inter int `json:"inter"`
	// SharedInter is the intermediate size of an ungated shared SwiGLU
	// expert added at the end of each block; 0 means none (not for ort).
	SharedInter int `json:"shared_inter"`
	// Router is the router activation, softmax (default) or sigmoid
	// (not for ort, whose routing is always softmax).
	Router string `json:"router"`
	// Normalize renormalises the top-k weights to sum to 1.
	Normalize bool `json:"normalize"`
	// Seed selects the weights.
	Seed int64 `json:"seed"`
	// Tokens is the static token count T of the input [T, H], or 0 for a
	// symbolic dimension "tokens" (the graph then bakes in no T).
	Tokens int `json:"tokens"`
	// External registers the weights as deferred tensors that Save streams
	// into the side file; otherwise they are generated into raw_data.
	External bool `json:"external"`
	// ORTSwiGLU (ort only) writes activation_type "swiglu" with
	// swiglu_fusion=1 and an interleaved fused fc1 [E, 2I, H] instead of
	// activation_type "silu" with separate fc1 (gate) and fc3 (up).
	ORTSwiGLU bool `json:"ort_swiglu,omitempty"`
	// Quant (ort only) is "int8" or "int4": each block is one
	// com.microsoft::QMoE node with symmetric quantized expert weights (fc1 =
	// gate and up interleaved, swiglu_fusion 1) and float scales, one per
	// row or, with QuantBlockSize, per block of that many inputs. The model
	// then computes with the dequantized weights (Weights returns them).
	Quant string `json:"quant,omitempty"`
	// QuantBlockSize is QMoE's block_size (a power of two >= 16 dividing
	// Hidden and Inter); 0 means one scale per output row.
	QuantBlockSize int `json:"quant_block_size,omitempty"`
	// DType is the element type of the model's input, output, weights and
	// compute: DTypeFloat32 (the default, also ""), DTypeFloat16 or
	// DTypeBFloat16. A half-precision model is written the way torch.onnx
	// exports a model cast to that type: weights stored in it, the router
	// linear and the experts computing in it, and the routing (activation,
	// top-k, renormalisation) in float32 between Casts, as transformers
	// does; see Build.
	DType string `json:"dtype,omitempty"`
}

// Element types Config.DType can name.
const (
	DTypeFloat32  = "float32"
	DTypeFloat16  = "float16"
	DTypeBFloat16 = "bfloat16"
)

// DTypes lists the valid Config.DType values.
var DTypes = []string{DTypeFloat32, DTypeFloat16, DTypeBFloat16}

// dtypeAliases maps the short names the CLI accepts to Config.DType values.
var dtypeAliases = map[string]string{"fp32": DTypeFloat32, "fp16": DTypeFloat16, "bf16": DTypeBFloat16, "float": DTypeFloat32, "half": DTypeFloat16}

// ParseDType returns the Config.DType that s names: fp32, fp16, bf16 or
// one of DTypes; "" is float32. Anything else is an error naming the
// accepted values.
func ParseDType(s string) (string, error) {
	if s == "" {
		return DTypeFloat32, nil
	}
	if slices.Contains(DTypes, s) {
		return s, nil
	}
	if d, ok := dtypeAliases[s]; ok {
		return d, nil
	}
	return "", fmt.Errorf("dtype %q (want fp32, fp16 or bf16, or float32, float16, bfloat16)", s)
}

// elemType is the ONNX element type of cfg.DType.
func (cfg Config) elemType() pb.TensorProto_DataType {
	switch cfg.DType {
	case DTypeFloat16:
		return pb.TensorProto_FLOAT16
	case DTypeBFloat16:
		return pb.TensorProto_BFLOAT16
	}
	return pb.TensorProto_FLOAT
}

// half reports whether cfg's model computes in a 16-bit float type.
func (cfg Config) half() bool { return cfg.elemType() != pb.TensorProto_FLOAT }

// quantBits returns the weight bits of cfg.Quant (0 when not quantized).
func (cfg Config) quantBits() int {
	return map[string]int{"int8": 8, "int4": 4}[cfg.Quant]
}

// normalized returns cfg with defaults filled in, or an error naming every
// invalid field.
func (cfg Config) normalized() (Config, error) {
	if cfg.Router == "" {
		cfg.Router = moe.Softmax
	}
	var errs []string
	if d, err := ParseDType(cfg.DType); err != nil {
		errs = append(errs, err.Error())
	} else if d == DTypeFloat32 {
		cfg.DType = "" // the default: float32 configs keep their JSON
	} else {
		cfg.DType = d
	}
	switch cfg.Shape {
	case ShapeBatched, ShapeUnrolled, ShapeDense, ShapeORT:
	default:
		errs = append(errs, fmt.Sprintf("shape %q (want one of %s)", cfg.Shape, strings.Join(Shapes, ", ")))
	}
	if cfg.Layers < 1 {
		errs = append(errs, fmt.Sprintf("layers %d < 1", cfg.Layers))
	}
	if cfg.Experts < 1 {
		errs = append(errs, fmt.Sprintf("experts %d < 1", cfg.Experts))
	}
	if cfg.TopK < 1 || cfg.TopK > cfg.Experts {
		errs = append(errs, fmt.Sprintf("top-k %d not in 1..experts (%d)", cfg.TopK, cfg.Experts))
	}
	if cfg.Hidden < 1 {
		errs = append(errs, fmt.Sprintf("hidden %d < 1", cfg.Hidden))
	}
	if cfg.Inter < 1 {
		errs = append(errs, fmt.Sprintf("inter %d < 1", cfg.Inter))
	}
	if cfg.SharedInter < 0 {
		errs = append(errs, fmt.Sprintf("shared-inter %d < 0", cfg.SharedInter))
	}
	if cfg.Tokens < 0 {
		errs = append(errs, fmt.Sprintf("tokens %d < 0", cfg.Tokens))
	}
	if cfg.Router != moe.Softmax && cfg.Router != moe.Sigmoid {
		errs = append(errs, fmt.Sprintf("router %q (want softmax or sigmoid)", cfg.Router))
	}
	if cfg.Shape == ShapeORT {
		if cfg.Router != moe.Softmax {
			errs = append(errs, "shape ort routes with a softmax only (com.microsoft::MoE has no sigmoid router)")
		}
		if cfg.SharedInter > 0 {
			errs = append(errs, "shape ort has no shared expert")
		}
	} else if cfg.ORTSwiGLU {
		errs = append(errs, "ort-swiglu needs shape ort")
	}
	if cfg.Quant != "" {
		switch {
		case cfg.quantBits() == 0:
			errs = append(errs, fmt.Sprintf("quant %q (want int8 or int4)", cfg.Quant))
		case cfg.Shape != ShapeORT:
			errs = append(errs, "quant needs shape ort (com.microsoft::QMoE)")
		case !cfg.Normalize:
			errs = append(errs, "quant needs normalize (ONNX Runtime 1.30's CPU QMoE always renormalises the top-k weights)")
		case cfg.quantBits() == 4 && (cfg.Hidden%2 != 0 || cfg.Inter%2 != 0):
			errs = append(errs, "quant int4 needs even hidden and inter sizes")
		}
	}
	if cfg.half() && cfg.Quant != "" {
		errs = append(errs, fmt.Sprintf("quant with dtype %s (com.microsoft::QMoE here takes float32 activations and scales)", cfg.DType))
	}
	if cfg.Shape == ShapeORT && cfg.elemType() == pb.TensorProto_BFLOAT16 {
		errs = append(errs, "shape ort with dtype bfloat16 (ONNX Runtime registers com.microsoft::MoE for float and float16 only, on CPU and CUDA)")
	}
	if b := cfg.QuantBlockSize; b != 0 && (cfg.Quant == "" || b < 16 || b&(b-1) != 0 || cfg.Hidden%b != 0 || cfg.Inter%b != 0) {
		errs = append(errs, fmt.Sprintf("quant block size %d (needs quant, a power of two >= 16 dividing hidden %d and inter %d)", b, cfg.Hidden, cfg.Inter))
	}
	if len(errs) > 0 {
		return cfg, errors.New("invalid model config: " + strings.Join(errs, "; "))
	}
	return cfg, nil
}

// Validate reports whether cfg describes a model Build can make.
func (cfg Config) Validate() error {
	_, err := cfg.normalized()
	return err
}

// Spec returns the moe.Spec every block of cfg's model implements, exactly
// as the detector should read it back.
func Spec(cfg Config) (moe.Spec, error) {
	cfg, err := cfg.normalized()
	if err != nil {
		return moe.Spec{}, err
	}
	return moe.Spec{
		NumExperts:          cfg.Experts,
		TopK:                cfg.TopK,
		Hidden:              cfg.Hidden,
		Inter:               cfg.Inter,
		RouterActivation:    cfg.Router,
		RouterOrder:         moe.ActivationThenTopK,
		NormalizeTopK:       cfg.Normalize,
		RoutedScalingFactor: 1,
		NGroup:              1,
		TopKGroup:           1,
		Activation:          moe.SwiGLU,
		SwiGLUAlpha:         1,
		SharedInter:         cfg.SharedInter,
		EPSize:              1,
		IOType:              cfg.DType,
	}, nil
}
