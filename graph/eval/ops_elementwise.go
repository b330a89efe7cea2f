package eval

import (
	"math"
	"slices"
	"strconv"
	"strings"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	vec "github.com/mokopt/mokopt/internal/f32"
)

// broadcast2 applies f elementwise to a and b under broadcasting.
func broadcast2[A, B, R any](a []A, ash []int, b []B, bsh []int, f func(A, B) R) ([]R, []int, error) {
	shape, err := BroadcastShapes(ash, bsh)
	if err != nil {
		return nil, nil, err
	}
	n := numel(shape)
	out := make([]R, n)
	switch {
	case slices.Equal(ash, shape) && slices.Equal(bsh, shape):
		for i := range out {
			out[i] = f(a[i], b[i])
		}
	case slices.Equal(ash, shape) && len(b) == 1:
		bv := b[0]
		for i := range out {
			out[i] = f(a[i], bv)
		}
	case slices.Equal(bsh, shape) && len(a) == 1:
		av := a[0]
		for i := range out {
			out[i] = f(av, b[i])
		}
	case slices.Equal(ash, shape) && blockBroadcast(bsh, shape) != 0:
		// b repeats along trailing dims (inner > 0: b[i/inner]) or
		// leading dims (inner < 0: b[i%len(b)]), with no index arrays.
		if inner := blockBroadcast(bsh, shape); inner > 0 {
			for blk, bv := range b[:n/inner] {
				o, x := out[blk*inner:(blk+1)*inner], a[blk*inner:(blk+1)*inner]
				for i := range o {
					o[i] = f(x[i], bv)
				}
			}
		} else {
			for off := 0; off < n; off += len(b) {
				o, x := out[off:off+len(b)], a[off:off+len(b)]
				for i := range o {
					o[i] = f(x[i], b[i])
				}
			}
		}
	case slices.Equal(bsh, shape) && blockBroadcast(ash, shape) != 0:
		if inner := blockBroadcast(ash, shape); inner > 0 {
			for blk, av := range a[:n/inner] {
				o, y := out[blk*inner:(blk+1)*inner], b[blk*inner:(blk+1)*inner]
				for i := range o {
					o[i] = f(av, y[i])
				}
			}
		} else {
			for off := 0; off < n; off += len(a) {
				o, y := out[off:off+len(a)], b[off:off+len(a)]
				for i := range o {
					o[i] = f(a[i], y[i])
				}
			}
		}
	default:
		ai := bcastIndex(ash, shape)
		bi := bcastIndex(bsh, shape)
		for i := range out {
			x, y := i, i
			if ai != nil {
				x = ai[i]
			}
			if bi != nil {
				y = bi[i]
			}
			out[i] = f(a[x], b[y])
		}
	}
	return out, shape, nil
}

// blockBroadcast says how an operand of shape in repeats over out when its
// (right-aligned) dims are out's leading dims followed by ones: the size of
// the repeated trailing block (> 0); or ones followed by out's trailing
// dims: -1 (it repeats whole); 0 for any other broadcast or a size-0 out.
func blockBroadcast(in, out []int) int {
	if numel(out) == 0 || numel(in) == 0 || len(in) > len(out) {
		return 0
	}
	pad := make([]int, len(out))
	for i := range pad {
		pad[i] = 1
	}
	copy(pad[len(out)-len(in):], in)
	k := 0 // leading dims equal to out's
	for k < len(out) && pad[k] == out[k] {
		k++
	}
	rest := true
	for _, d := range pad[k:] {
		rest = rest && d == 1
	}
	if rest && k > 0 {
		return numel(out[k:])
	}
	j := 0 // leading ones
	for j < len(out) && pad[j] == 1 {
		j++
	}
	if slices.Equal(pad[j:], out[j:]) {
		return -1
	}
	return 0
}

// arith is a binary numeric operation per storage class (nil: unsupported).
type arith struct {
	f32 func(a, b float32) float32
	f64 func(a, b float64) float64
	i64 func(a, b int64) int64
	// intZeroCheck rejects integer division by zero.
	intZeroCheck bool
	// sym is '+', '-', '*' or '/' for the four operators whose float32
	// loop over equal shapes is written out (no call per element); 0 else.
	sym byte
}

