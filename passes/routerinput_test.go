package passes

import (
	"strings"
	"testing"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/models"
	"github.com/mokopt/mokopt/moe"
	"google.golang.org/protobuf/proto"
)

// rerouted builds a one-layer model of shape whose router linear reads, in
// place of the hidden state, what feed writes (it returns the value the
// router then reads, appending nodes, initializers and inputs to gp).
func rerouted(t *testing.T, shape string, feed func(gp *pb.GraphProto) string) *graph.Model {
	t.Helper()
	m, err := models.Build(models.Config{Shape: shape, Layers: 1, Experts: 4, TopK: 2, Hidden: 16, Inter: 8, Normalize: true, Tokens: 6, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	gp := m.Proto.Graph
	var router *pb.NodeProto
	for _, n := range gp.Node {
		if strings.HasSuffix(n.Output[0], "router_logits") {
			router = n
		}
	}
	if router == nil {
		t.Fatal("no router linear")
	}
	router.Input[0] = feed(gp)
	if err := m.Graph().Sort(); err != nil {
		t.Fatal(err)
	}
	return m
}

// constRows is a constant [6, 16] initializer named name.
func constRows(gp *pb.GraphProto, name string) string {
	v := make([]float32, 6*16)
	for i := range v {
		v[i] = float32(i%7)*0.1 - 0.3
	}
	gp.Initializer = append(gp.Initializer, moe.Float32Tensor(name, []int64{6, 16}, v))
	return name
}

// secondInput declares a second graph input like the first, named name.
func secondInput(gp *pb.GraphProto, name string) string {
	gp.Input = append(gp.Input, &pb.ValueInfoProto{Name: proto.String(name), Type: gp.Input[0].Type})
	return name
}

// TestRouterInputNotHiddenRefused: a router linear that reads a constant,
// a value computed from constants, another graph input or a value computed
// from it (not the hidden state its experts read) is refused in every shape,
// naming the router linear and what it reads, rather than fused reading the
// wrong value or reported for a failure it does not have (a numerical check
// that fails, experts that seem to be missing). A router reading its own
// reshape of the hidden state fuses.
func TestRouterInputNotHiddenRefused(t *testing.T) {
	const linear = `router linear "node_layers.0.router_logits" reads `
	cases := []struct {
		name string
		feed func(gp *pb.GraphProto) string
		want string // "" : fuses
	}{
		{"constant", func(gp *pb.GraphProto) string { return constRows(gp, "router_rows") },
			linear + `"router_rows", which is computed from constants alone`},
		{"computed from constants", func(gp *pb.GraphProto) string {
			c := constRows(gp, "router_rows")
			gp.Node = append(gp.Node, graph.NewNode("Mul", "", "sq", []string{c, c}, []string{"router_sq"}))
			return "router_sq"
		}, linear + `"router_sq", which is computed from constants alone`},
		{"another input", func(gp *pb.GraphProto) string { return secondInput(gp, "other") },
			linear + `"other", computed from "other", which the experts do not read (they compute from "hidden_states")`},
		{"computed from another input", func(gp *pb.GraphProto) string {
			gp.Node = append(gp.Node, graph.NewNode("Tanh", "", "tanh_other", []string{secondInput(gp, "other")}, []string{"other_t"}))
			return "other_t"
		}, linear + `"other_t", computed from "other", which the experts do not read`},
		{"another value of the hidden state", func(gp *pb.GraphProto) string {
			gp.Node = append(gp.Node, graph.NewNode("Tanh", "", "tanh_x", []string{gp.Input[0].GetName()}, []string{"x_t"}))
			return "x_t"
		}, linear + `"x_t", a value computed from the hidden state that no expert reads`},
		{"its own reshape of the hidden state", func(gp *pb.GraphProto) string {
			gp.Initializer = append(gp.Initializer, moe.Int64Tensor("router_view_shape", []int64{2}, []int64{-1, 16}))
			gp.Node = append(gp.Node, graph.NewNode("Reshape", "", "router_view", []string{gp.Input[0].GetName(), "router_view_shape"}, []string{"router_view"}))
			return "router_view"
		}, ""},
	}
	for _, shape := range []string{models.ShapeBatched, models.ShapeUnrolled, models.ShapeDense} {
		for _, tc := range cases {
			t.Run(shape+"/"+tc.name, func(t *testing.T) {
				m := rerouted(t, shape, tc.feed)
				rep, err := Rewrite(m, Options{Check: true})
				if tc.want == "" {
					if err != nil || len(rep.Fused) != 1 {
						t.Fatalf("want one block fused, got %v", err)
					}
					return
				}
				if err == nil {
					t.Fatalf("fused %d blocks, want a refusal", len(rep.Fused))
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("refusal %q does not contain %q", err, tc.want)
				}
				if strings.Contains(tc.want, "constants alone") || strings.Contains(tc.want, "do not read") {
					if !strings.Contains(err.Error(), "routing does not depend on the hidden state: ") {
						t.Fatalf("refusal %q does not say the routing does not depend on the hidden state", err)
					}
				}
			})
		}
	}
}
