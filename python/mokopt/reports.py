"""Report objects built from the JSON documents of ``mokopt ... --json``.

Each class mirrors one document of docs/json.md (and docs/diff-schema.md for
``diff``). Fields named there are attributes; ``raw`` keeps the whole decoded
document, so a field added by a newer mokopt is still reachable. JSON's
``"NaN"``, ``"Inf"`` and ``"-Inf"`` strings come back as Python floats.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Type, TypeVar

__all__ = [
    "Reason",
    "Opset",
    "OpCount",
    "ValueInfo",
    "ModelSummary",
    "Spec",
    "Block",
    "NearMiss",
    "MoESummary",
    "InspectReport",
    "Fused",
    "RewriteReport",
    "Violation",
    "LoweredBlock",
    "LowerReport",
    "TensorInfo",
    "OutputComparison",
    "Case",
    "VerifyReport",
    "DiffReport",
]

T = TypeVar("T")

_SPECIAL = {"NaN": math.nan, "Inf": math.inf, "-Inf": -math.inf}


def _num(v: Any) -> Any:
    """A JSON number, with mokopt's strings for NaN and infinities decoded."""
    if isinstance(v, str) and v in _SPECIAL:
        return _SPECIAL[v]
    return v


def _list(v: Any) -> List[Any]:
    """mokopt writes an empty list as null in some documents: both become []."""
    return list(v) if v else []


def _build(cls: Type[T], d: Mapping[str, Any], **convert: Any) -> T:
    """Builds dataclass cls from d: known keys become fields (through
    convert[key] where given), the rest go to the ``extra`` dict."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kw: Dict[str, Any] = {}
    extra: Dict[str, Any] = {}
    for k, v in d.items():
        key = _RENAME.get(k, k)
        if key in names and key != "extra":
            kw[key] = convert[key](v) if key in convert else _num(v)
        else:
            extra[k] = v
    if "extra" in names:
        kw["extra"] = extra
    return cls(**kw)


# JSON keys that are Python keywords or would shadow builtins.
_RENAME = {"class": "class_", "pass": "passed"}


@dataclass
class Reason:
    """Why mokopt refused a block: the block's node and mokopt's cause."""

    block: str
    cause: str

    def __str__(self) -> str:
        return f"{self.block}: {self.cause}"


@dataclass
class Opset:
    """One ``opset_import`` entry."""

    domain: str = ""
    version: int = 0


@dataclass
class OpCount:
    """One row of the op census: an op (``domain::Op`` outside ai.onnx) and its count."""

    op: str = ""
    count: int = 0


@dataclass
class ValueInfo:
    """A graph input or output: its name, element type and dims (numbers or symbolic names, as strings)."""

    name: str = ""
    type: str = ""
    shape: List[str] = field(default_factory=list)


@dataclass
class ModelSummary:
    """``inspect --json``'s ``model``: the model's header, census and I/O."""

    file: str = ""
    ir_version: int = 0
    producer: str = ""
    opsets: List[Opset] = field(default_factory=list)
    nodes: int = 0
    functions: int = 0
    ops: List[OpCount] = field(default_factory=list)
    initializers: int = 0
    initializer_bytes: int = 0
    external_bytes: int = 0
    inputs: List[ValueInfo] = field(default_factory=list)
    outputs: List[ValueInfo] = field(default_factory=list)
    extra: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ModelSummary":
        """Builds it from the decoded JSON object."""
        return _build(
            cls,
            d,
            opsets=lambda v: [_build(Opset, o) for o in _list(v)],
            ops=lambda v: [_build(OpCount, o) for o in _list(v)],
            inputs=lambda v: [_build(ValueInfo, o) for o in _list(v)],
            outputs=lambda v: [_build(ValueInfo, o) for o in _list(v)],
        )

    def op_count(self, op: str) -> int:
        """The census count of op (``"MatMul"``, ``"ai.mok::MoE"``), 0 when absent."""
        return sum(o.count for o in self.ops if o.op == op)


@dataclass
class Spec:
    """A block's semantics: the fused node's attributes (docs/fused-op.md).

    The common fields are attributes; the rest (``group_score``,
    ``sparsemixer_threshold``, ``io_type``, ...) are in ``extra``.
    """

    num_experts: int = 0
    top_k: int = 0
    hidden: int = 0
    inter: int = 0
    router_activation: str = ""
    router_order: str = ""
    normalize_topk: bool = False
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    weights_on_input: bool = False
    router_bias: bool = False
    correction_bias: bool = False
    activation: str = ""
    swiglu_alpha: float = 1.0
    swiglu_limit: float = 0.0
    gate_up_interleaved: bool = False
    expert_bias: bool = False
    shared_inter: int = 0
    shared_expert_gated: bool = False
    ep_size: int = 1
    expert_offset: int = 0
    extra: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Optional[Mapping[str, Any]]) -> "Spec":
        """Builds it from the decoded JSON object (an empty Spec for null)."""
        return _build(cls, d or {})


@dataclass
class Block:
    """An MoE block found in the model: where it is, its shape kind and its semantics."""

    name: str = ""
    kind: str = ""
    input: str = ""
    output: str = ""
    nodes: int = 0
    spec: Spec = field(default_factory=Spec)
    router_logits: str = ""
    scope: str = ""
    extra: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Block":
        """Builds it from the decoded JSON object."""
        return _build(cls, d, spec=Spec.from_json)


@dataclass
class NearMiss:
    """A candidate mokopt did not fuse, with the reason (``class_`` and
    ``capacity`` where mokopt classifies it, e.g. ``capacity_limited``)."""

    node: str = ""
    reason: str = ""
    class_: str = ""
    capacity: List[int] = field(default_factory=list)
    scope: str = ""
    extra: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "NearMiss":
        """Builds it from the decoded JSON object."""
        return _build(cls, d, capacity=_list)

    def as_reason(self) -> Reason:
        """The near-miss as a Reason (block, cause)."""
        return Reason(self.node, self.reason)


@dataclass
class MoESummary:
    """``inspect --json``'s ``moe``: the blocks found and the near-misses."""

    blocks: List[Block] = field(default_factory=list)
    near_misses: List[NearMiss] = field(default_factory=list)
    extra: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "MoESummary":
        """Builds it from the decoded JSON object."""
        return _build(
            cls,
            d,
            blocks=lambda v: [Block.from_json(b) for b in _list(v)],
            near_misses=lambda v: [NearMiss.from_json(n) for n in _list(v)],
        )


