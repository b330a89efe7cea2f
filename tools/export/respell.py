#!/usr/bin/env python3
"""Rewrites committed exports into other spellings of the same computation.

    python3 tools/export/respell.py OUTDIR SRC.onnx [TRANSFORM ...]

writes OUTDIR/NAME__TRANSFORM.onnx for each transform (all of them when none
is named) and copies SRC's NAME_data folder beside each as
NAME__TRANSFORM_data: every transform computes what the source computes (up
to float rounding), so the source's golden outputs hold for it. Needs only
the onnx Python package (Debian's python3-onnx 1.12 will do).

Transforms:
  const      every initializer becomes a Constant node
  identity   an Identity after every node output (value_info dropped)
  strip      value_info and the outputs' shapes dropped
  swap       operands of commutative binary ops swapped
  transpose  each 2-D MatMul weight stored transposed, behind a Transpose
  cast       a Cast to its own type (a no-op) before each MatMul/Gemm input
  if         the whole graph inside an If on a constant true (both branches equal)
  divmul     x / c by a constant written x * (1/c)
  subneg     a - b written a + (-b)
  softmax    Softmax(x) written Exp(x - ReduceMax(x)) / ReduceSum(...)
  topkneg    TopK(x) written TopK(-x) with largest flipped, the values negated back
  mul1       a Mul by 1 after each Sigmoid
  sigmoid    Sigmoid(x) written 1 / (1 + Exp(-x))
  recip      a / b by a computed b written a * Reciprocal(b)
  logsoftmax Softmax(x) written Exp(LogSoftmax(x))
  einsum     x @ W by a 2-D initializer W written Einsum("...i,ij->...j")
  gemm       Gemm(A, B, C) of alpha = beta = 1 written MatMul (with Transposes) + C
  sum        a + b of floats written Sum(a, b)
  axis       a negative axis attribute (Softmax, TopK, Concat, Gather, ...) written as its positive value
  widen      every float32 MatMul output cast to double and back (an exact round trip)
  unsq       Unsqueeze(x, [a]) written Reshape(x, Concat(Shape(x)[:a], [1], Shape(x)[a:]))
  tmm        x @ W of a 2-D x and a 2-D initializer W written (W^T @ x^T)^T
  flat2d     x @ W of a rank-3 x and a 2-D initializer W written Reshape(Reshape(x, [-1, K]) @ W, [*x.shape[:-1], N])
  loop       the whole graph inside a Loop of one trip (outputs as scan outputs, squeezed after)
  func       the whole graph as one call of a model-local function (initializers passed as inputs)
  pow        x*x written Pow(x, 2), Sqrt(x) Pow(x, 0.5), Reciprocal(x) Pow(x, -1)
  gathertopk TopK's values written GatherElements(scores, TopK's indices)
  argmax     a TopK of k = 1 written ArgMax and ReduceMax
  fusegu     two MatMuls of one input by 2-D initializers of one shape written one MatMul of the concatenated weight and a Split
  subflip    a - b written Neg(b - a)
  max0       Relu(x) written Max(x, 0)
  squeeze    Squeeze(Unsqueeze(y, [0]), [0]) after every MatMul output
  onehot     OneHot(i, depth, values) on the last axis written Where(Equal(Unsqueeze(i, -1), Range(0, depth)), on, off)
  dropout    an inference Dropout (an identity) after every MatMul output
  splitgu    one MatMul by a 2-D initializer split in two along its last axis written two MatMuls of the weight's halves
  expand     a Mul by a scalar constant c written a Mul by Expand(c, Shape(x))
  silu       x * Sigmoid(x) written x / (1 + Exp(-x))
  powdiv     a / b by a computed b written a * Pow(b, -1)
  lse        Softmax(x) written Exp(x - ReduceLogSumExp(x))
  sorted0    every TopK with sorted=0 (ONNX Runtime's CPU kernel still returns them sorted)
  int32ids   TopK indices read only by Gather/GatherElements/OneHot cast to int32 first
  add0       an Add of 0 after every MatMul output
  neg2       Neg(Neg(p)) after every Softmax and Sigmoid output
  topklogits a TopK of Softmax(x) or Sigmoid(x) taken on x, its values gathered from the probabilities
  clip0      Relu(x) written Clip(x, 0)
  whererelu  Relu(x) written Where(x > 0, x, 0)
  div1       a Div by 1 after every Softmax, Sigmoid and MatMul output
  reassoc    Mul(Mul(a, b), c) by a scalar constant c written Mul(a, Mul(b, c))
  w3d        x @ W of a rank-3 x and a 2-D initializer W written x @ W[None] (a [1, K, N] weight)
  maskwhere  a * Cast(m) of a boolean m written Where(m, a, 0)
  stackw     2-D MatMul weights of one shape stacked in one initializer, each read back as Gather(stack, i)
  sigtanh    Sigmoid(x) written (1 + Tanh(x / 2)) / 2
  gathernd   Gather(x, i) on axis 0 by a rank-1 int64 i written GatherND(x, Unsqueeze(i, -1))
  togemm     x @ W of a 2-D x and a 2-D initializer W written Gemm(x, W)
  flatten    Reshape(x, [-1, c]) of x whose last dim is c written Flatten(x, rank - 1)
  notwhere   Where(c, a, b) written Where(Not(c), b, a)
  flipcmp    Greater(a, b) written Less(b, a), and the other order comparisons likewise
  softmaxt   Softmax(x) of a 2-D x over its last axis written Transpose(Softmax(Transpose(x), axis=0))
  stacksum   a + b of one known shape written ReduceSum(Concat(a[None], b[None]), 0)
  scan       the whole graph inside a Scan over its first input unsqueezed (outputs squeezed after)
  dynin      every dim of the graph's inputs and outputs but the last made symbolic (value_info dropped)
  rowsplit   x @ W by a 2-D initializer W of an even row count written x[..., :K/2] @ W[:K/2] + x[..., K/2:] @ W[K/2:]
  lpnorm     p / ReduceSum(p) over the last axis, of probabilities or their top k, written LpNormalization(p, p=1)
  meanx      ReduceSum(x) over axes of known sizes written ReduceMean(x) * (their product)
  finmin     every -inf in a constant written as its type's lowest finite value
  seqstack   Concat(a, b, ...) written ConcatFromSequence(SequenceConstruct(a, b, ...))
  splitseq   Split(x) into n outputs written SplitToSequence(x) and n SequenceAt
  gslice     Gather(x, i) by a scalar constant i written Squeeze(Slice(x, i, i + 1))
  slicestep  every Slice given its axes and steps (of ones) explicitly
  absrelu    Relu(x) written (x + Abs(x)) * 0.5
  mulneg     Neg(x) of floats written x * -1
  f64soft    Softmax(x) of floats computed in double: Cast(Softmax(Cast(x, double)), its type)
  sumeps     p / ReduceSum(p) written p / (ReduceSum(p) + 1e-20)
"""
import copy
import os
import shutil
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def rebuild(g, nodes):
    del g.node[:]
    g.node.extend(nodes)


def after_outputs(m, ops, suffix, make):
    """Renames the first output o of every node whose op is in ops to o + suffix and puts the
    nodes make(k, o + suffix, o) returns (those that compute o from it) after the node; k is
    the node's position. make returns None to leave the node as it is."""
    g, nodes = m.graph, []
    for k, n in enumerate(g.node):
        nodes.append(n)
        if n.op_type not in ops:
            continue
        o = n.output[0]
        extra = make(k, o + suffix, o)
        if extra is not None:
            n.output[0] = o + suffix
            nodes += extra
    rebuild(g, nodes)


def by_const_after(m, ops, suffix, op, value, cname, nname):
    """after_outputs with op(o, value) (an identity: Add 0, Div 1) after every float output, its
    constant named cname + k in the output's type and its node nname + k."""
    types = value_types(m)

    def make(k, pre, o):
        dt = FLOATS.get(types.get(o))
        if dt is None:
            return None
        m.graph.initializer.append(numpy_helper.from_array(np.array(value, dtype=dt), f"{cname}{k}"))
        return [helper.make_node(op, [pre, f"{cname}{k}"], [o], name=f"{nname}{k}")]
    after_outputs(m, ops, suffix, make)


