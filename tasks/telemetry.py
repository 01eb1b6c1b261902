"""operate's watch between certifications: passive telemetry judged by the gates, slow drift on each
GPU's own history. Both only *ask* for re-certification; neither taints anything by itself."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from prefect import get_run_logger, task
from prefect.artifacts import create_link_artifact
from prefect.cache_policies import NO_CACHE

from gpucert.kube import Kube
from gpucert.operate import TelemetryCoverage, counted, telemetry_coverage
from gpucert.policy import Policy
from gpucert.report import render_drift_html
from gpucert.stack import exporter_sources
from gpucert.store import BaselineStore
from gpucert.telemetry import ExporterScrape, PrometheusSource, check_drift
from gpucert.verdict import judge

from ._retry import may_pass

__all__ = ["drift_check", "telemetry_check"]


@task(name="telemetry", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=may_pass)
def telemetry_check(
    kube: Kube,
    store: BaselineStore,
    *,
    run_id: str,
    namespace: str,
    prometheus: PrometheusSource | None,
    since_h: float,
    scrape_interval_s: float,
    policy: Policy,
    gpu_nodes: Sequence[str],
) -> tuple[dict[str, str], TelemetryCoverage]:
    """Read the DCGM telemetry of the last ``since_h`` hours (from ``prometheus`` when given, with its
    credentials and TLS settings, else from the exporters scraped directly: gpucert's own in ``namespace``
    and the GPU Operator's where it runs the stack) and judge it by the gates;
    returns node → why it should be re-certified, and which of ``gpu_nodes`` (the GPU nodes in scope) it
    read, which not and why, and whether it read any (a night that read none is not a clean one).

    Raises ``gpucert.telemetry.PrometheusAuthError`` (not retried) when Prometheus refuses the
    credentials, ``TelemetryError`` when it cannot be read at all."""
    if prometheus is not None:
        now = datetime.now(UTC)
        telemetry = prometheus.read(now - timedelta(hours=since_h), now, run_id=run_id, nodes=gpu_nodes)
    else:
        # gpucert's own exporter, the GPU Operator's, or both: whichever installer runs the stack.
        scrape = ExporterScrape(kube, sources=exporter_sources(kube, namespace))
        telemetry = scrape.read(run_id=run_id, interval_s=scrape_interval_s, nodes=gpu_nodes)
    asked: dict[str, str] = {}
    if len(telemetry.results):
        verdicts = judge(telemetry.results, store.read(), policy)
        flagged = verdicts[verdicts["verdict"].isin(["fail", "warn"]) & verdicts["node"].notna()]
        for node, rows in flagged.groupby("node", observed=True, sort=True):
            first = rows.iloc[0]
            asked[str(node)] = f"telemetry: {str(first['reasons']).split(';')[0]}"
    coverage = telemetry_coverage(telemetry, gpu_nodes)
    log = get_run_logger()
    log.info(
        "telemetry (%s): %s asked for re-certification; read on %s, unread on %s",
        telemetry.source,
        counted(len(asked), "node"),
        counted(len(coverage.read), "node"),
        counted(len(coverage.unread), "node"),
    )
    for node, why in coverage.unread.items():
        log.warning("telemetry of %s unread: %s", node, why)
    if coverage.missing:
        log.error("%s: this night judged no telemetry", coverage.missing)
    return asked, coverage


@task(name="drift", cache_policy=NO_CACHE)
def drift_check(store: BaselineStore, policy: Policy) -> dict[str, str]:
    """The policy's drift chart over each GPU's own last certifications (``policy.drift``); returns node →
    why it should be re-certified (its worst alarm)."""
    drift = check_drift(store, policy)
    asked = drift.asked()
    get_run_logger().info(
        "drift: %d series in alarm; %s asked to re-certify", len(drift.alarms), counted(len(asked), "node")
    )
    if len(drift.alarms):
        # Each flagged GPU's history for a person: its own baseline, every night, the alarm point.
        html = render_drift_html(drift.alarms, drift.history, drift.baseline, policy=policy)
        key = f"operate/date={datetime.now(UTC):%Y-%m-%d}/drift.html"
        store.objects.put(key, html.encode("utf-8"))
        create_link_artifact(key="operate-drift", link=store.link(key), link_text="drift: each flagged GPU's history")
    return asked
