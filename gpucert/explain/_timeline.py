"""The picture of ``gpucert explain``: one self-contained HTML page, every signal on one time axis.

From the top: the answer in three lines; the job's step time (median per bucket with its min–max envelope, the
step-time change and the stalls marked, events as markers); then one lane per node, suspects first, each with its
GPUs' SM clock, slowdown reasons, temperature and power; last the suspects' evidence, recommendations and notes. A
lane draws its GPUs as a min–max envelope over at most :data:`MAX_BUCKETS` time buckets plus their mean; only suspect
GPUs are drawn in full, against the job's peer median, so a 512-GPU job is a few hundred paths, not 512 lines of 1,440
points. Events are markers on the shared axis, drawn across every lane. Geometry is computed here with numpy;
``templates/explain.html.j2`` writes it, escaping every name (node, pod, event note) through Jinja's autoescape. No
script, nothing fetched.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from .._templates import html_environment
from ._diagnose import DISRUPTIVE_REASONS, SLOWDOWN_BITS, _Event, _nanmedian, _secs
from ._frames import Explanation, Suspect, check_frame
from ._grid import FloatArray, Grid, bucket_ends, equal_runs, telemetry_grid, to_ns

__all__ = ["MAX_BUCKETS", "MAX_LANES", "TEMPLATE", "render_timeline"]

TEMPLATE = "explain.html.j2"
#: Time buckets per lane (and for the step-time chart): 480 across the 960 px plot, two pixels each.
MAX_BUCKETS = 480
#: Lanes drawn; past this many nodes the rest (never a suspect's) are summed up in one lane.
MAX_LANES = 96
_MAX_FULL_POINTS = 2000  # a suspect GPU "in full": every instant, up to this many
_MAX_EVENT_MARKERS = 200

PLOT_W = 960.0
LABEL_W = 190.0
_STEP_H = 150.0
_TRACKS = (  # (signal, label, unit, height)
    ("sm_clock_mhz", "SM clock", "MHz", 46.0),
    ("temp_c", "temperature", "°C", 30.0),
    ("power_w", "power", "W", 30.0),
)
_REASONS_H = 9.0
_GAP = 5.0
_HARD_MASK = 0x08 | 0x40 | 0x80 | 0x20  # the power cap alone is normal at full load: not shaded
_THERMAL = 0x40 | 0x20
_POWER = 0x80
_REASON_COLOURS = {"thermal": "#d84315", "power": "#6a1b9a", "slowdown": "#c62828", "cap": "#f0c36d"}
_SUSPECT_COLOURS = ("#c62828", "#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a")


@dataclass(frozen=True)
class Path:
    """An SVG path: ``d`` holds only numbers and the letters M, L, Z."""

    d: str
    css: str
    colour: str = ""
    title: str = ""


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    w: float
    h: float
    css: str
    colour: str = ""
    opacity: float = 1.0
    title: str = ""


@dataclass(frozen=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True)
class Marker:
    x: float
    css: str
    title: str
    glyph: str


@dataclass(frozen=True)
class Track:
    label: str
    unit: str
    y: float
    h: float
    lo: str
    hi: str
    paths: tuple[Path, ...]


@dataclass(frozen=True)
class Lane:
    """One node's lane: its tracks, its slowdown strips and whether (and how) it is a suspect."""

    node: str
    title: str
    css: str
    badge: str
    height: float
    tracks: tuple[Track, ...]
    strips: tuple[tuple[str, float, tuple[Rect, ...]], ...]  # (label, y, rects)
    note: str


@dataclass(frozen=True)
class StepChart:
    height: float
    lo: str
    hi: str
    paths: tuple[Path, ...]
    labels: tuple[tuple[float, float, str], ...]
    empty: bool


# --- geometry ---------------------------------------------------------------------------------------------------


def _points(xs: FloatArray, ys: FloatArray) -> str:
    """``Mx,y Lx,y …`` over the finite points; a NaN breaks the line (a new ``M``)."""
    ok = np.isfinite(xs) & np.isfinite(ys)
    if not ok.any():
        return ""
    starts = ok & ~np.concatenate([[False], ok[:-1]])
    idx = np.flatnonzero(ok)
    x_r = np.round(xs[idx], 1).tolist()
    y_r = np.round(ys[idx], 1).tolist()
    first = starts[idx].tolist()
    return " ".join(f"{'M' if m else 'L'}{x:.1f},{y:.1f}" for m, x, y in zip(first, x_r, y_r, strict=True))


