package diff

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"google.golang.org/protobuf/proto"
)

// Hashing. Structural hashes are 64-bit; they only steer the matching (a
// collision can at worst pair two nodes that then show up as "changed"), so
// a fast non-cryptographic mix is enough. Initializer contents use SHA-256.

const (
	tagInput uint64 = 0x1000 + iota
	tagInit
	tagEmpty
	tagUndef
	tagNode
	tagStar
	tagMatched
	tagOutput
	tagCapture
	tagConsumer
)

// fmix is the splitmix64 finaliser.
func fmix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// comb folds x into h, order-sensitively.
func comb(h, x uint64) uint64 { return fmix(h*0x9e3779b97f4a7c15 ^ fmix(x+0x632be59bd9b4e019)) }

// strHash is FNV-1a over s, finalised.
func strHash(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return fmix(h)
}

func bytesHash(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return fmix(h)
}

// tensorDigest is the content identity of a tensor: its data type, dims and
// the SHA-256 of its raw little-endian bytes (names play no part).
type tensorDigest struct {
	dtype pb.TensorProto_DataType
	dims  []int64
	sum   [32]byte
	bytes int64
}

func (d tensorDigest) key() uint64 {
	h := comb(uint64(d.dtype), uint64(len(d.dims)))
	for _, x := range d.dims {
		h = comb(h, uint64(x))
	}
	return comb(h, binary.LittleEndian.Uint64(d.sum[:8]))
}

func (d tensorDigest) hex() string { return hex.EncodeToString(d.sum[:]) }

// digestTensor hashes t's contents. Bytes are streamed (external data is read
// with ranged reads, never held whole). Tensors without a raw form (STRING)
// hash their string_data; unreadable data yields an error.
func digestTensor(m *graph.Model, t *pb.TensorProto) (tensorDigest, error) {
	d := tensorDigest{dtype: graph.DataType(t), dims: t.GetDims()}
	h := sha256.New()
	if d.dtype == pb.TensorProto_STRING {
		var n [8]byte
		for _, s := range t.StringData {
			binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
			h.Write(n[:])
			h.Write(s)
			d.bytes += int64(len(s))
		}
		copy(d.sum[:], h.Sum(nil))
		return d, nil
	}
	r, n, err := m.TensorReader(t)
	if err != nil {
		return d, err
	}
	if _, err := io.Copy(h, r); err != nil {
		return d, err
	}
	d.bytes = n
	copy(d.sum[:], h.Sum(nil))
	return d, nil
}

// fallbackDigest hashes the tensor message without its name, for tensors
// whose bytes cannot be read.
func fallbackDigest(t *pb.TensorProto) tensorDigest {
	c := proto.Clone(t).(*pb.TensorProto)
	c.Name = nil
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	return tensorDigest{dtype: graph.DataType(t), dims: t.GetDims(), sum: sha256.Sum256(b)}
}

// attrHasher canonicalises node attributes: sorted by name, tensors by
// content, subgraphs by structure (names inside them do not count).
type attrHasher struct {
	m *graph.Model
}

// nodeAttrs hashes all attributes of n, independent of their order.
func (ah *attrHasher) nodeAttrs(attrs []*pb.AttributeProto) uint64 {
	if len(attrs) == 0 {
		return 0
	}
	as := sortedAttrs(attrs)
	h := uint64(len(as))
	for _, a := range as {
		h = comb(h, ah.attr(a))
	}
	return h
}

func sortedAttrs(attrs []*pb.AttributeProto) []*pb.AttributeProto {
	as := append([]*pb.AttributeProto(nil), attrs...)
	sort.SliceStable(as, func(i, j int) bool { return as[i].GetName() < as[j].GetName() })
	return as
}

func floatBits(f float32) uint64 {
	if f != f {
		return 0x7fc00000
	}
	return uint64(math.Float32bits(f))
}

