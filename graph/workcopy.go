package graph

import (
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// WorkingCopy returns a model whose lists a pass may edit without changing
// m: the main graph's node, initializer, input, output and value-info lists,
// the opset imports and the metadata entries are the copy's own (inputs,
// outputs, opset imports and metadata entries are copied too). Each node is
// a new message with its own output list, sharing its input list,
// attributes and metadata with m's node: a pass may rename a node's outputs
// in place, but replaces a node by an edited clone for any other change.
// Value infos, initializers and model-local functions are shared with m (a
// pass adds new ones rather than editing those). Copying is thus linear in
// the number of nodes and copies no tensor. The copy reads m's external
// data and deferred tensors; it must not be closed, and it stays valid as
// long as m is open.
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
	mp.OpsetImport, mp.MetadataProps = cloneEach(src.OpsetImport), cloneEach(src.MetadataProps)
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
			gp.Node[i] = &pb.NodeProto{Input: n.Input, Output: append([]string(nil), n.Output...), Name: n.Name, OpType: n.OpType,
				Domain: n.Domain, Overload: n.Overload, Attribute: n.Attribute, DocString: n.DocString,
				MetadataProps: n.MetadataProps, DeviceConfigurations: n.DeviceConfigurations}
		}
		gp.ValueInfo = append([]*pb.ValueInfoProto(nil), sg.ValueInfo...)
		gp.Input, gp.Output = cloneEach(sg.Input), cloneEach(sg.Output)
		mp.Graph = gp
	}
	wc := &Model{Proto: mp, Path: m.Path, Dir: m.Dir, ext: m.ext, srcID: m.srcID, srcOK: m.srcOK, labels: m.labelMap(), ext0: m.ext0}
	wc.ShareDeferred(m)
	return wc
}

// Deferred returns the deferred producer registered for t (see SetDeferred)
// and whether there is one.
func (m *Model) Deferred(t *pb.TensorProto) (DeferredData, bool) {
	ds := m.deferredSet(false)
	if ds == nil {
		return DeferredData{}, false
	}
	ds.mu.RLock()
	d, ok := ds.m[t]
	ds.mu.RUnlock()
	return d, ok
}

// KeepIndex hands g, an index over m's main graph that is still current,
// to the next Graph call, as Check does with the index it builds.
func (m *Model) KeepIndex(g *Graph) {
	if g != nil && g.P == m.Proto.GetGraph() {
		sig := sigOf(m.Proto.Graph)
		m.mu.Lock()
		m.spare, m.spareSig = g, sig
		m.mu.Unlock()
	}
}

// WithGraph returns a model whose main graph is gp and whose header (IR
// version, opset imports, model-local functions) and tensor sources
// (external data, deferred tensors) are m's, shared: a model of a part of
// m (one block, say) for the interpreter, built in the size of that part.
// Like a working copy, it must not be closed and stays valid as long as m
// is open.
func (m *Model) WithGraph(gp *pb.GraphProto) *Model {
	mp := &pb.ModelProto{IrVersion: m.Proto.IrVersion, OpsetImport: m.Proto.OpsetImport, Functions: m.Proto.Functions, Graph: gp}
	return &Model{Proto: mp, Path: m.Path, Dir: m.Dir, ext: m.ext, srcID: m.srcID, srcOK: m.srcOK, labels: m.labelMap(), deferred: m.deferredSet(false), ext0: m.ext0}
}
