package passes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"sync"
	"unsafe"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// CheckTolerance is the tolerance of the per-block numerical check:
// |fused - original| <= ATol + RTol*|original| element-wise.
var CheckTolerance = struct{ RTol, ATol float64 }{1e-4, 1e-5}

// errOriginalFails is the check's error for an original model that does not
// run on a data set it was given.
var errOriginalFails = errors.New("the original model does not run")

// RandomFeeds makes deterministic random inputs for every graph input of m
// that is not an initializer: float inputs from N(0, 1); integer inputs
// uniform in [0, V) where V is the row count of the first initializer the
// input gathers from (an embedding), else 100. Dynamic dims take
// dynDim (the first) and 1 (the rest).
//
// A declared shape whose element count overflows is an error.
func RandomFeeds(m *graph.Model, seed uint64, dynDim int) (map[string]*eval.Tensor, error) {
	return randomFeeds(m, seed, dynDim, 0, false)
}

// randomFeeds is RandomFeeds where an input whose elements alone would
// take more than memLimit bytes (when > 0) is an error wrapping
// eval.ErrMemLimit. With pin, an input with symbolic dims takes the static
// shape the model itself pins for it (staticTwin), where it has one.
func randomFeeds(m *graph.Model, seed uint64, dynDim int, memLimit int64, pin bool) (map[string]*eval.Tensor, error) {
	g := m.Graph()
	defer m.KeepIndex(g) // the graph is only read: the next reader takes this index
	rng := rand.New(rand.NewPCG(seed, 0x6d6f6b6f7074))
	feeds := map[string]*eval.Tensor{}
	for _, v := range m.Proto.Graph.Input {
		if g.Initializer(v.GetName()) != nil {
			continue
		}
		tt := v.GetType().GetTensorType()
		if tt == nil {
			return nil, fmt.Errorf("graph input %q is not a tensor", v.GetName())
		}
		var shape []int
		dyn := dynDim
		for _, d := range tt.GetShape().GetDim() {
			if _, ok := d.Value.(*pb.TensorShapeProto_Dimension_DimValue); ok {
				shape = append(shape, int(d.GetDimValue()))
			} else {
				shape = append(shape, dyn)
				dyn = 1
			}
		}
		if pin {
			if twin := staticTwin(m, v); twin != nil {
				shape = twin
			}
		}
		dt := pb.TensorProto_DataType(tt.GetElemType())
		if err := eval.CheckShape(pb.TensorProto_FLOAT, shape, memLimit); err != nil {
			if errors.Is(err, eval.ErrMemLimit) {
				return nil, fmt.Errorf("random input %q: %w", v.GetName(), err)
			}
			return nil, &graph.InputError{File: m.Name(), Object: fmt.Sprintf("input %q", v.GetName()), Msg: fmt.Sprintf("declared shape %v: %v", shape, err)}
		}
		n := 1
		for _, d := range shape {
			n *= d
		}
		switch dt {
		case pb.TensorProto_FLOAT, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16, pb.TensorProto_DOUBLE:
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			t := eval.NewFloat32(shape, x)
			t.DType = dt
			feeds[v.GetName()] = t
		case pb.TensorProto_INT64, pb.TensorProto_INT32:
			bound := int64(100)
			for _, c := range g.Consumers(v.GetName()) {
				if c.GetOpType() == "Gather" && len(c.Input) > 1 && c.Input[1] == v.GetName() {
					if emb := g.Initializer(c.Input[0]); emb != nil && len(emb.GetDims()) > 0 {
						bound = emb.GetDims()[0]
						break
					}
				}
			}
			x := make([]int64, n)
			for i := range x {
				x[i] = rng.Int64N(bound)
			}
			t := eval.NewInt64(shape, x)
			t.DType = dt
			feeds[v.GetName()] = t
		case pb.TensorProto_BOOL: // an If condition, say
			x := make([]bool, n)
			for i := range x {
				x[i] = rng.IntN(2) == 1
			}
			feeds[v.GetName()] = eval.NewBool(shape, x)
		default:
			return nil, fmt.Errorf("graph input %q has type %s, which random inputs do not cover", v.GetName(), dt)
		}
	}
	return feeds, nil
}

// checkTokens is how many distinct tokens the numerical check feeds:
// enough that every expert is expected to be chosen about four times (4E/k
// tokens, k experts each), at least 14 and at most 128.
func checkTokens(blocks []*Block) int {
	n := 14
	for _, b := range blocks {
		if k := b.Spec.TopK; k > 0 {
			n = max(n, (4*b.Spec.NumExperts+k-1)/k)
		}
	}
	return min(n, 128)
}

