"""The explain-job flow's units of work: find the job, gather and judge its window, publish the answer, act.

The frames (hours of telemetry for every GPU of the job) never leave the task that gathers them: it judges
them, stores the timeline and returns the explanation, which is small.
"""

from __future__ import annotations

from datetime import datetime

from prefect import get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from gpucert.audit import AuditRecorder
from gpucert.explain import (
    ActOutcome,
    ExplainOutcome,
    Explanation,
    JobTarget,
    LabelMap,
    act_on,
    diagnose,
    gather,
    read_record,
    resolve_target,
    timeline_key,
)
from gpucert.kube import Kube
from gpucert.policy import Policy
from gpucert.store import BaselineStore
from gpucert.telemetry import PrometheusSource
from gpucert.tickets import EscalationPolicy, TicketBackend

from ._retry import may_pass

__all__ = ["act_on_suspect", "explain_window", "find_job", "publish_explanation"]


@task(name="find the job", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=may_pass)
def find_job(
    kube: Kube, job: str | None, *, selector: str | None, since: str | None, until: str | None, now: datetime
) -> JobTarget:
    """The job's pods, nodes and window (``gpucert.explain.resolve_target``); raises ``InputError`` for a
    job that is not there (not retried)."""
    target = resolve_target(kube, job, selector=selector, since=since, until=until, now=now)
    get_run_logger().info(
        "%s (%s): %d pods on %d nodes, %s .. %s",
        target.job,
        target.kind,
        len(target.pods),
        len(target.nodes),
        target.window[0],
        target.window[1],
    )
    return target


@task(
    name="gather and judge", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=may_pass
)
def explain_window(
    kube: Kube,
    source: PrometheusSource,
    target: JobTarget,
    *,
    store: BaselineStore,
    tickets: TicketBackend | None,
    policy: Policy,
    step_metric: str | None,
    run_id: str,
    now: datetime,
    labels: LabelMap | None = None,
) -> tuple[Explanation, str, str, dict[str, float]]:
    """Gather the window's telemetry, timings, events and gpucert's record of the nodes, judge them and
    store the timeline; returns the explanation, the timeline's URI and a link a browser opens, and the
    seconds each part took; ``labels``: the label mapping where detection cannot tell."""
    gathered = gather(kube, source, target, step_metric=step_metric, labels=labels)
    record, notes = read_record(store, target.nodes, tickets=tickets, policy=policy)
    explanation, html, seconds = diagnose(target, gathered, record, [*gathered.notes, *notes])
    key = timeline_key(run_id, now)
    store.objects.put(key, html.encode("utf-8"))
    get_run_logger().info("%s: %s (%d queries to Prometheus)", target.job, explanation.answer[0], gathered.queries)
    return explanation, f"{store.uri.rstrip('/')}/{key}", store.link(key), {**gathered.seconds, **seconds}


@task(name="publish the answer", cache_policy=NO_CACHE, retries=3, retry_delay_seconds=[5, 10, 20])
def publish_explanation(outcome: ExplainOutcome) -> None:
    """The answer in three lines (a markdown artifact) and a link to the timeline."""
    create_markdown_artifact(key="explain-answer", markdown=outcome.markdown(), description=f"explain {outcome.job}")
    if outcome.timeline_link:
        create_link_artifact(key="explain-timeline", link=outcome.timeline_link, link_text=f"timeline of {outcome.job}")


@task(name="act on the suspect", cache_policy=NO_CACHE)
def act_on_suspect(
    explanation: Explanation,
    kube: Kube,
    *,
    policy: Policy,
    tickets: TicketBackend | None,
    audit: AuditRecorder,
    run_id: str,
    now: datetime,
    prefix: str,
    gpu_node_selector: str,
    evidence_link: str,
    escalation: EscalationPolicy,
) -> ActOutcome:
    """Cordon (gpucert's taint, inside the blast radius) and ticket the first hardware suspect
    (``gpucert.explain.act_on``); not retried: a taint or a ticket is never written twice by a retry."""
    done = act_on(
        explanation,
        kube,
        policy=policy,
        tickets=tickets,
        audit=audit,
        run_id=run_id,
        now=now,
        prefix=prefix,
        gpu_node_selector=gpu_node_selector,
        evidence_link=evidence_link,
        escalation=escalation,
    )
    get_run_logger().info("act: %s", "; ".join(done.lines()))
    return done