def _band(xs: FloatArray, lo: FloatArray, hi: FloatArray) -> str:
    """A closed envelope between ``lo`` and ``hi`` for every finite run (one subpath per run)."""
    ok = np.isfinite(xs) & np.isfinite(lo) & np.isfinite(hi)
    if not ok.any():
        return ""
    out = []
    idx = np.flatnonzero(ok)
    runs = np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1)
    for run in runs:
        up = _points(xs[run], hi[run])
        down = _points(xs[run][::-1], lo[run][::-1]).replace("M", "L", 1)
        out.append(f"{up} {down} Z")
    return " ".join(out)


def _scale(values: Sequence[FloatArray], pad: float = 0.06) -> tuple[float, float]:
    finite = np.concatenate([v[np.isfinite(v)] for v in values])
    if not finite.size:
        return 0.0, 1.0
    lo, hi = float(finite.min()), float(finite.max())
    if hi - lo < 1e-9:
        lo, hi = lo - 1.0, hi + 1.0
    span = hi - lo
    return lo - pad * span, hi + pad * span


def _y(values: FloatArray, lo: float, hi: float, top: float, height: float) -> FloatArray:
    return np.asarray(top + height * (1 - (values - lo) / (hi - lo)), dtype=np.float64)


def _label(value: float) -> str:
    if not math.isfinite(value):
        return ""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _ticks(lo: pd.Timestamp, hi: pd.Timestamp, with_date: bool) -> list[Tick]:
    span_min = max(1e-9, (hi - lo).total_seconds() / 60)
    step = next(
        (m for m in (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880, 10080) if span_min / m <= 10), 10080
    )
    first = lo.ceil(f"{step}min") if step < 1440 else lo.ceil("1D")
    fmt = "%m-%d %H:%M" if with_date else "%H:%M"
    return [Tick(round(_x_of(t, lo, hi), 1), t.strftime(fmt)) for t in pd.date_range(first, hi, freq=f"{step}min")]


def _x_of(ts: pd.Timestamp, lo: pd.Timestamp, hi: pd.Timestamp) -> float:
    span = (hi - lo).total_seconds() or 1.0
    return PLOT_W * (ts - lo).total_seconds() / span


def _infer_step_s(telemetry: pd.DataFrame) -> float:
    """The scrape interval: the most common gap between the telemetry's distinct instants (15 s if unknown)."""
    if not len(telemetry):
        return 15.0
    gaps = np.diff(np.unique(to_ns(telemetry["ts"])))  # distinct instants, in order: every gap is positive
    if not gaps.size:
        return 15.0
    values, counts = np.unique(gaps, return_counts=True)
    return float(values[counts.argmax()]) / 1e9


