"""The long ``telemetry`` (and ``nic``) frames pivoted onto one time grid: a (instant × GPU) matrix per signal.

The diagnosis and the timeline both read the frames this way. The pivot is vectorised: every row's instant is
its timestamp snapped to the scrape grid (``t0 + k · step_s``), every row's column its (node, GPU) key, and one
fancy assignment per signal fills a NaN matrix. 7 M rows pivot in about a second; no per-GPU Python loop. Every
departure found on a grid persists the same way (:func:`persistent_onset`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pandas as pd

from ..errors import InputError

__all__ = [
    "ROBUST_Z",
    "FloatArray",
    "Grid",
    "bucket_ends",
    "column_codes",
    "equal_runs",
    "nic_grid",
    "persistent_onset",
    "telemetry_grid",
    "to_ns",
    "utc",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: More instants than this on one grid is a step that does not fit the window (1 s over a week is 604,800).
MAX_INSTANTS = 1_000_000
#: Every departure must also exceed this many robust standard deviations (1.4826 × MAD) of the peers.
ROBUST_Z = 5.0
#: Persistence: the onset is an instant departed and followed by PERSIST_RUN departed in a row, or by
#: PERSIST_FRAC of the next PERSIST_WINDOW, or by half of the next 2 × PERSIST_WINDOW (a duty-cycled slowdown).
PERSIST_RUN = 3
PERSIST_WINDOW = 10
PERSIST_FRAC = 0.8


def to_ns(series: pd.Series) -> IntArray:
    """The UTC timestamps of ``series`` as int64 nanoseconds (any datetime unit); NaT becomes int64's minimum."""
    index = pd.DatetimeIndex(series)
    return np.asarray(index.as_unit("ns").asi8, dtype=np.int64)


def column_codes(series: pd.Series) -> tuple[npt.NDArray[np.signedinteger], list[str]]:
    """Integer codes of a text column (-1 where missing) and the names they index; categoricals stay unsorted.

    A categorical's codes keep their narrow dtype (int8 for a few hundred names): cast before arithmetic.
    """
    if isinstance(series.dtype, pd.CategoricalDtype):
        return np.asarray(series.cat.codes.to_numpy()), [str(c) for c in series.cat.categories]
    codes_raw, uniques = pd.factorize(series, use_na_sentinel=True)
    return np.asarray(codes_raw, dtype=np.int64), [str(u) for u in uniques]


@dataclass(frozen=True)
class Grid:
    """Signals on a shared grid: ``values[signal]`` is a (len(times) × len(columns)) float matrix, NaN where absent.

    ``t0_ns`` is the first instant, ``step_ns`` the spacing; the columns are sorted by (node, index) and
    described by ``nodes``, ``index`` (GPU index, or RDMA port; -1 where unknown), ``ids`` (the GPU UUID, or
    the NIC device) and ``pods`` (the last pod seen holding the GPU; None where unknown). ``held`` is True where
    a sample names the pod holding the GPU, None when every sample (or none) names one.
    """

    t0_ns: int
    step_ns: int
    n_times: int
    nodes: tuple[str, ...]
    index: tuple[int, ...]
    ids: tuple[str | None, ...]
    pods: tuple[str | None, ...]
    values: dict[str, FloatArray] = field(default_factory=dict)
    held: BoolArray | None = None

    @property
    def n_columns(self) -> int:
        """How many GPUs (or ports) the grid has."""
        return len(self.nodes)

    @property
    def empty(self) -> bool:
        """True when the grid has no instant or no column."""
        return self.n_times == 0 or self.n_columns == 0

    def at(self, i: int) -> pd.Timestamp:
        """The ``i``-th instant as a UTC timestamp."""
        return pd.Timestamp(self.t0_ns + self.step_ns * int(i), unit="ns", tz="UTC")


