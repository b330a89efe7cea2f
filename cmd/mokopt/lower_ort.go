package main

import (
	"errors"
	"fmt"

	"github.com/mokopt/mokopt"
	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/lowering"
	"github.com/spf13/cobra"
)

// runLowerORT is `mokopt lower --target ort`.
func runLowerORT(c *cobra.Command, in, out, extMode string, opt lowering.ORTOptions, asJSON bool) error {
	mode, err := mokopt.ParseExternalMode(extMode)
	if err != nil {
		return usageErr(err)
	}
	switch opt.Quant {
	case "", "int8", "int4":
	default:
		return usageErr(fmt.Errorf("--quant %q (want int8 or int4)", opt.Quant))
	}
	if opt.BlockSize != 0 && (opt.Quant == "" || opt.BlockSize < 16 || opt.BlockSize&(opt.BlockSize-1) != 0) {
		return usageErr(fmt.Errorf("--block-size %d needs --quant and a power of two >= 16", opt.BlockSize))
	}
	if out == mokopt.Stdio && asJSON {
		return usageErr(errors.New("two outputs would share standard output (-o -, --json)"))
	}
	m, err := loadModel(in)
	if err != nil {
		return err
	}
	defer m.Close()
	if err := checkSameFiles(modelInputs(m), []outFile{{out, "the output model", true}}, false); err != nil {
		return err
	}
	rep, lerr := mokopt.LowerORT(c.Context(), m, opt)
	if lerr != nil {
		if asJSON && rep != nil {
			_ = writeJSON(c.OutOrStdout(), map[string]any{"schema_version": 1, "input": in, "output": nil, "report": rep})
		}
		if errors.Is(lerr, graph.ErrBadInput) {
			return &exitError{code: 2, msg: lerr.Error(), err: lerr}
		}
		return &exitError{code: 1, msg: fmt.Sprintf("%s: %v; no output written", in, lerr), err: lerr}
	}
	if err := saveModel(c, m, out, mode, newProgress(c)); err != nil {
		return err
	}
	if asJSON {
		return writeJSON(c.OutOrStdout(), map[string]any{"schema_version": 1, "input": in, "output": out, "report": rep})
	}
	w := c.OutOrStdout()
	if out == mokopt.Stdio {
		w = c.ErrOrStderr() // standard output holds the model
	}
	fmt.Fprintf(w, "%s -> %s: %s", in, out, rep.Summary())
	return nil
}