func applyArith(op arith, a, b *Tensor) (*Tensor, error) {
	if a.kind() != b.kind() {
		return nil, errf("operand types differ: %s and %s", a.DType, b.DType)
	}
	out := &Tensor{DType: a.DType}
	var err error
	switch a.kind() {
	case kF32:
		if op.f32 == nil {
			break
		}
		if op.sym != 0 && slices.Equal(a.Shape, b.Shape) && len(a.F32) == len(b.F32) {
			out.Shape, out.F32 = append([]int{}, a.Shape...), make([]float32, len(a.F32))
			x, y, o := a.F32, b.F32[:len(a.F32)], out.F32[:len(a.F32)]
			switch op.sym {
			case '+':
				for i, v := range x {
					o[i] = v + y[i]
				}
			case '-':
				for i, v := range x {
					o[i] = v - y[i]
				}
			case '*':
				for i, v := range x {
					o[i] = v * y[i]
				}
			case '/':
				for i, v := range x {
					o[i] = v / y[i]
				}
			}
			return out, nil
		}
		out.F32, out.Shape, err = broadcast2(a.F32, a.Shape, b.F32, b.Shape, op.f32)
		return out, err
	case kF64:
		if op.f64 == nil {
			break
		}
		out.F64, out.Shape, err = broadcast2(a.F64, a.Shape, b.F64, b.Shape, op.f64)
		return out, err
	case kI64:
		if op.i64 == nil {
			break
		}
		if op.intZeroCheck {
			for _, v := range b.I64 {
				if v == 0 {
					return nil, errf("integer division by zero")
				}
			}
		}
		out.I64, out.Shape, err = broadcast2(a.I64, a.Shape, b.I64, b.Shape, op.i64)
		return out, err
	}
	return nil, errf("type %s is not supported", a.DType)
}

var arithOps = map[string]arith{
	"Add": {
		sym: '+',
		f32: func(a, b float32) float32 { return a + b },
		f64: func(a, b float64) float64 { return a + b },
		i64: func(a, b int64) int64 { return a + b },
	},
	"Sub": {
		sym: '-',
		f32: func(a, b float32) float32 { return a - b },
		f64: func(a, b float64) float64 { return a - b },
		i64: func(a, b int64) int64 { return a - b },
	},
	"Mul": {
		sym: '*',
		f32: func(a, b float32) float32 { return a * b },
		f64: func(a, b float64) float64 { return a * b },
		i64: func(a, b int64) int64 { return a * b },
	},
	"Div": {
		sym:          '/',
		f32:          func(a, b float32) float32 { return a / b },
		f64:          func(a, b float64) float64 { return a / b },
		i64:          func(a, b int64) int64 { return a / b },
		intZeroCheck: true,
	},
	"Max": {
		f32: func(a, b float32) float32 { return float32(nanMax(float64(a), float64(b))) },
		f64: nanMax,
		i64: func(a, b int64) int64 { return max(a, b) },
	},
	"Min": {
		f32: func(a, b float32) float32 { return float32(nanMin(float64(a), float64(b))) },
		f64: nanMin,
		i64: func(a, b int64) int64 { return min(a, b) },
	},
	"Sum": {
		f32: func(a, b float32) float32 { return a + b },
		f64: func(a, b float64) float64 { return a + b },
		i64: func(a, b int64) int64 { return a + b },
	},
}

func nanMax(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.NaN()
	}
	return math.Max(a, b)
}

func nanMin(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.NaN()
	}
	return math.Min(a, b)
}

func kArith(op string) KernelFunc {
	ar := arithOps[op]
	return func(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
		a, b, err := need2(in)
		if err != nil {
			return nil, err
		}
		if op == "Div" && a.DType == pb.TensorProto_UINT64 {
			u := ar
			u.i64 = func(x, y int64) int64 { return int64(uint64(x) / uint64(y)) }
			return one(applyArith(u, a, b))
		}
		return one(applyArith(ar, a, b))
	}
}

// kVariadic folds Max, Min, Sum and Mean over any number of inputs.
func kVariadic(op string) KernelFunc {
	ar := arithOps[op]
	if op == "Mean" {
		ar = arithOps["Sum"]
	}
	unsigned := arith{i64: func(a, b int64) int64 {
		if op == "Max" {
			return int64(max(uint64(a), uint64(b)))
		}
		return int64(min(uint64(a), uint64(b)))
	}}
	return func(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
		if len(in) == 0 || in[0] == nil {
			return nil, errf("needs at least one input")
		}
		acc := in[0]
		use := ar
		if (op == "Max" || op == "Min") && acc.DType == pb.TensorProto_UINT64 {
			use = unsigned
		}
		for _, t := range in[1:] {
			if t == nil {
				continue
			}
			var err error
			if acc, err = applyArith(use, acc, t); err != nil {
				return nil, err
			}
		}
		if len(in) == 1 {
			acc = acc.Clone()
		}
		if op == "Mean" {
			k := float64(len(in))
			switch acc.kind() {
			case kF32:
				for i := range acc.F32 {
					acc.F32[i] = float32(float64(acc.F32[i]) / k)
				}
			case kF64:
				for i := range acc.F64 {
					acc.F64[i] /= k
				}
			default:
				return nil, errf("Mean needs a float type, got %s", acc.DType)
			}
		}
		return []*Tensor{acc}, nil
	}
}

