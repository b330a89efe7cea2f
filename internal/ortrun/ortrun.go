//go:build ort

package ortrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/mokopt/mokopt/graph"
	"github.com/mokopt/mokopt/graph/eval"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	ort "github.com/yalue/onnxruntime_go"
)

var (
	initOnce sync.Once
	initErr  error
)

// Init loads the shared library and creates ONNX Runtime's environment; Run
// calls it. Only the first call does anything; later ones return its error.
func Init() error {
	initOnce.Do(func() {
		lib, err := FindLibrary()
		if err != nil {
			initErr = err
			return
		}
		ort.SetSharedLibraryPath(lib)
		if err := ort.InitializeEnvironment(); err != nil {
			initErr = fmt.Errorf("ONNX Runtime library %s could not be loaded (%v); install ONNX Runtime 1.30 or set %s to another copy", lib, err, EnvLib)
		}
	})
	return initErr
}

// Version returns the loaded ONNX Runtime's version string.
func Version() (string, error) {
	if err := Init(); err != nil {
		return "", err
	}
	return ort.GetVersion(), nil
}

// Run evaluates the model at modelPath in ONNX Runtime (CPU execution
// provider, default optimizations) on feeds, keyed by graph input name, and
// returns every graph output by name. Inputs must be FLOAT or INT64 tensors;
// outputs may be FLOAT or INT64. External data is resolved relative to the
// model's folder, as ONNX Runtime does.
func Run(modelPath string, feeds map[string]*eval.Tensor) (map[string]*eval.Tensor, error) {
	return run(modelPath, nil, feeds)
}

// RunModel evaluates an in-memory model in ONNX Runtime, like Run: the model
// is encoded with its external and deferred initializers inline (so it must
// fit protobuf's 2 GiB limit), which runs exactly what m holds, edits
// included. It has the signature of verify.Runner.
func RunModel(ctx context.Context, m *graph.Model, feeds map[string]*eval.Tensor) (map[string]*eval.Tensor, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := m.Encode(&buf, graph.SaveOptions{External: graph.ExternalInline, Context: ctx}); err != nil {
		return nil, err
	}
	return run(m.Name(), buf.Bytes(), feeds)
}

// run evaluates the model in data, or at path when data is nil.
func run(path string, data []byte, feeds map[string]*eval.Tensor) (map[string]*eval.Tensor, error) {
	if err := Init(); err != nil {
		return nil, err
	}
	opts, err := ort.NewSessionOptions()
	if err != nil {
		return nil, fmt.Errorf("ortrun: session options: %w", err)
	}
	defer opts.Destroy()

	var outInfo []ort.InputOutputInfo
	if data != nil {
		_, outInfo, err = ort.GetInputOutputInfoWithONNXData(data)
	} else {
		_, outInfo, err = ort.GetInputOutputInfoWithOptions(path, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("ortrun: loading %s: %w", path, err)
	}
	outNames := make([]string, len(outInfo))
	for i, o := range outInfo {
		outNames[i] = o.Name
	}
	inNames := make([]string, 0, len(feeds))
	for name := range feeds {
		inNames = append(inNames, name)
	}
	sort.Strings(inNames)

	inputs := make([]ort.Value, 0, len(inNames))
	defer func() {
		for _, v := range inputs {
			v.Destroy()
		}
	}()
	for _, name := range inNames {
		v, err := toORT(feeds[name])
		if err != nil {
			return nil, fmt.Errorf("ortrun: input %q: %w", name, err)
		}
		inputs = append(inputs, v)
	}

	var sess *ort.DynamicAdvancedSession
	if data != nil {
		sess, err = ort.NewDynamicAdvancedSessionWithONNXData(data, inNames, outNames, opts)
	} else {
		sess, err = ort.NewDynamicAdvancedSession(path, inNames, outNames, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("ortrun: session for %s: %w", path, err)
	}
	defer sess.Destroy()

	outputs := make([]ort.Value, len(outNames)) // nil: ORT allocates
	defer func() {
		for _, v := range outputs {
			if v != nil {
				v.Destroy()
			}
		}
	}()
	if err := sess.Run(inputs, outputs); err != nil {
		return nil, fmt.Errorf("ortrun: running %s: %w", path, err)
	}
	res := make(map[string]*eval.Tensor, len(outNames))
	for i, v := range outputs {
		t, err := fromORT(v)
		if err != nil {
			return nil, fmt.Errorf("ortrun: output %q: %w", outNames[i], err)
		}
		res[outNames[i]] = t
	}
	return res, nil
}

func toORT(t *eval.Tensor) (ort.Value, error) {
	if t == nil {
		return nil, errors.New("nil tensor")
	}
	shape := make(ort.Shape, len(t.Shape))
	for i, d := range t.Shape {
		shape[i] = int64(d)
	}
	if len(shape) == 0 && t.Len() == 1 { // a scalar: ort tensors need a dim
		switch t.DType {
		case pb.TensorProto_FLOAT:
			return ort.NewScalar(t.F32[0])
		case pb.TensorProto_INT64:
			return ort.NewScalar(t.I64[0])
		case pb.TensorProto_BOOL:
			return ort.NewScalar(t.Bool[0])
		}
	}
	switch t.DType {
	case pb.TensorProto_FLOAT:
		return ort.NewTensor(shape, append([]float32(nil), t.F32...))
	case pb.TensorProto_INT64:
		return ort.NewTensor(shape, append([]int64(nil), t.I64...))
	case pb.TensorProto_BOOL: // an If condition, say
		return ort.NewTensor(shape, append([]bool(nil), t.Bool...))
	}
	return nil, fmt.Errorf("unsupported input type %s (want FLOAT, INT64 or BOOL)", t.DType)
}

func fromORT(v ort.Value) (*eval.Tensor, error) {
	if v == nil {
		return nil, errors.New("not produced")
	}
	var dims []int
	for _, d := range v.GetShape() {
		dims = append(dims, int(d))
	}
	if dims == nil {
		dims = []int{}
	}
	switch x := v.(type) {
	case *ort.Tensor[float32]:
		return eval.NewFloat32(dims, append([]float32(nil), x.GetData()...)), nil
	case *ort.Tensor[int64]:
		return eval.NewInt64(dims, append([]int64(nil), x.GetData()...)), nil
	}
	return nil, fmt.Errorf("unsupported output value %T (want float32 or int64 tensor)", v)
}
