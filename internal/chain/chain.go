// Package chain composes one-block models. Compose chains n copies of a
// model's graph, where copy i+1 reads copy i's output in place of the block
// input (blocks chained directly, with no residual between them): the
// chained models that the detector's tests and bench/chain.sh run on.
// Parallel puts several models on one input (two blocks on one hidden
// state), and WithRouterOutputs adds a block's router values as further
// graph outputs (router logits, auxiliary losses).
package chain

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// Options change what Compose builds.
type Options struct {
	// Perturb gives each copy float32 weight matrices of its own: copy i
	// scales every element of each float32 initializer of rank 2 or more by
	// a factor between 0.9 and 1.1 that depends on i and the element's
	// index, so that copies are told apart by their numbers. Scalars and
	// vectors (thresholds, biases, shapes) are copied unchanged.
	Perturb bool
}

// Compose returns n chained copies of m's graph. m must have one graph
// input that is not an initializer and one output, of the same element type
// and rank. Every copy's nodes, values and initializers are renamed with the
// prefix "c<i>/"; the chain reads m's input under its own name and writes
// m's output under its own name. Initializer data is inlined.
func Compose(m *graph.Model, n int, opt Options) (*pb.ModelProto, error) {
	gp := m.Proto.GetGraph()
	if gp == nil {
		return nil, fmt.Errorf("%s: no graph", m.Name())
	}
	if n < 1 {
		return nil, fmt.Errorf("chain of %d copies", n)
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
	if len(ins) != 1 || len(gp.Output) != 1 {
		return nil, fmt.Errorf("%s: %d inputs and %d outputs; a chain needs one of each", m.Name(), len(ins), len(gp.Output))
	}
	in, out := ins[0], gp.Output[0]
	ti, to := in.GetType().GetTensorType(), out.GetType().GetTensorType()
	if ti.GetElemType() != to.GetElemType() || len(ti.GetShape().GetDim()) != len(to.GetShape().GetDim()) {
		return nil, fmt.Errorf("%s: input %q and output %q differ in type or rank", m.Name(), in.GetName(), out.GetName())
	}
	for _, nd := range gp.Node {
		for _, a := range nd.Attribute {
			if a.G != nil || len(a.Graphs) > 0 {
				return nil, fmt.Errorf("%s: node %q has a subgraph; chains of those are not built", m.Name(), graph.NodeLabel(nd))
			}
		}
	}
	data := make(map[string][]byte, len(gp.Initializer))
	for _, t := range gp.Initializer {
		b, err := m.TensorBytes(t)
		if err != nil {
			return nil, fmt.Errorf("%s: initializer %q: %w", m.Name(), t.GetName(), err)
		}
		data[t.GetName()] = b
	}
	ng := &pb.GraphProto{Name: proto.String(gp.GetName() + "_chain"), Input: []*pb.ValueInfoProto{proto.Clone(in).(*pb.ValueInfoProto)}}
	prev := in.GetName()
	for i := range n {
		pre := fmt.Sprintf("c%d/", i)
		last := i == n-1
		re := func(v string) string {
			switch {
			case v == "":
				return ""
			case v == in.GetName():
				return prev
			case v == out.GetName() && last:
				return out.GetName()
			}
			return pre + v
		}
		for _, t := range gp.Initializer {
			c := &pb.TensorProto{Name: proto.String(re(t.GetName())), Dims: t.GetDims(), DataType: t.DataType}
			c.RawData = perturbed(t, data[t.GetName()], i, opt.Perturb)
			ng.Initializer = append(ng.Initializer, c)
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
		prev = re(out.GetName())
	}
	ng.Output = []*pb.ValueInfoProto{proto.Clone(out).(*pb.ValueInfoProto)}
	mp := &pb.ModelProto{
		IrVersion:       m.Proto.IrVersion,
		OpsetImport:     m.Proto.OpsetImport,
		ProducerName:    proto.String("mokopt chain"),
		Functions:       m.Proto.Functions,
		Graph:           ng,
		MetadataProps:   nil,
		ModelVersion:    m.Proto.ModelVersion,
		ProducerVersion: m.Proto.ProducerVersion,
	}
	return mp, nil
}

// perturbed returns copy i's bytes of initializer t.
func perturbed(t *pb.TensorProto, b []byte, i int, on bool) []byte {
	if !on || pb.TensorProto_DataType(t.GetDataType()) != pb.TensorProto_FLOAT || len(t.GetDims()) < 2 {
		return b
	}
	out := make([]byte, len(b))
	for j := 0; j+4 <= len(b); j += 4 {
		f := math.Float32frombits(binary.LittleEndian.Uint32(b[j:]))
		k := float32((i*7+j/4*13)%21-10) / 100
		binary.LittleEndian.PutUint32(out[j:], math.Float32bits(f*(1+k)))
	}
	return out
}