func kPow(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	a, b, err := need2(in)
	if err != nil {
		return nil, err
	}
	bf := b.Float64s()
	out := &Tensor{DType: a.DType}
	switch a.kind() {
	case kF32:
		out.F32, out.Shape, err = broadcast2(a.F32, a.Shape, bf, b.Shape, func(x float32, y float64) float32 {
			if y == 2 {
				return x * x
			}
			return float32(math.Pow(float64(x), y))
		})
	case kF64:
		out.F64, out.Shape, err = broadcast2(a.F64, a.Shape, bf, b.Shape, math.Pow)
	case kI64:
		out.I64, out.Shape, err = broadcast2(a.I64, a.Shape, bf, b.Shape, func(x int64, y float64) int64 {
			return int64(math.Pow(float64(x), y))
		})
	default:
		return nil, errf("type %s is not supported", a.DType)
	}
	return one(out, err)
}

func kMod(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	a, b, err := need2(in)
	if err != nil {
		return nil, err
	}
	fm := attrInt(n, "fmod", 0) == 1
	op := arith{
		f32: func(x, y float32) float32 { return float32(math.Mod(float64(x), float64(y))) },
		f64: math.Mod,
		i64: func(x, y int64) int64 {
			r := x % y
			if !fm && r != 0 && (r < 0) != (y < 0) {
				r += y
			}
			return r
		},
		intZeroCheck: true,
	}
	if a.kind() != kI64 && !fm {
		op.f32 = func(x, y float32) float32 { return float32(pyMod(float64(x), float64(y))) }
		op.f64 = pyMod
	}
	if a.DType == pb.TensorProto_UINT64 {
		op.i64 = func(x, y int64) int64 { return int64(uint64(x) % uint64(y)) }
	}
	return one(applyArith(op, a, b))
}

func pyMod(x, y float64) float64 {
	r := math.Mod(x, y)
	if r != 0 && (r < 0) != (y < 0) {
		r += y
	}
	return r
}

func kPRelu(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, s, err := need2(in)
	if err != nil {
		return nil, err
	}
	return one(applyArith(arith{
		f32: func(a, b float32) float32 {
			if a < 0 {
				return a * b
			}
			return a
		},
		f64: func(a, b float64) float64 {
			if a < 0 {
				return a * b
			}
			return a
		},
		i64: func(a, b int64) int64 {
			if a < 0 {
				return a * b
			}
			return a
		},
	}, x, s))
}

func kBitShift(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	a, b, err := need2(in)
	if err != nil {
		return nil, err
	}
	left := attrString(n, "direction", "") == "LEFT"
	return one(applyArith(arith{i64: func(x, y int64) int64 {
		if y < 0 || y >= 64 {
			return 0
		}
		if left {
			return int64(uint64(x) << uint(y))
		}
		return int64(uint64(x) >> uint(y))
	}}, a, b))
}

// unaryF is a float function for unary float ops.
type unaryF func(x float64) float64

