package moe

// ProvenanceKey prefixes the model metadata_props entries that record, per
// fused node, what it replaced: the key is ProvenanceKey + the fused node's
// name, the value a Provenance as JSON.
const ProvenanceKey = "ai.mok.fused/"

// Provenance is what a fused ai.mok::MoE node replaced, stored as JSON in
// the model's metadata_props under ProvenanceKey + Node.
type Provenance struct {
	// Node is the fused node's name.
	Node string `json:"node"`
	// Kind is the detected block kind (batched, unrolled, dense, ...).
	Kind string `json:"kind"`
	// Nodes and Initializers name what the fused node replaced.
	Nodes        []string `json:"nodes"`
	Initializers []string `json:"initializers"`
	// Spec is the fused node's spec.
	Spec Spec `json:"spec"`
	// TracedExperts is non-zero when the block was restored from a trace
	// that computed only that many experts.
	TracedExperts int `json:"traced_experts,omitempty"`
	// NullExperts is non-zero when the last NullExperts of the spec's
	// experts are null experts of the original router, held as zero
	// weights.
	NullExperts int `json:"null_experts,omitempty"`
	// SourceType is the element type the replaced weights were stored in
	// when that was a half type ("float16" or "bfloat16"): the original
	// block computed at that precision, and the fused node, which takes
	// float32 weights, agrees with it to that precision.
	SourceType string `json:"source_type,omitempty"`
}
