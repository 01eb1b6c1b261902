"""The straggler as the job itself sees it: when a GPU's own telemetry is silent, its peers still wait for it.

In synchronous training the rank that finishes its compute last arrives last at each collective, so *its*
collectives are the shortest and every other rank's are longer by the time they waited for it. Per
(communicator, collective) and instant every rank's time is divided by the median of all ranks' (communicators of
different sizes weigh alike), and a rank persistently below its peers is the one they wait for. Where the step
time is reported per pod, a pod slower than its peers names its node the same way. Vectorised over (instant ×
rank) matrices on the telemetry's grid.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ._grid import ROBUST_Z, FloatArray, Grid, persistent_onset, telemetry_grid

__all__ = ["COLLECTIVE_GATE", "POD_STEP_GATE", "JobFinding", "collective_grid", "pod_step_grid", "rank_departures"]

#: A rank whose collectives take this much less than its peers' (relative) is the one they wait for.
COLLECTIVE_GATE = 0.10
#: A pod whose step time exceeds its peers' by this much departs (pods that report their own compute time).
POD_STEP_GATE = 0.05
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
    """``value`` per row of ``frame`` as a long telemetry frame of one signal, ``rel``, its columns by ``column_id``."""
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
    keys = [instant, part["comm"].astype(str).to_numpy(), part["collective"].astype(str).to_numpy()]
    median = pd.Series(exec_ok).groupby(keys, sort=False).transform("median").to_numpy()
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
    return _aligned(telemetry_grid(long, step_s=step_s, window=window, signals=("rel",)), t0_ns)


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
    long = _long(part, seconds[ok] / median, part["pod"])  # one column per pod: the pod's name is its id
    long["gpu"] = pd.factorize(long["pod"])[0]
    grid = telemetry_grid(long, step_s=step_s, window=window, signals=("rel",))
    return None if grid.empty else _aligned(grid, t0_ns)


def _aligned(grid: Grid, t0_ns: int | None) -> Grid:
    """``grid`` re-based to start at ``t0_ns``, the telemetry's first instant, so that onsets read on one time
    axis (rows before it dropped, NaN where it starts later)."""
    if grid.empty or t0_ns is None or grid.t0_ns == t0_ns:
        return grid
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


def rank_departures(grid: Grid, *, below: bool, gate: float, gpus: bool = True) -> list[JobFinding]:
    """The columns of a relative grid (1.0 = the peers' median) that depart persistently: below the peers by
    ``gate`` (``below``: a rank the others wait for) or above them (a slower pod), and by :data:`ROBUST_Z` robust
    standard deviations of the columns' spread."""
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
    onsets = persistent_onset(departed)
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
