package graph

import (
	"errors"
	"slices"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// ErrForkDeferred is returned by Fork for a model holding deferred tensors,
// whose producers may read messages of the model itself.
var ErrForkDeferred = errors.New("a model with deferred tensors cannot be forked")

// Fork returns a copy of m that m's own edits and saves cannot reach, so
// that the copy can be read (evaluated, checked) on another goroutine
// while m is rewritten and saved, or the other way round.
//
// What passes and writers edit in place is the copy's own: the model's
// opset imports and metadata, the main graph's lists, every node (a new
// message with its own input, output and attribute lists), every tensor
// (initializers, tensors and graphs in attributes, model-local functions,
// the graph's inputs and outputs), which Save repoints at the side file it
// writes. What no pass edits in place is shared: the main graph's value
// infos and the node attributes that hold no tensor or graph (a pass
// replaces those; see WorkingCopy). The bytes of the tensors' raw data are
// shared too, since nothing writes into them: forking copies no weight and
// costs time linear in the number of nodes.
//
// The copy reads m's side files through m's handles: it stays valid as long
// as m is open, and closing it does nothing. Forking only reads m: other
// goroutines may read m meanwhile, but none may edit it.
func (m *Model) Fork() (*Model, error) {
	if m.hasDeferred() {
		return nil, ErrForkDeferred
	}
	src := m.Proto
	sg := src.Graph
	graphField := src.ProtoReflect().Descriptor().Fields().ByName("graph")
	mp := cloneShare(src.ProtoReflect(), graphField).Interface().(*pb.ModelProto) // all but the main graph
	if sg != nil {
		gp := &pb.GraphProto{Name: sg.Name, DocString: sg.DocString,
			ValueInfo: slices.Clone(sg.ValueInfo)}
		gp.Initializer = make([]*pb.TensorProto, len(sg.Initializer))
		for i, t := range sg.Initializer {
			gp.Initializer[i] = cloneSharing(t)
		}
		for _, t := range sg.SparseInitializer {
			gp.SparseInitializer = append(gp.SparseInitializer, cloneSharing(t))
		}
		gp.QuantizationAnnotation = cloneEach(sg.QuantizationAnnotation)
		gp.MetadataProps = cloneEach(sg.MetadataProps)
		gp.Input, gp.Output = cloneEach(sg.Input), cloneEach(sg.Output)
		gp.Node = make([]*pb.NodeProto, len(sg.Node))
		for i, n := range sg.Node {
			gp.Node[i] = CopyNode(n)
		}
		keepUnknown(gp, sg)
		mp.Graph = gp
	}
	return &Model{Proto: mp, Path: m.Path, Dir: m.Dir, ext: m.ext, borrowed: true, srcID: m.srcID, srcOK: m.srcOK, ext0: m.ext0}, nil
}

// CopyNode returns a copy of n that a pass may edit as passes do: a new
// message with its own input, output and attribute lists, whose attributes
// that hold a tensor or a graph are copies (sharing their tensors' raw
// data); the other attributes, which passes replace rather than edit, are
// shared with n. It costs a fraction of proto.Clone.
func CopyNode(n *pb.NodeProto) *pb.NodeProto {
	c := &pb.NodeProto{Input: slices.Clone(n.Input), Output: slices.Clone(n.Output), Name: n.Name, OpType: n.OpType,
		Domain: n.Domain, Overload: n.Overload, Attribute: slices.Clone(n.Attribute), DocString: n.DocString,
		MetadataProps: slices.Clone(n.MetadataProps), DeviceConfigurations: slices.Clone(n.DeviceConfigurations)}
	for j, a := range c.Attribute {
		if holdsTensors(a) {
			c.Attribute[j] = cloneSharing(a)
		}
	}
	keepUnknown(c, n)
	return c
}

// keepUnknown gives c a copy of the unknown fields of from.
func keepUnknown(c, from proto.Message) {
	if u := from.ProtoReflect().GetUnknown(); len(u) > 0 {
		c.ProtoReflect().SetUnknown(slices.Clone(u))
	}
}

// holdsTensors reports whether attribute a holds a tensor or a graph.
func holdsTensors(a *pb.AttributeProto) bool {
	return a.T != nil || a.G != nil || a.SparseTensor != nil || len(a.Tensors) > 0 || len(a.Graphs) > 0 || len(a.SparseTensors) > 0
}

// cloneSharing is proto.Clone(msg), except that the tensors inside msg
// share their raw data with the copy's instead of copying it. It only
// reads msg.
func cloneSharing[M proto.Message](msg M) M {
	if t, ok := any(msg).(*pb.TensorProto); ok {
		return any(copyTensor(t)).(M)
	}
	return cloneShare(msg.ProtoReflect(), nil).Interface().(M)
}

// copyTensor is cloneSharing for a tensor, field by field (a tenth of the
// time of the reflective walk, for the many initializers of a model): a
// new message with its own dims, typed data, external data entries and
// metadata, sharing t's raw data.
func copyTensor(t *pb.TensorProto) *pb.TensorProto {
	c := &pb.TensorProto{
		Dims: slices.Clone(t.Dims), DataType: t.DataType, Name: t.Name, DocString: t.DocString, DataLocation: t.DataLocation,
		FloatData: slices.Clone(t.FloatData), Int32Data: slices.Clone(t.Int32Data), Int64Data: slices.Clone(t.Int64Data),
		DoubleData: slices.Clone(t.DoubleData), Uint64Data: slices.Clone(t.Uint64Data), RawData: t.RawData,
	}
	if t.Segment != nil {
		c.Segment = proto.Clone(t.Segment).(*pb.TensorProto_Segment)
	}
	if t.StringData != nil {
		c.StringData = make([][]byte, len(t.StringData))
		for i, b := range t.StringData {
			c.StringData[i] = slices.Clone(b)
		}
	}
	c.ExternalData, c.MetadataProps = cloneEach(t.ExternalData), cloneEach(t.MetadataProps)
	keepUnknown(c, t)
	return c
}

// cloneEach returns a list of proto.Clone's copies of xs' messages (nil for
// none).
func cloneEach[M proto.Message](xs []M) []M {
	if len(xs) == 0 {
		return nil
	}
	out := make([]M, len(xs))
	for i, x := range xs {
		out[i] = proto.Clone(x).(M)
	}
	return out
}

// cloneShare returns a deep copy of m, but for the field skip (nil for
// none), in which every bytes field shares its bytes with m's: a tensor's
// raw data is not copied, every message and list is the copy's own.
func cloneShare(m protoreflect.Message, skip protoreflect.FieldDescriptor) protoreflect.Message {
	if t, ok := m.Interface().(*pb.TensorProto); ok && skip == nil {
		return copyTensor(t).ProtoReflect()
	}
	c := m.New()
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd == skip:
		case fd.IsMap():
			dm := c.Mutable(fd).Map()
			v.Map().Range(func(k protoreflect.MapKey, e protoreflect.Value) bool {
				if fd.MapValue().Message() != nil {
					e = protoreflect.ValueOfMessage(cloneShare(e.Message(), nil))
				}
				dm.Set(k, e)
				return true
			})
		case fd.IsList():
			dl, sl := c.Mutable(fd).List(), v.List()
			for i := range sl.Len() {
				e := sl.Get(i)
				if fd.Message() != nil {
					e = protoreflect.ValueOfMessage(cloneShare(e.Message(), nil))
				}
				dl.Append(e)
			}
		case fd.Message() != nil:
			c.Set(fd, protoreflect.ValueOfMessage(cloneShare(v.Message(), nil)))
		default:
			c.Set(fd, v) // a scalar, a string, or bytes (shared)
		}
		return true
	})
	if u := m.GetUnknown(); len(u) > 0 {
		c.SetUnknown(slices.Clone(u))
	}
	return c
}

