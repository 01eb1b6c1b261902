"""The report's pictures as geometry: numbers computed with pandas, drawn as SVG by the template.

A *strip chart* per metric: each GPU's (or node's) median relative to its reference on a symmetric-log axis
(±1 % and −50 % both stay readable), passing GPUs binned into a grey histogram, the others coloured dots,
the worst labelled. A *heat map*: nodes × (GPU index, the node's own row), coloured by the worst relative
performance and marked with the verdict. Python loops run only over what is drawn, which is capped, so a
1,000-node fleet draws as fast as a 10-node one. The template writes every string, escaped by its autoescape.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import numpy.typing as npt
import pandas as pd

from .._text import counted
from ..metrics import METRICS
from ._common import VERDICT_ORDER, entity_kinds, gpu_keys

__all__ = [
    "CHART_METRICS",
    "HEAT_BINS",
    "REFERENCE_TEXT",
    "VERDICT_COLOURS",
    "HeatMap",
    "StripChart",
    "heat_map",
    "relative_frame",
    "strip_charts",
]

FloatArray = npt.NDArray[np.float64]

#: Always charted, in this order; an optional metric gets a chart when the run measured it.
PRIMARY_METRICS = ("gemm_bf16_tflops", "hbm_copy_gbps", "h2d_gbps", "d2h_gbps", "nccl_allreduce_busbw_gbps")
OPTIONAL_METRICS = ("gemm_fp8_tflops", "storage_read_gbps")
CHART_METRICS = PRIMARY_METRICS + OPTIONAL_METRICS

VERDICT_COLOURS = {"fail": "#c62828", "warn": "#e08600", "inconclusive": "#7e57c2", "pass": "#9e9e9e"}
GLYPHS = {"fail": "✕", "warn": "!", "inconclusive": "?"}

#: Where each point's reference came from, in the order they are tried.
REFERENCE_TEXT = {
    "verdict": "the value its verdict compared it with (its deciding check was on this metric)",
    "own": "its own baseline (held from its first passing runs)",
    "model": "its model's stored reference",
    "run": "the median of its GPU model in this run",
}
# Verdict references that describe typical performance; a spec floor or a gate threshold does not.
_VERDICT_REFERENCE_KINDS = ("own", "model", "peer", "node")

#: Heat-map fill by worst relative performance: (lower bound in %, colour, legend text).
HEAT_BINS: tuple[tuple[float, str, str], ...] = (
    (-2.0, "#e4efe0", "within 2 % of its reference, or faster"),
    (-5.0, "#fdd9b5", "2–5 % slower"),
    (-10.0, "#f7a35c", "5–10 % slower"),
    (-25.0, "#de5530", "10–25 % slower"),
    (-math.inf, "#8a1c12", "more than 25 % slower"),
)
NO_VALUE_FILL = "#cfcfcf"

# Symmetric log: linear within ±1 %, logarithmic beyond, so noise and a halved link share one axis.
_SYMLOG_C = 1.0
_TICKS = (-100, -50, -20, -10, -5, -2, -1, 0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
_REL_MIN, _REL_MAX = -100.0, 1000.0


def _symlog(r: FloatArray | float) -> FloatArray:
    r = np.asarray(r, dtype=np.float64)
    return np.sign(r) * np.log10(1.0 + np.abs(r) / _SYMLOG_C)


# --- the data ---------------------------------------------------------------------------------------


def _as_text(series: pd.Series) -> pd.Series:
    return series.astype(object).where(series.notna(), None)


def relative_frame(results: pd.DataFrame, verdicts: pd.DataFrame, baseline: pd.DataFrame | None) -> pd.DataFrame:
    """One row per GPU (or node) and charted metric: its median, reference, and relative performance.

    Columns: ``node``, ``gpu`` (-1 for node metrics), ``gpu_uuid``, ``gpu_model``, ``metric``, ``x``
    (median of the repeats), ``ref``, ``ref_kind`` (a key of :data:`REFERENCE_TEXT`), ``rel`` (percent;
    NaN without a usable reference), ``verdict`` (the entity's; ``pass`` when it has no verdict row),
    ``cause``, ``deciding`` (the verdict's deciding check is on this metric).
    """
    columns = ["node", "gpu", "gpu_uuid", "gpu_model", "metric", "value"]
    keep = results["metric"].isin(CHART_METRICS).to_numpy(dtype=bool)
    perf = results.loc[keep, [c for c in columns if c in results.columns]]
    for c in ("gpu_uuid", "gpu_model"):
        if c not in perf.columns:
            perf[c] = None
    perf = perf.assign(gpu=gpu_keys(perf["gpu"]))
    med = (
        perf.groupby(["node", "gpu", "metric"], observed=True, sort=False)
        .agg(x=("value", "median"), gpu_uuid=("gpu_uuid", "first"), gpu_model=("gpu_model", "first"))
        .reset_index()
    )
    med = med[med["x"].notna().to_numpy()]
    for c in ("node", "metric", "gpu_uuid", "gpu_model"):
        med[c] = _as_text(med[c])
    med = med.reset_index(drop=True)

    # The entity's verdict, cause and deciding comparison (GPU and node rows; pairs and fleet rows aside).
    ent = _entity_verdicts(verdicts)
    med = med.merge(ent, on=["node", "gpu"], how="left")
    med["verdict"] = med["verdict"].fillna("pass")
    med["deciding"] = (med["v_metric"] == med["metric"]).to_numpy(dtype=bool)
    v_ref = pd.to_numeric(med["v_reference"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    usable = med["deciding"].to_numpy() & med["v_kind"].isin(_VERDICT_REFERENCE_KINDS).to_numpy() & (v_ref > 0)
    ref = np.where(usable, v_ref, np.nan)
    kind = np.where(usable, "verdict", "")

    if baseline is not None and len(baseline):
        own, model = _baseline_references(med, baseline)
        for values, name in ((own, "own"), (model, "model")):
            take = np.isnan(ref) & (values > 0)
            ref = np.where(take, values, ref)
            kind = np.where(take, name, kind)

    # The last resort, and the only one without a baseline: the GPU model's median in this run.
    cohort = med.assign(_m=med["gpu_model"].fillna("")).groupby(["_m", "metric"], sort=False)["x"]
    run_ref = cohort.transform("median").to_numpy(dtype=np.float64)
    take = np.isnan(ref) & (run_ref > 0)
    ref = np.where(take, run_ref, ref)
    kind = np.where(take, "run", kind)

    med["ref"] = ref
    med["ref_kind"] = kind
    with np.errstate(divide="ignore", invalid="ignore"):
        med["rel"] = (med["x"].to_numpy(dtype=np.float64) / ref - 1.0) * 100.0
    return med.drop(columns=["v_metric", "v_reference", "v_kind"])


def _entity_verdicts(verdicts: pd.DataFrame) -> pd.DataFrame:
    cols = ["node", "gpu", "verdict", "cause", "v_metric", "v_reference", "v_kind"]
    if verdicts.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols}).astype({"gpu": np.int64})
    kinds = entity_kinds(verdicts)
    rows = verdicts[(kinds == "gpu") | (kinds == "node")]
    out = pd.DataFrame(
        {
            "node": _as_text(rows["node"]).to_numpy(),
            "gpu": gpu_keys(rows["gpu"]),
            "verdict": rows["verdict"].astype(object).to_numpy(),
            "cause": rows["cause"].astype(object).to_numpy() if "cause" in rows else None,
            "v_metric": rows["metric"].astype(object).to_numpy() if "metric" in rows else None,
            "v_reference": pd.to_numeric(rows["reference"], errors="coerce").to_numpy()
            if "reference" in rows
            else np.nan,
            "v_kind": rows["reference_kind"].astype(object).to_numpy(),
        }
    )
    return out.drop_duplicates(["node", "gpu"], keep="first")


def _baseline_references(med: pd.DataFrame, baseline: pd.DataFrame) -> tuple[FloatArray, FloatArray]:
    """Each row's own baseline centre (GPU by UUID, node by name) and its model's, NaN where absent."""
    base = pd.DataFrame(
        {
            "level": baseline["level"].astype(object).to_numpy(),
            "key": baseline["key"].astype(object).to_numpy(),
            "metric": baseline["metric"].astype(object).to_numpy(),
            "center": pd.to_numeric(baseline["center"], errors="coerce").to_numpy(),
        }
    ).drop_duplicates(["level", "key", "metric"], keep="last")
    is_gpu = med["gpu"].to_numpy() >= 0
    probe = pd.DataFrame(
        {
            "level": np.where(is_gpu, "gpu", "node"),
            "key": np.where(is_gpu, med["gpu_uuid"].to_numpy(), med["node"].to_numpy()),
            "metric": med["metric"].to_numpy(),
        }
    )
    own = probe.merge(base, on=["level", "key", "metric"], how="left")["center"].to_numpy(dtype=np.float64)
    probe["level"] = "model"
    probe["key"] = med["gpu_model"].to_numpy()
    model = probe.merge(base, on=["level", "key", "metric"], how="left")["center"].to_numpy(dtype=np.float64)
    return own, model


# --- strip charts -----------------------------------------------------------------------------------


_W, _H = 380, 330
_TOP, _BOTTOM = 16.0, 300.0
_AXIS_X, _BAND_X, _BAND_W = 44.0, 48.0, 96.0
_LANE_X, _LABEL_X = 154.0, 194.0
_BIN_PX = 4.0
_MAX_DOTS, _MAX_LABELS, _LABEL_GAP = 300, 20, 12.5
_LABEL_THRESHOLD = -3.0  # a flagged point this much below its reference is labelled on any chart
_NAME_CHARS = 22


@dataclass(frozen=True)
class Tick:
    y: float
    label: str


@dataclass(frozen=True)
class Bar:
    y: float
    height: float
    width: float
    title: str


@dataclass(frozen=True)
class Dot:
    x: float
    y: float
    colour: str
    verdict: str
    title: str
    #: a GPU flagged for something else, unremarkable on this metric: drawn as a ring, not a disc
    hollow: bool


@dataclass(frozen=True)
class Label:
    x: float
    y: float
    text: str
    colour: str
    verdict: str
    #: the leader line from the dot to the label
    x1: float
    y1: float
    x2: float
    y2: float


@dataclass(frozen=True)
class StripChart:
    """One metric's picture; ``empty`` when the run has no value for it (the page says so)."""

    metric: str
    unit: str
    entity: str  # "GPU" or "node"
    zero_y: float
    # The geometry every strip chart shares.
    width: ClassVar[int] = _W
    height: ClassVar[int] = _H
    top: ClassVar[float] = _TOP
    bottom: ClassVar[float] = _BOTTOM
    axis_x: ClassVar[float] = _AXIS_X
    band_x: ClassVar[float] = _BAND_X
    lane_x: ClassVar[float] = _LANE_X
    ticks: list[Tick] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    dots: list[Dot] = field(default_factory=list)
    labels: list[Label] = field(default_factory=list)
    n_points: int = 0
    n_flagged: int = 0
    n_dots_left_out: int = 0
    n_unlabelled: int = 0
    n_without_value: int = 0
    n_without_reference: int = 0
    median_rel: float | None = None
    low_rel: float | None = None  # the 1st percentile: how far the slow tail of the bulk reaches
    references: list[tuple[str, int]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.n_points == 0


def _short(name: str, limit: int = _NAME_CHARS) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _entity_name(node: str, gpu: int) -> str:
    return f"{node}/{gpu}" if gpu >= 0 else node


def _spread(ys: list[float], lo: float, hi: float, gap: float) -> list[float]:
    """Label positions near ``ys`` (sorted ascending), at least ``gap`` apart, within [lo, hi]."""
    out = list(ys)
    for i in range(len(out)):
        out[i] = max(out[i], lo if i == 0 else out[i - 1] + gap)
    for i in reversed(range(len(out))):
        out[i] = min(out[i], hi if i == len(out) - 1 else out[i + 1] - gap)
    return out


def _ticks(lo: float, hi: float, scale: Callable[[float], FloatArray]) -> list[Tick]:
    """Axis ticks from :data:`_TICKS` within [lo, hi] percent, 0 first, none closer than 14 pixels."""
    kept: list[tuple[float, int]] = []
    for value in sorted((t for t in _TICKS if lo <= t <= hi), key=abs):
        y = float(scale(value))
        if all(abs(y - other) >= 14.0 for other, _ in kept):
            kept.append((y, value))
    return [Tick(round(y, 1), f"{v:+d} %" if v else "0") for y, v in sorted(kept)]


def strip_charts(rel: pd.DataFrame, verdicts: pd.DataFrame) -> list[StripChart]:
    """A chart per metric of :data:`PRIMARY_METRICS`, plus each optional metric the run measured."""
    metrics = [m for m in CHART_METRICS if m in PRIMARY_METRICS or (rel["metric"] == m).any()]
    kinds = entity_kinds(verdicts)
    names = verdicts["node"].to_numpy(dtype=object)
    gpus = gpu_keys(verdicts["gpu"])
    # The entities judged at each level: those without a value for a metric are counted on its chart.
    judged = {
        level: pd.MultiIndex.from_arrays([names[kinds == level], gpus[kinds == level]]) for level in ("gpu", "node")
    }
    by_metric = dict(tuple(rel.groupby("metric", sort=False)))
    charts = []
    for metric in metrics:
        part = by_metric.get(metric, rel.iloc[:0])
        have = pd.MultiIndex.from_arrays([part["node"].to_numpy(dtype=object), part["gpu"].to_numpy()])
        missing = judged[METRICS[metric].level].difference(have)
        charts.append(_strip(metric, part, n_without_value=len(missing)))
    return charts


def _strip(metric: str, part: pd.DataFrame, *, n_without_value: int) -> StripChart:
    entity = "GPU" if METRICS[metric].level == "gpu" else "node"
    has_rel = part["rel"].notna().to_numpy(dtype=bool)
    chart = StripChart(
        metric=metric,
        unit=METRICS[metric].unit,
        entity=entity,
        zero_y=(_TOP + _BOTTOM) / 2,
        n_without_value=n_without_value,
        n_without_reference=int((~has_rel).sum()),
    )
    part = part[has_rel]
    if part.empty:
        return chart

    rel = np.clip(part["rel"].to_numpy(dtype=np.float64), _REL_MIN, _REL_MAX)
    lo, hi = min(float(rel.min()), -5.0), max(float(rel.max()), 5.0)
    t_lo, t_hi = float(_symlog(lo)), float(_symlog(hi))

    def y_of(r: FloatArray | float) -> FloatArray:
        return _TOP + (t_hi - _symlog(r)) / (t_hi - t_lo) * (_BOTTOM - _TOP)

    ys = y_of(rel)
    verdict = part["verdict"].astype(str).to_numpy()
    flagged = verdict != "pass"

    # Passing points: counts per 4-pixel bin, drawn as bars whose length is the share of the busiest bin.
    n_bins = math.ceil((_BOTTOM - _TOP) / _BIN_PX) + 1
    bins = np.clip(((ys[~flagged] - _TOP) // _BIN_PX).astype(np.int64), 0, n_bins - 1)
    counts = np.bincount(bins, minlength=n_bins)
    peak = max(int(counts.max()), 1) if len(counts) else 1
    bars = []
    for i in np.flatnonzero(counts):
        top = _TOP + i * _BIN_PX
        r_hi, r_lo = _inverse(top, t_lo, t_hi), _inverse(top + _BIN_PX, t_lo, t_hi)
        bars.append(
            Bar(
                y=round(top, 1),
                height=_BIN_PX - 0.6,
                # An outlier bin of one GPU among thousands still shows.
                width=round(max(1.5, counts[i] / peak * _BAND_W), 1),
                title=f"{int(counts[i]):,} passing {entity}s from {r_lo:+.1f} % to {r_hi:+.1f} %",
            )
        )

    # Flagged points: worst first, every one a dot up to the cap, the worst of them labelled.
    idx = np.flatnonzero(flagged)
    idx = idx[np.argsort(rel[idx], kind="stable")]
    drawn = idx[:_MAX_DOTS]
    nodes = part["node"].to_numpy()
    gpus = part["gpu"].to_numpy()
    x_vals, refs = part["x"].to_numpy(), part["ref"].to_numpy()
    ref_kinds, causes = part["ref_kind"].to_numpy(), part["cause"].to_numpy()
    deciding = part["deciding"].to_numpy(dtype=bool)
    unit = METRICS[metric].unit
    straggler = deciding | (rel <= _LABEL_THRESHOLD)
    dots: list[Dot] = []
    for k, i in enumerate(drawn):
        name = _entity_name(str(nodes[i]), int(gpus[i]))
        cause = causes[i] if isinstance(causes[i], str) and causes[i] else None
        dots.append(
            Dot(
                x=_LANE_X + (k % 4) * 5.0,
                y=round(float(ys[i]), 1),
                colour=VERDICT_COLOURS.get(verdict[i], VERDICT_COLOURS["inconclusive"]),
                verdict=verdict[i],
                title=(
                    f"{name}: {metric} {x_vals[i]:.4g} {unit}, {rel[i]:+.1f} % vs {ref_kinds[i]} "
                    f"{refs[i]:.4g} — {verdict[i]}" + (f" ({cause})" if cause else "")
                ),
                hollow=not straggler[i],
            )
        )
    candidates = [k for k, i in enumerate(drawn) if straggler[i]]
    chosen = candidates[:_MAX_LABELS]
    labels = []
    if chosen:
        order = sorted(chosen, key=lambda k: dots[k].y)
        placed = _spread([dots[k].y for k in order], _TOP + 4, _BOTTOM + 8, _LABEL_GAP)
        for k, y in zip(order, placed, strict=True):
            i = drawn[k]
            dot = dots[k]
            labels.append(
                Label(
                    x=_LABEL_X,
                    y=round(y + 3.5, 1),
                    text=f"{_short(_entity_name(str(nodes[i]), int(gpus[i])))} {rel[i]:+.1f} %",
                    colour=dot.colour,
                    verdict=dot.verdict,
                    x1=dot.x + 3,
                    y1=dot.y,
                    x2=_LABEL_X - 3,
                    y2=round(y, 1),
                )
            )

    kinds = part["ref_kind"].value_counts()
    pass_rel = rel[~flagged] if (~flagged).any() else rel
    return dataclasses.replace(
        chart,
        zero_y=round(float(y_of(0.0)), 1),
        ticks=_ticks(lo, hi, y_of),
        bars=bars,
        dots=dots,
        labels=labels,
        n_points=len(part),
        n_flagged=int(flagged.sum()),
        n_dots_left_out=len(idx) - len(drawn),
        n_unlabelled=len(drawn) - len(labels) + (len(idx) - len(drawn)),
        median_rel=round(float(np.median(pass_rel)), 2),
        low_rel=round(float(np.percentile(pass_rel, 1)), 2),
        references=[(REFERENCE_TEXT[k], int(kinds[k])) for k in REFERENCE_TEXT if k in kinds],
    )


def _inverse(y: float, t_lo: float, t_hi: float) -> float:
    t = t_hi - (y - _TOP) / (_BOTTOM - _TOP) * (t_hi - t_lo)
    return float(np.sign(t) * (10 ** abs(t) - 1.0) * _SYMLOG_C)


# --- the heat map -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    x: float
    y: float
    fill: str
    glyph: str
    title: str


@dataclass(frozen=True)
class RowLabel:
    y: float
    text: str
    title: str
    colour: str


@dataclass(frozen=True)
class HeatPanel:
    width: int
    height: int
    cell: float
    label_width: float
    columns: list[tuple[float, str]]
    rows: list[RowLabel]
    cells: list[Cell]


@dataclass(frozen=True)
class HeatMap:
    panels: list[HeatPanel]
    legend: list[tuple[str, str]]  # (fill, text)
    glyphs: list[tuple[str, str, str]]  # (glyph, colour, text)
    n_nodes: int
    n_drawn: int
    n_flagged: int
    note: str


_CELL = 15.0
_ROWS_PER_PANEL = 40
_HEAT_NAME_CHARS = 20


def _fills(worst: FloatArray) -> npt.NDArray[np.object_]:
    conditions = [np.isnan(worst)] + [worst >= lo for lo, _, _ in HEAT_BINS]
    choices = [NO_VALUE_FILL] + [fill for _, fill, _ in HEAT_BINS]
    return np.select(conditions, choices, default=HEAT_BINS[-1][1]).astype(object)


def heat_map(rel: pd.DataFrame, verdicts: pd.DataFrame, *, max_nodes: int) -> HeatMap:
    """The node × GPU map: every node with a verdict other than pass (up to ``max_nodes``), then an
    evenly spaced sample of passing nodes to fill ``max_nodes`` rows; the page says which were drawn."""
    kinds = entity_kinds(verdicts)
    ent = verdicts[(kinds == "gpu") | (kinds == "node") | (kinds == "pair")]
    ent_kinds = kinds[(kinds == "gpu") | (kinds == "node") | (kinds == "pair")]
    v_node = ent["node"].astype(object).to_numpy()
    v_gpu = np.where(ent_kinds == "gpu", gpu_keys(ent["gpu"]), -1)
    v_sev = ent["verdict"].astype(object).map(VERDICT_ORDER).fillna(2).to_numpy(dtype=np.int64)

    names = pd.Index(pd.unique(np.concatenate([rel["node"].to_numpy(dtype=object), v_node]))).dropna()
    names = names.sort_values()
    n_nodes = len(names)
    max_gpu = int(max(rel["gpu"].max() if len(rel) else -1, v_gpu.max() if len(v_gpu) else -1))
    n_gpu_cols = min(max_gpu + 1, 64)
    n_cols = n_gpu_cols + 1  # the last column is the node's own row (node-level metrics and verdict)

    def col_of(gpu: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return np.where(gpu < 0, n_gpu_cols, np.minimum(gpu, n_gpu_cols - 1))

    # Worst relative performance per cell, and the worst verdict per cell (3 = pass, -1: no verdict).
    worst = np.full((n_nodes, n_cols), np.nan)
    has = rel["rel"].notna().to_numpy(dtype=bool)
    cells = (
        pd.DataFrame(
            {
                "r": names.get_indexer(rel["node"].to_numpy(dtype=object)[has]),
                "c": col_of(rel["gpu"].to_numpy(dtype=np.int64)[has]),
                "rel": rel["rel"].to_numpy(dtype=np.float64)[has],
            }
        )
        .groupby(["r", "c"], sort=False)["rel"]
        .min()
    )
    if len(cells):
        worst[cells.index.get_level_values(0), cells.index.get_level_values(1)] = cells.to_numpy()
    sev = np.full((n_nodes, n_cols), 9, dtype=np.int64)
    is_pair = ent_kinds == "pair"
    if len(ent):
        r = names.get_indexer(v_node)
        ok = (r >= 0) & ~is_pair
        np.minimum.at(sev, (r[ok], col_of(v_gpu[ok])), v_sev[ok])
        # A pair's verdict marks its node's column too: the node's network path is what it judges.
        okp = (r >= 0) & is_pair
        np.minimum.at(sev, (r[okp], np.full(int(okp.sum()), n_gpu_cols)), v_sev[okp])
    node_sev = sev.min(axis=1) if n_nodes else np.array([], dtype=np.int64)
    node_worst = np.nanmin(np.where(np.isnan(worst), np.inf, worst), axis=1) if n_nodes else np.array([])

    flagged = np.flatnonzero(node_sev < VERDICT_ORDER["pass"])
    flagged = flagged[np.lexsort((names.to_numpy()[flagged], node_worst[flagged], node_sev[flagged]))]
    passing = np.flatnonzero(node_sev >= VERDICT_ORDER["pass"])  # sorted by name already
    drawn_flagged = flagged[:max_nodes]
    room = max_nodes - len(drawn_flagged)
    if room >= len(passing):
        sample = passing
    elif room > 0:
        sample = passing[np.unique(np.linspace(0, len(passing) - 1, room).round().astype(np.int64))]
    else:
        sample = passing[:0]
    order = np.concatenate([drawn_flagged, sample]).astype(np.int64)

    if len(order) == n_nodes:
        note = f"All {counted(n_nodes, 'node')} {'is' if n_nodes == 1 else 'are'} drawn"
        note += ", those with a verdict other than pass first." if len(flagged) else "."
    elif len(drawn_flagged) < len(flagged):
        note = (
            f"{len(order):,} of {n_nodes:,} nodes are drawn: the {len(drawn_flagged):,} worst of the "
            f"{len(flagged):,} nodes with a verdict other than pass; passing nodes are left out. "
            "The verdict table lists every one."
        )
    else:
        note = (
            f"{len(order):,} of {n_nodes:,} nodes are drawn: all {len(flagged):,} with a verdict other than "
            f"pass, first, then {len(sample):,} of the {len(passing):,} passing nodes, evenly spaced by name."
        )

    fills = _fills(worst[order]) if len(order) else np.empty((0, n_cols), dtype=object)
    glyph_of = {VERDICT_ORDER[v]: g for v, g in GLYPHS.items()}
    verdict_of = {code: v for v, code in VERDICT_ORDER.items()}
    col_names = [str(g) for g in range(n_gpu_cols)] + ["node"]
    panels = []
    for start in range(0, len(order), _ROWS_PER_PANEL):
        rows = order[start : start + _ROWS_PER_PANEL]
        label_w = 8.0 + 6.6 * min(_HEAT_NAME_CHARS, max(len(str(names[r])) for r in rows))
        head = 22.0
        row_labels, panel_cells = [], []
        for j, r in enumerate(rows):
            y = head + j * _CELL
            node = str(names[r])
            node_v = verdict_of.get(int(node_sev[r]), "pass")
            row_labels.append(
                RowLabel(
                    y=round(y + _CELL * 0.72, 1),
                    text=_short(node, _HEAT_NAME_CHARS),
                    title=f"{node}: {node_v}",
                    colour=VERDICT_COLOURS[node_v] if node_v != "pass" else "#333",
                )
            )
            for c in range(n_cols):
                code = int(sev[r, c])
                value = worst[r, c]
                where = f"{node}/{col_names[c]}" if c < n_gpu_cols else f"{node} (node)"
                v_text = verdict_of.get(code, "no verdict")
                perf = "no value" if math.isnan(value) else f"worst {value:+.1f} % vs its reference"
                if code == 9 and math.isnan(value):
                    continue  # nothing measured or judged here (a node with fewer GPUs)
                panel_cells.append(
                    Cell(
                        x=round(label_w + c * _CELL + (4.0 if c == n_gpu_cols else 0.0), 1),
                        y=y,
                        fill=str(fills[start + j, c]),
                        glyph=glyph_of.get(code, ""),
                        title=f"{where}: {v_text}, {perf}",
                    )
                )
        panels.append(
            HeatPanel(
                width=int(label_w + n_cols * _CELL + 10),
                height=int(head + len(rows) * _CELL + 4),
                cell=_CELL,
                label_width=label_w,
                columns=[
                    (round(label_w + c * _CELL + _CELL / 2 + (4.0 if c == n_gpu_cols else 0.0), 1), name)
                    for c, name in enumerate(col_names)
                ],
                rows=row_labels,
                cells=panel_cells,
            )
        )
    return HeatMap(
        panels=panels,
        legend=[(fill, text) for _, fill, text in HEAT_BINS] + [(NO_VALUE_FILL, "no value measured")],
        glyphs=[(g, VERDICT_COLOURS[v], v) for v, g in GLYPHS.items()],
        n_nodes=n_nodes,
        n_drawn=len(order),
        n_flagged=len(flagged),
        note=note,
    )
