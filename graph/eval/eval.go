package eval

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// KernelFunc computes one node. inputs holds one tensor per node input, nil
// where an optional input is omitted (empty name). It returns one tensor per
// node output; trailing outputs may be left off and entries may be nil for
// optional outputs the node does not produce.
type KernelFunc func(ctx *OpContext, node *pb.NodeProto, inputs []*Tensor) ([]*Tensor, error)

// Options controls a Run.
type Options struct {
	// Capture selects intermediate values (by name) to return alongside the
	// graph outputs. Values inside model-local function bodies are not
	// visible. nil captures none.
	Capture func(name string) bool
	// KeepAll returns every value computed in the main graph (and the feeds
	// and initializers read), like a Capture that accepts all names.
	KeepAll bool
	// MemLimit caps, in bytes, the data of the values alive at once (feeds,
	// initializers read, intermediates and outputs); exceeding it ends the
	// run with an error wrapping ErrMemLimit. 0 means no limit.
	MemLimit int64
	// PreferFunctions evaluates a model-local function's body even when a
	// custom kernel is registered for the same (domain, op_type), so the two
	// can be checked against each other.
	PreferFunctions bool
	// Kernels are the custom kernels of this run (NewKernels); they take
	// precedence over kernels registered process-wide, which no package of
	// this module registers on import.
	Kernels *Kernels
	// Threads bounds the goroutines a kernel may use (MatMul); 0 means
	// GOMAXPROCS.
	Threads int
	// MaxNodeRuns bounds the node evaluations of the run, counting those
	// inside function bodies and every Loop, Scan and If iteration;
	// exceeding it ends the run with an error wrapping ErrWorkLimit. 0
	// means DefaultMaxNodeRuns; negative means no bound.
	MaxNodeRuns int64
	// OnCapture, when set, is called on the run's goroutine with each
	// value of the main graph that Capture selects, as soon as a node has
	// computed it (feeds, initializers and values a kernel left as a lazy
	// view are not reported), so that a caller can start working on it
	// while the run goes on. The tensor is the one the run returns;
	// nothing may change it.
	OnCapture func(name string, t *Tensor)
	// Replace, when set, is called on the run's goroutine with each value
	// of the main graph that Capture selects, as a node computed it and
	// before the run holds it: a non-nil result (of t's dtype and shape)
	// is what the run holds, passes on to the nodes that read the value,
	// reports to OnCapture and returns. A caller restarts the run from
	// fresh values this way (the numerical check, where a graph's
	// activations vanished). Lazy views are not offered.
	Replace func(name string, t *Tensor) *Tensor
	// OnSubgraph, when set, is called on the run's goroutine each time a
	// subgraph (an If branch, a Loop or Scan body) is about to run, and
	// once for each branch an If does not take, with the values the
	// subgraph reads from outside: its formal inputs and the values of
	// enclosing scopes it uses that are not initializers, by name. A
	// caller binds a subgraph's free values this way (the numerical check
	// of a block inside one). The tensors are the run's; nothing may
	// change them.
	OnSubgraph func(g *pb.GraphProto, vals map[string]*Tensor)
}

// DefaultMaxNodeRuns is the node evaluations a run may make unless
// Options.MaxNodeRuns says otherwise: twenty runs of a 100,000-node graph,
// and far below what a Loop with an absurd trip count or functions calling
// functions exponentially often would ask for. Each function call and
// each subgraph run (a Loop iteration, an If branch) also counts as
// subgraphRunCost evaluations, what setting it up costs.
const DefaultMaxNodeRuns = 1 << 21

// subgraphRunCost is what one function call or subgraph run counts toward
// Options.MaxNodeRuns beyond its nodes.
const subgraphRunCost = 16

// ErrWorkLimit is wrapped by the error a Run returns when it evaluates more
// nodes than Options.MaxNodeRuns allows.
var ErrWorkLimit = errors.New("work limit exceeded")

// ErrMemLimit is wrapped by the error a Run returns when the live values
// exceed Options.MemLimit.
var ErrMemLimit = errors.New("memory limit exceeded")

