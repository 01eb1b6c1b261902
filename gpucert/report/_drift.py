"""Each drifting GPU's own history, drawn: its baseline, every night's value, where the alarm rose and cleared.

One small chart per alarmed series (GPU or node × metric, from :func:`gpucert.telemetry.drift_trace`): time
across (a rotation's gaps show), the value as a percentage of the own baseline's centre up; the dashed line
is the baseline moved by the night's fleet factor (what the detector compared with), the band ±1 σ around it.
The template writes the SVG, so every name is escaped by its autoescape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from .._templates import html_environment
from ..metrics import METRICS
from ..policy import Policy
from ..telemetry import drift_trace
from ._charts import VERDICT_COLOURS
from ._common import json_value

__all__ = ["DRIFT_TEMPLATE", "DriftChart", "DriftView", "drift_view", "render_drift_html"]

DRIFT_TEMPLATE = "report/drift.html.j2"
_W, _H = 380, 210
_LEFT, _RIGHT, _TOP, _BOTTOM = 46.0, 12.0, 26.0, 176.0
_STEPS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0)
_ALARM = VERDICT_COLOURS["fail"]
_CLEARED = "#2e7d32"
_QUIET = "#5f6368"


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    colour: str
    title: str


@dataclass(frozen=True)
class Marker:
    x: float
    y: float
    colour: str
    text: str
    text_y: float


@dataclass(frozen=True)
class Tick:
    pos: float
    label: str


@dataclass(frozen=True)
class DriftChart:
    """One series' history; coordinates in SVG pixels."""

    title: str
    subtitle: str
    reason: str
    zero_y: float
    expected: str  # polyline points: the baseline moved by each night's fleet factor
    band: str  # polygon points: ±1 σ around it
    line: str  # polyline points through the nights' values
    points: list[Point] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    x_ticks: list[Tick] = field(default_factory=list)
    # The geometry every drift chart shares.
    width: ClassVar[int] = _W
    height: ClassVar[int] = _H
    left: ClassVar[float] = _LEFT
    right: ClassVar[float] = _W - _RIGHT
    top: ClassVar[float] = _TOP
    bottom: ClassVar[float] = _BOTTOM


@dataclass(frozen=True)
class DriftView:
    """The drift section: a chart per alarmed series (the worst ``len(charts)`` of ``n_alarms``)."""

    charts: list[DriftChart]
    n_alarms: int
    n_nodes: int
    note: str

    @property
    def empty(self) -> bool:
        return self.n_alarms == 0


def _nice_step(span: float) -> float:
    for step in _STEPS:
        if span / step <= 6:
            return step
    return _STEPS[-1] * math.ceil(span / (_STEPS[-1] * 6))


def _points(xs: np.ndarray, ys: np.ndarray) -> str:
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys, strict=True))


