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
	for _, e := range m.Graph().Validate() {
		errs = append(errs, e)
	}
	seen := map[string]bool{}
	for _, t := range m.Proto.Graph.Initializer {
		if seen[t.GetName()] {
			errs = append(errs, fmt.Errorf("initializer %q is defined more than once", t.GetName()))
		}
		seen[t.GetName()] = true
	}
	for _, t := range allInitializers(m.Proto) {
		if err := m.checkTensor(t); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	if len(errs) > maxCheckErrors {
		n := len(errs) - maxCheckErrors
		errs = append(errs[:maxCheckErrors], fmt.Errorf("and %d more problems", n))
	}
	return &InputError{File: m.Name(), Msg: "invalid model", Err: errors.Join(errs...)}
}

// checkTensor checks one initializer's declared size against its data.
func (m *Model) checkTensor(t *pb.TensorProto) error {
	obj := fmt.Sprintf("initializer %q", t.GetName())
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
