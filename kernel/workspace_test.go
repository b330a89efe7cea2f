package kernel

import "testing"

func TestEstimateWorkspace(t *testing.T) {
	spec := deepseekLike()
	k := DefaultKnobs()
	bf := EstimateWorkspace(spec, 64, 2048, BF16, k)
	mx := EstimateWorkspace(spec, 64, 2048, MXFP8, k)
	if bf.ScheduleRows != 2048*8*32 || mx.ScheduleRows != bf.ScheduleRows {
		t.Errorf("schedule rows %d / %d", bf.ScheduleRows, mx.ScheduleRows)
	}
	for _, w := range []Workspace{bf, mx} {
		var sum int64
		for _, it := range w.Items {
			if it.Bytes <= 0 || it.Name == "" || it.Shape == "" {
				t.Errorf("bad item %+v", it)
			}
			sum += it.Bytes
		}
		if sum != w.Total {
			t.Errorf("total %d, items sum %d", w.Total, sum)
		}
	}
	if mx.Total >= bf.Total {
		t.Errorf("MXFP8 workspace %d not smaller than BF16 %d", mx.Total, bf.Total)
	}
	// The combine buffer is bf16 [T·k, H].
	for _, it := range bf.Items {
		if it.Name == "combine_buffer" && it.Bytes != 2048*8*7168*2 {
			t.Errorf("combine buffer %d bytes", it.Bytes)
		}
	}
	// More tokens never need less memory.
	if big := EstimateWorkspace(spec, 64, 4096, BF16, k); big.Total <= bf.Total {
		t.Errorf("workspace not increasing in T: %d <= %d", big.Total, bf.Total)
	}
}
