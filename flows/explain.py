"""Explain a job: "my training job got slower — why?", answered on one time axis.

The runbook, top to bottom:

1. **find the job**: a Job, a JobSet, a PyTorchJob or MPIJob (``NAMESPACE/NAME``), or any pods of a
   ``selector``; its pods, their nodes, the GPUs each pod holds, the window (default: the job's lifetime);
2. **gather and judge**: the DCGM telemetry of the job's GPUs from Prometheus at the scrape step, the job's
   own step and collective times (its Prometheus metric, else its pods' logs), the Kubernetes events of its
   pods and nodes, gpucert's record of those nodes (last certification, open tickets, drift, baseline
   deviations); the GPUs are peers: the straggler, its onset and the step-time change that follows it, or
   plainly "elsewhere" when the GPUs and nodes show nothing; the timeline stored beside the runs.
   A window with nothing to judge fails the run with one line (``gpucert explain`` exits 2 with the same):
   no answer is published about GPUs nobody saw;
3. **publish**: the answer in three lines (a markdown artifact) and a link to the timeline;
4. **act** — only when ``act`` is set, never on its own: cordon the suspect node with gpucert's taint
   (inside the blast radius, as certify taints), open a ticket with the evidence, and re-certify it with
   the certify flow once it is idle (a node still running the job is left to the next certify). A silent
   straggler (named by the job's own timings, its telemetry showing no cause) is only re-certified — no
   cordon, no ticket on a guess; its verdict settles the cause. A transient or a hang is reported only.
"""

from datetime import UTC, datetime

from prefect import flow
from prefect.runtime import flow_run

from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.policy import CertificationPolicy
from gpucert.blocks.prometheus import Prometheus
from gpucert.blocks.store import StoreLocation
from gpucert.blocks.ticketing import Ticketing
from gpucert.errors import InputError
from gpucert.explain import STEP_METRIC, ExplainOutcome, LabelMap, explain_id, nothing_to_explain
from gpucert.flows._setup import apublish_audit, resolve
from gpucert.flows.certify import certify
from gpucert.tasks.explain import act_on_suspect, explain_window, find_job, publish_explanation

__all__ = ["explain_job"]


def _run_name() -> str:
    """``explain-<job>``: the run's name in the UI."""
    params = flow_run.parameters or {}
    what = params.get("job") or f"selector {params.get('selector')}"
    return f"explain-{what}".replace("/", "-")[:100]


@flow(name="explain-job", flow_run_name=_run_name, log_prints=False)
async def explain_job(
    job: str | None = None,
    selector: str | None = None,
    since: str | None = None,
    until: str | None = None,
    prometheus: Prometheus | None = None,
    cluster: GpuCluster | None = None,
    store: StoreLocation | None = None,
    policy: CertificationPolicy | None = None,
    ticketing: Ticketing | None = None,
    step_metric: str | None = STEP_METRIC,
    act: bool = False,
    labels: str | None = None,
    cluster_block: str | None = None,
    store_block: str | None = None,
    policy_block: str | None = None,
    ticketing_block: str | None = None,
) -> ExplainOutcome:
    """Why ``job`` (``NAMESPACE/NAME``; or the pods of ``selector``) is slow over ``since``..``until``
    (ISO 8601 or a duration ago such as ``6h``; default its lifetime); returns the answer, the suspects and
    the timeline's link. ``prometheus`` is where the DCGM telemetry is read; ``step_metric`` the job's
    step-time gauge (empty: its pods' logs only). ``labels``: which labels name the pod, namespace and node
    where explain cannot tell on its own (``operator``, ``plain``, or ``pod=…,namespace=…`` and/or
    ``node=…``; default detected). ``act`` cordons, tickets and re-certifies the suspect (a silent straggler
    is only re-certified).
    """
    if prometheus is None:
        raise InputError("explain-job reads DCGM telemetry from Prometheus: give the prometheus block")
    mapping = LabelMap.parse(labels)  # a bad mapping fails before anything is read
    setup = resolve(
        cluster,
        store,
        policy,
        ticketing,
        cluster_block=cluster_block,
        store_block=store_block,
        policy_block=policy_block,
        ticketing_block=ticketing_block,
    )
    kube, prefix = setup.kube, setup.cluster.label_prefix
    now = datetime.now(UTC)
    run_id = explain_id(job or f"selector-{selector}", now)
    setup.audit.run_id = run_id

    target = find_job(kube, job, selector=selector, since=since, until=until, now=now)
    explanation, timeline, link, seconds = explain_window(
        kube,
        prometheus.source(),
        target,
        store=setup.store,
        tickets=setup.tickets,
        policy=setup.rules.policy,
        step_metric=step_metric or None,
        run_id=run_id,
        now=now,
        labels=mapping,
    )
    if explanation.verdict == "no-data":
        raise InputError(nothing_to_explain(explanation))
    answered = ExplainOutcome.of(explanation, timeline=timeline, timeline_link=link, seconds=seconds)
    if not act:
        publish_explanation(answered)
        return answered

    done = act_on_suspect(
        explanation,
        kube,
        policy=setup.rules.policy,
        tickets=setup.tickets,
        audit=setup.audit,
        run_id=run_id,
        now=now,
        prefix=prefix,
        gpu_node_selector=setup.cluster.gpu_node_selector,
        evidence_link=link,
        escalation=setup.rules.escalation,
    )
    certified = None
    if done.node is not None and done.recertify == "due":
        certified = await certify(
            cluster=setup.cluster,
            store=setup.store_block,
            nodes=[done.node],
            policy=setup.policy,
            ticketing=setup.ticketing,
        )
    await apublish_audit(setup.audit)
    outcome = ExplainOutcome.of(
        explanation, timeline=timeline, timeline_link=link, seconds=seconds, act=done, certify=certified
    )
    publish_explanation(outcome)
    return outcome
