package models

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// Expert-parallel forms BuildRank and BuildSharded write.
const (
	// FormORTAllToAll is a per-rank model with ONNX Runtime collectives:
	// every (token, slot) row is sent to the rank owning its expert with
	// com.microsoft::AllToAll (rows for other ranks zeroed, [G·T·k, H]),
	// together with its local expert id (and, placed before combine, its
	// routing weight); the rank runs its E/G experts on the received rows
	// (GatherND of the local stacked weights, batched MatMuls) and a second
	// AllToAll sends the results back, summed over source ranks.
	FormORTAllToAll = "ort-alltoall"
	// FormORTAllGather is a per-rank model with ONNX Runtime collectives in
	// Megatron's all-gather token dispatcher pattern: the tokens, top-k ids
	// (and, placed before combine, weights) of every rank are gathered with
	// com.microsoft::AllGather; the rank runs its E/G experts densely on all
	// gathered tokens, masked to the slots routed to them; the partial sums
	// are added over ranks with com.microsoft::AllReduce and the rank keeps
	// its own rows (Slice at rank·T).
	FormORTAllGather = "ort-allgather"
	// FormDeepEP is a per-rank model with DeepEP-style custom nodes
	// deep_ep::dispatch and deep_ep::combine (semantics in package ep): the
	// rank runs its E/G experts densely on the received tokens, weighted by
	// the received top-k weights (before combine) or per slot, the weights
	// applied on the token's rank after combine.
	FormDeepEP = "deepep"
	// FormORTSharded is a per-rank model with ONNX Runtime's
	// com.microsoft::ShardedMoE: the rank's E/G experts ([E/G, …] fc1/fc2/fc3,
	// local_experts_start_index), the router logits of the replicated router;
	// every rank sees all tokens and returns the whole output (the op
	// broadcasts the expert outputs). The routing weights apply after the
	// exchange, on every rank.
	FormORTSharded = "ort-sharded"
	// FormSharding is one global model (the batched shape) whose expert
	// weights carry ONNX IR 10+ sharding annotations (NodeProto
	// device_configurations: axis 0 of each stacked expert weight split in
	// G shards over the devices of a ModelProto configuration).
	FormSharding = "sharding"
)

// Placements of the router-weight multiply in an EP graph.
const (
	// BeforeCombine multiplies each expert output by its routing weight on
	// the expert's rank, before combine (as DeepEP-based stacks do).
	BeforeCombine = "before_combine"
	// AfterCombine multiplies on the token's rank after combine (as MoK does).
	AfterCombine = "after_combine"
)

// EP metadata keys of per-rank models (metadata_props).
const (
	MetaEPRank = "ai.mok.ep_rank"
	MetaEPSize = "ai.mok.ep_size"
)

// EPConfig describes an expert-parallel model: the base Config (its Shape
// is ignored; Tokens is per rank), the form, the group size and the
// placement of the router-weight multiply.
type EPConfig struct {
	Config
	Form      string `json:"form"`
	EP        int    `json:"ep"`
	Placement string `json:"placement"`
}

// EPForms lists the valid EPConfig.Form values.
var EPForms = []string{FormORTAllToAll, FormORTAllGather, FormDeepEP, FormORTSharded, FormSharding}

func (c EPConfig) normalized() (EPConfig, error) {
	c.Shape = ShapeBatched
	if c.Placement == "" {
		c.Placement = BeforeCombine
	}
	base, err := c.Config.normalized()
	c.Config = base
	var errs []string
	if err != nil {
		errs = append(errs, err.Error())
	}
	switch c.Form {
	case FormORTAllToAll, FormORTAllGather, FormDeepEP, FormSharding:
	case FormORTSharded:
		c.Placement = AfterCombine
		if c.SharedInter > 0 {
			errs = append(errs, "form ort-sharded has no shared expert (com.microsoft::ShardedMoE)")
		}
		if c.Router != moe.Softmax {
			errs = append(errs, "form ort-sharded routes with a softmax only")
		}
	default:
		errs = append(errs, fmt.Sprintf("EP form %q (want one of %s)", c.Form, strings.Join(EPForms, ", ")))
	}
	if c.Placement != BeforeCombine && c.Placement != AfterCombine {
		errs = append(errs, fmt.Sprintf("placement %q (want %s or %s)", c.Placement, BeforeCombine, AfterCombine))
	}
	if c.EP < 1 || c.Experts%max(c.EP, 1) != 0 {
		errs = append(errs, fmt.Sprintf("EP size %d does not divide %d experts", c.EP, c.Experts))
	}
	if len(errs) > 0 {
		return c, errors.New("invalid EP model config: " + strings.Join(errs, "; "))
	}
	return c, nil
}

