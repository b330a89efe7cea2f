package perf

import (
	"fmt"
	"strings"

	"github.com/mokopt/mokopt/kernel"
)

// VendorReported returns the vendor's reported best speedups over the fastest
// public baseline for a precision (docs/kernel.md "Reported results": up to 2.37×
// MXFP8 forward, 1.78× MXFP8 backward, 1.92× BF16 forward, 1.58× BF16 backward).
// They are maxima over the four shapes, and the vendor's own measurements.
func VendorReported(p kernel.Precision) (fwd, bwd float64) {
	if p == kernel.MXFP8 {
		return 2.37, 1.78
	}
	return 1.92, 1.58
}

// ComparisonRow is the model's prediction for one vendor benchmark.
type ComparisonRow struct {
	// Shape is the layer shape.
	Shape Shape
	// Precision is the routed precision.
	Precision kernel.Precision
	// Prediction is the model's output.
	Prediction Prediction
}

// ComparisonSummary sets the model's best predicted speedups for a precision
// next to the vendor's reported maxima.
type ComparisonSummary struct {
	// Precision is the routed precision.
	Precision kernel.Precision
	// PredictedMaxFwd and PredictedMaxBwd are the largest predicted speedups
	// over the four shapes.
	PredictedMaxFwd, PredictedMaxBwd float64
	// VendorMaxFwd and VendorMaxBwd are the vendor's reported maxima.
	VendorMaxFwd, VendorMaxBwd float64
}

// Comparison is the vendor benchmark suite evaluated by the model.
type Comparison struct {
	// Rows holds one row per (shape, precision), MXFP8 first.
	Rows []ComparisonRow
	// Summary holds one entry per precision, MXFP8 first.
	Summary []ComparisonSummary
}

// VendorComparison evaluates the vendor's benchmark suite: the four shapes of
// VendorShapes on one GB300 NVL72 rack, EP 64, 2048 tokens per GPU, MXFP8 and
// BF16, with MoK's default knobs and the given params.
func VendorComparison(params Params) (Comparison, error) {
	var c Comparison
	for _, p := range []kernel.Precision{kernel.MXFP8, kernel.BF16} {
		sum := ComparisonSummary{Precision: p}
		sum.VendorMaxFwd, sum.VendorMaxBwd = VendorReported(p)
		for _, sh := range VendorShapes() {
			pred, err := Predict(Scenario{Hardware: GB300, Shape: sh, EP: 64, TokensPerRank: 2048,
				Precision: p, Knobs: kernel.DefaultKnobs(), Params: params})
			if err != nil {
				return Comparison{}, err
			}
			c.Rows = append(c.Rows, ComparisonRow{Shape: sh, Precision: p, Prediction: pred})
			sum.PredictedMaxFwd = max(sum.PredictedMaxFwd, pred.FwdSpeedup)
			sum.PredictedMaxBwd = max(sum.PredictedMaxBwd, pred.BwdSpeedup)
		}
		c.Summary = append(c.Summary, sum)
	}
	return c, nil
}

// String renders the comparison as a text table (times in µs).
func (c Comparison) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-6s %-22s %9s %9s %6s %9s %9s %6s %8s\n", "prec", "shape", "fwd MoK", "fwd base", "x", "bwd MoK", "bwd base", "x", "MoK TF/s")
	for _, r := range c.Rows {
		p := r.Prediction
		fmt.Fprintf(&b, "%-6s %-22s %9.1f %9.1f %6.2f %9.1f %9.1f %6.2f %8.0f\n", r.Precision, r.Shape.Name,
			p.FwdMoK.Total*1e6, p.FwdBaseline.Total*1e6, p.FwdSpeedup,
			p.BwdMoK.Total*1e6, p.BwdBaseline.Total*1e6, p.BwdSpeedup, p.EffectiveTFLOPS(p.FwdMoK.Total))
	}
	for _, s := range c.Summary {
		fmt.Fprintf(&b, "%s: predicted max %.2fx fwd, %.2fx bwd; vendor reported up to %.2fx fwd, %.2fx bwd\n",
			s.Precision, s.PredictedMaxFwd, s.PredictedMaxBwd, s.VendorMaxFwd, s.VendorMaxBwd)
	}
	return b.String()
}
