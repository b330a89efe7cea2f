package lowering

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/mokopt/mokopt/moe"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/kernel/mxfp8"
)

// AddKernels adds the Go kernel of ai.mok::MoKDispatchFFNCombine (MXFP8
// as the MoK kernel computes it) to k and returns k. Nothing is registered
// on import: without it the interpreter runs the node's function body.
//
// The routed weights and their scales are read one expert at a time where
// the run streams them (eval.Kernels.Streams): a lowered block whose
// weights lie in a side file is evaluated holding a few experts'
// dequantized matrices, not the block's.
func AddKernels(k *eval.Kernels) *eval.Kernels {
	return k.Add(Domain, OpType, evalKernel).Streams(Domain, OpType, InGate, InGateScale, InUp, InUpScale, InDown, InDownScale)
}

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
	routed, err := routedRows(ctx, x.F32, ids.I64, T, H, k, I, [3]*pair{gate, up, down}, limit, actQuant)
	if err != nil {
		return nil, err
	}
	out := make([]float32, T*H)
	threads := max(1, ctx.Threads())
	var wgp sync.WaitGroup
	for w := 0; w < threads; w++ {
		wgp.Add(1)
		go func(w int) {
			defer wgp.Done()
			h, acc := make([]float32, Is), make([]float32, H)
			for t := w; t < T; t += threads {
				xt := x.F32[t*H : (t+1)*H]
				// Shared expert, BF16.
				for i := 0; i < Is; i++ {
					gv, uv := moe.Dot(xt, sg.F32[i*H:(i+1)*H]), moe.Dot(xt, su.F32[i*H:(i+1)*H])
					h[i] = bf16(gv * moe.Logistic(gv) * uv)
				}
				for j := 0; j < H; j++ {
					acc[j] = bf16(moe.Dot(h, sd.F32[j*Is:(j+1)*Is]))
				}
				// Routed experts, in the order of their slots.
				for j := 0; j < k; j++ {
					wt, yr := rw.F32[t*k+j], routed[(t*k+j)*H:(t*k+j+1)*H]
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

// expertBudget bounds the dequantized expert matrices the routed pass holds
// at once (one expert's gate, up and down per worker): the routed weights
// are read expert by expert, so that a block is never held whole.
const expertBudget = 1 << 30

// routedRows returns, for every routing slot t·k+j, the bf16-rounded output
// row of expert ids[t·k+j] on token t: the experts in use are dequantized
// one at a time (gate, up, down of one expert per worker, read by ranges
// where the run streams them) and applied to every slot that chose them.
func routedRows(ctx *eval.OpContext, x []float32, ids []int64, T, H, k, I int, w [3]*pair, limit float32, actQuant bool) ([]float32, error) {
	xq := slices.Clone(x)
	codes := make([]uint8, mxfp8.BlockSize)
	if actQuant {
		for t := 0; t < T; t++ {
			fakeQuant(xq[t*H:(t+1)*H], codes)
		}
	}
	slots := make([][]int, w[0].E)
	for i, e := range ids {
		slots[e] = append(slots[e], i)
	}
	var used []int
	for e, s := range slots {
		if len(s) > 0 {
			used = append(used, e)
		}
	}
	routed := make([]float32, T*k*H)
	workers := min(max(1, ctx.Threads()), len(used), max(1, expertBudget/(3*4*I*H)))
	var next atomic.Int64
	errs := make([]error, workers)
	var wgp sync.WaitGroup
	for wk := 0; wk < workers; wk++ {
		wgp.Add(1)
		go func(wk int) {
			defer wgp.Done()
			var mats [3][]float32
			for i := range mats {
				mats[i] = make([]float32, I*H)
			}
			g, u, h := make([]float32, I), make([]float32, I), make([]float32, I)
			codes := make([]uint8, mxfp8.BlockSize)
			for n := int(next.Add(1)) - 1; n < len(used); n = int(next.Add(1)) - 1 {
				e := used[n]
				for i, p := range w {
					if err := p.expert(e, mats[i]); err != nil {
						errs[wk] = err
						return
					}
				}
				wg, wu, wd := mats[0], mats[1], mats[2]
				for _, slot := range slots[e] {
					xt := xq[(slot/k)*H : (slot/k+1)*H]
					for i := 0; i < I; i++ {
						g[i], u[i] = moe.Dot(xt, wg[i*H:(i+1)*H]), moe.Dot(xt, wu[i*H:(i+1)*H])
						if limit > 0 {
							g[i] = min(g[i], limit)
							u[i] = max(min(u[i], limit), -limit)
						}
						h[i] = g[i] * moe.Logistic(g[i]) * u[i]
					}
					if actQuant {
						fakeQuant(h, codes)
					}
					yr := routed[slot*H : (slot+1)*H]
					for c := range yr {
						yr[c] = bf16(moe.Dot(h, wd[c*I:(c+1)*I]))
					}
				}
			}
		}(wk)
	}
	wgp.Wait()
	return routed, errors.Join(errs...)
}

// pair is one MXFP8 weight tensor as the interpreter hands it over: its
// E4M3 values (FLOAT8E4M3FN, or float after DecodeFP8ForEval) or raw code
// bytes (an integer tensor), and its UE8M0 scales, either in memory or
// streamed from the model's file (eval.Tensor.ReadFloat32 reads both).
type pair struct {
	name         string
	E, N, K      int
	data, scales *eval.Tensor
	rawCodes     bool // data holds code bytes as integers, not their values
}

func newPair(d, s *eval.Tensor, name string) (*pair, error) {
	if d.Rank() != 3 {
		return nil, fmt.Errorf("%s must be [E, N, K], got %v", name, d.Shape)
	}
	p := &pair{name: name, E: d.Shape[0], N: d.Shape[1], K: d.Shape[2], data: d, scales: s}
	if err := mxfp8.CheckShape(p.E, p.N, p.K); err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	switch {
	case d.Streamed() || d.F32 != nil:
		p.rawCodes = d.F32 == nil && graph.ElemBits(d.DType) == 8 && !isFloat8(d.DType)
	case d.I64 != nil && graph.ElemBits(d.DType) == 8:
		p.rawCodes = true
	default:
		return nil, fmt.Errorf("%s must hold E4M3 codes (integer) or their values (float), got %s", name, d.DType)
	}
	if n := numel(s.Shape); (!s.Streamed() && s.I64 == nil) || graph.ElemBits(s.DType) != 8 || n != mxfp8.ScaleLen(p.E, p.N, p.K) {
		return nil, fmt.Errorf("%s scales must be uint8 %v, got %s%v", name, mxfp8.ScaleShape(p.E, p.N, p.K), s.DType, s.Shape)
	}
	return p, nil
}

// isFloat8 reports whether dt is one of the FLOAT8 types (whose values the
// interpreter reads decoded).
func isFloat8(dt pb.TensorProto_DataType) bool {
	switch dt {
	case pb.TensorProto_FLOAT8E4M3FN, pb.TensorProto_FLOAT8E4M3FNUZ, pb.TensorProto_FLOAT8E5M2, pb.TensorProto_FLOAT8E5M2FNUZ:
		return true
	}
	return false
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// expert writes expert e's dequantized [N, K] matrix into dst (N·K long),
// reading only that expert's values and scales (an expert's scale tiles
// are contiguous: N is a multiple of the tile height).
func (p *pair) expert(e int, dst []float32) error {
	nk := p.N * p.K
	if err := p.data.ReadFloat32(dst, e*nk); err != nil {
		return fmt.Errorf("%s expert %d: %w", p.name, e, err)
	}
	sc := make([]float32, nk/mxfp8.BlockSize)
	if err := p.scales.ReadFloat32(sc, e*len(sc)); err != nil {
		return fmt.Errorf("%s scales of expert %d: %w", p.name, e, err)
	}
	for r := 0; r < p.N; r++ {
		for kb := 0; kb < p.K/mxfp8.BlockSize; kb++ {
			s := mxfp8.ScaleValue(uint8(sc[mxfp8.ScaleIndex(r, kb, p.K)]))
			row := dst[r*p.K+kb*mxfp8.BlockSize : r*p.K+(kb+1)*mxfp8.BlockSize]
			for j, v := range row {
				if p.rawCodes {
					v = mxfp8.DecodeE4M3(uint8(v))
				}
				row[j] = v * s
			}
		}
	}
	return nil
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