// checkFeeds makes the numerical check's random inputs: like RandomFeeds
// with dynamic dims of distinct (the first) and 1, but an input whose
// static dims hold more than distinct rows (a float input's last dim is a
// row; each element of an integer input is one) repeats distinct random
// rows over them. A static-token graph then computes only distinct
// different tokens, and the interpreter computes each repeated row of a
// matrix product once, so the check's work follows distinct, not the
// exported token count.
func checkFeeds(m *graph.Model, seed uint64, distinct int, memLimit int64) (map[string]*eval.Tensor, error) {
	feeds, err := randomFeeds(m, seed, distinct, memLimit, true)
	if err != nil {
		return nil, err
	}
	for _, t := range feeds {
		period := repeatPeriod(t, distinct)
		repeatFrom(t.F32, period)
		repeatFrom(t.I64, period)
	}
	return feeds, nil
}

// staticTwin returns, for a graph input with symbolic dims, the static
// shape the model pins for it: that of the first graph output or
// value_info entry of the same element type and rank whose dims are all
// static and equal to the input's static dims where those are static. A
// trace exported with symbolic input dims but static shapes inside (a
// Reshape to the traced [2, 8, 64]) declares its output that way; the
// check then feeds the traced shape instead of one its shape arithmetic
// cannot take. It returns nil when the input is fully static or no such
// entry exists.
func staticTwin(m *graph.Model, in *pb.ValueInfoProto) []int {
	tt := in.GetType().GetTensorType()
	dims := tt.GetShape().GetDim()
	symbolic := false
	for _, d := range dims {
		if _, ok := d.Value.(*pb.TensorShapeProto_Dimension_DimValue); !ok {
			symbolic = true
		}
	}
	if !symbolic || len(dims) == 0 {
		return nil
	}
	cands := append(append([]*pb.ValueInfoProto(nil), m.Proto.Graph.Output...), m.Proto.Graph.ValueInfo...)
next:
	for _, c := range cands {
		ct := c.GetType().GetTensorType()
		if ct == nil || ct.GetElemType() != tt.GetElemType() || len(ct.GetShape().GetDim()) != len(dims) {
			continue
		}
		shape := make([]int, len(dims))
		for i, d := range ct.GetShape().GetDim() {
			v, ok := d.Value.(*pb.TensorShapeProto_Dimension_DimValue)
			if !ok || v.DimValue <= 0 {
				continue next
			}
			if w, ok := dims[i].Value.(*pb.TensorShapeProto_Dimension_DimValue); ok && w.DimValue != v.DimValue {
				continue next
			}
			shape[i] = int(v.DimValue)
		}
		return shape
	}
	return reshapePinned(m, in.GetName(), dims)
}

// reshapePinned is staticTwin's second source: a Reshape of the input to a
// constant shape without -1 or 0 fixes the product of the input's symbolic
// dims; the first symbolic dim takes it, the others 1. (A traced shape
// elsewhere in the graph is not preferred: where the model does not declare
// the output with the input's dims, the [16, 1, H] a trace also takes shows
// the fused node changing the output's shape.)
func reshapePinned(m *graph.Model, name string, dims []*pb.TensorShapeProto_Dimension) []int {
	g := m.Graph()
	defer m.KeepIndex(g)
	for _, p := range reshapeTargets(g, name) {
		t, err := eval.FromProto(p, m.TensorBytes)
		if err != nil || t.I64 == nil {
			continue
		}
		total := int64(1)
		for _, v := range t.I64 {
			if v <= 0 || total > 1<<40/v {
				total = -1
				break
			}
			total *= v
		}
		static := int64(1)
		for _, d := range dims {
			if v, ok := d.Value.(*pb.TensorShapeProto_Dimension_DimValue); ok {
				static *= max(v.DimValue, 1)
			}
		}
		if total <= 0 || total%static != 0 {
			continue
		}
		shape := make([]int, len(dims))
		first := true
		for i, d := range dims {
			switch v, ok := d.Value.(*pb.TensorShapeProto_Dimension_DimValue); {
			case ok:
				shape[i] = int(v.DimValue)
			case first:
				shape[i], first = int(total/static), false
			default:
				shape[i] = 1
			}
		}
		return shape
	}
	return nil
}

// reshapeTargets returns the constant targets of the Reshapes of value
// name: in g, and in the subgraphs of the nodes that read name from their
// outer scope, at any depth where nothing of that name shadows it (a trace
// wrapped in an If or a Loop pins its input inside the body).
func reshapeTargets(g *graph.Graph, name string) []*pb.TensorProto {
	return constReshapes(g, name, g.Consumers(name))
}

