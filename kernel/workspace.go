package kernel

// WorkspaceItem is one buffer of a workspace estimate.
type WorkspaceItem struct {
	// Name names the buffer (MoK's name where known).
	Name string
	// Shape is the shape formula.
	Shape string
	// Bytes is the size in bytes.
	Bytes int64
	// Symmetric is true for buffers in symmetric (peer-addressable) memory that
	// other ranks write over NVLink.
	Symmetric bool
}

// Workspace is an estimate of the per-rank device memory one MoK layer needs
// besides its weights, inputs and output.
type Workspace struct {
	// ScheduleRows is the schedule capacity, see ScheduleRows.
	ScheduleRows int
	// Items are the buffers.
	Items []WorkspaceItem
	// Total is the sum of Items' bytes.
	Total int64
}

// EstimateWorkspace estimates the per-rank workspace of one MoK layer for the
// forward pass. It is an estimate, not the kernel's allocator; its assumptions:
//
//   - Routing all-gather: int32 [EP, T, k] (every rank's top-k ids; MoK's
//     schedule op takes them as topk_all).
//   - Schedule: int32 peer rank and int32 peer token index per schedule row
//     (ScheduleRows rows), plus num_tokens [1] and tokens_per_expert [E_l].
//   - Combine buffer: bf16 [T·k, H] in symmetric memory (expert outputs written
//     back by the expert ranks; the router weights are applied after combine).
//   - Forward activations kept for backward, with the row count of the routed
//     ones set by macrobatch_size (M rows), as MoK's forward returns them:
//     BF16: x [M, H], gate, up, hidden [M, I], y [M, H]; MXFP8: x transposed
//     e4m3 [H, M], gate and up e4m3 [M, I], hidden transposed e4m3 [I, M], each
//     with its UE8M0 scales (1 byte per 32 elements), and y bf16 [M, H]. The
//     shared expert's gate, up, hidden [T, I] and y [T, H] are bf16 in both.
//   - The backward pass's buffers are not estimated (unknown).
//
// The shapes of the last two come from MoK's public Python operator signatures
// (mok::dispatch_mlp_swiglu_combine_fwd_{bf16,mxfp8}), not from docs/kernel.md.
func EstimateWorkspace(spec LayerSpec, ep, tokensPerRank int, p Precision, knobs Knobs) Workspace {
	T, H, I, k := int64(tokensPerRank), int64(spec.H), int64(spec.I), int64(spec.K)
	eLocal := int64(0)
	if ep > 0 {
		eLocal = int64(spec.E / ep)
	}
	M := int64(knobs.MacrobatchSize)
	rows := ScheduleRows(tokensPerRank, spec.K, ep, knobs.ScheduleCapacityMultiplier)
	w := Workspace{ScheduleRows: rows}
	add := func(name, shape string, bytes int64, symmetric bool) {
		w.Items = append(w.Items, WorkspaceItem{Name: name, Shape: shape, Bytes: bytes, Symmetric: symmetric})
		w.Total += bytes
	}
	add("topk_all", "int32 [EP, T, k]", int64(ep)*T*k*4, true)
	add("schedule_peer_rank", "int32 [schedule_rows]", int64(rows)*4, false)
	add("schedule_peer_token_idx", "int32 [schedule_rows]", int64(rows)*4, false)
	add("num_tokens, tokens_per_expert", "int32 [1 + E_l]", (1+eLocal)*4, false)
	add("combine_buffer", "bf16 [T·k, H]", T*k*H*2, true)
	switch p {
	case MXFP8:
		add("x_fp8_t_routed (+ scales)", "e4m3 [H, M] + uint8 [H/128, M/128, 32, 16]", H*M+H*M/32, false)
		add("gate_fp8_routed (+ scales)", "e4m3 [M, I] + uint8 [M/128, I/128, 32, 16]", M*I+M*I/32, false)
		add("up_fp8_routed (+ scales)", "e4m3 [M, I] + uint8 [M/128, I/128, 32, 16]", M*I+M*I/32, false)
		add("hidden_fp8_t_routed (+ scales)", "e4m3 [I, M] + uint8 [I/128, M/128, 32, 16]", I*M+I*M/32, false)
	default:
		add("x_routed", "bf16 [M, H]", M*H*2, false)
		add("gate_routed", "bf16 [M, I]", M*I*2, false)
		add("up_routed", "bf16 [M, I]", M*I*2, false)
		add("hidden_routed", "bf16 [M, I]", M*I*2, false)
	}
	add("y_routed", "bf16 [M, H]", M*H*2, false)
	add("gate_shared, up_shared, hidden_shared", "3 × bf16 [T, I]", 3*T*I*2, false)
	add("y_shared", "bf16 [T, H]", T*H*2, false)
	return w
}