def consts(g):
    d = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    d[n.output[0]] = numpy_helper.to_array(a.t)
    return d


def t_const(m):
    g = m.graph
    ins = {i.name for i in g.input}  # an initializer that is also an input is a default: kept
    cs = [helper.make_node("Constant", [], [t.name], value=t, name="c_" + t.name) for t in g.initializer if t.name not in ins]
    keep = [t for t in g.initializer if t.name in ins]
    del g.initializer[:]
    g.initializer.extend(keep)
    rebuild(g, cs + list(g.node))


def t_identity(m):
    g, nodes = m.graph, []
    outs = {o.name for o in g.output}
    for n in g.node:
        nodes.append(n)
        for i, o in enumerate(n.output):
            if o and o not in outs:
                n.output[i] = o + "__pre"
                nodes.append(helper.make_node("Identity", [o + "__pre"], [o], name=f"{n.name}_id{i}"))
    rebuild(g, nodes)
    del g.value_info[:]


def t_strip(m):
    del m.graph.value_info[:]
    for o in m.graph.output:
        o.type.tensor_type.ClearField("shape")


def t_swap(m):
    for n in m.graph.node:
        if n.op_type in ("Add", "Mul", "Max", "Min", "Sum") and len(n.input) == 2:
            n.input[0], n.input[1] = n.input[1], n.input[0]


def t_transpose(m):
    g, nodes = m.graph, []
    inits = {t.name: t for t in g.initializer}
    for n in g.node:
        if n.op_type == "MatMul" and n.input[1] in inits and len(inits[n.input[1]].dims) == 2:
            t = inits[n.input[1]]
            tt = numpy_helper.from_array(numpy_helper.to_array(t).T.copy(), t.name + "__T")
            g.initializer.append(tt)
            o = f"{t.name}__TT_{n.name}"
            nodes.append(helper.make_node("Transpose", [tt.name], [o], perm=[1, 0], name=n.name + "_tr"))
            n.input[1] = o
        nodes.append(n)
    rebuild(g, nodes)


def value_types(m):
    """The element type of every value shape inference or an initializer gives."""
    inferred = onnx.shape_inference.infer_shapes(m).graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(inferred.value_info) + list(inferred.input) + list(inferred.output)}
    types.update({t.name: t.data_type for t in m.graph.initializer})
    return types


FLOATS = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64}


def t_cast(m):
    g, nodes = m.graph, []
    # the no-op cast is to the value's own type (float16 in a half-precision graph)
    types = value_types(m)
    for n in g.node:
        if n.op_type in ("MatMul", "Gemm"):
            c = f"{n.input[0]}__cast_{n.name}"
            to = types.get(n.input[0]) or TensorProto.FLOAT
            nodes.append(helper.make_node("Cast", [n.input[0]], [c], to=to, name=n.name + "_cast"))
            n.input[0] = c
        nodes.append(n)
    rebuild(g, nodes)


def t_if(m):
    g = m.graph
    ins = {i.name for i in g.input}  # an initializer that is also an input stays outside, a default
    keep = [t for t in g.initializer if t.name in ins]
    then = helper.make_graph(list(g.node), "then", [], list(g.output), [t for t in g.initializer if t.name not in ins])
    other = copy.deepcopy(then)
    other.name = "else"
    for n in other.node:
        n.name += "_e"
    outs = [o.name for o in g.output]
    node = helper.make_node("If", ["cond__"], [o + "__if" for o in outs], then_branch=then, else_branch=other, name="wrap_if")
    ids = [helper.make_node("Identity", [o + "__if"], [o], name="id_" + o) for o in outs]
    rebuild(g, [node] + ids)
    del g.initializer[:]
    g.initializer.extend(keep)
    g.initializer.append(helper.make_tensor("cond__", TensorProto.BOOL, [], [True]))
    del g.value_info[:]


def t_divmul(m):
    g, nodes = m.graph, []
    c = consts(g)
    for k, n in enumerate(g.node):
        if n.op_type == "Div" and n.input[1] in c and c[n.input[1]].dtype in (np.float32, np.float16):
            t = numpy_helper.from_array(np.array(1.0 / c[n.input[1]]).astype(c[n.input[1]].dtype), f"recip{k}")
            g.initializer.append(t)
            n.op_type, n.input[1] = "Mul", t.name
        nodes.append(n)
    rebuild(g, nodes)


def t_subneg(m):
    g, nodes = m.graph, []
    for k, n in enumerate(g.node):
        if n.op_type == "Sub":
            nodes.append(helper.make_node("Neg", [n.input[1]], [f"neg{k}"], name=f"negn{k}"))
            n.op_type, n.input[1] = "Add", f"neg{k}"
        nodes.append(n)
    rebuild(g, nodes)


def t_softmax(m):
    g, nodes = m.graph, []
    for k, n in enumerate(g.node):
        if n.op_type != "Softmax":
            nodes.append(n)
            continue
        ax = [a.i for a in n.attribute if a.name == "axis"]
        p, x = f"smx{k}", n.input[0]
        g.initializer.append(numpy_helper.from_array(np.array([ax[0] if ax else -1], dtype=np.int64), p + "_axes"))
        nodes += [helper.make_node("ReduceMax", [x, p + "_axes"], [p + "_m"], keepdims=1, name=p + "a"),
                  helper.make_node("Sub", [x, p + "_m"], [p + "_s"], name=p + "b"),
                  helper.make_node("Exp", [p + "_s"], [p + "_e"], name=p + "c"),
                  helper.make_node("ReduceSum", [p + "_e", p + "_axes"], [p + "_z"], keepdims=1, name=p + "d"),
                  helper.make_node("Div", [p + "_e", p + "_z"], [n.output[0]], name=p + "e")]
    rebuild(g, nodes)


def t_topkneg(m):
    g, nodes = m.graph, []
    for k, n in enumerate(g.node):
        if n.op_type != "TopK":
            nodes.append(n)
            continue
        p = f"tkn{k}"
        attrs = {a.name: a.i for a in n.attribute if a.name in ("axis", "sorted")}
        largest = next((a.i for a in n.attribute if a.name == "largest"), 1)
        nodes.append(helper.make_node("Neg", [n.input[0]], [p + "_x"], name=p + "a"))
        nodes.append(helper.make_node("TopK", [p + "_x", n.input[1]], [p + "_v", n.output[1]], name=n.name, largest=1 - largest, **attrs))
        if n.output[0]:
            nodes.append(helper.make_node("Neg", [p + "_v"], [n.output[0]], name=p + "b"))
    rebuild(g, nodes)