// attr hashes one attribute: name, type, value.
func (ah *attrHasher) attr(a *pb.AttributeProto) uint64 {
	h := comb(strHash(a.GetName()), uint64(a.GetType()))
	if r := a.GetRefAttrName(); r != "" {
		h = comb(h, strHash("ref:"+r))
	}
	switch a.GetType() {
	case pb.AttributeProto_FLOAT:
		h = comb(h, floatBits(a.GetF()))
	case pb.AttributeProto_INT:
		h = comb(h, uint64(a.GetI()))
	case pb.AttributeProto_STRING:
		h = comb(h, bytesHash(a.S))
	case pb.AttributeProto_TENSOR:
		h = comb(h, ah.tensor(a.T))
	case pb.AttributeProto_GRAPH:
		h = comb(h, ah.graphHash(a.G))
	case pb.AttributeProto_FLOATS:
		h = comb(h, uint64(len(a.Floats)))
		for _, f := range a.Floats {
			h = comb(h, floatBits(f))
		}
	case pb.AttributeProto_INTS:
		h = comb(h, uint64(len(a.Ints)))
		for _, x := range a.Ints {
			h = comb(h, uint64(x))
		}
	case pb.AttributeProto_STRINGS:
		h = comb(h, uint64(len(a.Strings)))
		for _, s := range a.Strings {
			h = comb(h, bytesHash(s))
		}
	case pb.AttributeProto_TENSORS:
		h = comb(h, uint64(len(a.Tensors)))
		for _, t := range a.Tensors {
			h = comb(h, ah.tensor(t))
		}
	case pb.AttributeProto_GRAPHS:
		h = comb(h, uint64(len(a.Graphs)))
		for _, g := range a.Graphs {
			h = comb(h, ah.graphHash(g))
		}
	default: // sparse tensors, type protos, untyped legacy attributes
		c := proto.Clone(a).(*pb.AttributeProto)
		c.Name, c.DocString = nil, nil
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c)
		h = comb(h, bytesHash(b))
	}
	return h
}

func (ah *attrHasher) tensor(t *pb.TensorProto) uint64 {
	if t == nil {
		return 0
	}
	d, err := digestTensor(ah.m, t)
	if err != nil {
		d = fallbackDigest(t)
	}
	return d.key()
}

// graphHash hashes a subgraph structurally: its inputs by position, the
// outer values it captures by first use, its initializers by content, each
// node by op, attributes and input hashes, and its outputs by position.
func (ah *attrHasher) graphHash(g *pb.GraphProto) uint64 {
	if g == nil {
		return 0
	}
	val := map[string]uint64{}
	for i, v := range g.Input {
		val[v.GetName()] = comb(tagInput, uint64(i))
	}
	for _, t := range g.Initializer {
		val[t.GetName()] = comb(tagInit, ah.tensor(t))
	}
	captured := 0
	label := func(v string) uint64 {
		if v == "" {
			return tagEmpty
		}
		if h, ok := val[v]; ok {
			return h
		}
		h := comb(tagCapture, uint64(captured))
		captured++
		val[v] = h
		return h
	}
	nodeSum := uint64(0)
	for _, n := range g.Node {
		h := comb(strHash(opID(n)), ah.nodeAttrs(n.Attribute))
		ins := graph.NodeInputs(n)
		h = comb(h, uint64(len(ins)))
		for _, in := range ins {
			h = comb(h, label(in))
		}
		nodeSum += fmix(h)
		for j, o := range n.Output {
			if o != "" {
				val[o] = comb(h, uint64(j))
			}
		}
	}
	h := comb(uint64(len(g.Node)), nodeSum)
	for _, v := range g.Output {
		h = comb(h, label(v.GetName()))
	}
	return h
}

// opID is the op key plus the overload, which selects a model-local function.
func opID(n *pb.NodeProto) string {
	k := graph.OpKey(n)
	if o := n.GetOverload(); o != "" {
		k += "[" + o + "]"
	}
	return k
}

