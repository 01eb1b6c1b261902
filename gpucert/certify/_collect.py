"""A succeeded benchmark pod's log → validated results rows, the stack record and the payload's messages.

The log mixes the payload's two streams, as ``kubectl logs`` shows them (:mod:`gpucert.bench`):

* stdout: results rows, one JSON object a line with the contract's columns;
* stderr: ``gpucert-bench: …`` messages (``gpucert-bench: error: <step> on <where>: <reason>`` explains
  each ``error`` row), the stack record ``gpucert-stack: {…}`` and, with ``--dcgm``, ``gpucert-dcgm: {…}``;
* anything else the image or a library printed (NCCL, CUDA, Python warnings, a traceback).

The rows are read by the rule of :func:`gpucert.results.read_results` for a Pod log — a line that starts
with ``{`` (after blanks) is an object, an object with none of the contract's columns is some other tool's
structured log line and is skipped, and an object line that is not valid JSON is an error naming its
line — and validated by :func:`gpucert.results.parse_results`, line numbers kept. Then every row must be
the Job's: its ``run_id`` and ``node`` (the payload writes the node it ran on). A row of another run or
node is an error, never kept quietly: it would be judged as this node's.

Every problem raises one :class:`~gpucert.errors.ResultsError` whose source names the pod, its Job and its
node; the certify flow records the node ``inconclusive`` for it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..errors import Problem, ResultsError
from ..kube import Kube
from ..metrics import RESULT_COLUMNS
from ..results import parse_results
from ._names import DEFAULT_LABEL_PREFIX
from ._outcome import JobOutcome

__all__ = [
    "BENCH_PREFIX",
    "DCGM_PREFIX",
    "STACK_PREFIX",
    "CollectedResults",
    "collect_results",
    "parse_pod_log",
]

BENCH_PREFIX = "gpucert-bench: "
STACK_PREFIX = "gpucert-stack: "
DCGM_PREFIX = "gpucert-dcgm: "
_SHOWN = 12


@dataclass(frozen=True)
class CollectedResults:
    """What one benchmark pod's log held.

    ``results`` is the canonical results frame (:func:`gpucert.results.parse_results`); ``stack`` the
    stack record (the run's ``stack.json``), None when the log had none; ``dcgm`` the DCGM diagnostic
    summary, when run; ``errors`` the payload's ``error:`` messages (what each ``error`` row was about);
    ``warnings`` what was odd but did not stop the reading (no stack record, foreign lines).
    """

    results: pd.DataFrame
    stack: dict[str, Any] | None
    dcgm: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _record(line: str, prefix: str, number: int, warnings: list[str]) -> dict[str, Any] | None:
    try:
        value = json.loads(line[len(prefix) :])
    except ValueError as exc:
        warnings.append(f"line {number}: the {prefix.strip()} record is not valid JSON: {exc}")
        return None
    if not isinstance(value, dict):
        warnings.append(f"line {number}: the {prefix.strip()} record is not a JSON object")
        return None
    return value


def _cell(value: object) -> object:
    """Numbers and strings as they are; anything else as its JSON text, so no check mistakes its type
    (the rule of the JSON-lines reader)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        return json.dumps(value)
    return value


def parse_pod_log(text: str, *, run_id: str, node: str, source: str) -> CollectedResults:
    """Split a benchmark pod's log and validate its rows as ``run_id`` on ``node``.

    ``source`` names the log in errors (e.g. ``log of Pod gpucert-system/x (Job j, node n)``). Returns a
    :class:`CollectedResults`. Raises :class:`~gpucert.errors.ResultsError` for an object line that is not
    JSON, rows that break the data contract, a row of another run or node, or a log with no rows at all.
    """
    records: list[dict[str, object]] = []
    numbers: list[int] = []
    problems: list[Problem] = []
    bad_json = 0
    stack: dict[str, Any] | None = None
    dcgm: dict[str, Any] | None = None
    errors: list[str] = []
    warnings: list[str] = []
    foreign: list[tuple[int, str]] = []
    stacks = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError as exc:
                bad_json += 1
                if len(problems) < _SHOWN:
                    problems.append(Problem(f"not valid JSON: {exc}", row=number))
                continue
            if isinstance(obj, dict) and any(c in obj for c in RESULT_COLUMNS):
                records.append({c: _cell(obj[c]) for c in RESULT_COLUMNS if c in obj})
                numbers.append(number)
            continue
        if raw.startswith(STACK_PREFIX):
            stacks += 1
            stack = _record(raw, STACK_PREFIX, number, warnings) or stack
        elif raw.startswith(DCGM_PREFIX):
            dcgm = _record(raw, DCGM_PREFIX, number, warnings) or dcgm
        elif raw.startswith(BENCH_PREFIX):
            said = raw[len(BENCH_PREFIX) :].strip()
            if said.startswith("error:"):
                errors.append(said.removeprefix("error:").strip())
        else:
            foreign.append((number, line))
    if problems:
        raise ResultsError(source, problems, total=bad_json)
    if not records:
        raise ResultsError(source, [Problem("no results rows: the payload printed none")])
    if stacks == 0:
        warnings.append("no gpucert-stack record in the log: the run's stack.json will lack this node")
    elif stacks > 1:
        warnings.append(f"{stacks} gpucert-stack records in the log: the last one is kept")
    if foreign:
        first_line, first_text = foreign[0]
        shown = first_text if len(first_text) <= 160 else first_text[:159] + "…"
        warnings.append(
            f"{len(foreign)} line(s) of the log are neither rows nor the payload's messages "
            f"(first, line {first_line}: {shown!r})"
        )

    present = [c for c in RESULT_COLUMNS if any(c in r for r in records)]
    frame = pd.DataFrame(
        {c: pd.Series([r.get(c) for r in records], dtype=object) for c in present},
        index=pd.RangeIndex(len(records)),
    )
    lines = np.asarray(numbers, dtype=np.int64)
    results = parse_results(frame, source, rows=lines)
    _check_identity(results, lines, run_id=run_id, node=node, source=source)
    return CollectedResults(results=results, stack=stack, dcgm=dcgm, errors=errors, warnings=warnings)


def _check_identity(results: pd.DataFrame, lines: Any, *, run_id: str, node: str, source: str) -> None:
    """Every row must be ``run_id`` on ``node``; raises :class:`ResultsError` naming the rows that are not."""
    problems: list[Problem] = []
    total = 0
    for column, expected, what in (("run_id", run_id, "run"), ("node", node, "node")):
        values = results[column].astype(str).to_numpy()
        wrong = np.flatnonzero(values != expected)
        total += wrong.size
        for i in wrong[: max(0, _SHOWN - len(problems))]:
            problems.append(
                Problem(
                    f"{what} {values[i]!r}, but this Job is {what} {expected!r}: a row of another {what} is "
                    "never kept",
                    row=int(lines[i]),
                    column=column,
                )
            )
    if total:
        raise ResultsError(source, problems, total=total)


def _pod_source(
    pod: Mapping[str, Any], run_id: str | None, node: str | None, label_prefix: str
) -> tuple[str, str, str, str | None, str | None]:
    """(namespace, pod, job, run id, node) of a benchmark pod, from what it carries."""
    meta = pod.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    if (pod.get("status") or {}).get("phase") != "Succeeded":
        raise ValueError(f"Pod {meta.get('name')} has not succeeded: no results to collect")
    job = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name") or ""
    key = f"{label_prefix}/node"
    where = node or annotations.get(key) or labels.get(key) or (pod.get("spec") or {}).get("nodeName")
    run = run_id or labels.get(f"{label_prefix}/run-id")
    return str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(job), run, where


def collect_results(
    kube: Kube,
    source: JobOutcome | Mapping[str, Any],
    *,
    run_id: str | None = None,
    node: str | None = None,
    label_prefix: str = DEFAULT_LABEL_PREFIX,
) -> CollectedResults:
    """Read the log of a succeeded benchmark pod and return its validated rows and records.

    ``source`` is the Job's :class:`JobOutcome` (state ``succeeded``) or the succeeded Pod itself.
    ``run_id`` and ``node`` are what every row must say; they default to the outcome's (or the pod's
    ``<prefix>/run-id`` label and ``<prefix>/node`` annotation, else where it was bound) — pass them to
    check against what the caller asked for rather than what the objects say.

    Raises ``ValueError`` for an outcome or pod that did not succeed (there is no log to trust) or when
    no run id or node is known, a :class:`~gpucert.errors.ResultsError` naming the pod, Job and node for a
    log whose rows cannot be used (see :func:`parse_pod_log`), and :class:`~gpucert.kube.KubeError` when
    the log cannot be read (:class:`~gpucert.kube.KubeNotFound`: the pod is gone — the node is
    ``vanished``).
    """
    expected_run: str | None
    expected_node: str | None
    if isinstance(source, JobOutcome):
        if source.state != "succeeded" or source.pod is None:
            raise ValueError(f"Job {source.job} has not succeeded ({source.state}): no results to collect")
        namespace, pod, job = source.namespace, source.pod, source.job
        expected_run, expected_node = run_id or source.run_id, node or source.node
    else:
        namespace, pod, job, expected_run, expected_node = _pod_source(source, run_id, node, label_prefix)
    if not expected_run or not expected_node:
        raise ValueError(f"Pod {namespace}/{pod}: the run id and the node must be known to check its rows")
    text = kube.pod_log(pod, namespace)
    where = f"log of Pod {namespace}/{pod} (Job {job or '?'}, node {expected_node})"
    return parse_pod_log(text, run_id=expected_run, node=expected_node, source=where)
