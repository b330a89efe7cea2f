package chain

import (
	"fmt"
	"math"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// RouterOutputs says which of a block's router values WithRouterOutputs
// adds as graph outputs.
type RouterOutputs struct {
	// Logits adds the router linear's output (after its bias) as the
	// graph output "router_logits".
	Logits bool
	// ProbLoss adds "aux_loss" ([1]) = E · Σ_e (mean over tokens of p_e)², from
	// the block's own router probabilities p (the selection's input).
	ProbLoss bool
	// BalanceLoss adds "balance_loss" ([1]) = E · Σ_e f_e · P_e, the
	// load-balancing loss of Switch Transformers and Mixtral: f_e the
	// fraction of chosen slots that went to expert e (a one-hot of the
	// selection's ids, averaged), P_e the mean probability of e.
	BalanceLoss bool
	// OwnTopK makes the balance loss choose its experts with a TopK of
	// its own over the probabilities, as transformers'
	// load_balancing_loss_func does, instead of reading the selection's.
	OwnTopK bool
}

// WithRouterOutputs returns m with the router values opt names as further
// graph outputs: what a model with output_router_logits, or an auxiliary
// loss computed next to its blocks, exports. Every selection of m (a TopK
// fed, through shape ops, a Softmax or Sigmoid and a bias Add, by a MatMul
// or Gemm with a constant weight, whose input is [T, E]) contributes: its
// logits are an output of their own ("router_logits", or
// "router_logits.<i>" for the i-th of several in node order), and the
// losses of all selections are summed into one output each, as
// transformers sums them over layers. The added nodes read the blocks' own
// values, so the router's values are used twice. m is not edited.
func WithRouterOutputs(m *graph.Model, opt RouterOutputs) (*pb.ModelProto, error) {
	mp := proto.Clone(m.Proto).(*pb.ModelProto)
	gp := mp.GetGraph()
	if gp == nil {
		return nil, fmt.Errorf("%s: no graph", m.Name())
	}
	for i, t := range m.Proto.GetGraph().GetInitializer() { // data inlined
		b, err := m.TensorBytes(t)
		if err != nil {
			return nil, fmt.Errorf("%s: initializer %q: %w", m.Name(), t.GetName(), err)
		}
		gp.Initializer[i] = &pb.TensorProto{Name: t.Name, Dims: t.GetDims(), DataType: t.DataType, RawData: b}
	}
	g := graph.NewGraph(gp)
	sels, err := selections(g)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", m.Name(), err)
	}
	opset := int64(0)
	for _, o := range mp.GetOpsetImport() {
		if o.GetDomain() == "" || o.GetDomain() == "ai.onnx" {
			opset = o.GetVersion()
		}
	}
	e := &edit{gp: gp, opset: opset}
	var aux, balance []string
	for i, sel := range sels {
		E, err := experts(g, sel.tk)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.Name(), err)
		}
		if opt.Logits {
			name := "router_logits"
			if len(sels) > 1 {
				name = fmt.Sprintf("router_logits.%d", i)
			}
			e.node("Identity", name, sel.logits)
			gp.Output = append(gp.Output, &pb.ValueInfoProto{Name: proto.String(name), Type: floatType()})
		}
		a, bl := e.losses(sel.tk, E, opt)
		aux, balance = append(aux, a...), append(balance, bl...)
	}
	e.loss("aux_loss", aux)
	e.loss("balance_loss", balance)
	return mp, nil
}

// losses appends the losses opt asks for of the selection tk among E
// experts and returns their values (none, or one each).
func (e *edit) losses(tk *pb.NodeProto, E int64, opt RouterOutputs) (aux, balance []string) {
	probs := tk.Input[0]
	meanP := ""
	if opt.ProbLoss || opt.BalanceLoss {
		meanP = e.reduce("ReduceMean", probs, 0) // [E]
	}
	if opt.ProbLoss {
		sq := e.node("Mul", "", meanP, meanP)
		aux = append(aux, e.node("Mul", "", e.reduce("ReduceSum", sq, 0), e.scalar(float32(E))))
	}
	if opt.BalanceLoss {
		depth := e.init(&pb.TensorProto{DataType: proto.Int32(int32(pb.TensorProto_INT64)), RawData: le64(E)})
		onOff := e.init(&pb.TensorProto{Dims: []int64{2}, DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), RawData: append(le32(0), le32(1)...)})
		ids := tk.Output[1]
		if opt.OwnTopK {
			ids = e.name()
			e.gp.Node = append(e.gp.Node, graph.NewNode("TopK", "", ids+"/TopK", []string{probs, tk.Input[1]}, []string{e.name(), ids}, graph.IntAttr("axis", -1)))
		}
		hot := e.node("OneHot", "", ids, depth, onOff) // [T, k, E]
		f := e.reduce("ReduceMean", e.reduce("ReduceSum", hot, 1), 0)
		balance = append(balance, e.node("Mul", "", e.reduce("ReduceSum", e.node("Mul", "", f, meanP), 0), e.scalar(float32(E))))
	}
	return aux, balance
}