func unaryFloats(n *pb.NodeProto, op string) unaryF {
	switch op {
	case "Abs":
		return math.Abs
	case "Neg":
		return func(x float64) float64 { return -x }
	case "Exp":
		return math.Exp
	case "Log":
		return math.Log
	case "Sqrt":
		return math.Sqrt
	case "Reciprocal":
		return func(x float64) float64 { return 1 / x }
	case "Erf":
		return math.Erf
	case "Tanh":
		return math.Tanh
	case "Relu":
		return func(x float64) float64 {
			if x > 0 {
				return x
			}
			return 0
		}
	case "Sigmoid":
		return sigmoid
	case "Floor":
		return math.Floor
	case "Ceil":
		return math.Ceil
	case "Round":
		return math.RoundToEven
	case "Sign":
		return func(x float64) float64 {
			switch {
			case x > 0:
				return 1
			case x < 0:
				return -1
			}
			return x
		}
	case "Sin":
		return math.Sin
	case "Cos":
		return math.Cos
	case "Tan":
		return math.Tan
	case "Asin":
		return math.Asin
	case "Acos":
		return math.Acos
	case "Atan":
		return math.Atan
	case "Sinh":
		return math.Sinh
	case "Cosh":
		return math.Cosh
	case "Asinh":
		return math.Asinh
	case "Acosh":
		return math.Acosh
	case "Atanh":
		return math.Atanh
	case "Softplus":
		return func(x float64) float64 {
			if x > 30 {
				return x
			}
			return math.Log1p(math.Exp(x))
		}
	case "Softsign":
		return func(x float64) float64 { return x / (1 + math.Abs(x)) }
	case "Mish":
		return func(x float64) float64 { return x * math.Tanh(math.Log1p(math.Exp(x))) }
	case "Elu":
		alpha := float64(attrFloat(n, "alpha", 1))
		return func(x float64) float64 {
			if x < 0 {
				return alpha * (math.Exp(x) - 1)
			}
			return x
		}
	case "Celu":
		alpha := float64(attrFloat(n, "alpha", 1))
		return func(x float64) float64 {
			return math.Max(0, x) + math.Min(0, alpha*(math.Exp(x/alpha)-1))
		}
	case "Selu":
		alpha := float64(attrFloat(n, "alpha", 1.67326319217681884765625))
		gamma := float64(attrFloat(n, "gamma", 1.05070102214813232421875))
		return func(x float64) float64 {
			if x <= 0 {
				return gamma * (alpha*math.Exp(x) - alpha)
			}
			return gamma * x
		}
	case "LeakyRelu":
		alpha := float64(attrFloat(n, "alpha", 0.01))
		return func(x float64) float64 {
			if x < 0 {
				return alpha * x
			}
			return x
		}
	case "ThresholdedRelu":
		alpha := float64(attrFloat(n, "alpha", 1))
		return func(x float64) float64 {
			if x > alpha {
				return x
			}
			return 0
		}
	case "HardSigmoid":
		alpha := float64(attrFloat(n, "alpha", 0.2))
		beta := float64(attrFloat(n, "beta", 0.5))
		return func(x float64) float64 { return math.Max(0, math.Min(1, alpha*x+beta)) }
	case "HardSwish":
		return func(x float64) float64 { return x * math.Max(0, math.Min(1, x/6+0.5)) }
	case "Gelu":
		if attrString(n, "approximate", "none") == "tanh" {
			return func(x float64) float64 {
				return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
			}
		}
		return func(x float64) float64 { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }
	case "FastGelu":
		return func(x float64) float64 {
			return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
		}
	case "QuickGelu":
		alpha := float64(attrFloat(n, "alpha", 1.702))
		return func(x float64) float64 { return x * sigmoid(alpha*x) }
	case "Shrink":
		bias := float64(attrFloat(n, "bias", 0))
		lambd := float64(attrFloat(n, "lambd", 0.5))
		return func(x float64) float64 {
			switch {
			case x < -lambd:
				return x + bias
			case x > lambd:
				return x - bias
			}
			return 0
		}
	}
	return nil
}

func sigmoid(x float64) float64 {
	if x >= 0 {
		return 1 / (1 + math.Exp(-x))
	}
	e := math.Exp(x)
	return e / (1 + e)
}

// intUnary handles the unary ops defined on integer types.
func intUnary(n *pb.NodeProto, op string, dt pb.TensorProto_DataType) func(int64) int64 {
	switch op {
	case "Abs":
		return func(x int64) int64 {
			if x < 0 {
				return -x
			}
			return x
		}
	case "Neg":
		return func(x int64) int64 { return -x }
	case "Relu":
		return func(x int64) int64 { return max(x, 0) }
	case "Sign":
		return func(x int64) int64 {
			switch {
			case x > 0:
				return 1
			case x < 0:
				return -1
			}
			return 0
		}
	case "Identity", "Floor", "Ceil", "Round":
		return func(x int64) int64 { return x }
	case "Shrink":
		bias := int64(attrFloat(n, "bias", 0))
		lambd := float64(attrFloat(n, "lambd", 0.5))
		return func(x int64) int64 {
			switch {
			case float64(x) < -lambd:
				return x + bias
			case float64(x) > lambd:
				return x - bias
			}
			return 0
		}
	}
	return nil
}

