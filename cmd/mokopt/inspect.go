package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/internal/diff"
	"github.com/mokopt/mokopt/moe"
	"github.com/mokopt/mokopt/passes"
	"github.com/spf13/cobra"
)

func init() { subcommands = append(subcommands, newInspectCmd) }

func printSummary(w io.Writer, s *mokopt.ModelSummary) {
	// Names come from the model: escaped (diff.Printable), a name holding
	// a newline or an escape sequence cannot forge or hide lines.
	p := diff.Printable
	fmt.Fprintf(w, "%s: IR %d, %d nodes, %d functions, %d initializers (%s, %s external)\n",
		p(s.File), s.IRVersion, s.Nodes, s.Functions, s.Initializers, humanBytes(s.InitializerBytes), humanBytes(s.ExternalBytes))
	var ops []string
	for _, o := range s.Opsets {
		d := o.Domain
		if d == "" {
			d = "ai.onnx"
		}
		ops = append(ops, fmt.Sprintf("%s %d", p(d), o.Version))
	}
	fmt.Fprintf(w, "opsets: %s\n", strings.Join(ops, ", "))
	for _, v := range s.Inputs {
		fmt.Fprintf(w, "input  %s %s [%s]\n", p(v.Name), p(v.Type), p(strings.Join(v.Shape, ", ")))
	}
	for _, v := range s.Outputs {
		fmt.Fprintf(w, "output %s %s [%s]\n", p(v.Name), p(v.Type), p(strings.Join(v.Shape, ", ")))
	}
	var census []string
	for _, c := range s.Ops {
		census = append(census, fmt.Sprintf("%s %d", p(c.Op), c.Count))
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
	var epf epFlags
	c := &cobra.Command{
		Use:   "inspect MODEL",
		Short: "Summarise a model: IR, opsets, op census, initializers, inputs and outputs",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			m, err := loadForInspect(c, args[0])
			if err != nil {
				return err
			}
			defer m.Close()
			tbl, err := epf.table()
			if err != nil {
				return err
			}
			in, err := mokopt.InspectWith(c.Context(), m, mokopt.InspectOptions{EPTable: tbl})
			if err != nil {
				return err
			}
			s, det := &in.Model, in.Detection
			if asJSON {
				return writeJSON(c.OutOrStdout(), map[string]any{"schema_version": 1, "model": s, "moe": in.MoE})
			}
			printSummary(c.OutOrStdout(), s)
			printBlocks(c.OutOrStdout(), det)
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "machine-readable output")
	epf.addDetect(c.Flags())
	return c
}

func printBlocks(w io.Writer, det *passes.Detection) {
	p := diff.Printable
	fmt.Fprintf(w, "MoE blocks: %d\n", len(det.Blocks))
	for _, b := range det.Blocks {
		s := b.Spec
		fmt.Fprintf(w, "  %s (%s, %d nodes): E=%d k=%d H=%d I=%d\n", p(b.Name), p(b.Kind), b.Nodes, s.NumExperts, s.TopK, s.Hidden, s.Inter)
		router := s.RouterActivation + ", " + s.RouterOrder
		if s.NormalizeTopK {
			router += ", renormalised"
		}
		if s.RoutedScalingFactor != 1 {
			router += fmt.Sprintf(", scaled x%g", s.RoutedScalingFactor)
		}
		if s.RouterActivation == moe.SparseMixer {
			router += fmt.Sprintf(", threshold %g", s.SparseMixerThreshold)
		}
		if s.NGroup > 1 {
			router += fmt.Sprintf(", group-limited %d of %d groups", s.TopKGroup, s.NGroup)
			if s.GroupScore == moe.GroupScoreMax {
				router += " (scored by their best expert)"
			}
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
		printEP(w, b)
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
		fmt.Fprintf(w, "  near-miss at %s: %s\n", p(n.Node), p(n.Reason))
	}
}

// loadForInspect is loadModel for inspect, which reads no weight bytes of
// big tensors: a model whose only problem is a missing side file is
// summarised anyway, with a warning; a tensor the detector then needs from
// the missing file fails naming it.
func loadForInspect(c *cobra.Command, path string) (*mokopt.Model, error) {
	m, err := mokopt.Load(path)
	if err != nil {
		return nil, &exitError{code: 2, msg: err.Error(), err: err}
	}
	err = m.Graph().Check()
	if err == nil {
		return m, nil
	}
	if onlyMissingSideFiles(err) {
		fmt.Fprintf(c.ErrOrStderr(), "mokopt: warning: %s: a side file is missing; summarising without its weights: %s\n", diff.Printable(path), diff.Printable(err.Error()))
		return m, nil
	}
	m.Close()
	return nil, &exitError{code: 2, msg: err.Error(), err: err}
}

// onlyMissingSideFiles reports whether every problem err lists (a Check
// error joining them) is an external data file that does not exist.
func onlyMissingSideFiles(err error) bool {
	var ie *graph.InputError
	if !errors.As(err, &ie) || ie.Err == nil {
		return false
	}
	problems := []error{ie.Err}
	if j, ok := ie.Err.(interface{ Unwrap() []error }); ok {
		problems = j.Unwrap()
	}
	for _, p := range problems {
		if !errors.Is(p, fs.ErrNotExist) {
			return false
		}
	}
	return len(problems) > 0
}