// Validate reports whether c describes a model BuildRank/BuildSharded can make.
func (c EPConfig) Validate() error {
	_, err := c.normalized()
	return err
}

// Replicated reports whether every rank of the form sees all tokens (and
// returns the whole output) instead of its own share.
func (c EPConfig) Replicated() bool { return c.Form == FormORTSharded }

// Reference returns the single-rank model computing the same function as
// the EP group of c (the batched shape with the same weights); the merged
// global model must verify equal to it.
func (c EPConfig) Reference() Config {
	r := c.Config
	r.Shape = ShapeBatched
	return r
}

// BuildRank makes rank's model of an ort-alltoall or deepep EP group:
// input hidden_states [T, H] (this rank's tokens), output [T, H], the
// router replicated, the routed experts [rank·E/G, (rank+1)·E/G) stored
// locally, and MetaEPRank / MetaEPSize in metadata_props.
func BuildRank(c EPConfig, rank int) (*graph.Model, error) {
	c, err := c.normalized()
	if err != nil {
		return nil, err
	}
	if c.Form == FormSharding {
		return nil, errors.New("the sharding form is one global model: use BuildSharded")
	}
	if rank < 0 || rank >= c.EP {
		return nil, fmt.Errorf("rank %d not in 0..%d", rank, c.EP-1)
	}
	b, err := newEPBuilder(c)
	if err != nil {
		return nil, err
	}
	b.m.SetMetadata(MetaEPRank, strconv.Itoa(rank))
	b.m.SetMetadata(MetaEPSize, strconv.Itoa(c.EP))
	switch c.Form {
	case FormORTAllToAll, FormORTAllGather, FormORTSharded:
		b.m.SetOpset(ORTDomain, 1)
	case FormDeepEP:
		b.m.SetOpset(DeepEPDomain, 1)
	}
	h := InputName
	for l := 0; l < c.Layers; l++ {
		p := "layers." + strconv.Itoa(l) + "."
		var y string
		switch c.Form {
		case FormORTAllToAll:
			y = b.ortAllToAll(c, rank, l, p, h)
		case FormORTAllGather:
			y = b.ortAllGather(c, rank, l, p, h)
		case FormORTSharded:
			y = b.ortSharded(c, rank, l, p, h)
		default:
			y = b.deepEP(c, rank, l, p, h)
		}
		h = b.residual(p, l, h, y)
	}
	return b.m, nil
}

// DeepEPDomain is the custom domain of the deepep form's dispatch/combine.
const DeepEPDomain = "deep_ep"

func newEPBuilder(c EPConfig) (*builder, error) {
	b := newBuilder(c.Config, "mokopt_synthetic_ep_moe")
	js, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	b.m.SetMetadata(MetadataKey, string(js))
	b.g.Input = []*pb.ValueInfoProto{b.valueInfo(InputName)}
	b.g.Output = []*pb.ValueInfoProto{b.valueInfo(OutputName)}
	return b, nil
}

// localRange returns the local experts of rank.
func localRange(c EPConfig, rank int) (first, n int64) {
	L := int64(c.Experts / c.EP)
	return int64(rank) * L, L
}

