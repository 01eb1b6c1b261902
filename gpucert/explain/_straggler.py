"""The straggler as the job itself sees it: when a GPU's own telemetry is silent, its peers still wait for it.

In synchronous training every rank enters each collective and leaves it together: the rank that finishes its
compute last arrives last, so *its* collectives are the shortest and every other rank's are longer by the time
they waited for it. NCCL Inspector reports each rank's execution time per collective; per (communicator,
collective) and instant every rank's time is divided by the median of all ranks', so communicators of different
sizes weigh alike, and a rank whose relative time sits persistently below its peers' (by
:data:`COLLECTIVE_GATE` and :data:`ROBUST_Z` robust standard deviations) is the one they wait for. Where the
job's step time is reported per pod and a pod is slower than its peers, that pod's node is the straggler too.

Everything here is vectorised over (instant × rank) matrices on the telemetry's grid; nothing loops per row.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ._grid import FloatArray, Grid, telemetry_grid

__all__ = ["COLLECTIVE_GATE", "POD_STEP_GATE", "JobFinding", "collective_grid", "pod_step_grid", "rank_departures"]

#: A rank whose collectives take this much less than its peers' (relative) is the one they wait for.
COLLECTIVE_GATE = 0.10
#: A pod whose step time exceeds its peers' by this much departs (pods that report their own compute time).
POD_STEP_GATE = 0.05
ROBUST_Z = 5.0
#: Column indexes from here on are ranks whose GPU is unknown, not GPU indexes.
NO_GPU = 100_000


@dataclass
class JobFinding:
    """A rank (or pod) the job waits for: where it is, on which grid instant it began and, when it recovered,
    the last instant it departed; ``gap`` is how far from its peers (relative, positive = slower)."""

    column: int
    node: str
    gpu: int | None
    rank: str | None
    pod: str | None
    onset: int
    last: int
    gap: float
    own: float
    peer: float
    persistence: float


def _long(frame: pd.DataFrame, value: np.ndarray, column_id: pd.Series) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "ts": frame["ts"].to_numpy(),
            "node": frame["node"].astype(object).to_numpy(),
            "gpu": frame["gpu"].to_numpy(dtype=np.float64, na_value=np.nan) if "gpu" in frame else np.nan,
            "gpu_uuid": column_id.to_numpy(),
            "pod": frame["pod"].astype(object).to_numpy() if "pod" in frame else None,
            "signal": "rel",
            "value": value,
        }
    )


def collective_grid(
    collectives: pd.DataFrame, *, step_s: float, window: tuple[pd.Timestamp, pd.Timestamp], t0_ns: int | None
) -> Grid | None:
    """Each rank's collective time relative to all ranks' median of the same (communicator, collective) and
    instant, as a (instant × rank) grid (``ids`` holds the rank); None without per-rank times."""
    if not len(collectives):
        return None
    exec_us = collectives["exec_time_us"].to_numpy(dtype=np.float64, na_value=np.nan)
    if not np.isfinite(exec_us).any():
        # Bus bandwidth is the message over the time: its inverse orders the ranks the same way.
        busbw = collectives["busbw_gbps"].to_numpy(dtype=np.float64, na_value=np.nan)
        with np.errstate(divide="ignore"):
            exec_us = np.where(busbw > 0, 1.0 / busbw, np.nan)
    ok = np.isfinite(exec_us) & (exec_us > 0)
    if ok.sum() == 0:
        return None
    part = collectives.loc[ok]
    exec_ok = exec_us[ok]
    step_ns = max(1, round(step_s * 1e9))
    instant = pd.DatetimeIndex(part["ts"]).as_unit("ns").asi8 // step_ns
    group = pd.DataFrame(
        {
            "i": instant,
            "comm": part["comm"].astype(str).to_numpy(),
            "coll": part["collective"].astype(str).to_numpy(),
            "v": exec_ok,
        }
    )
    median = group.groupby(["i", "comm", "coll"], sort=False)["v"].transform("median").to_numpy()
    rel = exec_ok / median
    rank = part["rank"] if "rank" in part else pd.Series(pd.NA, index=part.index)
    rank_text = rank.astype("string").fillna("")
    long = _long(part, rel, rank_text)
    # A rank with no GPU index is still a column of its own: past NO_GPU, its rank's number stands in.
    no_gpu = ~np.isfinite(long["gpu"].to_numpy(dtype=np.float64))
    if no_gpu.any():
        ranks = pd.to_numeric(rank_text[no_gpu], errors="coerce").fillna(0).to_numpy(dtype=np.float64)
        long.loc[no_gpu, "gpu"] = NO_GPU + ranks
    long["gpu"] = long["gpu"].astype(np.int64)
    grid = telemetry_grid(long, step_s=step_s, window=window, signals=("rel",))
    if grid.empty or t0_ns is None or grid.t0_ns == t0_ns:
        return grid
    # Align it on the telemetry's grid, so the onsets read on one time axis.
    return _shift(grid, t0_ns)


def pod_step_grid(
    steps: pd.DataFrame, *, step_s: float, window: tuple[pd.Timestamp, pd.Timestamp], t0_ns: int | None
) -> Grid | None:
    """Each pod's step time relative to all pods' median at that instant, as an (instant × pod) grid; None when
    the pods report one step time (synchronous training where every pod reports the job's)."""
    if not len(steps) or steps["pod"].isna().all():
        return None
    seconds = steps["step_time_s"].to_numpy(dtype=np.float64, na_value=np.nan)
    ok = np.isfinite(seconds) & (seconds > 0)
    part = steps.loc[ok]
    if part["pod"].nunique() < 3:
        return None
    step_ns = max(1, round(step_s * 1e9))
    instant = pd.DatetimeIndex(part["ts"]).as_unit("ns").asi8 // step_ns
    median = pd.Series(seconds[ok]).groupby(instant).transform("median").to_numpy()
    rel = seconds[ok] / median
    long = pd.DataFrame(
        {
            "ts": part["ts"].to_numpy(),
            "node": part["node"].astype(object).to_numpy(),
            "gpu": -1,
            "gpu_uuid": "",
            "pod": part["pod"].astype(object).to_numpy(),
            "signal": "rel",
            "value": rel,
        }
    )
    # One column per pod: the pod's name is its id.
    long["gpu_uuid"] = long["pod"]
    long["gpu"] = pd.factorize(long["pod"])[0]
    grid = telemetry_grid(long, step_s=step_s, window=window, signals=("rel",))
    if grid.empty:
        return None
    return grid if t0_ns is None or grid.t0_ns == t0_ns else _shift(grid, t0_ns)


def _shift(grid: Grid, t0_ns: int) -> Grid:
    """``grid`` re-based to start at ``t0_ns`` (rows before it dropped, NaN where it starts later)."""
    offset = round((grid.t0_ns - t0_ns) / grid.step_ns)
    values: dict[str, FloatArray] = {}
    n_times = max(0, grid.n_times + offset)
    for name, m in grid.values.items():
        out = np.full((n_times, grid.n_columns), np.nan)
        if offset >= 0:
            out[offset:] = m
        else:
            out[:] = m[-offset:]
        values[name] = out
    return Grid(t0_ns, grid.step_ns, n_times, grid.nodes, grid.index, grid.ids, grid.pods, values)


def rank_departures(grid: Grid, *, below: bool, gate: float, onset_of: object, gpus: bool = True) -> list[JobFinding]:
    """The columns of a relative grid (1.0 = the peers' median) that depart persistently: below the peers by
    ``gate`` (``below``: a rank the others wait for) or above them (a slower pod), and by :data:`ROBUST_Z` robust
    standard deviations of the columns' spread. ``onset_of`` is :func:`~._judge.persistent_onset`."""
    rel = grid.values.get("rel")
    if rel is None or grid.n_columns < 3:
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an instant no rank reported has no median
        median = np.nanmedian(rel, axis=1, keepdims=True)
    gap = (median - rel) if below else (rel - median)
    finite = np.isfinite(rel)
    deviations = np.abs(rel - median)[finite]
    sigma = 1.4826 * float(np.median(deviations)) if deviations.size else 0.0
    floor = max(gate, ROBUST_Z * sigma)
    departed = np.nan_to_num(gap > floor, nan=False).astype(bool)
    onsets = onset_of(departed)  # type: ignore[operator]
    out: list[JobFinding] = []
    for c in np.flatnonzero(onsets >= 0):
        t = int(onsets[c])
        at = np.flatnonzero(departed[:, c])
        at = at[at >= t]
        last = int(at[-1])
        own = float(np.median(rel[at, c]))
        peer = float(np.nanmedian(median[at, 0]))
        seen = np.flatnonzero(finite[t : last + 1, c])
        persistence = float(departed[t : last + 1, c].sum() / max(1, len(seen)))
        gpu = grid.index[c] if gpus and 0 <= grid.index[c] < NO_GPU else None
        rank = (grid.ids[c] or None) if gpus else None
        gap_rel = abs(own / peer - 1) if peer else 0.0
        out.append(JobFinding(int(c), grid.nodes[c], gpu, rank, grid.pods[c], t, last, gap_rel, own, peer, persistence))
    return out