// UnsupportedOpError reports a node whose operator has no kernel and no
// model-local function.
type UnsupportedOpError struct {
	Domain, OpType, Node string
}

// Error formats as "unsupported op DOMAIN::OP (node NAME)".
func (e *UnsupportedOpError) Error() string {
	return fmt.Sprintf("unsupported op %s::%s (node %s)", domainName(e.Domain), e.OpType, e.Node)
}

func domainName(d string) string {
	if d == "" {
		return "ai.onnx"
	}
	return d
}

func normDomain(d string) string {
	if d == "ai.onnx" {
		return ""
	}
	return d
}

type opKey struct{ domain, op string }

// funcKey names a model-local function: domain, name and (IR 10) overload.
type funcKey struct{ domain, op, overload string }

var (
	regMu    sync.RWMutex
	custom   = map[opKey]KernelFunc{}
	builtins = map[opKey]KernelFunc{}
)

// Register installs fn as the kernel for (domain, opType), replacing any
// previous custom kernel; "" and "ai.onnx" both name the default domain. A
// custom kernel takes precedence over built-in kernels and over model-local
// functions of the same name (see Options.PreferFunctions). fn nil removes
// the custom kernel. Register is safe for concurrent use.
func Register(domain, opType string, fn KernelFunc) {
	regMu.Lock()
	defer regMu.Unlock()
	k := opKey{normDomain(domain), opType}
	if fn == nil {
		delete(custom, k)
		return
	}
	custom[k] = fn
}

// builtin registers a built-in kernel (package init only).
func builtin(domain string, fn KernelFunc, ops ...string) {
	for _, op := range ops {
		builtins[opKey{domain, op}] = fn
	}
}

func lookupKernel(domain, op string) (KernelFunc, bool, bool) {
	regMu.RLock()
	defer regMu.RUnlock()
	k := opKey{normDomain(domain), op}
	if fn, ok := custom[k]; ok {
		return fn, true, true
	}
	fn, ok := builtins[k]
	return fn, ok, false
}

// Supported reports whether (domain, opType) has a built-in or registered kernel.
func Supported(domain, opType string) bool {
	_, ok, _ := lookupKernel(domain, opType)
	return ok
}

// BuiltinOps lists the built-in kernels as "op" (default domain) or
// "domain::op", sorted.
func BuiltinOps() []string {
	var out []string
	for k := range builtins {
		if k.domain == "" {
			out = append(out, k.op)
		} else {
			out = append(out, k.domain+"::"+k.op)
		}
	}
	sort.Strings(out)
	return out
}

