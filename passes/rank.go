package passes

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// rankInfer returns the rank of v: the declared one, or one worked out from
// its producers (graph.InferRank), or -1 when it cannot be told. Chained
// blocks leave the values between them undeclared; their ranks still decide
// which value a fused node reads (see inputLike).
func (c *ctx) rankInfer(v string) int {
	if c.rankMemo == nil {
		c.rankMemo = map[string]int{}
	}
	r, _ := graph.InferRank(ctxRanks{c}, v, c.rankMemo)
	return r
}

// ctxRanks answers graph.InferRank from the detection context: ranks the
// graph declares or its initializers have, producers and integer constants.
type ctxRanks struct{ c *ctx }

func (s ctxRanks) Producer(v string) *pb.NodeProto { return s.c.g.Producer(v) }

func (s ctxRanks) KnownRank(v string) (int, bool) {
	if r := s.c.rankOf(v); r >= 0 {
		return r, true
	}
	if t := s.c.g.Initializer(v); t != nil {
		return len(t.GetDims()), true
	}
	return 0, false
}

func (s ctxRanks) ConstInts(v string) ([]int64, bool) {
	if p := s.c.g.Producer(v); s.c.g.Initializer(v) == nil && (p == nil || p.GetOpType() != "Constant") {
		return nil, false // not a constant itself (constInts would look through reshapes)
	}
	x := s.c.constInts(v)
	return x, x != nil
}
