package eval

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/mokopt/mokopt/graph"
	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

func kIf(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	cond, err := need(in, 0)
	if err != nil {
		return nil, err
	}
	if cond.Len() != 1 {
		return nil, errf("If condition must hold one element")
	}
	branch := "else_branch"
	if cond.Float64At(0) != 0 {
		branch = "then_branch"
	}
	a := graph.Attr(n, branch)
	if a == nil || a.G == nil {
		return nil, errf("If has no %s", branch)
	}
	if c.r != nil && c.r.opt.OnSubgraph != nil {
		other := "then_branch"
		if branch == other {
			other = "else_branch"
		}
		if b := graph.Attr(n, other); b != nil && b.G != nil {
			if err := c.reportSubgraph(b.G, &scope{parent: c.sc, vals: map[string]*Tensor{}}); err != nil {
				return nil, err
			}
		}
	}
	return c.runSubgraph(a.G, nil)
}

// stack joins same-shaped tensors along a new leading axis.
func stack(ts []*Tensor, dt pb.TensorProto_DataType, elemShape []int) *Tensor {
	shape := append([]int{len(ts)}, elemShape...)
	out := New(dt, shape)
	sz := numel(elemShape)
	for i, t := range ts {
		copyRange(out, i*sz, t, 0, sz)
	}
	return out
}

func kLoop(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	a := graph.Attr(n, "body")
	if a == nil || a.G == nil {
		return nil, errf("Loop has no body")
	}
	body := a.G
	maxTrip := int64(-1)
	if t := opt(in, 0); t != nil {
		v, err := scalarInt(t)
		if err != nil {
			return nil, err
		}
		maxTrip = v
	}
	cond := true
	if t := opt(in, 1); t != nil {
		if t.Len() != 1 {
			return nil, errf("Loop condition must hold one element")
		}
		cond = t.Float64At(0) != 0
	}
	carried := append([]*Tensor{}, in[min(2, len(in)):]...)
	nCarried := len(carried)
	nScan := len(body.GetOutput()) - 1 - nCarried
	if nScan < 0 {
		return nil, errf("Loop body has %d outputs for %d carried values", len(body.GetOutput()), nCarried)
	}
	scans := make([][]*Tensor, nScan)
	// The scan outputs gathered so far count toward the memory limit.
	held := int64(0)
	defer func() {
		if c.r != nil {
			c.r.live -= held
		}
	}()
	for i := int64(0); (maxTrip < 0 || i < maxTrip) && cond; i++ {
		if err := c.Context.Err(); err != nil {
			return nil, err
		}
		args := append([]*Tensor{ScalarInt64(i), NewBool(nil, []bool{cond})}, carried...)
		res, err := c.runSubgraph(body, args)
		if err != nil {
			return nil, err
		}
		if res[0] == nil || res[0].Len() != 1 {
			return nil, errf("Loop body condition output must hold one element")
		}
		cond = res[0].Float64At(0) != 0
		copy(carried, res[1:1+nCarried])
		for s := 0; s < nScan; s++ {
			scans[s] = append(scans[s], res[1+nCarried+s])
			if c.r != nil && res[1+nCarried+s] != nil {
				sz := res[1+nCarried+s].ByteSize()
				held += sz
				c.r.live += sz
			}
		}
		if c.r != nil && c.r.opt.MemLimit > 0 && c.r.live > c.r.opt.MemLimit {
			return nil, fmt.Errorf("%w: Loop scan outputs hold %d bytes after %d iterations, %d live (limit %d)", ErrMemLimit, held, i+1, c.r.live, c.r.opt.MemLimit)
		}
		if maxTrip < 0 && opt(in, 1) == nil {
			return nil, errf("Loop without trip count or condition never ends")
		}
	}
	out := append([]*Tensor{}, carried...)
	for s := 0; s < nScan; s++ {
		if len(scans[s]) == 0 {
			dt := pb.TensorProto_DataType(body.GetOutput()[1+nCarried+s].GetType().GetTensorType().GetElemType())
			if kindOf(dt) == kNone {
				dt = pb.TensorProto_FLOAT
			}
			out = append(out, New(dt, []int{0}))
			continue
		}
		first := scans[s][0]
		for _, t := range scans[s] {
			if t == nil || !slices.Equal(t.Shape, first.Shape) {
				return nil, errf("Loop scan output %d changes shape across iterations", s)
			}
		}
		if err := c.checkAlloc(first.DType, append([]int{len(scans[s])}, first.Shape...)); err != nil {
			return nil, err
		}
		out = append(out, stack(scans[s], first.DType, first.Shape))
	}
	return out, nil
}

