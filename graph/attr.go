package graph

import (
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// Attr returns n's attribute called name, or nil.
func Attr(n *pb.NodeProto, name string) *pb.AttributeProto {
	for _, a := range n.Attribute {
		if a.GetName() == name {
			return a
		}
	}
	return nil
}

// AttrInt returns an INT attribute, or def when absent.
func AttrInt(n *pb.NodeProto, name string, def int64) int64 {
	if a := Attr(n, name); a != nil {
		return a.GetI()
	}
	return def
}

// AttrFloat returns a FLOAT attribute, or def when absent.
func AttrFloat(n *pb.NodeProto, name string, def float32) float32 {
	if a := Attr(n, name); a != nil {
		return a.GetF()
	}
	return def
}

// AttrString returns a STRING attribute, or def when absent.
func AttrString(n *pb.NodeProto, name string, def string) string {
	if a := Attr(n, name); a != nil {
		return string(a.GetS())
	}
	return def
}

// AttrInts returns an INTS attribute, or nil when absent.
func AttrInts(n *pb.NodeProto, name string) []int64 {
	if a := Attr(n, name); a != nil {
		return a.Ints
	}
	return nil
}

// AttrTensor returns a TENSOR attribute, or nil when absent.
func AttrTensor(n *pb.NodeProto, name string) *pb.TensorProto {
	if a := Attr(n, name); a != nil {
		return a.T
	}
	return nil
}

// IntAttr builds an INT attribute.
func IntAttr(name string, v int64) *pb.AttributeProto {
	return &pb.AttributeProto{Name: proto.String(name), Type: pb.AttributeProto_INT.Enum(), I: proto.Int64(v)}
}

// FloatAttr builds a FLOAT attribute.
func FloatAttr(name string, v float32) *pb.AttributeProto {
	return &pb.AttributeProto{Name: proto.String(name), Type: pb.AttributeProto_FLOAT.Enum(), F: proto.Float32(v)}
}

// StringAttr builds a STRING attribute.
func StringAttr(name, v string) *pb.AttributeProto {
	return &pb.AttributeProto{Name: proto.String(name), Type: pb.AttributeProto_STRING.Enum(), S: []byte(v)}
}

// IntsAttr builds an INTS attribute.
func IntsAttr(name string, v ...int64) *pb.AttributeProto {
	return &pb.AttributeProto{Name: proto.String(name), Type: pb.AttributeProto_INTS.Enum(), Ints: v}
}

// TensorAttr builds a TENSOR attribute.
func TensorAttr(name string, t *pb.TensorProto) *pb.AttributeProto {
	return &pb.AttributeProto{Name: proto.String(name), Type: pb.AttributeProto_TENSOR.Enum(), T: t}
}

// NewNode builds a node.
func NewNode(op, domain, name string, inputs, outputs []string, attrs ...*pb.AttributeProto) *pb.NodeProto {
	n := &pb.NodeProto{OpType: proto.String(op), Input: inputs, Output: outputs, Attribute: attrs}
	if name != "" {
		n.Name = proto.String(name)
	}
	if domain != "" {
		n.Domain = proto.String(domain)
	}
	return n
}

// AttrWithGraphs returns a copy of the graph attribute a holding g and gs
// instead of its own graph and graphs; a is not edited.
func AttrWithGraphs(a *pb.AttributeProto, g *pb.GraphProto, gs []*pb.GraphProto) *pb.AttributeProto {
	return &pb.AttributeProto{Name: a.Name, Type: a.Type, DocString: a.DocString, RefAttrName: a.RefAttrName, G: g, Graphs: gs}
}

// AllNames adds to names every value and node name of gp, in all its
// scopes (the subgraphs its nodes hold, nested).
func AllNames(gp *pb.GraphProto, names map[string]bool) {
	for _, l := range [][]*pb.ValueInfoProto{gp.GetInput(), gp.GetOutput(), gp.GetValueInfo()} {
		for _, v := range l {
			names[v.GetName()] = true
		}
	}
	for _, t := range gp.GetInitializer() {
		names[t.GetName()] = true
	}
	for _, n := range gp.GetNode() {
		names[n.GetName()] = true
		for _, o := range n.Output {
			names[o] = true
		}
		for _, a := range n.Attribute {
			if a.G != nil {
				AllNames(a.G, names)
			}
			for _, sg := range a.Graphs {
				AllNames(sg, names)
			}
		}
	}
}
