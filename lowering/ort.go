package lowering

import (
	"errors"
	"fmt"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/internal/ortmoe"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// TargetORT is the --target value that lowers to ONNX Runtime's contrib ops.
const TargetORT = "ort"

// ErrORTUnsupported is wrapped by LowerORT's error when some fused node has
// semantics ONNX Runtime's com.microsoft::MoE / QMoE cannot express.
var ErrORTUnsupported = errors.New("ONNX Runtime's MoE op cannot express the block")

// ORTOptions control LowerORT.
type ORTOptions struct {
	// Quant is "" (float com.microsoft::MoE), "int8" or "int4"
	// (com.microsoft::QMoE with symmetric weights and the default zero point).
	Quant string
	// BlockSize is QMoE's block_size (a power of two >= 16 dividing H and
	// I); 0 means one scale per output row.
	BlockSize int
	// Partial lowers the nodes ONNX Runtime can take and keeps the others
	// as ai.mok::MoE (with their function bodies), instead of refusing.
	Partial bool
}

// ORTBlock is what happened to one fused node.
type ORTBlock struct {
	Node    string    `json:"node"`
	Spec    *moe.Spec `json:"spec,omitempty"`
	Lowered bool      `json:"lowered"`
	// Op is the ONNX Runtime op written ("com.microsoft::MoE" or "::QMoE").
	Op string `json:"op,omitempty"`
	// ORTNode is the name of the node written.
	ORTNode string `json:"ort_node,omitempty"`
	// Attrs are its attributes.
	Attrs map[string]any `json:"attributes,omitempty"`
	// SharedExpert says how a shared expert was emitted.
	SharedExpert string `json:"shared_expert,omitempty"`
	// Precision says, for a float16 or bfloat16 block, what the op computes
	// in: float32 between a Cast in and a Cast out, the weights widened
	// exactly (ONNX Runtime's MoE has no bfloat16 kernel at all).
	Precision string `json:"precision,omitempty"`
	// Unsupported lists the semantics ONNX Runtime's op lacks.
	Unsupported []string `json:"unsupported,omitempty"`
}

// ORTReport is LowerORT's account.
type ORTReport struct {
	SchemaVersion int        `json:"schema_version"`
	Target        string     `json:"target"`
	Quant         string     `json:"quant,omitempty"`
	BlockSize     int        `json:"block_size,omitempty"`
	Blocks        []ORTBlock `json:"blocks"`
}

// Summary is a one-line-per-block account.
func (r *ORTReport) Summary() string {
	var b strings.Builder
	n := 0
	for _, blk := range r.Blocks {
		if blk.Lowered {
			n++
		}
	}
	fmt.Fprintf(&b, "%d of %d fused nodes lowered to ONNX Runtime\n", n, len(r.Blocks))
	for _, blk := range r.Blocks {
		if blk.Lowered {
			fmt.Fprintf(&b, "  %s -> %s %s", blk.Node, blk.Op, blk.ORTNode)
			if blk.SharedExpert != "" {
				fmt.Fprintf(&b, " (shared expert: %s)", blk.SharedExpert)
			}
			if blk.Precision != "" {
				fmt.Fprintf(&b, " (%s)", blk.Precision)
			}
			b.WriteString("\n")
		} else {
			fmt.Fprintf(&b, "  %s kept: %s\n", blk.Node, strings.Join(blk.Unsupported, "; "))
		}
	}
	return b.String()
}

// ORTUnsupported lists the semantics of s that ONNX Runtime's
// com.microsoft::MoE (quant "") or QMoE (quant "int8"/"int4") cannot
// express; empty means the block lowers exactly.
func ORTUnsupported(s *moe.Spec, quant string) []string {
	var why []string
	if s.RouterActivation == moe.SparseMixer {
		why = append(why, "sparsemixer routing (use_sparse_mixer is ignored by ONNX Runtime 1.30's CPU MoE, which routes by softmax top-k)")
	} else if s.RouterActivation != moe.Softmax {
		why = append(why, fmt.Sprintf("%s routing (the op routes with a softmax over the router logits)", s.RouterActivation))
	}
	if s.NGroup > 1 {
		why = append(why, fmt.Sprintf("group-limited top-k routing (n_group %d, topk_group %d)", s.NGroup, s.TopKGroup))
	}
	if s.CorrectionBias {
		why = append(why, "a score-correction bias (experts chosen by biased scores, weighted by unbiased ones)")
	}
	if s.WeightsOnInput {
		why = append(why, "routing weights applied to the expert input (weights_on_input)")
	}
	if _, reason := ortActivation(s); reason != "" {
		why = append(why, reason)
	}
	normalized := s.NormalizeTopK || s.RouterOrder == moe.TopKThenActivation
	if quant != "" && !normalized {
		why = append(why, "unnormalised top-k weights (ONNX Runtime 1.30's CPU QMoE always renormalises them)")
	}
	return why
}

// LowerORT replaces each fused ai.mok::MoE node by ONNX Runtime's
// com.microsoft::MoE (or QMoE with opt.Quant): the input flattened to
// [T, H]; the router logits as a standard Gemm (router weight and bias);
// fc1 = gate and up interleaved per row ([E, 2I, H], swiglu_fusion 1) with
// activation_type swiglu and activation_alpha / activation_beta /
// swiglu_limit pinning the variant (swiglu: 1, 0, FLT_MAX; swiglu_clamped:
// 1, 0, L; swiglu_oai: α, 1, L); fc2 = down, scaled by
// routed_scaling_factor; expert biases interleaved likewise;
// normalize_routing_weights from normalize_topk (a softmax after top-k is a
// renormalised softmax before it); a shared expert as standard ops added
// to the op's output; the result reshaped back. Nodes with semantics the op
// lacks (ORTUnsupported) are refused, naming the node and the semantics.
// The routed tensors (fc1, fc2, QMoE's codes and scales) are computed
// expert by expert, from ranged reads of the fused stacks, when m is saved
// (graph.Model.SetDeferred), so m's source must stay open until then.
func LowerORT(m *graph.Model, opt ORTOptions) (*ORTReport, error) {
	rep := &ORTReport{SchemaVersion: 1, Target: TargetORT, Quant: opt.Quant, BlockSize: opt.BlockSize}
	bits := 0
	switch opt.Quant {
	case "":
		if opt.BlockSize != 0 {
			return rep, fmt.Errorf("block size %d needs Quant int8 or int4 (mokopt lower --quant)", opt.BlockSize)
		}
	case "int8":
		bits = 8
	case "int4":
		bits = 4
	default:
		return rep, fmt.Errorf("quant %q (want int8 or int4)", opt.Quant)
	}
	if opt.BlockSize != 0 && (opt.BlockSize < 16 || opt.BlockSize&(opt.BlockSize-1) != 0) {
		return rep, fmt.Errorf("block size %d is not a power of two >= 16", opt.BlockSize)
	}
	g := m.Graph()
	fused, err := fusedNodes(g)
	if err != nil {
		return rep, err
	}
	if err := moe.CheckBodies(m); err != nil {
		return rep, err
	}
	if m.Opset("") < 13 {
		return rep, fmt.Errorf("model imports default-domain opset %d; lowering needs >= 13", m.Opset(""))
	}
	var refusals []string
	type job struct {
		n   *pb.NodeProto
		blk int
	}
	var jobs []job
	for i, n := range fused {
		blk := ORTBlock{Node: n.GetName()}
		if blk.Node == "" {
			blk.Node = fmt.Sprintf("MoE_%d", i)
		}
		s, err := moe.SpecFromNode(n, nodeDims(g, n))
		if err != nil {
			blk.Unsupported = []string{err.Error()}
		} else {
			s.SharedGated = len(n.Input) > moe.InSharedGateW && n.Input[moe.InSharedGateW] != ""
			blk.Spec = s
			blk.Unsupported = ORTUnsupported(s, opt.Quant)
			for _, v := range constantWeights(g, n, s) {
				blk.Unsupported = append(blk.Unsupported, v.Message)
			}
			if bits > 0 {
				for _, d := range []int{s.Hidden, s.Inter} {
					if d%(8/bits) != 0 || (opt.BlockSize > 0 && d%opt.BlockSize != 0) {
						blk.Unsupported = append(blk.Unsupported, fmt.Sprintf("H %d / I %d do not divide into %d-bit packs and blocks of %d", s.Hidden, s.Inter, bits, opt.BlockSize))
						break
					}
				}
			}
		}
		if len(blk.Unsupported) > 0 {
			refusals = append(refusals, fmt.Sprintf("node %q: %s", blk.Node, strings.Join(blk.Unsupported, "; ")))
		} else {
			jobs = append(jobs, job{n, len(rep.Blocks)})
		}
		rep.Blocks = append(rep.Blocks, blk)
	}
	if len(refusals) > 0 && !opt.Partial {
		return rep, fmt.Errorf("%w: %s", ErrORTUnsupported, strings.Join(refusals, "; "))
	}
	candidates := map[string]bool{}
	drop := map[*pb.NodeProto]bool{}
	var added []*pb.NodeProto
	for _, j := range jobs {
		blk := &rep.Blocks[j.blk]
		nodes, err := emitORT(m, g, j.n, blk, bits, opt.BlockSize)
		if err != nil {
			return rep, fmt.Errorf("lowering %s to ONNX Runtime: %w", blk.Node, err)
		}
		added = append(added, nodes...)
		drop[j.n] = true
		for _, in := range j.n.Input {
			if in != "" {
				candidates[in] = true
			}
		}
	}
	g.RemoveNodes(drop)
	for _, n := range added {
		g.AddNode(n)
	}
	removeOrphans(g, candidates)
	pruneFunctions(m)
	m.SetOpset(ortmoe.Domain, 1)
	if err := g.Sort(); err != nil {
		return rep, err
	}
	return rep, nil
}

// emitORT writes the nodes and initializers replacing fused node n.
func emitORT(m *graph.Model, g *graph.Graph, n *pb.NodeProto, blk *ORTBlock, bits, blockSize int) ([]*pb.NodeProto, error) {
	s := blk.Spec
	E, H, I, Is := s.NumExperts, s.Hidden, s.Inter, s.SharedInter
	read := func(pos int) ([]float32, error) {
		if pos >= len(n.Input) || n.Input[pos] == "" {
			return nil, nil
		}
		t := g.Initializer(n.Input[pos])
		if t == nil {
			return nil, fmt.Errorf("%s (%q) is not an initializer", moe.InputNames[pos], n.Input[pos])
		}
		b, err := m.TensorBytes(t)
		if err != nil {
			return nil, err
		}
		return graph.DecodeFloat32(graph.DataType(t), b)
	}
	// The routed experts' stacks are not read here: their fc1 / fc2 (or
	// QMoE's codes and scales) are deferred tensors computed expert by
	// expert, from ranged reads, when the model is saved.
	var w moe.Weights
	for _, r := range []struct {
		pos int
		dst *[]float32
	}{{moe.InRouterW, &w.RouterW}, {moe.InRouterB, &w.RouterB},
		{moe.InGateBias, &w.GateB}, {moe.InUpBias, &w.UpB}, {moe.InDownBias, &w.DownB},
		{moe.InSharedGate, &w.SharedGate}, {moe.InSharedUp, &w.SharedUp}, {moe.InSharedDown, &w.SharedDown}, {moe.InSharedGateW, &w.SharedGateW}} {
		var err error
		if *r.dst, err = read(r.pos); err != nil {
			return nil, err
		}
	}
	routed, err := ortRoutedSources(m, g, n, s, &w)
	if err != nil {
		return nil, err
	}
	if err := moe.CheckWeights(s, &w); err != nil {
		return nil, err
	}
	prefix := g.UniqueName(blk.Node + "/ort")
	b := &moe.Builder{Prefix: prefix + "/t"}
	init := func(role string, dims []int64, v []float32) string {
		name := g.UniqueName(prefix + "/" + role)
		g.AddInitializer(moe.Float32Tensor(name, dims, v))
		return name
	}
	// Half-precision I/O: the op and the shared expert run on the input cast
	// to float32, and the result is cast back to the block's type.
	x, out := n.Input[moe.InHidden], n.Output[0]
	if s.IOType != "" {
		x = b.Op("Cast", []string{x}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT)))
		out = prefix + "/y_float"
		blk.Precision = ortHalfPrecision(s.IOType)
	}
	finish := func() []*pb.NodeProto {
		if s.IOType != "" {
			b.Nodes = append(b.Nodes, graph.NewNode("Cast", "", prefix+"/Cast_y_"+s.IOType, []string{out}, []string{n.Output[0]}, graph.IntAttr("to", int64(s.IOElemType()))))
		}
		return b.Nodes
	}
	x2 := b.Op("Reshape", []string{x, b.Ints(-1, int64(H))})
	gemmIn := []string{x2, init("router_weight", []int64{int64(E), int64(H)}, w.RouterW)}
	if w.RouterB != nil {
		gemmIn = append(gemmIn, init("router_bias", []int64{int64(E)}, w.RouterB))
	}
	logits := b.Op("Gemm", gemmIn, graph.IntAttr("transB", 1))
	if s.RouterLogits { // the optional router_logits output, which the op lacks: the Gemm's, kept beside it
		b.Nodes = append(b.Nodes, graph.NewNode("Identity", "", prefix+"/router_logits", []string{logits}, []string{n.Output[moe.OutRouterLogits]}))
	}
	// ONNX Runtime 1.30's CPU kernel may run in place on its input
	// (MayInplace(0, 0)), and in place it loses rows of the routed output
	// when normalize_routing_weights is 0 (measured: qwen2_moe_full's block
	// output was the shared expert alone; a private copy of the input fed
	// only to the op lost 80 of 80 elements of some rows). So the input is
	// kept alive past the op: the result goes through Where(false, input,
	// op output), which is exact and costs one elementwise pass.
	xm := x

	a, f, fc1b := ortFC1Bias(s, &w)
	routed.f = f
	scale := routed.scale
	fc2b := w.DownB
	if scale != 1 {
		if w.DownB != nil {
			fc2b = make([]float32, len(w.DownB))
			for i, v := range w.DownB {
				fc2b[i] = v * scale
			}
		}
	}
	if s.ExpertBias && fc2b == nil {
		fc2b = make([]float32, E*H)
	}
	e64, h64, i64 := int64(E), int64(H), int64(I)
	opt := func(role string, dims []int64, v []float32) string {
		if v == nil {
			return ""
		}
		return init(role, dims, v)
	}
	var inputs []string
	op := ortmoe.OpMoE
	if bits == 0 {
		deferred := func(role string, dims []int64, mk func() func(int) ([]float32, error)) string {
			name := g.UniqueName(prefix + "/" + role)
			deferFloat32(m, g, name, dims, mk)
			return name
		}
		inputs = []string{xm, logits,
			deferred("fc1_experts_weights", []int64{e64, f * i64, h64}, routed.fc1), opt("fc1_experts_bias", []int64{e64, f * i64}, fc1b),
			deferred("fc2_experts_weights", []int64{e64, h64, i64}, routed.fc2), opt("fc2_experts_bias", []int64{e64, h64}, fc2b)}
	} else {
		op = ortmoe.OpQMoE
		a.Quantized, a.Bits, a.BlockSize = true, bits, blockSize
		a.Normalize = true // QMoE on ONNX Runtime 1.30's CPU always renormalises
		q1, s1 := deferQuantized(m, g, prefix, "fc1", E, int(f)*I, H, bits, blockSize, routed.fc1)
		q2, s2 := deferQuantized(m, g, prefix, "fc2", E, H, I, bits, blockSize, routed.fc2)
		inputs = []string{xm, logits, q1, s1, opt("fc1_experts_bias", []int64{e64, f * i64}, fc1b), q2, s2, opt("fc2_experts_bias", []int64{e64, h64}, fc2b)}
	}
	for len(inputs) > 0 && inputs[len(inputs)-1] == "" {
		inputs = inputs[:len(inputs)-1]
	}
	ortName := g.UniqueName(prefix + "/" + op)
	raw := prefix + "/" + op + "_out"
	b.Nodes = append(b.Nodes, graph.NewNode(op, ortmoe.Domain, ortName, inputs, []string{raw}, a.NodeAttrs()...))
	no := b.Op("Constant", nil, graph.TensorAttr("value", &pb.TensorProto{DataType: proto.Int32(int32(pb.TensorProto_BOOL)), Int32Data: []int32{0}}))
	y := prefix + "/keep_input"
	if Is == 0 {
		y = out
	}
	b.Nodes = append(b.Nodes, graph.NewNode("Where", "", prefix+"/keep_input_alive", []string{no, x, raw}, []string{y}))
	blk.Lowered, blk.Op, blk.ORTNode = true, ortmoe.Domain+"::"+op, ortName
	blk.Attrs = map[string]any{}
	for _, at := range a.NodeAttrs() {
		switch at.GetType() {
		case pb.AttributeProto_INT:
			blk.Attrs[at.GetName()] = at.GetI()
		case pb.AttributeProto_FLOAT:
			blk.Attrs[at.GetName()] = at.GetF()
		case pb.AttributeProto_STRING:
			blk.Attrs[at.GetName()] = string(at.GetS())
		}
	}
	if Is == 0 {
		return finish(), nil
	}
	// The shared expert reads the block input as it comes (MatMul takes
	// [..., H]) and is added to the op's output.
	tr := func(v []float32, r, c int) []float32 { // [r, c] -> [c, r]
		out := make([]float32, len(v))
		for i := 0; i < r; i++ {
			for j := 0; j < c; j++ {
				out[j*r+i] = v[i*c+j]
			}
		}
		return out
	}
	is64 := int64(Is)
	sg := b.Op("MatMul", []string{x, init("shared_gate_t", []int64{h64, is64}, tr(w.SharedGate, Is, H))})
	su := b.Op("MatMul", []string{x, init("shared_up_t", []int64{h64, is64}, tr(w.SharedUp, Is, H))})
	sa := b.Op("Mul", []string{b.Op("Mul", []string{sg, b.Op("Sigmoid", []string{sg})}), su})
	sd := b.Op("MatMul", []string{sa, init("shared_down_t", []int64{is64, h64}, tr(w.SharedDown, H, Is))})
	blk.SharedExpert = "SwiGLU in standard ops (MatMul, Sigmoid, Mul) added to the op's output"
	if w.SharedGateW != nil {
		gate := b.Op("Sigmoid", []string{b.Op("MatMul", []string{x, init("shared_gate_weight_t", []int64{h64, 1}, w.SharedGateW)})})
		sd = b.Op("Mul", []string{sd, gate})
		blk.SharedExpert = "sigmoid-gated SwiGLU in standard ops (MatMul, Sigmoid, Mul) added to the op's output"
	}
	b.Nodes = append(b.Nodes, graph.NewNode("Add", "", prefix+"/add_shared", []string{y, sd}, []string{out}))
	return finish(), nil
}

