package graph

import (
	"errors"
	"fmt"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// maxCheckErrors bounds how many problems Check lists in one error.
const maxCheckErrors = 20

// Check vets a loaded model before any pass reads it, without reading weight
// bytes: the main graph must validate (no cycle, no value defined twice, no
// dangling input, see Graph.Validate), initializer names must be unique, and
// every initializer (main graph, subgraphs, training_info) must have
// non-negative dims whose byte size fits int64 and data that matches them:
// raw_data or typed fields of the right length, or an external location
// inside the model's folder whose offset and length lie inside an existing
// side file (which is only stat'ed). A tensor claiming more bytes than its
// file holds is thus refused before anything is allocated for it.
//
// The error, if any, is an *InputError (errors.Is ErrBadInput) naming the
// file and listing the problems, each naming its node or tensor.
func (m *Model) Check() error {
	var errs []error
	g := m.Graph()
	errs = append(errs, g.Validate()...)
	opset := m.Opset("")
	for _, n := range m.Proto.Graph.Node {
		if err := checkArity(n, opset); err != nil {
			errs = append(errs, err)
		}
	}
	if g.dupInit {
		seen := map[string]bool{}
		for _, t := range m.Proto.Graph.Initializer {
			if seen[t.GetName()] {
				errs = append(errs, fmt.Errorf("initializer %q is defined more than once", t.GetName()))
			}
			seen[t.GetName()] = true
		}
	}
	for _, t := range initializers(m.Proto, g.sub) {
		if err := m.checkTensor(t); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, m.checkOthers()...)
	if g.sub || len(m.Proto.Functions) > 0 {
		errs = append(errs, checkBodies(m.Proto)...)
		errs = append(errs, checkFunctionCalls(m.Proto)...)
	}
	if len(errs) == 0 {
		// Nothing was edited: the next Graph call can use this index.
		m.KeepIndex(g)
		return nil
	}
	return &InputError{File: m.Name(), Msg: "invalid model", Err: joinProblems(errs, maxCheckErrors)}
}

// minInputs is the number of inputs an op of the default domain requires
// (ONNX schemas), for the ops passes and the interpreter take apart; ops
// whose arity changed take the opset version.
func minInputs(op string, opset int64) int {
	switch op {
	case "Add", "Sub", "Mul", "Div", "Pow", "MatMul", "Gemm", "Gather", "GatherND", "GatherElements",
		"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Expand", "Tile", "Mod", "And", "Or":
		return 2
	case "ScatterND", "ScatterElements", "Where", "Range", "OneHot":
		return 3
	case "Relu", "Sigmoid", "Softmax", "LogSoftmax", "Transpose", "Identity", "Neg", "Exp", "Log", "Sqrt",
		"Tanh", "Erf", "Abs", "Reciprocal", "Cast", "Squeeze", "Unsqueeze", "Split", "Concat", "Flatten",
		"ReduceSum", "ReduceMean", "ReduceMax", "Shape", "Size", "NonZero", "Clip", "Min", "Max", "Sum",
		"ArgMax", "ArgMin", "ConstantOfShape", "Not", "Softplus", "Gelu", "Einsum", "CumSum":
		return 1
	case "TopK":
		if opset >= 10 {
			return 2
		}
		return 1
	case "Reshape":
		if opset >= 5 {
			return 2
		}
		return 1
	case "Slice":
		if opset >= 10 {
			return 3
		}
		return 1
	}
	return 0
}

// checkArity refuses a default-domain node with fewer inputs or outputs
// than its op requires (a TopK without k, a MatMul with one operand), which
// no exporter writes and which passes must not index past.
func checkArity(n *pb.NodeProto, opset int64) error {
	if d := n.GetDomain(); d != "" && d != "ai.onnx" {
		return nil
	}
	op := n.GetOpType()
	if need := minInputs(op, opset); len(n.Input) < need {
		return fmt.Errorf("node %q (%s) has %d inputs; %s (opset %d) needs at least %d", NodeLabel(n), op, len(n.Input), op, opset, need)
	}
	needOut := 1
	if op == "TopK" {
		needOut = 2
	}
	if len(n.Output) < needOut {
		return fmt.Errorf("node %q (%s) has %d outputs; %s needs %d", NodeLabel(n), op, len(n.Output), op, needOut)
	}
	return nil
}

// checkOthers checks the tensors held in attributes and sparse
// initializers (otherTensors) as initializers are checked, and records
// their labels for messages.
func (m *Model) checkOthers() []error {
	var errs []error
	others := otherTensors(m.Proto)
	if len(others) == 0 {
		return nil
	}
	// A new map, published whole: working copies share the old one, and
	// other goroutines may be reading it.
	m.mu.Lock()
	labels := make(map[*pb.TensorProto]string, len(m.labels)+len(others))
	for t, l := range m.labels {
		labels[t] = l
	}
	m.mu.Unlock()
	for _, p := range others {
		labels[p.t] = p.label
	}
	m.mu.Lock()
	m.labels = labels
	m.mu.Unlock()
	for _, p := range others {
		if _, ok := m.Deferred(p.t); ok {
			continue
		}
		if err := m.checkTensor(p.t); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// checkTensor checks one tensor's declared size against its data.
func (m *Model) checkTensor(t *pb.TensorProto) error {
	obj := tensorObj{t, m.label(t)}
	dt := DataType(t)
	if t.Segment != nil {
		return fmt.Errorf("%s: segmented tensors are not supported", obj)
	}
	if dt == pb.TensorProto_STRING {
		n, err := NumElements(t.GetDims())
		if err != nil {
			return fmt.Errorf("%s: %v", obj, err)
		}
		if !IsExternal(t) && int64(len(t.StringData)) != n {
			return fmt.Errorf("%s: string_data holds %d strings but dims %v need %d", obj, len(t.StringData), t.GetDims(), n)
		}
		return nil
	}
	want, err := ByteSize(dt, t.GetDims())
	if err != nil {
		return fmt.Errorf("%s: %v", obj, err)
	}
	if IsExternal(t) {
		if m.ext == nil {
			return fmt.Errorf("%s: external data but the model has no folder to read it from", obj)
		}
		_, err := m.tensorSection(t)
		if err != nil {
			var ie *InputError
			if errors.As(err, &ie) {
				// tensorSection names file and object; keep only what follows.
				ie2 := *ie
				ie2.File = ""
				return &ie2
			}
			return err
		}
		return nil
	}
	if t.RawData != nil {
		if int64(len(t.RawData)) != want {
			return fmt.Errorf("%s: raw_data holds %d bytes but dims %v of %s need %d", obj, len(t.RawData), t.GetDims(), dt, want)
		}
		return nil
	}
	if have, ok := typedFieldLen(t); ok && have != want {
		return fmt.Errorf("%s: typed data holds %d bytes but dims %v of %s need %d", obj, have, t.GetDims(), dt, want)
	}
	return nil
}

// tensorObj names an initializer in messages ("initializer \"w\""),
// formatted only when a message is.
type tensorObj struct {
	t     *pb.TensorProto
	label string // where an attribute tensor sits; "" for an initializer
}

func (o tensorObj) String() string {
	if o.label != "" {
		return o.label
	}
	return fmt.Sprintf("initializer %q", o.t.GetName())
}

// typedFieldLen returns the number of raw bytes t's typed repeated fields
// hold, without converting them; ok is false for types without a raw form.
func typedFieldLen(t *pb.TensorProto) (int64, bool) {
	switch dt := DataType(t); dt {
	case pb.TensorProto_FLOAT, pb.TensorProto_COMPLEX64:
		return 4 * int64(len(t.FloatData)), true
	case pb.TensorProto_DOUBLE, pb.TensorProto_COMPLEX128:
		return 8 * int64(len(t.DoubleData)), true
	case pb.TensorProto_INT64:
		return 8 * int64(len(t.Int64Data)), true
	case pb.TensorProto_UINT64:
		return 8 * int64(len(t.Uint64Data)), true
	case pb.TensorProto_UINT32:
		return 4 * int64(len(t.Uint64Data)), true
	case pb.TensorProto_INT32:
		return 4 * int64(len(t.Int32Data)), true
	default:
		bits := ElemBits(dt)
		switch {
		case bits == 16:
			return 2 * int64(len(t.Int32Data)), true
		case bits == 8, bits == 4:
			return int64(len(t.Int32Data)), true
		}
	}
	return 0, false
}