// kBiasThen is a contrib activation with an optional bias (FastGelu's
// input 1, BiasGelu's B): op(X + bias), the sum broadcast as Add does.
func kBiasThen(op string) KernelFunc {
	f := kUnary(op)
	return func(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
		if len(in) > 1 && in[1] != nil {
			x, err := need(in, 0)
			if err != nil {
				return nil, err
			}
			sum, err := applyArith(arithOps["Add"], x, in[1])
			if err != nil {
				return nil, err
			}
			in = []*Tensor{sum}
		}
		return f(c, n, in)
	}
}

func kUnary(op string) KernelFunc {
	return func(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
		x, err := need(in, 0)
		if err != nil {
			return nil, err
		}
		out := &Tensor{DType: x.DType, Shape: append([]int{}, x.Shape...)}
		switch x.kind() {
		case kF32:
			f := unaryFloats(n, op)
			out.F32 = make([]float32, len(x.F32))
			switch op {
			case "Neg":
				for i, v := range x.F32 {
					out.F32[i] = -v
				}
			case "Relu":
				for i, v := range x.F32 {
					out.F32[i] = max(v, 0)
				}
			case "Sigmoid":
				// in float32 (within 2 ulps), eight at a time: the gate of
				// every SiLU expert
				vec.SigmoidSlice(out.F32, x.F32)
			default:
				if unaryDistinctRows(x, out, f) {
					break
				}
				for i, v := range x.F32 {
					out.F32[i] = float32(f(float64(v)))
				}
			}
		case kF64:
			f := unaryFloats(n, op)
			out.F64 = make([]float64, len(x.F64))
			for i, v := range x.F64 {
				out.F64[i] = f(v)
			}
		case kI64:
			f := intUnary(n, op, x.DType)
			if f == nil {
				return nil, errf("%s is not defined for %s", op, x.DType)
			}
			out.I64 = make([]int64, len(x.I64))
			for i, v := range x.I64 {
				out.I64[i] = f(v)
			}
		default:
			return nil, errf("%s is not defined for %s", op, x.DType)
		}
		return []*Tensor{out}, nil
	}
}

// cmpOp is a comparison per storage class.
type cmpOp struct {
	f32 func(a, b float32) bool
	f64 func(a, b float64) bool
	i64 func(a, b int64) bool
	b   func(a, b bool) bool
	s   func(a, b string) bool
}

func ordered[T float32 | float64 | int64 | string](op string) func(a, b T) bool {
	switch op {
	case "Equal":
		return func(a, b T) bool { return a == b }
	case "Less":
		return func(a, b T) bool { return a < b }
	case "Greater":
		return func(a, b T) bool { return a > b }
	case "LessOrEqual":
		return func(a, b T) bool { return a <= b }
	case "GreaterOrEqual":
		return func(a, b T) bool { return a >= b }
	}
	return nil
}

func kCompare(op string) KernelFunc {
	cp := cmpOp{f32: ordered[float32](op), f64: ordered[float64](op), i64: ordered[int64](op), s: ordered[string](op)}
	if op == "Equal" {
		cp.b = func(a, b bool) bool { return a == b }
	}
	return func(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
		a, b, err := need2(in)
		if err != nil {
			return nil, err
		}
		if a.kind() != b.kind() {
			return nil, errf("operand types differ: %s and %s", a.DType, b.DType)
		}
		out := &Tensor{DType: pb.TensorProto_BOOL}
		i64 := cp.i64
		if a.DType == pb.TensorProto_UINT64 && op != "Equal" {
			u := ordered[float64](op)
			i64 = func(x, y int64) bool {
				ux, uy := uint64(x), uint64(y)
				if ux == uy {
					return u(0, 0)
				}
				if ux < uy {
					return u(0, 1)
				}
				return u(1, 0)
			}
		}
		switch a.kind() {
		case kF32:
			out.Bool, out.Shape, err = broadcast2(a.F32, a.Shape, b.F32, b.Shape, cp.f32)
		case kF64:
			out.Bool, out.Shape, err = broadcast2(a.F64, a.Shape, b.F64, b.Shape, cp.f64)
		case kI64:
			out.Bool, out.Shape, err = broadcast2(a.I64, a.Shape, b.I64, b.Shape, i64)
		case kBool:
			if cp.b == nil {
				return nil, errf("%s is not defined for bool", op)
			}
			out.Bool, out.Shape, err = broadcast2(a.Bool, a.Shape, b.Bool, b.Shape, cp.b)
		case kStr:
			out.Bool, out.Shape, err = broadcast2(a.Str, a.Shape, b.Str, b.Shape, cp.s)
		}
		return one(out, err)
	}
}

