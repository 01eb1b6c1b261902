"""Operate: the nightly round — re-certify the nodes due, and leave a fleet report.

The runbook:

1. choose tonight's nodes: every GPU node is re-certified within ``rotation_days``; idle nodes only; no
   more than ``max_nodes`` at once;
2. certify them (the certify flow: benchmarks, verdicts, labels, confirmed taints, baselines, report);
3. leave a fleet report.
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

__all__ = ["operate"]


@flow(name="operate", log_prints=False)
async def operate(
    cluster: GpuCluster | None = None,
    store: BaselineStore | None = None,
    rotation_days: float = 7.0,
    max_nodes: int = 64,
    pod_annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One night: choose the nodes due, certify them, report; returns what was done."""
    log = get_run_logger()
    cluster = cluster or GpuCluster()
    kube = cluster.kube()
    nodes = kube.nodes(cluster.gpu_node_selector)
    due = due_nodes(
        nodes, now=datetime.now(UTC), rotation_days=rotation_days, max_nodes=max_nodes,
        busy=busy_nodes(kube, prefix=cluster.label_prefix), prefix=cluster.label_prefix,
    )  # fmt: skip
    log.info("%d nodes due tonight, %d postponed", len(due.chosen), len(due.postponed))
    result: dict[str, Any] = {"due": due.chosen, "postponed": due.postponed, "certify": None}
    if due.chosen:
        result["certify"] = await certify(
            cluster=cluster, store=store, nodes=due.chosen, pod_annotations=pod_annotations
        )
    await acreate_markdown_artifact(
        key="operate-night", markdown=_fleet_report(result), description="operate"
    )
    return result


def _fleet_report(result: dict[str, Any]) -> str:
    lines = ["# operate: tonight", "", f"{len(result['due'])} nodes re-certified"]
    cert = result["certify"]
    if cert:
        lines.append(f"states: {cert['states']}; tainted: {', '.join(cert['tainted']) or 'none'}")
        lines.append(f"report: {cert['report']}")
    if result["postponed"]:
        lines.append(f"postponed: {', '.join(f'{n} ({w})' for n, w in sorted(result['postponed'].items()))}")
    return "\n".join(lines) + "\n"
