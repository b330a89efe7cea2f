package mokopt

import (
	"context"
	"sync"
	"testing"
)

// TestSharedModelReadOnly: the read-only entry points (Inspect, Verify,
// Run, Diff, and Check through them) may share one *Model across
// goroutines. Under -race (as .ci/run runs this test) a write to shared
// model state while another goroutine reads it fails the test; without it,
// every goroutine must still see the same results.
func TestSharedModelReadOnly(t *testing.T) {
	m, err := Load("testdata/example/mixtral_block_dynamo_batched_mm.onnx")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	blocks := make([]int, 4)
	errs := make([]error, 8)
	for i := range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			in, err := Inspect(ctx, m)
			if err == nil {
				blocks[i] = len(in.MoE.Blocks)
			}
			errs[2*i] = err
		}()
		go func() {
			defer wg.Done()
			switch i % 3 {
			case 0:
				_, errs[2*i+1] = Verify(ctx, m, m, VerifyOptions{Tokens: []int{4}})
			case 1:
				_, errs[2*i+1] = Run(ctx, m, "testdata/example/mixtral_block_dynamo_batched_mm_data", VerifyOptions{})
			default:
				_, errs[2*i+1] = Diff(m, m)
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("goroutine %d: %v", i, err)
		}
	}
	for i, n := range blocks {
		if n != 1 {
			t.Errorf("Inspect %d found %d blocks, want 1", i, n)
		}
	}
}
