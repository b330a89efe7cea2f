package eval

import (
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

func roundHalf(v float32) float32 { return graph.HalfToFloat32(graph.Float32ToHalf(v)) }
func roundBF16(v float32) float32 { return graph.BFloat16ToFloat32(graph.Float32ToBFloat16(v)) }

// BytesFunc returns the raw little-endian bytes of a tensor proto; use a
// loaded model's TensorBytes method so external data is reached.
type BytesFunc func(t *pb.TensorProto) ([]byte, error)

// inlineBytes reads a tensor's bytes from raw_data or its typed fields; it
// cannot reach external data.
func inlineBytes(t *pb.TensorProto) ([]byte, error) {
	if graph.IsExternal(t) {
		return nil, &graph.InputError{Object: fmt.Sprintf("tensor %q", t.GetName()), Msg: "external data needs the model (pass its TensorBytes)"}
	}
	return (&graph.Model{}).TensorBytes(t)
}

// FromProto converts a TensorProto to a Tensor. bytesFn fetches its raw
// bytes (for example m.TensorBytes for an initializer of model m); nil reads
// only data stored inside the proto.
func FromProto(t *pb.TensorProto, bytesFn BytesFunc) (*Tensor, error) {
	dt := graph.DataType(t)
	obj := fmt.Sprintf("tensor %q", t.GetName())
	if t.Segment != nil {
		return nil, &graph.InputError{Object: obj, Msg: "segmented tensors are not supported"}
	}
	shape := make([]int, len(t.GetDims()))
	for i, d := range t.GetDims() {
		if d < 0 || d > math.MaxInt32 {
			return nil, &graph.InputError{Object: obj, Msg: fmt.Sprintf("bad dimension %d", d)}
		}
		shape[i] = int(d)
	}
	n, err := checkedNumel(shape)
	if err != nil {
		return nil, &graph.InputError{Object: obj, Msg: err.Error()}
	}
	if dt == pb.TensorProto_STRING {
		if len(t.StringData) != n {
			return nil, &graph.InputError{Object: obj, Msg: fmt.Sprintf("string_data holds %d strings, dims %v need %d", len(t.StringData), shape, n)}
		}
		out := &Tensor{DType: dt, Shape: shape, Str: make([]string, n)}
		for i, s := range t.StringData {
			out.Str[i] = string(s)
		}
		return out, nil
	}
	if kindOf(dt) == kNone {
		return nil, &graph.InputError{Object: obj, Msg: fmt.Sprintf("data type %s is not supported by the evaluator", dt)}
	}
	if bytesFn == nil {
		bytesFn = inlineBytes
	}
	raw, err := bytesFn(t)
	if err != nil {
		return nil, err
	}
	return fromRaw(dt, shape, raw)
}

// fromRaw decodes little-endian raw bytes of type dt.
func fromRaw(dt pb.TensorProto_DataType, shape []int, raw []byte) (*Tensor, error) {
	n := numel(shape)
	bits := graph.ElemBits(dt)
	if len(raw)*8 != n*bits {
		return nil, &graph.InputError{Msg: fmt.Sprintf("%d bytes of data for %s%v", len(raw), dt, shape)}
	}
	t := New(dt, shape)
	le := binary.LittleEndian
	switch dt {
	case pb.TensorProto_FLOAT:
		if littleEndian {
			copy(f32Bytes(t.F32), raw)
			break
		}
		for i := range t.F32 {
			t.F32[i] = math.Float32frombits(le.Uint32(raw[4*i:]))
		}
	case pb.TensorProto_FLOAT16:
		for i := range t.F32 {
			t.F32[i] = graph.HalfToFloat32(le.Uint16(raw[2*i:]))
		}
	case pb.TensorProto_BFLOAT16:
		for i := range t.F32 {
			t.F32[i] = graph.BFloat16ToFloat32(le.Uint16(raw[2*i:]))
		}
	case pb.TensorProto_DOUBLE:
		for i := range t.F64 {
			t.F64[i] = math.Float64frombits(le.Uint64(raw[8*i:]))
		}
	case pb.TensorProto_INT64, pb.TensorProto_UINT64:
		for i := range t.I64 {
			t.I64[i] = int64(le.Uint64(raw[8*i:]))
		}
	case pb.TensorProto_INT32:
		for i := range t.I64 {
			t.I64[i] = int64(int32(le.Uint32(raw[4*i:])))
		}
	case pb.TensorProto_UINT32:
		for i := range t.I64 {
			t.I64[i] = int64(le.Uint32(raw[4*i:]))
		}
	case pb.TensorProto_INT16:
		for i := range t.I64 {
			t.I64[i] = int64(int16(le.Uint16(raw[2*i:])))
		}
	case pb.TensorProto_UINT16:
		for i := range t.I64 {
			t.I64[i] = int64(le.Uint16(raw[2*i:]))
		}
	case pb.TensorProto_INT8:
		for i := range t.I64 {
			t.I64[i] = int64(int8(raw[i]))
		}
	case pb.TensorProto_UINT8:
		for i := range t.I64 {
			t.I64[i] = int64(raw[i])
		}
	case pb.TensorProto_BOOL:
		for i := range t.Bool {
			t.Bool[i] = raw[i] != 0
		}
	case pb.TensorProto_FLOAT8E4M3FN, pb.TensorProto_FLOAT8E4M3FNUZ, pb.TensorProto_FLOAT8E5M2, pb.TensorProto_FLOAT8E5M2FNUZ:
		f := f8formats[dt]
		for i := range t.F32 {
			t.F32[i] = float32(f.decode(raw[i]))
		}
	default:
		return nil, fmt.Errorf("data type %s is not supported by the evaluator", dt)
	}
	return t, nil
}

// rawBytes encodes t's elements as little-endian bytes of its DType.
func rawBytes(t *Tensor) ([]byte, error) {
	n := t.Len()
	le := binary.LittleEndian
	var out []byte
	switch t.DType {
	case pb.TensorProto_FLOAT:
		out = make([]byte, 0, 4*n)
		for _, v := range t.F32 {
			out = le.AppendUint32(out, math.Float32bits(v))
		}
	case pb.TensorProto_FLOAT16:
		out = make([]byte, 0, 2*n)
		for _, v := range t.F32 {
			out = le.AppendUint16(out, graph.Float32ToHalf(v))
		}
	case pb.TensorProto_BFLOAT16:
		out = make([]byte, 0, 2*n)
		for _, v := range t.F32 {
			out = le.AppendUint16(out, graph.Float32ToBFloat16(v))
		}
	case pb.TensorProto_DOUBLE:
		out = make([]byte, 0, 8*n)
		for _, v := range t.F64 {
			out = le.AppendUint64(out, math.Float64bits(v))
		}
	case pb.TensorProto_INT64, pb.TensorProto_UINT64:
		out = make([]byte, 0, 8*n)
		for _, v := range t.I64 {
			out = le.AppendUint64(out, uint64(v))
		}
	case pb.TensorProto_INT32, pb.TensorProto_UINT32:
		out = make([]byte, 0, 4*n)
		for _, v := range t.I64 {
			out = le.AppendUint32(out, uint32(v))
		}
	case pb.TensorProto_INT16, pb.TensorProto_UINT16:
		out = make([]byte, 0, 2*n)
		for _, v := range t.I64 {
			out = le.AppendUint16(out, uint16(v))
		}
	case pb.TensorProto_INT8, pb.TensorProto_UINT8:
		out = make([]byte, 0, n)
		for _, v := range t.I64 {
			out = append(out, byte(v))
		}
	case pb.TensorProto_FLOAT8E4M3FN, pb.TensorProto_FLOAT8E4M3FNUZ, pb.TensorProto_FLOAT8E5M2, pb.TensorProto_FLOAT8E5M2FNUZ:
		f := f8formats[t.DType]
		out = make([]byte, 0, n)
		for _, v := range t.F32 {
			out = append(out, f.encode(float64(v)))
		}
	case pb.TensorProto_BOOL:
		out = make([]byte, 0, n)
		for _, v := range t.Bool {
			if v {
				out = append(out, 1)
			} else {
				out = append(out, 0)
			}
		}
	default:
		return nil, fmt.Errorf("cannot encode data type %s", t.DType)
	}
	return out, nil
}

// ToProto converts t to a TensorProto named name, with its data in raw_data
// (string_data for STRING).
func ToProto(t *Tensor, name string) (*pb.TensorProto, error) {
	p := &pb.TensorProto{DataType: proto.Int32(int32(t.DType))}
	if name != "" {
		p.Name = proto.String(name)
	}
	p.Dims = make([]int64, len(t.Shape))
	for i, d := range t.Shape {
		p.Dims[i] = int64(d)
	}
	if t.DType == pb.TensorProto_STRING {
		for _, s := range t.Str {
			p.StringData = append(p.StringData, []byte(s))
		}
		return p, nil
	}
	raw, err := rawBytes(t)
	if err != nil {
		return nil, err
	}
	p.RawData = raw
	return p, nil
}

// ReadTensorFile reads a serialized TensorProto (an ONNX test_data_set
// input_N.pb or output_N.pb file) and returns the tensor and its name.
func ReadTensorFile(path string) (*Tensor, string, error) {
	b, err := graph.ReadProtoFile(path) // bounded: an endless file cannot exhaust memory
	if err != nil {
		return nil, "", err
	}
	p := &pb.TensorProto{}
	if err := proto.Unmarshal(b, p); err != nil {
		return nil, "", &graph.InputError{File: path, Msg: "not a serialized TensorProto", Err: err}
	}
	t, err := FromProto(p, nil)
	if err != nil {
		return nil, "", &graph.InputError{File: path, Msg: "cannot decode tensor", Err: err}
	}
	return t, p.GetName(), nil
}

// WriteTensorFile writes t as a serialized TensorProto named name.
func WriteTensorFile(path string, t *Tensor, name string) error {
	p, err := ToProto(t, name)
	if err != nil {
		return err
	}
	b, err := proto.Marshal(p)
	if err != nil {
		return err
	}
	return graph.WriteFileAtomic(path, b)
}

// DataSet is an ONNX test_data_set folder: input_N.pb and output_N.pb
// files, in index order.
type DataSet struct {
	Dir         string
	Inputs      []*Tensor
	InputNames  []string // names stored in the files (may be empty)
	Outputs     []*Tensor
	OutputNames []string
}

// ReadDataSet reads every input_N.pb and output_N.pb in dir, ordered by N.
// A folder with no input files is an error.
func ReadDataSet(dir string) (*DataSet, error) {
	ds := &DataSet{Dir: dir}
	for _, prefix := range []string{"input_", "output_"} {
		files, err := indexedFiles(dir, prefix)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			t, name, err := ReadTensorFile(f)
			if err != nil {
				return nil, err
			}
			if prefix == "input_" {
				ds.Inputs = append(ds.Inputs, t)
				ds.InputNames = append(ds.InputNames, name)
			} else {
				ds.Outputs = append(ds.Outputs, t)
				ds.OutputNames = append(ds.OutputNames, name)
			}
		}
	}
	if len(ds.Inputs) == 0 && len(ds.Outputs) == 0 {
		return nil, &graph.InputError{File: dir, Msg: "no input_N.pb or output_N.pb files"}
	}
	return ds, nil
}

