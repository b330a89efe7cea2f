package moe

import (
	"context"
	"math"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// TestActivationBodies: every row's function body, run in the interpreter
// on a grid of gate and up values, computes the row's reference within the
// row's own tolerance, and Activate (the reference semantics) agrees too.
func TestActivationBodies(t *testing.T) {
	var gs, us []float32
	for _, g := range []float32{-40, -8, -3, -2.5, -1, -0.1, 0, 1e-3, 0.5, 1, 2.25, 3, 6, 9, 40} {
		for _, u := range []float32{-9, -2, -0.5, 0, 0.3, 1.5, 8} {
			gs, us = append(gs, g), append(us, u)
		}
	}
	for i := range Activations {
		def := &Activations[i]
		t.Run(def.Name, func(t *testing.T) {
			p := ActParams{Alpha: 1}
			if def.Alpha {
				p.Alpha = 1.702
			}
			if def.Limit != LimitNone {
				p.Limit = 7
			}
			b := &Builder{Prefix: "t"}
			g := ""
			if def.Gated {
				g = "g"
			}
			out := def.Body(b, g, "u", p)
			gp := &pb.GraphProto{Name: proto.String("act"), Node: append(b.Nodes, graph.NewNode("Identity", "", "", []string{out}, []string{"y"})),
				Input:  []*pb.ValueInfoProto{{Name: proto.String("g")}, {Name: proto.String("u")}},
				Output: []*pb.ValueInfoProto{{Name: proto.String("y")}}}
			m := &graph.Model{Proto: &pb.ModelProto{IrVersion: proto.Int64(10), Graph: gp,
				OpsetImport: []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(13)}}}}
			feeds := map[string]*eval.Tensor{"g": eval.NewFloat32([]int{len(gs)}, gs), "u": eval.NewFloat32([]int{len(us)}, us)}
			res, err := eval.Run(context.Background(), m, feeds, eval.Options{Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			s := &Spec{Activation: def.Name, SwiGLUAlpha: p.Alpha, SwiGLULimit: p.Limit}
			for j, y := range res["y"].F32 {
				gj, uj := float64(gs[j]), float64(us[j])
				want := def.Eval(gj, uj, p)
				tol := def.RTol*math.Abs(want) + def.ATol*(1+math.Abs(gj))*(1+math.Abs(uj))
				if d := math.Abs(float64(y) - want); d > tol {
					t.Fatalf("body at g=%g u=%g: %g, reference %g", gj, uj, y, want)
				}
				if d := math.Abs(float64(Activate(s, gs[j], us[j])) - want); d > tol {
					t.Fatalf("Activate at g=%g u=%g: %g, reference %g", gj, uj, Activate(s, gs[j], us[j]), want)
				}
			}
		})
	}
}