// ortAllToAll writes one layer of the ort-alltoall form (see FormORTAllToAll).
func (b *builder) ortAllToAll(c EPConfig, rank, l int, p, h string) string {
	E, H, I, K, G := int64(c.Experts), int64(c.Hidden), int64(c.Inter), int64(c.TopK), int64(c.EP)
	first, L := localRange(c, rank)
	k := keysFor(c.Config, l)
	view, w, idx, _ := b.router(l, p, h)
	a2a := func(out, in string) string {
		b.g.Node = append(b.g.Node, graph.NewNode("AllToAll", ORTDomain, "node_"+out, []string{in}, []string{out}, graph.IntAttr("group_size", G)))
		return out
	}
	arange := make([]int64, G)
	for i := range arange {
		arange[i] = int64(i)
	}
	dst := b.node("Div", p+"dst_rank", []string{idx, b.scalarInt(L)})
	loc := b.node("Mod", p+"local_id", []string{idx, b.scalarInt(L)}, graph.IntAttr("fmod", 0))
	eq := b.node("Equal", p+"dst_onehot_bool", []string{b.node("Unsqueeze", p+"dst_unsq", []string{dst, b.vec(-1)}), b.vec(arange...)})
	oh := b.node("Cast", p+"dst_onehot", []string{eq}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT)))
	xk := b.node("Expand", p+"x_expand", []string{b.node("Unsqueeze", p+"x_unsq", []string{view, b.vec(1)}), b.vec(1, K, 1)})
	sx := b.node("Mul", p+"send_masked", []string{b.node("Unsqueeze", p+"x_slot", []string{xk, b.vec(2)}), b.node("Unsqueeze", p+"dst_col", []string{oh, b.vec(-1)})})
	sxt := b.node("Transpose", p+"send_by_rank", []string{sx}, graph.IntsAttr("perm", 2, 0, 1, 3))
	rx := a2a(p+"recv_x", b.node("Reshape", p+"send_x", []string{sxt, b.vec(-1, H)}, graph.IntAttr("allowzero", 0)))
	bcast := func(name, v string) string { // [T, k] -> [G·T·k], the same rows for every rank
		f := b.node("Reshape", p+name+"_row", []string{v, b.vec(1, -1)}, graph.IntAttr("allowzero", 0))
		e := b.node("Expand", p+name+"_bcast", []string{f, b.vec(G, 1)})
		return b.node("Reshape", p+name+"_send", []string{e, b.vec(-1)}, graph.IntAttr("allowzero", 0))
	}
	rid := a2a(p+"recv_local_id", bcast("local_id", loc))
	q := "model." + p + "mlp.experts."
	wgu := b.weight(q+"gate_up_proj", []int64{L, 2 * I, H}, gateUp(k.gate, k.up, E, I, H, false).rowsFrom(first*2*I, L*2*I))
	wdn := b.weight(q+"down_proj", []int64{L, H, I}, contiguous(k.down, first*H*I, L*H*I, I, c.Inter))
	idu := b.node("Unsqueeze", p+"recv_id_col", []string{rid, b.vec(-1)})
	wg := b.node("GatherND", p+"gate_up_w", []string{wgu, idu}, graph.IntAttr("batch_dims", 0))
	gu := b.node("Squeeze", p+"gate_up", []string{b.node("MatMul", p+"gate_up_bmm", []string{wg, b.node("Unsqueeze", p+"x_col", []string{rx, b.vec(-1)})}), b.vec(-1)})
	g, u := p+"gate", p+"up"
	b.g.Node = append(b.g.Node, graph.NewNode("Split", "", "node_"+p+"split", []string{gu}, []string{g, u},
		graph.IntAttr("axis", 1), graph.IntAttr("num_outputs", 2)))
	a := b.swiglu(p, g, u)
	wd := b.node("GatherND", p+"down_w", []string{wdn, idu}, graph.IntAttr("batch_dims", 0))
	d := b.node("Squeeze", p+"down", []string{b.node("MatMul", p+"down_bmm", []string{wd, b.node("Unsqueeze", p+"act_col", []string{a, b.vec(-1)})}), b.vec(-1)})
	if c.Placement == BeforeCombine {
		rw := a2a(p+"recv_weight", bcast("weight", w))
		d = b.node("Mul", p+"weighted", []string{d, b.node("Unsqueeze", p+"recv_weight_col", []string{rw, b.vec(-1)})})
	}
	back := a2a(p+"combined", d)
	ys := b.node("ReduceSum", p+"combined_sum", []string{b.node("Reshape", p+"combined_by_rank", []string{back, b.vec(G, -1, H)}, graph.IntAttr("allowzero", 0)), b.vec(0)},
		graph.IntAttr("keepdims", 0), graph.IntAttr("noop_with_empty_axes", 0))
	if c.Placement == AfterCombine {
		wf := b.node("Unsqueeze", p+"weight_col", []string{b.node("Reshape", p+"weight_flat", []string{w, b.vec(-1)}, graph.IntAttr("allowzero", 0)), b.vec(-1)})
		ys = b.node("Mul", p+"weighted", []string{ys, wf})
	}
	y := b.node("ReduceSum", p+"routed", []string{b.node("Reshape", p+"per_slot", []string{ys, b.vec(-1, K, H)}, graph.IntAttr("allowzero", 0)), b.vec(1)},
		graph.IntAttr("keepdims", 0), graph.IntAttr("noop_with_empty_axes", 0))
	return b.shared(l, p, view, y)
}

