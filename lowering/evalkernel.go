package lowering

import (
	"fmt"
	"github.com/mokopt/mokopt/moe"
	"sync"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/kernel/mxfp8"
)

// AddKernels adds the Go kernel of ai.mok::MoKDispatchFFNCombine (MXFP8
// as the MoK kernel computes it) to k and returns k. Nothing is registered
// on import: without it the interpreter runs the node's function body.
func AddKernels(k *eval.Kernels) *eval.Kernels { return k.Add(Domain, OpType, evalKernel) }

// evalKernel runs ai.mok::MoKDispatchFFNCombine in the reference interpreter
// as the MoK kernel computes it, up to the order of floating-point sums:
//
//   - routed weights: E4M3 codes times their UE8M0 block scale (kernel/mxfp8);
//     the codes may arrive decoded (float, see DecodeFP8ForEval) or raw
//     (an integer tensor of the code bytes);
//   - routed activations (emulate_activation_quant=1, the default): the
//     bf16 token row and the SwiGLU hidden row are quantized to MXFP8
//     (1×32 blocks along the contraction axis) before their GEMMs, as the
//     kernel does; GEMMs accumulate in float32;
//   - each expert's output is rounded to bfloat16 (the combine buffer);
//   - the shared expert runs in BF16: bf16 weights, its hidden and its output
//     rounded to bfloat16;
//   - out[t] = shared[t] + Σ_k w[t,k]·routed[t,k] in float32, stored bfloat16.
func evalKernel(ctx *eval.OpContext, n *pb.NodeProto, in []*eval.Tensor) ([]*eval.Tensor, error) {
	if len(in) < NumInputs {
		return nil, fmt.Errorf("%s needs %d inputs, got %d", OpType, NumInputs, len(in))
	}
	for i, t := range in[:NumInputs] {
		if t == nil {
			return nil, fmt.Errorf("%s input %s is missing", OpType, InputNames[i])
		}
	}
	x, ids, rw := in[InX], in[InTopKExperts], in[InRouterWeights]
	if x.Rank() != 2 || x.F32 == nil {
		return nil, fmt.Errorf("x must be a float [T, H] tensor, got %s%v", x.DType, x.Shape)
	}
	T, H := x.Shape[0], x.Shape[1]
	if ids.Rank() != 2 || ids.I64 == nil || ids.Shape[0] != T {
		return nil, fmt.Errorf("topk_experts must be int64 [%d, k], got %s%v", T, ids.DType, ids.Shape)
	}
	k := ids.Shape[1]
	if rw.F32 == nil || len(rw.F32) != T*k {
		return nil, fmt.Errorf("router_weights must be float [%d, %d], got %s%v", T, k, rw.DType, rw.Shape)
	}
	gate, err := newPair(in[InGate], in[InGateScale], "gate")
	if err != nil {
		return nil, err
	}
	E, I := gate.E, gate.N
	up, err := newPair(in[InUp], in[InUpScale], "up")
	if err != nil {
		return nil, err
	}
	down, err := newPair(in[InDown], in[InDownScale], "down")
	if err != nil {
		return nil, err
	}
	if gate.K != H || up.E != E || up.N != I || up.K != H || down.E != E || down.N != H || down.K != I {
		return nil, fmt.Errorf("routed weights gate %v, up %v, down %v do not fit H=%d", in[InGate].Shape, in[InUp].Shape, in[InDown].Shape, H)
	}
	sg, su, sd := in[InSharedGate], in[InSharedUp], in[InSharedDown]
	if sg.F32 == nil || su.F32 == nil || sd.F32 == nil || len(sg.F32)%H != 0 || len(su.F32) != len(sg.F32) || len(sd.F32) != len(sg.F32) {
		return nil, fmt.Errorf("shared weights must be float [Is, H], [Is, H], [H, Is]; got %v %v %v", sg.Shape, su.Shape, sd.Shape)
	}
	Is := len(sg.F32) / H
	limit := float32(0)
	if graph.AttrString(n, AttrActivation, overloadSwiGLU) == overloadSwiGLUClamped {
		limit = graph.AttrFloat(n, AttrSwiGLULimit, 0)
	}
	actQuant := graph.AttrInt(n, AttrEmulateActQuant, 1) != 0
	for i, e := range ids.I64 {
		if e < 0 || e >= int64(E) {
			return nil, fmt.Errorf("topk_experts[%d, %d] = %d is not an expert id in 0..%d", i/k, i%k, e, E-1)
		}
	}
	// Dequantize the experts that are used, once each.
	used := make([]bool, E)
	for _, e := range ids.I64 {
		used[e] = true
	}
	wg, wu, wd := make([][]float32, E), make([][]float32, E), make([][]float32, E)
	for e := 0; e < E; e++ {
		if used[e] {
			wg[e], wu[e], wd[e] = gate.expert(e), up.expert(e), down.expert(e)
		}
	}
	out := make([]float32, T*H)
	threads := max(1, ctx.Threads())
	var wgp sync.WaitGroup
	for w := 0; w < threads; w++ {
		wgp.Add(1)
		go func(w int) {
			defer wgp.Done()
			xq := make([]float32, H)
			g, u, h := make([]float32, max(I, Is)), make([]float32, max(I, Is)), make([]float32, max(I, Is))
			yr, acc := make([]float32, H), make([]float32, H)
			codes := make([]uint8, mxfp8.BlockSize)
			for t := w; t < T; t += threads {
				xt := x.F32[t*H : (t+1)*H]
				// Shared expert, BF16.
				for i := 0; i < Is; i++ {
					gv, uv := moe.Dot(xt, sg.F32[i*H:(i+1)*H]), moe.Dot(xt, su.F32[i*H:(i+1)*H])
					h[i] = bf16(gv * moe.Logistic(gv) * uv)
				}
				for j := 0; j < H; j++ {
					acc[j] = bf16(moe.Dot(h[:Is], sd.F32[j*Is:(j+1)*Is]))
				}
				// Routed experts.
				copy(xq, xt)
				if actQuant {
					fakeQuant(xq, codes)
				}
				for j := 0; j < k; j++ {
					e := ids.I64[t*k+j]
					for i := 0; i < I; i++ {
						g[i], u[i] = moe.Dot(xq, wg[e][i*H:(i+1)*H]), moe.Dot(xq, wu[e][i*H:(i+1)*H])
						if limit > 0 {
							g[i] = min(g[i], limit)
							u[i] = max(min(u[i], limit), -limit)
						}
						h[i] = g[i] * moe.Logistic(g[i]) * u[i]
					}
					if actQuant {
						fakeQuant(h[:I], codes)
					}
					for c := 0; c < H; c++ {
						yr[c] = bf16(moe.Dot(h[:I], wd[e][c*I:(c+1)*I]))
					}
					wt := rw.F32[t*k+j]
					for c := range acc {
						acc[c] += wt * yr[c]
					}
				}
				for c := range acc {
					out[t*H+c] = bf16(acc[c])
				}
			}
		}(w)
	}
	wgp.Wait()
	res := &eval.Tensor{DType: pb.TensorProto_BFLOAT16, Shape: []int{T, H}, F32: out}
	return []*eval.Tensor{res}, nil
}

