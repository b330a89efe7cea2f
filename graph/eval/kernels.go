package eval

// Kernels is a set of custom kernels, by (domain, op type), that a Run uses
// when Options.Kernels names it. Passing the set to each Run makes the
// kernels a program evaluates with explicit: which packages it links does
// not change its numbers. Packages holding kernels offer a function adding
// theirs (for example moe.AddKernels).
type Kernels struct {
	m       map[opKey]KernelFunc
	streams map[opKey][]int
}

// NewKernels returns an empty set.
func NewKernels() *Kernels { return &Kernels{m: map[opKey]KernelFunc{}} }

// Add installs fn as the kernel of (domain, opType), replacing any
// previous one ("" and "ai.onnx" both name the default domain), and
// returns k. It is not safe to call while a Run uses k.
func (k *Kernels) Add(domain, opType string, fn KernelFunc) *Kernels {
	k.m[opKey{normDomain(domain), opType}] = fn
	return k
}

// Streams declares that the kernel of (domain, opType) reads the inputs at
// the given positions through Tensor.ReadFloat32 when they are streamed
// (Tensor.Streamed): a large float initializer in a side file is then
// handed to it unread, and the kernel reads the ranges it needs, so that
// the run never holds the weight whole. It returns k.
func (k *Kernels) Streams(domain, opType string, inputs ...int) *Kernels {
	if k.streams == nil {
		k.streams = map[opKey][]int{}
	}
	k.streams[opKey{normDomain(domain), opType}] = append([]int{}, inputs...)
	return k
}

// Has reports whether k holds a kernel for (domain, opType).
func (k *Kernels) Has(domain, opType string) bool {
	if k == nil {
		return false
	}
	_, ok := k.m[opKey{normDomain(domain), opType}]
	return ok
}

// Register installs every kernel of k in the process-wide registry (see
// Register), for code that runs models without passing Options.Kernels.
func (k *Kernels) Register() {
	for key, fn := range k.m {
		Register(key.domain, key.op, fn)
	}
}

// lookup finds the kernel of a node: a kernel of the run's set, then a
// process-wide registered one, then a built-in. custom is true for the
// first two (they take precedence over model-local functions).
func (r *runner) lookup(domain, op string) (fn KernelFunc, ok, custom bool) {
	if ks := r.opt.Kernels; ks != nil {
		if fn, ok := ks.m[opKey{normDomain(domain), op}]; ok {
			return fn, true, true
		}
	}
	return lookupKernel(domain, op)
}
