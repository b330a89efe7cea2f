package kernel

import "strings"

// Precision is the number format of the routed experts' weights. The shared
// expert is BF16 in both.
type Precision string

// The two routed-expert precisions MoK supports.
const (
	BF16  Precision = "bf16"
	MXFP8 Precision = "mxfp8"
)

// DType is a tensor element type of the kernel interface.
type DType string

// The element types that appear in the contract.
const (
	DTypeBF16  DType = "bfloat16"
	DTypeFP32  DType = "float32"
	DTypeInt64 DType = "int64"
	DTypeE4M3  DType = "float8_e4m3fn"
	DTypeUE8M0 DType = "uint8" // UE8M0 scale bytes
)

// Size returns the size of one element in bytes.
func (d DType) Size() int {
	switch d {
	case DTypeBF16:
		return 2
	case DTypeFP32:
		return 4
	case DTypeInt64:
		return 8
	default:
		return 1
	}
}

// Dims are the sizes the shape formulas refer to, per rank.
type Dims struct {
	// T is the number of tokens per rank.
	T int
	// H is the hidden size.
	H int
	// I is the intermediate size (of each routed expert and of the shared expert).
	I int
	// TopK is k, the number of experts per token.
	TopK int
	// ELocal is E_l = E / EP, the number of experts on each rank.
	ELocal int
}

// TensorSpec describes one tensor of a MoK call on one rank.
type TensorSpec struct {
	// Name is the tensor's name (MoK's argument name where it has one).
	Name string
	// Role is "input", "weight" or "output".
	Role string
	// DType is the element type.
	DType DType
	// Shape is the shape as formulas over Dims, e.g. {"E_l·I/128", "H/128", "32", "16"}.
	Shape []string
	// Layout says how the tensor is laid out.
	Layout string
	// Precision is the routed precision the tensor belongs to; "" means both.
	Precision Precision
	// TrainingOnly marks tensors only a training (backward) call needs.
	TrainingOnly bool

	dims func(Dims) []int
}

// Dims evaluates the shape formulas.
func (s TensorSpec) Dims(d Dims) []int { return s.dims(d) }

// Bytes returns the tensor's size in bytes for d.
func (s TensorSpec) Bytes(d Dims) int64 {
	n := int64(s.DType.Size())
	for _, v := range s.dims(d) {
		n *= int64(v)
	}
	return n
}

// ShapeString returns the shape formula as "[a, b, c]".
func (s TensorSpec) ShapeString() string { return "[" + strings.Join(s.Shape, ", ") + "]" }

const enkLayout = "[E, N, K], K (the contraction axis) contiguous"

func mxfp8Pair(name string, nName, kName string, n, k func(Dims) int, training bool, what string) []TensorSpec {
	return []TensorSpec{
		{Name: name, Role: "weight", DType: DTypeE4M3, Shape: []string{"E_l", nName, kName},
			Layout: enkLayout + "; " + what, Precision: MXFP8, TrainingOnly: training,
			dims: func(d Dims) []int { return []int{d.ELocal, n(d), k(d)} }},
		{Name: name + "_sc", Role: "weight", DType: DTypeUE8M0,
			Shape:     []string{"E_l·" + nName + "/128", kName + "/128", "32", "16"},
			Layout:    "UE8M0 scale per 1×32 block along " + kName + ", tcgen05 scale-factor-1x tiles (kernel/mxfp8.ScaleIndex)",
			Precision: MXFP8, TrainingOnly: training,
			dims: func(d Dims) []int { return []int{d.ELocal * n(d) / 128, k(d) / 128, 32, 16} }},
	}
}

