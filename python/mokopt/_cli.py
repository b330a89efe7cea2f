"""Finding and running the mokopt binary, and moving models to and from files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import onnx

from .errors import BinaryNotFound, CheckFailed, Interrupted, MokoptError, UsageError

PathLike = Union[str, "os.PathLike[str]"]
ModelLike = Union[onnx.ModelProto, PathLike]

ENV_BINARY = "MOKOPT_BINARY"

# A model whose serialized size is above this is written with its tensors in a
# side file: one protobuf cannot exceed 2 GiB, and a margin keeps the graph's
# own bytes (and protobuf's accounting) well below it.
EXTERNAL_THRESHOLD = 1 << 30
# Tensors at least this large go to the side file when one is written.
EXTERNAL_TENSOR_MIN = 1024

_HOWTO = (
    "install the wheel (pip install mokopt, which carries the binary for linux x86-64 and arm64), "
    "or build it from a clone of the repository (go install ./cmd/mokopt, which puts it in "
    "$(go env GOPATH)/bin) and put it on PATH or name it in MOKOPT_BINARY"
)


def _bundled() -> Path:
    return Path(__file__).resolve().parent / "bin" / "mokopt"


def find_binary(binary: Optional[PathLike] = None) -> str:
    """The mokopt binary to run: ``binary`` if given, else ``$MOKOPT_BINARY``,
    else the one the wheel carries, else ``mokopt`` on ``PATH``.

    Raises:
        BinaryNotFound: none of these exists (the message says how to get one),
            or the one named explicitly is not an executable file.
    """
    named = [(os.fspath(binary), "the binary argument")] if binary is not None else []
    if not named and os.environ.get(ENV_BINARY):
        named = [(os.environ[ENV_BINARY], ENV_BINARY)]
    for path, where in named:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        raise BinaryNotFound(f"mokopt binary {path!r} (from {where}) is not an executable file; {_HOWTO}")
    b = _bundled()
    if b.is_file() and os.access(b, os.X_OK):
        return str(b)
    found = shutil.which("mokopt")
    if found:
        return found
    raise BinaryNotFound(f"no mokopt binary found ({ENV_BINARY} is unset, this package carries none, none on PATH): {_HOWTO}")


def _message(stderr: str) -> str:
    """mokopt's message: the lines of its standard error that are not
    progress, without the ``mokopt: `` prefix."""
    lines = []
    for line in stderr.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("mokopt: "):
            line = line[len("mokopt: ") :]
        lines.append(line)
    return "\n".join(lines)


class Completed:
    """A finished command: exit code, standard output and standard error."""

    def __init__(self, cmd: List[str], returncode: int, stdout: str, stderr: str) -> None:
        self.cmd = cmd
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr

    @property
    def message(self) -> str:
        """mokopt's message on standard error."""
        return _message(self.stderr)

    def json(self) -> Optional[Dict[str, Any]]:
        """The JSON document on standard output, None when there is none."""
        text = self.stdout.strip()
        if not text.startswith("{"):
            return None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            return None
        return doc if isinstance(doc, dict) else None

    def fail(self, cls: type = CheckFailed, **kw: Any) -> MokoptError:
        """The exception for this command's failure: UsageError on exit 2,
        Interrupted on 130, cls on 1, MokoptError otherwise."""
        msg = self.message or f"mokopt exited with status {self.returncode}"
        common = dict(returncode=self.returncode, cmd=self.cmd, stderr=self.stderr)
        if self.returncode == 2:
            return UsageError(msg, **common)
        if self.returncode == 130:
            return Interrupted(msg, **common)
        if self.returncode == 1:
            return cls(msg, **common, **kw)
        return MokoptError(msg, **common)


def run_cli(args: Sequence[str], binary: Optional[PathLike] = None, ok: Tuple[int, ...] = (0,)) -> Completed:
    """Runs ``mokopt --quiet ARGS``; returns the result when its exit code is in
    ok, raises the matching MokoptError otherwise."""
    exe = find_binary(binary)
    cmd = [exe, args[0], "--quiet", *args[1:]]
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    except OSError as e:
        raise BinaryNotFound(f"cannot run mokopt binary {exe!r}: {e}; {_HOWTO}", cmd=cmd) from e
    c = Completed(cmd, p.returncode, p.stdout, p.stderr)
    if c.returncode not in ok:
        raise c.fail()
    return c


def _tensors(g: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of a graph: initializers, sparse initializers' values,
    node attributes, and those of subgraphs."""
    yield from g.initializer
    for s in g.sparse_initializer:
        yield s.values
        yield s.indices
    for n in g.node:
        yield from _attr_tensors(n.attribute)


def _attr_tensors(attrs: Any) -> Iterator[onnx.TensorProto]:
    for a in attrs:
        if a.HasField("t"):
            yield a.t
        yield from a.tensors
        if a.HasField("g"):
            yield from _tensors(a.g)
        for sg in a.graphs:
            yield from _tensors(sg)


def model_tensors(m: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of a model, model-local functions' constants included."""
    yield from _tensors(m.graph)
    for f in m.functions:
        for n in f.node:
            yield from _attr_tensors(n.attribute)


def write_model(m: onnx.ModelProto, path: Path, external: Optional[bool] = None) -> Path:
    """Writes m to path without changing m. Where m is too large for one
    protobuf (or external is True), its tensors of EXTERNAL_TENSOR_MIN bytes or
    more go to ``path.name + ".data"`` beside it: they are moved out of m while
    the graph is serialized and put back afterwards, so no copy of the weights
    is made and no protobuf over 2 GiB is built.

    Raises:
        UsageError: m refers to external data it does not hold (a model loaded
            with load_external_data=False): pass its path instead.
    """
    for t in model_tensors(m):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            loc = next((e.value for e in t.external_data if e.key == "location"), "?")
            raise UsageError(
                f"tensor {t.name!r} of this ModelProto is stored in external data ({loc!r}) that the "
                "proto does not hold; pass the model's path instead, or load it with onnx.load(path) "
                "(load_external_data=True)"
            )
    if external is None:
        external = m.ByteSize() > EXTERNAL_THRESHOLD
    if not external:
        path.write_bytes(m.SerializeToString())
        return path
    loc = path.name + ".data"
    moved: List[Tuple[onnx.TensorProto, bytes]] = []
    try:
        with open(path.parent / loc, "wb") as f:
            for t in model_tensors(m):
                if not t.HasField("raw_data") or len(t.raw_data) < EXTERNAL_TENSOR_MIN:
                    continue
                data = t.raw_data
                offset = f.tell()
                f.write(data)
                moved.append((t, data))
                t.ClearField("raw_data")
                t.data_location = onnx.TensorProto.EXTERNAL
                del t.external_data[:]
                for k, v in (("location", loc), ("offset", str(offset)), ("length", str(len(data)))):
                    e = t.external_data.add()
                    e.key, e.value = k, v
        path.write_bytes(m.SerializeToString())
    finally:
        for t, data in moved:
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
            t.raw_data = data
    return path


def model_arg(model: ModelLike, tmp: Path, name: str, external: Optional[bool] = None) -> str:
    """The path mokopt reads model from: the path itself, or a file in tmp
    holding the ModelProto."""
    if isinstance(model, onnx.ModelProto):
        return str(write_model(model, tmp / name, external))
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    raise TypeError(f"expected an onnx.ModelProto or a path, got {type(model).__name__}")


def graph_io(model: ModelLike) -> Tuple[List[str], List[str]]:
    """The names of model's graph inputs (less initializers) and outputs."""
    m = model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model), load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    return [i.name for i in m.graph.input if i.name not in inits], [o.name for o in m.graph.output]
