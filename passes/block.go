package passes

import (
	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
	"github.com/mokopt/mokopt/moe"
)

// detectAt analyzes the block the selection tk routes for (analyze, under
// attempt's safety net).
func (c *ctx) detectAt(tk *pb.NodeProto) (b *Block, err error) {
	if err := attempt(func() (e error) { b, e = c.analyze(tk); return e }); err != nil {
		return nil, err
	}
	return b, nil
}

// analyze reads the block the selection tk routes for, or says why it is
// no block ai.mok::MoE expresses.
func (c *ctx) analyze(tk *pb.NodeProto) (*Block, error) {
	s := moe.Spec{RoutedScalingFactor: 1, EPSize: 1, SwiGLUAlpha: 1}
	ri, err := c.routerSpec(tk, &s)
	if err != nil {
		return nil, err
	}
	x0 := c.inputBoundary(ri.x)
	y := c.postDominator(tk, ri.linear)
	if y == "" {
		y = c.combineBeside(tk, ri.linear) // sides.go
	}
	if y == "" {
		return nil, rejectf("no single value combines the experts' outputs after the router")
	}
	xDeps := c.reachFrom(x0)
	y, sharedVal := c.extendOutput(y, x0, xDeps)
	regionPos := c.regionPos(x0, y, xDeps.hasPos)
	region := c.nodesAt(regionPos)
	b := &Block{Kind: "", Input: c.inputLike(x0, ri.x, y), Router: ri.x, Output: y, TopK: tk}
	b.Region, b.regionPos = region, regionPos
	b.Nodes = len(region)
	// Router post-processing: nodes downstream of the top-k values (and of a
	// gather of the scores by the indices) that do not touch expert compute.
	var sharedNodes map[*pb.NodeProto]bool
	if sharedVal != "" {
		sharedNodes = c.backward(sharedVal, map[string]bool{x0: true})
	}
	if err := c.checkRouterInput(ri, x0, y, regionPos, sharedNodes); err != nil { // routerinput.go
		return nil, err
	}
	c.setLimitPos(regionPos)
	c.idxDeps = nil
	defer func() { c.setLimit(nil); c.idxDeps = nil }()
	if err := c.routerPost(tk, ri, &s); err != nil {
		return nil, rejectf("%v", err)
	}
	plan := &WeightPlan{}
	kind, err := c.experts(b, tk, ri, &s, sharedNodes, plan)
	if err != nil {
		return nil, err
	}
	b.Kind = kind
	if err := padNullExperts(plan, b.NullExperts); err != nil { // nullexperts.go
		return nil, rejectf("null experts: %v", err)
	}
	if sharedVal != "" {
		if err := c.sharedExpert(sharedVal, x0, &s, plan); err != nil {
			return nil, err
		}
	}
	plan.Router = Proj{Init: ri.w, Expert: -1, InOut: ri.wInOut}
	if ri.bias != nil {
		plan.RouterB = &Proj{Init: ri.bias, Expert: -1}
	}
	if ri.corr != nil {
		plan.Corr = &Proj{Init: ri.corr, Expert: -1}
	}
	b.W = plan
	b.Spec = s
	c.exposeLogits(b, ri) // logits.go
	s = b.Spec
	if err := s.Validate(); err != nil {
		return nil, rejectf("%v", err)
	}
	b.Name = blockName(y, ri.w.GetName(), region)
	return b, nil
}

// routerSpec reads the selection tk's top-k and router into s: k, the
// router's activation, order, groups and shape (a sparsemixer's selection
// too).
func (c *ctx) routerSpec(tk *pb.NodeProto, s *moe.Spec) (*routerInfo, error) {
	sm := c.sparse[tk]
	if sm != nil {
		s.TopK = sm.k
	} else {
		k, ok := c.scalarInt(tk.Input[1])
		if !ok {
			return nil, rejectf("TopK k is not a constant: %q is computed at run time (from a dimension that is not static, such as the number of tokens), and the fused op's top_k is fixed", tk.Input[1])
		}
		if graph.AttrInt(tk, "largest", 1) != 1 {
			return nil, rejectf("TopK selects the smallest values, not a router")
		}
		s.TopK = int(k)
	}
	ri, err := c.router(tk)
	if err != nil {
		return nil, err
	}
	s.RouterActivation, s.RouterOrder, s.NGroup, s.TopKGroup = ri.act, ri.order, ri.nGroup, ri.topkGroup
	if ri.groupMax && ri.nGroup > 1 {
		s.GroupScore = moe.GroupScoreMax
	}
	if sm != nil {
		if ri.act != "" || ri.corr != nil || ri.nGroup > 1 {
			return nil, rejectf("sparsemixer router with an activation, correction bias or groups before it")
		}
		s.RouterActivation, s.RouterOrder, s.SparseMixerThreshold = moe.SparseMixer, moe.TopKThenActivation, sm.thr
	}
	if err := c.routerShape(ri, s); err != nil {
		return nil, err
	}
	if s.TopK > s.NumExperts {
		return nil, rejectf("TopK k=%d exceeds the router's %d outputs", s.TopK, s.NumExperts)
	}
	return ri, nil
}

// extendOutput extends the combine value y through shape noise, a cast back
// to a half-precision input's type (exports of float16/bfloat16 models
// combine in float32) and a shared-expert Add; it returns the block output
// and the shared expert's value ("" when none).
func (c *ctx) extendOutput(y, x0 string, xDeps *reach) (string, string) {
	var sharedVal string
	castBack := false
	for {
		cons := c.g.Consumers(y)
		if len(cons) != 1 || c.g.IsOutput(y) {
			return y, sharedVal
		}
		if c.feedsRouter(c.g.ValueID(y)) {
			// y reaches the next block's router through shape ops only:
			// the blocks meet at the boundary of that chain (see boundary),
			// which the next block finds from its side too.
			return c.boundary(y), sharedVal
		}
		n := cons[0]
		if noiseOps[n.GetOpType()] && n.GetOpType() != "Cast" || n.GetOpType() == "ReduceSum" && sharedVal == "" {
			y = n.Output[0]
			continue
		}
		if n.GetOpType() == "Cast" && (!castBack && c.castsBackTo(n, x0) || c.upcasts(n)) {
			castBack = castBack || !c.upcasts(n)
			y = n.Output[0]
			continue
		}
		if n.GetOpType() == "Add" && sharedVal == "" {
			other := otherInput(n, y)
			if p := c.g.Producer(other); p != nil && xDeps.has(p) && c.sharedBranch(other, x0) { // ownership.go
				sharedVal = other
				y = n.Output[0]
				continue
			}
		}
		return y, sharedVal
	}
}
