package passes

import "github.com/mokopt/mokopt/graph"

// rankInfer returns the rank of v: the declared one, or one worked out from
// its producers (shape ops with constant or computed shapes, elementwise
// ops, scatters, matmuls), or -1 when it cannot be told. Chained blocks
// leave the values between them undeclared; their ranks still decide which
// value a fused node reads (see inputLike).
func (c *ctx) rankInfer(v string) int {
	return c.rankMemo(v, map[string]int{}, 0)
}

// rankMemo is rankInfer with a memo of the values worked out (and a depth
// bound, so that a long chain of elementwise ops costs a bounded walk).
func (c *ctx) rankMemo(v string, memo map[string]int, depth int) int {
	if v == "" || depth > 64 {
		return -1
	}
	if r := c.rankOf(v); r >= 0 {
		return r
	}
	if r, ok := memo[v]; ok {
		return r
	}
	memo[v] = -1
	r := c.rankFromProducer(v, memo, depth)
	memo[v] = r
	return r
}

func (c *ctx) rankFromProducer(v string, memo map[string]int, depth int) int {
	if t := c.g.Initializer(v); t != nil {
		return len(t.GetDims())
	}
	p := c.g.Producer(v)
	if p == nil || len(p.Input) == 0 && p.GetOpType() != "Constant" {
		return -1
	}
	rank := func(i int) int {
		if i >= len(p.Input) {
			return -1
		}
		return c.rankMemo(p.Input[i], memo, depth+1)
	}
	switch op := p.GetOpType(); op {
	case "Constant":
		if t := graph.AttrTensor(p, "value"); t != nil {
			return len(t.GetDims())
		}
	case "Reshape":
		if len(p.Input) > 1 {
			return c.shapeLen(p.Input[1], memo, depth+1)
		}
	case "ConstantOfShape":
		return c.shapeLen(p.Input[0], memo, depth+1)
	case "Expand":
		a, b := rank(0), -1
		if len(p.Input) > 1 {
			b = c.shapeLen(p.Input[1], memo, depth+1)
		}
		if a < 0 || b < 0 {
			return -1
		}
		return max(a, b)
	case "Flatten":
		return 2
	case "Unsqueeze", "Squeeze":
		axes := graph.AttrInts(p, "axes")
		if len(p.Input) > 1 && p.Input[1] != "" {
			axes = c.constInts(p.Input[1])
			if axes == nil {
				return -1
			}
		}
		r := rank(0)
		if r < 0 || op == "Squeeze" && len(axes) == 0 {
			return -1
		}
		if op == "Unsqueeze" {
			return r + len(axes)
		}
		return r - len(axes)
	case "Cast", "Identity", "Transpose", "Relu", "Sigmoid", "Softmax", "Neg", "Exp", "Log", "Sqrt", "Tanh", "Erf", "Abs", "Clip",
		"ScatterND", "ScatterElements", "CastLike", "LayerNormalization", "Gelu":
		return rank(0)
	case "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2":
		r := rank(0)
		if r < 0 || graph.AttrInt(p, "keepdims", 1) == 1 {
			return r
		}
		axes := graph.AttrInts(p, "axes")
		if len(p.Input) > 1 && p.Input[1] != "" {
			if axes = c.constInts(p.Input[1]); axes == nil {
				return -1
			}
		}
		if len(axes) == 0 {
			if graph.AttrInt(p, "noop_with_empty_axes", 0) == 1 {
				return r
			}
			return 0
		}
		return r - len(axes)
	case "Reciprocal", "Softplus", "SimplifiedLayerNormalization", "RMSNormalization", "Sin", "Cos", "HardSigmoid", "LeakyRelu", "Elu":
		return rank(0)
	case "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "Sum":
		r := -1
		for i := range p.Input {
			ri := rank(i)
			if ri < 0 {
				return -1
			}
			r = max(r, ri)
		}
		return r
	case "MatMul":
		a, b := rank(0), rank(1)
		if a < 2 || b < 2 {
			return -1
		}
		return max(a, b)
	}
	return -1
}

// shapeLen returns the number of elements of a 1-D shape value: a
// constant's, a Shape's (the rank of what it measures), a Concat's (the sum
// of its parts'), or -1.
func (c *ctx) shapeLen(v string, memo map[string]int, depth int) int {
	if depth > 64 {
		return -1
	}
	if t := c.constTensor(v); t != nil {
		d := t.GetDims()
		switch len(d) {
		case 0:
			return 1
		case 1:
			return int(d[0])
		}
		return -1
	}
	p := c.g.Producer(v)
	if p == nil || len(p.Input) == 0 {
		return -1
	}
	switch p.GetOpType() {
	case "Shape":
		if graph.AttrInt(p, "start", 0) != 0 || graph.AttrInt(p, "end", 0) != 0 {
			return -1
		}
		return c.rankMemo(p.Input[0], memo, depth+1)
	case "Concat":
		n := 0
		for _, in := range p.Input {
			k := c.shapeLen(in, memo, depth+1)
			if k < 0 {
				return -1
			}
			n += k
		}
		return n
	case "Unsqueeze":
		if c.rankMemo(p.Input[0], memo, depth+1) == 0 {
			return 1
		}
	case "Cast", "Identity":
		return c.shapeLen(p.Input[0], memo, depth+1)
	}
	return -1
}
