"""mokopt for Python: fuse, verify, lower, diff and inspect the Mixture-of-Experts
blocks of ONNX models.

Each function takes an ``onnx.ModelProto`` or a path and runs the ``mokopt``
command (found by :func:`find_binary`); models go through files, so a model
over 2 GiB is never one protobuf. Reports are the objects of
:mod:`mokopt.reports`, built from the command's ``--json`` documents; failures
raise the exceptions of :mod:`mokopt.errors`. docs/python.md is the guide.

>>> import onnx, mokopt
>>> fused, report = mokopt.rewrite(onnx.load("exported.onnx"))  # doctest: +SKIP
>>> lowered, plan = mokopt.lower(fused, target="ort")  # doctest: +SKIP
"""

from ._cli import find_binary
from ._version import __version__
from .api import Result, diff, inspect, lower, rewrite, verify, version
from .errors import (
    BinaryNotFound,
    CheckFailed,
    FusionRefused,
    Interrupted,
    LoweringRefused,
    MokoptError,
    UsageError,
    VerifyMismatch,
)
from .reports import (
    DiffReport,
    InspectReport,
    LowerReport,
    Reason,
    RewriteReport,
    VerifyReport,
)

__all__ = [
    "__version__",
    "find_binary",
    "Result",
    "rewrite",
    "lower",
    "verify",
    "diff",
    "inspect",
    "version",
    "MokoptError",
    "BinaryNotFound",
    "UsageError",
    "CheckFailed",
    "FusionRefused",
    "LoweringRefused",
    "VerifyMismatch",
    "Interrupted",
    "Reason",
    "RewriteReport",
    "LowerReport",
    "VerifyReport",
    "DiffReport",
    "InspectReport",
]