// constReshapes returns the constant targets of the Reshapes among nodes
// and in their subgraphs at any depth: those of value name where it is not
// shadowed, or of every value when name is empty.
func constReshapes(g *graph.Graph, name string, nodes []*pb.NodeProto) []*pb.TensorProto {
	var out []*pb.TensorProto
	var walk func(nodes []*pb.NodeProto, lookup func(string) *pb.TensorProto, depth int)
	walk = func(nodes []*pb.NodeProto, lookup func(string) *pb.TensorProto, depth int) {
		for _, c := range nodes {
			if c.GetOpType() == "Reshape" && c.GetDomain() == "" && len(c.Input) >= 2 && (name == "" || c.Input[0] == name) {
				if p := lookup(c.Input[1]); p != nil {
					out = append(out, p)
				}
			}
			if depth >= 32 {
				continue
			}
			for _, a := range c.Attribute {
				for _, sg := range append([]*pb.GraphProto{a.G}, a.Graphs...) {
					if sg == nil || name != "" && shadows(sg, name) {
						continue
					}
					local := graphConsts(sg)
					walk(sg.Node, func(v string) *pb.TensorProto {
						if t, ok := local[v]; ok {
							return t
						}
						return lookup(v)
					}, depth+1)
				}
			}
		}
	}
	walk(nodes, func(v string) *pb.TensorProto {
		if t := g.Initializer(v); t != nil {
			return t
		}
		if pr := g.Producer(v); pr != nil && pr.GetOpType() == "Constant" {
			return graph.AttrTensor(pr, "value")
		}
		return nil
	}, 0)
	return out
}

// shadows reports whether subgraph sg declares a value called name (an
// input, an initializer or a node output), which its nodes then read
// instead of the outer scope's.
func shadows(sg *pb.GraphProto, name string) bool {
	for _, v := range sg.GetInput() {
		if v.GetName() == name {
			return true
		}
	}
	for _, t := range sg.GetInitializer() {
		if t.GetName() == name {
			return true
		}
	}
	for _, n := range sg.GetNode() {
		if slices.Contains(n.Output, name) {
			return true
		}
	}
	return false
}

// graphConsts maps the constants a subgraph defines, its initializers and
// its Constant nodes' values (a shadowed name maps to nil), to their tensors.
func graphConsts(sg *pb.GraphProto) map[string]*pb.TensorProto {
	out := map[string]*pb.TensorProto{}
	for _, v := range sg.GetInput() {
		out[v.GetName()] = nil
	}
	for _, t := range sg.GetInitializer() {
		out[t.GetName()] = t
	}
	for _, n := range sg.GetNode() {
		for _, o := range n.Output {
			out[o] = nil
		}
		if n.GetOpType() == "Constant" && n.GetDomain() == "" && len(n.Output) == 1 {
			out[n.Output[0]] = graph.AttrTensor(n, "value")
		}
	}
	return out
}

// distinctRows returns the distinct rows (H values each) of x in order of
// first appearance and, per row of x, the position of its distinct row.
// Rows are equal when their bits are.
func distinctRows(x []float32, H int) ([]float32, []int) {
	seed := maphash.MakeSeed()
	return distinctRowsBy(x, H, func(b []byte) uint64 { return maphash.Bytes(seed, b) })
}

// distinctRowsBy is distinctRows with the rows' hash given.
func distinctRowsBy(x []float32, H int, hash func([]byte) uint64) ([]float32, []int) {
	T := len(x) / H
	of := make([]int, T)
	first := make(map[uint64]int, min(T, 16))    // row hash -> the first distinct row with it
	out := make([]float32, 0, min(len(x), 16*H)) // grown to the distinct rows only
	row := func(j int) []byte { return unsafeBytes(out[j*H : (j+1)*H]) }
	for t := range T {
		b := unsafeBytes(x[t*H : (t+1)*H])
		h := hash(b)
		j, ok := first[h]
		if ok && !bytes.Equal(row(j), b) {
			// Another row has this hash: compare with every distinct row.
			j, ok = 0, false
			for k := range len(out) / H {
				if bytes.Equal(row(k), b) {
					j, ok = k, true
					break
				}
			}
		}
		if !ok {
			j = len(out) / H
			if _, taken := first[h]; !taken {
				first[h] = j
			}
			out = append(out, x[t*H:(t+1)*H]...)
		}
		of[t] = j
	}
	return out, of
}