// loss makes the sum of vals (none: nothing) the graph output name, a
// one-element vector: ONNX Runtime's Go binding reads no rank-0 outputs.
func (e *edit) loss(name string, vals []string) {
	if len(vals) == 0 {
		return
	}
	sum := vals[0]
	for _, v := range vals[1:] {
		sum = e.node("Add", "", sum, v)
	}
	one := e.init(&pb.TensorProto{Dims: []int64{1}, DataType: proto.Int32(int32(pb.TensorProto_INT64)), RawData: le64(1)})
	e.gp.Node = append(e.gp.Node, graph.NewNode("Reshape", "", name+"/Reshape", []string{sum, one}, []string{name}))
	e.gp.Output = append(e.gp.Output, &pb.ValueInfoProto{Name: proto.String(name), Type: floatType()})
}

// sel is one selection and its router's logits.
type sel struct {
	tk     *pb.NodeProto
	logits string
}

// selections returns g's selections in node order.
func selections(g *graph.Graph) ([]sel, error) {
	var out []sel
	for _, n := range g.P.Node {
		if n.GetOpType() != "TopK" {
			continue
		}
		if z := routerLogits(g, n.Input[0]); z != "" {
			out = append(out, sel{n, z})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no TopK fed by a router linear")
	}
	return out, nil
}

// routerLogits follows v back through shape ops, one Softmax or Sigmoid
// and a bias Add to a MatMul/Gemm with an initializer weight, and returns
// the logits value (the Add's output where there is one); "" otherwise.
func routerLogits(g *graph.Graph, v string) string {
	z := ""
	for steps := 0; steps < 16; steps++ {
		p := g.Producer(v)
		if p == nil {
			return ""
		}
		switch p.GetOpType() {
		case "Reshape", "Squeeze", "Unsqueeze", "Identity", "Cast", "Softmax", "Sigmoid":
			v = p.Input[0]
		case "Add":
			if g.Initializer(p.Input[1]) == nil {
				return ""
			}
			z, v = p.Output[0], p.Input[0]
		case "MatMul", "Gemm":
			if g.Initializer(p.Input[1]) == nil {
				return ""
			}
			if z == "" {
				z = p.Output[0]
			}
			return z
		default:
			return ""
		}
	}
	return ""
}

// experts returns the number of experts the selection tk chooses among:
// the last dim of its router's weight.
func experts(g *graph.Graph, tk *pb.NodeProto) (int64, error) {
	v := tk.Input[0]
	for steps := 0; steps < 16; steps++ {
		p := g.Producer(v)
		if p == nil {
			break
		}
		if op := p.GetOpType(); op == "MatMul" || op == "Gemm" {
			d := g.Initializer(p.Input[1]).GetDims()
			if len(d) != 2 {
				break
			}
			if op == "Gemm" && graph.AttrInt(p, "transB", 0) == 1 {
				return d[0], nil
			}
			return d[1], nil
		}
		v = p.Input[0]
	}
	return 0, fmt.Errorf("cannot read the number of experts behind %q", graph.NodeLabel(tk))
}

// edit appends nodes and initializers to a graph.
type edit struct {
	gp    *pb.GraphProto
	opset int64
	n     int
}

func (e *edit) name() string { e.n++; return fmt.Sprintf("router_out/v%d", e.n) }

// node appends a one-output node; out "" names its output.
func (e *edit) node(op, out string, in ...string) string {
	if out == "" {
		out = e.name()
	}
	e.gp.Node = append(e.gp.Node, graph.NewNode(op, "", out+"/"+op, in, []string{out}))
	return out
}

// reduce appends a reduction of v over axis, without keeping it: axes as
// an input from opset 18 (13 for ReduceSum), as an attribute before.
func (e *edit) reduce(op, v string, axis int64) string {
	out := e.name()
	if e.opset >= 18 || op == "ReduceSum" && e.opset >= 13 {
		axes := e.init(&pb.TensorProto{Dims: []int64{1}, DataType: proto.Int32(int32(pb.TensorProto_INT64)), RawData: le64(axis)})
		e.gp.Node = append(e.gp.Node, graph.NewNode(op, "", out+"/"+op, []string{v, axes}, []string{out}, graph.IntAttr("keepdims", 0)))
	} else {
		e.gp.Node = append(e.gp.Node, graph.NewNode(op, "", out+"/"+op, []string{v}, []string{out}, graph.IntAttr("keepdims", 0), graph.IntsAttr("axes", axis)))
	}
	return out
}

// init adds t as an initializer under a new name and returns it.
func (e *edit) init(t *pb.TensorProto) string {
	t.Name = proto.String(e.name())
	e.gp.Initializer = append(e.gp.Initializer, t)
	return t.GetName()
}

func (e *edit) scalar(f float32) string {
	return e.init(&pb.TensorProto{DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), RawData: le32(f)})
}

func floatType() *pb.TypeProto {
	return &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: proto.Int32(int32(pb.TensorProto_FLOAT))}}}
}

func le64(v int64) []byte {
	b := make([]byte, 8)
	for j := range 8 {
		b[j] = byte(uint64(v) >> (8 * j))
	}
	return b
}

func le32(f float32) []byte {
	u := math.Float32bits(f)
	return []byte{byte(u), byte(u >> 8), byte(u >> 16), byte(u >> 24)}
}