func kLogical(op string) KernelFunc {
	var f func(a, b bool) bool
	switch op {
	case "And":
		f = func(a, b bool) bool { return a && b }
	case "Or":
		f = func(a, b bool) bool { return a || b }
	case "Xor":
		f = func(a, b bool) bool { return a != b }
	}
	return func(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
		a, b, err := need2(in)
		if err != nil {
			return nil, err
		}
		if a.kind() != kBool || b.kind() != kBool {
			return nil, errf("%s needs bool inputs", op)
		}
		out := &Tensor{DType: pb.TensorProto_BOOL}
		out.Bool, out.Shape, err = broadcast2(a.Bool, a.Shape, b.Bool, b.Shape, f)
		return one(out, err)
	}
}

func kBitwise(op string) KernelFunc {
	var f func(a, b int64) int64
	switch op {
	case "BitwiseAnd":
		f = func(a, b int64) int64 { return a & b }
	case "BitwiseOr":
		f = func(a, b int64) int64 { return a | b }
	case "BitwiseXor":
		f = func(a, b int64) int64 { return a ^ b }
	}
	return func(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
		a, b, err := need2(in)
		if err != nil {
			return nil, err
		}
		return one(applyArith(arith{i64: f}, a, b))
	}
}

func kBitwiseNot(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	if x.kind() != kI64 {
		return nil, errf("BitwiseNot needs an integer type")
	}
	out := x.Clone()
	for i, v := range out.I64 {
		out.I64[i] = ^v
	}
	return []*Tensor{out}, nil
}

func kNot(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	if x.kind() != kBool {
		return nil, errf("Not needs a bool input")
	}
	out := New(pb.TensorProto_BOOL, x.Shape)
	for i, v := range x.Bool {
		out.Bool[i] = !v
	}
	return []*Tensor{out}, nil
}

func kIsNaN(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	out := New(pb.TensorProto_BOOL, x.Shape)
	if isFloat(x.DType) {
		for i := range out.Bool {
			out.Bool[i] = math.IsNaN(x.Float64At(i))
		}
	}
	return []*Tensor{out}, nil
}

func kIsInf(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	neg := attrInt(n, "detect_negative", 1) == 1
	pos := attrInt(n, "detect_positive", 1) == 1
	out := New(pb.TensorProto_BOOL, x.Shape)
	if isFloat(x.DType) {
		for i := range out.Bool {
			v := x.Float64At(i)
			out.Bool[i] = (pos && math.IsInf(v, 1)) || (neg && math.IsInf(v, -1))
		}
	}
	return []*Tensor{out}, nil
}

func kWhere(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	cond, x, err := need2(in)
	if err != nil {
		return nil, err
	}
	y, err := need(in, 2)
	if err != nil {
		return nil, err
	}
	if cond.kind() != kBool {
		return nil, errf("condition must be bool, got %s", cond.DType)
	}
	if x.kind() != y.kind() {
		return nil, errf("X and Y types differ: %s and %s", x.DType, y.DType)
	}
	shape, err := BroadcastShapes(cond.Shape, x.Shape, y.Shape)
	if err != nil {
		return nil, err
	}
	if err := c.checkAlloc(x.DType, shape); err != nil {
		return nil, err
	}
	ci := bcastIndex(cond.Shape, shape)
	xi := bcastIndex(x.Shape, shape)
	yi := bcastIndex(y.Shape, shape)
	out := New(x.DType, shape)
	at := func(idx []int, i int) int {
		if idx == nil {
			return i
		}
		return idx[i]
	}
	for i := 0; i < numel(shape); i++ {
		if cond.Bool[at(ci, i)] {
			setElem(out, i, x, at(xi, i))
		} else {
			setElem(out, i, y, at(yi, i))
		}
	}
	return []*Tensor{out}, nil
}