// numericCheck runs the original model on random inputs (one run of
// checkTokens distinct tokens; further seeds only if a run fails),
// captures each block's input and output, and compares the output with the
// fused node's reference semantics on the captured input; for a nil entry
// of ws the block's weights are read from its weight plan when the block
// is checked and dropped after it (checkWeights: router, shared expert and
// routed biases whole, the routed experts one at a time). It returns one
// error (or nil) per block. A block whose fused input has the wrong shape
// but whose router input fits is switched to the router input.
//
// A block is checked as soon as the run has computed its values, on
// another core while the run goes on (the run and the checks, the two
// large costs, overlap); what is left is checked after the run.
//
// With data (CheckData) the model runs on those input sets instead, each of
// which must run; the case label in messages is then the set's position.
func numericCheck(ctx context.Context, m *graph.Model, blocks []*Block, ws []*moe.Weights, data []map[string]*eval.Tensor, memLimit int64) ([]error, error) {
	errs := make([]error, len(blocks))
	want := map[string]bool{}
	ext := make([][]string, len(blocks))
	g := m.Graph()
	m.KeepIndex(g) // the check only reads the graph: one index serves it all
	for i, b := range blocks {
		want[b.Input], want[b.Router], want[b.Output], want[b.RouterLogits] = true, true, true, b.RouterLogits != ""
		ext[i] = regionInputs(g, b)
		for _, v := range ext[i] {
			want[v] = true
		}
	}
	// A tighter garbage-collection target than the default while the
	// check runs (see checkGCPercent); the previous one comes back at the
	// end, and the collector reclaims the check's garbage when the heap
	// next grows (forcing a cycle here cost the 500-block chain 20-35 ms of
	// CPU while the output was being written, for a process about to exit).
	defer debug.SetGCPercent(debug.SetGCPercent(checkGCPercent()))
	ran := 0
	distinct := checkTokens(blocks)
	var lastErr error
	cases := uint64(12)
	if len(data) > 0 {
		cases = uint64(len(data))
	}
	noRestarts := false
	for seed := uint64(1); seed <= cases && (ran < 1 || len(data) > 0); seed++ {
		var feeds map[string]*eval.Tensor
		var err error
		if len(data) > 0 {
			feeds = data[seed-1]
		} else if feeds, err = checkFeeds(m, seed, distinct, memLimit); err != nil {
			return nil, err
		}
		where := fmt.Sprintf("random inputs, seed %d", seed)
		if len(data) > 0 {
			where = fmt.Sprintf("check data set %d", seed-1)
		}
		var rs *restarts
		if !noRestarts {
			rs = newRestarts(blocks, seed, distinct)
		}
		early := newEarlyChecks(ctx, m, blocks, ws, errs, memLimit, where, rs)
		vals, err := eval.Run(ctx, m, feeds, eval.Options{Capture: func(n string) bool { return want[n] }, MemLimit: memLimit, Kernels: evalKernels(), OnCapture: early.captured, Replace: rs.replacer()})
		done := early.finish(err == nil)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if errors.Is(err, eval.ErrMemLimit) || errors.Is(err, eval.ErrWorkLimit) {
				return nil, fmt.Errorf("numerical check: %w", err)
			}
			if rs != nil && len(rs.orig) > 0 {
				// the run failed on a restarted value: run this input
				// again as it is (vanished blocks are then run alone)
				noRestarts = true
				seed--
				continue
			}
			if len(data) > 0 {
				return nil, fmt.Errorf("numerical check: %w on check data set %d: %w", errOriginalFails, seed-1, err)
			}
			// Some traced graphs only run on inputs like their trace input
			// (a loop unrolled over the experts hit at trace time): try others.
			lastErr = err
			continue
		}
		ran++
		// The run's tensors are garbage now: collect them before big
		// weights of the remaining blocks are read, so that peak memory is
		// the larger of the two, not their sum. (Small weights fit the
		// collector's headroom: a forced cycle would only cost time.)
		if remainingCheckBytes(blocks, ws, errs, done) >= checkGCHeadroom/2 {
			runtime.GC()
		}
		forBlocks(blocks, ws, memLimit, func(i int, scratch *checkScratch) {
			if errs[i] != nil || done[i] {
				return
			}
			bv, bwhere := rs.view(blocks[i], ext[i], vals), rs.where(blocks[i], where)
			if vanished(vals[blocks[i].Input]) {
				// the model's activations vanished before this block
				// (blocks chained without residuals): check it alone on
				// inputs of unit scale; if it cannot run alone, compare
				// what the model gave
				if iv, err := isolatedVals(ctx, m, g, blocks[i], ext[i], vals, seed, memLimit); err == nil {
					bv, bwhere = iv, where+", the block alone on its own random input"
				}
			}
			errs[i] = checkBlock(m, blocks[i], bv, ws, i, scratch, bwhere)
		})
	}
	if ran == 0 {
		return nil, fmt.Errorf("%w: the original model fails on random inputs: %v", ErrCheckInconclusive, lastErr)
	}
	return errs, nil
}

