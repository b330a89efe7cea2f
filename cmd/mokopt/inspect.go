package main

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
	"github.com/mokopt/mokopt/passes"
	"github.com/spf13/cobra"
)

func init() { subcommands = append(subcommands, newInspectCmd) }

// ModelSummary is the structural part of `mokopt inspect --json`.
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

func printSummary(w io.Writer, s *ModelSummary) {
	fmt.Fprintf(w, "%s: IR %d, %d nodes, %d functions, %d initializers (%s, %s external)\n",
		s.File, s.IRVersion, s.Nodes, s.Functions, s.Initializers, humanBytes(s.InitializerBytes), humanBytes(s.ExternalBytes))
	var ops []string
	for _, o := range s.Opsets {
		d := o.Domain
		if d == "" {
			d = "ai.onnx"
		}
		ops = append(ops, fmt.Sprintf("%s %d", d, o.Version))
	}
	fmt.Fprintf(w, "opsets: %s\n", strings.Join(ops, ", "))
	for _, v := range s.Inputs {
		fmt.Fprintf(w, "input  %s %s [%s]\n", v.Name, v.Type, strings.Join(v.Shape, ", "))
	}
	for _, v := range s.Outputs {
		fmt.Fprintf(w, "output %s %s [%s]\n", v.Name, v.Type, strings.Join(v.Shape, ", "))
	}
	var census []string
	for _, c := range s.Ops {
		census = append(census, fmt.Sprintf("%s %d", c.Op, c.Count))
	}
	fmt.Fprintf(w, "ops: %s\n", strings.Join(census, ", "))
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for v := n / unit; v >= unit; v /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func newInspectCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "inspect MODEL",
		Short: "Summarise a model: IR, opsets, op census, initializers, inputs and outputs",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			m, err := loadModel(args[0])
			if err != nil {
				return err
			}
			defer m.Close()
			s, err := summarize(m)
			if err != nil {
				return err
			}
			det, err := passes.Detect(m)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(c.OutOrStdout(), map[string]any{"schema_version": 1, "model": s, "moe": inspectBlocks(det)})
			}
			printSummary(c.OutOrStdout(), s)
			printBlocks(c.OutOrStdout(), det)
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "machine-readable output")
	return c
}

// BlockSummary is one MoE block in `inspect --json`.
type BlockSummary struct {
	Name   string   `json:"name"`
	Kind   string   `json:"kind"`
	Input  string   `json:"input"`
	Output string   `json:"output"`
	Nodes  int      `json:"nodes"`
	Spec   moe.Spec `json:"spec"`
}

// MoESummary is the MoE part of `inspect --json`.
type MoESummary struct {
	Blocks     []BlockSummary    `json:"blocks"`
	NearMisses []passes.NearMiss `json:"near_misses"`
}

func inspectBlocks(det *passes.Detection) MoESummary {
	out := MoESummary{Blocks: []BlockSummary{}, NearMisses: det.NearMiss}
	if out.NearMisses == nil {
		out.NearMisses = []passes.NearMiss{}
	}
	for _, b := range det.Blocks {
		out.Blocks = append(out.Blocks, BlockSummary{Name: b.Name, Kind: b.Kind, Input: b.Input, Output: b.Output, Nodes: b.Nodes, Spec: b.Spec})
	}
	return out
}

func printBlocks(w io.Writer, det *passes.Detection) {
	fmt.Fprintf(w, "MoE blocks: %d\n", len(det.Blocks))
	for _, b := range det.Blocks {
		s := b.Spec
		fmt.Fprintf(w, "  %s (%s, %d nodes): E=%d k=%d H=%d I=%d\n", b.Name, b.Kind, b.Nodes, s.NumExperts, s.TopK, s.Hidden, s.Inter)
		router := s.RouterActivation + ", " + s.RouterOrder
		if s.NormalizeTopK {
			router += ", renormalised"
		}
		if s.RoutedScalingFactor != 1 {
			router += fmt.Sprintf(", scaled x%g", s.RoutedScalingFactor)
		}
		if s.NGroup > 1 {
			router += fmt.Sprintf(", group-limited %d of %d groups", s.TopKGroup, s.NGroup)
		}
		if s.RouterBias {
			router += ", router bias"
		}
		if s.CorrectionBias {
			router += ", score-correction bias"
		}
		if s.WeightsOnInput {
			router += ", weights on input"
		}
		fmt.Fprintf(w, "    router: %s\n", router)
		act := s.Activation
		if s.Activation != moe.SwiGLU && s.Activation != moe.GELU {
			act += fmt.Sprintf(" (alpha %g, limit %g)", s.SwiGLUAlpha, s.SwiGLULimit)
		}
		if s.GateUpInterleaved {
			act += ", interleaved gate/up"
		}
		if s.ExpertBias {
			act += ", expert biases"
		}
		fmt.Fprintf(w, "    experts: %s\n", act)
		switch {
		case s.SharedInter == 0:
			fmt.Fprintf(w, "    shared expert: none\n")
		case s.SharedGated:
			fmt.Fprintf(w, "    shared expert: I=%d, sigmoid-gated\n", s.SharedInter)
		default:
			fmt.Fprintf(w, "    shared expert: I=%d, ungated\n", s.SharedInter)
		}
	}
	for _, n := range det.NearMiss {
		fmt.Fprintf(w, "  near-miss at %s: %s\n", n.Node, n.Reason)
	}
}
