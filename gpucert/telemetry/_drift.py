"""Slow drift on each GPU's own history: a lower CUSUM (or EWMA) per GPU × metric (docs/design/operate.md, "Drift",
with why k = 1.5, h = 6 and not the textbook's).

Input: per run, each GPU's (or node's) median of a performance metric with the count and standard deviation of
the repeats behind it (:func:`history_from_store`, :func:`run_medians`); each series is the entity's *own* last
``window_runs`` certifications, however many of the store's runs that takes. Each run is judged against the
entity's own baseline (the store's ``gpu`` and ``node`` rows) after the night's fleet factor is divided out,
standardised by ``σ_t² = σ_med² + σ_c²`` (the run median's noise, from the repeats' spread pooled robustly per
series and never below the cohort's; and the baseline centre's uncertainty). A run whose repeats disagree beyond
chance is judged with the spread it showed, and neither raises a one-run alarm nor clears one. An alarm asks for
a re-certification only. The recursion runs over positions — few — with numpy across all series at once.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pandas.api.types import union_categoricals

from ..errors import StoreError
from ..metrics import METRICS
from ..policy import Policy, default_policy
from ..store import BaselineStore
from ._common import utc

__all__ = [
    "DRIFT_COLUMNS",
    "DRIFT_METRICS",
    "HISTORY_COLUMNS",
    "TRACE_COLUMNS",
    "DriftCheck",
    "check_drift",
    "drift_alarms",
    "drift_trace",
    "ewma_limit",
    "history_from_store",
    "run_medians",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: The performance metrics drift is watched on by default (GPU level, and the node's all-reduce).
DRIFT_METRICS = ("gemm_bf16_tflops", "hbm_copy_gbps", "h2d_gbps", "d2h_gbps", "nccl_allreduce_busbw_gbps")
#: One row per run and GPU (or node) and metric: the median of its ``n`` repeats and their standard
#: deviation ``rep_sd`` (NaN for a single repeat).
HISTORY_COLUMNS = ("run_id", "ts", "node", "gpu", "gpu_uuid", "gpu_model", "metric", "value", "n", "rep_sd")
#: A series: the GPU (or node) and the metric.
_SERIES = ("node", "gpu", "gpu_uuid", "metric")
DRIFT_COLUMNS: tuple[str, ...] = (
    *_SERIES,
    "method",
    "statistic",
    "threshold",
    "alarm",
    "runs",
    "onset_run",
    "first_run_over",
    "last_run",
    "deviation_pct",
    "fleet_pct",
    "center",
    "sigma",
    "action",
    "reason",
)
#: One row per series and run of :func:`drift_trace`: what the detector saw that night (the value, its own
#: baseline's centre, the fleet factor, σ_t, the standardised u, the statistic against its threshold, and
#: whether the series was in alarm, raised one or cleared one).
TRACE_COLUMNS: tuple[str, ...] = (
    *_SERIES,
    "run_id",
    "ts",
    "value",
    "center",
    "fleet_factor",
    "sigma",
    "u",
    "statistic",
    "threshold",
    "alarm",
    "raised",
    "cleared",
)

_CATEGORIES = ("run_id", "node", "gpu_uuid", "gpu_model", "metric")
_RESULT_READ = ["run_id", "node", "gpu", "gpu_uuid", "gpu_model", "metric", "value", "ts"]
_GROUP = ["run_id", "node", "gpu", "gpu_uuid", "gpu_model", "metric"]
_NODE_SALT = np.uint64(0x9E3779B97F4A7C15)  # keeps a node's key apart from a UUID's of the same text
_MIX = np.uint64(0x100000001B3)
_PRIOR_DF = 20.0


# --- history -------------------------------------------------------------------------------------------


def run_medians(results: pd.DataFrame, metrics: Sequence[str] = DRIFT_METRICS) -> pd.DataFrame:
    """Per run, GPU (or node) and metric of ``metrics``: the median of the repeats, their count ``n`` and
    standard deviation ``rep_sd``, and the run's time ``ts`` (its earliest sample). Returns the
    :data:`HISTORY_COLUMNS`; non-finite values and pair metrics are left out."""
    return _typed(_medians(results, metrics))


def _medians(results: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """:func:`run_medians` before the final dtypes (so that many runs are typed once, together)."""
    wanted = [m for m in metrics if m in METRICS and METRICS[m].level in ("gpu", "node")]
    rows = results[results["metric"].isin(wanted) & np.isfinite(results["value"].to_numpy(dtype=np.float64))]
    if rows.empty:
        return _empty_history()
    run_ts = results.groupby("run_id", observed=True)["ts"].min()
    # One integer key per (run, node, gpu, uuid, metric) from the columns' codes: a groupby on one int64
    # is several times faster than on five categoricals with missing values.
    key = np.zeros(len(rows), dtype=np.int64)
    span = 1
    for name in ("run_id", "node", "gpu", "gpu_uuid", "metric"):
        column = rows[name]
        if isinstance(column.dtype, pd.CategoricalDtype):
            codes, size = column.cat.codes.to_numpy().astype(np.int64), len(column.cat.categories)
        else:
            factorized, uniques = pd.factorize(column, use_na_sentinel=True)
            codes, size = factorized.astype(np.int64), len(uniques)
        if span * (size + 1) >= 2**62:  # keep the mixed-radix key inside int64
            key = pd.factorize(key)[0].astype(np.int64)
            span = int(key.max(initial=0)) + 1
        key, span = key * (size + 1) + (codes + 1), span * (size + 1)
    ids, first = np.unique(key, return_index=True)
    group = np.searchsorted(ids, key)
    values = pd.Series(rows["value"].to_numpy(dtype=np.float64)).groupby(group, sort=True)
    out: pd.DataFrame = rows.iloc[first][list(_GROUP)].reset_index(drop=True)
    out["value"] = values.median().to_numpy()
    out["n"] = values.size().to_numpy(dtype=np.int64)
    out["rep_sd"] = values.std().to_numpy()  # ddof 1: NaN for a single repeat
    out["ts"] = out["run_id"].map(run_ts).astype(run_ts.dtype)
    return out


def _hash(column: pd.Series) -> npt.NDArray[np.uint64]:
    """A 64-bit hash per value (a categorical is hashed per category): vectorised, instead of string keys."""
    return np.asarray(pd.util.hash_pandas_object(column, index=False), dtype=np.uint64)


def _entity_hashes(
    frame: pd.DataFrame,
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """Per history row, 64-bit keys of its series (entity × metric), its entity (GPU or node) and its node."""
    gpu_level = _level_of(frame["metric"]) == "gpu"
    h_node = _hash(frame["node"])
    entity = np.asarray(np.where(gpu_level, _hash(frame["gpu_uuid"]), h_node ^ _NODE_SALT), dtype=np.uint64)
    return np.asarray(entity * _MIX + _hash(frame["metric"]), dtype=np.uint64), entity, h_node


def _level_of(metric: pd.Series) -> npt.NDArray[np.object_]:
    """Each row's metric level (``gpu``, ``node``, ``pair`` or ``""``), looked up per category."""
    column = metric.astype("category")
    levels = np.array(
        [METRICS[str(m)].level if str(m) in METRICS else "" for m in column.cat.categories] + [""], dtype=object
    )
    codes = column.cat.codes.to_numpy()
    return levels[np.where(codes < 0, len(levels) - 1, codes)]


