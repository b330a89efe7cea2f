"""mokopt's commands as Python functions over onnx.ModelProto or paths."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Iterator, List, Mapping, Optional, Sequence, TypeVar, Union

import onnx
from onnx import numpy_helper

from ._cli import ModelLike, PathLike, graph_io, model_arg, run_cli
from .errors import CheckFailed, FusionRefused, LoweringRefused, VerifyMismatch
from .reports import DiffReport, InspectReport, LowerReport, RewriteReport, VerifyReport

__all__ = ["Result", "rewrite", "lower", "verify", "diff", "inspect", "version"]

R = TypeVar("R")

# Inputs or outputs given as arrays: a mapping name -> array, or a sequence in
# the graph's order. Arrays are numpy arrays (anything numpy.asarray takes).
Tensors = Union[Mapping[str, Any], Sequence[Any]]


@dataclass
class Result(Generic[R]):
    """A rewritten or lowered model with its report.

    ``model`` is the output model. Without ``output=`` it is loaded whole
    (weights included) from a temporary folder that is then removed; with
    ``output=PATH`` it is loaded from PATH without its external data, so a
    model of any size stays on disk: its external tensors refer to files
    beside ``path`` (``onnx.load(result.path)`` loads them). Unpacks as
    ``model, report = mokopt.rewrite(...)``.
    """

    model: onnx.ModelProto
    report: R
    path: Optional[str] = None

    def __iter__(self) -> Iterator[Any]:
        yield self.model
        yield self.report


def _opt(args: List[str], flag: str, value: Any) -> None:
    """Appends ``flag value`` when value is not None (``flag`` alone for True)."""
    if value is None or value is False:
        return
    if value is True:
        args.append(flag)
    elif isinstance(value, (list, tuple)):
        args += [flag, ",".join(str(v) for v in value)]
    else:
        args += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]


def _write_tensors(values: Tensors, names: Sequence[str], folder: Path, prefix: str) -> None:
    """Writes values as ``PREFIX_N.pb`` files in folder, in the order of names
    (a mapping must hold every name; a sequence is taken in order)."""
    import numpy as np  # onnx depends on numpy

    if isinstance(values, Mapping):
        missing = [n for n in names if n not in values]
        extra = [n for n in values if n not in names]
        if missing or extra:
            raise ValueError(f"{prefix}s: the model's are {list(names)}; missing {missing}, unknown {extra}")
        seq = [(n, values[n]) for n in names]
    else:
        vals = list(values)
        if len(vals) != len(names):
            raise ValueError(f"{prefix}s: {len(vals)} given, the model has {len(names)} ({list(names)})")
        seq = list(zip(names, vals))
    folder.mkdir(parents=True, exist_ok=True)
    for i, (name, v) in enumerate(seq):
        t = numpy_helper.from_array(np.asarray(v), name)
        (folder / f"{prefix}_{i}.pb").write_bytes(t.SerializeToString())


def _data_arg(inputs: Union[Tensors, PathLike], model: ModelLike, tmp: Path, expected: Optional[Tensors] = None) -> str:
    """The test data folder mokopt reads: inputs itself when it is a path,
    else a folder in tmp with inputs (and expected outputs) written out."""
    if isinstance(inputs, (str, os.PathLike)):
        if expected is not None:
            raise ValueError("expected= needs inputs as arrays, not a data folder (whose output_N.pb are the expected outputs)")
        return os.fspath(inputs)
    ins, outs = graph_io(model)
    d = tmp / "test_data_set_0"
    _write_tensors(inputs, ins, d, "input")
    if expected is not None:
        _write_tensors(expected, outs, d, "output")
    return str(d)


def _load(path: str, whole: bool) -> onnx.ModelProto:
    return onnx.load(path, load_external_data=whole)


def rewrite(
    model: ModelLike,
    *,
    output: Optional[PathLike] = None,
    check: bool = True,
    partial: bool = False,
    check_inputs: Optional[Union[Tensors, PathLike]] = None,
    restore_traced_experts: bool = False,
    external_data: Optional[str] = None,
    mem_limit: Optional[str] = None,
    binary: Optional[PathLike] = None,
) -> Result[RewriteReport]:
    """Fuses every MoE block of model into one ``ai.mok::MoE`` node (``mokopt rewrite``).

    Args:
        model: an ``onnx.ModelProto`` or the path of an ``.onnx`` file.
        output: where to write the fused model; the result is then path-backed
            (see :class:`Result`). Default: a temporary file, loaded whole.
        check: run the numerical check of each block (``check=False`` is
            ``--no-check``).
        partial: fuse the blocks that pass and report the rest (``--partial``)
            instead of refusing the model.
        check_inputs: run the check on these inputs instead of random ones:
            arrays (a mapping by input name, or a sequence in the graph's
            order) or an ONNX test data folder (``--check-data``).
        restore_traced_experts: ``--restore-traced-experts``.
        external_data: ``"keep"``, ``"repack"`` or ``"inline"`` (``--external-data``).
        mem_limit: the interpreter's memory budget, e.g. ``"4GiB"`` (``--mem-limit``).
        binary: the mokopt binary to run (default: see :func:`find_binary`).

    Returns:
        ``Result(model, report, path)``; ``report.fused`` lists each fused block.

    Raises:
        FusionRefused: a block failed its check or a candidate could not be
            fused; ``.reasons`` lists (block, cause), ``.report`` the whole report.
        UsageError: the model cannot be read, or an argument is bad.
    """
    with tempfile.TemporaryDirectory(prefix="mokopt-") as td:
        tmp = Path(td)
        src = model_arg(model, tmp, "input.onnx")
        out = os.fspath(output) if output is not None else str(tmp / "output.onnx")
        rep = str(tmp / "report.json")
        args = ["rewrite", src, "-o", out, "--report", rep]
        _opt(args, "--no-check", not check)
        _opt(args, "--partial", partial)
        if check_inputs is not None:
            args += ["--check-data", _data_arg(check_inputs, model, tmp)]
        _opt(args, "--restore-traced-experts", restore_traced_experts)
        _opt(args, "--external-data", external_data)
        _opt(args, "--mem-limit", mem_limit)
        c = run_cli(args, binary, ok=(0, 1))
        report = RewriteReport.from_json(json.loads(Path(rep).read_text())) if os.path.exists(rep) else None
        if c.returncode == 1:
            raise c.fail(FusionRefused, report=report, reasons=report.reasons() if report else None)
        assert report is not None, "mokopt rewrite succeeded without writing its report"
        m = _load(out, output is None)
    return Result(m, report, out if output is not None else None)


def lower(
    model: ModelLike,
    *,
    target: str,
    output: Optional[PathLike] = None,
    ep: Optional[int] = None,
    tokens_per_rank: Optional[int] = None,
    partial: bool = False,
    strict: bool = False,
    quant: Optional[str] = None,
    block_size: Optional[int] = None,
    plan: Optional[PathLike] = None,
    external_data: Optional[str] = None,
    binary: Optional[PathLike] = None,
) -> Result[LowerReport]:
    """Lowers the fused ``ai.mok::MoE`` nodes of model (``mokopt lower``).

    Args:
        model: a fused model (``onnx.ModelProto`` or path), e.g. ``rewrite``'s.
        target: ``"ort"`` (ONNX Runtime's ``com.microsoft::MoE``/``QMoE``),
            ``"gb300-nvl72"`` or ``"gb200-nvl72"`` (the MoK kernel).
        output: where to write the lowered model (see :class:`Result`).
        ep: the expert-parallel group size (MoK targets; ``--ep``).
        tokens_per_rank: static tokens per rank (``--tokens-per-rank``).
        partial: keep nodes the target cannot take as ``ai.mok::MoE``.
        strict: also refuse a shared expert the kernel would leave outside.
        quant: ``"int8"`` or ``"int4"`` expert weights (``target="ort"``).
        block_size: block-wise quantization scales over N inputs.
        plan: also write the launch plan JSON there (``--plan``).
        external_data: ``"keep"``, ``"repack"`` or ``"inline"``.
        binary: the mokopt binary to run.

    Returns:
        ``Result(model, report, path)``; ``report.blocks`` says per fused node
        whether it was lowered, with the violated kernel constraints.

    Raises:
        LoweringRefused: a node the target cannot take (without partial);
            ``.reasons`` lists (node, reason), ``.report.blocks`` the violations.
        UsageError: unreadable model or a bad argument.
    """
    with tempfile.TemporaryDirectory(prefix="mokopt-") as td:
        tmp = Path(td)
        src = model_arg(model, tmp, "input.onnx")
        out = os.fspath(output) if output is not None else str(tmp / "output.onnx")
        args = ["lower", src, "-o", out, "--target", target, "--json"]
        _opt(args, "--ep", ep)
        _opt(args, "--tokens-per-rank", tokens_per_rank)
        _opt(args, "--partial", partial)
        _opt(args, "--strict", strict)
        _opt(args, "--quant", quant)
        _opt(args, "--block-size", block_size)
        _opt(args, "--plan", plan)
        _opt(args, "--external-data", external_data)
        c = run_cli(args, binary, ok=(0, 1))
        doc = c.json()
        report = LowerReport.from_json(doc) if doc else None
        if c.returncode == 1:
            raise c.fail(LoweringRefused, report=report, reasons=report.reasons() if report else None)
        if report is None:
            raise c.fail(CheckFailed)
        m = _load(out, output is None)
    return Result(m, report, out if output is not None else None)


def verify(
    a: ModelLike,
    b: Optional[ModelLike] = None,
    *,
    inputs: Optional[Union[Tensors, PathLike]] = None,
    expected: Optional[Tensors] = None,
    tokens: Optional[Sequence[int]] = None,
    seed: Optional[int] = None,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    elementwise: bool = False,
    quant_bound: Optional[float] = None,
    engine: Optional[str] = None,
    mem_limit: Optional[str] = None,
    check: bool = True,
    binary: Optional[PathLike] = None,
) -> VerifyReport:
    """Runs two models on the same inputs and compares every output (``mokopt verify``),
    or one model against expected outputs (``mokopt run``).

    Args:
        a: a model (``onnx.ModelProto`` or path).
        b: the model to compare with; leave it out to compare a with ``expected``.
        inputs: the inputs: arrays (a mapping by input name or a sequence in
            the graph's order) or an ONNX test data folder (``--data``); default
            random inputs at ``tokens`` token counts.
        expected: a's expected outputs (a mapping by output name or a sequence),
            e.g. ONNX Runtime's on the same inputs; needs ``inputs`` as arrays.
        tokens, seed: random inputs' token counts and seed.
        rtol, atol, elementwise, quant_bound: the comparison (docs/numerical-check.md).
        engine: ``"ref"`` (mokopt's interpreter) or ``"ort"`` (binaries built with ``-tags ort``).
        mem_limit: the interpreter's memory budget, e.g. ``"4GiB"``.
        check: raise VerifyMismatch on a mismatch (``check=False`` returns the report).
        binary: the mokopt binary to run.

    Returns:
        The VerifyReport; ``report.passed`` is the verdict.

    Raises:
        VerifyMismatch: outputs differ (when check); ``.reasons`` names each
            failed output, ``.report`` holds every comparison.
        UsageError: a model or the data cannot be read, or they do not fit.
    """
    if (b is None) == (expected is None):
        raise ValueError("verify: give either b (a second model) or expected (a's expected outputs)")
    with tempfile.TemporaryDirectory(prefix="mokopt-") as td:
        tmp = Path(td)
        pa = model_arg(a, tmp, "a.onnx")
        if b is None:
            if inputs is None:
                raise ValueError("verify: expected= needs inputs=")
            args = ["run", pa, "--data", _data_arg(inputs, a, tmp, expected)]
        else:
            args = ["verify", pa, model_arg(b, tmp, "b.onnx")]
            if inputs is not None:
                args += ["--data", _data_arg(inputs, a, tmp)]
            _opt(args, "--tokens", tokens)
            _opt(args, "--seed", seed)
            _opt(args, "--engine", engine)
        _opt(args, "--rtol", rtol)
        _opt(args, "--atol", atol)
        _opt(args, "--elementwise", elementwise)
        _opt(args, "--quant-bound", quant_bound)
        _opt(args, "--mem-limit", mem_limit)
        args.append("--json")
        c = run_cli(args, binary, ok=(0, 1))
    doc = c.json()
    if doc is None:
        raise c.fail(CheckFailed)
    report = VerifyReport.from_json(doc)
    if c.returncode == 1 and check:
        raise c.fail(VerifyMismatch, report=report, reasons=report.reasons())
    return report


def diff(a: ModelLike, b: ModelLike, *, binary: Optional[PathLike] = None) -> DiffReport:
    """Compares two models structurally (``mokopt diff --format json``).

    Differences are no error: ``report.same`` is False and
    ``report.fused_regions`` lists each fused node of b with the region of a
    it replaced.

    Raises:
        UsageError: a model cannot be read.
    """
    with tempfile.TemporaryDirectory(prefix="mokopt-") as td:
        tmp = Path(td)
        c = run_cli(["diff", model_arg(a, tmp, "a.onnx"), model_arg(b, tmp, "b.onnx"), "--format", "json"], binary, ok=(0, 1))
    doc = c.json()
    if doc is None:
        raise c.fail(CheckFailed)
    return DiffReport.from_json(doc)


def inspect(model: ModelLike, *, ep_ops: Optional[PathLike] = None, binary: Optional[PathLike] = None) -> InspectReport:
    """Summarises model and lists every MoE block found (``mokopt inspect --json``).

    External data is not read. ``ep_ops`` is a JSON table of EP collective ops
    (``--ep-ops``).

    Raises:
        UsageError: the model cannot be read.
    """
    with tempfile.TemporaryDirectory(prefix="mokopt-") as td:
        args = ["inspect", model_arg(model, Path(td), "model.onnx"), "--json"]
        _opt(args, "--ep-ops", ep_ops)
        c = run_cli(args, binary)
    doc = c.json()
    if doc is None:
        raise c.fail(CheckFailed)
    return InspectReport.from_json(doc)


def version(*, binary: Optional[PathLike] = None) -> str:
    """The mokopt binary's version (``mokopt version --json``)."""
    doc = run_cli(["version", "--json"], binary).json() or {}
    return str(doc.get("version", ""))
