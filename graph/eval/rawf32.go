package eval

import (
	"unsafe"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// littleEndian reports whether float32 values are stored like ONNX's raw
// data, so that raw bytes can be copied (or kept) as they are.
var littleEndian = func() bool {
	v := uint16(1)
	return *(*byte)(unsafe.Pointer(&v)) == 1
}()

// LittleEndian reports whether the host stores float32 values in ONNX raw
// data's byte order (then raw bytes and []float32 memory are the same).
func LittleEndian() bool { return littleEndian }

// f32Bytes views a float32 slice's memory as bytes.
func f32Bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

// initializerTensor is FromProto for an initializer the run reads: float32
// data already in host order is kept as it is (no copy) where the byte
// order and the buffer's alignment allow: external data read into a fresh
// buffer, or the raw data stored inside the model, which the run shares
// with the model (kernels never write their inputs).
func initializerTensor(p *pb.TensorProto, bytesFn BytesFunc) (*Tensor, error) {
	if !littleEndian || graph.DataType(p) != pb.TensorProto_FLOAT || p.Segment != nil || (!graph.IsExternal(p) && p.RawData == nil) {
		return FromProto(p, bytesFn)
	}
	shape := make([]int, len(p.GetDims()))
	for i, d := range p.GetDims() {
		if d < 0 || d > 1<<31-1 {
			return FromProto(p, bytesFn) // FromProto names the bad dim
		}
		shape[i] = int(d)
	}
	n, err := checkedNumel(shape)
	if err != nil {
		return FromProto(p, bytesFn)
	}
	if !graph.IsExternal(p) && len(p.RawData) != 4*n {
		return FromProto(p, bytesFn) // FromProto names the mismatch
	}
	raw, err := bytesFn(p)
	if err != nil {
		return nil, err
	}
	if len(raw) != 4*n || n == 0 || uintptr(unsafe.Pointer(&raw[0]))%4 != 0 {
		return fromRaw(pb.TensorProto_FLOAT, shape, raw)
	}
	return &Tensor{DType: pb.TensorProto_FLOAT, Shape: shape, F32: unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), n)}, nil
}

// Float32View returns raw's bytes as float32 values without a copy when the
// host stores floats as ONNX raw data does and raw is aligned for them
// (false otherwise). The caller must own raw: a fresh buffer, such as
// external data just read, that nothing else writes.
func Float32View(raw []byte) ([]float32, bool) {
	if !littleEndian || len(raw) == 0 || len(raw)%4 != 0 || uintptr(unsafe.Pointer(&raw[0]))%4 != 0 {
		return nil, false
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), len(raw)/4), true
}
