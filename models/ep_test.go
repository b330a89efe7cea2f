package models

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	"github.com/mokopt/mokopt/internal/ep"
)

// runEPGroup runs the G rank models of c on x [G·T, H] (rank r gets rows
// [r·T, (r+1)·T)) with simulated collectives and returns the concatenated outputs.
func runEPGroup(t *testing.T, c EPConfig, x []float32, T int) []float32 {
	t.Helper()
	H := c.Hidden
	ms := make([]*graph.Model, c.EP)
	feeds := make([]map[string]*eval.Tensor, c.EP)
	for r := range ms {
		m, err := BuildRank(c, r)
		if err != nil {
			t.Fatal(err)
		}
		ms[r] = m
		feeds[r] = map[string]*eval.Tensor{InputName: eval.NewFloat32([]int{T, H}, append([]float32(nil), x[r*T*H:(r+1)*T*H]...))}
		if c.Replicated() { // every rank sees all tokens
			feeds[r] = map[string]*eval.Tensor{InputName: eval.NewFloat32([]int{c.EP * T, H}, append([]float32(nil), x...))}
		}
	}
	outs, err := ep.RunRanks(context.Background(), nil, ms, feeds, eval.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var y []float32
	for r, o := range outs {
		if c.Replicated() {
			if r > 0 && !slices.Equal(o[OutputName].F32, outs[0][OutputName].F32) {
				t.Fatalf("rank %d's output differs from rank 0's", r)
			}
			continue
		}
		y = append(y, o[OutputName].F32...)
	}
	if c.Replicated() {
		y = outs[0][OutputName].F32
	}
	return y
}

func TestEPRanksMatchReference(t *testing.T) {
	const T = 3
	for _, tc := range []struct {
		form, placement string
		ep, experts     int
		shared          int
	}{
		{FormORTAllToAll, BeforeCombine, 4, 8, 0},
		{FormORTAllToAll, AfterCombine, 4, 8, 16},
		{FormDeepEP, BeforeCombine, 4, 8, 0},
		{FormDeepEP, AfterCombine, 8, 16, 16},
		{FormORTAllToAll, BeforeCombine, 8, 8, 0},
		{FormORTAllGather, BeforeCombine, 4, 8, 16},
		{FormORTAllGather, AfterCombine, 8, 16, 0},
		{FormORTSharded, AfterCombine, 4, 8, 0},
		{FormORTSharded, AfterCombine, 8, 16, 0},
	} {
		t.Run(fmt.Sprintf("%s/%s/ep%d", tc.form, tc.placement, tc.ep), func(t *testing.T) {
			c := EPConfig{Config: Config{Layers: 2, Experts: tc.experts, TopK: 2, Hidden: 16, Inter: 24, SharedInter: tc.shared, Normalize: true, Seed: 5},
				Form: tc.form, EP: tc.ep, Placement: tc.placement}
			rng := rand.New(rand.NewPCG(1, 2))
			x := make([]float32, tc.ep*T*c.Hidden)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			got := runEPGroup(t, c, x, T)
			ref, err := Build(c.Reference())
			if err != nil {
				t.Fatal(err)
			}
			want, err := eval.Run(context.Background(), ref, map[string]*eval.Tensor{InputName: eval.NewFloat32([]int{tc.ep * T, c.Hidden}, x)}, eval.Options{})
			if err != nil {
				t.Fatal(err)
			}
			w := want[OutputName].F32
			if len(w) != len(got) {
				t.Fatalf("got %d values, want %d", len(got), len(w))
			}
			worst := 0.0
			for i := range w {
				worst = max(worst, math.Abs(float64(w[i]-got[i])))
			}
			if worst > 1e-5 {
				t.Fatalf("EP group differs from the reference by %g", worst)
			}
		})
	}
}