// UnsupportedOps lists the distinct "domain::op" keys of nodes in m (main
// graph, subgraphs and function bodies) that have neither a kernel nor a
// model-local function, sorted.
func UnsupportedOps(m *graph.Model) []string {
	funcs := map[opKey]bool{}
	for _, f := range m.Proto.GetFunctions() {
		funcs[opKey{normDomain(f.GetDomain()), f.GetName()}] = true
	}
	seen := map[string]bool{}
	var walk func(nodes []*pb.NodeProto)
	walk = func(nodes []*pb.NodeProto) {
		for _, n := range nodes {
			k := opKey{normDomain(n.GetDomain()), n.GetOpType()}
			if !funcs[k] && !Supported(k.domain, k.op) {
				seen[domainName(k.domain)+"::"+k.op] = true
			}
			for _, a := range n.Attribute {
				if a.G != nil {
					walk(a.G.Node)
				}
				for _, g := range a.Graphs {
					walk(g.Node)
				}
			}
		}
	}
	walk(m.Proto.GetGraph().GetNode())
	for _, f := range m.Proto.GetFunctions() {
		walk(f.Node)
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// OpContext is what a kernel sees of the run: the context, the opset
// versions in force for the node, and the node itself.
type OpContext struct {
	// Context is the run's context.
	Context context.Context
	// Node is the node being evaluated (attribute references already
	// resolved inside function bodies).
	Node   *pb.NodeProto
	opsets map[string]int64
	r      *runner
	sc     *scope
}

// Opset returns the version of domain ("" for the default domain) that the
// node's graph or function imports, or 0.
func (c *OpContext) Opset(domain string) int64 { return c.opsets[normDomain(domain)] }

// Threads returns how many goroutines a kernel may use.
func (c *OpContext) Threads() int { return c.r.threads }

// checkAlloc errors if allocating a tensor of the given type and shape would
// exceed the run's memory limit or the size limits of the evaluator.
func (c *OpContext) checkAlloc(dt pb.TensorProto_DataType, shape []int) error {
	n, err := checkedNumel(shape)
	if err != nil {
		return err
	}
	if c == nil || c.r == nil || c.r.opt.MemLimit <= 0 {
		return nil
	}
	sz := int64(n) * 8
	if kindOf(dt) == kF32 {
		sz = int64(n) * 4
	}
	if c.r.live+sz > c.r.opt.MemLimit {
		return fmt.Errorf("%w: output %s%v needs %d bytes with %d live (limit %d)", ErrMemLimit, dt, shape, sz, c.r.live, c.r.opt.MemLimit)
	}
	return nil
}

// Alloc returns a zero tensor of type dt and the given shape, or an error
// wrapping ErrMemLimit when it would push the run past Options.MemLimit
// (custom kernels should allocate their outputs through it).
func (c *OpContext) Alloc(dt pb.TensorProto_DataType, shape []int) (*Tensor, error) {
	if kindOf(dt) == kNone {
		return nil, fmt.Errorf("data type %s is not supported", dt)
	}
	return c.alloc(dt, shape)
}

// alloc returns a zero tensor after checkAlloc.
func (c *OpContext) alloc(dt pb.TensorProto_DataType, shape []int) (*Tensor, error) {
	if err := c.checkAlloc(dt, shape); err != nil {
		return nil, err
	}
	return New(dt, shape), nil
}

// runner holds the state of one Run.
type runner struct {
	ctx     context.Context
	m       *graph.Model
	opt     Options
	threads int
	funcs   map[funcKey]*pb.FunctionProto
	live    int64
	depth   int
	runs    int64 // node evaluations so far
	maxRuns int64
	free    map[*pb.GraphProto][]string  // freeVars memo
	orders  map[orderKey][]*pb.NodeProto // topoOrder memo
}

// scope is one graph's (or function body's) value table; lookups fall back
// to the parent for subgraphs.
type scope struct {
	parent *scope
	vals   map[string]*Tensor
	inits  map[string]*pb.TensorProto // lazily converted initializers
}

// bind stores t as name, counting it toward the memory limit.
func (s *scope) bind(r *runner, name string, t *Tensor) {
	if old, ok := s.vals[name]; ok {
		r.live -= old.ByteSize()
	}
	s.vals[name] = t
	r.live += t.ByteSize()
}

// drop frees name.
func (s *scope) drop(r *runner, name string) {
	if t, ok := s.vals[name]; ok {
		r.live -= t.ByteSize()
		delete(s.vals, name)
	}
}

// release uncounts every value the scope still holds (when it ends).
func (s *scope) release(r *runner) {
	for _, t := range s.vals {
		r.live -= t.ByteSize()
	}
}

func (s *scope) lookup(r *runner, name string) (*Tensor, error) {
	for sc := s; sc != nil; sc = sc.parent {
		if t, ok := sc.vals[name]; ok {
			return t, nil
		}
		if p, ok := sc.inits[name]; ok {
			if err := r.checkInitializer(p); err != nil {
				return nil, err
			}
			t, err := initializerTensor(p, r.m.TensorBytes)
			if err != nil {
				return nil, err
			}
			sc.bind(r, name, t)
			return t, nil
		}
	}
	return nil, fmt.Errorf("value %q is not defined", name)
}

// Run evaluates m's main graph on feeds and returns the graph outputs by
// name, plus the values Options.Capture selects. Graph inputs missing from
// feeds take their initializer's value. Nodes run in topological order and
// each intermediate is freed after its last use. The context is checked
// between nodes.
func Run(ctx context.Context, m *graph.Model, feeds map[string]*Tensor, opt Options) (map[string]*Tensor, error) {
	if m == nil || m.Proto.GetGraph() == nil {
		return nil, &graph.InputError{Msg: "no model graph"}
	}
	if ctx == nil {
		ctx = context.Background()
	}
	r := &runner{ctx: ctx, m: m, opt: opt, threads: opt.Threads, funcs: map[funcKey]*pb.FunctionProto{},
		free: map[*pb.GraphProto][]string{}, orders: map[orderKey][]*pb.NodeProto{}}
	if r.threads <= 0 {
		r.threads = defaultThreads()
	}
	switch r.maxRuns = opt.MaxNodeRuns; {
	case r.maxRuns == 0:
		r.maxRuns = DefaultMaxNodeRuns
	case r.maxRuns < 0:
		r.maxRuns = math.MaxInt64
	}
	for _, f := range m.Proto.GetFunctions() {
		r.funcs[funcKey{normDomain(f.GetDomain()), f.GetName(), f.GetOverload()}] = f
	}
	g := m.Proto.GetGraph()
	opsets := opsetMap(m.Proto.GetOpsetImport())
	sc := &scope{vals: map[string]*Tensor{}, inits: make(map[string]*pb.TensorProto, len(g.GetInitializer()))}
	for _, t := range g.GetInitializer() {
		sc.inits[t.GetName()] = t
	}
	if len(g.GetSparseInitializer()) > 0 {
		return nil, &graph.InputError{File: m.Name(), Msg: "sparse initializers are not supported by the evaluator"}
	}
	declared := map[string]*pb.ValueInfoProto{}
	for _, v := range g.GetInput() {
		declared[v.GetName()] = v
	}
	names := make([]string, 0, len(feeds))
	for n := range feeds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		t := feeds[name]
		v, ok := declared[name]
		if !ok {
			return nil, &graph.InputError{File: m.Name(), Msg: fmt.Sprintf("feed %q is not a graph input", name)}
		}
		if t == nil {
			continue
		}
		if err := checkFeed(v, t); err != nil {
			return nil, &graph.InputError{File: m.Name(), Object: fmt.Sprintf("input %q", name), Msg: err.Error()}
		}
		if isNarrow(t.DType) {
			t = t.Clone()
			t.normalize()
		}
		sc.bind(r, name, t)
	}
	for _, v := range g.GetInput() {
		if _, ok := sc.vals[v.GetName()]; ok {
			continue
		}
		if _, ok := sc.inits[v.GetName()]; !ok {
			return nil, &graph.InputError{File: m.Name(), Msg: fmt.Sprintf("graph input %q is not fed and has no initializer", v.GetName())}
		}
	}
	var outNames []string
	for _, v := range g.GetOutput() {
		outNames = append(outNames, v.GetName())
	}
	keep := func(name string) bool {
		return opt.KeepAll || (opt.Capture != nil && opt.Capture(name))
	}
	res, err := r.runNodes(sc, g.GetNode(), opsets, outNames, keep)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*Tensor, len(outNames))
	for i, n := range outNames {
		out[n] = res[i]
	}
	if opt.KeepAll || opt.Capture != nil {
		for n, t := range sc.vals {
			if keep(n) {
				if out[n], err = r.materialize(t, nil); err != nil {
					return nil, err
				}
			}
		}
	}
	return out, nil
}