def t_mul1(m):
    m.graph.initializer.append(numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one__"))
    after_outputs(m, ("Sigmoid",), "__m1", lambda k, pre, o: [helper.make_node("Mul", [pre, "one__"], [o], name=f"m1_{k}")])


def t_sigmoid(m):
    g, nodes, types = m.graph, [], value_types(m)
    for k, n in enumerate(g.node):
        dt = FLOATS.get(types.get(n.input[0])) if n.op_type == "Sigmoid" else None
        if dt is None:
            nodes.append(n)
            continue
        p = f"sig{k}"
        g.initializer.append(numpy_helper.from_array(np.array(1, dtype=dt), p + "_one"))
        nodes += [helper.make_node("Neg", [n.input[0]], [p + "_n"], name=p + "a"),
                  helper.make_node("Exp", [p + "_n"], [p + "_e"], name=p + "b"),
                  helper.make_node("Add", [p + "_one", p + "_e"], [p + "_d"], name=p + "c"),
                  helper.make_node("Reciprocal", [p + "_d"], [n.output[0]], name=n.name or p + "d")]
    rebuild(g, nodes)


def t_recip(m):
    g, nodes, types, c = m.graph, [], value_types(m), consts(m.graph)
    for k, n in enumerate(g.node):
        if n.op_type == "Div" and n.input[1] not in c and types.get(n.input[1]) in FLOATS:
            nodes.append(helper.make_node("Reciprocal", [n.input[1]], [f"rcp{k}"], name=f"rcpn{k}"))
            n.op_type, n.input[1] = "Mul", f"rcp{k}"
        nodes.append(n)
    rebuild(g, nodes)


def t_logsoftmax(m):
    g, nodes = m.graph, []
    for k, n in enumerate(g.node):
        if n.op_type != "Softmax":
            nodes.append(n)
            continue
        o = n.output[0]
        n.op_type, n.output[0] = "LogSoftmax", o + "__log"
        nodes += [n, helper.make_node("Exp", [o + "__log"], [o], name=f"lsm{k}")]
    rebuild(g, nodes)


def t_einsum(m):
    g, nodes = m.graph, []
    inits = {t.name: t for t in g.initializer}
    for n in g.node:
        w = inits.get(n.input[1]) if n.op_type == "MatMul" else None
        if w is not None and len(w.dims) == 2 and w.data_type in FLOATS:
            n.op_type = "Einsum"
            n.attribute.append(helper.make_attribute("equation", "...i,ij->...j"))
        nodes.append(n)
    rebuild(g, nodes)


def t_gemm(m):
    g, nodes = m.graph, []
    for k, n in enumerate(g.node):
        at = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type != "Gemm" or at.get("alpha", 1.0) != 1.0 or at.get("beta", 1.0) != 1.0:
            nodes.append(n)
            continue
        p, a, b = f"gm{k}", n.input[0], n.input[1]
        if at.get("transA", 0):
            nodes.append(helper.make_node("Transpose", [a], [p + "_a"], perm=[1, 0], name=p + "ta"))
            a = p + "_a"
        if at.get("transB", 0):
            nodes.append(helper.make_node("Transpose", [b], [p + "_b"], perm=[1, 0], name=p + "tb"))
            b = p + "_b"
        if len(n.input) > 2 and n.input[2]:
            nodes += [helper.make_node("MatMul", [a, b], [p + "_m"], name=p + "m"),
                      helper.make_node("Add", [p + "_m", n.input[2]], [n.output[0]], name=n.name or p + "add")]
        else:
            nodes.append(helper.make_node("MatMul", [a, b], [n.output[0]], name=n.name or p + "m"))
    rebuild(g, nodes)


def t_sum(m):
    types = value_types(m)
    for n in m.graph.node:
        if n.op_type == "Add" and types.get(n.output[0]) in FLOATS:
            n.op_type = "Sum"


def value_ranks(m):
    """The rank of every value shape inference declares."""
    inferred = onnx.shape_inference.infer_shapes(m).graph
    return {v.name: len(v.type.tensor_type.shape.dim) for v in list(inferred.value_info) + list(inferred.input) + list(inferred.output)
            if v.type.tensor_type.HasField("shape")}


def t_axis(m):
    ranks = value_ranks(m)
    for n in m.graph.node:
        r = ranks.get(n.input[0]) if n.input else None
        for a in n.attribute:
            if a.name == "axis" and a.type == onnx.AttributeProto.INT and a.i < 0 and r:
                a.i += r + (n.op_type == "OneHot")  # OneHot's axis counts the output's new axis


def t_widen(m):
    g, nodes, types = m.graph, [], value_types(m)
    for k, n in enumerate(g.node):
        nodes.append(n)
        if n.op_type == "MatMul" and types.get(n.output[0]) == TensorProto.FLOAT:
            o = n.output[0]
            n.output[0] = o + "__f32"
            nodes += [helper.make_node("Cast", [o + "__f32"], [o + "__f64"], to=TensorProto.DOUBLE, name=f"wd{k}a"),
                      helper.make_node("Cast", [o + "__f64"], [o], to=TensorProto.FLOAT, name=f"wd{k}b")]
    rebuild(g, nodes)


def opset(m):
    return next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))


def axes_node(m, op, x, out, axes, name, **attrs):
    """op(x) over axes, with axes an input or an attribute as the model's opset has it."""
    since = {"Squeeze": 13, "Unsqueeze": 13, "ReduceSum": 13}.get(op, 18)
    if opset(m) >= since:
        return helper.make_node(op, [x, _ints(m.graph, name + "_axes", axes)], [out], name=name, **attrs)
    return helper.make_node(op, [x], [out], name=name, axes=axes, **attrs)


def _ints(g, name, vals):
    g.initializer.append(numpy_helper.from_array(np.array(vals, dtype=np.int64), name))
    return name


def t_unsq(m):
    g, nodes, ranks, c = m.graph, [], value_ranks(m), consts(m.graph)
    for k, n in enumerate(g.node):
        if n.op_type != "Unsqueeze":
            nodes.append(n)
            continue
        axes = [a.ints for a in n.attribute if a.name == "axes"]
        axes = list(axes[0]) if axes else (list(c[n.input[1]].reshape(-1)) if len(n.input) > 1 and n.input[1] in c else None)
        r = ranks.get(n.input[0])
        if axes is None or len(axes) != 1 or r is None:
            nodes.append(n)
            continue
        a = int(axes[0]) + (r + 1 if axes[0] < 0 else 0)
        p = f"unsq{k}"
        nodes += [helper.make_node("Shape", [n.input[0]], [p + "_s"], name=p + "a"),
                  helper.make_node("Slice", [p + "_s", _ints(g, p + "_z", [0]), _ints(g, p + "_a", [a])], [p + "_h"], name=p + "b"),
                  helper.make_node("Slice", [p + "_s", _ints(g, p + "_a2", [a]), _ints(g, p + "_e", [r])], [p + "_t"], name=p + "c"),
                  helper.make_node("Concat", [p + "_h", _ints(g, p + "_one", [1]), p + "_t"], [p + "_shape"], axis=0, name=p + "d"),
                  helper.make_node("Reshape", [n.input[0], p + "_shape"], [n.output[0]], name=n.name or p + "e")]
    rebuild(g, nodes)


def t_flat2d(m):
    g, nodes, ranks = m.graph, [], value_ranks(m)
    inits = {t.name: t for t in g.initializer}
    for k, n in enumerate(g.node):
        w = inits.get(n.input[1]) if n.op_type == "MatMul" else None
        if w is None or len(w.dims) != 2 or ranks.get(n.input[0]) != 3:
            nodes.append(n)
            continue
        p, K, N = f"fl{k}", w.dims[0], w.dims[1]
        nodes += [helper.make_node("Reshape", [n.input[0], _ints(g, p + "_kshape", [-1, K])], [p + "_x2"], name=p + "a"),
                  helper.make_node("MatMul", [p + "_x2", n.input[1]], [p + "_y2"], name=n.name or p + "b"),
                  helper.make_node("Shape", [n.input[0]], [p + "_s"], name=p + "c"),
                  helper.make_node("Slice", [p + "_s", _ints(g, p + "_z", [0]), _ints(g, p + "_e", [2])], [p + "_lead"], name=p + "d"),
                  helper.make_node("Concat", [p + "_lead", _ints(g, p + "_n", [N])], [p + "_shape"], axis=0, name=p + "e"),
                  helper.make_node("Reshape", [p + "_y2", p + "_shape"], [n.output[0]], name=p + "f")]
    rebuild(g, nodes)


def t_tmm(m):
    g, nodes, ranks = m.graph, [], value_ranks(m)
    inits = {t.name: t for t in g.initializer}
    for k, n in enumerate(g.node):
        w = inits.get(n.input[1]) if n.op_type == "MatMul" else None
        if w is None or len(w.dims) != 2 or ranks.get(n.input[0]) != 2:
            nodes.append(n)
            continue
        p = f"tmm{k}"
        nodes += [helper.make_node("Transpose", [n.input[1]], [p + "_wt"], perm=[1, 0], name=p + "a"),
                  helper.make_node("Transpose", [n.input[0]], [p + "_xt"], perm=[1, 0], name=p + "b"),
                  helper.make_node("MatMul", [p + "_wt", p + "_xt"], [p + "_yt"], name=n.name or p + "c"),
                  helper.make_node("Transpose", [p + "_yt"], [n.output[0]], perm=[1, 0], name=p + "d")]
    rebuild(g, nodes)