// deepEP writes one layer of the deepep form (see FormDeepEP).
func (b *builder) deepEP(c EPConfig, rank, l int, p, h string) string {
	E, G := int64(c.Experts), int64(c.EP)
	_, L := localRange(c, rank)
	view, w, idx, _ := b.router(l, p, h)
	rx, rid, rw, hd := p+"recv_x", p+"recv_topk_idx", p+"recv_topk_weights", p+"handle"
	b.g.Node = append(b.g.Node, graph.NewNode("dispatch", DeepEPDomain, "node_"+p+"dispatch", []string{view, idx, w}, []string{rx, rid, rw, hd},
		graph.IntAttr("num_ranks", G), graph.IntAttr("num_experts", E)))
	arange := make([]int64, L)
	for i := range arange {
		arange[i] = int64(i)
	}
	eq := b.node("Equal", p+"local_onehot_bool", []string{b.node("Unsqueeze", p+"recv_idx_unsq", []string{rid, b.vec(-1)}), b.vec(arange...)})
	oh := b.node("Cast", p+"local_onehot", []string{eq}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT)))
	d := b.localDense(c, rank, l, p, rx)
	combine := func(out, in string) string {
		b.g.Node = append(b.g.Node, graph.NewNode("combine", DeepEPDomain, "node_"+out, []string{in, hd}, []string{out}, graph.IntAttr("num_ranks", G)))
		return out
	}
	if c.Placement == BeforeCombine {
		route := b.node("ReduceSum", p+"routing", []string{b.node("Mul", p+"onehot_weighted", []string{oh, b.node("Unsqueeze", p+"recv_w_col", []string{rw, b.vec(-1)})}), b.vec(1)},
			graph.IntAttr("keepdims", 0), graph.IntAttr("noop_with_empty_axes", 0))
		rt := b.node("Unsqueeze", p+"routing_col", []string{b.node("Transpose", p+"routing_t", []string{route}, graph.IntsAttr("perm", 1, 0)), b.vec(-1)})
		y := b.node("ReduceSum", p+"local_sum", []string{b.node("Mul", p+"weighted", []string{d, rt}), b.vec(0)},
			graph.IntAttr("keepdims", 0), graph.IntAttr("noop_with_empty_axes", 0))
		return b.shared(l, p, view, combine(p+"combined", y))
	}
	dt := b.node("Transpose", p+"down_by_row", []string{d}, graph.IntsAttr("perm", 1, 0, 2))
	ys := b.node("MatMul", p+"per_slot", []string{oh, dt}) // [R, k, H]
	cy := combine(p+"combined", ys)
	m := b.node("Mul", p+"weighted", []string{cy, b.node("Unsqueeze", p+"weight_col", []string{w, b.vec(-1)})})
	y := b.node("ReduceSum", p+"routed", []string{m, b.vec(1)}, graph.IntAttr("keepdims", 0), graph.IntAttr("noop_with_empty_axes", 0))
	return b.shared(l, p, view, y)
}

// rowsFrom restricts s to n physical rows starting at row first.
func (s *source) rowsFrom(first, n int64) *source {
	inner := s.row
	return &source{rows: n, rowLen: s.rowLen, step: s.step, row: func(r int64) (uint64, int64, int64) { return inner(first + r) }}
}

// ShardingConfig is the name of the device configuration BuildSharded writes.
const ShardingConfig = "ep"

