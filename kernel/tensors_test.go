package kernel

import (
	"reflect"
	"testing"
)

func TestTensorTable(t *testing.T) {
	d := Dims{T: 2048, H: 7168, I: 2048, TopK: 8, ELocal: 6}
	byName := func(ts []TensorSpec) map[string]TensorSpec {
		m := map[string]TensorSpec{}
		for _, s := range ts {
			if _, dup := m[s.Name]; dup {
				t.Fatalf("duplicate tensor %s", s.Name)
			}
			m[s.Name] = s
		}
		return m
	}
	for _, tc := range []struct {
		p        Precision
		training bool
		n        int
		want     map[string][]int
		dtypes   map[string]DType
		absent   []string
	}{
		{BF16, false, 10, map[string][]int{
			"x": {2048, 7168}, "topk_experts": {2048, 8}, "router_weights": {2048, 8},
			"w_shared_gate": {2048, 7168}, "w_shared_down": {7168, 2048},
			"w_routed_gate": {6, 2048, 7168}, "w_routed_down": {6, 7168, 2048}, "output": {2048, 7168},
		}, map[string]DType{"w_routed_gate": DTypeBF16, "topk_experts": DTypeInt64, "router_weights": DTypeFP32},
			[]string{"w_routed_gate_sc", "w_routed_gate_t"}},
		{MXFP8, false, 13, map[string][]int{
			"w_routed_gate": {6, 2048, 7168}, "w_routed_gate_sc": {6 * 2048 / 128, 7168 / 128, 32, 16},
			"w_routed_up_sc": {96, 56, 32, 16}, "w_routed_down": {6, 7168, 2048}, "w_routed_down_sc": {6 * 7168 / 128, 2048 / 128, 32, 16},
		}, map[string]DType{"w_routed_gate": DTypeE4M3, "w_routed_gate_sc": DTypeUE8M0, "w_shared_up": DTypeBF16},
			[]string{"w_routed_gate_t"}},
		{MXFP8, true, 19, map[string][]int{
			"w_routed_gate_t": {6, 7168, 2048}, "w_routed_gate_t_sc": {6 * 7168 / 128, 2048 / 128, 32, 16},
			"w_routed_down_t": {6, 2048, 7168}, "w_routed_down_t_sc": {6 * 2048 / 128, 7168 / 128, 32, 16},
		}, nil, nil},
	} {
		ts := Tensors(tc.p, tc.training)
		if len(ts) != tc.n {
			t.Errorf("%s training=%v: %d tensors, want %d", tc.p, tc.training, len(ts), tc.n)
		}
		m := byName(ts)
		for name, want := range tc.want {
			s, ok := m[name]
			if !ok {
				t.Errorf("%s: missing %s", tc.p, name)
				continue
			}
			if got := s.Dims(d); !reflect.DeepEqual(got, want) {
				t.Errorf("%s %s: dims %v, want %v (%s)", tc.p, name, got, want, s.ShapeString())
			}
			if len(s.Shape) != len(want) {
				t.Errorf("%s: formula %v has %d dims", name, s.Shape, len(s.Shape))
			}
		}
		for name, dt := range tc.dtypes {
			if m[name].DType != dt {
				t.Errorf("%s %s: dtype %s, want %s", tc.p, name, m[name].DType, dt)
			}
		}
		for _, name := range tc.absent {
			if _, ok := m[name]; ok {
				t.Errorf("%s training=%v: %s should be absent", tc.p, tc.training, name)
			}
		}
	}
	// Sizes: MXFP8 routed gate is 1 byte per element plus 1/32 for scales.
	m := byName(Tensors(MXFP8, false))
	if got, want := m["w_routed_gate"].Bytes(d)+m["w_routed_gate_sc"].Bytes(d), int64(6*2048*7168)*33/32; got != want {
		t.Errorf("MXFP8 gate bytes %d, want %d", got, want)
	}
}