func kScan(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	a := graph.Attr(n, "body")
	if a == nil || a.G == nil {
		return nil, errf("Scan has no body")
	}
	if c.Opset("") < 9 {
		return scan8(c, n, a.G, in)
	}
	return scanCore(c, n, a.G, in)
}

// scan8 is opset-8 Scan: a leading batch axis, optional sequence_lens first.
func scan8(c *OpContext, n *pb.NodeProto, body *pb.GraphProto, in []*Tensor) ([]*Tensor, error) {
	if t := opt(in, 0); t != nil {
		return nil, errf("Scan-8 sequence_lens is not supported")
	}
	rest := in[1:]
	batch := rest[0].Shape[0]
	var per [][]*Tensor
	for b := 0; b < batch; b++ {
		var args []*Tensor
		for _, t := range rest {
			args = append(args, sliceAxis(t, 0, b, 1).view(t.Shape[1:]))
		}
		res, err := scanCore(c, n, body, args)
		if err != nil {
			return nil, err
		}
		per = append(per, res)
	}
	var out []*Tensor
	for i := range per[0] {
		var ts []*Tensor
		for b := range per {
			ts = append(ts, per[b][i])
		}
		out = append(out, stack(ts, ts[0].DType, ts[0].Shape))
	}
	return out, nil
}

func scanCore(c *OpContext, n *pb.NodeProto, body *pb.GraphProto, in []*Tensor) ([]*Tensor, error) {
	m := int(attrInt(n, "num_scan_inputs", 0))
	nState := len(in) - m
	if m <= 0 || nState < 0 {
		return nil, errf("bad num_scan_inputs %d", m)
	}
	inAxes := attrInts(n, "scan_input_axes")
	inDirs := attrInts(n, "scan_input_directions")
	if c.Opset("") < 9 {
		inDirs = attrInts(n, "directions")
	}
	outAxes := attrInts(n, "scan_output_axes")
	outDirs := attrInts(n, "scan_output_directions")
	state := append([]*Tensor{}, in[:nState]...)
	scanIn := in[nState:]
	axes := make([]int, m)
	T := -1
	for i, t := range scanIn {
		if i < len(inAxes) {
			ax, err := normAxis(inAxes[i], t.Rank())
			if err != nil {
				return nil, err
			}
			axes[i] = ax
		}
		if T >= 0 && t.Shape[axes[i]] != T {
			return nil, errf("scan inputs differ in sequence length")
		}
		T = t.Shape[axes[i]]
	}
	nOut := len(body.GetOutput()) - nState
	scans := make([][]*Tensor, nOut)
	for step := 0; step < T; step++ {
		args := append([]*Tensor{}, state...)
		for i, t := range scanIn {
			pos := step
			if i < len(inDirs) && inDirs[i] == 1 {
				pos = T - 1 - step
			}
			sl := sliceAxis(t, axes[i], pos, 1)
			shape := append(append([]int{}, t.Shape[:axes[i]]...), t.Shape[axes[i]+1:]...)
			args = append(args, sl.view(shape))
		}
		res, err := c.runSubgraph(body, args)
		if err != nil {
			return nil, err
		}
		copy(state, res[:nState])
		for j := 0; j < nOut; j++ {
			scans[j] = append(scans[j], res[nState+j])
		}
	}
	out := append([]*Tensor{}, state...)
	for j := 0; j < nOut; j++ {
		ts := scans[j]
		if j < len(outDirs) && outDirs[j] == 1 {
			for l, r := 0, len(ts)-1; l < r; l, r = l+1, r-1 {
				ts[l], ts[r] = ts[r], ts[l]
			}
		}
		if len(ts) == 0 {
			out = append(out, New(pb.TensorProto_FLOAT, []int{0}))
			continue
		}
		st := stack(ts, ts[0].DType, ts[0].Shape)
		if j < len(outAxes) {
			ax, err := normAxis(outAxes[j], st.Rank())
			if err != nil {
				return nil, err
			}
			if ax != 0 {
				perm := make([]int, 0, st.Rank())
				for d := 1; d <= ax; d++ {
					perm = append(perm, d)
				}
				perm = append(perm, 0)
				for d := ax + 1; d < st.Rank(); d++ {
					perm = append(perm, d)
				}
				st = transpose(st, perm)
			}
		}
		out = append(out, st)
	}
	return out, nil
}

