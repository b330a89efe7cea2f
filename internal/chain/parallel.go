package chain

import (
	"fmt"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// ParallelOptions change what Parallel builds.
type ParallelOptions struct {
	// Sum adds the branches' first outputs into one graph output (named as
	// the first branch's first output); the branches' other outputs stay
	// graph outputs. Without it every output of every branch is a graph
	// output.
	Sum bool
	// KeepOutputs, with Sum, keeps each branch's first output a graph
	// output too (named "b<i>/" and its name): a block output that is
	// also read elsewhere than by the sum.
	KeepOutputs bool
	// ShareFront writes once what the branches compute alike from the
	// shared input (the flatten of the tokens, shape reads), as an
	// exporter's common-subexpression pass does, so that the blocks read
	// those nodes in common (see shareFront).
	ShareFront bool
}

// Parallel returns one model in which every model of ms reads the same
// input: the first model's graph input (each model must have exactly one
// graph input that is not an initializer, all of one element type). Branch
// i's nodes, values and initializers are renamed with the prefix "b<i>/",
// except the shared input. A branch whose input has another rank than the
// shared one reads it reshaped to [-1, H] (H its input's last dim), and
// its first output is reshaped back to the shared input's shape. This is
// how two blocks on one hidden state (two MoE blocks, an MoE block and a
// dense MLP) are built from single-block exports. Initializer data is
// inlined.
func Parallel(ms []*graph.Model, opt ParallelOptions) (*pb.ModelProto, error) {
	if len(ms) < 2 {
		return nil, fmt.Errorf("parallel composition of %d models", len(ms))
	}
	ins := make([]*pb.ValueInfoProto, len(ms))
	for i, m := range ms {
		in, err := soleInput(m)
		if err != nil {
			return nil, err
		}
		if len(m.Proto.GetGraph().GetOutput()) == 0 {
			return nil, fmt.Errorf("%s: no graph output", m.Name())
		}
		if i > 0 && in.GetType().GetTensorType().GetElemType() != ins[0].GetType().GetTensorType().GetElemType() {
			return nil, fmt.Errorf("%s: input %q has another element type than %q", m.Name(), in.GetName(), ins[0].GetName())
		}
		ins[i] = in
	}
	shared := ins[0]
	ng := &pb.GraphProto{Name: proto.String("parallel"), Input: []*pb.ValueInfoProto{proto.Clone(shared).(*pb.ValueInfoProto)}}
	opsets := map[string]int64{}
	ir := int64(0)
	var funcs []*pb.FunctionProto
	var firsts []string
	for i, m := range ms {
		first, err := addBranch(ng, m, i, ins[i], shared, opt.Sum && !opt.KeepOutputs)
		if err != nil {
			return nil, err
		}
		firsts = append(firsts, first)
		for _, o := range m.Proto.GetOpsetImport() {
			opsets[o.GetDomain()] = max(opsets[o.GetDomain()], o.GetVersion())
		}
		ir = max(ir, m.Proto.GetIrVersion())
		funcs = append(funcs, m.Proto.GetFunctions()...)
	}
	if opt.Sum {
		out := ms[0].Proto.GetGraph().GetOutput()[0].GetName()
		acc := firsts[0]
		for i, v := range firsts[1:] {
			name := fmt.Sprintf("sum%d", i+1)
			if i == len(firsts)-2 {
				name = out
			}
			ng.Node = append(ng.Node, graph.NewNode("Add", "", "parallel/"+name, []string{acc, v}, []string{name}))
			acc = name
		}
		vi := proto.Clone(shared).(*pb.ValueInfoProto)
		vi.Name = proto.String(out)
		ng.Output = append([]*pb.ValueInfoProto{vi}, ng.Output...)
	}
	if opt.ShareFront {
		shareFront(ng)
	}
	mp := &pb.ModelProto{IrVersion: proto.Int64(ir), ProducerName: proto.String("mokopt parallel"), Graph: ng, Functions: funcs}
	for _, d := range []string{"", "ai.onnx", "com.microsoft", "ai.mok"} {
		if v, ok := opsets[d]; ok {
			mp.OpsetImport = append(mp.OpsetImport, &pb.OperatorSetIdProto{Domain: proto.String(d), Version: proto.Int64(v)})
			delete(opsets, d)
		}
	}
	for d, v := range opsets {
		mp.OpsetImport = append(mp.OpsetImport, &pb.OperatorSetIdProto{Domain: proto.String(d), Version: proto.Int64(v)})
	}
	return mp, nil
}

// soleInput returns m's one graph input that is not an initializer.
func soleInput(m *graph.Model) (*pb.ValueInfoProto, error) {
	gp := m.Proto.GetGraph()
	if gp == nil {
		return nil, fmt.Errorf("%s: no graph", m.Name())
	}
	inits := map[string]bool{}
	for _, t := range gp.Initializer {
		inits[t.GetName()] = true
	}
	var ins []*pb.ValueInfoProto
	for _, v := range gp.Input {
		if !inits[v.GetName()] {
			ins = append(ins, v)
		}
	}
	if len(ins) != 1 {
		return nil, fmt.Errorf("%s: %d graph inputs; a parallel branch needs one", m.Name(), len(ins))
	}
	for _, nd := range gp.Node {
		for _, a := range nd.Attribute {
			if a.G != nil || len(a.Graphs) > 0 {
				return nil, fmt.Errorf("%s: node %q has a subgraph; parallel branches of those are not built", m.Name(), graph.NodeLabel(nd))
			}
		}
	}
	return ins[0], nil
}

// addBranch appends branch i (model m, input in) to ng, reading the shared
// input, and returns the name of its first output in ng. Unless sum is set
// the branch's outputs are added to ng's outputs.
func addBranch(ng *pb.GraphProto, m *graph.Model, i int, in, shared *pb.ValueInfoProto, sum bool) (string, error) {
	gp := m.Proto.GetGraph()
	pre := fmt.Sprintf("b%d/", i)
	rin, rsh := len(in.GetType().GetTensorType().GetShape().GetDim()), len(shared.GetType().GetTensorType().GetShape().GetDim())
	adapt := rin != rsh
	src := shared.GetName()
	if adapt {
		d := in.GetType().GetTensorType().GetShape().GetDim()
		if rin != 2 || d[1].GetDimValue() <= 0 {
			return "", fmt.Errorf("%s: input %q of rank %d cannot read the shared input of rank %d (only a [T, H] input with a static H is adapted)", m.Name(), in.GetName(), rin, rsh)
		}
		shape := pre + "flat_shape"
		ng.Initializer = append(ng.Initializer, int64s(shape, -1, d[1].GetDimValue()))
		src = pre + "flat_input"
		ng.Node = append(ng.Node, graph.NewNode("Reshape", "", pre+"flatten_input", []string{shared.GetName(), shape}, []string{src}))
	}
	re := func(v string) string {
		switch v {
		case "":
			return ""
		case in.GetName():
			return src
		}
		return pre + v
	}
	for _, t := range gp.Initializer {
		b, err := m.TensorBytes(t)
		if err != nil {
			return "", fmt.Errorf("%s: initializer %q: %w", m.Name(), t.GetName(), err)
		}
		ng.Initializer = append(ng.Initializer, &pb.TensorProto{Name: proto.String(re(t.GetName())), Dims: t.GetDims(), DataType: t.DataType, RawData: b})
	}
	for _, nd := range gp.Node {
		c := proto.Clone(nd).(*pb.NodeProto)
		c.Name = proto.String(pre + nd.GetName())
		for k, v := range c.Input {
			c.Input[k] = re(v)
		}
		for k, v := range c.Output {
			c.Output[k] = re(v)
		}
		ng.Node = append(ng.Node, c)
	}
	for _, v := range gp.ValueInfo {
		c := proto.Clone(v).(*pb.ValueInfoProto)
		c.Name = proto.String(re(v.GetName()))
		ng.ValueInfo = append(ng.ValueInfo, c)
	}
	first := ""
	for k, o := range gp.Output {
		name := re(o.GetName())
		vi := proto.Clone(o).(*pb.ValueInfoProto)
		if k == 0 && adapt {
			shape, back := pre+"shared_shape", pre+"unflattened_output"
			ng.Node = append(ng.Node,
				graph.NewNode("Shape", "", pre+"shape_of_input", []string{shared.GetName()}, []string{shape}),
				graph.NewNode("Reshape", "", pre+"unflatten_output", []string{name, shape}, []string{back}))
			name = back
			vi = proto.Clone(shared).(*pb.ValueInfoProto)
		}
		if k == 0 {
			first = name
			if sum {
				continue
			}
		}
		vi.Name = proto.String(name)
		ng.Output = append(ng.Output, vi)
	}
	return first, nil
}

// int64s is a 1-D INT64 initializer.
func int64s(name string, v ...int64) *pb.TensorProto {
	raw := make([]byte, 8*len(v))
	for i, x := range v {
		for j := 0; j < 8; j++ {
			raw[8*i+j] = byte(uint64(x) >> (8 * j))
		}
	}
	return &pb.TensorProto{Name: proto.String(name), Dims: []int64{int64(len(v))}, DataType: proto.Int32(int32(pb.TensorProto_INT64)), RawData: raw}
}