// repeatPeriod is the number of leading elements of t that hold distinct
// rows (a float row being its last dim; each element of an integer tensor
// being one).
func repeatPeriod(t *eval.Tensor, distinct int) int {
	row := 1
	if t.F32 != nil && len(t.Shape) > 1 {
		row = t.Shape[len(t.Shape)-1]
	}
	return distinct * row
}

// repeatFrom repeats s's first period elements over the rest of s.
func repeatFrom[T any](s []T, period int) {
	for i := period; i < len(s); i++ {
		s[i] = s[i-period]
	}
}

// checkGCPercent is the collector's target while the check runs: 25% of
// the live heap, but at least checkGCHeadroom. The interpreter and the
// checks allocate tensors one after another: a target near the live data
// (the model, the weights and the values alive at once) keeps the process
// there and reuses memory already paged in, where the default would let
// garbage grow to the size of the model's weights; but on a heap of many
// small messages (a graph of many nodes and value infos with small
// weights) each cycle costs more than it saves, and a floor on the
// headroom keeps the cycles few. (On a 500-block residual stack of 400 MB
// of weights, 25% beat 50% and 100%; on a 500-block chain of 117 MB, 25%
// spent 0.2 s more than 50%: bench/check.sh, bench/chain.sh.)
func checkGCPercent() int {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 || s[0].Value.Uint64() == 0 {
		return 25
	}
	return int(min(100, max(25, 100*checkGCHeadroom/s[0].Value.Uint64())))
}

// checkGCHeadroom is the least garbage checkGCPercent lets grow between
// collections.
const checkGCHeadroom = 128 << 20

// remainingCheckBytes returns the most weight bytes (checkBytes) that a
// block still to be checked (without an error, not done) will hold.
func remainingCheckBytes(blocks []*Block, ws []*moe.Weights, errs []error, done []bool) int64 {
	var most int64
	for i, b := range blocks {
		if errs[i] == nil && !done[i] && ws[i] == nil {
			most = max(most, b.W.checkBytes(&b.Spec))
		}
	}
	return most
}

// earlyChecks checks blocks while the model runs: each block whose input,
// router input and output the run has computed (and whose input has not
// vanished) goes to a worker on another core, one block at a time, if the
// weights its check holds (checkBytes: the router, the shared expert and a
// few routed experts' matrices at a time) fit a quarter of the memory
// limit (1 GiB without one). The run reports values through captured, on
// its own goroutine.
type earlyChecks struct {
	m      *graph.Model
	blocks []*Block
	ws     []*moe.Weights
	errs   []error
	where  string
	rs     *restarts
	need   map[string][]int // value name -> blocks waiting for it
	vals   []map[string]*eval.Tensor
	left   []int // values each block still waits for
	done   []bool
	res    []error
	queue  chan earlyJob
	wg     sync.WaitGroup
}

func newEarlyChecks(ctx context.Context, m *graph.Model, blocks []*Block, ws []*moe.Weights, errs []error, memLimit int64, where string, rs *restarts) *earlyChecks {
	e := &earlyChecks{m: m, blocks: blocks, ws: ws, errs: errs, where: where, rs: rs, done: make([]bool, len(blocks)), res: make([]error, len(blocks))}
	if runtime.GOMAXPROCS(0) < 2 {
		return e
	}
	budget := weightsBudget(memLimit)
	e.need = map[string][]int{}
	e.vals = make([]map[string]*eval.Tensor, len(blocks))
	e.left = make([]int, len(blocks))
	for i, b := range blocks {
		if errs[i] != nil || ws[i] == nil && b.W.checkBytes(&b.Spec) > budget {
			continue
		}
		e.vals[i] = map[string]*eval.Tensor{}
		for _, v := range checkedValues(b) {
			if _, dup := e.vals[i][v]; !dup {
				e.vals[i][v] = nil
				e.need[v] = append(e.need[v], i)
				e.left[i]++
			}
		}
	}
	e.queue = make(chan earlyJob, len(blocks))
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		scratch := &checkScratch{}
		for j := range e.queue {
			if ctx.Err() != nil {
				continue // the run ends with the context's error
			}
			e.res[j.i] = checkBlock(m, blocks[j.i], e.vals[j.i], ws, j.i, scratch, j.where)
			e.done[j.i] = true
		}
	}()
	return e
}

