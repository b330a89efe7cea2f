package verify

import (
	"errors"
	"fmt"
	"math/rand"
	"strings"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// inputSpec is a graph input's declared type: element type and dims, where
// a dim is fixed (Value >= 0) or symbolic (Param, possibly "").
type inputSpec struct {
	Name  string
	DType pb.TensorProto_DataType
	Dims  []dimSpec
}

type dimSpec struct {
	Value int64 // -1 when symbolic or unknown
	Param string
}

// dynamic reports whether any dim is symbolic.
func (s inputSpec) dynamic() bool {
	for _, d := range s.Dims {
		if d.Value < 0 {
			return true
		}
	}
	return false
}

// inputSpecs reads the declared types of m's fed inputs (inputs that are
// not initializers).
func inputSpecs(m *graph.Model) ([]inputSpec, error) {
	names := eval.GraphInputs(m)
	byName := map[string]*pb.ValueInfoProto{}
	for _, v := range m.Proto.GetGraph().GetInput() {
		byName[v.GetName()] = v
	}
	var out []inputSpec
	for _, n := range names {
		tt := byName[n].GetType().GetTensorType()
		if tt == nil {
			return nil, &graph.InputError{File: m.Name(), Object: fmt.Sprintf("input %q", n), Msg: "is not a tensor; random inputs need tensor types (use a data dir)"}
		}
		s := inputSpec{Name: n, DType: pb.TensorProto_DataType(tt.GetElemType())}
		if tt.GetShape() == nil {
			return nil, &graph.InputError{File: m.Name(), Object: fmt.Sprintf("input %q", n), Msg: "declares no shape (not even a rank); random inputs need one (use a data dir)"}
		}
		for _, d := range tt.GetShape().GetDim() {
			ds := dimSpec{Value: -1}
			switch v := d.GetValue().(type) {
			case *pb.TensorShapeProto_Dimension_DimValue:
				ds.Value = v.DimValue
			case *pb.TensorShapeProto_Dimension_DimParam:
				ds.Param = v.DimParam
			}
			s.Dims = append(s.Dims, ds)
		}
		out = append(out, s)
	}
	return out, nil
}

// resolveDims picks concrete dims for every input given a token count:
//   - fixed dims are kept;
//   - a named dim takes the value already chosen for the same name;
//   - a name containing "batch" gives 1; one containing "seq", "token",
//     "len" or "length" gives tokens;
//   - otherwise, in an input of rank >= 2 the leading dim is the batch (1)
//     and every later symbolic dim is the sequence (tokens); a symbolic dim
//     of a rank-1 input is tokens.
func resolveDims(specs []inputSpec, tokens int) [][]int {
	named := map[string]int{}
	out := make([][]int, len(specs))
	for i, s := range specs {
		shape := make([]int, len(s.Dims))
		for j, d := range s.Dims {
			if d.Value >= 0 {
				shape[j] = int(d.Value)
				continue
			}
			if v, ok := named[d.Param]; ok && d.Param != "" {
				shape[j] = v
				continue
			}
			p := strings.ToLower(d.Param)
			var v int
			switch {
			case strings.Contains(p, "batch"):
				v = 1
			case strings.Contains(p, "seq"), strings.Contains(p, "token"), strings.Contains(p, "len"):
				v = tokens
			case len(s.Dims) >= 2 && j == 0:
				v = 1
			default:
				v = tokens
			}
			shape[j] = v
			if d.Param != "" {
				named[d.Param] = v
			}
		}
		out[i] = shape
	}
	return out
}

// vocabFor infers the exclusive upper bound of integer ids fed to input:
// the row count of the initializer gathered by the first Gather that reads
// the input as its indices, else 100.
func vocabFor(m *graph.Model, input string) (int64, string) {
	g := m.Proto.GetGraph()
	inits := map[string]*pb.TensorProto{}
	for _, t := range g.GetInitializer() {
		inits[t.GetName()] = t
	}
	// follow value-preserving ops (Cast, Reshape, ...) from the input.
	frontier := map[string]bool{input: true}
	for _, n := range g.GetNode() {
		reads := false
		for _, in := range n.Input {
			if frontier[in] {
				reads = true
			}
		}
		if !reads {
			continue
		}
		switch n.GetOpType() {
		case "Gather":
			if len(n.Input) >= 2 && frontier[n.Input[1]] {
				if t, ok := inits[n.Input[0]]; ok {
					axis := graph.AttrInt(n, "axis", 0)
					dims := t.GetDims()
					if axis < 0 {
						axis += int64(len(dims))
					}
					if axis >= 0 && axis < int64(len(dims)) && dims[axis] > 0 {
						return dims[axis], fmt.Sprintf("rows of %q gathered by node %s", t.GetName(), graph.NodeLabel(n))
					}
				}
			}
		case "Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity":
			if frontier[n.Input[0]] {
				for _, o := range n.Output {
					frontier[o] = true
				}
			}
		}
	}
	return 100, "default (no Gather on an initializer reads it)"
}

// randomInputs builds deterministic inputs for one token count. Notes
// explain the choices made.
//
// A float input whose static dims hold more than maxDistinctRows rows (a row
// is its last dim) repeats maxDistinctRows random rows over them, with a
// note: a static-token model then computes only that many different tokens,
// and the interpreter computes each repeated row of a matrix product once.
// Shapes whose element count overflows, or whose data alone exceeds
// memLimit (when > 0), are errors.
func randomInputs(m *graph.Model, specs []inputSpec, tokens int, seed int64, memLimit int64) ([]*eval.Tensor, []string, error) {
	shapes := resolveDims(specs, tokens)
	rng := rand.New(rand.NewSource(seed*1000003 + int64(tokens)))
	var notes []string
	out := make([]*eval.Tensor, len(specs))
	for i, s := range specs {
		if !eval.SupportedDType(s.DType) || s.DType == pb.TensorProto_STRING {
			return nil, nil, &graph.InputError{File: m.Name(), Object: fmt.Sprintf("input %q", s.Name), Msg: fmt.Sprintf("cannot generate random %s values (use a data dir)", s.DType)}
		}
		t, err := eval.NewChecked(s.DType, shapes[i], memLimit)
		if errors.Is(err, eval.ErrMemLimit) {
			return nil, nil, fmt.Errorf("random input %q of shape %v: %w", s.Name, shapes[i], err)
		}
		if err != nil {
			return nil, nil, &graph.InputError{File: m.Name(), Object: fmt.Sprintf("input %q", s.Name), Msg: fmt.Sprintf("declared shape %v: %v", shapes[i], err)}
		}
		lname := strings.ToLower(s.Name)
		switch {
		case t.F32 != nil || t.F64 != nil:
			period := t.Len()
			if r := len(shapes[i]); r > 1 && shapes[i][r-1] > 0 && t.Len()/shapes[i][r-1] > maxDistinctRows {
				period = maxDistinctRows * shapes[i][r-1]
				notes = append(notes, fmt.Sprintf("input %q: %d random rows repeated over its %d rows", s.Name, maxDistinctRows, t.Len()/shapes[i][r-1]))
			}
			for j := 0; j < t.Len(); j++ {
				v := rng.NormFloat64()
				if j >= period {
					v = t.Float64At(j - period)
				}
				if t.F32 != nil {
					t.F32[j] = float32(v)
				} else {
					t.F64[j] = v
				}
			}
		case t.Bool != nil:
			for j := range t.Bool {
				t.Bool[j] = true
			}
			notes = append(notes, fmt.Sprintf("input %q: bool, all true", s.Name))
		case strings.Contains(lname, "mask"):
			for j := range t.I64 {
				t.I64[j] = 1
			}
			notes = append(notes, fmt.Sprintf("input %q: a mask, all ones", s.Name))
		case strings.Contains(lname, "position"):
			last := 1
			if len(shapes[i]) > 0 {
				last = shapes[i][len(shapes[i])-1]
			}
			for j := range t.I64 {
				if last > 0 {
					t.I64[j] = int64(j % last)
				}
			}
			notes = append(notes, fmt.Sprintf("input %q: positions 0..%d along the last dim", s.Name, last-1))
		default:
			v, why := vocabFor(m, s.Name)
			switch s.DType {
			case pb.TensorProto_INT8:
				v = min(v, 128)
			case pb.TensorProto_UINT8:
				v = min(v, 256)
			case pb.TensorProto_INT16:
				v = min(v, 1<<15)
			}
			for j := range t.I64 {
				t.I64[j] = rng.Int63n(v)
			}
			notes = append(notes, fmt.Sprintf("input %q: integers uniform in [0, %d): %s", s.Name, v, why))
		}
		out[i] = t
	}
	return out, notes, nil
}

// maxDistinctRows is how many different random rows a float input with
// more (static) rows gets.
const maxDistinctRows = 64
