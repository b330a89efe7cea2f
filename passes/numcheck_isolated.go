package passes

import (
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// vanishingInput is the largest magnitude below which a block's captured
// input counts as vanished: hidden states are of order one, and blocks
// chained without residual connections shrink them copy after copy until
// a later block sees (near) zeros, on which any weights give (near) zero
// and the comparison proves nothing.
const vanishingInput = 1e-3

// vanished reports whether x holds no element of magnitude vanishingInput
// or more.
func vanished(x *eval.Tensor) bool {
	if x == nil || x.F32 == nil {
		return false
	}
	for _, v := range x.F32 {
		if math.Abs(float64(v)) >= vanishingInput {
			return false
		}
	}
	return true
}

// regionInputs returns the values block b's region reads that it does not
// compute and that are neither b.Input nor initializers (shape values
// computed upstream, say), in the order first read.
func regionInputs(g *graph.Graph, b *Block) []string {
	made := make(map[string]bool, 2*len(b.Region))
	for _, n := range b.Region {
		for _, o := range n.Output {
			made[o] = true
		}
	}
	seen := map[string]bool{}
	var out []string
	for _, n := range b.Region {
		for _, in := range graph.NodeInputs(n) {
			if in == "" || in == b.Input || made[in] || seen[in] || g.Initializer(in) != nil {
				continue
			}
			seen[in] = true
			out = append(out, in)
		}
	}
	return out
}

// isolatedVals evaluates block b's region alone, on a random input of
// unit scale with the shape of its captured input x, and returns the
// block's input, router input and output from that run. The other values
// the region reads (ext) are fed as the whole model's run computed them
// (in vals); g is m's main graph. A block's fused semantics are per
// token, so any input tests them; this one tests them where the model's
// own activations vanished.
func isolatedVals(ctx context.Context, m *graph.Model, g *graph.Graph, b *Block, ext []string, vals map[string]*eval.Tensor, seed uint64, memLimit int64) (map[string]*eval.Tensor, error) {
	x := vals[b.Input]
	gp := &pb.GraphProto{Node: b.Region}
	seen := map[string]bool{}
	for _, n := range b.Region {
		for _, in := range graph.NodeInputs(n) {
			if t := g.Initializer(in); t != nil && !seen[in] {
				seen[in] = true
				gp.Initializer = append(gp.Initializer, t)
			}
		}
	}
	sub := m.WithGraph(gp)
	feeds := map[string]*eval.Tensor{}
	rng := rand.New(rand.NewPCG(seed, 0x69736f6c61746564))
	xs := make([]float32, len(x.F32))
	for i := range xs {
		xs[i] = float32(rng.NormFloat64())
	}
	feeds[b.Input] = eval.NewFloat32(x.Shape, xs)
	feeds[b.Input].DType = x.DType
	for _, v := range ext {
		t := vals[v]
		if t == nil {
			return nil, fmt.Errorf("value %q the block reads was not computed", v)
		}
		feeds[v] = t
	}
	for _, v := range append([]string{b.Input}, ext...) {
		gp.Input = append(gp.Input, &pb.ValueInfoProto{Name: proto.String(v)}) // typed by its feed
	}
	for _, v := range []string{b.Output, b.Router, b.RouterLogits} {
		if v == "" {
			continue
		}
		if v != b.Input && !slices.ContainsFunc(gp.Output, func(o *pb.ValueInfoProto) bool { return o.GetName() == v }) {
			gp.Output = append(gp.Output, &pb.ValueInfoProto{Name: proto.String(v)})
		}
	}
	out, err := eval.Run(ctx, sub, feeds, eval.Options{MemLimit: memLimit, Kernels: evalKernels()})
	if err != nil {
		return nil, err
	}
	res := map[string]*eval.Tensor{b.Input: feeds[b.Input], b.Output: out[b.Output]}
	for _, v := range []string{b.Router, b.RouterLogits} {
		if r, ok := out[v]; ok && v != "" {
			res[v] = r
		}
	}
	return res, nil
}

// restarts lets the check's run go on from fresh values where the model's
// activations vanished: a block input that the run computes as vanished is
// replaced by random values of unit scale (of its shape and dtype, its
// distinct rows repeated as checkFeeds repeats the feeds'), which the
// block, and every block after it, then compute on. Each block is thus
// checked on inputs of unit scale during the one run, early, instead of
// alone after it. Where a block's input is also an earlier block's output
// (blocks chained directly), the earlier block is checked against the
// value the run computed, the later one on the replacement. A nil
// *restarts replaces nothing.
type restarts struct {
	inputs   map[string]bool
	orig     map[string]*eval.Tensor // value name -> what the run computed, where replaced
	seed     uint64
	distinct int
}

func newRestarts(blocks []*Block, seed uint64, distinct int) *restarts {
	r := &restarts{inputs: map[string]bool{}, orig: map[string]*eval.Tensor{}, seed: seed, distinct: distinct}
	for _, b := range blocks {
		r.inputs[b.Input] = true
	}
	return r
}

// replacer returns r.replace as the interpreter's Replace option (nil for
// a nil r).
func (r *restarts) replacer() func(string, *eval.Tensor) *eval.Tensor {
	if r == nil {
		return nil
	}
	return r.replace
}

// replace returns the random values that stand for the block input name
// when the run computed it as vanished (t), and nil otherwise.
func (r *restarts) replace(name string, t *eval.Tensor) *eval.Tensor {
	if !r.inputs[name] || !vanished(t) {
		return nil
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	rng := rand.New(rand.NewPCG(r.seed, h.Sum64()))
	xs := make([]float32, len(t.F32))
	period := min(len(xs), repeatPeriod(t, r.distinct))
	for i := range period {
		xs[i] = float32(rng.NormFloat64())
	}
	repeatFrom(xs, period)
	u := eval.NewFloat32(slices.Clone(t.Shape), xs)
	u.DType = t.DType
	r.orig[name] = t
	return u
}

// value returns the value block b reads under name, given what the run
// holds (t): the replacement where name is b's input, otherwise what the
// run computed.
func (r *restarts) value(b *Block, name string, t *eval.Tensor) *eval.Tensor {
	if r != nil && name != b.Input {
		if o, ok := r.orig[name]; ok {
			return o
		}
	}
	return t
}

// view returns vals as block b reads them (see value): vals itself unless
// a value b reads other than its input (ext, its router input or output)
// was replaced.
func (r *restarts) view(b *Block, ext []string, vals map[string]*eval.Tensor) map[string]*eval.Tensor {
	if r == nil || len(r.orig) == 0 {
		return vals
	}
	var out map[string]*eval.Tensor
	for _, v := range append([]string{b.Router, b.Output}, ext...) {
		if o, ok := r.orig[v]; ok && v != b.Input {
			if out == nil {
				out = maps.Clone(vals)
			}
			out[v] = o
		}
	}
	if out == nil {
		return vals
	}
	return out
}

// where names the inputs block b is checked on, for messages: the run's
// (where), restarted at b's input when it was replaced.
func (r *restarts) where(b *Block, where string) string {
	if r != nil && r.orig[b.Input] != nil {
		return where + ", restarted from random values of unit scale at the block's input (the model's activations vanished before it)"
	}
	return where
}