def t_loop(m):
    g = m.graph
    ins = {i.name for i in g.input}
    keep = [t for t in g.initializer if t.name in ins]
    outs = [o.name for o in g.output]
    body_in = [helper.make_tensor_value_info("it__", TensorProto.INT64, []), helper.make_tensor_value_info("cin__", TensorProto.BOOL, [])]
    body_out = [helper.make_tensor_value_info("cout__", TensorProto.BOOL, [])]
    for o in g.output:
        v = copy.deepcopy(o)
        v.type.tensor_type.ClearField("shape")
        body_out.append(v)
    nodes = [helper.make_node("Identity", ["cin__"], ["cout__"], name="loop_cond")] + list(g.node)
    body = helper.make_graph(nodes, "body", body_in, body_out, [t for t in g.initializer if t.name not in ins])
    node = helper.make_node("Loop", ["trip__", ""], [o + "__loop" for o in outs], body=body, name="wrap_loop")
    del g.initializer[:]
    g.initializer.extend(keep)
    sq = [axes_node(m, "Squeeze", o + "__loop", o, [0], "sq_" + o) for o in outs]
    rebuild(g, [node] + sq)
    g.initializer.append(helper.make_tensor("trip__", TensorProto.INT64, [], [1]))
    del g.value_info[:]


def t_func(m):
    g = m.graph
    ins = {i.name for i in g.input}
    weights = [t.name for t in g.initializer if t.name not in ins]
    f_in = [i.name for i in g.input] + weights
    outs = [o.name for o in g.output]
    f = helper.make_function("respell.local", "Block", f_in, outs, list(g.node), list(m.opset_import))
    m.functions.append(f)
    m.opset_import.append(helper.make_opsetid("respell.local", 1))
    rebuild(g, [helper.make_node("Block", f_in, outs, domain="respell.local", name="block_call")])
    del g.value_info[:]


def t_pow(m):
    g, nodes, types = m.graph, [], value_types(m)
    for k, n in enumerate(g.node):
        dt = FLOATS.get(types.get(n.input[0])) if n.input else None
        e = None
        if dt is not None and n.op_type == "Mul" and n.input[0] == n.input[1]:
            e = 2.0
        elif dt is not None and n.op_type == "Sqrt":
            e = 0.5
        elif dt is not None and n.op_type == "Reciprocal":
            e = -1.0
        if e is not None:
            g.initializer.append(numpy_helper.from_array(np.array(e, dtype=dt), f"pw{k}"))
            n.op_type = "Pow"
            del n.input[1:]
            n.input.append(f"pw{k}")
        nodes.append(n)
    rebuild(g, nodes)


def t_gathertopk(m):
    g, nodes = m.graph, []
    for k, n in enumerate(g.node):
        nodes.append(n)
        if n.op_type != "TopK" or not n.output[0]:
            continue
        ax = next((a.i for a in n.attribute if a.name == "axis"), -1)
        v = n.output[0]
        n.output[0] = v + "__unused"
        if not n.output[1]:
            n.output[1] = f"gtk{k}_i"
        nodes.append(helper.make_node("GatherElements", [n.input[0], n.output[1]], [v], axis=ax, name=f"gtk{k}"))
    rebuild(g, nodes)


def t_argmax(m):
    g, nodes, c = m.graph, [], consts(m.graph)
    for k, n in enumerate(g.node):
        kk = c.get(n.input[1]) if n.op_type == "TopK" else None
        if kk is None or int(np.array(kk).reshape(-1)[0]) != 1:
            nodes.append(n)
            continue
        ax = next((a.i for a in n.attribute if a.name == "axis"), -1)
        largest = next((a.i for a in n.attribute if a.name == "largest"), 1)
        if n.output[1]:
            nodes.append(helper.make_node("ArgMax" if largest else "ArgMin", [n.input[0]], [n.output[1]], axis=ax, keepdims=1, name=f"am{k}"))
        if n.output[0]:
            nodes.append(axes_node(m, "ReduceMax" if largest else "ReduceMin", n.input[0], n.output[0], [ax], f"rm{k}", keepdims=1))
    rebuild(g, nodes)


def t_fusegu(m):
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    by_input = {}
    for n in g.node:
        w = inits.get(n.input[1]) if n.op_type == "MatMul" and len(n.input) == 2 else None
        if w is not None and len(w.dims) == 2:
            by_input.setdefault(n.input[0], []).append(n)
    pairs = {}
    for x, ms in by_input.items():
        if len(ms) == 2 and list(inits[ms[0].input[1]].dims) == list(inits[ms[1].input[1]].dims):
            pairs[id(ms[0])] = ms
    nodes, drop = [], set()
    for k, n in enumerate(g.node):
        if id(n) in drop:
            continue
        ms = pairs.get(id(n))
        if ms is None:
            nodes.append(n)
            continue
        a, b = ms
        wa, wb = numpy_helper.to_array(inits[a.input[1]]), numpy_helper.to_array(inits[b.input[1]])
        w = numpy_helper.from_array(np.concatenate([wa, wb], axis=1), f"fgu{k}_w")
        g.initializer.append(w)
        sizes = [wa.shape[1], wb.shape[1]]
        split = (helper.make_node("Split", [f"fgu{k}_y", _ints(g, f"fgu{k}_s", sizes)], [a.output[0], b.output[0]], axis=-1, name=f"fgu{k}s")
                 if opset(m) >= 13 else
                 helper.make_node("Split", [f"fgu{k}_y"], [a.output[0], b.output[0]], axis=-1, split=sizes, name=f"fgu{k}s"))
        nodes += [helper.make_node("MatMul", [a.input[0], w.name], [f"fgu{k}_y"], name=f"fgu{k}m"), split]
        drop.add(id(b))
    rebuild(g, nodes)


def t_subflip(m):
    g, nodes = m.graph, []
    for k, n in enumerate(g.node):
        if n.op_type == "Sub":
            o = n.output[0]
            n.input[0], n.input[1] = n.input[1], n.input[0]
            n.output[0] = o + "__flip"
            nodes += [n, helper.make_node("Neg", [o + "__flip"], [o], name=f"sf{k}")]
        else:
            nodes.append(n)
    rebuild(g, nodes)


def t_max0(m):
    g, nodes, types = m.graph, [], value_types(m)
    for k, n in enumerate(g.node):
        dt = FLOATS.get(types.get(n.input[0])) if n.op_type == "Relu" else None
        if dt is not None:
            g.initializer.append(numpy_helper.from_array(np.array(0, dtype=dt), f"mx{k}"))
            n.op_type = "Max"
            n.input.append(f"mx{k}")
        nodes.append(n)
    rebuild(g, nodes)


def t_squeeze(m):
    g, nodes = m.graph, []
    for k, n in enumerate(g.node):
        nodes.append(n)
        if n.op_type == "MatMul":
            o = n.output[0]
            n.output[0] = o + "__sq"
            nodes += [axes_node(m, "Unsqueeze", o + "__sq", o + "__u", [0], f"sq{k}a"),
                      axes_node(m, "Squeeze", o + "__u", o, [0], f"sq{k}b")]
    rebuild(g, nodes)


def t_onehot(m):
    g, nodes, c = m.graph, [], consts(m.graph)
    for k, n in enumerate(g.node):
        ax = next((a.i for a in n.attribute if a.name == "axis"), -1)
        if n.op_type != "OneHot" or ax != -1 or n.input[2] not in c:
            nodes.append(n)
            continue
        p, (i, depth, vals) = f"oh{k}", n.input
        nodes += [helper.make_node("Reshape", [depth, _ints(g, p + "_scalar", [])], [p + "_d"], name=p + "a"),
                  helper.make_node("Cast", [p + "_d"], [p + "_d64"], to=TensorProto.INT64, name=p + "b"),
                  helper.make_node("Range", [_ints(g, p + "_zero", 0), p + "_d64", _ints(g, p + "_one", 1)], [p + "_r"], name=p + "c"),
                  axes_node(m, "Unsqueeze", i, p + "_u", [-1], p + "d"),
                  helper.make_node("Cast", [p + "_u"], [p + "_u64"], to=TensorProto.INT64, name=p + "e"),
                  helper.make_node("Equal", [p + "_u64", p + "_r"], [p + "_eq"], name=p + "f"),
                  helper.make_node("Gather", [vals, _ints(g, p + "_on", 1)], [p + "_hi"], axis=0, name=p + "g"),
                  helper.make_node("Gather", [vals, _ints(g, p + "_off", 0)], [p + "_lo"], axis=0, name=p + "h"),
                  helper.make_node("Where", [p + "_eq", p + "_hi", p + "_lo"], [n.output[0]], name=n.name or p + "i")]
    rebuild(g, nodes)