// checkFeed checks a fed tensor against the declared input type.
func checkFeed(v *pb.ValueInfoProto, t *Tensor) error {
	tt := v.GetType().GetTensorType()
	if tt == nil {
		return nil
	}
	if want := pb.TensorProto_DataType(tt.GetElemType()); want != pb.TensorProto_UNDEFINED && want != t.DType {
		return fmt.Errorf("fed %s, model declares %s", t.DType, want)
	}
	if t.Len() != numel(t.Shape) {
		return fmt.Errorf("tensor holds %d elements but shape %v needs %d", t.Len(), t.Shape, numel(t.Shape))
	}
	if tt.GetShape() == nil {
		return nil
	}
	dims := tt.GetShape().GetDim()
	if len(dims) != len(t.Shape) {
		return fmt.Errorf("fed shape %v, model declares rank %d", t.Shape, len(dims))
	}
	for i, d := range dims {
		if _, ok := d.GetValue().(*pb.TensorShapeProto_Dimension_DimValue); ok && int(d.GetDimValue()) != t.Shape[i] {
			return fmt.Errorf("fed shape %v, model declares dim %d = %d", t.Shape, i, d.GetDimValue())
		}
	}
	return nil
}

func opsetMap(imps []*pb.OperatorSetIdProto) map[string]int64 {
	m := map[string]int64{}
	for _, o := range imps {
		m[normDomain(o.GetDomain())] = o.GetVersion()
	}
	return m
}

