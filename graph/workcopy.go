package graph

import (
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// WorkingCopy returns a model whose lists a pass may edit without changing
// m: the main graph's node, initializer, input, output and value-info lists,
// the opset imports and the metadata entries are the copy's own (inputs,
// outputs, opset imports and metadata entries are copied too), while the
// nodes, value infos, initializers and model-local functions themselves are
// shared with m: a pass replaces such a message by an edited clone rather
// than editing it in place. Copying is thus linear in the number of nodes
// but copies no node. The copy reads m's external data and deferred
// tensors; it must not be closed, and it stays valid as long as m is open.
func (m *Model) WorkingCopy() *Model {
	src := m.Proto
	mp := &pb.ModelProto{
		IrVersion:       src.IrVersion,
		ProducerName:    src.ProducerName,
		ProducerVersion: src.ProducerVersion,
		Domain:          src.Domain,
		ModelVersion:    src.ModelVersion,
		DocString:       src.DocString,
		Functions:       append([]*pb.FunctionProto(nil), src.Functions...),
	}
	for _, o := range src.OpsetImport {
		mp.OpsetImport = append(mp.OpsetImport, proto.Clone(o).(*pb.OperatorSetIdProto))
	}
	for _, p := range src.MetadataProps {
		mp.MetadataProps = append(mp.MetadataProps, proto.Clone(p).(*pb.StringStringEntryProto))
	}
	if sg := src.Graph; sg != nil {
		gp := &pb.GraphProto{
			Name:                   sg.Name,
			DocString:              sg.DocString,
			Initializer:            append([]*pb.TensorProto(nil), sg.Initializer...),
			SparseInitializer:      append([]*pb.SparseTensorProto(nil), sg.SparseInitializer...),
			QuantizationAnnotation: sg.QuantizationAnnotation,
			MetadataProps:          sg.MetadataProps,
		}
		gp.Node = append([]*pb.NodeProto(nil), sg.Node...)
		gp.ValueInfo = append([]*pb.ValueInfoProto(nil), sg.ValueInfo...)
		for _, v := range sg.Input {
			gp.Input = append(gp.Input, proto.Clone(v).(*pb.ValueInfoProto))
		}
		for _, v := range sg.Output {
			gp.Output = append(gp.Output, proto.Clone(v).(*pb.ValueInfoProto))
		}
		mp.Graph = gp
	}
	wc := &Model{Proto: mp, Path: m.Path, Dir: m.Dir, ext: m.ext, srcID: m.srcID, srcOK: m.srcOK, labels: m.labels}
	if len(m.deferred) > 0 {
		wc.deferred = make(map[*pb.TensorProto]DeferredData, len(m.deferred))
		for t, d := range m.deferred {
			wc.deferred[t] = d
		}
	}
	return wc
}

// Deferred returns the deferred producer registered for t (see SetDeferred)
// and whether there is one.
func (m *Model) Deferred(t *pb.TensorProto) (DeferredData, bool) {
	d, ok := m.deferred[t]
	return d, ok
}

// Unshare replaces each node of m's main graph that is also a node of
// other's (see WorkingCopy) by a copy with its own output list, so that
// the outputs of m's nodes can then be renamed in place; the copy shares
// its input list, attributes and metadata with the original node, which
// must still not be edited in place. An index kept for m's next Graph call
// (see KeepIndex) is updated to the copies.
func (m *Model) Unshare(other *Model) {
	theirs := make(map[*pb.NodeProto]bool, len(other.Proto.GetGraph().GetNode()))
	for _, n := range other.Proto.GetGraph().GetNode() {
		theirs[n] = true
	}
	clones := map[*pb.NodeProto]*pb.NodeProto{}
	for i, n := range m.Proto.GetGraph().GetNode() {
		if theirs[n] {
			c := &pb.NodeProto{Input: n.Input, Output: append([]string(nil), n.Output...), Name: n.Name, OpType: n.OpType,
				Domain: n.Domain, Overload: n.Overload, Attribute: n.Attribute, DocString: n.DocString,
				MetadataProps: n.MetadataProps, DeviceConfigurations: n.DeviceConfigurations}
			clones[n] = c
			m.Proto.Graph.Node[i] = c
		}
	}
	// An index kept for the next Graph call names the clones instead.
	g := m.spare
	if g == nil || g.P != m.Proto.Graph {
		m.spare = nil
		return
	}
	swap := func(l []*pb.NodeProto) {
		for i, n := range l {
			if c, ok := clones[n]; ok {
				l[i] = c
			}
		}
	}
	swap(g.prod)
	for _, l := range g.cons {
		swap(l)
	}
	swap(g.added)
	swap(g.topo)
	swap(g.nodes)
	m.spareSig = sigOf(m.Proto.Graph)
}

// KeepIndex hands g, an index over m's main graph that is still current,
// to the next Graph call, as Check does with the index it builds.
func (m *Model) KeepIndex(g *Graph) {
	if g != nil && g.P == m.Proto.GetGraph() {
		m.spare, m.spareSig = g, sigOf(m.Proto.Graph)
	}
}