// BuildSharded makes the sharding form: the global batched model whose
// GatherND nodes reading the stacked expert weights carry a
// device_configurations entry that splits axis 0 of the weight into EP
// shards over the EP devices of ModelProto.configuration "ep" (IR 11).
func BuildSharded(c EPConfig) (*graph.Model, error) {
	c, err := c.normalized()
	if err != nil {
		return nil, err
	}
	if c.Form != FormSharding {
		return nil, fmt.Errorf("form %s is written one model per rank: use BuildRank", c.Form)
	}
	m, err := Build(c.Reference())
	if err != nil {
		return nil, err
	}
	devs := make([]string, c.EP)
	ids := make([]int64, c.EP)
	for i := range devs {
		devs[i] = "cuda:" + strconv.Itoa(i)
		ids[i] = int64(i)
	}
	m.Proto.IrVersion = proto.Int64(11)
	m.Proto.Configuration = []*pb.DeviceConfigurationProto{{Name: proto.String(ShardingConfig), NumDevices: proto.Int32(int32(c.EP)), Device: devs}}
	g := m.Graph()
	for _, n := range m.Proto.Graph.Node {
		if n.GetOpType() != "GatherND" {
			continue
		}
		t := g.Initializer(n.Input[0])
		if t == nil || len(t.GetDims()) != 3 || t.GetDims()[0] != int64(c.Experts) {
			continue
		}
		n.DeviceConfigurations = append(n.DeviceConfigurations, &pb.NodeDeviceConfigurationProto{
			ConfigurationId: proto.String(ShardingConfig),
			ShardingSpec: []*pb.ShardingSpecProto{{
				TensorName: proto.String(t.GetName()),
				Device:     ids,
				ShardedDim: []*pb.ShardedDimProto{{Axis: proto.Int64(0), SimpleSharding: []*pb.SimpleShardedDimProto{{
					Dim: &pb.SimpleShardedDimProto_DimValue{DimValue: int64(c.Experts)}, NumShards: proto.Int64(int64(c.EP))}}}},
			}},
		})
	}
	js, _ := json.Marshal(c)
	m.SetMetadata(MetadataKey, string(js))
	return m, nil
}

// EPSpec is the moe.Spec of every block of c's global model, with ep_size
// set (expert_offset 0).
func EPSpec(c EPConfig) (moe.Spec, error) {
	c, err := c.normalized()
	if err != nil {
		return moe.Spec{}, err
	}
	s, err := Spec(c.Reference())
	s.EPSize = c.EP
	return s, err
}

// localDense runs the L local experts of layer l densely on x [R, H]: the
// stacked gate/up [L, H, I] and down [L, I, H] MatMuls; it returns the
// expert outputs [L, R, H].
func (b *builder) localDense(c EPConfig, rank, l int, p, x string) string {
	E, H, I := int64(c.Experts), int64(c.Hidden), int64(c.Inter)
	first, L := localRange(c, rank)
	k := keysFor(c.Config, l)
	q := "model." + p + "mlp."
	wg := b.weight(q+"w_gate", []int64{L, H, I}, transposedStack(k.gate, E, I, H).rowsFrom(first*H, L*H))
	wup := b.weight(q+"w_up", []int64{L, H, I}, transposedStack(k.up, E, I, H).rowsFrom(first*H, L*H))
	wdn := b.weight(q+"w_down", []int64{L, I, H}, transposedStack(k.down, E, H, I).rowsFrom(first*I, L*I))
	xx := b.node("Expand", p+"x_expand", []string{b.node("Unsqueeze", p+"x_unsq", []string{x, b.vec(0)}), b.vec(L, 1, 1)})
	g := b.node("MatMul", p+"gate", []string{xx, wg})
	u := b.node("MatMul", p+"up", []string{xx, wup})
	a := b.swiglu(p, g, u)
	return b.node("MatMul", p+"down", []string{a, wdn})
}