def _bucketed(
    matrix: FloatArray, starts: npt.NDArray[np.int64]
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Per time bucket and column: min, max, sum and count of the finite values."""
    finite = np.isfinite(matrix)
    lo = np.fmin.reduceat(matrix, starts, axis=0)
    hi = np.fmax.reduceat(matrix, starts, axis=0)
    total = np.add.reduceat(np.where(finite, matrix, 0.0), starts, axis=0)
    count = np.add.reduceat(finite.astype(np.float64), starts, axis=0)
    return lo, hi, total, count


# --- the page ---------------------------------------------------------------------------------------------------


def _step_chart(steps: pd.DataFrame, explanation: Explanation, lo: pd.Timestamp, hi: pd.Timestamp) -> StepChart:
    height = _STEP_H
    top, plot_h = 8.0, height - 22.0
    ts = to_ns(steps["ts"]) if len(steps) else np.zeros(0, dtype=np.int64)
    secs = steps["step_time_s"].to_numpy(dtype=np.float64, na_value=np.nan) if len(steps) else np.zeros(0)
    lo_ns, hi_ns = lo.value, hi.value
    ok = np.isfinite(secs) & (secs > 0) & (ts >= lo_ns) & (ts <= hi_ns)
    ts, secs = ts[ok], secs[ok]
    if not len(ts):
        return StepChart(height, "", "", (), (), True)
    span = max(1, hi_ns - lo_ns)
    bucket = np.minimum(((ts - lo_ns) / span * MAX_BUCKETS).astype(np.int64), MAX_BUCKETS - 1)
    agg = pd.Series(secs).groupby(bucket).agg(["min", "max", "median"]).reindex(range(MAX_BUCKETS))
    series = {col: agg[col].to_numpy(dtype=np.float64) for col in agg}
    # The axis stops at the 99.5th percentile of the buckets' maxima, so one stalled step does not flatten the rest.
    ceiling = float(np.nanpercentile(series["max"], 99.5))
    y_lo, y_hi = 0.0, max(ceiling, float(np.nanmax(series["median"]))) * 1.08
    xs = (np.arange(MAX_BUCKETS) + 0.5) * PLOT_W / MAX_BUCKETS

    def y(values: FloatArray) -> FloatArray:
        return _y(values, y_lo, y_hi, top, plot_h)

    paths = [
        Path(_band(xs, y(series["min"]), y(np.minimum(series["max"], y_hi))), "envelope"),
        Path(_points(xs, y(series["median"])), "median"),
    ]
    labels: list[tuple[float, float, str]] = []
    change = explanation.step_change
    if change is not None:
        x_at = _x_of(change.at, lo, hi)
        y_b, y_a = (float(v) for v in y(np.array([change.before_s, min(change.after_s, y_hi)])))
        paths.append(Path(f"M0,{y_b:.1f} L{x_at:.1f},{y_b:.1f} M{x_at:.1f},{y_a:.1f} L{PLOT_W:.1f},{y_a:.1f}", "level"))
        paths.append(Path(f"M{x_at:.1f},{top:.1f} L{x_at:.1f},{top + plot_h:.1f}", "change"))
        text = f"{_secs(change.before_s)} s → {_secs(change.after_s)} s ({change.change_pct:+.0f} %)"
        labels.append((min(x_at + 4, PLOT_W - 160), top + plot_h - 14, text))
    return StepChart(height, _label(y_lo), _label(y_hi), tuple(paths), tuple(labels), False)


def _stalls(steps: pd.DataFrame, lo: pd.Timestamp, hi: pd.Timestamp) -> list[tuple[float, float]]:
    """Gaps in the logged steps far longer than the usual gap (x from, x to), as the diagnosis finds them."""
    if len(steps) < 3:
        return []
    ts = np.unique(to_ns(steps["ts"]))
    ts = ts[(ts >= lo.value) & (ts <= hi.value)]
    secs = steps["step_time_s"].to_numpy(dtype=np.float64, na_value=np.nan)
    med = float(np.nanmedian(secs)) if np.isfinite(secs).any() else 1.0
    if len(ts) < 3:
        return []
    gaps = np.diff(ts)
    limit = max(10 * med * 1e9, 4 * float(np.median(gaps)), 30e9)
    out = []
    for i in np.flatnonzero(gaps > limit)[:100]:
        a = pd.Timestamp(int(ts[i]), unit="ns", tz="UTC")
        b = pd.Timestamp(int(ts[i + 1]), unit="ns", tz="UTC")
        out.append((_x_of(a, lo, hi), _x_of(b, lo, hi)))
    return out


def _reason_rects(frac: FloatArray, xs0: FloatArray, xs1: FloatArray, y: float) -> list[Rect]:
    """Runs of equal shading level (quarters of the share of a node's samples with a hard slowdown reason) as
    rectangles."""
    level = np.where(np.isfinite(frac), np.ceil(np.clip(frac, 0, 1) * 4) / 4, 0.0)
    return [
        Rect(
            round(float(xs0[i]), 1),
            y,
            round(float(xs1[j] - xs0[i]), 1),
            _REASONS_H - 1,
            "reason-share",
            "#c62828",
            float(level[i]),
            f"GPUs of this node with a HW/SW slowdown reason: up to {level[i]:.0%} of samples".replace("%", " %"),
        )
        for i, j in equal_runs(level)
        if level[i] > 0
    ]


def _suspect_reason_rects(bits: FloatArray, xs0: FloatArray, xs1: FloatArray, y: float) -> list[Rect]:
    """One GPU's reasons per bucket, coloured by the dominant kind: thermal, power brake, other HW slowdown, cap."""
    b = np.where(np.isfinite(bits), bits, 0).astype(np.int64)
    masks = (_THERMAL, _POWER, 0x08, 0x04)  # the first kind set wins
    kind = np.select([(b & mask) != 0 for mask in masks], ["thermal", "power", "slowdown", "cap"], "")
    return [
        Rect(
            round(float(xs0[i]), 1),
            y,
            round(max(0.6, float(xs1[j] - xs0[i])), 1),
            _REASONS_H - 1,
            "reason",
            _REASON_COLOURS[str(kind[i])],
            1.0,
            ", ".join(name for bit, name in SLOWDOWN_BITS.items() if any((b[i : j + 1] & bit) != 0)),
        )
        for i, j in equal_runs(kind)
        if kind[i]
    ]


def _lanes(grid: Grid, explanation: Explanation, lo: pd.Timestamp, hi: pd.Timestamp) -> tuple[list[Lane], str]:
    """One lane per node (suspects first), capped at :data:`MAX_LANES`; and a note on what was left out."""
    if grid.empty:
        return [], ""
    nodes = np.asarray(grid.nodes, dtype=object)
    node_names, node_start = np.unique(nodes, return_index=True)
    order = np.argsort(node_start)
    node_names, node_start = node_names[order], node_start[order]
    starts_t = bucket_ends(grid.n_times, MAX_BUCKETS)
    t_ns = grid.t0_ns + grid.step_ns * starts_t
    ends_ns = np.append(t_ns[1:], grid.t0_ns + grid.step_ns * grid.n_times)
    span = max(1, hi.value - lo.value)
    xs0 = PLOT_W * (t_ns - lo.value) / span
    xs1 = PLOT_W * (ends_ns - lo.value) / span
    xs = (xs0 + xs1) / 2
    full_xs = PLOT_W * (grid.t0_ns + grid.step_ns * np.arange(grid.n_times) - lo.value) / span

    badges: dict[str, list[tuple[int, Suspect]]] = {}  # node → its suspects, with their rank
    for rank, suspect in enumerate(explanation.suspects, start=1):
        badges.setdefault(suspect.node, []).append((rank, suspect))
    ranked = [s.node for s in explanation.suspects]
    index_of = {str(n): i for i, n in enumerate(node_names)}
    lane_nodes = [n for n in dict.fromkeys(ranked) if n in index_of]
    rest = [str(n) for n in node_names if str(n) not in badges]
    room = max(0, MAX_LANES - len(lane_nodes))
    lane_nodes += rest[:room]
    left_out = rest[room:]

    # Per signal: bucketed min/max/mean of every column, then per node across its columns.
    node_bounds = np.append(node_start, grid.n_columns)
    per_signal: dict[str, tuple[FloatArray, FloatArray, FloatArray, float, float, FloatArray]] = {}
    for signal, _, _, _ in _TRACKS:
        m = grid.values.get(signal)
        if m is None:
            continue
        b_lo, b_hi, b_sum, b_cnt = _bucketed(m, starts_t)
        n_lo = np.fmin.reduceat(b_lo, node_start, axis=1)
        n_hi = np.fmax.reduceat(b_hi, node_start, axis=1)
        n_mean = _mean(np.add.reduceat(b_sum, node_start, axis=1), np.add.reduceat(b_cnt, node_start, axis=1))
        peer = _nanmedian(m, axis=1)
        y_lo, y_hi = _scale([n_lo, n_hi])
        per_signal[signal] = (n_lo, n_hi, n_mean, y_lo, y_hi, peer)
    reasons = grid.values.get("clock_event_reasons")
    hard_frac = None
    if reasons is not None:
        bits = np.where(np.isfinite(reasons), reasons, 0).astype(np.int64)
        hard = np.where(np.isfinite(reasons), (bits & _HARD_MASK) != 0, np.nan)
        _, _, h_sum, h_cnt = _bucketed(hard, starts_t)
        hard_frac = _mean(np.add.reduceat(h_sum, node_start, axis=1), np.add.reduceat(h_cnt, node_start, axis=1))

    col_of = {(grid.nodes[c], grid.index[c]): c for c in range(grid.n_columns)}
    lanes: list[Lane] = []
    for node in lane_nodes:
        k = index_of[node]
        suspects_here = badges.get(node, [])
        tracks: list[Track] = []
        y = 4.0
        strips: list[tuple[str, float, tuple[Rect, ...]]] = []
        full_cols = [(rank, s, col_of.get((node, s.gpu if s.gpu is not None else -1))) for rank, s in suspects_here]
        full_cols = [(rank, s, c) for rank, s, c in full_cols if c is not None and s.gpu is not None]
        for signal, label, unit, height in _TRACKS:
            if signal not in per_signal:
                continue
            n_lo, n_hi, n_mean, y_lo, y_hi, peer = per_signal[signal]
            ys = functools.partial(_y, lo=y_lo, hi=y_hi, top=y, height=height)
            paths = [
                Path(_band(xs, ys(n_lo[:, k]), ys(n_hi[:, k])), "envelope"),
                Path(_points(xs, ys(n_mean[:, k])), "mean"),
            ]
            if full_cols:
                paths.append(Path(_points(xs, ys(_bucket_mean(peer, starts_t))), "peer"))
                m = grid.values[signal]
                for rank, s, c in full_cols:
                    colour = _SUSPECT_COLOURS[(rank - 1) % len(_SUSPECT_COLOURS)]
                    values, px = _full(m[:, c], full_xs)
                    paths.append(Path(_points(px, ys(values)), "suspect-line", colour, f"suspect {rank}: GPU {s.gpu}"))
            tracks.append(Track(label, unit, y, height, _label(y_lo), _label(y_hi), tuple(paths)))
            y += height + _GAP
            if signal == "sm_clock_mhz" and hard_frac is not None:
                strips.append(("reasons", y, tuple(_reason_rects(hard_frac[:, k], xs0, xs1, y))))
                y += _REASONS_H + 1
                for _, s, c in full_cols:
                    assert reasons is not None
                    bits_b = _bucket_or(reasons[:, c], starts_t)
                    strips.append((f"GPU {s.gpu}", y, tuple(_suspect_reason_rects(bits_b, xs0, xs1, y))))
                    y += _REASONS_H + 1
                y += _GAP
        n_gpus = int(node_bounds[k + 1] - node_bounds[k])
        if suspects_here:
            rank, top = suspects_here[0]
            what = (
                {"network": "network", "event": "event"}.get(top.layer, "node") if top.gpu is None else f"GPU {top.gpu}"
            )
            badge = f"suspect {rank}: {what}"
            css = "lane suspect" if rank == 1 else "lane suspect other"
            note = top.evidence[0] if top.evidence else ""
            pods = sorted({p for p, n in zip(grid.pods, grid.nodes, strict=True) if n == node and p})
        else:
            badge, css, note, pods = "", "lane", "", []
        title = f"{node} — {n_gpus} GPU{'s' if n_gpus != 1 else ''}" + (f", pod {', '.join(pods)}" if pods else "")
        lanes.append(Lane(node, title, css, badge, y + 2, tuple(tracks), tuple(strips), note))
    if not left_out:
        return lanes, ""
    nodes_word = "nodes" if len(left_out) != 1 else "node"
    return lanes, f"{len(left_out):,} more {nodes_word} without a suspect are not drawn (at most {MAX_LANES} lanes)"


def _mean(total: FloatArray, count: FloatArray) -> FloatArray:
    """``total / count``, NaN where nothing was counted."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(total / count, dtype=np.float64)


def _bucket_mean(values: FloatArray, starts: npt.NDArray[np.int64]) -> FloatArray:
    _, _, total, count = _bucketed(values, starts)
    return _mean(total, count)


def _bucket_or(bits: FloatArray, starts: npt.NDArray[np.int64]) -> FloatArray:
    known = np.isfinite(bits)
    b = np.where(known, bits, 0).astype(np.int64)
    out = np.bitwise_or.reduceat(b, starts).astype(np.float64)
    seen = np.add.reduceat(known.astype(np.int64), starts) > 0
    return np.where(seen, out, np.nan)


def _full(values: FloatArray, xs: FloatArray) -> tuple[FloatArray, FloatArray]:
    """One GPU's series at every instant, averaged in pairs (or more) only past :data:`_MAX_FULL_POINTS`."""
    n = len(values)
    if n <= _MAX_FULL_POINTS:
        return values, xs
    starts = bucket_ends(n, _MAX_FULL_POINTS)
    return _bucket_mean(values, starts), _bucket_mean(xs, starts)


def _markers(
    events: pd.DataFrame, explanation: Explanation, lo: pd.Timestamp, hi: pd.Timestamp, with_date: bool
) -> list[Marker]:
    if not len(events):
        return []
    ts = pd.DatetimeIndex(events["ts"])
    keep = np.asarray((ts >= lo) & (ts <= hi))
    part = events.loc[keep].assign(at_=ts[keep]).sort_values("at_", kind="stable")
    blamed = {s.onset for s in explanation.suspects if s.layer == "event"}
    out = []
    for r in part.head(_MAX_EVENT_MARKERS).to_dict("records"):
        e = _Event.of(r, pd.Timestamp(r["at_"]))
        warning = e.type == "Warning" or e.reason in DISRUPTIVE_REASONS
        css = "event suspect" if e.ts in blamed and warning else ("event warning" if warning else "event normal")
        out.append(Marker(round(_x_of(e.ts, lo, hi), 1), css, e.line(with_date), "▼" if warning else "▽"))
    return out


def render_timeline(
    explanation: Explanation,
    *,
    telemetry: pd.DataFrame,
    steps: pd.DataFrame,
    events: pd.DataFrame,
    step_s: float | None = None,
    title: str | None = None,
) -> str:
    """The job's timeline (see the module docstring) as one self-contained HTML page, returned as a string.

    ``step_s`` is the scrape interval of ``telemetry`` (found from the data when not given). Raises
    :class:`~gpucert.errors.InputError` when a frame breaks the contract.
    """
    for name, frame in (("telemetry", telemetry), ("steps", steps), ("events", events)):
        check_frame(name, frame)
    lo, hi = explanation.window
    with_date = lo.normalize() != hi.normalize()
    if step_s is None:
        step_s = _infer_step_s(telemetry)
    signals = (*tuple(s for s, _, _, _ in _TRACKS), "clock_event_reasons")
    grid = telemetry_grid(telemetry, step_s=step_s, window=explanation.window, signals=signals)
    lanes, lanes_note = _lanes(grid, explanation, lo, hi)
    chart = _step_chart(steps, explanation, lo, hi)
    stalls = [
        Rect(round(a, 1), 8.0, round(max(1.0, b - a), 1), chart.height - 22.0, "stall", title="steps stalled")
        for a, b in _stalls(steps, lo, hi)
    ]
    fmt = "%Y-%m-%d %H:%M:%S UTC"
    template = html_environment().get_template(TEMPLATE)
    return template.render(
        title=title or f"Why is {explanation.job} slow — gpucert explain",
        ex=explanation,
        window=(lo.strftime(fmt), hi.strftime(fmt)),
        onsets=[
            (rank, s, s.onset.strftime(fmt) if s.onset is not None else "")
            for rank, s in enumerate(explanation.suspects, start=1)
        ],
        change_at=explanation.step_change.at.strftime(fmt) if explanation.step_change is not None else "",
        chart=chart,
        stalls=stalls,
        lanes=lanes,
        lanes_note=lanes_note,
        markers=_markers(events, explanation, lo, hi, with_date),
        onset_marks=[
            (round(_x_of(s.onset, lo, hi), 1), rank)
            for rank, s in enumerate(explanation.suspects[:5], 1)
            if s.onset is not None
        ],
        ticks=_ticks(lo, hi, with_date),
        plot_w=PLOT_W,
        label_w=LABEL_W,
        n_gpus=grid.n_columns,
        n_nodes=len(set(grid.nodes)),
        step_s=step_s,
        buckets=min(grid.n_times, MAX_BUCKETS),
        reason_colours=_REASON_COLOURS,
    )
