package passes

import (
	"strings"
	"testing"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// scoped returns a node named name with, when scopes is not "", dynamo's
// name_scopes metadata.
func scoped(name, scopes string) *pb.NodeProto {
	n := &pb.NodeProto{Name: proto.String(name), OpType: proto.String("MatMul")}
	if scopes != "" {
		n.MetadataProps = []*pb.StringStringEntryProto{{Key: proto.String(nameScopesKey), Value: proto.String(scopes)}}
	}
	return n
}

func TestNodeScope(t *testing.T) {
	cases := []struct {
		name string
		n    *pb.NodeProto
		want string
	}{
		{"dynamo metadata", scoped("node_MatMul_3", "['', 'm', 'm.model', 'm.model.layers.1', 'm.model.layers.1.mlp', 'matmul_3']"), "m.model.layers.1.mlp"},
		{"dynamo metadata, double quotes", scoped("node_x", `["", "m", "m.gate", "linear"]`), "m.gate"},
		{"dynamo top level", scoped("node_x", "['', 'add']"), ""},
		{"torchscript slashes", scoped("/model/layers.3/mlp/experts.0/gate_proj/MatMul", ""), "model.layers.3.mlp.experts.0.gate_proj"},
		{"torchscript module root", scoped("/m/Reshape_1", ""), "m"},
		{"plain name", scoped("node_MatMul_12", ""), ""},
		{"malformed metadata", scoped("node_x", "['m', 'm.a"), ""},
		{"malformed after the module", scoped("node_x", "['', 'm', 'm.a' 'x']"), ""},
		{"one entry", scoped("node_x", "['x']"), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := strings.Join(nodeScope(tc.n), "."); got != tc.want {
				t.Fatalf("nodeScope = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestBlockName(t *testing.T) {
	l1 := func(op string) *pb.NodeProto {
		return scoped("node_"+op, "['', 'm', 'm.model', 'm.model.layers.1', 'm.model.layers.1.mlp', 'm.model.layers.1.mlp.experts', '"+op+"']")
	}
	cases := []struct {
		name    string
		y, w    string
		region  []*pb.NodeProto
		want    string
		comment string
	}{
		{"scope beats a misleading router name", "add_7", "m.model.layers.0.mlp.gate.weight",
			[]*pb.NodeProto{l1("a"), scoped("node_b", "['', 'm', 'm.model', 'm.model.layers.1', 'm.model.layers.1.mlp', 'm.model.layers.1.mlp.gate', 'b']"), scoped("node_Constant_3", "")},
			"m.model.layers.1.mlp", "the scoped nodes share layers.1.mlp; the unscoped constant does not count"},
		{"torchscript trace", "/m/Reshape_1_output_0", "onnx::MatMul_209",
			[]*pb.NodeProto{scoped("/m/gate/MatMul", ""), scoped("/m/experts/Gather", ""), scoped("/m/Reshape_1", "")}, "m", ""},
		{"router weight path when nodes are unnamed", "y", "model.layers.2.mlp.gate.weight",
			[]*pb.NodeProto{scoped("", ""), scoped("n1", "")}, "model.layers.2.mlp", ""},
		{"output value last", "moe_out", "w", []*pb.NodeProto{scoped("n1", "")}, "moe_out", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := blockName(tc.y, tc.w, tc.region); got != tc.want {
				t.Fatalf("blockName = %q, want %q (%s)", got, tc.want, tc.comment)
			}
		})
	}
}

func TestUniqueBlockNames(t *testing.T) {
	layer := func(i string) []*pb.NodeProto {
		return []*pb.NodeProto{scoped("node_"+i, "['', 'm', 'm.layers."+i+"', 'm.layers."+i+".mlp', 'x']")}
	}
	cases := []struct {
		name   string
		blocks []*Block
		want   []string
	}{
		{"distinct names kept", []*Block{{Name: "a", Output: "y0"}, {Name: "b", Output: "y1"}}, []string{"a", "b"}},
		{"scopes tell a duplicate apart", []*Block{{Name: "m.layers.0.mlp", Region: layer("0"), Output: "y0"}, {Name: "m.layers.0.mlp", Region: layer("1"), Output: "y1"}},
			[]string{"m.layers.0.mlp", "m.layers.1.mlp"}},
		{"else the output values", []*Block{{Name: "m", Output: "add_3"}, {Name: "m", Output: "add_9"}}, []string{"add_3", "add_9"}},
		{"else numbered in order", []*Block{{Name: "m", Output: "y"}, {Name: "k", Output: "y"}, {Name: "m", Output: "y"}, {Name: "m", Output: "y"}},
			[]string{"m", "k", "m#2", "m#3"}},
		{"numbering skips a taken name", []*Block{{Name: "m"}, {Name: "m#2"}, {Name: "m"}}, []string{"m", "m#2", "m#3"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			uniqueBlockNames(tc.blocks)
			var got []string
			for _, b := range tc.blocks {
				got = append(got, b.Name)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("names %q, want %q", got, tc.want)
			}
		})
	}
}