func kClip(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	lo, hi := math.Inf(-1), math.Inf(1)
	if c.Opset("") < 11 {
		lo = float64(attrFloat(n, "min", float32(math.Inf(-1))))
		hi = float64(attrFloat(n, "max", float32(math.Inf(1))))
	} else {
		if t := opt(in, 1); t != nil {
			if t.Len() != 1 {
				return nil, errf("min must be a scalar")
			}
			lo = t.Float64At(0)
		}
		if t := opt(in, 2); t != nil {
			if t.Len() != 1 {
				return nil, errf("max must be a scalar")
			}
			hi = t.Float64At(0)
		}
	}
	out := x.Clone()
	switch x.kind() {
	case kF32:
		l, h := float32(lo), float32(hi)
		for i, v := range out.F32 {
			if v < l {
				v = l
			}
			if v > h {
				v = h
			}
			out.F32[i] = v
		}
	case kF64:
		for i, v := range out.F64 {
			out.F64[i] = math.Min(math.Max(v, lo), hi)
		}
	case kI64:
		var l, h int64 = math.MinInt64, math.MaxInt64
		if t := opt(in, 1); t != nil && t.kind() == kI64 {
			l = t.I64[0]
		}
		if t := opt(in, 2); t != nil && t.kind() == kI64 {
			h = t.I64[0]
		}
		for i, v := range out.I64 {
			out.I64[i] = min(max(v, l), h)
		}
	default:
		return nil, errf("Clip is not defined for %s", x.DType)
	}
	return []*Tensor{out}, nil
}

// castTensor converts x to type to.
func castTensor(x *Tensor, to pb.TensorProto_DataType) (*Tensor, error) {
	if kindOf(to) == kNone {
		return nil, errf("cast to %s is not supported", to)
	}
	out := New(to, x.Shape)
	n := x.Len()
	switch kindOf(to) {
	case kF32:
		switch x.kind() {
		case kF32:
			copy(out.F32, x.F32)
		case kStr:
			for i, s := range x.Str {
				v, err := parseFloat(s)
				if err != nil {
					return nil, err
				}
				out.F32[i] = float32(v)
			}
		default:
			for i := 0; i < n; i++ {
				out.F32[i] = float32(x.Float64At(i))
			}
		}
	case kF64:
		if x.kind() == kStr {
			for i, s := range x.Str {
				v, err := parseFloat(s)
				if err != nil {
					return nil, err
				}
				out.F64[i] = v
			}
			break
		}
		for i := 0; i < n; i++ {
			out.F64[i] = x.Float64At(i)
		}
	case kI64:
		switch x.kind() {
		case kI64:
			copy(out.I64, x.I64)
		case kStr:
			for i, s := range x.Str {
				v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
				if err != nil {
					f, ferr := parseFloat(s)
					if ferr != nil {
						return nil, err
					}
					v = int64(f)
				}
				out.I64[i] = v
			}
		default:
			for i := 0; i < n; i++ {
				out.I64[i] = floatToInt(x.Float64At(i), to)
			}
		}
	case kBool:
		switch x.kind() {
		case kBool:
			copy(out.Bool, x.Bool)
		case kI64:
			for i, v := range x.I64 {
				out.Bool[i] = v != 0
			}
		case kStr:
			for i, s := range x.Str {
				v, err := parseFloat(s)
				if err != nil {
					return nil, err
				}
				out.Bool[i] = v != 0
			}
		default:
			for i := 0; i < n; i++ {
				out.Bool[i] = x.Float64At(i) != 0
			}
		}
	case kStr:
		for i := 0; i < n; i++ {
			switch x.kind() {
			case kStr:
				out.Str[i] = x.Str[i]
			case kBool:
				out.Str[i] = strconv.FormatBool(x.Bool[i])
			case kI64:
				out.Str[i] = strconv.FormatInt(x.I64[i], 10)
			case kF32:
				out.Str[i] = formatFloat(float64(x.F32[i]), 32)
			case kF64:
				out.Str[i] = formatFloat(x.F64[i], 64)
			}
		}
	}
	return out, nil
}

func parseFloat(s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
			return v, nil
		}
		return 0, errf("cannot parse %q as a number", s)
	}
	return v, nil
}

func formatFloat(v float64, bits int) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "INF"
	case math.IsInf(v, -1):
		return "-INF"
	}
	return strconv.FormatFloat(v, 'g', -1, bits)
}

// floatToInt truncates toward zero; out-of-range values saturate for 64-bit
// targets and wrap (via normalize) for narrower ones.
func floatToInt(v float64, to pb.TensorProto_DataType) int64 {
	if math.IsNaN(v) {
		return 0
	}
	v = math.Trunc(v)
	if to == pb.TensorProto_UINT64 {
		if v >= 1<<64 {
			return -1
		}
		if v <= 0 {
			return int64(v)
		}
		return int64(uint64(v))
	}
	if v >= 1<<63 {
		return math.MaxInt64
	}
	if v < -(1 << 63) {
		return math.MinInt64
	}
	return int64(v)
}