def history_from_store(
    store: BaselineStore,
    *,
    since: date | datetime | None = None,
    metrics: Sequence[str] = DRIFT_METRICS,
    last_runs: int = 30,
    max_days: float | None = 240.0,
    baseline: pd.DataFrame | None = None,
    workers: int = 8,
) -> pd.DataFrame:
    """Each GPU's (and node's) own last ``last_runs`` per-run medians (:func:`run_medians`) in ``store``,
    oldest first, from ``since`` on (a date: runs of that day and later; a datetime: runs whose first
    sample is not earlier), at most ``max_days`` before the newest run. A run without results is skipped.

    Runs are read newest first, ``2 × workers`` at a time, until every GPU and node in service (measured in
    its node's newest run) has ``last_runs`` points or, with ``baseline`` given, its whole history since its
    baseline's first run.

    Raises :class:`~gpucert.errors.StoreError` when a results file cannot be read or parsed (naming the
    run), and ``ValueError`` when ``last_runs`` < 1.
    """
    if last_runs < 1:
        raise ValueError(f"last_runs must be at least 1, not {last_runs}")
    runs = store.list_runs()
    if since is not None:
        first_day = since.date() if isinstance(since, datetime) else since
        runs = [(day, run) for day, run in runs if day >= first_day]
    candidates = runs[::-1]
    first_ts = _first_ts_index(baseline) if baseline is not None else None

    def load(entry: tuple[date, str]) -> pd.DataFrame | None:
        day, run_id = entry
        try:
            data = store.read_run_file(run_id, day, "results.parquet")
        except StoreError:
            if store.objects.exists(f"runs/date={day:%Y-%m-%d}/run={run_id}/results.parquet"):
                raise
            return None
        try:
            schema = pq.read_schema(io.BytesIO(data))
            # Strings as dictionaries: they arrive as categoricals, which group fast.
            text = [
                c
                for c in _CATEGORIES
                if c in schema.names
                and (pa.types.is_string(schema.field(c).type) or pa.types.is_large_string(schema.field(c).type))
            ]
            table = pq.read_table(io.BytesIO(data), columns=_RESULT_READ, read_dictionary=text)
            run_ts = pc.min(table.column("ts")).as_py()
            table = table.filter(pc.is_in(table.column("metric"), value_set=pa.array(list(metrics))))
        except (pa.ArrowException, OSError, ValueError, KeyError) as exc:
            raise StoreError(f"results of run {run_id} ({day}) cannot be read: {exc}") from exc
        medians = _medians(table.to_pandas(), metrics)
        if len(medians) and run_ts is not None:  # the run's time: its earliest sample of any metric
            medians["ts"] = pd.Timestamp(utc(run_ts)).as_unit("us")
        if len(medians):
            medians["_series"], medians["_entity"], medians["_node"] = _entity_hashes(medians)
        return medians

    loaded: list[tuple[date, pd.DataFrame]] = []
    step = 2 * max(1, workers)
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="gpucert-history") as pool:
        while candidates:
            batch, candidates = candidates[:step], candidates[step:]
            loaded += [(e[0], p) for e, p in zip(batch, pool.map(load, batch), strict=True) if p is not None and len(p)]
            if max_days is not None and loaded:  # the bound counts from the newest run that has results
                oldest_day = loaded[0][0] - timedelta(days=max_days)
                candidates = [(day, run) for day, run in candidates if day >= oldest_day]
                loaded = [(day, p) for day, p in loaded if day >= oldest_day]
            # No series can have last_runs points before that many runs are read (a check costs a sort).
            if candidates and len(loaded) >= last_runs and _have_enough([p for _, p in loaded], last_runs, first_ts):
                break
    parts = [p for _, p in loaded]
    if not parts:
        return _empty_history()
    history = _concat(parts)
    if isinstance(since, datetime):
        history = history[history["ts"] >= pd.Timestamp(utc(since))]
    history = history.sort_values(["ts", "run_id"], kind="stable", ignore_index=True)
    if len(parts) > last_runs:  # each series' own last N, counted from its newest row back
        rank = history.groupby("_series", sort=False).cumcount(ascending=False).to_numpy()
        history = history[rank < last_runs]
    return _typed(history)


def _first_ts_index(baseline: pd.DataFrame) -> pd.Series:
    """The baseline's ``first_ts`` (int64 µs) per series key, as :func:`_entity_hashes` computes it."""
    own = baseline[baseline["level"].isin(["gpu", "node"])]
    h_key = _hash(own["key"].astype(object))
    entity = np.where(own["level"].astype(object) == "gpu", h_key, h_key ^ _NODE_SALT)
    keys = entity * _MIX + _hash(own["metric"].astype(object))
    return pd.Series(_micros(own["first_ts"]), index=pd.Index(keys)).groupby(level=0).max()