// runNodes evaluates nodes in sc (sorted topologically) and returns the
// values named outs. Values kept by keep, and outs, are not freed.
func (r *runner) runNodes(sc *scope, nodes []*pb.NodeProto, opsets map[string]int64, outs []string, keep func(string) bool) ([]*Tensor, error) {
	if sc.parent != nil || r.depth > 0 {
		r.runs += subgraphRunCost
	}
	order, err := r.topoOrder(nodes)
	if err != nil {
		return nil, &graph.InputError{File: r.m.Name(), Msg: err.Error()}
	}
	// last use of every value, by position in order.
	edges := 0
	for _, n := range order {
		edges += len(n.Input)
	}
	last := make(map[string]int, edges)
	for i, n := range order {
		for _, in := range r.inputsOf(n) {
			if in != "" {
				last[in] = i
			}
		}
	}
	pinned := map[string]bool{}
	for _, o := range outs {
		pinned[o] = true
	}
	inputs := make([]*Tensor, 0, 8)
	for i, n := range order {
		if err := r.ctx.Err(); err != nil {
			return nil, err
		}
		if r.runs++; r.runs > r.maxRuns {
			return nil, fmt.Errorf("%w: more than %d node evaluations (at node %s (%s)): a Loop with a huge trip count, or functions that call functions many times over", ErrWorkLimit, r.maxRuns, graph.NodeLabel(n), n.GetOpType())
		}
		inputs = inputs[:0]
		for pos, in := range n.Input {
			if in == "" {
				inputs = append(inputs, nil)
				continue
			}
			t, err := r.input(sc, n, pos, in)
			if errors.Is(err, ErrMemLimit) {
				return nil, fmt.Errorf("%s: %w", nodeObj(n), err)
			}
			if err != nil {
				return nil, &graph.InputError{File: r.m.Name(), Object: nodeObj(n), Msg: err.Error()}
			}
			if t.lazy != nil && !r.lazyAware(n) {
				if t, err = r.materialize(t, n); err != nil {
					return nil, err
				}
			}
			inputs = append(inputs, t)
		}
		res, err := r.runNode(sc, n, opsets, inputs)
		if err != nil {
			return nil, err
		}
		for j, o := range n.Output {
			if o == "" || j >= len(res) || res[j] == nil {
				continue
			}
			t := res[j]
			if r.opt.Replace != nil && t.lazy == nil && sc.parent == nil && r.depth == 0 && keep(o) {
				if u := r.opt.Replace(o, t); u != nil {
					t = u
				}
			}
			if isNarrow(t.DType) {
				t.normalize()
			}
			sc.bind(r, o, t)
			if r.opt.OnCapture != nil && t.lazy == nil && sc.parent == nil && r.depth == 0 && keep(o) {
				r.opt.OnCapture(o, t)
			}
		}
		if r.opt.MemLimit > 0 && r.live > r.opt.MemLimit {
			return nil, fmt.Errorf("%w: %d bytes live after node %s (%s), limit %d", ErrMemLimit, r.live, graph.NodeLabel(n), n.GetOpType(), r.opt.MemLimit)
		}
		// free values whose last use was this node.
		for _, in := range r.inputsOf(n) {
			if in == "" || last[in] != i || pinned[in] || keep(in) {
				continue
			}
			sc.drop(r, in)
		}
		// outputs nobody reads are dropped at once.
		for _, o := range n.Output {
			if _, used := last[o]; o != "" && !used && !pinned[o] && !keep(o) {
				sc.drop(r, o)
			}
		}
	}
	res := make([]*Tensor, len(outs))
	for i, o := range outs {
		if o == "" {
			continue
		}
		t, err := sc.lookup(r, o)
		if err != nil {
			return nil, &graph.InputError{File: r.m.Name(), Msg: fmt.Sprintf("output %q: %v", o, err)}
		}
		if res[i], err = r.materialize(t, nil); err != nil {
			return nil, err
		}
	}
	return res, nil
}

