"""Passive telemetry and drift detection for the operate stage (docs/design/operate.md; docs/reference/telemetry.md).

Between certifications gpucert watches, without touching a GPU, the DCGM telemetry since the last run — from
Prometheus (:class:`PrometheusSource`) or scraped from the exporters (:class:`ExporterScrape`), as rows of the
results contract that the verdict engine's hard gates judge; what could not be read is a per-node problem, never
an invented number — and slow drift on each GPU's own history (:func:`history_from_store`, :func:`drift_alarms`,
:func:`drift_trace`, all from a store with :func:`check_drift`), which asks for a re-certification, no more.
Nothing here imports Prefect::

    seen = PrometheusSource(url, basic_auth=("gpucert", password)).read(start=last_run_at, run_id="operate-1")
    verdicts = judge(seen.results, baseline)             # the Stage 0 gates on the window's telemetry
    check_drift(store, policy).asked()                    # node → why it should be re-certified
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