// kEinsum evaluates an Einsum equation by direct summation.
func kEinsum(c *OpContext, n *pb.NodeProto, in []*Tensor) ([]*Tensor, error) {
	eq := strings.ReplaceAll(attrString(n, "equation", ""), " ", "")
	lhs, rhs, explicit := strings.Cut(eq, "->")
	terms := strings.Split(lhs, ",")
	if len(terms) != len(in) {
		return nil, errf("equation %q has %d operands, node has %d", eq, len(terms), len(in))
	}
	dt := in[0].DType
	for _, t := range in {
		if t == nil || t.kind() != in[0].kind() {
			return nil, errf("Einsum operands must share a type")
		}
	}
	// ellipsis rank
	ell := 0
	for i, term := range terms {
		if strings.Contains(term, "...") {
			ell = max(ell, in[i].Rank()-(len(term)-3))
		}
	}
	ellLabels := make([]rune, ell)
	for i := range ellLabels {
		ellLabels[i] = rune(0x100 + i)
	}
	expand := func(term string, rank int) ([]rune, error) {
		var out []rune
		if pre, post, ok := strings.Cut(term, "..."); ok {
			k := rank - len(pre) - len(post)
			if k < 0 {
				return nil, errf("term %q does not match rank %d", term, rank)
			}
			out = append(out, []rune(pre)...)
			out = append(out, ellLabels[ell-k:]...)
			out = append(out, []rune(post)...)
		} else {
			out = []rune(term)
		}
		if len(out) != rank {
			return nil, errf("term %q does not match rank %d", term, rank)
		}
		return out, nil
	}
	labels := make([][]rune, len(in))
	dims := map[rune]int{}
	count := map[rune]int{}
	for i, term := range terms {
		ls, err := expand(term, in[i].Rank())
		if err != nil {
			return nil, err
		}
		labels[i] = ls
		for j, l := range ls {
			d := in[i].Shape[j]
			if old, ok := dims[l]; ok && old != d && old != 1 && d != 1 {
				return nil, errf("label %c has sizes %d and %d", l, old, d)
			}
			if d != 1 || dims[l] == 0 {
				dims[l] = max(dims[l], d)
			}
			count[l]++
		}
	}
	var outL []rune
	if explicit {
		if strings.Contains(rhs, "...") {
			pre, post, _ := strings.Cut(rhs, "...")
			outL = append(append(append(outL, []rune(pre)...), ellLabels...), []rune(post)...)
		} else {
			outL = []rune(rhs)
		}
	} else {
		outL = append(outL, ellLabels...)
		var single []rune
		for l, cnt := range count {
			if cnt == 1 && l < 0x100 {
				single = append(single, l)
			}
		}
		sort.Slice(single, func(i, j int) bool { return single[i] < single[j] })
		outL = append(outL, single...)
	}
	inOut := map[rune]bool{}
	for _, l := range outL {
		if _, ok := dims[l]; !ok {
			return nil, errf("output label %c does not appear in the inputs", l)
		}
		inOut[l] = true
	}
	var sumL []rune
	for l := range dims {
		if !inOut[l] {
			sumL = append(sumL, l)
		}
	}
	sort.Slice(sumL, func(i, j int) bool { return sumL[i] < sumL[j] })
	all := append(append([]rune{}, outL...), sumL...)
	pos := map[rune]int{}
	for i, l := range all {
		pos[l] = i
	}
	allDims := make([]int, len(all))
	for i, l := range all {
		allDims[i] = dims[l]
	}
	// per-operand stride for each label position (0 where broadcast)
	strides := make([][]int, len(in))
	for i, t := range in {
		st := Strides(t.Shape)
		s := make([]int, len(all))
		for j, l := range labels[i] {
			if t.Shape[j] != 1 {
				s[pos[l]] += st[j]
			}
		}
		strides[i] = s
	}
	outShape := allDims[:len(outL)]
	out, err := c.alloc(dt, outShape)
	if err != nil {
		return nil, err
	}
	nOut := numel(outShape)
	nSum := numel(allDims[len(outL):])
	idx := make([]int, len(all))
	vals := make([]float64, len(in))
	for o := 0; o < nOut; o++ {
		copy(idx, Unravel(o, outShape))
		acc := 0.0
		var accI int64
		for s := 0; s < nSum; s++ {
			copy(idx[len(outL):], Unravel(s, allDims[len(outL):]))
			p := 1.0
			var pi int64 = 1
			for i, t := range in {
				f := 0
				for j, v := range idx {
					f += v * strides[i][j]
				}
				if t.kind() == kI64 {
					pi *= t.I64[f]
				} else {
					vals[i] = t.Float64At(f)
					p *= vals[i]
				}
			}
			acc += p
			accI += pi
		}
		switch out.kind() {
		case kI64:
			out.I64[o] = accI
		case kF32, kF64:
			setF(out, o, acc)
		default:
			return nil, errf("Einsum is not defined for %s", dt)
		}
	}
	return []*Tensor{out}, nil
}

func init() {
	builtin("", kIf, "If")
	builtin("", kLoop, "Loop")
	builtin("", kScan, "Scan")
	builtin("", kEinsum, "Einsum")
}
