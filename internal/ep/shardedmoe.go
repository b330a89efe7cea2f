package ep

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// ShardedMoE is ONNX Runtime's com.microsoft::ShardedMoE (CUDA, NCCL): the
// inputs of com.microsoft::MoE with the expert weights of this rank only
// ([E_local, …], experts local_experts_start_index onwards) and the input
// tokens replicated on every rank; the ranks' expert outputs are broadcast
// so that every rank returns the whole block's output. The group size is
// the world size E / E_local (no attribute). The simulator runs it with
// ONNX Runtime's MoE semantics (softmax over router_probs, top k,
// optional renormalisation, silu with fc3 or swiglu with fused fc1) over
// the experts of all ranks, written here independently of package moe.
const (
	ShardedMoEDomain = "com.microsoft"
	ShardedMoEOp     = "ShardedMoE"
)

type shardedPart struct {
	start int64
	in    []*eval.Tensor
}

func shardedMoE(c *eval.OpContext, n *pb.NodeProto, in []*eval.Tensor) ([]*eval.Tensor, error) {
	get := func(i int) *eval.Tensor {
		if i < len(in) {
			return in[i]
		}
		return nil
	}
	if ts := graph.AttrInt(n, "tensor_shards", 1); ts != 1 {
		return nil, fmt.Errorf("ShardedMoE with tensor_shards=%d (tensor parallel) is not simulated", ts)
	}
	start := graph.AttrInt(n, "local_experts_start_index", 0)
	_, all, err := Exchange(c.Context, "sharded_moe:"+ShardedMoEDomain+"::"+ShardedMoEOp, shardedPart{start, append([]*eval.Tensor(nil), in...)}) // the runner reuses in
	if err != nil {
		return nil, err
	}
	// Assemble the experts of all ranks in start-index order.
	parts := make([]shardedPart, len(all))
	for i, v := range all {
		parts[i] = v.(shardedPart)
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].start < parts[j].start })
	weights := make([]*eval.Tensor, 8)
	for _, pos := range []int{2, 3, 4, 5, 6, 7} {
		if get(pos) == nil {
			continue
		}
		var ts []*eval.Tensor
		next := int64(0)
		for _, p := range parts {
			if p.start != next {
				return nil, fmt.Errorf("ranks' local_experts_start_index do not tile the experts (expected %d, found %d)", next, p.start)
			}
			if pos >= len(p.in) || p.in[pos] == nil {
				return nil, errors.New("ranks disagree on which optional inputs are present")
			}
			ts = append(ts, p.in[pos])
			next += int64(p.in[pos].Shape[0])
		}
		t, err := concatRows(ts)
		if err != nil {
			return nil, err
		}
		weights[pos] = t
	}
	x, probs := get(0), get(1)
	if x == nil || probs == nil || x.F32 == nil || probs.F32 == nil || weights[2] == nil || weights[4] == nil {
		return nil, errors.New("ShardedMoE needs input, router_probs, fc1 and fc2 as float")
	}
	y, err := ortMoE(n, x, probs, weights)
	if err != nil {
		return nil, err
	}
	return []*eval.Tensor{y}, nil
}

// ortMoE computes com.microsoft::MoE over all experts (current [E, out, in]
// weight layout only).
func ortMoE(n *pb.NodeProto, x, probs *eval.Tensor, w []*eval.Tensor) (*eval.Tensor, error) {
	fc1, fc2, fc3 := w[2], w[4], w[6]
	if len(fc2.Shape) != 3 || len(fc1.Shape) != 3 {
		return nil, fmt.Errorf("expert weights of rank %d and %d, want 3", len(fc1.Shape), len(fc2.Shape))
	}
	E, H, I := fc2.Shape[0], fc2.Shape[1], fc2.Shape[2]
	T := x.Len() / H
	if x.Len() != T*H || probs.Len() != T*E {
		return nil, fmt.Errorf("input %v and router_probs %v do not fit %d experts of hidden size %d", x.Shape, probs.Shape, E, H)
	}
	k := int(graph.AttrInt(n, "k", 1))
	norm := graph.AttrInt(n, "normalize_routing_weights", 0) != 0
	act := graph.AttrString(n, "activation_type", "relu")
	fusion := graph.AttrInt(n, "swiglu_fusion", 0)
	alpha := float64(graph.AttrFloat(n, "activation_alpha", 1))
	beta := float64(graph.AttrFloat(n, "activation_beta", 0))
	limit := float64(graph.AttrFloat(n, "swiglu_limit", float32(math.Inf(1))))
	rows1 := fc1.Shape[1]
	switch {
	case act == "silu" && fc3 != nil && rows1 == I:
	case act == "swiglu" && (fusion == 1 || fusion == 2) && rows1 == 2*I:
	default:
		return nil, fmt.Errorf("activation_type %q (swiglu_fusion %d, fc3 %v, fc1 rows %d) is not simulated", act, fusion, fc3 != nil, rows1)
	}
	dot := func(a, b []float32) float64 {
		var s float64
		for i := range a {
			s += float64(a[i]) * float64(b[i])
		}
		return s
	}
	bias := func(t *eval.Tensor, e, i, n int) float64 {
		if t == nil {
			return 0
		}
		return float64(t.F32[e*n+i])
	}
	sigmoid := func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }
	out := eval.New(x.DType, append([]int(nil), x.Shape...))
	act1 := make([]float64, I)
	for t := 0; t < T; t++ {
		xt := x.F32[t*H : (t+1)*H]
		logits := probs.F32[t*E : (t+1)*E]
		m := math.Inf(-1)
		for _, v := range logits {
			m = math.Max(m, float64(v))
		}
		p := make([]float64, E)
		var s float64
		for e, v := range logits {
			p[e] = math.Exp(float64(v) - m)
			s += p[e]
		}
		idx := make([]int, E)
		for e := range idx {
			idx[e] = e
			p[e] /= s
		}
		sort.SliceStable(idx, func(a, b int) bool { return p[idx[a]] > p[idx[b]] })
		sel := idx[:k]
		var wsum float64
		for _, e := range sel {
			wsum += p[e]
		}
		acc := make([]float64, H)
		for _, e := range sel {
			we := p[e]
			if norm {
				we /= wsum
			}
			row := func(tt *eval.Tensor, r, cols int) []float32 {
				base := (e*tt.Shape[1] + r) * cols
				return tt.F32[base : base+cols]
			}
			for i := 0; i < I; i++ {
				if act == "silu" {
					g := dot(xt, row(fc1, i, H)) + bias(w[3], e, i, rows1)
					u := dot(xt, row(fc3, i, H)) + bias(w[7], e, i, I)
					act1[i] = g * sigmoid(g) * u
					continue
				}
				gr, lr := 2*i, 2*i+1
				if fusion == 2 {
					gr, lr = i, I+i
				}
				g := dot(xt, row(fc1, gr, H)) + bias(w[3], e, gr, rows1)
				l := dot(xt, row(fc1, lr, H)) + bias(w[3], e, lr, rows1)
				g = math.Min(g, limit)
				l = math.Max(math.Min(l, limit), -limit)
				act1[i] = g * sigmoid(alpha*g) * (l + beta)
			}
			a32 := make([]float32, I)
			for i, v := range act1 {
				a32[i] = float32(v)
			}
			for h := 0; h < H; h++ {
				acc[h] += we * (dot(a32, row(fc2, h, I)) + bias(w[5], e, h, H))
			}
		}
		for h, v := range acc {
			out.F32[t*H+h] = float32(v)
		}
	}
	return out, nil
}
