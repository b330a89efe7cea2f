package graph

import (
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// WorkingCopy returns a model that a pass may edit freely without changing
// m: its main graph's nodes, value infos, opset imports and metadata entries
// are copies, while initializers and model-local functions are shared with
// m (a pass must add new ones rather than edit those in place). The copy
// reads m's external data and deferred tensors; it must not be closed, and
// it stays valid as long as m is open.
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
		gp.Node = make([]*pb.NodeProto, len(sg.Node))
		for i, n := range sg.Node {
			gp.Node[i] = proto.Clone(n).(*pb.NodeProto)
		}
		for _, v := range sg.Input {
			gp.Input = append(gp.Input, proto.Clone(v).(*pb.ValueInfoProto))
		}
		for _, v := range sg.Output {
			gp.Output = append(gp.Output, proto.Clone(v).(*pb.ValueInfoProto))
		}
		for _, v := range sg.ValueInfo {
			gp.ValueInfo = append(gp.ValueInfo, proto.Clone(v).(*pb.ValueInfoProto))
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