// formatAttr renders an attribute value for reports.
func formatAttr(m *graph.Model, a *pb.AttributeProto) string {
	if a == nil {
		return ""
	}
	if r := a.GetRefAttrName(); r != "" {
		return "@" + r
	}
	switch a.GetType() {
	case pb.AttributeProto_FLOAT:
		return fmtFloat(float64(a.GetF()))
	case pb.AttributeProto_INT:
		return strconv.FormatInt(a.GetI(), 10)
	case pb.AttributeProto_STRING:
		return strconv.Quote(string(a.S))
	case pb.AttributeProto_TENSOR:
		return formatTensor(m, a.T)
	case pb.AttributeProto_GRAPH:
		return formatGraph(m, a.G)
	case pb.AttributeProto_FLOATS:
		return formatList(len(a.Floats), func(i int) string { return fmtFloat(float64(a.Floats[i])) })
	case pb.AttributeProto_INTS:
		return formatList(len(a.Ints), func(i int) string { return strconv.FormatInt(a.Ints[i], 10) })
	case pb.AttributeProto_STRINGS:
		return formatList(len(a.Strings), func(i int) string { return strconv.Quote(string(a.Strings[i])) })
	case pb.AttributeProto_TENSORS:
		return formatList(len(a.Tensors), func(i int) string { return formatTensor(m, a.Tensors[i]) })
	case pb.AttributeProto_GRAPHS:
		return formatList(len(a.Graphs), func(i int) string { return formatGraph(m, a.Graphs[i]) })
	}
	c := proto.Clone(a).(*pb.AttributeProto)
	c.Name, c.DocString = nil, nil
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	return fmt.Sprintf("%s #%016x", a.GetType(), bytesHash(b))
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 32) }

const maxListShown = 16

func formatList(n int, item func(int) string) string {
	var b strings.Builder
	b.WriteByte('[')
	for i := 0; i < n && i < maxListShown; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(item(i))
	}
	if n > maxListShown {
		fmt.Fprintf(&b, ", … (%d in all)", n)
	}
	b.WriteByte(']')
	return b.String()
}

func formatGraph(m *graph.Model, g *pb.GraphProto) string {
	ah := &attrHasher{m: m}
	return fmt.Sprintf("graph(%d nodes) #%08x", len(g.GetNode()), uint32(ah.graphHash(g)))
}

// formatTensor shows small numeric tensors by value and others by type,
// shape and a short content hash.
func formatTensor(m *graph.Model, t *pb.TensorProto) string {
	if t == nil {
		return "tensor()"
	}
	dt := graph.DataType(t)
	shape := formatDims(t.GetDims())
	n, err := graph.NumElements(t.GetDims())
	if err == nil && n <= maxListShown {
		if b, err := m.TensorBytes(t); err == nil {
			if vals, ok := decodeSmall(dt, b, int(n)); ok {
				return fmt.Sprintf("%s%s %s", dt, shape, vals)
			}
		}
	}
	d, err := digestTensor(m, t)
	if err != nil {
		d = fallbackDigest(t)
	}
	return fmt.Sprintf("%s%s sha256:%s", dt, shape, d.hex()[:12])
}

func formatDims(dims []int64) string {
	s := make([]string, len(dims))
	for i, d := range dims {
		s[i] = strconv.FormatInt(d, 10)
	}
	return "[" + strings.Join(s, ",") + "]"
}

func decodeSmall(dt pb.TensorProto_DataType, b []byte, n int) (string, bool) {
	size := graph.ElemBits(dt) / 8
	if size == 0 || len(b) != n*size {
		return "", false
	}
	var item func(i int) string
	switch dt {
	case pb.TensorProto_FLOAT:
		item = func(i int) string {
			return fmtFloat(float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))))
		}
	case pb.TensorProto_DOUBLE:
		item = func(i int) string {
			return strconv.FormatFloat(math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:])), 'g', -1, 64)
		}
	case pb.TensorProto_INT64:
		item = func(i int) string { return strconv.FormatInt(int64(binary.LittleEndian.Uint64(b[8*i:])), 10) }
	case pb.TensorProto_INT32:
		item = func(i int) string { return strconv.FormatInt(int64(int32(binary.LittleEndian.Uint32(b[4*i:]))), 10) }
	case pb.TensorProto_INT8:
		item = func(i int) string { return strconv.Itoa(int(int8(b[i]))) }
	case pb.TensorProto_UINT8:
		item = func(i int) string { return strconv.Itoa(int(b[i])) }
	case pb.TensorProto_BOOL:
		item = func(i int) string { return strconv.FormatBool(b[i] != 0) }
	default:
		return "", false
	}
	return formatList(n, item), true
}