def t_dropout(m):
    after_outputs(m, ("MatMul",), "__pre_dropout", lambda k, pre, o: [helper.make_node("Dropout", [pre], [o], name=f"dr{k}")])


def t_splitgu(m):
    g, nodes, c, ranks = m.graph, [], consts(m.graph), value_ranks(m)
    inits = {t.name: t for t in g.initializer}
    prod = {o: n for n in g.node for o in n.output}
    for k, n in enumerate(g.node):
        mm = prod.get(n.input[0]) if n.op_type == "Split" and n.input else None
        w = inits.get(mm.input[1]) if mm is not None and mm.op_type == "MatMul" else None
        ax = next((a.i for a in n.attribute if a.name == "axis"), 0)
        sizes = next((list(a.ints) for a in n.attribute if a.name == "split"), None)
        if sizes is None and len(n.input) > 1 and n.input[1] in c and c[n.input[1]].dtype.kind in "iu":
            sizes = [int(v) for v in c[n.input[1]].reshape(-1)]
        r = ranks.get(n.input[0]) if n.input else None
        if w is None or len(w.dims) != 2 or len(n.output) != 2 or not sizes or r is None or ax not in (-1, r - 1):
            nodes.append(n)
            continue
        wa = numpy_helper.to_array(w)
        parts = np.split(wa, np.cumsum(sizes)[:-1], axis=1)
        for j, (part, out) in enumerate(zip(parts, n.output)):
            t = numpy_helper.from_array(np.ascontiguousarray(part), f"sgu{k}_w{j}")
            g.initializer.append(t)
            nodes.append(helper.make_node("MatMul", [mm.input[0], t.name], [out], name=f"sgu{k}m{j}"))
    rebuild(g, nodes)


def t_expand(m):
    g, nodes, c, types = m.graph, [], consts(m.graph), value_types(m)
    for k, n in enumerate(g.node):
        sc = [j for j, v in enumerate(n.input[:2]) if v in c and c[v].size == 1] if n.op_type == "Mul" else []
        if len(sc) != 1 or types.get(n.input[1 - sc[0]]) not in FLOATS:
            nodes.append(n)
            continue
        j, p = sc[0], f"ex{k}"
        nodes += [helper.make_node("Shape", [n.input[1 - j]], [p + "_s"], name=p + "a"),
                  helper.make_node("Expand", [n.input[j], p + "_s"], [p + "_e"], name=p + "b")]
        n.input[j] = p + "_e"
        nodes.append(n)
    rebuild(g, nodes)


def t_silu(m):
    g, nodes, types = m.graph, [], value_types(m)
    prod = {o: n for n in g.node for o in n.output}
    cons = {}
    for n in g.node:
        for i in n.input:
            cons.setdefault(i, []).append(n)
    gone = set()
    for k, n in enumerate(g.node):
        if n.op_type != "Mul":
            continue
        for j in (0, 1):
            s, x = prod.get(n.input[j]), n.input[1 - j]
            if s is not None and s.op_type == "Sigmoid" and s.input[0] == x and types.get(x) in FLOATS and len(cons.get(s.output[0], [])) == 1:
                dt = FLOATS[types[x]]
                p = f"silu{k}"
                g.initializer.append(numpy_helper.from_array(np.array(1, dtype=dt), p + "_one"))
                n.op_type = "Div"
                n.input[0], n.input[1] = x, p + "_d"
                gone.add(id(s))
                nodes.append((n, [helper.make_node("Neg", [x], [p + "_n"], name=p + "a"),
                                  helper.make_node("Exp", [p + "_n"], [p + "_e"], name=p + "b"),
                                  helper.make_node("Add", [p + "_one", p + "_e"], [p + "_d"], name=p + "c")]))
                break
    pre = {id(n): extra for n, extra in nodes}
    out = []
    for n in g.node:
        if id(n) in gone:
            continue
        out += pre.get(id(n), []) + [n]
    rebuild(g, out)


def t_powdiv(m):
    g, nodes, types, c = m.graph, [], value_types(m), consts(m.graph)
    for k, n in enumerate(g.node):
        dt = FLOATS.get(types.get(n.input[1])) if n.op_type == "Div" and n.input[1] not in c else None
        if dt is not None:
            g.initializer.append(numpy_helper.from_array(np.array(-1, dtype=dt), f"pd{k}_e"))
            nodes.append(helper.make_node("Pow", [n.input[1], f"pd{k}_e"], [f"pd{k}"], name=f"pdn{k}"))
            n.op_type, n.input[1] = "Mul", f"pd{k}"
        nodes.append(n)
    rebuild(g, nodes)


def t_lse(m):
    g, nodes = m.graph, []
    for k, n in enumerate(g.node):
        if n.op_type != "Softmax" or opset(m) < 13:
            nodes.append(n)
            continue
        ax = next((a.i for a in n.attribute if a.name == "axis"), -1)
        p, x = f"lse{k}", n.input[0]
        nodes += [axes_node(m, "ReduceLogSumExp", x, p + "_l", [ax], p + "a", keepdims=1),
                  helper.make_node("Sub", [x, p + "_l"], [p + "_s"], name=p + "b"),
                  helper.make_node("Exp", [p + "_s"], [n.output[0]], name=p + "c")]
    rebuild(g, nodes)


def t_sorted0(m):
    for n in m.graph.node:
        if n.op_type == "TopK":
            for a in list(n.attribute):
                if a.name == "sorted":
                    n.attribute.remove(a)
            n.attribute.append(helper.make_attribute("sorted", 0))


def t_int32ids(m):
    g, nodes = m.graph, []
    cons = {}
    for n in g.node:
        for j, i in enumerate(n.input):
            cons.setdefault(i, []).append((n, j))
    for k, n in enumerate(g.node):
        nodes.append(n)
        if n.op_type != "TopK" or len(n.output) < 2 or not n.output[1]:
            continue
        users = cons.get(n.output[1], [])
        ok = users and all(u.op_type in ("Gather", "GatherElements") and j == 1 or u.op_type == "OneHot" and j == 0 for u, j in users)
        if not ok or n.output[1] in [o.name for o in g.output]:
            continue
        c = n.output[1] + "__i32"
        nodes.append(helper.make_node("Cast", [n.output[1]], [c], to=TensorProto.INT32, name=f"i32_{k}"))
        for u, j in users:
            u.input[j] = c
    rebuild(g, nodes)


def t_add0(m):
    by_const_after(m, ("MatMul",), "__pre_add0", "Add", 0, "zero", "a0_")


def t_neg2(m):
    after_outputs(m, ("Softmax", "Sigmoid"), "__pre_neg2", lambda k, pre, o: [
        helper.make_node("Neg", [pre], [o + "__neg"], name=f"ng{k}a"), helper.make_node("Neg", [o + "__neg"], [o], name=f"ng{k}b")])


def t_topklogits(m):
    g, nodes = m.graph, []
    prod = {o: n for n in g.node for o in n.output}
    for k, n in enumerate(g.node):
        p = prod.get(n.input[0]) if n.op_type == "TopK" else None
        if p is None or p.op_type not in ("Softmax", "Sigmoid") or len(n.output) < 2 or not n.output[1]:
            nodes.append(n)
            continue
        if p.op_type == "Softmax":
            ax = next((a.i for a in p.attribute if a.name == "axis"), -1)
            tax = next((a.i for a in n.attribute if a.name == "axis"), -1)
            if ax != tax or opset(m) < 13:
                nodes.append(n)
                continue
        q = f"tkl{k}"
        vals = n.output[0]
        n.input[0] = p.input[0]
        if vals:
            n.output[0] = q + "_logit_values"
        nodes.append(n)
        if vals:
            ax = next((a.i for a in n.attribute if a.name == "axis"), -1)
            nodes.append(helper.make_node("GatherElements", [p.output[0], n.output[1]], [vals], name=q + "g", axis=ax))
    rebuild(g, nodes)


