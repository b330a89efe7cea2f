"""Tests of the mokopt Python package against the binary of this checkout.

Numbers are compared with an independent truth where there is one: ONNX
Runtime's outputs stored beside the bundled export (output_0.pb), and the
onnx package's own reading of the models.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from conftest import CAPACITY, EXAMPLE, EXAMPLE_DATA

import mokopt
from mokopt import _cli


def ort_golden():
    """The bundled export's input and ONNX Runtime's output for it."""
    x = numpy_helper.to_array(onnx.load_tensor(str(EXAMPLE_DATA / "input_0.pb")))
    y = numpy_helper.to_array(onnx.load_tensor(str(EXAMPLE_DATA / "output_0.pb")))
    return x, y


def moe_nodes(m: onnx.ModelProto, domain: str = "ai.mok"):
    return [n for n in m.graph.node if n.op_type == "MoE" and n.domain == domain]


def attrs(n: onnx.NodeProto):
    return {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}


@pytest.mark.parametrize("as_proto", [True, False], ids=["ModelProto", "path"])
def test_rewrite(as_proto: bool, tmp_path: Path) -> None:
    src = onnx.load(str(EXAMPLE)) if as_proto else EXAMPLE
    fused, report = mokopt.rewrite(src)
    assert isinstance(fused, onnx.ModelProto)
    (node,) = moe_nodes(fused)
    assert [f.node for f in report.fused] == [node.name]
    f = report.fused[0]
    a = attrs(node)
    # The report's spec is the fused node's attributes.
    assert (f.block.spec.num_experts, f.block.spec.top_k) == (a["num_experts"], a["top_k"])
    assert f.block.spec.activation == a["activation"].decode()
    assert f.nodes_removed == len(onnx.load(str(EXAMPLE)).graph.node) - len(fused.graph.node) + 1
    assert report.refused == [] and report.near_misses == []
    # The fused model reproduces ONNX Runtime's output of the export.
    x, y = ort_golden()
    rep = mokopt.verify(fused, inputs={"hidden_states": x}, expected=[y])
    assert rep.passed and rep.cases[0].outputs[0].elements == y.size
    assert rep.cases[0].outputs[0].max_abs_err < 1e-5


def test_rewrite_leaves_the_proto_alone() -> None:
    m = onnx.load(str(EXAMPLE))
    before = m.SerializeToString()
    mokopt.rewrite(m)
    assert m.SerializeToString() == before


def test_rewrite_output_path(tmp_path: Path) -> None:
    out = tmp_path / "fused.onnx"
    r = mokopt.rewrite(str(EXAMPLE), output=out)
    assert r.path == str(out) and out.exists()
    assert r.report.output == str(out)
    assert len(moe_nodes(r.model)) == 1
    assert onnx.load(str(out)).SerializeToString() == r.model.SerializeToString()


def test_refusal_raises_with_reasons(tmp_path: Path) -> None:
    out = tmp_path / "never.onnx"
    with pytest.raises(mokopt.FusionRefused) as ei:
        mokopt.rewrite(CAPACITY, output=out)
    e = ei.value
    assert e.returncode == 1 and not out.exists()
    # The reasons are inspect's near-misses: the same block, the same cause.
    nm = mokopt.inspect(CAPACITY).moe.near_misses
    assert [(r.block, r.cause) for r in e.reasons] == [(n.node, n.reason) for n in nm]
    assert "expert_capacity 5" in e.reasons[0].cause
    assert e.report is not None and e.report.near_misses[0].class_ == "capacity_limited"
    assert e.report.near_misses[0].capacity == [5]
    assert "no output written" in str(e)
    assert isinstance(e, mokopt.CheckFailed) and isinstance(e, mokopt.MokoptError)


def test_partial_rewrite_reports_instead_of_raising() -> None:
    m, report = mokopt.rewrite(CAPACITY, partial=True)
    assert report.fused == [] and [n.class_ for n in report.near_misses] == ["capacity_limited"]
    assert len(m.graph.node) == len(onnx.load(str(CAPACITY)).graph.node)


def test_usage_error_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    with pytest.raises(mokopt.UsageError) as ei:
        mokopt.rewrite(missing)
    assert ei.value.returncode == 2 and str(missing) in str(ei.value)
    with pytest.raises(mokopt.UsageError):
        mokopt.lower(EXAMPLE, target="no-such-target")


@pytest.mark.parametrize("as_proto", [True, False], ids=["ModelProto", "path"])
def test_verify_mismatch_raises(as_proto: bool, tmp_path: Path) -> None:
    fused, _ = mokopt.rewrite(EXAMPLE)
    # Scale the largest initializer (an expert weight): outputs must differ.
    t = max(fused.graph.initializer, key=lambda t: len(t.raw_data))
    w = numpy_helper.to_array(t) * 1.5
    t.CopyFrom(numpy_helper.from_array(w.astype(np.float32), t.name))
    b = fused
    if not as_proto:
        b = tmp_path / "broken.onnx"
        onnx.save(fused, str(b))
    with pytest.raises(mokopt.VerifyMismatch) as ei:
        mokopt.verify(EXAMPLE, b)
    e = ei.value
    assert e.report is not None and not e.report.passed
    bad = e.report.mismatches()
    assert bad and bad[0].mismatches > 0 and bad[0].max_abs_err > 1e-5
    assert e.reasons and "moe_out" in e.reasons[0].block
    # check=False returns the same verdict instead of raising.
    rep = mokopt.verify(EXAMPLE, b, check=False)
    assert not rep.passed and rep.mismatches()[0].mismatches == bad[0].mismatches


def test_verify_against_expected_outputs() -> None:
    x, y = ort_golden()
    assert mokopt.verify(EXAMPLE, inputs=[x], expected={"moe_out": y}).passed
    with pytest.raises(mokopt.VerifyMismatch) as ei:
        mokopt.verify(EXAMPLE, inputs=[x], expected=[y + 0.01])
    o = ei.value.report.cases[0].outputs[0]
    assert o.mismatches == y.size and abs(o.max_abs_err - 0.01) < 1e-4
    with pytest.raises(ValueError, match="missing"):
        mokopt.verify(EXAMPLE, inputs={"x": x}, expected=[y])


def test_verify_data_folder_and_options() -> None:
    fused, _ = mokopt.rewrite(EXAMPLE)
    rep = mokopt.verify(EXAMPLE, fused, inputs=EXAMPLE_DATA, rtol=1e-3, atol=1e-4)
    assert rep.passed and rep.inputs == "data" and (rep.rtol, rep.atol) == (1e-3, 1e-4)
    assert rep.cases[0].inputs[0].shape == [2, 8, 64]


@pytest.mark.parametrize("as_proto", [True, False], ids=["ModelProto", "path"])
def test_lower_ort(as_proto: bool, tmp_path: Path) -> None:
    fused, _ = mokopt.rewrite(EXAMPLE)
    src = fused
    if not as_proto:
        src = tmp_path / "fused.onnx"
        onnx.save(fused, str(src))
    lowered, report = mokopt.lower(src, target="ort")
    assert len(moe_nodes(lowered, "com.microsoft")) == 1 and not moe_nodes(lowered)
    assert report.target == "ort" and [b.lowered for b in report.blocks] == [True]
    x, y = ort_golden()
    assert mokopt.verify(lowered, inputs=[x], expected=[y]).passed


def test_lowering_refused_carries_violations(tmp_path: Path) -> None:
    fused, _ = mokopt.rewrite(EXAMPLE)
    out = tmp_path / "mok.onnx"
    with pytest.raises(mokopt.LoweringRefused) as ei:
        mokopt.lower(fused, target="gb300-nvl72", ep=8, output=out)
    e = ei.value
    assert not out.exists() and e.report is not None and e.report.output is None
    (b,) = e.report.blocks
    assert (b.spec.hidden, b.spec.inter) == (64, 128)
    assert [(v.number, v.code) for v in b.errors] == [(8, "H_MOD_256"), (9, "I_MOD_256")]
    assert [r.block for r in e.reasons] == [b.node] and "#8 H_MOD_256" in e.reasons[0].cause
    # partial=True keeps the node and writes the model.
    m, rep = mokopt.lower(fused, target="gb300-nvl72", ep=8, partial=True, plan=tmp_path / "plan.json")
    assert len(moe_nodes(m)) == 1 and rep.ep == 8 and not rep.blocks[0].lowered
    assert (tmp_path / "plan.json").stat().st_size > 0


@pytest.mark.parametrize("as_proto", [True, False], ids=["ModelProto", "path"])
def test_diff(as_proto: bool) -> None:
    fused, _ = mokopt.rewrite(EXAMPLE)
    a = onnx.load(str(EXAMPLE)) if as_proto else EXAMPLE
    d = mokopt.diff(a, fused)
    assert not d.same and d.summary["fused_regions"] == 1 and d.summary["other_changes"] == 0
    assert d.summary["region_nodes"] == len(onnx.load(str(EXAMPLE)).graph.node)
    assert len(d.fused_regions) == 1 and "ai.mok::MoE" in d.line
    assert mokopt.diff(a, a).same


@pytest.mark.parametrize("as_proto", [True, False], ids=["ModelProto", "path"])
def test_inspect_fields(as_proto: bool) -> None:
    m = onnx.load(str(EXAMPLE))
    r = mokopt.inspect(m if as_proto else EXAMPLE)
    # The census and I/O agree with the onnx package's reading of the file.
    census = collections.Counter(n.op_type for n in m.graph.node)
    assert {o.op: o.count for o in r.model.ops} == dict(census)
    assert r.model.op_count("MatMul") == census["MatMul"]
    assert r.model.nodes == len(m.graph.node) and r.model.initializers == len(m.graph.initializer)
    assert r.model.ir_version == m.ir_version
    assert [(o.domain or "ai.onnx", o.version) for o in r.model.opsets] == [(o.domain or "ai.onnx", o.version) for o in m.opset_import]
    dims = [str(d.dim_value) for d in m.graph.input[0].type.tensor_type.shape.dim]
    assert [(i.name, i.type, i.shape) for i in r.model.inputs] == [("hidden_states", "FLOAT", dims)]
    (blk,) = r.moe.blocks
    assert (blk.kind, blk.input, blk.output) == ("batched", "hidden_states", "moe_out")
    assert (blk.spec.num_experts, blk.spec.top_k, blk.spec.hidden, blk.spec.inter) == (8, 2, 64, 128)
    assert r.raw["schema_version"] == 1


def test_external_data_round_trip(gen_model, tmp_path: Path) -> None:
    src = gen_model("--shared-inter", "64")
    assert (src.parent / "m.onnx.data").exists()
    whole = onnx.load(str(src))
    assert mokopt.inspect(src).model.external_bytes > 0

    # A path with a side file: the result is loaded whole, weights included.
    fused, report = mokopt.rewrite(src)
    assert len(report.fused) == 1 and report.fused[0].block.spec.shared_inter == 64
    ext = [t.name for t in _cli.model_tensors(fused) if t.data_location == onnx.TensorProto.EXTERNAL]
    assert ext == []
    mokopt.verify(fused, whole)

    # The loaded proto, forced through a side file as a large model would be.
    before = whole.SerializeToString()
    old = _cli.EXTERNAL_THRESHOLD
    _cli.EXTERNAL_THRESHOLD = 0
    try:
        fused2, _ = mokopt.rewrite(whole)
    finally:
        _cli.EXTERNAL_THRESHOLD = old
    assert whole.SerializeToString() == before  # the caller's proto is unchanged
    mokopt.verify(fused2, src)

    # output=: the result stays on disk, its tensors referring to the side file.
    out = tmp_path / "out" / "fused.onnx"
    out.parent.mkdir()
    r = mokopt.rewrite(src, output=out)
    refs = {e.value for t in r.model.graph.initializer for e in t.external_data if e.key == "location"}
    assert refs == {"fused.onnx.data"} and (out.parent / "fused.onnx.data").exists()
    # Such a path-backed proto cannot be sent as a proto: pass the path.
    with pytest.raises(mokopt.UsageError, match="pass the model's path"):
        mokopt.inspect(r.model)
    mokopt.verify(r.path, src)
    assert mokopt.verify(onnx.load(r.path), whole).passed


def test_write_model_external_layout(tmp_path: Path) -> None:
    m = onnx.load(str(EXAMPLE))
    p = _cli.write_model(m, tmp_path / "m.onnx", external=True)
    back = onnx.load(str(p))
    for t0, t1 in zip(m.graph.initializer, back.graph.initializer):
        np.testing.assert_array_equal(numpy_helper.to_array(t0), numpy_helper.to_array(t1))
    small = onnx.load(str(p), load_external_data=False)
    n_ext = sum(t.data_location == onnx.TensorProto.EXTERNAL for t in small.graph.initializer)
    assert n_ext == sum(len(t.raw_data) >= _cli.EXTERNAL_TENSOR_MIN for t in m.graph.initializer) > 0


def test_missing_binary_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MOKOPT_BINARY", str(tmp_path / "absent"))
    with pytest.raises(mokopt.BinaryNotFound) as ei:
        mokopt.inspect(EXAMPLE)
    assert "absent" in str(ei.value) and "MOKOPT_BINARY" in str(ei.value)
    assert "go install ./cmd/mokopt" in str(ei.value)
    monkeypatch.delenv("MOKOPT_BINARY")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(_cli, "_bundled", lambda: tmp_path / "bin" / "mokopt")
    with pytest.raises(mokopt.BinaryNotFound, match="go install ./cmd/mokopt"):
        mokopt.rewrite(EXAMPLE)
    with pytest.raises(FileNotFoundError):  # BinaryNotFound is one
        mokopt.find_binary()


def test_binary_lookup_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mokopt_binary: str) -> None:
    assert mokopt.find_binary(mokopt_binary) == mokopt_binary
    monkeypatch.delenv("MOKOPT_BINARY")
    bundled = tmp_path / "bin" / "mokopt"
    bundled.parent.mkdir()
    os.symlink(mokopt_binary, bundled)
    onpath = tmp_path / "path"
    onpath.mkdir()
    os.symlink(mokopt_binary, onpath / "mokopt")
    monkeypatch.setenv("PATH", str(onpath))
    monkeypatch.setattr(_cli, "_bundled", lambda: bundled)
    assert mokopt.find_binary() == str(bundled)
    bundled.unlink()
    assert mokopt.find_binary() == str(onpath / "mokopt")
    assert mokopt.version().startswith("0.")


def test_report_decodes_special_floats() -> None:
    rep = mokopt.VerifyReport.from_json(
        {"pass": False, "cases": [{"name": "c", "pass": False, "outputs": [{"index": 0, "max_abs_err": "NaN", "max_rel_err": "Inf", "pass": False}]}]}
    )
    o = rep.cases[0].outputs[0]
    assert np.isnan(o.max_abs_err) and o.max_rel_err == float("inf") and not rep.passed
