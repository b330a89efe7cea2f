package passes

import (
	"context"
	"fmt"
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
	made := map[string]bool{}
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
	for _, v := range []string{b.Output, b.Router} {
		if v != b.Input && !slices.ContainsFunc(gp.Output, func(o *pb.ValueInfoProto) bool { return o.GetName() == v }) {
			gp.Output = append(gp.Output, &pb.ValueInfoProto{Name: proto.String(v)})
		}
	}
	out, err := eval.Run(ctx, sub, feeds, eval.Options{MemLimit: memLimit, Kernels: evalKernels()})
	if err != nil {
		return nil, err
	}
	res := map[string]*eval.Tensor{b.Input: feeds[b.Input], b.Output: out[b.Output]}
	if r, ok := out[b.Router]; ok {
		res[b.Router] = r
	}
	return res, nil
}