def t_clip0(m):
    g, nodes, types = m.graph, [], value_types(m)
    for k, n in enumerate(g.node):
        dt = FLOATS.get(types.get(n.input[0])) if n.op_type == "Relu" and opset(m) >= 11 else None
        if dt is not None:
            g.initializer.append(numpy_helper.from_array(np.array(0, dtype=dt), f"clip0_{k}"))
            n.op_type = "Clip"
            n.input.append(f"clip0_{k}")
        nodes.append(n)
    rebuild(g, nodes)


def t_whererelu(m):
    g, nodes, types = m.graph, [], value_types(m)
    for k, n in enumerate(g.node):
        dt = FLOATS.get(types.get(n.input[0])) if n.op_type == "Relu" else None
        if dt is None:
            nodes.append(n)
            continue
        p = f"wr{k}"
        g.initializer.append(numpy_helper.from_array(np.array(0, dtype=dt), p + "_zero"))
        nodes += [helper.make_node("Greater", [n.input[0], p + "_zero"], [p + "_pos"], name=p + "a"),
                  helper.make_node("Where", [p + "_pos", n.input[0], p + "_zero"], [n.output[0]], name=p + "b")]
    rebuild(g, nodes)


def t_div1(m):
    by_const_after(m, ("Softmax", "Sigmoid", "MatMul"), "__pre_div1", "Div", 1, "one", "d1_")


def t_reassoc(m):
    g, nodes, c = m.graph, [], consts(m.graph)
    prod = {o: n for n in g.node for o in n.output}
    cons = {}
    for n in g.node:
        for i in n.input:
            cons.setdefault(i, []).append(n)
    for k, n in enumerate(g.node):
        sc = [j for j, v in enumerate(n.input[:2]) if v in c and c[v].size == 1] if n.op_type == "Mul" else []
        inner = prod.get(n.input[1 - sc[0]]) if len(sc) == 1 else None
        if inner is None or inner.op_type != "Mul" or len(cons.get(inner.output[0], [])) != 1 or any(v in c for v in inner.input):
            nodes.append(n)
            continue
        p = f"ra{k}"
        nodes += [helper.make_node("Mul", [inner.input[1], n.input[sc[0]]], [p + "_bc"], name=p + "a"),
                  helper.make_node("Mul", [inner.input[0], p + "_bc"], [n.output[0]], name=p + "b")]
    rebuild(g, nodes)


def t_w3d(m):
    g, ranks = m.graph, value_ranks(m)
    inits = {t.name: t for t in g.initializer}
    users = {}
    for n in g.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    for k, n in enumerate(g.node):
        w = inits.get(n.input[1]) if n.op_type == "MatMul" else None
        if w is None or len(w.dims) != 2 or ranks.get(n.input[0]) != 3:
            continue
        a = numpy_helper.to_array(w)[None]
        t = numpy_helper.from_array(np.ascontiguousarray(a), f"w3d{k}_" + w.name)
        g.initializer.append(t)
        n.input[1] = t.name


def t_maskwhere(m):
    g, nodes, types = m.graph, [], value_types(m)
    prod = {o: n for n in g.node for o in n.output}
    for k, n in enumerate(g.node):
        if n.op_type == "Mul":
            for j in (0, 1):
                cst = prod.get(n.input[j])
                a = n.input[1 - j]
                if cst is not None and cst.op_type == "Cast" and types.get(cst.input[0]) == TensorProto.BOOL and types.get(a) in FLOATS:
                    dt = FLOATS[types[a]]
                    z = f"mw{k}_zero"
                    g.initializer.append(numpy_helper.from_array(np.array(0, dtype=dt), z))
                    nodes.append(helper.make_node("Where", [cst.input[0], a, z], [n.output[0]], name=f"mw{k}"))
                    break
            else:
                nodes.append(n)
            continue
        nodes.append(n)
    rebuild(g, nodes)


def t_stackw(m):
    ins = {i.name for i in m.graph.input}
    g, inits = m.graph, {t.name: t for t in m.graph.initializer if t.name not in ins}
    groups = {}
    for n in g.node:
        w = inits.get(n.input[1]) if n.op_type == "MatMul" and len(n.input) > 1 else None
        if w is not None and len(w.dims) == 2:
            names = groups.setdefault((tuple(w.dims), w.data_type), [])
            if w.name not in names:
                names.append(w.name)
    lead, rename = [], {}
    for j, names in enumerate(v for v in groups.values() if len(v) > 1):
        stack = f"stk{j}"
        g.initializer.append(numpy_helper.from_array(np.stack([numpy_helper.to_array(inits[w]) for w in names]), stack))
        for i, w in enumerate(names):
            rename[w] = f"{stack}_{i}"
            lead.append(helper.make_node("Gather", [stack, _ints(g, f"{stack}_i{i}", i)], [rename[w]], axis=0, name=f"{stack}g{i}"))
    if not rename:
        return
    for n in g.node:
        if n.op_type == "MatMul" and n.input[1] in rename:
            n.input[1] = rename[n.input[1]]
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    keep = [t for t in g.initializer if t.name not in rename or t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    rebuild(g, lead + list(g.node))


def t_sigtanh(m):
    g, nodes, types = m.graph, [], value_types(m)
    for k, n in enumerate(g.node):
        dt = FLOATS.get(types.get(n.input[0])) if n.op_type == "Sigmoid" else None
        if dt is None:
            nodes.append(n)
            continue
        p = f"st{k}"
        g.initializer.append(numpy_helper.from_array(np.array(0.5, dtype=dt), p + "_h"))
        g.initializer.append(numpy_helper.from_array(np.array(1, dtype=dt), p + "_one"))
        nodes += [helper.make_node("Mul", [n.input[0], p + "_h"], [p + "_x"], name=p + "a"),
                  helper.make_node("Tanh", [p + "_x"], [p + "_t"], name=p + "b"),
                  helper.make_node("Add", [p + "_t", p + "_one"], [p + "_s"], name=p + "c"),
                  helper.make_node("Mul", [p + "_s", p + "_h"], [n.output[0]], name=n.name or p + "d")]
    rebuild(g, nodes)


def t_gathernd(m):
    g, nodes, ranks, types = m.graph, [], value_ranks(m), value_types(m)
    for k, n in enumerate(g.node):
        axis = [a.i for a in n.attribute if a.name == "axis"]
        if n.op_type == "Gather" and (axis or [0])[0] == 0 and ranks.get(n.input[1]) == 1 and types.get(n.input[1]) == TensorProto.INT64:
            nodes.append(axes_node(m, "Unsqueeze", n.input[1], f"gnd{k}_i", [1], f"gnd{k}u"))
            nodes.append(helper.make_node("GatherND", [n.input[0], f"gnd{k}_i"], [n.output[0]], name=n.name or f"gnd{k}"))
            continue
        nodes.append(n)
    rebuild(g, nodes)


def t_togemm(m):
    g, ranks, inits = m.graph, value_ranks(m), {t.name: t for t in m.graph.initializer}
    for n in g.node:
        w = inits.get(n.input[1]) if n.op_type == "MatMul" else None
        if w is not None and len(w.dims) == 2 and ranks.get(n.input[0]) == 2:
            n.op_type = "Gemm"


def t_flatten(m):
    g, c = m.graph, consts(m.graph)
    inferred = onnx.shape_inference.infer_shapes(m).graph
    dims = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
            for v in list(inferred.value_info) + list(inferred.input) if v.type.tensor_type.HasField("shape")}
    for n in g.node:
        shape = c.get(n.input[1]) if n.op_type == "Reshape" else None
        d = dims.get(n.input[0]) if shape is not None else None
        if d and shape.size == 2 and shape[0] == -1 and d[-1] == shape[1] and len(d) >= 2:
            n.op_type = "Flatten"
            del n.input[1:]
            del n.attribute[:]
            n.attribute.append(helper.make_attribute("axis", len(d) - 1))


