"""Explaining one job end to end, without Prefect: find it, gather its signals, read gpucert's record of
its nodes, diagnose, draw the timeline. ``gpucert explain`` calls :func:`explain_job`; the ``explain-job``
flow runs the same steps as tasks.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import pandas as pd

from ..kube import Kube
from ..policy import Policy
from ..store import BaselineStore
from ..telemetry import PrometheusSource
from ..tickets import TicketBackend
from ._diagnose import explain
from ._frames import Explanation
from ._gather import STEP_METRIC, Gathered, gather
from ._record import read_record
from ._target import JobTarget, LabelMap, resolve_target
from ._timeline import render_timeline

__all__ = ["TIMELINES", "JobExplanation", "diagnose", "explain_id", "explain_job", "nothing_to_explain", "timeline_key"]

#: Where timelines are kept in the store: ``explain/date=YYYY-MM-DD/<explain id>.html``.
TIMELINES = "explain/"


@dataclass(frozen=True)
class JobExplanation:
    """One job explained: what was found, read and diagnosed, the timeline's HTML, and where time went."""

    target: JobTarget
    gathered: Gathered
    record: pd.DataFrame
    explanation: Explanation
    html: str
    #: Seconds per step: ``resolve``, ``prometheus`` (the queries), ``frames``, ``logs``, ``events``,
    #: ``record``, ``judge``, ``render``.
    seconds: dict[str, float] = field(default_factory=dict)


def explain_id(job: str, now: datetime) -> str:
    """``explain-<job>-<UTC time>`` as a DNS label (≤ 63 characters, a hash keeps cut names apart): the id
    the audit trail, the ticket and the timeline's file carry."""
    stamp = f"{now.astimezone(UTC):%Y%m%d-%H%M%S}"
    slug = "".join(c if c.isalnum() else "-" for c in job.lower()).strip("-")
    digest = hashlib.sha256(job.encode()).hexdigest()[:6]
    head = f"explain-{slug}"[: 63 - len(stamp) - len(digest) - 2].rstrip("-")
    return f"{head}-{digest}-{stamp}"


def timeline_key(run_id: str, now: datetime) -> str:
    """The store key of an explanation's timeline."""
    return f"{TIMELINES}date={now.astimezone(UTC):%Y-%m-%d}/{run_id}.html"


def nothing_to_explain(explanation: Explanation) -> str:
    """The one line of a window with no data (the verdict ``no-data``): the job, the window and what was
    missing. ``gpucert explain`` exits 2 with it and the ``explain-job`` flow fails with it: an answer about
    GPUs nobody saw is no answer."""
    start, end = explanation.window
    why = explanation.notes[0] if explanation.notes else "no telemetry, step times or events"
    return (
        f"explain {explanation.job}: nothing to judge from {start:%Y-%m-%d %H:%M:%S} to {end:%Y-%m-%d %H:%M:%S} "
        f"UTC: {why}"
    )


def diagnose(
    target: JobTarget, gathered: Gathered, record: pd.DataFrame, notes: list[str]
) -> tuple[Explanation, str, dict[str, float]]:
    """The explanation of gathered frames (``notes``, what gathering could not read, first among its notes), its
    timeline HTML, and the seconds each took."""
    began = time.perf_counter()
    explanation = explain(
        target.job,
        target.window,
        telemetry=gathered.telemetry,
        steps=gathered.steps,
        collectives=gathered.collectives,
        events=gathered.events,
        record=record,
        nic=gathered.nic,
        step_s=gathered.step_s,
    )
    if notes:
        explanation = replace(explanation, notes=tuple(dict.fromkeys([*notes, *explanation.notes])))
    diagnosed = time.perf_counter()
    html = render_timeline(explanation, telemetry=gathered.telemetry, steps=gathered.steps, events=gathered.events)
    return explanation, html, {"judge": diagnosed - began, "render": time.perf_counter() - diagnosed}


def explain_job(
    kube: Kube,
    source: PrometheusSource,
    job: str | None,
    *,
    selector: str | None = None,
    since: str | datetime | None = None,
    until: str | datetime | None = None,
    store: BaselineStore | None = None,
    tickets: TicketBackend | None = None,
    policy: Policy | None = None,
    step_metric: str | None = STEP_METRIC,
    now: datetime | None = None,
    labels: LabelMap | None = None,
) -> JobExplanation:
    """Explain ``job`` (``NAMESPACE/NAME``, or the pods of ``selector``) over ``since``..``until`` (default
    its lifetime); see :func:`~gpucert.explain._target.resolve_target`, :func:`~._gather.gather`,
    :func:`~._record.read_record`; ``labels``: the label mapping where detection cannot tell (``--labels``).

    Raises :class:`~gpucert.errors.InputError` for a job that cannot be found or a bad window, the
    ``TelemetryError`` of a Prometheus that refuses or does not answer, the ``KubeError`` of a cluster that
    does not answer.
    """
    now = now or datetime.now(UTC)
    began = time.perf_counter()
    target = resolve_target(kube, job, selector=selector, since=since, until=until, now=now)
    resolved = time.perf_counter()
    gathered = gather(kube, source, target, step_metric=step_metric, labels=labels)
    gathered_at = time.perf_counter()
    record, record_notes = read_record(store, target.nodes, tickets=tickets, policy=policy)
    recorded = time.perf_counter()
    explanation, html, diagnosed = diagnose(target, gathered, record, [*gathered.notes, *record_notes])
    seconds = {"resolve": resolved - began, **gathered.seconds, "record": recorded - gathered_at, **diagnosed}
    seconds["gather"] = gathered_at - resolved
    return JobExplanation(
        target=target,
        gathered=gathered,
        record=record,
        explanation=explanation,
        html=html,
        seconds={k: round(v, 3) for k, v in seconds.items()},
    )
