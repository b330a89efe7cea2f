"""The exceptions mokopt's Python functions raise.

They follow the command's exit codes (docs/cli.md): 2 is a :class:`UsageError`
(bad arguments or an input that cannot be read), 1 a :class:`CheckFailed`
(a refused fusion or lowering, a numerical mismatch), 130 :class:`Interrupted`.
Every one carries the command line, the exit code and mokopt's own message.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from .reports import LowerReport, Reason, RewriteReport, VerifyReport

__all__ = [
    "MokoptError",
    "BinaryNotFound",
    "UsageError",
    "CheckFailed",
    "FusionRefused",
    "LoweringRefused",
    "VerifyMismatch",
    "Interrupted",
]


class MokoptError(Exception):
    """Base of every mokopt error.

    Attributes:
        message: mokopt's message (its standard error without the ``mokopt: `` prefixes).
        returncode: the command's exit code (None when it did not run).
        cmd: the command line that ran.
        stderr: the command's whole standard error.
        reasons: per-block reasons (block, cause) where mokopt gave them.
    """

    def __init__(
        self,
        message: str,
        *,
        returncode: Optional[int] = None,
        cmd: Sequence[str] = (),
        stderr: str = "",
        reasons: Optional[List[Reason]] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.returncode = returncode
        self.cmd = list(cmd)
        self.stderr = stderr
        self.reasons: List[Reason] = list(reasons or [])

    def __str__(self) -> str:
        return self.message


class BinaryNotFound(MokoptError, FileNotFoundError):
    """No ``mokopt`` binary was found (MOKOPT_BINARY, the wheel's, PATH)."""


class UsageError(MokoptError, ValueError):
    """Exit 2: bad arguments, or an input model or data set that cannot be read."""


class CheckFailed(MokoptError):
    """Exit 1: a check failed. The subclasses say which, with the report."""


class FusionRefused(CheckFailed):
    """``rewrite`` refused: a block failed its numerical check or a candidate
    could not be fused (without ``partial=True``). ``report`` is the rewrite
    report; ``reasons`` names each block and why."""

    def __init__(self, message: str, *, report: Optional[RewriteReport] = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.report = report


class LoweringRefused(CheckFailed):
    """``lower`` refused the model: a fused node the target cannot take
    (without ``partial=True``). ``report.blocks[i].violations`` hold the
    violated kernel constraints; ``reasons`` names each node and why."""

    def __init__(self, message: str, *, report: Optional[LowerReport] = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.report = report


class VerifyMismatch(CheckFailed):
    """``verify`` found outputs that differ beyond the tolerance. ``report``
    holds every case and output; ``reasons`` names each failed output."""

    def __init__(self, message: str, *, report: Optional[VerifyReport] = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.report = report


class Interrupted(MokoptError):
    """Exit 130: the command was interrupted; it wrote nothing."""
