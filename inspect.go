package mokopt

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
	"github.com/mokopt/mokopt/passes"
)

// Inspection is what Inspect finds: the model's structure and its MoE
// blocks. `mokopt inspect --json` writes it as
// {"schema_version": 1, "model": Model, "moe": MoE}.
type Inspection struct {
	Model ModelSummary `json:"model"`
	MoE   MoESummary   `json:"moe"`
	// Detection is the detector's full result.
	Detection *passes.Detection `json:"-"`
}

// ModelSummary is the structural part of an Inspection.
type ModelSummary struct {
	File             string          `json:"file"`
	IRVersion        int64           `json:"ir_version"`
	Producer         string          `json:"producer,omitempty"`
	Opsets           []OpsetEntry    `json:"opsets"`
	Nodes            int             `json:"nodes"`
	Functions        int             `json:"functions"`
	Ops              []graph.OpCount `json:"ops"`
	Initializers     int             `json:"initializers"`
	InitializerBytes int64           `json:"initializer_bytes"`
	ExternalBytes    int64           `json:"external_bytes"`
	Inputs           []ValueSummary  `json:"inputs"`
	Outputs          []ValueSummary  `json:"outputs"`
}

// OpsetEntry is one opset_import row.
type OpsetEntry struct {
	Domain  string `json:"domain"`
	Version int64  `json:"version"`
}

// ValueSummary is a graph input or output with its type.
type ValueSummary struct {
	Name  string   `json:"name"`
	Type  string   `json:"type"`
	Shape []string `json:"shape"`
}

// BlockSummary is one MoE block of an Inspection.
type BlockSummary struct {
	Name   string   `json:"name"`
	Kind   string   `json:"kind"`
	Input  string   `json:"input"`
	Output string   `json:"output"`
	Nodes  int      `json:"nodes"`
	Spec   moe.Spec `json:"spec"`
	// Placement is where an EP block multiplies the routing weights
	// (before_combine, after_combine, or sharding for annotations).
	Placement string `json:"placement,omitempty"`
	// Scope says where the block lives when not in the main graph (e.g.
	// `If node "cond"'s then_branch`; nested subgraphs joined by " > ").
	Scope string `json:"scope,omitempty"`
}

// InspectOptions control InspectWith.
type InspectOptions struct {
	// EPTable names the EP collectives to recognise (nil: the defaults).
	EPTable *EPTable
}

// MoESummary is the MoE part of an Inspection.
type MoESummary struct {
	Blocks     []BlockSummary `json:"blocks"`
	NearMisses []Candidate    `json:"near_misses"`
}

// Inspect summarises m (IR, opsets, op census, initializer bytes without
// reading external data, inputs and outputs) and detects its MoE blocks and
// near-misses. It never edits m.
func Inspect(ctx context.Context, m *Model) (*Inspection, error) {
	return InspectWith(ctx, m, InspectOptions{})
}

// InspectWith is Inspect with options.
func InspectWith(ctx context.Context, m *Model, opt InspectOptions) (*Inspection, error) {
	if err := errCtx(ctx); err != nil {
		return nil, err
	}
	s, err := summarize(m.g)
	if err != nil {
		return nil, err
	}
	det, err := passes.DetectWith(m.g, passes.DetectOptions{Context: ctx, EPTable: opt.EPTable})
	if err != nil {
		return nil, err
	}
	in := &Inspection{Model: *s, Detection: det, MoE: MoESummary{Blocks: []BlockSummary{}, NearMisses: det.NearMiss}}
	if in.MoE.NearMisses == nil {
		in.MoE.NearMisses = []Candidate{}
	}
	for _, b := range det.Blocks {
		in.MoE.Blocks = append(in.MoE.Blocks, BlockSummary{Name: b.Name, Kind: b.Kind, Input: b.Input, Output: b.Output, Nodes: b.Nodes, Spec: b.Spec, Placement: b.Placement, Scope: b.Scope})
	}
	return in, nil
}

func summarize(m *graph.Model) (*ModelSummary, error) {
	mp := m.Proto
	s := &ModelSummary{File: m.Name(), IRVersion: mp.GetIrVersion(), Producer: strings.TrimSpace(mp.GetProducerName() + " " + mp.GetProducerVersion()),
		Nodes: len(mp.Graph.Node), Functions: len(mp.Functions)}
	for _, o := range mp.OpsetImport {
		s.Opsets = append(s.Opsets, OpsetEntry{Domain: o.GetDomain(), Version: o.GetVersion()})
	}
	sort.Slice(s.Opsets, func(i, j int) bool { return s.Opsets[i].Domain < s.Opsets[j].Domain })
	s.Ops = m.Graph().OpCensus()
	for _, t := range mp.Graph.Initializer {
		s.Initializers++
		n, err := graph.ByteSize(graph.DataType(t), t.GetDims())
		if err != nil {
			if graph.DataType(t) == pb.TensorProto_STRING {
				continue
			}
			return nil, &graph.InputError{File: m.Name(), Object: fmt.Sprintf("initializer %q", t.GetName()), Msg: err.Error()}
		}
		s.InitializerBytes += n
		if graph.IsExternal(t) {
			s.ExternalBytes += n
		}
	}
	for _, v := range mp.Graph.Input {
		s.Inputs = append(s.Inputs, valueSummary(v))
	}
	for _, v := range mp.Graph.Output {
		s.Outputs = append(s.Outputs, valueSummary(v))
	}
	return s, nil
}

func valueSummary(v *pb.ValueInfoProto) ValueSummary {
	vs := ValueSummary{Name: v.GetName(), Type: "?"}
	if tt := v.GetType().GetTensorType(); tt != nil {
		vs.Type = pb.TensorProto_DataType(tt.GetElemType()).String()
		for _, d := range tt.GetShape().GetDim() {
			switch d.Value.(type) {
			case *pb.TensorShapeProto_Dimension_DimParam:
				vs.Shape = append(vs.Shape, d.GetDimParam())
			case *pb.TensorShapeProto_Dimension_DimValue:
				vs.Shape = append(vs.Shape, fmt.Sprint(d.GetDimValue()))
			default:
				vs.Shape = append(vs.Shape, "?")
			}
		}
	}
	return vs
}
