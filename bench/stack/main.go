// Command stack writes the pre-norm residual stack of a real exported MoE
// block that bench/check.sh rewrites: N copies of the block, copy i reading
// the RMS-normalised running value and its output added back to it,
//
//	x_{i+1} = x_i + block_i(x_i / sqrt(mean(x_i^2, last axis) + 1e-6)),
//
// every copy with initializers of its own (same values, renamed "s<i>/").
// The model's single input is x_0, its output x_N. Initializer data is
// inlined (keep N x weights under protobuf's 2 GiB).
//
// Usage: go run ./bench/stack [-n N] BLOCK.onnx OUT.onnx
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

func main() {
	n := flag.Int("n", 500, "number of stacked copies")
	flag.Parse()
	if flag.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: stack [-n N] BLOCK.onnx OUT.onnx")
		os.Exit(2)
	}
	m, err := graph.Load(flag.Arg(0))
	if err == nil {
		var mp *pb.ModelProto
		if mp, err = stack(m, *n); err == nil {
			var b []byte
			if b, err = proto.Marshal(mp); err == nil {
				err = os.WriteFile(flag.Arg(1), b, 0o644)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "stack:", err)
		os.Exit(1)
	}
}

// stack returns n pre-norm residual copies of m's graph (one input, one
// output of the same type and shape).
func stack(m *graph.Model, n int) (*pb.ModelProto, error) {
	gp := m.Proto.GetGraph()
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
	if len(ins) != 1 || len(gp.Output) != 1 || n < 1 {
		return nil, fmt.Errorf("%s: %d inputs, %d outputs: a stack needs one of each (and n >= 1)", m.Name(), len(ins), len(gp.Output))
	}
	in, out := ins[0], gp.Output[0]
	data := map[string][]byte{}
	for _, t := range gp.Initializer {
		b, err := m.TensorBytes(t)
		if err != nil {
			return nil, err
		}
		data[t.GetName()] = b
	}
	f32 := func(name string, v float32) *pb.TensorProto {
		return &pb.TensorProto{Name: proto.String(name), DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), FloatData: []float32{v}}
	}
	ng := &pb.GraphProto{Name: proto.String(gp.GetName() + "_stack"), Input: []*pb.ValueInfoProto{proto.Clone(in).(*pb.ValueInfoProto)},
		Initializer: []*pb.TensorProto{f32("stack/eps", 1e-6), {Name: proto.String("stack/last_axis"), Dims: []int64{1}, DataType: proto.Int32(int32(pb.TensorProto_INT64)), Int64Data: []int64{-1}}}}
	prev := in.GetName()
	for i := range n {
		pre := fmt.Sprintf("s%d/", i)
		node := func(op string, ins []string, out string, attrs ...*pb.AttributeProto) {
			ng.Node = append(ng.Node, graph.NewNode(op, "", pre+"norm/"+out, ins, []string{pre + "norm/" + out}, attrs...))
		}
		node("Mul", []string{prev, prev}, "sq")
		node("ReduceMean", []string{pre + "norm/sq", "stack/last_axis"}, "ms", graph.IntAttr("keepdims", 1))
		node("Add", []string{pre + "norm/ms", "stack/eps"}, "mse")
		node("Sqrt", []string{pre + "norm/mse"}, "rms")
		node("Div", []string{prev, pre + "norm/rms"}, "x")
		blockIn := pre + "norm/x"
		re := func(v string) string {
			switch v {
			case "":
				return ""
			case in.GetName():
				return blockIn
			}
			return pre + v
		}
		for _, t := range gp.Initializer {
			ng.Initializer = append(ng.Initializer, &pb.TensorProto{Name: proto.String(re(t.GetName())), Dims: t.GetDims(), DataType: t.DataType, RawData: data[t.GetName()]})
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
		sum := pre + "residual"
		if i == n-1 {
			sum = out.GetName()
		}
		ng.Node = append(ng.Node, graph.NewNode("Add", "", pre+"residual", []string{prev, re(out.GetName())}, []string{sum}))
		prev = sum
	}
	ng.Output = []*pb.ValueInfoProto{proto.Clone(out).(*pb.ValueInfoProto)}
	return &pb.ModelProto{IrVersion: m.Proto.IrVersion, OpsetImport: m.Proto.OpsetImport, ProducerName: proto.String("mokopt bench/stack"),
		Functions: m.Proto.Functions, Graph: ng}, nil
}
