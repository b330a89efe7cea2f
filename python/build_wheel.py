#!/usr/bin/env python3
"""Builds the mokopt wheels: the Python package with a static mokopt binary.

For each architecture it cross-compiles ``./cmd/mokopt`` (CGO_ENABLED=0
GOOS=linux GOARCH=amd64|arm64, -trimpath, so the binary is static and the same
on every build machine) and writes one platform wheel,
``mokopt-VERSION-py3-none-manylinux_2_17_ARCH.manylinux2014_ARCH.musllinux_1_1_ARCH.whl``:
a static binary runs on glibc and musl systems alike, and the Python code is
version-independent, so the tags say exactly that. It needs only the standard
library and a Go toolchain (the wheel format is a zip with METADATA, WHEEL and
RECORD, written here by hand), so it works offline.

Usage (from anywhere in a clone)::

    python3 python/build_wheel.py                 # both architectures, into python/dist/
    python3 python/build_wheel.py --arch amd64 --out /tmp/wheels
    python3 python/build_wheel.py --arch amd64 --binary ./mokopt   # package a built binary

The wheel installs with ``pip install mokopt-...whl``; ``mokopt.find_binary()``
then finds the bundled binary.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import List, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ARCHES = {"amd64": "x86_64", "arm64": "aarch64"}
# A fixed timestamp for every entry: the same sources give the same wheel.
EPOCH = (2020, 1, 1, 0, 0, 0)


def version() -> str:
    text = (HERE / "mokopt" / "_version.py").read_text()
    m = re.search(r'__version__ = "([^"]+)"', text)
    if not m:
        sys.exit("build_wheel: no __version__ in mokopt/_version.py")
    return m.group(1)


def go_build(goarch: str, out: Path) -> None:
    env = dict(os.environ, CGO_ENABLED="0", GOOS="linux", GOARCH=goarch)
    cmd = ["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(out), "./cmd/mokopt"]
    print(f"build_wheel: GOARCH={goarch} {' '.join(cmd)}", file=sys.stderr)
    subprocess.run(cmd, cwd=REPO, env=env, check=True)


def metadata(ver: str) -> str:
    readme = (HERE / "README.md").read_text()
    head = [
        "Metadata-Version: 2.1",
        "Name: mokopt",
        f"Version: {ver}",
        "Summary: Fuse Mixture-of-Experts blocks in ONNX models into one checked ai.mok::MoE node and lower them",
        "License: Apache-2.0",
        "Requires-Python: >=3.9",
        "Requires-Dist: onnx>=1.12",
        "Classifier: Programming Language :: Python :: 3",
        "Classifier: Operating System :: POSIX :: Linux",
        "Classifier: Typing :: Typed",
        "Description-Content-Type: text/markdown",
    ]
    return "\n".join(head) + "\n\n" + readme


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(ver: str, goarch: str, binary: Path, out_dir: Path) -> Path:
    plat = ARCHES[goarch]
    tag = f"py3-none-manylinux_2_17_{plat}.manylinux2014_{plat}.musllinux_1_1_{plat}"
    dist = f"mokopt-{ver}.dist-info"
    files: List[Tuple[str, bytes, int]] = []  # name, data, mode
    for p in sorted((HERE / "mokopt").rglob("*")):
        rel = p.relative_to(HERE).as_posix()
        if p.is_file() and "__pycache__" not in rel and not rel.startswith("mokopt/bin/"):
            files.append((rel, p.read_bytes(), 0o644))
    files.append(("mokopt/bin/mokopt", binary.read_bytes(), 0o755))
    wheel_txt = "Wheel-Version: 1.0\nGenerator: mokopt build_wheel.py\nRoot-Is-Purelib: false\n"
    wheel_txt += "".join(f"Tag: py3-none-{t}\n" for t in tag.split("-")[2].split("."))
    files.append((f"{dist}/METADATA", metadata(ver).encode(), 0o644))
    files.append((f"{dist}/WHEEL", wheel_txt.encode(), 0o644))
    files.append((f"{dist}/LICENSE", (REPO / "LICENSE").read_bytes(), 0o644))
    record = [record_line(n, d) for n, d, _ in files] + [f"{dist}/RECORD,,"]
    files.append((f"{dist}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"mokopt-{ver}-{tag}.whl"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, mode in files:
            info = zipfile.ZipInfo(name, EPOCH)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", choices=sorted(ARCHES), action="append", help="GOARCH to build (repeatable; default both)")
    ap.add_argument("--out", type=Path, default=HERE / "dist", help="folder for the wheels (default python/dist)")
    ap.add_argument("--binary", type=Path, help="package this already built binary (with exactly one --arch)")
    a = ap.parse_args()
    arches = a.arch or sorted(ARCHES)
    if a.binary and len(arches) != 1:
        ap.error("--binary needs exactly one --arch")
    ver = version()
    with tempfile.TemporaryDirectory() as td:
        for goarch in arches:
            b = a.binary
            if b is None:
                b = Path(td) / f"mokopt-{goarch}"
                go_build(goarch, b)
            print(write_wheel(ver, goarch, b, a.out))


if __name__ == "__main__":
    main()