def t_notwhere(m):
    g, nodes = m.graph, []
    for k, n in enumerate(g.node):
        if n.op_type == "Where":
            nodes.append(helper.make_node("Not", [n.input[0]], [f"nw{k}"], name=f"nw{k}n"))
            n.input[0], n.input[1], n.input[2] = f"nw{k}", n.input[2], n.input[1]
        nodes.append(n)
    rebuild(g, nodes)


def t_flipcmp(m):
    flip = {"Greater": "Less", "Less": "Greater", "GreaterOrEqual": "LessOrEqual", "LessOrEqual": "GreaterOrEqual"}
    for n in m.graph.node:
        if n.op_type in flip:
            n.op_type = flip[n.op_type]
            n.input[0], n.input[1] = n.input[1], n.input[0]


def t_softmaxt(m):
    g, nodes, ranks = m.graph, [], value_ranks(m)
    if opset(m) < 13:
        return
    for k, n in enumerate(g.node):
        axis = ([a.i for a in n.attribute if a.name == "axis"] or [-1])[0]
        if n.op_type != "Softmax" or ranks.get(n.input[0]) != 2 or axis not in (-1, 1):
            nodes.append(n)
            continue
        p = f"smt{k}"
        nodes += [helper.make_node("Transpose", [n.input[0]], [p + "_t"], perm=[1, 0], name=p + "a"),
                  helper.make_node("Softmax", [p + "_t"], [p + "_s"], axis=0, name=n.name or p + "b"),
                  helper.make_node("Transpose", [p + "_s"], [n.output[0]], perm=[1, 0], name=p + "c")]
    rebuild(g, nodes)


def t_stacksum(m):
    g, nodes = m.graph, []
    inferred = onnx.shape_inference.infer_shapes(m).graph
    types = value_types(m)

    def shape(v):
        return [d.dim_value or d.dim_param or None for d in v.type.tensor_type.shape.dim] if v.type.tensor_type.HasField("shape") else None
    shapes = {v.name: shape(v) for v in list(inferred.value_info) + list(inferred.input)}
    for k, n in enumerate(g.node):
        a, b = (shapes.get(i) for i in n.input[:2]) if n.op_type == "Add" else (None, None)
        if a and a == b and None not in a and types.get(n.output[0]) in FLOATS:
            p = f"ss{k}"
            nodes += [axes_node(m, "Unsqueeze", n.input[0], p + "_a", [0], p + "ua"),
                      axes_node(m, "Unsqueeze", n.input[1], p + "_b", [0], p + "ub"),
                      helper.make_node("Concat", [p + "_a", p + "_b"], [p + "_c"], axis=0, name=p + "c"),
                      axes_node(m, "ReduceSum", p + "_c", n.output[0], [0], n.name or p + "r", keepdims=0)]
            continue
        nodes.append(n)
    rebuild(g, nodes)


def t_scan(m):
    g = m.graph
    x = g.input[0].name
    sl = x + "__slice"
    outs = [o.name for o in g.output]
    body = list(g.node)
    for n in body:
        for j, i in enumerate(n.input):
            if i == x:
                n.input[j] = sl
    xin = copy.deepcopy(g.input[0])
    xin.name = sl
    xin.type.tensor_type.ClearField("shape")
    body_out = []
    for o in g.output:
        v = copy.deepcopy(o)
        v.type.tensor_type.ClearField("shape")
        body_out.append(v)
    scan = helper.make_graph(body, "scan_body", [xin], body_out)
    nodes = [axes_node(m, "Unsqueeze", x, x + "__scan", [0], "scan_in"),
             helper.make_node("Scan", [x + "__scan"], [o + "__scan" for o in outs], body=scan, num_scan_inputs=1, name="wrap_scan")]
    nodes += [axes_node(m, "Squeeze", o + "__scan", o, [0], "sq_" + o) for o in outs]
    rebuild(g, nodes)
    del g.value_info[:]


def t_dynin(m):
    g = m.graph
    inits = {t.name for t in g.initializer}
    for v in list(g.input) + list(g.output):
        if v.name in inits or not v.type.tensor_type.HasField("shape"):
            continue
        for j, d in enumerate(v.type.tensor_type.shape.dim):
            if j < len(v.type.tensor_type.shape.dim) - 1:
                d.dim_param = f"{v.name}_d{j}"
    del g.value_info[:]


def value_dims(m):
    """The dims of every value shape inference declares (None where a dim has no size)."""
    inferred = onnx.shape_inference.infer_shapes(m).graph
    return {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
            for v in list(inferred.value_info) + list(inferred.input) + list(inferred.output) if v.type.tensor_type.HasField("shape")}


def t_rowsplit(m):
    g, nodes, ranks = m.graph, [], value_ranks(m)
    inits = {t.name: t for t in g.initializer}
    if opset(m) < 10:
        return
    for k, n in enumerate(g.node):
        w = inits.get(n.input[1]) if n.op_type == "MatMul" else None
        if w is None or len(w.dims) != 2 or w.dims[0] % 2 or w.dims[0] < 2 or not ranks.get(n.input[0]):
            nodes.append(n)
            continue
        wa, h, p = numpy_helper.to_array(w), w.dims[0] // 2, f"rs{k}"
        for j, (lo, hi) in enumerate(((0, h), (h, 2 * h))):
            g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(wa[lo:hi]), f"{p}_w{j}"))
            nodes += [helper.make_node("Slice", [n.input[0], _ints(g, f"{p}_s{j}", [lo]), _ints(g, f"{p}_e{j}", [hi]), _ints(g, f"{p}_a{j}", [-1])], [f"{p}_x{j}"], name=f"{p}s{j}"),
                      helper.make_node("MatMul", [f"{p}_x{j}", f"{p}_w{j}"], [f"{p}_y{j}"], name=f"{p}m{j}")]
        nodes.append(helper.make_node("Add", [f"{p}_y0", f"{p}_y1"], [n.output[0]], name=n.name or p + "a"))
    rebuild(g, nodes)


def renormalizations(m):
    """The Div(p, ReduceSum(p, last axis, keepdims)) nodes of m whose p is a probability (a
    Softmax or Sigmoid output, or TopK values or a gather of one), with their ReduceSum."""
    g, c, ranks = m.graph, consts(m.graph), value_ranks(m)
    prod = {o: n for n in g.node for o in n.output}

    def prob(v, depth=0):
        n = prod.get(v)
        if n is None or depth > 3:
            return False
        if n.op_type in ("Softmax", "Sigmoid"):
            return True
        return n.op_type in ("TopK", "GatherElements", "Gather") and prob(n.input[0], depth + 1)
    out = []
    for n in g.node:
        r = prod.get(n.input[1]) if n.op_type == "Div" else None
        if r is None or r.op_type != "ReduceSum" or r.input[0] != n.input[0] or not prob(n.input[0]):
            continue
        axes = [list(a.ints) for a in r.attribute if a.name == "axes"] or ([list(c[r.input[1]].reshape(-1))] if len(r.input) > 1 and r.input[1] in c else [])
        keep = ([a.i for a in r.attribute if a.name == "keepdims"] or [1])[0]
        rank = ranks.get(n.input[0])
        if keep and rank and len(axes) == 1 and len(axes[0]) == 1 and axes[0][0] in (-1, rank - 1):
            out.append((n, r))
    return out


def t_lpnorm(m):
    for n, _ in renormalizations(m):
        n.op_type = "LpNormalization"
        del n.input[1:]
        n.attribute.extend([helper.make_attribute("axis", -1), helper.make_attribute("p", 1)])


def t_sumeps(m):
    g, nodes, types = m.graph, [], value_types(m)
    divs = {id(n) for n, _ in renormalizations(m)}
    for k, n in enumerate(g.node):
        dt = FLOATS.get(types.get(n.input[0])) if id(n) in divs else None
        if dt is not None:
            g.initializer.append(numpy_helper.from_array(np.array(1e-20, dtype=dt), f"se{k}_eps"))
            nodes.append(helper.make_node("Add", [n.input[1], f"se{k}_eps"], [f"se{k}_z"], name=f"se{k}a"))
            n.input[1] = f"se{k}_z"
        nodes.append(n)
    rebuild(g, nodes)