// ForkMap pairs the messages of a model with those of its fork (Fork),
// for a caller holding pointers into the model that must read the fork.
type ForkMap struct {
	nodes   map[*pb.NodeProto]*pb.NodeProto
	tensors map[*pb.TensorProto]*pb.TensorProto
}

// MapFork pairs the main-graph nodes and every tensor of m with those of
// f, a fork of m taken while m is unchanged since.
func MapFork(m, f *Model) (*ForkMap, error) {
	mn, fn := m.Proto.GetGraph().GetNode(), f.Proto.GetGraph().GetNode()
	mt, ft := allTensors(m.Proto), allTensors(f.Proto)
	if len(mn) != len(fn) || len(mt) != len(ft) {
		return nil, errors.New("fork map: the fork is not the model's")
	}
	fm := &ForkMap{nodes: make(map[*pb.NodeProto]*pb.NodeProto, len(mn)), tensors: make(map[*pb.TensorProto]*pb.TensorProto, len(mt))}
	for i, n := range mn {
		fm.nodes[n] = fn[i]
	}
	for i, t := range mt {
		fm.tensors[t] = ft[i]
	}
	return fm, nil
}

// Node returns the fork's node for the model's node n (nil for nil; n
// itself when n is not a main-graph node of the model, as for nodes a
// caller made up).
func (fm *ForkMap) Node(n *pb.NodeProto) *pb.NodeProto {
	if f, ok := fm.nodes[n]; ok {
		return f
	}
	return n
}

// Tensor returns the fork's tensor for the model's tensor t (t itself
// when t is not one of the model's).
func (fm *ForkMap) Tensor(t *pb.TensorProto) *pb.TensorProto {
	if f, ok := fm.tensors[t]; ok {
		return f
	}
	return t
}