func nodeObj(n *pb.NodeProto) string {
	return fmt.Sprintf("node %s (%s)", graph.NodeLabel(n), n.GetOpType())
}

// runNode dispatches one node: custom kernel, model-local function, built-in.
func (r *runner) runNode(sc *scope, n *pb.NodeProto, opsets map[string]int64, inputs []*Tensor) ([]*Tensor, error) {
	dom := normDomain(n.GetDomain())
	fn, ok, isCustom := r.lookup(dom, n.GetOpType())
	f := r.funcs[funcKey{dom, n.GetOpType(), n.GetOverload()}]
	if f != nil && (!isCustom || r.opt.PreferFunctions) {
		return r.callFunction(f, n, opsets, inputs)
	}
	if !ok {
		return nil, &UnsupportedOpError{Domain: dom, OpType: n.GetOpType(), Node: graph.NodeLabel(n)}
	}
	c := &OpContext{Context: r.ctx, Node: n, opsets: opsets, r: r, sc: sc}
	out, err := callKernel(fn, c, n, inputs)
	if err != nil {
		var u *UnsupportedOpError
		if errors.As(err, &u) || errors.Is(err, ErrMemLimit) || errors.Is(err, ErrWorkLimit) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		var ie *graph.InputError
		if errors.As(err, &ie) && strings.HasPrefix(ie.Object, "node ") {
			return nil, err
		}
		return nil, &graph.InputError{File: r.m.Name(), Object: nodeObj(n), Msg: "evaluation failed", Err: err}
	}
	if len(out) > len(n.Output) {
		out = out[:len(n.Output)]
	}
	return out, nil
}

// callKernel runs fn, turning a panic (a kernel bug, or an allocation Go
// refuses) into an error.
func callKernel(fn KernelFunc, c *OpContext, n *pb.NodeProto, inputs []*Tensor) (out []*Tensor, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = nil, fmt.Errorf("kernel panicked: %v", p)
		}
	}()
	return fn(c, n, inputs)
}

// maxFunctionDepth bounds nested function calls (guards against recursion).
const maxFunctionDepth = 64

// callFunction inlines a model-local function: formal inputs, outputs and
// attributes are bound to the call's, and the body runs in a fresh scope.
func (r *runner) callFunction(f *pb.FunctionProto, call *pb.NodeProto, outer map[string]int64, inputs []*Tensor) ([]*Tensor, error) {
	if r.depth >= maxFunctionDepth {
		return nil, &graph.InputError{File: r.m.Name(), Object: nodeObj(call), Msg: fmt.Sprintf("function calls nest deeper than %d (recursive function?)", maxFunctionDepth)}
	}
	r.depth++
	defer func() { r.depth-- }()
	sc := &scope{vals: map[string]*Tensor{}}
	for i, name := range f.GetInput() {
		if i < len(inputs) && inputs[i] != nil && name != "" {
			sc.bind(r, name, inputs[i])
		}
	}
	defer sc.release(r)
	// attribute bindings: the call's attributes, else the function's defaults.
	attrs := map[string]*pb.AttributeProto{}
	for _, a := range f.GetAttributeProto() {
		attrs[a.GetName()] = a
	}
	for _, a := range call.Attribute {
		attrs[a.GetName()] = a
	}
	body := make([]*pb.NodeProto, len(f.Node))
	for i, n := range f.Node {
		body[i] = bindAttrs(n, attrs)
	}
	opsets := opsetMap(f.GetOpsetImport())
	for d, v := range outer {
		if _, ok := opsets[d]; !ok {
			opsets[d] = v
		}
	}
	res, err := r.runNodes(sc, body, opsets, f.GetOutput(), func(string) bool { return false })
	if err != nil {
		return nil, fmt.Errorf("in function %s::%s called by node %s: %w", domainName(f.GetDomain()), f.GetName(), graph.NodeLabel(call), err)
	}
	return res, nil
}