def _last_code(
    columns: npt.NDArray[np.signedinteger],
    codes: npt.NDArray[np.signedinteger],
    n_columns: int,
    hint: IntArray | None = None,
) -> IntArray:
    """Per column, the code of the last row (in frame order) where it is not missing; -1 when none.

    ``hint`` (row numbers, e.g. one signal's rows) is searched first: every GPU has rows in every signal, so the
    full frame is searched only for the columns the hint leaves unresolved.
    """
    out = np.full(n_columns, -1, dtype=np.int64)
    for rows in ((hint,) if hint is not None else ()) + (None,):
        cols = columns if rows is None else columns[rows]
        vals = codes if rows is None else codes[rows]
        ok = vals >= 0
        if rows is None:
            ok &= out[cols] < 0  # only what the hint did not resolve
        if not ok.any():
            continue
        last = np.full(n_columns, -1, dtype=np.int64)
        np.maximum.at(last, cols[ok], np.flatnonzero(ok))
        seen = last >= 0
        out[seen] = vals[last[seen]]
        if (out >= 0).all():
            break
    return out


def _window_rows(ts: IntArray, window: tuple[pd.Timestamp, pd.Timestamp] | None, step_ns: int) -> BoolArray:
    keep = ts != np.iinfo(np.int64).min
    if window is not None:
        lo, hi = (int(pd.Timestamp(w).as_unit("ns").value) for w in window)
        keep &= (ts >= lo - step_ns // 2) & (ts <= hi + step_ns // 2)
    return np.asarray(keep, dtype=bool)


def _grid(
    frame: pd.DataFrame,
    index_column: str,
    id_column: str,
    pod_column: str | None,
    step_s: float,
    window: tuple[pd.Timestamp, pd.Timestamp] | None,
    t0_ns: int | None,
    signals: tuple[str, ...] | None,
    *,
    id_in_key: bool,
) -> Grid:
    if not step_s > 0:
        raise InputError(f"step_s must be a positive number of seconds, not {step_s!r}")
    step_ns = max(1, round(step_s * 1e9))
    ts = to_ns(frame["ts"])
    keep = _window_rows(ts, window, step_ns)
    node_codes, node_names = column_codes(frame["node"])
    keep &= node_codes >= 0
    values = frame["value"].to_numpy(dtype=np.float64, na_value=np.nan)
    keep &= ~np.isnan(values)
    sig_codes, sig_names = column_codes(frame["signal"])
    if not keep.all():
        rows = np.flatnonzero(keep)
        ts, node_codes, values, sig_codes = ts[rows], node_codes[rows], values[rows], sig_codes[rows]
    else:
        rows = None
    if len(ts) == 0:
        return Grid(t0_ns if t0_ns is not None else 0, step_ns, 0, (), (), (), ())
    start = int(ts.min()) if t0_ns is None else t0_ns
    t_wide = ts - start  # integer arithmetic throughout: 20 M rows, no float temporaries
    del ts
    t_wide += step_ns // 2
    t_wide //= step_ns
    n_times = int(t_wide.max()) + 1 if len(t_wide) else 0
    if n_times > MAX_INSTANTS:
        raise InputError(f"telemetry spans {n_times:,} instants of {step_s:g} s: the step does not fit the window")
    # Instants fit 32 bits (MAX_INSTANTS): half the memory of every row-long temporary from here on.
    t_idx = np.maximum(t_wide, -1).astype(np.int32)
    del t_wide
    inside = t_idx >= 0
    n_times = max(n_times, 0) if inside.any() else 0

    def pick(name: str) -> pd.Series:
        col = frame[name]
        return col if rows is None else col.iloc[rows]

    picked = pick(index_column)
    if pd.api.types.is_integer_dtype(picked.dtype) and not picked.hasnans:
        index: IntArray = np.maximum(picked.to_numpy(), -1).astype(np.int64)
    else:
        raw_index = np.asarray(picked.to_numpy(dtype=np.float64, na_value=-1.0), dtype=np.float64)
        index = np.where(raw_index >= 0, raw_index, -1.0).astype(np.int64)  # missing or negative: unknown
        del raw_index
    del picked
    id_codes, id_names = column_codes(pick(id_column))
    # One column per (node, index) — per (node, device, port) for NICs: a combined integer key, then ordered by
    # node name, device and index.
    span = int(index.max()) + 2 if len(index) else 1
    n_ids = len(id_names) + 1 if id_in_key else 1
    key = node_codes.astype(np.int64)
    key *= n_ids
    if id_in_key:
        key += id_codes.astype(np.int64) + 1
    key *= span
    key += index
    key += 1
    del index
    keyspace = len(node_names) * n_ids * span
    if keyspace <= 50_000_000:  # a lookup table over the key space: linear, no hashing of 20 M keys
        seen_key = np.zeros(keyspace, dtype=bool)
        seen_key[key] = True
        uniques = np.flatnonzero(seen_key).astype(np.int64)
        del seen_key
        slot = np.full(keyspace, -1, dtype=np.int32)
        slot[uniques] = np.arange(len(uniques), dtype=np.int32)
        col = slot[key]
        del slot
    else:
        col_raw, uniques_raw = pd.factorize(key)
        col = np.asarray(col_raw, dtype=np.int32)
        uniques = np.asarray(uniques_raw, dtype=np.int64)
    del key
    u_index = uniques % span - 1
    u_id = (uniques // span) % n_ids - 1
    u_node = uniques // span // n_ids
    names = np.asarray(node_names, dtype=object)[u_node]
    id_text = np.asarray([*id_names, ""], dtype=object)[u_id]  # -1 indexes the trailing ""
    order = np.lexsort((u_index, id_text.astype(str), names.astype(str)))
    rank = np.empty(len(order), dtype=np.int32)
    rank[order] = np.arange(len(order), dtype=np.int32)
    col = rank[col]
    n_cols = len(order)

    # The rows of the most common signal are enough to find each GPU's UUID and pod (see _last_code).
    common = int(np.bincount(sig_codes[sig_codes >= 0]).argmax()) if (sig_codes >= 0).any() else -1
    hint = np.flatnonzero(sig_codes == common) if common >= 0 else None
    if id_in_key:
        ids: tuple[str | None, ...] = tuple(id_names[c] if c >= 0 else None for c in u_id[order])
    else:
        last_id = _last_code(col, id_codes, n_cols, hint)
        ids = tuple(id_names[c] if c >= 0 else None for c in last_id)
    pods: tuple[str | None, ...] = (None,) * n_cols
    held: BoolArray | None = None
    if pod_column is not None:
        pod_codes, pod_names = column_codes(pick(pod_column))
        last_pod = _last_code(col, pod_codes, n_cols, hint)
        pods = tuple(pod_names[c] if c >= 0 else None for c in last_pod)
        # Where some samples name a pod and others do not, those without are a GPU nobody in the job held then.
        with_pod = pod_codes >= 0
        if with_pod.any() and not with_pod.all():
            with_pod &= inside
            held = np.zeros((n_times, n_cols), dtype=bool)
            held.reshape(-1)[t_idx[with_pod].astype(np.int64) * n_cols + col[with_pod]] = True

    # Every wanted signal in one (signal × instant × column) block, filled by a single assignment.
    wanted = [name for name in sig_names if signals is None or name in signals]
    dense_of = np.asarray([wanted.index(n) if n in wanted else -1 for n in sig_names] + [-1], dtype=np.int16)
    dense = dense_of[sig_codes]  # a missing signal (-1) indexes the trailing -1
    sel = (dense >= 0) & inside
    if not sel.all():
        t_sel, c_sel, d_sel, v_sel = t_idx[sel], col[sel], dense[sel], values[sel]
    else:
        t_sel, c_sel, d_sel, v_sel = t_idx, col, dense, values
    del sel, dense
    block = np.full((len(wanted), n_times, n_cols), np.nan)
    flat = d_sel.astype(np.int64)  # the flat position, built in place: one row-long temporary, not four
    flat *= n_times
    flat += t_sel
    flat *= n_cols
    flat += c_sel
    block.reshape(-1)[flat] = v_sel
    del flat
    present = np.bincount(d_sel, minlength=len(wanted)) > 0
    matrices: dict[str, FloatArray] = {name: block[d] for d, name in enumerate(wanted) if present[d]}
    return Grid(
        t0_ns=start,
        step_ns=step_ns,
        n_times=n_times,
        nodes=tuple(str(n) for n in names[order]),
        index=tuple(int(i) for i in u_index[order]),
        ids=ids,
        pods=pods,
        values=matrices,
        held=held,
    )


def telemetry_grid(
    telemetry: pd.DataFrame,
    *,
    step_s: float,
    window: tuple[pd.Timestamp, pd.Timestamp] | None = None,
    signals: tuple[str, ...] | None = None,
) -> Grid:
    """The ``telemetry`` frame as a :class:`Grid` of GPUs from its first sample (rows outside ``window`` dropped,
    ``signals`` only). Raises :class:`~gpucert.errors.InputError` when ``step_s`` is not positive or does not fit
    the data's span."""
    return _grid(telemetry, "gpu", "gpu_uuid", "pod", step_s, window, None, signals, id_in_key=False)


def nic_grid(
    nic: pd.DataFrame,
    *,
    step_s: float,
    window: tuple[pd.Timestamp, pd.Timestamp] | None = None,
    t0_ns: int | None = None,
) -> Grid:
    """The ``nic`` frame as a :class:`Grid` of RDMA ports (``index`` the port, ``ids`` the device, ``mlx5_0``),
    aligned on the telemetry's grid by ``t0_ns`` (rows before it dropped)."""
    return _grid(nic, "port", "device", None, step_s, window, t0_ns, None, id_in_key=True)


def bucket_ends(n_times: int, n_buckets: int) -> IntArray:
    """The start index of each of at most ``n_buckets`` near-equal runs of ``n_times`` instants."""
    n = max(1, min(n_times, n_buckets))
    return np.unique(np.linspace(0, n_times, n + 1)[:-1].astype(np.int64))


def persistent_onset(departed: BoolArray) -> npt.NDArray[np.int64]:
    """Per column of the (instant × column) ``departed`` matrix, the first instant from which it persists; -1 if none.

    An instant counts when it is departed and followed (itself included) by :data:`PERSIST_RUN` departed instants
    in a row, by :data:`PERSIST_FRAC` departed of the next :data:`PERSIST_WINDOW`, or by half of the next
    2 × :data:`PERSIST_WINDOW` (a slowdown that comes and goes with a duty cycle); fewer than
    :data:`PERSIST_RUN` departed instants never count.
    """
    n_times, n_cols = departed.shape
    if n_times == 0 or n_cols == 0:
        return np.full(n_cols, -1, dtype=np.int64)
    csum = np.zeros((n_times + 1, n_cols), dtype=np.int32)
    np.cumsum(departed, axis=0, out=csum[1:])
    t = np.arange(n_times)

    def ahead(length: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
        end = np.minimum(t + length, n_times)
        return csum[end] - csum[t], (end - t)[:, None]

    run_count, run_len = ahead(PERSIST_RUN)
    confirmed = (run_len == PERSIST_RUN) & (run_count == PERSIST_RUN)
    for length, frac in ((PERSIST_WINDOW, PERSIST_FRAC), (2 * PERSIST_WINDOW, 0.5)):
        count, span = ahead(length)
        confirmed |= (span >= PERSIST_RUN) & (count >= np.maximum(PERSIST_RUN, np.ceil(frac * span)))
    confirmed &= departed
    any_confirmed = confirmed.any(axis=0)
    return np.where(any_confirmed, confirmed.argmax(axis=0), -1).astype(np.int64)


def equal_runs(values: npt.NDArray[np.generic]) -> list[tuple[int, int]]:
    """The runs of equal consecutive ``values`` as (first, last) indexes, in order."""
    if not len(values):
        return []
    cuts = np.flatnonzero(values[1:] != values[:-1]) + 1
    return list(zip(np.r_[0, cuts].tolist(), (np.r_[cuts, len(values)] - 1).tolist(), strict=True))


def utc(stamp: pd.Timestamp) -> pd.Timestamp:
    """``stamp`` in UTC; a naive one is taken as UTC."""
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