def t_meanx(m):
    g, nodes, c, dims, types = m.graph, [], consts(m.graph), value_dims(m), value_types(m)
    for k, n in enumerate(g.node):
        d = dims.get(n.input[0]) if n.op_type == "ReduceSum" else None
        axes = [list(a.ints) for a in n.attribute if a.name == "axes"] or ([list(c[n.input[1]].reshape(-1))] if len(n.input) > 1 and n.input[1] in c else [])
        dt = FLOATS.get(types.get(n.input[0])) if d else None
        if not d or not axes or not axes[0] or dt is None or any(d[a] is None for a in axes[0] if -len(d) <= a < len(d)):
            nodes.append(n)
            continue
        cnt = int(np.prod([d[a] for a in axes[0]]))
        p = f"mx{k}"
        out = n.output[0]
        n.op_type, n.output[0] = "ReduceMean", p + "_m"
        if opset(m) < 18 and len(n.input) > 1:  # ReduceMean takes axes as an input only from opset 18
            del n.input[1:]
            n.attribute.append(helper.make_attribute("axes", axes[0]))
        g.initializer.append(numpy_helper.from_array(np.array(cnt, dtype=dt), p + "_n"))
        nodes += [n, helper.make_node("Mul", [p + "_m", p + "_n"], [out], name=p + "m")]
    rebuild(g, nodes)


def t_finmin(m):
    def fix(t):
        a = numpy_helper.to_array(t)
        if a.dtype in (np.float32, np.float16, np.float64) and np.isneginf(a).any():
            b = np.where(np.isneginf(a), np.finfo(a.dtype).min, a).astype(a.dtype)
            t.CopyFrom(numpy_helper.from_array(b, t.name))
    for t in m.graph.initializer:
        fix(t)
    for n in m.graph.node:
        for a in n.attribute:
            if n.op_type in ("Constant", "ConstantOfShape") and a.name == "value":
                fix(a.t)


def t_seqstack(m):
    g, nodes = m.graph, []
    if opset(m) < 11:
        return
    for k, n in enumerate(g.node):
        if n.op_type != "Concat":
            nodes.append(n)
            continue
        axis = [a.i for a in n.attribute if a.name == "axis"][0]
        nodes += [helper.make_node("SequenceConstruct", list(n.input), [f"sq{k}_s"], name=f"sq{k}c"),
                  helper.make_node("ConcatFromSequence", [f"sq{k}_s"], [n.output[0]], axis=axis, new_axis=0, name=n.name or f"sq{k}")]
    rebuild(g, nodes)


def t_splitseq(m):
    g, nodes, c, dims = m.graph, [], consts(m.graph), value_dims(m)
    if opset(m) < 11:
        return
    for k, n in enumerate(g.node):
        if n.op_type != "Split":
            nodes.append(n)
            continue
        axis = ([a.i for a in n.attribute if a.name == "axis"] or [0])[0]
        sizes = next((list(a.ints) for a in n.attribute if a.name == "split"), None)
        if sizes is None and len(n.input) > 1 and n.input[1] in c:
            sizes = [int(v) for v in c[n.input[1]].reshape(-1)]
        d = dims.get(n.input[0])
        computed = n.input[1] if sizes is None and len(n.input) > 1 and n.input[1] else None
        if sizes is None and not computed and d and d[axis] is not None and d[axis] % len(n.output) == 0:
            sizes = [d[axis] // len(n.output)] * len(n.output)
        if sizes is None and not computed:
            nodes.append(n)
            continue
        p = f"sps{k}"
        nodes.append(helper.make_node("SplitToSequence", [n.input[0], computed or _ints(g, p + "_sizes", sizes)], [p + "_s"], axis=axis, name=n.name or p))
        for j, o in enumerate(n.output):
            nodes.append(helper.make_node("SequenceAt", [p + "_s", _ints(g, f"{p}_i{j}", j)], [o], name=f"{p}a{j}"))
    rebuild(g, nodes)


def t_gslice(m):
    g, nodes, c = m.graph, [], consts(m.graph)
    if opset(m) < 10:
        return
    for k, n in enumerate(g.node):
        i = c.get(n.input[1]) if n.op_type == "Gather" else None
        if i is None or i.ndim != 0 or i < 0:
            nodes.append(n)
            continue
        axis, p = ([a.i for a in n.attribute if a.name == "axis"] or [0])[0], f"gs{k}"
        nodes += [helper.make_node("Slice", [n.input[0], _ints(g, p + "_s", [int(i)]), _ints(g, p + "_e", [int(i) + 1]), _ints(g, p + "_a", [axis])], [p + "_x"], name=p + "s"),
                  axes_node(m, "Squeeze", p + "_x", n.output[0], [axis], n.name or p + "q")]
    rebuild(g, nodes)


def t_slicestep(m):
    g, c = m.graph, consts(m.graph)
    if opset(m) < 10:
        return
    for k, n in enumerate(g.node):
        if n.op_type != "Slice" or len(n.input) >= 5 or n.input[1] not in c:
            continue
        r = c[n.input[1]].size
        while len(n.input) < 4:
            n.input.append("")
        if not n.input[3]:
            n.input[3] = _ints(g, f"ss{k}_axes", list(range(r)))
        n.input.append(_ints(g, f"ss{k}_steps", [1] * r))


def t_absrelu(m):
    g, nodes, types = m.graph, [], value_types(m)
    for k, n in enumerate(g.node):
        dt = FLOATS.get(types.get(n.input[0])) if n.op_type == "Relu" else None
        if dt is None:
            nodes.append(n)
            continue
        p = f"ar{k}"
        g.initializer.append(numpy_helper.from_array(np.array(0.5, dtype=dt), p + "_h"))
        nodes += [helper.make_node("Abs", [n.input[0]], [p + "_a"], name=p + "a"),
                  helper.make_node("Add", [n.input[0], p + "_a"], [p + "_s"], name=p + "b"),
                  helper.make_node("Mul", [p + "_s", p + "_h"], [n.output[0]], name=n.name or p + "c")]
    rebuild(g, nodes)


def t_mulneg(m):
    g, types = m.graph, value_types(m)
    for k, n in enumerate(g.node):
        dt = FLOATS.get(types.get(n.input[0])) if n.op_type == "Neg" else None
        if dt is not None:
            g.initializer.append(numpy_helper.from_array(np.array(-1, dtype=dt), f"mn{k}"))
            n.op_type = "Mul"
            n.input.append(f"mn{k}")


def t_f64soft(m):
    g, nodes, types = m.graph, [], value_types(m)
    for k, n in enumerate(g.node):
        t = types.get(n.input[0]) if n.op_type == "Softmax" else None
        if t not in FLOATS:
            nodes.append(n)
            continue
        p, out = f"fs{k}", n.output[0]
        nodes.append(helper.make_node("Cast", [n.input[0]], [p + "_d"], to=TensorProto.DOUBLE, name=p + "a"))
        n.input[0], n.output[0] = p + "_d", p + "_s"
        nodes += [n, helper.make_node("Cast", [p + "_s"], [out], to=t, name=p + "b")]
    rebuild(g, nodes)


TRANSFORMS = {name[2:]: f for name, f in sorted(globals().items()) if name.startswith("t_")}


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, src, names = sys.argv[1], sys.argv[2], sys.argv[3:] or list(TRANSFORMS)
    m0 = onnx.load(src)
    base = os.path.basename(src)[:-len(".onnx")]
    data = os.path.join(os.path.dirname(src), base + "_data")
    os.makedirs(out, exist_ok=True)
    for name in names:
        m = copy.deepcopy(m0)
        TRANSFORMS[name](m)
        dst = os.path.join(out, f"{base}__{name}")
        onnx.save(m, dst + ".onnx")
        if os.path.isdir(data):
            shutil.rmtree(dst + "_data", ignore_errors=True)
            shutil.copytree(data, dst + "_data")


if __name__ == "__main__":
    main()