// tensorTable is the per-rank tensor contract of docs/kernel.md "Tensor contract".
var tensorTable = func() []TensorSpec {
	h := func(d Dims) int { return d.H }
	i := func(d Dims) int { return d.I }
	ts := []TensorSpec{
		{Name: "x", Role: "input", DType: DTypeBF16, Shape: []string{"T", "H"}, Layout: "token-major",
			dims: func(d Dims) []int { return []int{d.T, d.H} }},
		{Name: "topk_experts", Role: "input", DType: DTypeInt64, Shape: []string{"T", "k"},
			Layout: "global expert ids; expert e lives on rank e / E_l (contiguous placement)",
			dims:   func(d Dims) []int { return []int{d.T, d.TopK} }},
		{Name: "router_weights", Role: "input", DType: DTypeFP32, Shape: []string{"T", "k"},
			Layout: "applied exactly as given: renormalisation, routed_scaling_factor and bias correction folded in by the caller",
			dims:   func(d Dims) []int { return []int{d.T, d.TopK} }},
		{Name: "w_shared_gate", Role: "weight", DType: DTypeBF16, Shape: []string{"I", "H"}, Layout: "(out, in), H contiguous",
			dims: func(d Dims) []int { return []int{d.I, d.H} }},
		{Name: "w_shared_up", Role: "weight", DType: DTypeBF16, Shape: []string{"I", "H"}, Layout: "(out, in), H contiguous",
			dims: func(d Dims) []int { return []int{d.I, d.H} }},
		{Name: "w_shared_down", Role: "weight", DType: DTypeBF16, Shape: []string{"H", "I"}, Layout: "(out, in), I contiguous",
			dims: func(d Dims) []int { return []int{d.H, d.I} }},
		{Name: "w_routed_gate", Role: "weight", DType: DTypeBF16, Shape: []string{"E_l", "I", "H"}, Layout: enkLayout, Precision: BF16,
			dims: func(d Dims) []int { return []int{d.ELocal, d.I, d.H} }},
		{Name: "w_routed_up", Role: "weight", DType: DTypeBF16, Shape: []string{"E_l", "I", "H"}, Layout: enkLayout, Precision: BF16,
			dims: func(d Dims) []int { return []int{d.ELocal, d.I, d.H} }},
		{Name: "w_routed_down", Role: "weight", DType: DTypeBF16, Shape: []string{"E_l", "H", "I"}, Layout: enkLayout, Precision: BF16,
			dims: func(d Dims) []int { return []int{d.ELocal, d.H, d.I} }},
	}
	ts = append(ts, mxfp8Pair("w_routed_gate", "I", "H", i, h, false, "gate and up are separate tensors")...)
	ts = append(ts, mxfp8Pair("w_routed_up", "I", "H", i, h, false, "gate and up are separate tensors")...)
	ts = append(ts, mxfp8Pair("w_routed_down", "H", "I", h, i, false, "")...)
	ts = append(ts, mxfp8Pair("w_routed_gate_t", "H", "I", h, i, true, "transposed copy (blocks along I) for dgrad")...)
	ts = append(ts, mxfp8Pair("w_routed_up_t", "H", "I", h, i, true, "transposed copy (blocks along I) for dgrad")...)
	ts = append(ts, mxfp8Pair("w_routed_down_t", "I", "H", i, h, true, "transposed copy (blocks along H) for dgrad")...)
	ts = append(ts, TensorSpec{Name: "output", Role: "output", DType: DTypeBF16, Shape: []string{"T", "H"},
		Layout: "token-major; out[t] = shared[t] + Σ_k w[t,k]·routed[t,k] formed in fp32 by the epilogue",
		dims:   func(d Dims) []int { return []int{d.T, d.H} }})
	return ts
}()

// Tensors returns the tensors of a MoK call on one rank for routed precision p;
// training adds the transposed MXFP8 weight copies the backward pass needs.
func Tensors(p Precision, training bool) []TensorSpec {
	var out []TensorSpec
	for _, t := range tensorTable {
		if (t.Precision != "" && t.Precision != p) || (t.TrainingOnly && !training) {
			continue
		}
		out = append(out, t)
	}
	return out
}
