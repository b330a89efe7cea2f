"""Fixtures: the mokopt binary under test and the repository's bundled models."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))  # the package of this checkout, installed or not

EXAMPLE = REPO / "testdata" / "example" / "mixtral_block_dynamo_batched_mm.onnx"
EXAMPLE_DATA = REPO / "testdata" / "example" / "mixtral_block_dynamo_batched_mm_data" / "test_data_set_0"
CAPACITY = REPO / "testdata" / "producers" / "capacity_nllb_replica_dynamo.onnx"


@pytest.fixture(scope="session", autouse=True)
def mokopt_binary(tmp_path_factory: pytest.TempPathFactory) -> str:
    """MOKOPT_BINARY when set (CI sets it to the checkout's build), else a
    binary built here from this checkout."""
    b = os.environ.get("MOKOPT_BINARY")
    if b:
        return b
    go = shutil.which("go")
    if go is None:
        pytest.exit("set MOKOPT_BINARY to a mokopt binary built from this checkout (no go toolchain to build one)", 2)
    out = tmp_path_factory.mktemp("bin") / "mokopt"
    subprocess.run([go, "build", "-o", str(out), "./cmd/mokopt"], cwd=REPO, check=True)
    os.environ["MOKOPT_BINARY"] = str(out)
    return str(out)


@pytest.fixture(scope="session")
def gen_model(tmp_path_factory: pytest.TempPathFactory, mokopt_binary: str):
    """gen_model(*flags) writes ``mokopt gen -o DIR/m.onnx FLAGS`` (weights in
    m.onnx.data unless --inline) and returns its path."""
    n = [0]

    def make(*flags: str) -> Path:
        n[0] += 1
        d = tmp_path_factory.mktemp(f"gen{n[0]}")
        p = d / "m.onnx"
        subprocess.run([mokopt_binary, "gen", "-q", "-o", str(p), *flags], check=True, capture_output=True)
        return p

    return make