// pair is one MXFP8 weight tensor as the interpreter hands it over.
type pair struct {
	name    string
	E, N, K int
	codes   []int64   // raw E4M3 code bytes, or
	values  []float32 // decoded E4M3 values (DecodeFP8ForEval)
	scales  []uint8
}

func newPair(d, s *eval.Tensor, name string) (*pair, error) {
	if d.Rank() != 3 {
		return nil, fmt.Errorf("%s must be [E, N, K], got %v", name, d.Shape)
	}
	p := &pair{name: name, E: d.Shape[0], N: d.Shape[1], K: d.Shape[2], codes: d.I64, values: d.F32}
	if err := mxfp8.CheckShape(p.E, p.N, p.K); err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	if p.codes == nil && p.values == nil {
		return nil, fmt.Errorf("%s must hold E4M3 codes (integer) or their values (float), got %s", name, d.DType)
	}
	if s.I64 == nil || len(s.I64) != mxfp8.ScaleLen(p.E, p.N, p.K) {
		return nil, fmt.Errorf("%s scales must be uint8 %v, got %s%v", name, mxfp8.ScaleShape(p.E, p.N, p.K), s.DType, s.Shape)
	}
	p.scales = make([]uint8, len(s.I64))
	for i, v := range s.I64 {
		p.scales[i] = uint8(v)
	}
	return p, nil
}

// expert returns expert e's dequantized [N, K] matrix.
func (p *pair) expert(e int) []float32 {
	out := make([]float32, p.N*p.K)
	base := e * p.N * p.K
	for r := 0; r < p.N; r++ {
		for kb := 0; kb < p.K/mxfp8.BlockSize; kb++ {
			s := mxfp8.ScaleValue(p.scales[mxfp8.ScaleIndex(e*p.N+r, kb, p.K)])
			for j := kb * mxfp8.BlockSize; j < (kb+1)*mxfp8.BlockSize; j++ {
				i := r*p.K + j
				var v float32
				if p.values != nil {
					v = p.values[base+i]
				} else {
					v = mxfp8.DecodeE4M3(uint8(p.codes[base+i]))
				}
				out[i] = v * s
			}
		}
	}
	return out
}

// fakeQuant replaces v (a multiple of 32 long) by its MXFP8 round trip.
func fakeQuant(v []float32, codes []uint8) {
	for o := 0; o+mxfp8.BlockSize <= len(v); o += mxfp8.BlockSize {
		blk := v[o : o+mxfp8.BlockSize]
		s := mxfp8.QuantizeBlock(codes, blk)
		mxfp8.DequantizeBlock(blk, codes, s)
	}
}

func bf16(f float32) float32 { return graph.BFloat16ToFloat32(graph.Float32ToBFloat16(f)) }

// KernelRouting returns, for an ai.mok::MoKDispatchFFNCombine node, the
// values carrying its routing (topk_experts, router_weights); ok is false
// for any other node. A block-by-block verify forces the reference's
// routing through them.
func KernelRouting(n *pb.NodeProto) (ids, weights string, ok bool) {
	if n.GetDomain() != Domain || n.GetOpType() != OpType || len(n.Input) <= max(InTopKExperts, InRouterWeights) {
		return "", "", false
	}
	return n.Input[InTopKExperts], n.Input[InRouterWeights], true
}