@dataclass
class InspectReport:
    """The document of ``mokopt inspect --json``."""

    model: ModelSummary
    moe: MoESummary
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "InspectReport":
        """Builds it from the decoded JSON document."""
        return cls(ModelSummary.from_json(d.get("model") or {}), MoESummary.from_json(d.get("moe") or {}), dict(d))


@dataclass
class Fused:
    """One fused block: the block, the ``ai.mok::MoE`` node that replaced it, its variant."""

    block: Block = field(default_factory=Block)
    node: str = ""
    variant: str = ""
    overload: str = ""
    nodes_removed: int = 0
    initializers_removed: int = 0
    extra: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Fused":
        """Builds it from the decoded JSON object."""
        return _build(cls, d, block=Block.from_json)


@dataclass
class RewriteReport:
    """The document of ``mokopt rewrite --json`` / ``--report``."""

    input: str = ""
    output: Optional[str] = None
    fused: List[Fused] = field(default_factory=list)
    near_misses: List[NearMiss] = field(default_factory=list)
    refused: List[NearMiss] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RewriteReport":
        """Builds it from the decoded JSON document."""
        r = d.get("report") or {}
        return cls(
            input=d.get("input") or "",
            output=d.get("output"),
            fused=[Fused.from_json(f) for f in _list(r.get("fused"))],
            near_misses=[NearMiss.from_json(n) for n in _list(r.get("near_misses"))],
            refused=[NearMiss.from_json(n) for n in _list(r.get("refused"))],
            warnings=[str(w) for w in _list(r.get("warnings"))],
            raw=dict(d),
        )

    def reasons(self) -> List[Reason]:
        """Every block not fused, refused ones first, each with mokopt's cause."""
        return [n.as_reason() for n in self.refused + self.near_misses]


@dataclass
class Violation:
    """A violated kernel constraint, numbered as in docs/kernel.md."""

    number: int = 0
    code: str = ""
    severity: str = ""
    message: str = ""
    constraint: str = ""
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class LoweredBlock:
    """One fused node in ``lower --json``: lowered or not, and why."""

    node: str = ""
    spec: Spec = field(default_factory=Spec)
    lowered: bool = False
    kernel_node: str = ""
    shared_expert: Any = None
    violations: List[Violation] = field(default_factory=list)
    reason: str = ""
    extra: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "LoweredBlock":
        """Builds it from the decoded JSON object."""
        return _build(cls, d, spec=Spec.from_json, violations=lambda v: [_build(Violation, x) for x in _list(v)])

    @property
    def errors(self) -> List[Violation]:
        """The violations of severity "error" (those that keep the node unlowered)."""
        return [v for v in self.violations if v.severity == "error"]


