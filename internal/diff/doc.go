// Package diff compares two ONNX models structurally and explains the
// difference, with first-class support for mokopt's rewrite: each fused
// ai.mok::MoE node of the new model is reported together with the region of
// the old model it replaced.
//
// # Matching
//
// Exporters rename freely, so nodes are matched by structure, not by name.
// Values are identified by where they come from: graph inputs by position,
// initializers by content (SHA-256 of the raw bytes, data type and dims),
// node outputs by the node's signature and output index. Each node gets a
// forward signature (op key and overload, attributes canonicalised — sorted
// by name, tensors by content, subgraphs by structure — and the signatures
// of its inputs) and a backward signature (op, attributes, and the
// signatures of its consumers and the graph outputs it feeds, by position).
// Computed in topological order over the DAG, these are the fixed point of
// Weisfeiler-Lehman refinement. Nodes with equal signatures are paired;
// the rest are paired by position in structure (same op, fed by paired
// nodes through the same input slots, or feeding paired nodes), which finds
// nodes whose attributes or inputs changed. See matcher for the details.
// Matching is linear in the size of the graphs.
//
// What stays unpaired in A is removed, in B added; a pair whose attributes
// or input wiring differ is changed. A slot whose old producer was removed
// and whose new producer was added is not a change of the reading node.
//
// # Fused regions
//
// An added node in domain ai.mok (or one with a provenance record
// "ai.mok.fused/<name>" in B's metadata_props) is a fused node. Its region
// is read from the provenance record when present and checked against the
// removed nodes; without a record it is inferred as the removed nodes
// connected to the values the fused node reads and produces. The new
// stacked initializers, the model-local function, the ai.mok opset import,
// the provenance record and the IR version raise are reported under the
// region too, so a diff of an original model against its rewrite shows the
// fused regions and nothing else.
//
// # Output
//
// Compare returns a Result; Text (optionally coloured), Stat, JSON
// (schema in docs/diff-schema.md), JSONStat, Markdown, DOT and HTML render it. HTML
// embeds an SVG drawn by the Graphviz dot program when installed (see
// RenderSVG), else the DOT source.
package diff