def _have_enough(parts: Sequence[pd.DataFrame], wanted: int, first_ts: pd.Series | None) -> bool:
    """Whether every series in service has ``wanted`` points, or its whole history since its baseline.
    ``parts`` are run files newest first, one row per series each."""
    series, entity, node = (
        np.concatenate([p[c].to_numpy(dtype=np.uint64) for p in parts]) for c in ("_series", "_entity", "_node")
    )
    # One time per run file (its earliest sample); files come newest first, so a key's first row is its newest.
    ts = np.repeat(np.concatenate([_micros(p["ts"].iloc[:1]) for p in parts]), [len(p) for p in parts])
    nodes, node_first = np.unique(node, return_index=True)
    entities, entity_first = np.unique(entity, return_index=True)
    # In service: measured in its node's newest run (a replaced GPU's UUID is absent from it).
    node_newest = ts[node_first][np.searchsorted(nodes, node[entity_first])]
    in_service = entities[ts[entity_first] == node_newest]
    keys, key_first, counts = np.unique(series, return_index=True, return_counts=True)
    needed = np.isin(entity[key_first], in_service)
    done = counts >= wanted
    if first_ts is not None:
        since = first_ts.reindex(pd.Index(keys)).to_numpy(dtype=np.float64)
        # No baseline: never judged, so no need to read on for it; else read back to its first run.
        done |= np.isnan(since) | (since > ts.min())
    return bool(done[needed].all())