// earlyJob is a block for the early worker: its index and the inputs it
// is checked on, for messages.
type earlyJob struct {
	i     int
	where string
}

// captured records a value the run computed and queues the blocks it
// completes.
func (e *earlyChecks) captured(name string, t *eval.Tensor) {
	for _, i := range e.need[name] {
		e.vals[i][name] = e.rs.value(e.blocks[i], name, t)
		if e.left[i] == 0 {
			continue // reported twice: already queued
		}
		if e.left[i]--; e.left[i] == 0 && !vanished(e.vals[i][e.blocks[i].Input]) {
			// where is read here, on the run's goroutine, which is the
			// one that records restarts
			e.queue <- earlyJob{i, e.rs.where(e.blocks[i], e.where)}
		}
	}
}

// finish waits for the worker and returns which blocks it checked; their
// errors are recorded only when the run completed (ok), otherwise the
// blocks are checked again on the next run.
func (e *earlyChecks) finish(ok bool) []bool {
	if e.queue == nil {
		return e.done
	}
	close(e.queue)
	e.wg.Wait()
	if !ok {
		return make([]bool, len(e.blocks))
	}
	for i, d := range e.done {
		if d {
			e.errs[i] = e.res[i]
		}
	}
	return e.done
}

// weightsBudget is the weight bytes (checkBytes) the checks running at
// once may hold: a quarter of memLimit, 1 GiB without one.
func weightsBudget(memLimit int64) int64 {
	if memLimit > 0 {
		return memLimit / 4
	}
	return 1 << 30
}