def _chart(part: pd.DataFrame, alarm: dict[str, Any]) -> DriftChart:
    metric = str(alarm["metric"])
    unit = METRICS[metric].unit if metric in METRICS else ""
    center = float(part["center"].iloc[0])
    rel = (part["value"].to_numpy(dtype=np.float64) / center - 1) * 100
    expected = (part["fleet_factor"].to_numpy(dtype=np.float64) - 1) * 100
    band = part["sigma"].to_numpy(dtype=np.float64) / center * 100
    ts = pd.to_datetime(part["ts"], utc=True)
    micros = np.asarray(pd.DatetimeIndex(ts).as_unit("us").asi8, dtype=np.float64)

    lo = float(min(rel.min(), (expected - band).min(), -1.0))
    hi = float(max(rel.max(), (expected + band).max(), 1.0))
    step = _nice_step(hi - lo)
    lo, hi = math.floor(lo / step) * step, math.ceil(hi / step) * step
    x0, x1 = _LEFT, _W - _RIGHT
    t0, t1 = float(micros.min()), float(micros.max())

    def x_of(t: np.ndarray) -> np.ndarray:
        if t1 == t0:
            return np.full(len(t), (x0 + x1) / 2)
        return x0 + (t - t0) / (t1 - t0) * (x1 - x0)

    def y_of(r: np.ndarray | float) -> np.ndarray:
        return np.asarray(_TOP + (hi - np.asarray(r, dtype=np.float64)) / (hi - lo) * (_BOTTOM - _TOP))

    xs, ys = x_of(micros), y_of(rel)
    alarm_on = part["alarm"].to_numpy(dtype=bool)
    runs = part["run_id"].astype(str).to_numpy()
    u, stat = part["u"].to_numpy(dtype=np.float64), part["statistic"].to_numpy(dtype=np.float64)
    factor = part["fleet_factor"].to_numpy(dtype=np.float64)
    values = part["value"].to_numpy(dtype=np.float64)
    days = ts.dt.strftime("%Y-%m-%d").to_numpy()
    points = [
        Point(
            x=round(float(xs[i]), 1),
            y=round(float(ys[i]), 1),
            colour=_ALARM if alarm_on[i] else _QUIET,
            title=(
                f"{runs[i]} ({days[i]}): {values[i]:.4g} {unit}, {rel[i]:+.2f} % vs its own baseline; "
                f"fleet {(factor[i] - 1) * 100:+.2f} %, u {u[i]:+.1f} σ, statistic {stat[i]:.2f}"
                + (" — in alarm" if alarm_on[i] else "")
            ),
        )
        for i in range(len(part))
    ]
    markers = []
    for column, colour, text in (("raised", _ALARM, "alarm"), ("cleared", _CLEARED, "cleared")):
        for i in np.flatnonzero(part[column].to_numpy(dtype=bool)):
            y = float(ys[i])
            markers.append(
                Marker(
                    x=round(float(xs[i]), 1),
                    y=round(y, 1),
                    colour=colour,
                    text=text,
                    text_y=round(y - 9 if y - 9 > _TOP else y + 15, 1),
                )
            )
    y_ticks = [Tick(round(float(y_of(v)), 1), f"{v:+g} %" if v else "0") for v in np.arange(lo, hi + step / 2, step)]
    picks = sorted({0, len(part) // 2, len(part) - 1}) if len(part) > 2 else list(range(len(part)))
    x_ticks = [Tick(round(float(xs[i]), 1), str(days[i])) for i in picks]
    gpu = json_value(alarm.get("gpu"))
    where = f"{alarm['node']}/{gpu}" if gpu is not None else f"{alarm['node']} (node)"
    sigma = float(part["sigma"].iloc[-1])
    return DriftChart(
        title=f"{where} · {metric}",
        subtitle=(
            f"own baseline {center:.4g} {unit} (σ {sigma:.3g} at the last night), {len(part)} nights; "
            f"deviation since the onset {float(alarm['deviation_pct']):+.1f} %"
        ),
        reason=str(alarm.get("reason") or ""),
        zero_y=round(float(y_of(0.0)), 1),
        expected=_points(xs, y_of(expected)),
        band=_points(np.concatenate([xs, xs[::-1]]), y_of(np.concatenate([expected + band, (expected - band)[::-1]]))),
        line=_points(xs, ys),
        points=points,
        markers=markers,
        y_ticks=y_ticks,
        x_ticks=x_ticks,
    )


def drift_view(
    alarms: pd.DataFrame,
    history: pd.DataFrame,
    baseline: pd.DataFrame,
    *,
    policy: Policy | None = None,
    max_series: int = 40,
) -> DriftView:
    """The drift section for ``alarms`` (:func:`gpucert.telemetry.drift_alarms`' rows; those not in alarm
    are ignored), drawn from the ``history`` and ``baseline`` they were computed from, with the same
    ``policy``: a chart per alarmed series, worst first, at most ``max_series``."""
    flagged = alarms[alarms["alarm"].to_numpy(dtype=bool)] if len(alarms) else alarms
    n_nodes = int(flagged["node"].nunique()) if len(flagged) else 0
    if flagged.empty:
        return DriftView(charts=[], n_alarms=0, n_nodes=0, note="No GPU or node is drifting from its own baseline.")
    drawn = flagged.head(max_series)
    method = str(drawn["method"].iloc[0]) if "method" in drawn.columns else None
    trace = drift_trace(
        history,
        baseline,
        drawn,
        method=method if method in ("cusum", "ewma") else None,  # type: ignore[arg-type]
        policy=policy,
    )
    entity = np.where(
        trace["gpu_uuid"].notna().to_numpy(), trace["gpu_uuid"].astype(object), trace["node"].astype(object)
    )
    by_series = dict(list(trace.assign(_e=entity).groupby(["_e", "metric"], sort=False)))
    charts = []
    for alarm in drawn.to_dict("records"):
        key = (alarm["gpu_uuid"] if isinstance(alarm["gpu_uuid"], str) else alarm["node"], alarm["metric"])
        part = by_series.get(key)
        if part is not None and len(part):
            charts.append(_chart(part.sort_values("ts", kind="stable"), {str(k): v for k, v in alarm.items()}))
    note = f"{len(flagged):,} series in alarm on {n_nodes:,} node{'' if n_nodes == 1 else 's'}"
    note += "." if len(drawn) == len(flagged) else f"; the worst {len(drawn):,} are drawn."
    return DriftView(charts=charts, n_alarms=len(flagged), n_nodes=n_nodes, note=note)


def render_drift_html(
    alarms: pd.DataFrame,
    history: pd.DataFrame,
    baseline: pd.DataFrame,
    *,
    policy: Policy | None = None,
    title: str | None = None,
    max_series: int = 40,
) -> str:
    """A self-contained HTML page (``templates/report/drift.html.j2``) with :func:`drift_view`'s charts:
    each alarmed GPU's own baseline, every night's value and the alarm point. Raises
    ``jinja2.TemplateError`` when the template is broken."""
    view = drift_view(alarms, history, baseline, policy=policy, max_series=max_series)
    measured = None
    if len(history):
        last = pd.to_datetime(history["ts"], utc=True).max()
        measured = None if pd.isna(last) else last.strftime("%Y-%m-%d %H:%M UTC")
    template = html_environment().get_template(DRIFT_TEMPLATE)
    return template.render(title=title or "gpucert drift report", drift=view, measured=measured)