// indexedFiles lists dir/PREFIXN.pb sorted by N, checking N runs 0..k-1.
func indexedFiles(dir, prefix string) ([]string, error) {
	matches, err := filepath.Glob(filepath.Join(dir, prefix+"*.pb"))
	if err != nil {
		return nil, err
	}
	type item struct {
		n    int
		path string
	}
	var items []item
	for _, m := range matches {
		s := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m), prefix), ".pb")
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			continue
		}
		items = append(items, item{n, m})
	}
	sort.Slice(items, func(i, j int) bool { return items[i].n < items[j].n })
	out := make([]string, len(items))
	for i, it := range items {
		if it.n != i {
			return nil, &graph.InputError{File: dir, Msg: fmt.Sprintf("%s files are not numbered 0..%d (found %s)", prefix, len(items)-1, filepath.Base(it.path))}
		}
		out[i] = it.path
	}
	return out, nil
}

// GraphInputs returns the names of m's graph inputs that are not also
// initializers: the inputs a caller must feed, in declaration order.
func GraphInputs(m *graph.Model) []string {
	inits := map[string]bool{}
	for _, t := range m.Proto.GetGraph().GetInitializer() {
		inits[t.GetName()] = true
	}
	var out []string
	for _, v := range m.Proto.GetGraph().GetInput() {
		if !inits[v.GetName()] {
			out = append(out, v.GetName())
		}
	}
	return out
}

// Feeds maps tensors to m's graph inputs: a tensor whose stored name is a
// graph input goes there; otherwise tensors map by position onto
// GraphInputs(m). names may be nil or hold "" entries.
func Feeds(m *graph.Model, tensors []*Tensor, names []string) (map[string]*Tensor, error) {
	ins := GraphInputs(m)
	all := map[string]bool{}
	for _, v := range m.Proto.GetGraph().GetInput() {
		all[v.GetName()] = true
	}
	byName := len(names) == len(tensors)
	for _, n := range names {
		if !all[n] {
			byName = false
		}
	}
	feeds := make(map[string]*Tensor, len(tensors))
	if byName {
		for i, t := range tensors {
			feeds[names[i]] = t
		}
		return feeds, nil
	}
	if len(tensors) > len(ins) {
		return nil, &graph.InputError{File: m.Name(), Msg: fmt.Sprintf("%d input tensors for a model with %d inputs", len(tensors), len(ins))}
	}
	for i, t := range tensors {
		feeds[ins[i]] = t
	}
	return feeds, nil
}
