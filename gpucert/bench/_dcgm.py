"""``dcgmi diag -r LEVEL -j``: run it when the image has it, and read its JSON tolerantly.

DCGM's JSON has changed between releases (``"DCGM GPU Diagnostic"`` in 2.x/3.x, ``"DCGM Diagnostic"``
with entity groups in 4.x), so the reader walks the document and takes every object with a ``name`` and a
``results`` list (or a ``status``) as a test, each result's ``status`` as the outcome and ``gpu_id`` /
``gpu_ids`` / ``entity_id`` as the GPU it concerns. A test fails when any of its results says ``fail``;
``skip``, ``warn`` and the like are not failures. Levels 3 and 4 take from half an hour to hours: the
benchmark Job's deadline must allow for them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["DIAG_LEVELS", "DIAG_TIMEOUT_S", "DcgmDiag", "DcgmError", "DcgmTest", "parse_dcgm_diag", "run_dcgm_diag"]

#: The run levels of ``dcgmi diag -r``.
DIAG_LEVELS = (1, 2, 3, 4)
#: Seconds a level may take before the run counts as hung: a few times DCGM's own estimate of its length.
DIAG_TIMEOUT_S = {1: 600.0, 2: 1800.0, 3: 3 * 3600.0, 4: 6 * 3600.0}


class DcgmError(ValueError):
    """``dcgmi`` output that is not a diagnostic report, or a run that produced none."""


@dataclass(frozen=True)
class DcgmTest:
    name: str
    #: one (gpu, status) per result; gpu None when the result is not about one GPU
    results: tuple[tuple[int | None, str], ...]

    @property
    def failed_gpus(self) -> tuple[int | None, ...]:
        return tuple(g for g, s in self.results if s == "fail")

    @property
    def status(self) -> str:
        statuses = {s for _, s in self.results}
        return next((w for w in ("fail", "warn", "pass", "skip") if w in statuses), min(statuses, default="unknown"))


@dataclass(frozen=True)
class DcgmDiag:
    tests: tuple[DcgmTest, ...]

    def summary(self) -> dict[str, str]:
        return {t.name: t.status for t in self.tests}


def _status(value: object) -> str:
    word = str(value).strip().lower()
    for status in ("fail", "pass", "warn", "skip"):
        if word.startswith(status):
            return status
    return "skip" if word in {"not run", "notrun", "not_run"} else word or "unknown"


def _gpu_of(result: dict[str, Any]) -> int | None:
    value = next((result[k] for k in ("gpu_id", "entity_id", "gpu_ids") if result.get(k) is not None), None)
    text = str(value).strip()
    # Several GPUs ("0,1,2") or a non-GPU entity: the node's.
    return int(text) if value is not None and text.isdigit() else None


def _tests(node: Any) -> Iterator[DcgmTest]:
    if isinstance(node, dict):
        name, results = node.get("name"), node.get("results")
        if isinstance(name, str) and isinstance(results, list):
            found = tuple(
                (_gpu_of(r), _status(r.get("status"))) for r in results if isinstance(r, dict) and "status" in r
            )
            if found:
                yield DcgmTest(name, found)
                return
        if isinstance(name, str) and "status" in node and not isinstance(node.get("status"), dict | list):
            yield DcgmTest(name, ((None, _status(node["status"])),))
            return
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for value in children:
        yield from _tests(value)


def parse_dcgm_diag(text: str) -> DcgmDiag:
    """Parse ``dcgmi diag -j`` output; :class:`DcgmError` when it holds no JSON report with tests."""
    start = text.find("{")
    if start < 0:
        raise DcgmError("no JSON object in the dcgmi output")
    try:
        document = json.JSONDecoder().raw_decode(text[start:])[0]
    except json.JSONDecodeError as exc:
        raise DcgmError(f"the dcgmi output is not valid JSON ({exc})") from None
    tests = tuple(_tests(document))
    if not tests:
        raise DcgmError("the dcgmi JSON names no test results")
    return DcgmDiag(tests)


def run_dcgm_diag(level: int = 1) -> DcgmDiag | None:
    """Run ``dcgmi diag -r LEVEL -j`` (timeout: the level's :data:`DIAG_TIMEOUT_S`); returns ``None`` when
    ``dcgmi`` is not on the PATH. Raises ``ValueError`` for a level outside 1-4,
    :class:`DcgmError` when no report comes back and ``subprocess.TimeoutExpired`` when it runs too long."""
    if level not in DIAG_LEVELS:
        raise ValueError(f"dcgmi diag level {level!r} is not one of {', '.join(map(str, DIAG_LEVELS))}")
    exe = shutil.which("dcgmi")
    if exe is None:
        return None
    done = subprocess.run(
        [exe, "diag", "-r", str(level), "-j"],
        capture_output=True,
        text=True,
        timeout=DIAG_TIMEOUT_S[level],
        check=False,
    )
    try:
        # dcgmi exits non-zero when a test fails, and still prints the report: read it either way.
        return parse_dcgm_diag(done.stdout)
    except DcgmError as exc:
        tail = " ".join((done.stderr or done.stdout).split()[-40:])
        raise DcgmError(f"dcgmi diag exited with status {done.returncode}: {exc}; {tail}") from None