// ortAllGather writes one layer of the ort-allgather form (see FormORTAllGather).
func (b *builder) ortAllGather(c EPConfig, rank, l int, p, h string) string {
	G := int64(c.EP)
	first, L := localRange(c, rank)
	view, w, idx, _ := b.router(l, p, h)
	coll := func(op, out, in string) string {
		b.g.Node = append(b.g.Node, graph.NewNode(op, ORTDomain, "node_"+out, []string{in}, []string{out}, graph.IntAttr("group_size", G)))
		return out
	}
	xa := coll("AllGather", p+"all_x", view)
	ia := coll("AllGather", p+"all_topk_idx", idx)
	arange := make([]int64, L)
	for i := range arange {
		arange[i] = first + int64(i)
	}
	eq := b.node("Equal", p+"local_onehot_bool", []string{b.node("Unsqueeze", p+"all_idx_unsq", []string{ia, b.vec(-1)}), b.vec(arange...)})
	oh := b.node("Cast", p+"local_onehot", []string{eq}, graph.IntAttr("to", int64(pb.TensorProto_FLOAT)))
	d := b.localDense(c, rank, l, p, xa)
	// this rank's rows of the reduced result: [rank·T, (rank+1)·T)
	T := b.node("Shape", p+"tokens", []string{view}, graph.IntAttr("start", 0), graph.IntAttr("end", 1))
	start := b.node("Mul", p+"own_start", []string{T, b.vec(int64(rank))})
	end := b.node("Mul", p+"own_end", []string{T, b.vec(int64(rank + 1))})
	own := func(v string) string {
		return b.node("Slice", p+"own_rows", []string{v, start, end, b.vec(0)})
	}
	if c.Placement == BeforeCombine {
		wa := coll("AllGather", p+"all_topk_weights", w)
		route := b.node("ReduceSum", p+"routing", []string{b.node("Mul", p+"onehot_weighted", []string{oh, b.node("Unsqueeze", p+"all_w_col", []string{wa, b.vec(-1)})}), b.vec(1)},
			graph.IntAttr("keepdims", 0), graph.IntAttr("noop_with_empty_axes", 0))
		rt := b.node("Unsqueeze", p+"routing_col", []string{b.node("Transpose", p+"routing_t", []string{route}, graph.IntsAttr("perm", 1, 0)), b.vec(-1)})
		y := b.node("ReduceSum", p+"local_sum", []string{b.node("Mul", p+"weighted", []string{d, rt}), b.vec(0)},
			graph.IntAttr("keepdims", 0), graph.IntAttr("noop_with_empty_axes", 0))
		return b.shared(l, p, view, own(coll("AllReduce", p+"reduced", y)))
	}
	ys := b.node("MatMul", p+"per_slot", []string{oh, b.node("Transpose", p+"down_by_row", []string{d}, graph.IntsAttr("perm", 1, 0, 2))})
	cy := own(coll("AllReduce", p+"reduced", ys))
	m := b.node("Mul", p+"weighted", []string{cy, b.node("Unsqueeze", p+"weight_col", []string{w, b.vec(-1)})})
	y := b.node("ReduceSum", p+"routed", []string{m, b.vec(1)}, graph.IntAttr("keepdims", 0), graph.IntAttr("noop_with_empty_axes", 0))
	return b.shared(l, p, view, y)
}

// ortSharded writes one layer of the ort-sharded form (see FormORTSharded).
func (b *builder) ortSharded(c EPConfig, rank, l int, p, h string) string {
	E, H, I := int64(c.Experts), int64(c.Hidden), int64(c.Inter)
	first, L := localRange(c, rank)
	k := keysFor(c.Config, l)
	wr := b.weight("model."+p+"mlp.gate.weight", []int64{E, H}, contiguous(k.router, 0, E*H, H, c.Hidden))
	logits := b.gemmT(p+"router_logits", h, wr)
	q := "model." + p + "mlp.moe."
	norm := int64(0)
	if c.Normalize {
		norm = 1
	}
	fc1 := b.weight(q+"fc1_experts_weights", []int64{L, I, H}, contiguous(k.gate, first*I*H, L*I*H, H, c.Hidden))
	fc2 := b.weight(q+"fc2_experts_weights", []int64{L, H, I}, contiguous(k.down, first*H*I, L*H*I, I, c.Inter))
	fc3 := b.weight(q+"fc3_experts_weights", []int64{L, I, H}, contiguous(k.up, first*I*H, L*I*H, H, c.Hidden))
	out := p + "moe_out"
	b.g.Node = append(b.g.Node, graph.NewNode("ShardedMoE", ORTDomain, "node_"+out, []string{h, logits, fc1, "", fc2, "", fc3}, []string{out},
		graph.IntAttr("k", int64(c.TopK)), graph.IntAttr("normalize_routing_weights", norm), graph.StringAttr("activation_type", "silu"),
		graph.IntAttr("local_experts_start_index", first), graph.IntAttr("tensor_shards", 1)))
	return out
}