// ortRoutedSources checks fused node n's routed gate, up and down stacks
// (float [E, I, H], [E, I, H], [E, H, I] initializers), sets their readers
// in w for CheckWeights, and returns their per-expert producers.
func ortRoutedSources(m *graph.Model, g *graph.Graph, n *pb.NodeProto, s *moe.Spec, w *moe.Weights) (*ortExperts, error) {
	E, H, I := s.NumExperts, s.Hidden, s.Inter
	o := &ortExperts{s: s, scale: s.RoutedScalingFactor}
	if o.scale == 0 {
		o.scale = 1
	}
	for _, r := range []struct {
		pos  int
		dims []int
		src  *source
		rd   *moe.ExpertReader
	}{{moe.InGate, []int{E, I, H}, &o.gate, &w.GateR}, {moe.InUp, []int{E, I, H}, &o.up, &w.UpR}, {moe.InDown, []int{E, H, I}, &o.down, &w.DownR}} {
		if r.pos >= len(n.Input) || n.Input[r.pos] == "" {
			continue
		}
		t := g.Initializer(n.Input[r.pos])
		if t == nil {
			return nil, fmt.Errorf("%s (%q) is not an initializer", moe.InputNames[r.pos], n.Input[r.pos])
		}
		src, err := newSource(m, t, r.dims...)
		if err != nil {
			return nil, err
		}
		*r.src, *r.rd = src, reader(src)
	}
	return o, nil
}

// ortHalfPrecision is ORTBlock.Precision for a block of I/O type io.
func ortHalfPrecision(io string) string {
	p := "float32 MoE between Casts from " + io + ", weights widened exactly"
	if io == moe.IOBFloat16 {
		p += "; ONNX Runtime registers com.microsoft::MoE for float and float16 only, on CPU and CUDA"
	}
	return p
}
