package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/mokopt/mokopt"
	"github.com/spf13/cobra"
)

// unusedRule names the flags of a command that its mode or target does not
// use: set on the command line while when holds, each is refused (exit 2)
// naming the flag, where it does not apply and why, instead of being
// silently ignored.
type unusedRule struct {
	cmd   string
	when  func(c *cobra.Command) bool
	where string
	flags map[string]string // flag name -> why it does not apply
}

// flagSet reports whether flag name of c was given on the command line.
func flagSet(c *cobra.Command, name string) bool {
	f := c.Flags().Lookup(name)
	return f != nil && f.Changed
}

// flagIs reports whether flag name of c has the value v.
func flagIs(c *cobra.Command, name, v string) bool {
	f := c.Flags().Lookup(name)
	return f != nil && f.Value.String() == v
}

// mokTargets lists the MoK racks --target takes ("gb200-nvl72 or gb300-nvl72").
func mokTargets() string {
	var s []string
	for _, t := range mokopt.Targets() {
		if t.IsMoK() {
			s = append(s, string(t))
		}
	}
	return strings.Join(s, " or ")
}

// unusedRules is every command's survey of flags against its modes and
// targets.
var unusedRules = []unusedRule{
	{"rewrite", func(c *cobra.Command) bool { return flagSet(c, "merge-ranks") }, "with --merge-ranks", map[string]string{
		"check-data": "the group check runs the ranks in lockstep on random inputs of --ep-check-tokens tokens per rank",
	}},
	{"rewrite", func(c *cobra.Command) bool { return !flagSet(c, "merge-ranks") }, "without --merge-ranks", map[string]string{
		"ep-check-tokens": "it sizes the group check of --merge-ranks",
	}},
	{"rewrite", func(c *cobra.Command) bool { return flagSet(c, "no-check") }, "with --no-check", map[string]string{
		"check-data":      "no numerical check runs",
		"mem-limit":       "it caps the numerical check's interpreter, and no check runs",
		"ep-check-tokens": "no group check runs",
	}},
	{"verify", func(c *cobra.Command) bool { return flagSet(c, "data") }, "with --data", map[string]string{
		"tokens": "the inputs come from the data set, not random",
		"seed":   "the inputs come from the data set, not random",
	}},
	{"verify", func(c *cobra.Command) bool { return !flagIs(c, "engine", "ref") }, "with --engine other than ref", map[string]string{
		"mem-limit": "it caps mokopt's reference interpreter (--engine ref)",
	}},
	{"verify", func(c *cobra.Command) bool { return flagSet(c, "quant-bound") }, "with --quant-bound", map[string]string{
		"rtol": "the bound compares each output statistically, without element-wise tolerances",
		"atol": "the bound compares each output statistically, without element-wise tolerances",
	}},
	{"lower", func(c *cobra.Command) bool { return flagIs(c, "target", string(mokopt.TargetORT)) }, "to --target ort", map[string]string{
		"ep":              "it is for the MoK kernel (--target " + mokTargets() + "); ONNX Runtime's MoE has no expert-parallel group",
		"tokens-per-rank": "it is for the MoK kernel (--target " + mokTargets() + "); ONNX Runtime's MoE has no static tokens per rank",
		"strict":          "it is for the MoK kernel (--target " + mokTargets() + "); ONNX Runtime's MoE has no kernel contract to be strict about",
		"plan":            "it is for the MoK kernel (--target " + mokTargets() + "); ONNX Runtime's MoE has no launch plan",
	}},
	{"lower", func(c *cobra.Command) bool {
		return !flagIs(c, "target", string(mokopt.TargetORT)) && !flagIs(c, "target", "")
	}, "to the MoK kernel's targets", map[string]string{
		"quant":      "it is for ONNX Runtime's QMoE (--target ort)",
		"block-size": "it is for ONNX Runtime's QMoE (--target ort)",
	}},
	{"diff", func(c *cobra.Command) bool { return flagSet(c, "json") || !flagIs(c, "format", "text") }, "to --format other than text", map[string]string{
		"color":   "only the text report is coloured",
		"verbose": "it lists the nodes of the text report",
	}},
	{"gen", func(c *cobra.Command) bool { return !flagSet(c, "ep-form") }, "without --ep-form", map[string]string{
		"ep":        "it is the EP group size of --ep-form's files",
		"rank":      "it picks one of --ep-form's rank files",
		"placement": "it places --ep-form's router-weight multiply",
	}},
	{"gen", func(c *cobra.Command) bool { return flagIs(c, "ep-form", "sharding") }, "with --ep-form sharding", map[string]string{
		"rank": "sharding writes one global model, not a file per rank",
	}},
	{"gen", func(c *cobra.Command) bool { return !flagIs(c, "shape", "ort") }, "without --shape ort", map[string]string{
		"quant":            "it quantizes the com.microsoft::MoE of --shape ort",
		"quant-block-size": "it quantizes the com.microsoft::MoE of --shape ort",
		"ort-swiglu":       "it spells the com.microsoft::MoE of --shape ort",
	}},
}

// checkUnused refuses the first flag of c, in unusedRules' order and then
// by name, that c's mode or target does not use.
func checkUnused(c *cobra.Command) error {
	for _, r := range unusedRules {
		if r.cmd != c.Name() || !r.when(c) {
			continue
		}
		if err := refuseUnused(c, r.where, r.flags); err != nil {
			return err
		}
	}
	return nil
}

// refuseUnused refuses, as a usage error (exit 2), the first flag (by
// name) of unused that is set on c's command line. where says to what it
// does not apply ("to --target ort"), unused maps each flag name to why.
func refuseUnused(c *cobra.Command, where string, unused map[string]string) error {
	names := make([]string, 0, len(unused))
	for n := range unused {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if flagSet(c, n) {
			return usageErr(fmt.Errorf("--%s does not apply %s: %s", n, where, unused[n]))
		}
	}
	return nil
}