def _concat(parts: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate frames whose category columns differ, keeping them categorical (no detour via text)."""
    names = [c for c in parts[0].columns if c in _CATEGORIES]
    rest = pd.concat([p.drop(columns=names) for p in parts], ignore_index=True)
    for name in names:
        merged = union_categoricals([p[name].astype("category") for p in parts], ignore_order=True)
        rest[name] = pd.Categorical(merged)
    return rest


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    if "rep_sd" not in frame.columns:
        frame = frame.assign(rep_sd=np.nan)
    out = frame[list(HISTORY_COLUMNS)].copy()
    for name in _CATEGORIES:
        out[name] = out[name].astype("category")
    out["gpu"] = out["gpu"].astype("Int64")
    out["ts"] = pd.to_datetime(out["ts"], utc=True).dt.as_unit("us")
    out["value"] = out["value"].astype(np.float64)
    out["rep_sd"] = out["rep_sd"].astype(np.float64)
    return out.reset_index(drop=True)


def _empty_history() -> pd.DataFrame:
    types = {"value": np.float64, "n": np.int64, "rep_sd": np.float64, "ts": "datetime64[us, UTC]"}
    return _typed(_empty(HISTORY_COLUMNS, types))


# --- the statistics ------------------------------------------------------------------------------------


def ewma_limit(lam: float, L: float) -> float:
    """The lower EWMA control limit (asymptotic): ``−L·sqrt(λ / (2 − λ))`` in σ units."""
    return -L * math.sqrt(lam / (2 - lam))


@functools.cache
def _repeat_factors(n: int) -> tuple[float, float, float]:
    """For ``n`` normal repeats of unit σ: the standard deviation of their median, and the median and the
    99th percentile of their sample variance (the first turns a robust pool of variances into σ², the
    second says when one run's repeats disagree beyond chance). Seeded Monte Carlo: no closed form for
    the median of an even count, and no SciPy here."""
    if n <= 1:
        return 1.0, math.nan, math.nan
    d = n - 1
    if n > 64:  # asymptotics (Wilson–Hilferty for the variance), within 0.5 % from here on
        a = 2 / (9 * d)
        return math.sqrt(math.pi / (2 * n)), (1 - a) ** 3, (1 - a + 2.326 * math.sqrt(a)) ** 3
    draws = np.random.default_rng(n).standard_normal((200_000, n))
    var = draws.var(axis=1, ddof=1)
    return float(np.median(draws, axis=1).std()), float(np.median(var)), float(np.quantile(var, 0.99))


def _factors_of(n: IntArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """:func:`_repeat_factors` per element of ``n`` (computed once per distinct count)."""
    inverse, uniq = _dense(n)
    table = np.array([_repeat_factors(int(v)) for v in uniq], dtype=np.float64).reshape(-1, 3)
    return table[inverse, 0], table[inverse, 1], table[inverse, 2]


@dataclass(frozen=True)
class _Params:
    method: Literal["cusum", "ewma"]
    k: float
    h: float
    lam: float
    L: float
    shewhart: float
    clip: float
    clear: float
    window: int
    min_baseline_runs: int

    @property
    def threshold(self) -> float:
        return self.h if self.method == "cusum" else ewma_limit(self.lam, self.L)


def _params(policy: Policy, **overrides: Any) -> _Params:
    drift = policy.drift
    values: dict[str, Any] = {name: getattr(drift, name) for name in ("method", "k", "h", "lam", "L", "shewhart")}
    values |= {"clip": drift.clip, "clear": drift.clear, "window": drift.window_runs}
    # A policy seeding from fewer runs than the drift minimum is still judged, on complete baselines.
    values["min_baseline_runs"] = min(drift.min_baseline_runs, policy.baseline.seed_runs)
    values |= {k: v for k, v in overrides.items() if v is not None}
    if values["method"] not in ("cusum", "ewma"):
        raise ValueError(f"method is 'cusum' or 'ewma', not {values['method']!r}")
    for name in ("k", "h", "lam", "L", "shewhart", "clip"):
        if not values[name] > 0:
            raise ValueError(f"{name} must be positive, not {values[name]!r}")
    if not 0 < values["lam"] <= 1:
        raise ValueError(f"lam must be in (0, 1], not {values['lam']!r}")
    if not values["clear"] >= 0:
        raise ValueError(f"clear must not be negative, not {values['clear']!r}")
    if values["window"] < 1:
        raise ValueError(f"window must be at least 1, not {values['window']!r}")
    return _Params(**values)


@dataclass(frozen=True)
class _Evaluated:
    """Every series as a (series × position) grid, each row its own runs in time order."""

    meta: pd.DataFrame  # per series: node, gpu, gpu_uuid, metric, center
    run_names: npt.NDArray[np.object_]
    run_ts: IntArray  # per run code: its time (µs)
    lengths: IntArray
    runs: IntArray  # run code per cell, -1 past a series' end
    x: FloatArray  # the value
    fleet: FloatArray  # the fleet factor of the cell's run and cohort
    sigma: FloatArray  # σ_t, in the metric's unit
    u: FloatArray  # standardised (clipped), a drop negative
    rel: FloatArray  # x / (f · center) − 1
    stat: FloatArray  # the CUSUM or EWMA after each cell
    alarm: BoolArray  # in alarm after each cell
    raised: BoolArray  # the cell raised an alarm
    cleared: BoolArray  # the cell cleared one
    by_step: BoolArray  # the cell raised it by the one-run limit alone
    # the state after each series' last cell
    onset: IntArray  # first cell of the current excursion
    raised_at: IntArray  # the cell that raised the alarm in force, -1 when none


def _evaluate(history: pd.DataFrame, baseline: pd.DataFrame, p: _Params, policy: Policy) -> _Evaluated | None:
    if history.empty or baseline.empty:
        return None
    metric = history["metric"].astype("category")
    names = np.asarray(metric.cat.categories, dtype=object)
    mcode = metric.cat.codes.to_numpy().astype(np.int64)
    level = np.array([METRICS[n].level if n in METRICS else "" for n in names] + [""])  # the last: no metric
    gpu_level, node_level = level == "gpu", level == "node"
    direction = np.array([METRICS[n].direction or 1 if n in METRICS else 1 for n in names])
    uuid = history["gpu_uuid"].astype("category")
    node = history["node"].astype("category")
    n_uuid = len(uuid.cat.categories)
    ucode = uuid.cat.codes.to_numpy().astype(np.int64)
    ncode = node.cat.codes.to_numpy().astype(np.int64)
    is_gpu, is_node = gpu_level[mcode], node_level[mcode]
    key_code = np.where(is_gpu, ucode, n_uuid + ncode)
    values = history["value"].to_numpy(dtype=np.float64)
    usable = (mcode >= 0) & (ncode >= 0) & ((is_gpu & (ucode >= 0)) | is_node) & np.isfinite(values)
    if not usable.any():
        return None
    idx = np.flatnonzero(usable)
    ts = _micros(history["ts"])[idx]

    # In service: an entity measured in its node's newest run (a replaced GPU's old UUID is not; its
    # history must not keep asking that node to be re-certified).
    ent, node_k = key_code[idx], ncode[idx]
    node_last = np.full(len(node.cat.categories), np.iinfo(np.int64).min)
    np.maximum.at(node_last, node_k, ts)
    ent_last = np.full(n_uuid + len(node.cat.categories), np.iinfo(np.int64).min)
    np.maximum.at(ent_last, ent, ts)
    serving = np.zeros(len(ent_last), dtype=bool)
    serving[ent[(ts == ent_last[ent]) & (ts == node_last[node_k])]] = True
    idx, ts = idx[serving[ent]], ts[serving[ent]]

    sid, uniques = _dense(key_code[idx] * len(names) + mcode[idx])
    uniq_key, uniq_metric = uniques // len(names), uniques % len(names)
    key_names = np.concatenate(
        [np.asarray(uuid.cat.categories, dtype=object), np.asarray(node.cat.categories, dtype=object)]
    )
    # The baseline of each series, found through the history's own codes (no merge on text columns).
    own = baseline[baseline["level"].isin(["gpu", "node"])].reindex(
        columns=["level", "key", "metric", "center", "spread", "n", "first_ts"]
    )
    keys_b = own["key"].astype(object).to_numpy()
    on_gpu = (own["level"].astype(object) == "gpu").to_numpy()
    at_uuid = pd.Index(uuid.cat.categories).get_indexer(keys_b)
    at_node = pd.Index(node.cat.categories).get_indexer(keys_b)
    code_b = np.where(on_gpu, at_uuid, np.where(at_node >= 0, n_uuid + at_node, -1))
    metric_b = pd.Index(names).get_indexer(own["metric"].astype(object).to_numpy())
    composite = np.where((code_b >= 0) & (metric_b >= 0), code_b * len(names) + metric_b, -1)
    at = np.minimum(np.searchsorted(uniques, composite), len(uniques) - 1)
    hit = (composite >= 0) & (uniques[at] == composite)
    rows_b = np.flatnonzero(hit)
    # A key given twice: the last row wins, as a merge that keeps the last would.
    last_of, first_pos = np.unique(at[rows_b][::-1], return_index=True)
    chosen_b = rows_b[::-1][first_pos]
    picked = own.iloc[chosen_b]

    def baseline_column(column: str, fill: float) -> FloatArray:
        out = np.full(len(uniques), fill)
        out[last_of] = pd.to_numeric(picked[column], errors="coerce").to_numpy(dtype=np.float64)
        return out

    center = baseline_column("center", np.nan)
    spread = np.nan_to_num(baseline_column("spread", 0.0), nan=0.0)
    # A table without run counts (built by hand) is taken as complete: the store's tables always have them.
    n_base = np.nan_to_num(baseline_column("n", np.nan), nan=float(p.min_baseline_runs))
    first_ts = np.full(len(uniques), np.iinfo(np.int64).min)  # NaT: no record of when
    first_ts[last_of] = _micros(picked["first_ts"])
    good = np.isfinite(center) & (center > 0) & (n_base >= p.min_baseline_runs)
    keep = good[sid] & (ts >= first_ts[sid])  # a NaT first_ts (no record of when) keeps every run
    idx, sid, ts = idx[keep], sid[keep], ts[keep]
    if len(idx) == 0:
        return None

    run = history["run_id"].astype("category")
    run_names = np.asarray(run.cat.categories, dtype=object)
    rcode = run.cat.codes.to_numpy().astype(np.int64)[idx]
    x = values[idx]
    # Without ``n`` and ``rep_sd`` (a history built by hand): one repeat each, of unknown spread.
    repeats = history.reindex(columns=["n", "rep_sd"]).apply(pd.to_numeric, errors="coerce")
    n_rep = repeats["n"].fillna(1).to_numpy(dtype=np.int64)[idx]
    rep_sd = repeats["rep_sd"].to_numpy(dtype=np.float64)[idx]
    model = history["gpu_model"].astype("category") if "gpu_model" in history.columns else None
    model_code = model.cat.codes.to_numpy().astype(np.int64)[idx] if model is not None else np.zeros(len(idx))
    cohort = (model_code.astype(np.int64) + 1) * len(names) + mcode[idx]

    # Runs in time order (each run at its earliest sample; ties by name), then each series' rows by run.
    run_ts_s = pd.Series(ts).groupby(rcode).min()
    run_ts = np.full(len(run_names), np.iinfo(np.int64).max, dtype=np.int64)
    run_ts[run_ts_s.index.to_numpy()] = run_ts_s.to_numpy()
    rank = np.full(len(run_names), len(run_names), dtype=np.int64)
    by_time = np.lexsort((run_names[run_ts_s.index.to_numpy()].astype(str), run_ts_s.to_numpy()))
    rank[run_ts_s.index.to_numpy()[by_time]] = np.arange(len(by_time))
    order = np.argsort(sid.astype(np.int64) * (len(run_names) + 1) + rank[rcode], kind="stable")
    sid, rcode, x, n_rep, rep_sd, cohort, node_k = (
        a[order] for a in (sid, rcode, x, n_rep, rep_sd, cohort, ncode[idx])
    )
    last_rows = idx[order]
    dup = np.zeros(len(sid), dtype=bool)
    dup[1:] = (sid[1:] == sid[:-1]) & (rcode[1:] == rcode[:-1])
    if dup.any():
        # Several rows of one series in one run (a history built by hand): their median, pooled repeats.
        frame = pd.DataFrame(
            {"sid": sid, "rcode": rcode, "x": x, "n": n_rep, "v": rep_sd**2, "cohort": cohort}
            | {"node": node_k, "row": last_rows}
        )
        how = {"x": "median", "n": "sum", "v": "mean", "cohort": "first", "node": "last", "row": "last"}
        frame = frame.groupby(["sid", "rcode"], sort=False).agg(how).reset_index()
        frame = frame.iloc[
            np.argsort(frame["sid"].to_numpy() * (len(run_names) + 1) + rank[frame["rcode"]], kind="stable")
        ]
        sid, rcode, x = (frame[c].to_numpy() for c in ("sid", "rcode", "x"))
        n_rep, cohort, node_k = (frame[c].to_numpy(dtype=np.int64) for c in ("n", "cohort", "node"))
        rep_sd = np.sqrt(frame["v"].to_numpy(dtype=np.float64))
        last_rows = frame["row"].to_numpy(dtype=np.int64)

    # 1. The fleet factor per run and cohort, from every series with a baseline in that run.
    base_center = center[sid]
    factor = _fleet_factor(rcode, cohort, node_k, x / base_center, is_gpu[last_rows], policy)

    # Each series' own last `window` runs.
    sid, live = _dense(sid)
    lengths_all = np.bincount(sid, minlength=len(live)).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths_all)[:-1]])
    pos = np.arange(len(sid)) - starts[sid]
    inside = pos >= lengths_all[sid] - p.window
    sid, rcode, x, n_rep, rep_sd, cohort, factor, last_rows = (
        a[inside] for a in (sid, rcode, x, n_rep, rep_sd, cohort, factor, last_rows)
    )
    pos = pos[inside] - np.maximum(lengths_all[sid] - p.window, 0)
    lengths = np.minimum(lengths_all, p.window)

    # 2. The noise: the repeats' own spread, pooled robustly per series, floored at the cohort's.
    c_med, var_med, var_q99 = _factors_of(np.maximum(n_rep, 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        run_var = np.where((n_rep >= 2) & (x > 0), (rep_sd / x) ** 2, np.nan)
    rel_var = run_var / var_med
    pooled = pd.DataFrame({"v": rel_var, "df": np.where(np.isfinite(rel_var), n_rep - 1, 0)}).groupby(sid)
    per_series = pooled["v"].median().reindex(np.arange(len(live))).to_numpy()
    df = pooled["df"].sum().reindex(np.arange(len(live))).fillna(0).to_numpy(dtype=np.float64)
    series_cohort = np.zeros(len(live), dtype=np.int64)
    series_cohort[sid] = cohort
    cohort_typical = pd.Series(per_series).groupby(series_cohort).transform("median").to_numpy()
    # Shrunk toward the cohort's typical spread (worth _PRIOR_DF repeats of evidence), never below it: a
    # GPU seen twice has 4 degrees of freedom, and its own estimate alone would be off by a factor of 2.
    shrunk = (np.nan_to_num(per_series) * df + np.nan_to_num(cohort_typical) * _PRIOR_DF) / (df + _PRIOR_DF)
    shrunk = np.where(np.isfinite(cohort_typical), shrunk, per_series)
    s2 = np.fmax(shrunk, cohort_typical)
    metric_of = uniq_metric[live]
    cv_rep = np.array([policy.metrics[n].cv_rep if n in policy.metrics else 0.01 for n in names])[metric_of]
    s2 = np.where(np.isfinite(s2), s2, cv_rep**2)
    # Repeats that agree to the last digit are a benchmark artefact, not a precise GPU.
    s_rep = np.sqrt(np.maximum(s2, (cv_rep / 10) ** 2))
    c = center[live]
    typical = c_med * s_rep[sid] * c[sid]
    # A run whose own repeats disagree beyond chance (two transient bad samples of three drag the median
    # down 5-10 %) is judged with the spread it showed: a true step moves every repeat, so theirs agree.
    # Such a run is no evidence either way: it neither raises an alarm on its own nor clears one.
    wild = np.sqrt(np.nan_to_num(run_var / var_q99, nan=0.0))
    steady_cell = wild <= s_rep[sid]
    sigma_med = c_med * np.maximum(s_rep[sid], wild) * c[sid]
    sigma_c = np.fmax(spread[live][sid], typical) / np.sqrt(np.maximum(n_base[live][sid], 1.0))
    sigma_cell = np.hypot(sigma_med, sigma_c)

    # 3. Standardised, on the grid.
    width = int(lengths.max())
    shape = (len(live), width)
    grid_x, grid_f, grid_s = np.full(shape, np.nan), np.full(shape, np.nan), np.full(shape, np.nan)
    runs = np.full(shape, -1, dtype=np.int64)
    steady = np.ones(shape, dtype=bool)
    grid_x[sid, pos], grid_f[sid, pos], grid_s[sid, pos], runs[sid, pos] = x, factor, sigma_cell, rcode
    steady[sid, pos] = steady_cell
    sign = direction[metric_of].astype(np.float64)[:, None]
    u = np.clip(sign * (grid_x / grid_f - c[:, None]) / grid_s, -p.clip, p.clip)
    rel = grid_x / (grid_f * c[:, None]) - 1

    chart = _recursion(u, steady, lengths, p)  # stat, alarm, raised, cleared, by_step, onset, raised_at

    # Where each series lives now: the node (and GPU index) of its latest row.
    latest = last_rows[np.cumsum(lengths) - 1]
    is_gpu_series = uniq_key[live] < n_uuid
    meta = pd.DataFrame(
        {
            "node": history["node"].astype(object).to_numpy()[latest],
            "gpu": np.where(is_gpu_series, history["gpu"].to_numpy(dtype=object)[latest], None),
            "gpu_uuid": np.where(is_gpu_series, key_names[uniq_key[live]], np.array(None, dtype=object)),
            "metric": names[metric_of],
            "center": c,
        }
    )
    # The fields in their order: the series and their runs, the grids, then the chart.
    return _Evaluated(meta, run_names, run_ts, lengths, runs, grid_x, grid_f, grid_s, u, rel, *chart)


def _dense(keys: IntArray) -> tuple[IntArray, IntArray]:
    """``pd.factorize`` for non-negative integer keys: codes in key order, and the keys (a bitmap over the
    range when it is small, which is several times faster than hashing)."""
    span = int(keys.max(initial=-1)) + 1
    if span > 8 * len(keys) + 1024:
        uniq, codes = np.unique(keys, return_inverse=True)
        return codes.astype(np.int64), uniq.astype(np.int64)
    present = np.zeros(span, dtype=bool)
    present[keys] = True
    code_of = np.cumsum(present) - 1
    return code_of[keys].astype(np.int64), np.flatnonzero(present).astype(np.int64)


def _fleet_factor(
    rcode: IntArray, cohort: IntArray, node: IntArray, ratio: FloatArray, gpu_rows: BoolArray, policy: Policy
) -> FloatArray:
    """Per row, the median value/centre of its run's cohort when the cohort is large enough (the verdict
    engine's ``fleet`` rule: ``min_nodes`` nodes and, for GPU metrics, ``min_gpus`` GPUs), else 1."""
    group, _ = _dense(rcode * (int(cohort.max(initial=0)) + 1) + cohort)
    median = pd.Series(ratio).groupby(group).median().to_numpy(dtype=np.float64)
    count = np.bincount(group)
    _, pairs = _dense(group * (int(node.max(initial=0)) + 1) + node)  # distinct (group, node)
    nodes = np.bincount(pairs // (int(node.max(initial=0)) + 1), minlength=len(count))
    ok_group = nodes >= policy.fleet.min_nodes
    enough_rows = ok_group[group] & ((count[group] >= policy.fleet.min_gpus) | ~gpu_rows)
    factor = median[group]
    return np.where(enough_rows & np.isfinite(factor) & (factor > 0), factor, 1.0)


def _recursion(
    u: FloatArray, steady: BoolArray, lengths: IntArray, p: _Params
) -> tuple[FloatArray, BoolArray, BoolArray, BoolArray, BoolArray, IntArray, IntArray]:
    """The chart over positions, all series at once (``steady``: the cell's repeats agreed); returns per
    cell the statistic, the alarm state, where an alarm was raised or cleared (and whether by the one-run
    limit), and per series the onset of its current excursion and the cell that raised the alarm in force."""
    n, width = u.shape
    stat_t = np.zeros((n, width))
    alarm_t = np.zeros((n, width), dtype=bool)
    raised_t = np.zeros((n, width), dtype=bool)
    cleared_t = np.zeros((n, width), dtype=bool)
    step_t = np.zeros((n, width), dtype=bool)
    stat = np.zeros(n)
    alarm = np.zeros(n, dtype=bool)
    rest_at = np.full(n, -1, dtype=np.int64)
    raised_at = np.full(n, -1, dtype=np.int64)
    limit = p.threshold
    for t in range(width):
        live = t < lengths
        ut = np.nan_to_num(u[:, t])
        if p.method == "cusum":
            new = np.maximum(0.0, stat - ut - p.k)
            over, at_rest = new > p.h, new == 0.0
        else:
            new = p.lam * ut + (1 - p.lam) * stat
            over, at_rest = new < limit, new >= 0.0
        step = (ut < -p.shewhart) & steady[:, t]
        # An alarm in force clears at a run back at the baseline (the chart restarts) or at rest.
        back = alarm & (ut >= -p.clear) & steady[:, t]
        clear = live & alarm & (back | at_rest)
        new = np.where(clear & back, 0.0, new)
        rise = live & ~alarm & (over | step)
        alarm = np.where(live, (alarm & ~clear) | rise, alarm)
        stat = np.where(live, new, stat)
        raised_at = np.where(rise, t, np.where(clear, -1, raised_at))
        rest_at = np.where(live & ~alarm & (at_rest | clear), t, rest_at)
        stat_t[:, t], alarm_t[:, t], raised_t[:, t], cleared_t[:, t] = stat, alarm & live, rise, clear
        step_t[:, t] = rise & step & ~over
    onset = np.minimum(rest_at + 1, lengths - 1)
    return stat_t, alarm_t, raised_t, cleared_t, step_t, onset, raised_at


def _micros(column: pd.Series) -> IntArray:
    """Timestamps as int64 microseconds since the epoch (UTC; a naive time is UTC; NaT the smallest int64)."""
    index = pd.DatetimeIndex(pd.to_datetime(column, utc=True)).as_unit("us")
    return np.asarray(index.asi8, dtype=np.int64)


# --- the public entry points ---------------------------------------------------------------------------


def drift_alarms(
    history: pd.DataFrame,
    baseline: pd.DataFrame,
    *,
    method: Literal["cusum", "ewma"] | None = None,
    k: float | None = None,
    h: float | None = None,
    lam: float | None = None,
    L: float | None = None,
    shewhart: float | None = None,
    clip: float | None = None,
    clear: float | None = None,
    window: int | None = None,
    policy: Policy | None = None,
    all_series: bool = False,
) -> pd.DataFrame:
    """The drift alarms of every GPU (and node) series in ``history`` against its own ``baseline``.

    ``history``: :data:`HISTORY_COLUMNS`, one row per run, entity and metric (without ``n`` and ``rep_sd`` the
    policy's ``cv_rep`` stands in for the repeats' spread); ``baseline``: the store's table. Every parameter left
    None comes from ``policy.drift``; ``window`` is each series' last N runs.

    Returns :data:`DRIFT_COLUMNS`, one row per series in alarm at its latest run (every series with
    ``all_series``), alarms first, worst first: ``statistic`` (C ≥ 0, or z) against ``threshold`` (h, or the
    negative EWMA limit), ``onset_run`` (the first run of the current excursion), ``first_run_over`` (the run that
    raised the alarm), ``deviation_pct`` (mean deviation from the fleet-corrected baseline since the onset),
    ``fleet_pct`` (the fleet's own shift), ``sigma`` (σ_t at the last run), ``action`` (``recertify``) and a
    ``reason`` in words. Series without a complete baseline, or whose GPU left its node, are left out.
    Raises ``ValueError`` for an unknown method or a non-positive parameter.
    """
    policy = policy or default_policy()
    p = _params(policy, method=method, k=k, h=h, lam=lam, L=L, shewhart=shewhart, clip=clip, clear=clear, window=window)
    ev = _evaluate(history, baseline, p, policy)
    if ev is None:
        return _empty_alarms()
    n = len(ev.lengths)
    last = ev.lengths - 1
    rows = np.arange(n)
    alarm = ev.alarm[rows, last]
    chosen = rows if all_series else np.flatnonzero(alarm)
    if len(chosen) == 0:
        return _empty_alarms()
    last_c, onset = last[chosen], ev.onset[chosen]
    # Mean relative deviation from the onset to the last run, from cumulative sums along each row.
    csum = np.cumsum(np.nan_to_num(ev.rel[chosen], nan=0.0), axis=1)
    at = np.arange(len(chosen))
    before = np.where(onset > 0, csum[at, np.maximum(onset - 1, 0)], 0.0)
    deviation = (csum[at, last_c] - before) / (last_c - onset + 1) * 100
    raised_at = ev.raised_at[chosen]

    def run_at(position: IntArray) -> npt.NDArray[np.object_]:
        names = np.full(len(position), None, dtype=object)
        ok = position >= 0
        names[ok] = ev.run_names[ev.runs[chosen[ok], position[ok]]]
        return names

    out = pd.DataFrame(
        {
            **_series_meta(ev, chosen),
            "method": p.method,
            "statistic": ev.stat[chosen, last_c],
            "threshold": p.threshold,
            "alarm": alarm[chosen],
            "runs": ev.lengths[chosen].astype(np.int64),
            "onset_run": run_at(onset),
            "first_run_over": run_at(raised_at),
            "last_run": run_at(last_c),
            "deviation_pct": deviation,
            "fleet_pct": (ev.fleet[chosen, last_c] - 1) * 100,
            "sigma": ev.sigma[chosen, last_c],
            "action": np.where(alarm[chosen], "recertify", "none"),
        }
    )
    safe = np.maximum(raised_at, 0)
    step_only = (raised_at >= 0) & ev.by_step[chosen, safe]
    step_u = ev.u[chosen, safe]
    records = [{str(c): v for c, v in r.items()} for r in out.to_dict("records")]
    out["reason"] = [
        _reason(row, p, bool(s), float(z)) if row["alarm"] else ""
        for row, s, z in zip(records, step_only, step_u, strict=True)
    ]  # alarms are few: one line of words each
    # Alarms first, then the furthest beyond the threshold, in the statistic's own direction.
    severity = out["statistic"] - p.threshold if p.method == "cusum" else p.threshold - out["statistic"]
    order = np.lexsort(
        (out["metric"].astype(str), out["node"].astype(str), -severity.to_numpy(), ~out["alarm"].to_numpy())
    )
    return out.iloc[order].reset_index(drop=True)[list(DRIFT_COLUMNS)]


def drift_trace(
    history: pd.DataFrame,
    baseline: pd.DataFrame,
    series: pd.DataFrame | None = None,
    *,
    method: Literal["cusum", "ewma"] | None = None,
    window: int | None = None,
    policy: Policy | None = None,
) -> pd.DataFrame:
    """Night by night, what the detector saw on ``series`` (rows naming ``metric`` and ``gpu_uuid``, or ``node``
    for node metrics, as :func:`drift_alarms`' do; None: every series): :data:`TRACE_COLUMNS`, by series then
    time, with the same parameters as :func:`drift_alarms`."""
    policy = policy or default_policy()
    p = _params(policy, method=method, window=window)
    ev = _evaluate(history, baseline, p, policy)
    if ev is None:
        return _empty_trace()
    chosen = np.arange(len(ev.lengths))
    if series is not None:
        if series.empty:
            return _empty_trace()
        wanted = _series_names(series).assign(keep=True).drop_duplicates(["metric", "entity"])
        have = _series_names(ev.meta)
        chosen = np.flatnonzero(have.merge(wanted, on=["metric", "entity"], how="left")["keep"].notna())
        if len(chosen) == 0:
            return _empty_trace()
    mask = np.arange(ev.runs.shape[1])[None, :] < ev.lengths[chosen][:, None]
    s, t = np.nonzero(mask)
    cells = chosen[s]
    run_codes = ev.runs[cells, t]
    out = pd.DataFrame(
        {
            **_series_meta(ev, cells),
            "run_id": ev.run_names[run_codes],
            "ts": pd.to_datetime(ev.run_ts[run_codes], unit="us", utc=True),
            "value": ev.x[cells, t],
            "fleet_factor": ev.fleet[cells, t],
            "sigma": ev.sigma[cells, t],
            "u": ev.u[cells, t],
            "statistic": ev.stat[cells, t],
            "threshold": p.threshold,
            "alarm": ev.alarm[cells, t],
            "raised": ev.raised[cells, t],
            "cleared": ev.cleared[cells, t],
        }
    )
    return out[list(TRACE_COLUMNS)]


def _series_meta(ev: _Evaluated, rows: IntArray) -> dict[str, Any]:
    """The columns naming the series of ``rows`` (node, gpu, gpu_uuid, metric) and their own baseline's centre."""
    picked = ev.meta.iloc[rows]
    columns = {c: picked[c].to_numpy() for c in ("node", "gpu_uuid", "metric", "center")}
    return columns | {"gpu": pd.array(picked["gpu"].to_numpy(), dtype="Int64")}


def _series_names(frame: pd.DataFrame) -> pd.DataFrame:
    """Each row's series: its metric, and its entity (the GPU's UUID, else the node's name)."""
    uuid = frame["gpu_uuid"].astype(object)
    return pd.DataFrame(
        {"metric": frame["metric"].astype(object).to_numpy(), "entity": uuid.where(uuid.notna(), frame["node"])}
    )


@dataclass(frozen=True)
class DriftCheck:
    """One night's drift check: the history read, the baseline it was judged against, and the alarms."""

    history: pd.DataFrame
    baseline: pd.DataFrame
    alarms: pd.DataFrame

    def asked(self) -> dict[str, str]:
        """Node → why it should be re-certified: its worst alarm's reason (alarms come worst first)."""
        first = self.alarms.drop_duplicates("node", keep="first")
        return dict(zip(first["node"].astype(str), "drift: " + first["reason"].astype(str), strict=True))


def check_drift(store: BaselineStore, policy: Policy | None = None, *, workers: int = 8) -> DriftCheck:
    """Read each GPU's own last ``policy.drift.window_runs`` certifications (at most ``lookback_days``
    back) and the current baseline from ``store``, and run :func:`drift_alarms` with the policy."""
    policy = policy or default_policy()
    baseline = store.read()
    history = history_from_store(
        store,
        last_runs=policy.drift.window_runs,
        max_days=policy.drift.lookback_days,
        baseline=baseline,
        workers=workers,
    )
    alarms = drift_alarms(history, baseline, policy=policy) if len(history) else _empty_alarms()
    return DriftCheck(history=history, baseline=baseline, alarms=alarms)


def _reason(row: dict[str, Any], p: _Params, by_step: bool, step_u: float) -> str:
    metric, uuid = str(row["metric"]), row["gpu_uuid"]
    unit = METRICS[metric].unit if metric in METRICS else ""
    statistic, threshold, deviation = (float(row["statistic"]), float(row["threshold"]), float(row["deviation_pct"]))
    if by_step:
        how = f"one run {abs(step_u):.1f} σ below it (limit {p.shewhart:g} σ) in run {row['first_run_over']}"
    elif p.method == "cusum":
        how = f"lower CUSUM {statistic:.1f} > h = {threshold:g} (k = {p.k:g}) since run {row['first_run_over']}"
    else:
        how = f"lower EWMA {statistic:.2f} σ < {threshold:.2f} σ (λ = {p.lam:g}) since run {row['first_run_over']}"
    fleet = float(row["fleet_pct"])
    fleet_words = f", beyond the fleet's own {fleet:+.1f} %" if abs(fleet) >= 0.05 else ""
    return (
        f"{metric} has drifted {abs(deviation):.1f} % {'below' if deviation < 0 else 'from'} "
        f"{'this GPU' if isinstance(uuid, str) else 'this node'}'s own baseline "
        f"({float(row['center']):.4g} {unit}, σ {float(row['sigma']):.3g}){fleet_words} since run "
        f"{row['onset_run']}: {how}, over {row['runs']} runs; schedule a re-certification "
        "(a drift alarm alone drains nothing)"
    )


def _empty(columns: Sequence[str], types: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in columns}).astype(types)


def _empty_alarms() -> pd.DataFrame:
    floats = dict.fromkeys(("statistic", "threshold", "deviation_pct", "fleet_pct", "center", "sigma"), np.float64)
    return _empty(DRIFT_COLUMNS, {"gpu": "Int64", "alarm": bool, "runs": np.int64, **floats})


def _empty_trace() -> pd.DataFrame:
    floats = dict.fromkeys(("value", "center", "fleet_factor", "sigma", "u", "statistic", "threshold"), np.float64)
    flags = dict.fromkeys(("alarm", "raised", "cleared"), bool)
    return _empty(TRACE_COLUMNS, {"gpu": "Int64", "ts": "datetime64[us, UTC]", **flags, **floats})