func kCast(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	if !hasAttr(n, "to") {
		return nil, errf("Cast needs attribute 'to'")
	}
	to := pb.TensorProto_DataType(attrInt(n, "to", 0))
	out, err := castTensor(x, to)
	if err != nil {
		return nil, err
	}
	if f := f8formats[to]; f != nil && attrInt(n, "saturate", 1) == 1 {
		saturate(out, f.maxFinite())
	}
	return []*Tensor{out}, nil
}

func kCastLike(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	x, like, err := need2(in)
	if err != nil {
		return nil, err
	}
	out, err := castTensor(x, like.DType)
	if err != nil {
		return nil, err
	}
	if f := f8formats[like.DType]; f != nil && attrInt(n, "saturate", 1) == 1 {
		saturate(out, f.maxFinite())
	}
	return []*Tensor{out}, nil
}

// saturate clamps a float tensor's values (infinities included) to
// [-mx, mx], leaving NaN alone: Cast to float8 with saturate=1.
func saturate(t *Tensor, mx float64) {
	m := float32(mx)
	for i, v := range t.F32 {
		if v > m {
			t.F32[i] = m
		} else if v < -m {
			t.F32[i] = -m
		}
	}
}

func init() {
	for op := range arithOps {
		if op == "Max" || op == "Min" || op == "Sum" {
			continue
		}
		builtin("", kArith(op), op)
	}
	for _, op := range []string{"Max", "Min", "Sum", "Mean"} {
		builtin("", kVariadic(op), op)
	}
	builtin("", kPow, "Pow")
	builtin("", kMod, "Mod")
	builtin("", kPRelu, "PRelu")
	builtin("", kBitShift, "BitShift")
	for _, op := range []string{"Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Tanh", "Relu", "Sigmoid",
		"Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh",
		"Acosh", "Atanh", "Softplus", "Softsign", "Mish", "Elu", "Celu", "Selu", "LeakyRelu", "ThresholdedRelu",
		"HardSigmoid", "HardSwish", "Gelu", "Shrink"} {
		builtin("", kUnary(op), op)
	}
	builtin("com.microsoft", kUnary("Gelu"), "Gelu")
	builtin("com.microsoft", kUnary("QuickGelu"), "QuickGelu")
	builtin("com.microsoft", kBiasThen("FastGelu"), "FastGelu")
	builtin("com.microsoft", kBiasThen("Gelu"), "BiasGelu")
	for _, op := range []string{"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"} {
		builtin("", kCompare(op), op)
	}
	for _, op := range []string{"And", "Or", "Xor"} {
		builtin("", kLogical(op), op)
	}
	for _, op := range []string{"BitwiseAnd", "BitwiseOr", "BitwiseXor"} {
		builtin("", kBitwise(op), op)
	}
	builtin("", kBitwiseNot, "BitwiseNot")
	builtin("", kNot, "Not")
	builtin("", kIsNaN, "IsNaN")
	builtin("", kIsInf, "IsInf")
	builtin("", kWhere, "Where")
	builtin("", kClip, "Clip")
	builtin("", kCast, "Cast")
	builtin("", kCastLike, "CastLike")
}

// unaryDistinctRows applies f to a large float tensor row by row (a row is
// its last dim), computing each distinct row (bit for bit) once: equal
// inputs give equal outputs, and a tensor of a few tokens repeated (the
// numerical check's inputs over a static token count) then costs its
// distinct rows. It returns false, having done nothing, when x is small or
// has few repeated rows.
func unaryDistinctRows(x, out *Tensor, f func(float64) float64) bool {
	if len(x.F32) < 1<<16 || len(x.Shape) < 2 {
		return false
	}
	H := x.Shape[len(x.Shape)-1]
	if H < 8 {
		return false
	}
	rows := len(x.F32) / H
	cls, d := slabClasses(rows, H, func(i int) []float32 { return x.F32[i*H : (i+1)*H] })
	if d > rows/2 {
		return false
	}
	done := make([]int, d)
	for i := range done {
		done[i] = -1
	}
	for r, k := range cls {
		dst := out.F32[r*H : (r+1)*H]
		if j := done[k]; j >= 0 {
			copy(dst, out.F32[j*H:(j+1)*H])
			continue
		}
		for i, v := range x.F32[r*H : (r+1)*H] {
			dst[i] = float32(f(float64(v)))
		}
		done[k] = r
	}
	return true
}
