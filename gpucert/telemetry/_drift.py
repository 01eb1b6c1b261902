"""Slow drift on each GPU's own history (REFERENCE.md §4.8): lower CUSUM or lower EWMA per GPU × metric.

Input: per run, each GPU's median of a performance metric (and each node's, for node metrics), from
:func:`history_from_store` or :func:`run_medians`. Each value is standardised against the entity's own
baseline (the store's ``baseline.parquet``, level ``gpu`` keyed by UUID or ``node`` keyed by node name):
``u_t = (x_t − μ0) / σ0`` with ``σ0 = max(spread, cv_rep · μ0)`` (REFERENCE §4.4 R1; ``cv_rep`` from the
policy), so a drop is negative. Then, per series, starting at 0 at the baseline's first run:

* CUSUM: ``C_t = max(0, C_{t−1} − u_t − k)``, alarm while ``C_t > h`` (k = 0.5, h = 5: in-control ARL
  ≈ 930 runs, a sustained 1σ drop is flagged after ≈ 10.4 runs);
* EWMA: ``z_t = λ·u_t + (1 − λ)·z_{t−1}``, alarm while ``z_t < −L·sqrt(λ / (2 − λ))`` (λ = 0.2, L = 3.0:
  ARL ≈ 1,130, 1σ drop after ≈ 10.8 runs).

``u`` is clipped to ±``clip`` (4 by default) first: one wildly low run (a link trained down for a night,
which the gates judge on their own) must not leave the CUSUM above ``h`` for dozens of runs, while any
sustained shift of a few σ still crosses within two or three runs. Runs before the baseline's
``first_ts`` are left out: a re-baseline (a repair, a stack change) starts the GPU's history afresh.

The recursion runs over runs — few — with numpy across all series at once: 10,000 GPUs × 5 metrics ×
30 runs is one pass over a 50,000 × 30 array. An alarm asks for a re-certification only; it drains
nothing by itself (REFERENCE §4.8).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import StoreError
from ..metrics import METRICS
from ..policy import Policy, default_policy
from ..store import BaselineStore
from ._common import utc

__all__ = [
    "DRIFT_COLUMNS",
    "DRIFT_METRICS",
    "HISTORY_COLUMNS",
    "drift_alarms",
    "ewma_limit",
    "history_from_store",
    "run_medians",
]

#: The performance metrics drift is watched on by default (GPU level, and the node's all-reduce).
DRIFT_METRICS: tuple[str, ...] = (
    "gemm_bf16_tflops",
    "hbm_copy_gbps",
    "h2d_gbps",
    "d2h_gbps",
    "nccl_allreduce_busbw_gbps",
)
#: One row per run and GPU (or node) and metric: the median of its repeats (``n`` of them).
HISTORY_COLUMNS: tuple[str, ...] = (
    "run_id",
    "ts",
    "node",
    "gpu",
    "gpu_uuid",
    "gpu_model",
    "metric",
    "value",
    "n",
)
DRIFT_COLUMNS: tuple[str, ...] = (
    "node",
    "gpu",
    "gpu_uuid",
    "metric",
    "method",
    "statistic",
    "threshold",
    "alarm",
    "runs",
    "onset_run",
    "first_run_over",
    "last_run",
    "deviation_pct",
    "center",
    "sigma",
    "action",
    "reason",
)

_CATEGORIES = ("run_id", "node", "gpu_uuid", "gpu_model", "metric")
_RESULT_READ = ["run_id", "node", "gpu", "gpu_uuid", "gpu_model", "metric", "value", "ts"]
_GROUP = ["run_id", "node", "gpu", "gpu_uuid", "gpu_model", "metric"]


# --- history -------------------------------------------------------------------------------------------


def run_medians(results: pd.DataFrame, metrics: Sequence[str] = DRIFT_METRICS) -> pd.DataFrame:
    """Per run, GPU (or node) and metric of ``metrics``: the median of the repeats, their count ``n``, and
    the run's time ``ts`` (its earliest sample). Returns the :data:`HISTORY_COLUMNS`; non-finite values and
    pair metrics are left out."""
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
    out["ts"] = out["run_id"].map(run_ts).astype(run_ts.dtype)
    return out


def history_from_store(
    store: BaselineStore,
    *,
    since: date | datetime | None = None,
    metrics: Sequence[str] = DRIFT_METRICS,
    last_runs: int = 30,
    workers: int = 8,
) -> pd.DataFrame:
    """The per-run medians (:func:`run_medians`) of the last ``last_runs`` runs in ``store`` with results,
    from ``since`` on (a date: runs of that day and later; a datetime: runs whose first sample is not
    earlier), oldest first. A run without ``results.parquet`` (no node produced results) is skipped.

    Raises :class:`~gpucert.errors.StoreError` when a results file cannot be read or parsed (naming the
    run), and ``ValueError`` when ``last_runs`` < 1.
    """
    if last_runs < 1:
        raise ValueError(f"last_runs must be at least 1, not {last_runs}")
    runs = store.list_runs()
    if since is not None:
        first_day = since.date() if isinstance(since, datetime) else since
        runs = [(day, run) for day, run in runs if day >= first_day]
    # Read a few more than asked: some runs have no results, and the store orders a day's runs by name.
    candidates = runs[-(last_runs + max(4, last_runs // 2)) :]

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
            text = [c for c in _CATEGORIES if c in schema.names and pa.types.is_string(schema.field(c).type)]
            table = pq.read_table(io.BytesIO(data), columns=_RESULT_READ, read_dictionary=text)
            run_ts = pc.min(table.column("ts")).as_py()
            table = table.filter(pc.is_in(table.column("metric"), value_set=pa.array(list(metrics))))
        except (pa.ArrowException, OSError, ValueError, KeyError) as exc:
            raise StoreError(f"results of run {run_id} ({day}) cannot be read: {exc}") from exc
        medians = _medians(table.to_pandas(), metrics)
        if len(medians) and run_ts is not None:  # the run's time: its earliest sample of any metric
            medians["ts"] = pd.Timestamp(utc(run_ts)).as_unit("us")
        return medians

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="gpucert-history") as pool:
        parts = [p for p in pool.map(load, candidates) if p is not None and len(p)]
    if not parts:
        return _empty_history()
    history = _concat(parts)
    if isinstance(since, datetime):
        history = history[history["ts"] >= pd.Timestamp(utc(since))]
    order = history.groupby("run_id", sort=False)["ts"].min().sort_values(kind="stable")
    keep = order.index[-last_runs:]
    history = history[history["run_id"].isin(keep)]
    history = history.sort_values(["ts", "run_id"], kind="stable", ignore_index=True)
    return _typed(history)


def _concat(parts: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate frames whose category columns differ, keeping them categorical (no detour via text)."""
    parts = [p.astype(dict.fromkeys(_CATEGORIES, "category")) for p in parts]
    for name in _CATEGORIES:
        every = pd.Index(np.concatenate([np.asarray(p[name].cat.categories, dtype=object) for p in parts]))
        union = sorted(every.unique())
        for p in parts:
            p[name] = p[name].cat.set_categories(union)
    return pd.concat(parts, ignore_index=True)


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame[list(HISTORY_COLUMNS)].copy()
    for name in _CATEGORIES:
        out[name] = out[name].astype("category")
    out["gpu"] = out["gpu"].astype("Int64")
    out["ts"] = pd.to_datetime(out["ts"], utc=True).dt.as_unit("us")
    out["value"] = out["value"].astype(np.float64)
    return out.reset_index(drop=True)


