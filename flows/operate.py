"""Operate: the nightly round — watch, re-certify what is due or suspect, ticket, report.

The runbook:

1. read the passive DCGM telemetry since the last night (Prometheus' HTTP API when configured, else the
   exporters scraped directly) and judge it by the gates: a node whose telemetry fails asks to be
   re-certified;
2. look for slow drift on each GPU's own history (CUSUM): a drifting GPU asks to be re-certified too —
   neither telemetry nor drift acts alone;
3. choose tonight's nodes: those that asked first, then every GPU node due within ``rotation_days``; idle
   nodes only; no more than ``max_nodes``;
4. certify them (benchmarks, verdicts, labels, confirmed taints, baselines, tickets, report);
5. leave a fleet report.
"""

from datetime import UTC, datetime
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact

from blocks.cluster import GpuCluster
from blocks.store import BaselineStore
from flows.certify import certify
from gpucert.certify import busy_nodes
from gpucert.operate import due_nodes
from gpucert.policy import load_policy
from tasks.telemetry import drift_check, telemetry_check

__all__ = ["operate"]


@flow(name="operate", log_prints=False)
async def operate(
    cluster: GpuCluster | None = None,
    store: BaselineStore | None = None,
    rotation_days: float = 7.0,
    max_nodes: int = 64,
    prometheus_url: str | None = None,
    telemetry_hours: float = 24.0,
    scrape_interval_s: float = 60.0,
    policy_file: str | None = None,
    pod_annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One night (see the module docstring); returns what was watched, chosen and found.

    ``prometheus_url`` reads telemetry of the last ``telemetry_hours`` from Prometheus; without it the
    exporters are scraped twice, ``scrape_interval_s`` apart.
    """
    log = get_run_logger()
    cluster = cluster or GpuCluster()
    kube = cluster.kube()
    policy = load_policy(policy_file)
    now = datetime.now(UTC)
    baseline_store = (store or BaselineStore.default()).open()
    asked, unreadable = telemetry_check(
        kube, baseline_store, run_id=f"telemetry-{now:%Y%m%d-%H%M%S}", namespace=cluster.stack_namespace,
        prometheus_url=prometheus_url, since_h=telemetry_hours, scrape_interval_s=scrape_interval_s, policy=policy,
    )  # fmt: skip
    drifting = drift_check(baseline_store, policy)
    for node, why in drifting.items():
        asked.setdefault(node, why)
    nodes = kube.nodes(cluster.gpu_node_selector)
    due = due_nodes(
        nodes, now=now, rotation_days=rotation_days, max_nodes=max_nodes, asked=asked,
        busy=busy_nodes(kube, prefix=cluster.label_prefix), prefix=cluster.label_prefix,
    )  # fmt: skip
    log.info("%d nodes due tonight (%d asked by telemetry or drift), %d postponed",
             len(due.chosen), len(asked), len(due.postponed))  # fmt: skip
    result: dict[str, Any] = {"due": due.chosen, "postponed": due.postponed, "asked": asked,
                              "drift": drifting, "unreadable": unreadable, "certify": None}  # fmt: skip
    if due.chosen:
        result["certify"] = await certify(
            cluster=cluster,
            store=store,
            nodes=due.chosen,
            pod_annotations=pod_annotations,
            policy_file=policy_file,
        )
    await acreate_markdown_artifact(
        key="operate-night", markdown=_fleet_report(result), description="operate"
    )
    return result


def _fleet_report(result: dict[str, Any]) -> str:
    lines = ["# operate: tonight", "", f"{len(result['due'])} nodes re-certified"]
    for node, why in sorted(result["asked"].items()):
        lines.append(f"- {node} asked: {why}")
    if result["unreadable"]:
        lines.append(
            f"telemetry unreadable: {', '.join(f'{n} ({w})' for n, w in sorted(result['unreadable'].items()))}"
        )
    cert = result["certify"]
    if cert:
        lines.append(f"states: {cert['states']}; tainted: {', '.join(cert['tainted']) or 'none'}")
        changes = ", ".join(f"{e['kind']} {e['ticket']} ({e['node']} {e['cause']})" for e in cert["tickets"])
        lines.append(f"tickets: {changes or 'no change'}")
        lines.append(f"report: {cert['report']}")
    if result["postponed"]:
        lines.append(f"postponed: {', '.join(f'{n} ({w})' for n, w in sorted(result['postponed'].items()))}")
    return "\n".join(lines) + "\n"
