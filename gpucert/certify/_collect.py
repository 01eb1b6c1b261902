"""A succeeded benchmark pod's log → validated results rows, the stack record and the payload's messages.

The log mixes the payload's two streams as ``kubectl logs`` shows them (:mod:`gpucert.bench`): results rows on
stdout, one JSON object a line; on stderr ``gpucert-bench: …`` messages (``gpucert-bench: error: …`` explains
each ``error`` row), the stack record ``gpucert-stack: {…}`` and, with ``--dcgm``, ``gpucert-dcgm: {…}``; and
whatever else the image or a library printed. The rows are read by the rule of
:func:`gpucert.results.read_results` for a Pod log (an object with none of the contract's columns is some other
tool's log line, skipped) and validated by :func:`gpucert.results.parse_results`, line numbers kept. Then every
row must be the Job's run and node: a row of another is an error, never kept quietly (it would be judged as this
node's). Every problem raises one :class:`~gpucert.errors.ResultsError` naming the pod, its Job and its node.

A wave reads its logs one by one (:func:`read_pod_log`) and validates them together (:func:`validate_pod_logs`):
the contract's checks are vectorised, and their fixed cost was 90 % of a 1,000-node certify's log reading.
When the batch is clean every log in it is (each check is of a row, or of one node's rows); when it is not,
each log is validated on its own, so a bad log costs its node alone, its error as :func:`parse_pod_log`'s.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..errors import Problem, ResultsError
from ..kube import Kube
from ..metrics import RESULT_COLUMNS
from ..results import parse_results, result_record
from ._names import DEFAULT_LABEL_PREFIX
from ._outcome import JobOutcome

BENCH_PREFIX = "gpucert-bench: "
STACK_PREFIX = "gpucert-stack: "
DCGM_PREFIX = "gpucert-dcgm: "
_SHOWN = 12


@dataclass(frozen=True)
class CollectedResults:
    """What one benchmark pod's log held: the canonical results frame; the stack record (the run's
    ``stack.json``; None when the log had none); the DCGM diagnostic summary, when run; the payload's ``error:``
    messages (what each ``error`` row was about); what was odd but did not stop the reading."""

    results: pd.DataFrame
    stack: dict[str, Any] | None
    dcgm: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PodLog:
    """A benchmark pod's log split into its results records and the payload's messages, not yet validated:
    ``records`` (the contract's columns a row gave), each one's line in the log (``numbers``), the contract's
    columns some record gave; ``run_id`` and ``node`` are what every row must say, ``source`` names the log."""

    source: str
    run_id: str
    node: str
    records: list[dict[str, object]]
    numbers: list[int]
    columns: frozenset[str]
    stack: dict[str, Any] | None
    dcgm: dict[str, Any] | None
    errors: list[str]
    warnings: list[str]


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


def parse_pod_log(text: str, *, run_id: str, node: str, source: str) -> CollectedResults:
    """Split a benchmark pod's log and validate its rows as ``run_id`` on ``node``.

    ``source`` names the log in errors (e.g. ``log of Pod gpucert-system/x (Job j, node n)``). Returns a
    :class:`CollectedResults`. Raises :class:`~gpucert.errors.ResultsError` for an object line that is not
    JSON, rows that break the data contract, a row of another run or node, or a log with no rows at all.
    """
    return _validated(split_pod_log(text, run_id=run_id, node=node, source=source))


def split_pod_log(text: str, *, run_id: str, node: str, source: str) -> PodLog:
    """Split a benchmark pod's log into its rows and messages (see :func:`parse_pod_log`), unvalidated.

    Returns a :class:`PodLog`. Raises :class:`~gpucert.errors.ResultsError` for an object line that is not
    JSON or a log with no rows at all.
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
    columns: set[str] = set()  # of the records short of a column (the payload writes every one)
    full = False
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
            record = result_record(obj)
            if record is not None:
                if len(record) == len(RESULT_COLUMNS):
                    full = True
                else:
                    columns.update(record)
                records.append(record)
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
    given = frozenset(RESULT_COLUMNS) if full else frozenset(columns)
    return PodLog(
        source=source,
        run_id=run_id,
        node=node,
        records=records,
        numbers=numbers,
        columns=given,
        stack=stack,
        dcgm=dcgm,
        errors=errors,
        warnings=warnings,
    )


def _frame_of(logs: Sequence[PodLog]) -> pd.DataFrame:
    """The records of ``logs`` in one object frame, in log order, with every column some record gave."""
    present = [c for c in RESULT_COLUMNS if any(c in log.columns for log in logs)]
    size = sum(len(log.records) for log in logs)
    return pd.DataFrame(
        {c: pd.Series([r.get(c) for log in logs for r in log.records], dtype=object) for c in present},
        index=pd.RangeIndex(size),
    )


def _validated(log: PodLog) -> CollectedResults:
    """``log``'s rows validated on their own; raises :class:`ResultsError` naming the log's problems."""
    lines = np.asarray(log.numbers, dtype=np.int64)
    results = parse_results(_frame_of([log]), log.source, rows=lines)
    _check_identity(results, lines, run_id=log.run_id, node=log.node, source=log.source)
    return _collected(log, results)


def _collected(log: PodLog, results: pd.DataFrame) -> CollectedResults:
    return CollectedResults(results=results, stack=log.stack, dcgm=log.dcgm, errors=log.errors, warnings=log.warnings)


def validate_pod_logs(logs: Sequence[PodLog]) -> list[CollectedResults | ResultsError]:
    """Validate the rows of many logs at once (see the module docstring); returns, for each log in order,
    its :class:`CollectedResults` or the :class:`ResultsError` that :func:`parse_pod_log` would raise."""
    whole = [log for log in logs if log.columns == frozenset(RESULT_COLUMNS)]
    if len(whole) < 2:
        return [_or_error(log) for log in logs]
    sizes = np.array([len(log.records) for log in whole], dtype=np.int64)
    ends = np.cumsum(sizes)
    canonical: pd.DataFrame | None = None
    with contextlib.suppress(ResultsError):  # some log is bad: each is validated on its own, to say which and why
        canonical = parse_results(_frame_of(whole), "the wave's logs")
    if canonical is not None and not _identity_mismatch(canonical, whole, sizes):
        done = {
            id(log): _collected(log, canonical.iloc[end - size : end].reset_index(drop=True))
            for log, size, end in zip(whole, sizes, ends, strict=True)
        }
        return [done[id(log)] if id(log) in done else _or_error(log) for log in logs]
    return [_or_error(log) for log in logs]


def _identity_mismatch(canonical: pd.DataFrame, logs: Sequence[PodLog], sizes: Any) -> bool:
    """Whether some row of the batch is not its log's run or node."""
    for column, expected in (("run_id", [log.run_id for log in logs]), ("node", [log.node for log in logs])):
        values = canonical[column].astype(str).to_numpy()
        if not np.array_equal(values, np.repeat(np.asarray(expected, dtype=object), sizes)):
            return True
    return False


def _or_error(log: PodLog) -> CollectedResults | ResultsError:
    try:
        return _validated(log)
    except ResultsError as exc:
        return exc


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
                    f"{what} {values[i]!r}, but this Job is {what} {expected!r}: a row of another {what} is never kept",
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
    """Read the log of a succeeded benchmark pod (``source``: the Job's :class:`JobOutcome`, or the Pod) and
    return its validated rows and records. ``run_id`` and ``node`` are what every row must say; they default to
    the outcome's (or the pod's ``<prefix>/run-id`` label and ``<prefix>/node`` annotation, else where it was
    bound) — pass them to check against what the caller asked for rather than what the objects say.

    Raises ``ValueError`` for an outcome or pod that did not succeed (no log to trust) or when no run id or node
    is known, :class:`~gpucert.errors.ResultsError` for a log whose rows cannot be used (see
    :func:`parse_pod_log`), and :class:`~gpucert.kube.KubeError` when the log cannot be read
    (:class:`~gpucert.kube.KubeNotFound`: the pod is gone — the node is ``vanished``).
    """
    if isinstance(source, JobOutcome):
        return _validated(read_pod_log(kube, source, run_id=run_id, node=node))
    namespace, pod, job, expected_run, expected_node = _pod_source(source, run_id, node, label_prefix)
    if not expected_run or not expected_node:
        raise ValueError(f"Pod {namespace}/{pod}: the run id and the node must be known to check its rows")
    return _validated(_read(kube, namespace, pod, job, expected_run, expected_node))


def read_pod_log(kube: Kube, source: JobOutcome, *, run_id: str | None = None, node: str | None = None) -> PodLog:
    """Read the log of a succeeded benchmark Job's pod, split but not validated (see :func:`collect_results`,
    whose rules and errors it shares but for the rows' validation: :func:`validate_pod_logs` does that).

    Raises ``ValueError`` for an outcome that did not succeed, :class:`~gpucert.errors.ResultsError` for a
    log with lines that are not JSON or no rows, and :class:`~gpucert.kube.KubeError` when it cannot be read.
    """
    if source.state != "succeeded" or source.pod is None:
        raise ValueError(f"Job {source.job} has not succeeded ({source.state}): no results to collect")
    expected_run, expected_node = run_id or source.run_id, node or source.node
    if not expected_run or not expected_node:
        raise ValueError(
            f"Pod {source.namespace}/{source.pod}: the run id and the node must be known to check its rows"
        )
    return _read(kube, source.namespace, source.pod, source.job, expected_run, expected_node)


def _read(kube: Kube, namespace: str, pod: str, job: str, run_id: str, node: str) -> PodLog:
    text = kube.pod_log(pod, namespace)
    where = f"log of Pod {namespace}/{pod} (Job {job or '?'}, node {node})"
    return split_pod_log(text, run_id=run_id, node=node, source=where)