def _empty_history() -> pd.DataFrame:
    return _typed(
        pd.DataFrame({c: pd.Series(dtype=object) for c in HISTORY_COLUMNS}).astype(
            {"value": np.float64, "n": np.int64, "ts": "datetime64[us, UTC]"}
        )
    )


# --- the statistics ------------------------------------------------------------------------------------


def ewma_limit(lam: float, L: float) -> float:
    """The lower EWMA control limit (asymptotic): ``−L·sqrt(λ / (2 − λ))`` in σ0 units."""
    return -L * math.sqrt(lam / (2 - lam))


def drift_alarms(
    history: pd.DataFrame,
    baseline: pd.DataFrame,
    *,
    method: Literal["cusum", "ewma"] = "cusum",
    k: float = 0.5,
    h: float = 5.0,
    lam: float = 0.2,
    L: float = 3.0,
    clip: float = 4.0,
    policy: Policy | None = None,
    all_series: bool = False,
) -> pd.DataFrame:
    """The drift alarms of every GPU (and node) series in ``history`` against its own ``baseline``.

    ``history``: :data:`HISTORY_COLUMNS` (at least run_id, ts, node, gpu, gpu_uuid, metric, value), one
    row per run and entity and metric; ``baseline``: the store's table (only ``gpu`` and ``node`` rows are
    used). ``method``: ``cusum`` (``k``, ``h``) or ``ewma`` (``lam``, ``L``); see the module docstring.
    ``policy`` gives each metric's ``cv_rep`` (the floor of σ0).

    Returns :data:`DRIFT_COLUMNS`, one row per series whose statistic is beyond its threshold at its latest
    run (every series with ``all_series``), worst first: ``statistic`` (C ≥ 0, or z), ``threshold`` (h, or
    the negative EWMA limit), ``runs`` (runs in the series since its baseline began), ``onset_run`` (the
    first run of the current excursion: after the last C = 0, or z ≥ 0), ``first_run_over`` (the run that
    crossed the threshold), ``deviation_pct`` (mean deviation from the baseline since the onset),
    ``action`` (``recertify``: an alarm drains nothing by itself) and a ``reason`` in words. Series without
    a baseline, or whose baseline centre is not positive, are left out.
    Raises ``ValueError`` for an unknown method or a non-positive parameter.
    """
    if method not in ("cusum", "ewma"):
        raise ValueError(f"method is 'cusum' or 'ewma', not {method!r}")
    for name, value in (("h", h), ("lam", lam), ("L", L), ("clip", clip)):
        if not value > 0:
            raise ValueError(f"{name} must be positive, not {value!r}")
    if not 0 < lam <= 1:
        raise ValueError(f"lam must be in (0, 1], not {lam!r}")
    policy = policy or default_policy()
    series = _series(history, baseline, policy)
    if series is None:
        return _empty_alarms()
    u, rel, runs, lengths, meta, run_names = series
    n_series, width = u.shape
    u = np.clip(u, -clip, clip)

    stat = np.zeros(n_series)
    over_since = np.full(n_series, -1, dtype=np.int64)
    quiet_at = np.full(n_series, -1, dtype=np.int64)  # last position where the statistic was at rest
    threshold = h if method == "cusum" else ewma_limit(lam, L)
    for t in range(width):
        live = t < lengths
        ut = u[:, t]
        if method == "cusum":
            new = np.maximum(0.0, stat - ut - k)
            over = new > h
            rest = new == 0.0
        else:
            new = lam * ut + (1 - lam) * stat
            over = new < threshold
            rest = new >= 0.0
        stat = np.where(live, new, stat)
        crossed = live & over & (over_since < 0)
        over_since = np.where(crossed, t, over_since)
        over_since = np.where(live & ~over, -1, over_since)
        quiet_at = np.where(live & rest, t, quiet_at)

    alarm = over_since >= 0
    chosen = np.arange(n_series) if all_series else np.flatnonzero(alarm)
    if len(chosen) == 0:
        return _empty_alarms()
    onset = quiet_at[chosen] + 1
    onset = np.minimum(onset, lengths[chosen] - 1)
    last = lengths[chosen] - 1
    # Mean relative deviation from the onset to the last run, from cumulative sums along each row.
    csum = np.nancumsum(np.nan_to_num(rel[chosen], nan=0.0), axis=1)
    rows = np.arange(len(chosen))
    before = np.where(onset > 0, csum[rows, np.maximum(onset - 1, 0)], 0.0)
    deviation = (csum[rows, last] - before) / (last - onset + 1) * 100

    def run_at(pos: npt.NDArray[np.int64]) -> npt.NDArray[np.object_]:
        names = np.full(len(pos), None, dtype=object)
        ok = pos >= 0
        names[ok] = run_names[runs[chosen[ok], pos[ok]]]
        return names

    picked = meta.iloc[chosen].reset_index(drop=True)
    out = pd.DataFrame(
        {
            "node": picked["node"].to_numpy(),
            "gpu": pd.array(picked["gpu"].to_numpy(), dtype="Int64"),
            "gpu_uuid": picked["gpu_uuid"].to_numpy(),
            "metric": picked["metric"].to_numpy(),
            "method": method,
            "statistic": stat[chosen],
            "threshold": threshold,
            "alarm": alarm[chosen],
            "runs": lengths[chosen].astype(np.int64),
            "onset_run": run_at(onset),
            "first_run_over": run_at(over_since[chosen]),
            "last_run": run_at(last),
            "deviation_pct": deviation,
            "center": picked["center"].to_numpy(),
            "sigma": picked["sigma"].to_numpy(),
            "action": np.where(alarm[chosen], "recertify", "none"),
        }
    )
    records: list[dict[str, Any]] = [{str(c): v for c, v in r.items()} for r in out.to_dict("records")]
    out["reason"] = [_reason(row, method, k, lam) if row["alarm"] else "" for row in records]
    # Worst first: the furthest beyond its threshold, in the statistic's own direction.
    severity = out["statistic"] - threshold if method == "cusum" else threshold - out["statistic"]
    order = np.lexsort((out["metric"].astype(str), out["node"].astype(str), -severity.to_numpy()))
    return out.iloc[order].reset_index(drop=True)[list(DRIFT_COLUMNS)]