// bindAttrs returns n with attributes that reference the caller's
// (ref_attr_name) replaced by the bound value, or dropped when unbound.
func bindAttrs(n *pb.NodeProto, attrs map[string]*pb.AttributeProto) *pb.NodeProto {
	hasRef := false
	for _, a := range n.Attribute {
		if a.GetRefAttrName() != "" {
			hasRef = true
		}
	}
	if !hasRef {
		return n
	}
	c := &pb.NodeProto{Input: n.Input, Output: n.Output, Name: n.Name, OpType: n.OpType, Domain: n.Domain, Overload: n.Overload}
	for _, a := range n.Attribute {
		ref := a.GetRefAttrName()
		if ref == "" {
			c.Attribute = append(c.Attribute, a)
			continue
		}
		b, ok := attrs[ref]
		if !ok {
			continue
		}
		nb := &pb.AttributeProto{
			Name: a.Name, Type: b.Type, F: b.F, I: b.I, S: b.S, T: b.T, G: b.G, SparseTensor: b.SparseTensor, Tp: b.Tp,
			Floats: b.Floats, Ints: b.Ints, Strings: b.Strings, Tensors: b.Tensors, Graphs: b.Graphs, SparseTensors: b.SparseTensors, TypeProtos: b.TypeProtos,
		}
		c.Attribute = append(c.Attribute, nb)
	}
	return c
}

// runSubgraph evaluates a subgraph attribute (If/Loop/Scan body) with the
// given formal input values, seeing the enclosing scope's values.
func (c *OpContext) runSubgraph(g *pb.GraphProto, inputs []*Tensor) ([]*Tensor, error) {
	sc := &scope{parent: c.sc, vals: map[string]*Tensor{}, inits: map[string]*pb.TensorProto{}}
	for _, t := range g.GetInitializer() {
		sc.inits[t.GetName()] = t
	}
	for i, v := range g.GetInput() {
		if i < len(inputs) && inputs[i] != nil {
			sc.bind(c.r, v.GetName(), inputs[i])
		}
	}
	defer sc.release(c.r)
	if err := c.reportSubgraph(g, sc); err != nil {
		return nil, err
	}
	var outs []string
	for _, v := range g.GetOutput() {
		outs = append(outs, v.GetName())
	}
	return c.r.runNodes(sc, g.GetNode(), c.opsets, outs, func(string) bool { return false })
}

// reportSubgraph calls Options.OnSubgraph, when set, with g's formal
// inputs (bound in sc) and the values of enclosing scopes g reads that are
// not initializers.
func (c *OpContext) reportSubgraph(g *pb.GraphProto, sc *scope) error {
	if c.r == nil || c.r.opt.OnSubgraph == nil {
		return nil
	}
	vals := map[string]*Tensor{}
	for _, v := range g.GetInput() {
		if t, ok := sc.vals[v.GetName()]; ok {
			vals[v.GetName()] = t
		}
	}
	for _, name := range c.r.freeVars(g) {
		if sc.outerInit(name) {
			continue
		}
		t, err := sc.lookup(c.r, name)
		if err != nil {
			continue // the subgraph reports it when it reads it
		}
		if t, err = c.r.materialize(t, nil); err != nil {
			return err
		}
		vals[name] = t
	}
	c.r.opt.OnSubgraph(g, vals)
	return nil
}

// outerInit reports whether name resolves, from sc, to an initializer of
// sc or an enclosing scope that no value of a nearer scope shadows.
func (s *scope) outerInit(name string) bool {
	for sc := s; sc != nil; sc = sc.parent {
		if _, ok := sc.vals[name]; ok {
			return false
		}
		if _, ok := sc.inits[name]; ok {
			return true
		}
	}
	return false
}
