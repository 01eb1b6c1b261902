"""Passive telemetry and drift detection for the operate stage (docs/design/operate.md; docs/reference/telemetry.md).

Between certifications gpucert watches two things, both without touching a GPU:

* **DCGM telemetry since the last run** — :class:`PrometheusSource` reads it from Prometheus' HTTP API
  (either host label, ``Hostname`` or ``hostname``), with the credentials and TLS checks a secured
  server needs (basic auth, a bearer token or other headers, a private CA; a refusal is a
  :class:`PrometheusAuthError`); :class:`ExporterScrape` scrapes the DCGM exporters
  directly where no Prometheus is configured. Both return a :class:`Telemetry` whose ``results`` are rows
  of the results contract (docs/design/data-contracts.md, "Results": the registry's telemetry metrics per GPU,
  XID events, GPU counts per node, and from Prometheus the node's RDMA ports, node-exporter's infiniband
  collector), so the verdict engine's hard gates judge them as they judge a certification's
  telemetry; what could not be read is a per-node problem, never an invented number.
* **Slow drift on each GPU's own history** — :func:`history_from_store` gathers each GPU's own last N
  certifications (per-run medians and the repeats' spread) from the store's runs, and
  :func:`drift_alarms` runs a lower CUSUM or EWMA per GPU × metric against its own baseline, calibrated
  by the repeats' noise and with the night's fleet-wide shift removed; :func:`drift_trace` gives the
  night-by-night statistic for a report, :func:`check_drift` all three from a store. A drift alarm asks
  for a re-certification; it never drains or taints on its own.

Nothing here imports Prefect::

    source = PrometheusSource("https://prometheus.monitoring:9090", basic_auth=("gpucert", password),
                              verify="/etc/ssl/monitoring-ca.pem")
    seen = source.read(start=last_run_at, run_id="operate-2026-11-02")
    verdicts = judge(seen.results, baseline)             # the Stage 0 gates on the window's telemetry

    drift = check_drift(store, policy)                    # history, baseline, alarms
    drift.asked()                                         # node → why it should be re-certified
"""

from ._common import HOST_LABELS, NIC_SERIES, SIGNALS, Signal, Telemetry, TelemetryError
from ._drift import (
    DRIFT_COLUMNS,
    DRIFT_METRICS,
    HISTORY_COLUMNS,
    TRACE_COLUMNS,
    DriftCheck,
    check_drift,
    drift_alarms,
    drift_trace,
    ewma_limit,
    history_from_store,
    run_medians,
)
from ._prometheus import PrometheusAuthError, PrometheusSource, PromSeries
from ._scrape import (
    EXPORTER_SELECTOR,
    METRICS_PATH_ANNOTATION,
    OPERATOR_EXPORTER_SELECTOR,
    ExporterScrape,
    ExporterSource,
    ExporterTarget,
)

__all__ = [
    "DRIFT_COLUMNS",
    "DRIFT_METRICS",
    "EXPORTER_SELECTOR",
    "HISTORY_COLUMNS",
    "HOST_LABELS",
    "METRICS_PATH_ANNOTATION",
    "NIC_SERIES",
    "OPERATOR_EXPORTER_SELECTOR",
    "SIGNALS",
    "TRACE_COLUMNS",
    "DriftCheck",
    "ExporterScrape",
    "ExporterSource",
    "ExporterTarget",
    "PromSeries",
    "PrometheusAuthError",
    "PrometheusSource",
    "Signal",
    "Telemetry",
    "TelemetryError",
    "check_drift",
    "drift_alarms",
    "drift_trace",
    "ewma_limit",
    "history_from_store",
    "run_medians",
]