def _reason(row: dict[str, Any], method: str, k: float, lam: float) -> str:
    metric, uuid = str(row["metric"]), row["gpu_uuid"]
    unit = METRICS[metric].unit if metric in METRICS else ""
    statistic, threshold, deviation = (
        float(row["statistic"]),
        float(row["threshold"]),
        float(row["deviation_pct"]),
    )
    stat = (
        f"lower CUSUM {statistic:.1f} > h = {threshold:g} (k = {k:g})"
        if method == "cusum"
        else f"lower EWMA {statistic:.2f} σ0 < {threshold:.2f} σ0 (λ = {lam:g})"
    )
    return (
        f"{metric} has drifted {abs(deviation):.1f} % {'below' if deviation < 0 else 'from'} "
        f"{'this GPU' if isinstance(uuid, str) else 'this node'}'s own baseline "
        f"({float(row['center']):.4g} {unit}, σ0 {float(row['sigma']):.3g}) since run {row['onset_run']}: "
        f"{stat} since run {row['first_run_over']}, over {row['runs']} runs; schedule a re-certification "
        "(a drift alarm alone drains nothing)"
    )


def _empty_alarms() -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype=object) for c in DRIFT_COLUMNS})
    return frame.astype(
        {
            "gpu": "Int64",
            "statistic": np.float64,
            "threshold": np.float64,
            "alarm": bool,
            "runs": np.int64,
            "deviation_pct": np.float64,
            "center": np.float64,
            "sigma": np.float64,
        }
    )