@dataclass
class LowerReport:
    """The document of ``mokopt lower --json``."""

    input: str = ""
    output: Optional[str] = None
    target: str = ""
    ep: int = 0
    tokens_per_rank: int = 0
    strict: bool = False
    blocks: List[LoweredBlock] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    plan: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "LowerReport":
        """Builds it from the decoded JSON document."""
        r = d.get("report") or {}
        return cls(
            input=d.get("input") or "",
            output=d.get("output"),
            target=r.get("target") or "",
            ep=r.get("ep") or 0,
            tokens_per_rank=r.get("tokens_per_rank") or 0,
            strict=bool(r.get("strict")),
            blocks=[LoweredBlock.from_json(b) for b in _list(r.get("blocks"))],
            notes=[str(n) for n in _list(r.get("notes"))],
            plan=r.get("plan"),
            raw=dict(d),
        )

    def reasons(self) -> List[Reason]:
        """Every fused node left unlowered, with mokopt's reason."""
        return [Reason(b.node, b.reason) for b in self.blocks if not b.lowered]


@dataclass
class TensorInfo:
    """An input of a verify case: name, element type and shape."""

    name: str = ""
    dtype: str = ""
    shape: List[int] = field(default_factory=list)
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class OutputComparison:
    """One output compared by ``verify``/``run``: errors, worst element and verdict."""

    index: int = 0
    name_a: str = ""
    name_b: str = ""
    dtype_a: str = ""
    dtype_b: str = ""
    shape_a: List[int] = field(default_factory=list)
    shape_b: List[int] = field(default_factory=list)
    elements: int = 0
    mismatches: int = 0
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    max_abs_ref: float = 0.0
    worst_index: int = 0
    worst_multi_index: List[int] = field(default_factory=list)
    worst_a: float = 0.0
    worst_b: float = 0.0
    passed: bool = False
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Case:
    """One input case of ``verify``/``run`` (random inputs at one token count, or a data set)."""

    name: str = ""
    tokens: Any = None
    inputs: List[TensorInfo] = field(default_factory=list)
    passed: bool = False
    message: str = ""
    outputs: List[OutputComparison] = field(default_factory=list)
    extra: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Case":
        """Builds it from the decoded JSON object."""
        return _build(
            cls,
            d,
            inputs=lambda v: [_build(TensorInfo, x) for x in _list(v)],
            outputs=lambda v: [_build(OutputComparison, x) for x in _list(v)],
        )


@dataclass
class VerifyReport:
    """The document of ``mokopt verify --json`` (and ``run --json``)."""

    model_a: str = ""
    model_b: str = ""
    reference: str = ""
    inputs: str = ""
    engine: str = ""
    seed: int = 0
    rtol: float = 0.0
    atol: float = 0.0
    passed: bool = False
    notes: List[str] = field(default_factory=list)
    cases: List[Case] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "VerifyReport":
        """Builds it from the decoded JSON document."""
        r = _build(cls, d, notes=_list, cases=lambda v: [Case.from_json(c) for c in _list(v)])
        r.raw = dict(d)
        return r

    def mismatches(self) -> List[OutputComparison]:
        """Every output that failed, over all cases."""
        return [o for c in self.cases for o in c.outputs if not o.passed]

    def reasons(self) -> List[Reason]:
        """One Reason per failed output (block: case/output name) or failed case."""
        out = []
        for c in self.cases:
            bad = [o for o in c.outputs if not o.passed]
            for o in bad:
                out.append(
                    Reason(
                        f"{c.name} output {o.index} {o.name_a}",
                        f"{o.mismatches} of {o.elements} elements off, max abs err {o.max_abs_err:.3g}, "
                        f"max rel err {o.max_rel_err:.3g}, worst at {o.worst_multi_index} ({o.worst_a} vs {o.worst_b})",
                    )
                )
            if not c.passed and not bad:
                out.append(Reason(c.name, c.message or "case failed"))
        return out


@dataclass
class DiffReport:
    """The document of ``mokopt diff --format json`` (docs/diff-schema.md).

    ``same`` is False when the models differ (the command's exit 1, which is
    no error here). ``summary``, ``fused_regions`` and the other lists are
    kept as decoded JSON.
    """

    a: Dict[str, Any] = field(default_factory=dict)
    b: Dict[str, Any] = field(default_factory=dict)
    summary: Dict[str, Any] = field(default_factory=dict)
    fused_regions: List[Dict[str, Any]] = field(default_factory=list)
    nodes: Dict[str, Any] = field(default_factory=dict)
    initializers: Dict[str, Any] = field(default_factory=dict)
    warnings: List[str] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "DiffReport":
        """Builds it from the decoded JSON document."""
        return cls(
            a=d.get("a") or {},
            b=d.get("b") or {},
            summary=d.get("summary") or {},
            fused_regions=_list(d.get("fused_regions")),
            nodes=d.get("nodes") or {},
            initializers=d.get("initializers") or {},
            warnings=_list(d.get("warnings")),
            raw=dict(d),
        )

    @property
    def same(self) -> bool:
        """True when mokopt found no difference."""
        return bool(self.summary.get("same"))

    @property
    def line(self) -> str:
        """The one-line summary mokopt prints."""
        return str(self.summary.get("line", ""))