// forBlocks calls check(i, scratch) for every block, on up to GOMAXPROCS
// goroutines, each with its own scratch to read blocks' weights into.
// A block whose weights are not given (ws[i] nil) has them read while it
// is checked and dropped after: the router, the shared expert and the
// routed biases whole, the routed experts one at a time (checkBytes counts
// what that holds). Such blocks run at once only while their checkBytes
// together stay within a quarter of memLimit (1 GiB without a limit); a
// block larger than that runs alone, as it would serially. Given weights
// are in memory anyway.
func forBlocks(blocks []*Block, ws []*moe.Weights, memLimit int64, check func(i int, scratch *checkScratch)) {
	workers := min(runtime.GOMAXPROCS(0), len(blocks))
	if workers <= 1 {
		scratch := &checkScratch{}
		for i := range blocks {
			check(i, scratch)
		}
		return
	}
	budget := weightsBudget(memLimit)
	cost := make([]int64, len(blocks))
	for i, b := range blocks {
		if ws[i] == nil {
			cost[i] = b.W.checkBytes(&b.Spec)
		}
	}
	var (
		mu       sync.Mutex
		cond     = sync.NewCond(&mu)
		next     int
		inFlight int64
		running  int
		wg       sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			scratch := &checkScratch{}
			for {
				mu.Lock()
				// Blocks start in order: wait until the next one fits (or
				// nothing else runs).
				for next < len(blocks) && running > 0 && inFlight+cost[next] > budget {
					cond.Wait()
				}
				if next >= len(blocks) {
					mu.Unlock()
					return
				}
				i := next
				next++
				inFlight += cost[i]
				running++
				mu.Unlock()
				check(i, scratch)
				mu.Lock()
				inFlight -= cost[i]
				running--
				cond.Broadcast()
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

// corruptWeights, set by tests only, edits each block's weights as the
// check reads them, for a check that must fail: the weights read whole
// (router, routed biases, shared expert); the routed experts' matrices,
// read one expert at a time, are edited by corruptExpert.
var corruptWeights func(b *Block, w *moe.Weights)

// checkedRouting, set by tests only, is told the routing of each block's
// distinct check tokens and which experts the check computes (only; nil:
// all), before the fused semantics read the routed experts.
var checkedRouting func(b *Block, ids [][]int, only func(int) bool)

// checkBlock compares block b's captured output in vals with the fused
// node's reference semantics on its captured input; where names the inputs
// for the message. A nil ws[i] is read from the block's weight plan
// (checkWeights): the router, the routed biases and the shared expert into
// scratch's memory, the routed experts one at a time by scratch's reader,
// which reads each expert the tokens are routed to once (nil scratch:
// fresh memory); scratch keeps what was allocated for the next block. It
// may switch b.Input to the router input (see numericCheck).
func checkBlock(m *graph.Model, b *Block, vals map[string]*eval.Tensor, ws []*moe.Weights, i int, scratch *checkScratch, where string) error {
	x, y := vals[b.Input], vals[b.Output]
	if x == nil || y == nil || x.F32 == nil || y.F32 == nil {
		return fmt.Errorf("numerical check: block input or output not computed as float")
	}
	// The fused node's output has its input's shape, which must be the
	// output's: when the block's input has another shape and the router's
	// input (its [T, H] reshape, say) has the output's, the fused node
	// reads that instead. Failing that, shapes that differ but hold the
	// same tokens of H values are the same rows in row-major order, and
	// are compared as they are, when the model declares the block's input
	// and output with the same dims: a trace whose static Reshape turns
	// the [16, 1, H] the check fed its [batch, sequence, H] input into the
	// [2, 8, H] it was traced with, where the fused node follows the
	// declared dims. Where the declarations differ, or are missing, the
	// fused node would change the output's shape.
	if !slices.Equal(x.Shape, y.Shape) {
		sameRows := len(x.F32) == len(y.F32) && len(x.Shape) > 0 && len(y.Shape) > 0 && x.Shape[len(x.Shape)-1] == y.Shape[len(y.Shape)-1]
		if r := vals[b.Router]; r != nil && slices.Equal(r.Shape, y.Shape) {
			b.Input, x = b.Router, r
		} else if len(x.F32) != len(y.F32) {
			return fmt.Errorf("numerical check: the block's output %q (shape %v on %s) does not hold what its input %q (shape %v) does: the value read as the block's output is not what the block computes, or, on random inputs, the graph's shapes do not follow its declared input dims (a trace with static shapes inside?); pass inputs like the export's with --check-data (an ONNX test data folder)", b.Output, y.Shape, where, b.Input, x.Shape)
		} else if !sameRows || !sameDeclaredDims(m.Proto.GetGraph(), b.Input, b.Output) {
			return fmt.Errorf("numerical check: block input shape %v differs from output shape %v: the graph's shapes do not follow its declared input dims (a trace with static shapes inside?); pass inputs like the export's with --check-data (an ONNX test data folder)", x.Shape, y.Shape)
		}
	}
	T := len(x.F32) / b.Spec.Hidden
	w := ws[i]
	if w == nil { // read now into scratch, which the next block reuses
		var err error
		if w, err = b.checkWeights(m, scratch); err != nil {
			return err
		}
	}
	if corruptWeights != nil {
		corruptWeights(b, w)
	}
	// The fused semantics are per token: computed once per distinct
	// token, compared on every token.
	xd, of := distinctRows(x.F32, b.Spec.Hidden)
	Td := len(xd) / b.Spec.Hidden
	var only func(int) bool
	if b.TracedExperts > 0 {
		only = tracedExperts(&b.Spec, w, xd, Td, b.TracedExperts)
	}
	if checkedRouting != nil {
		ids, _ := moe.Route(&b.Spec, w, xd, Td)
		checkedRouting(b, ids, only)
	}
	gd, err := moe.ForwardExperts(&b.Spec, w, xd, Td, only)
	if err != nil {
		return err
	}
	peak := 0.0
	for i, v := range y.F32 {
		if f := float64(v); math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Errorf("numerical check impossible: the original subgraph computes %v at element %d of its output on the check's inputs (a NaN or infinite weight?), and equal NaNs or infinities prove nothing (%s)", v, i, where)
		}
		peak = max(peak, math.Abs(float64(v)))
	}
	dt := computeType(b, y.DType)
	rtol, atol, half := checkTolerance(dt, peak)
	var off, at int
	var worst float64
	if half { // skip tokens whose routing a rounded router may flip
		gaps := moe.RouteGaps(&b.Spec, w, xd, Td)
		tie := moe.NearTie(dt)
		skip := func(t int) bool { return gaps[of[t]] < tie }
		off, worst, at = tokensOff(expandRows(gd, of, b.Spec.Hidden), y.F32, b.Spec.Hidden, rtol, atol, skip)
	} else {
		off, worst, at = tokensOffRows(gd, of, y.F32, b.Spec.Hidden, rtol, atol, tokenRTol)
	}
	if off > 0 {
		return fmt.Errorf("numerical check failed: the fused node's semantics differ from the original subgraph by %.3g at element %d, %d of %d tokens off (%s)", worst, at, off, T, where)
	}
	return checkLogits(b, vals, w, x.F32, T, where)
}

// sameDeclaredDims reports whether gp declares values a and b (as graph
// inputs, outputs or value infos) with the same dims: the same number,
// each the same dim_value or the same dim_param.
func sameDeclaredDims(gp *pb.GraphProto, a, b string) bool {
	da, db := declaredDims(gp, a), declaredDims(gp, b)
	if da == nil || db == nil || len(da) != len(db) {
		return false
	}
	for i := range da {
		x, y := da[i], db[i]
		_, xv := x.GetValue().(*pb.TensorShapeProto_Dimension_DimValue)
		_, yv := y.GetValue().(*pb.TensorShapeProto_Dimension_DimValue)
		switch {
		case xv && yv && x.GetDimValue() == y.GetDimValue():
		case x.GetDimParam() != "" && x.GetDimParam() == y.GetDimParam():
		default:
			return false
		}
	}
	return true
}

// declaredDims returns the dims gp declares for value v, or nil.
func declaredDims(gp *pb.GraphProto, v string) []*pb.TensorShapeProto_Dimension {
	for _, l := range [][]*pb.ValueInfoProto{gp.GetInput(), gp.GetOutput(), gp.GetValueInfo()} {
		for _, vi := range l {
			if vi.GetName() == v {
				if sh := vi.GetType().GetTensorType().GetShape(); sh != nil {
					return sh.GetDim()
				}
				return nil
			}
		}
	}
	return nil
}

// ErrCheckInconclusive is wrapped when the numerical check could not run.
var ErrCheckInconclusive = errors.New("numerical check inconclusive")

// tracedExperts says which experts a trace unrolled over the experts hit at
// trace time computes on input x: the first n experts hit, in ascending id
// order (the order ONNX NonZero lists them in, which such traces iterate
// over). The check of a restored block compares the original graph with the
// fused semantics restricted to these experts, which proves the restored
// block equal to the trace on everything the trace computes.
func tracedExperts(s *moe.Spec, w *moe.Weights, x []float32, T, n int) func(int) bool {
	ids, _ := moe.Route(s, w, x, T)
	hit := make([]bool, s.NumExperts)
	for _, row := range ids {
		for _, e := range row {
			hit[e] = true
		}
	}
	kept := make([]bool, s.NumExperts)
	for e := 0; e < s.NumExperts && n > 0; e++ {
		if hit[e] {
			kept[e] = true
			n--
		}
	}
	return func(e int) bool { return kept[e] }
}

// expandRows is the inverse of distinctRows: row t of the result is row
// of[t] of d.
func expandRows(d []float32, of []int, H int) []float32 {
	out := make([]float32, len(of)*H)
	for t, j := range of {
		copy(out[t*H:(t+1)*H], d[j*H:(j+1)*H])
	}
	return out
}

// unsafeBytes views a float slice's bytes (for use as a map key).
func unsafeBytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

// tokenRTol is the float32 check's tolerance relative to each token's
// output magnitude (the largest |value| of the token's output row), on top
// of the element-wise CheckTolerance. An output element is a sum of terms
// (expert rows times activations, the weighted experts) that the original
// graph and the fused semantics add in different orders; float32 rounds
// each partial sum to about 6e-8 of the largest terms, not of the result,
// so where terms cancel (weights spanning many binades) an element far
// below its token's magnitude differs by far more than its own size
// times RTol. A float64 evaluation of the original shows both float32
// results within about 2e-6 of the truth relative to the token's magnitude
// on weights spanning 2^-30..2^10 (TestWideBinadeTolerance): reassociation,
// not a different function. 1e-5 of the token's magnitude covers that
// while a changed weight, a swapped expert or a dropped renormalisation
// moves outputs by far more.
const tokenRTol = 1e-5

// tokensOffRows is tokensOff with the tolerance of element j of token t
// atol + rtol*|want[j]| + trtol*max|want[token t]|, where token t's result
// is row of[t] of the distinct rows gd (H values each).
func tokensOffRows(gd []float32, of []int, want []float32, H int, rtol, atol, trtol float64) (off int, worst float64, at int) {
	at = -1
	for t := 0; t*H < len(want); t++ {
		row := want[t*H : min((t+1)*H, len(want))]
		got := gd[of[t]*H:]
		mag := 0.0
		for _, v := range row {
			mag = max(mag, math.Abs(float64(v)))
		}
		bad := false
		for j, v := range row {
			d := math.Abs(float64(got[j]) - float64(v))
			if !(d <= atol+rtol*math.Abs(float64(v))+trtol*mag) { // a NaN is off
				if math.IsNaN(d) {
					d = math.Inf(1)
				}
				bad = true
				if d > worst {
					worst, at = d, t*H+j
				}
			}
		}
		if bad {
			off++
		}
	}
	return off, worst, at
}