_Series = tuple[
    npt.NDArray[np.float64],  # u[series, position]: standardised, NaN past the series' end
    npt.NDArray[np.float64],  # rel[series, position]: (x - center) / center
    npt.NDArray[np.int64],  # runs[series, position]: code of the run (into run_names)
    npt.NDArray[np.int64],  # lengths[series]
    pd.DataFrame,  # meta per series: node, gpu, gpu_uuid, metric, center, sigma
    npt.NDArray[np.object_],  # run_names
]


def _series(history: pd.DataFrame, baseline: pd.DataFrame, policy: Policy) -> _Series | None:
    """The standardised history as a (series × position) array, each series its own runs in time order."""
    if history.empty or baseline.empty:
        return None
    metric = history["metric"].astype("category")
    names = np.asarray(metric.cat.categories, dtype=object)
    mcode = metric.cat.codes.to_numpy()
    # Per category, then gathered through the codes (-1, a missing metric, lands on the appended False).
    gpu_level = np.array([n in METRICS and METRICS[n].level == "gpu" for n in names] + [False])
    node_level = np.array([n in METRICS and METRICS[n].level == "node" for n in names] + [False])
    uuid = history["gpu_uuid"].astype("category")
    node = history["node"].astype("category")
    n_uuid = len(uuid.cat.categories)
    ucode, ncode = uuid.cat.codes.to_numpy().astype(np.int64), node.cat.codes.to_numpy().astype(np.int64)
    is_gpu, is_node = gpu_level[mcode], node_level[mcode]
    key_code = np.where(is_gpu, ucode, n_uuid + ncode)
    usable = (mcode >= 0) & ((is_gpu & (ucode >= 0)) | (is_node & (ncode >= 0)))
    values = history["value"].to_numpy(dtype=np.float64)
    usable &= np.isfinite(values)
    if not usable.any():
        return None
    idx = np.flatnonzero(usable)
    sid, uniques = pd.factorize(key_code[idx] * len(names) + mcode[idx])
    uniq_key, uniq_metric = uniques // len(names), uniques % len(names)
    key_names = np.concatenate(
        [np.asarray(uuid.cat.categories, dtype=object), np.asarray(node.cat.categories, dtype=object)]
    )
    # The baseline of each series (a small merge: one row per series, not per run).
    wanted = pd.DataFrame(
        {
            "level": np.where(uniq_key < n_uuid, "gpu", "node"),
            "key": key_names[uniq_key],
            "metric": names[uniq_metric],
            "sid": np.arange(len(uniques)),
        }
    )
    own = baseline[baseline["level"].isin(["gpu", "node"])][
        ["level", "key", "metric", "center", "spread", "first_ts"]
    ]
    own = own.astype({"level": object, "key": object, "metric": object})
    found = wanted.merge(own, on=["level", "key", "metric"], how="left").sort_values("sid", kind="stable")
    center = found["center"].to_numpy(dtype=np.float64)
    cv_rep_of = np.array([policy.metrics[n].cv_rep if n in policy.metrics else np.nan for n in names])
    cv_rep = cv_rep_of[uniq_metric]
    sigma = np.fmax(found["spread"].to_numpy(dtype=np.float64), cv_rep * center)
    first_ts = _micros(found["first_ts"])
    good = np.isfinite(center) & (center > 0) & np.isfinite(sigma) & (sigma > 0)

    ts = _micros(history["ts"])[idx]
    keep = good[sid]
    keep &= ts >= first_ts[sid]  # a NaT first_ts (no record of when) is the smallest int64: every run kept
    idx, sid, ts = idx[keep], sid[keep], ts[keep]
    if len(idx) == 0:
        return None
    run = history["run_id"].astype("category")
    run_names = np.asarray(run.cat.categories, dtype=object)
    rcode = run.cat.codes.to_numpy().astype(np.int64)[idx]
    x = values[idx]

    # Runs in time order (each run at its earliest sample; ties by name), then each series' rows by run:
    # one integer sort instead of a sort on three keys.
    run_ts = pd.Series(ts).groupby(rcode).min()
    rank = np.full(len(run_names), len(run_names), dtype=np.int64)
    by_time = np.lexsort((run_names[run_ts.index.to_numpy()].astype(str), run_ts.to_numpy()))
    rank[run_ts.index.to_numpy()[by_time]] = np.arange(len(by_time))
    order = np.argsort(sid.astype(np.int64) * (len(run_names) + 1) + rank[rcode], kind="stable")
    sid, rcode, x = sid[order], rcode[order], x[order]
    dup = np.zeros(len(sid), dtype=bool)
    dup[1:] = (sid[1:] == sid[:-1]) & (rcode[1:] == rcode[:-1])
    if dup.any():
        # Several rows of one series in one run (a history built by hand): their median.
        frame = pd.DataFrame({"sid": sid, "rcode": rcode, "x": x})
        frame = frame.groupby(["sid", "rcode"], sort=False)["x"].median().reset_index()
        frame = frame.iloc[
            np.argsort(frame["sid"].to_numpy() * (len(run_names) + 1) + rank[frame["rcode"]], kind="stable")
        ]
        sid, rcode, x = (frame[c].to_numpy() for c in ("sid", "rcode", "x"))

    # Renumber the series that kept rows, then place each row at its position within its series.
    live, sid = np.unique(sid, return_inverse=True)
    lengths = np.bincount(sid, minlength=len(live)).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pos = np.arange(len(sid)) - starts[sid]
    width = int(lengths.max())
    u = np.full((len(live), width), np.nan)
    rel = np.full((len(live), width), np.nan)
    runs = np.full((len(live), width), -1, dtype=np.int64)
    c, s = center[live][sid], sigma[live][sid]
    u[sid, pos] = (x - c) / s  # every drift metric is higher-is-better: a drop is negative
    rel[sid, pos] = (x - c) / c
    runs[sid, pos] = rcode

    # Where each series lives now: the node (and GPU index) of its latest row.
    last_rows = idx[order][np.cumsum(lengths) - 1] if not dup.any() else None
    meta = pd.DataFrame(
        {
            "level": wanted["level"].to_numpy()[live],
            "key": wanted["key"].to_numpy()[live],
            "metric": wanted["metric"].to_numpy()[live],
            "center": center[live],
            "sigma": sigma[live],
        }
    )
    if last_rows is not None:
        meta["node"] = history["node"].astype(object).to_numpy()[last_rows]
        meta["gpu"] = history["gpu"].to_numpy(dtype=object)[last_rows]
    else:
        latest = _latest_place(history, idx)
        meta = meta.merge(latest, on=["level", "key"], how="left")
    is_gpu_series = meta["level"].to_numpy() == "gpu"
    meta["gpu_uuid"] = np.where(
        is_gpu_series, meta["key"].to_numpy(dtype=object), np.array(None, dtype=object)
    )
    meta.loc[~is_gpu_series, "gpu"] = None
    return u, rel, runs, lengths, meta, run_names


def _micros(column: pd.Series) -> npt.NDArray[np.int64]:
    """Timestamps as int64 microseconds since the epoch (UTC; a naive time is UTC; NaT the smallest int64)."""
    index = pd.DatetimeIndex(pd.to_datetime(column, utc=True)).as_unit("us")
    return np.asarray(index.asi8, dtype=np.int64)


def _latest_place(history: pd.DataFrame, idx: npt.NDArray[np.intp]) -> pd.DataFrame:
    """Per entity, the node and GPU index of its latest row (the slow path, for hand-built histories)."""
    rows = history.iloc[idx]
    level = np.where(rows["gpu"].notna().to_numpy(), "gpu", "node")
    frame = pd.DataFrame(
        {
            "level": level,
            "key": np.where(level == "gpu", rows["gpu_uuid"].astype(object), rows["node"].astype(object)),
            "node": rows["node"].astype(object).to_numpy(),
            "gpu": rows["gpu"].to_numpy(dtype=object),
            "ts": pd.to_datetime(rows["ts"], utc=True).to_numpy(),
        }
    )
    return frame.sort_values("ts", kind="stable").drop_duplicates(["level", "key"], keep="last")[
        ["level", "key", "node", "gpu"]
    ]
