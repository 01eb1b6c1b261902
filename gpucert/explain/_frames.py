"""The contract of ``gpucert explain`` in code: the frames it reads and the explanation it returns.

Gathering (:mod:`gpucert.explain._gather`) fills these frames from Prometheus, the pod logs, the Kubernetes
events and gpucert's own record; the diagnosis (:func:`gpucert.explain.explain`) reads only them, so it is pure
pandas and can be tested with frames built by hand. The frames (columns in :data:`FRAME_COLUMNS`, every timestamp
tz-aware UTC): ``telemetry`` (one row per GPU × signal × scrape instant, ``signal`` one of :data:`SIGNALS`, any of
which may be missing), ``nic`` (optional, per node × RDMA port × signal × instant), ``steps`` (the job's own step
times, may be empty), ``collectives`` (NCCL Inspector's per-collective timings, optional), ``events`` (Kubernetes
events of the job's pods and nodes) and ``record`` (gpucert's history of the nodes, one row per node).

String columns may be ``object``, ``string`` or ``category`` (category keeps 7 M telemetry rows small).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import pandas as pd

from ..errors import InputError

__all__ = [
    "COLLECTIVES_COLUMNS",
    "EVENTS_COLUMNS",
    "FRAME_COLUMNS",
    "LAYERS",
    "NIC_SIGNALS",
    "OPTIONAL_SIGNALS",
    "RECORD_COLUMNS",
    "SIGNALS",
    "SPARSE_SIGNALS",
    "VERDICTS",
    "Explanation",
    "StepChange",
    "Suspect",
    "check_frame",
    "empty_collectives",
    "empty_events",
    "empty_frame",
    "empty_nic",
    "empty_record",
    "empty_steps",
    "empty_telemetry",
]

#: The telemetry signals, each from one DCGM series (see the contract for the series and units).
SIGNALS: Final = (
    "sm_clock_mhz",  # DCGM_FI_DEV_SM_CLOCK
    "clock_event_reasons",  # DCGM_FI_DEV_CLOCKS_EVENT_REASONS, the bitmask as a float
    "power_w",  # DCGM_FI_DEV_POWER_USAGE
    "temp_c",  # DCGM_FI_DEV_GPU_TEMP
    "util_pct",  # DCGM_FI_DEV_GPU_UTIL
    "engine_active",  # DCGM_FI_PROF_GR_ENGINE_ACTIVE, 0..1
    "nvlink_gbps",  # rate of DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL
    "pcie_gbps",  # rate of DCGM_FI_PROF_PCIE_TX_BYTES + _RX_BYTES
    "xid",  # DCGM_FI_DEV_XID_ERRORS, the last XID
    "ecc_dbe",  # increase of DCGM_FI_DEV_ECC_DBE_VOL_TOTAL
    "pcie_replays_per_min",  # rate of DCGM_FI_DEV_PCIE_REPLAY_COUNTER × 60
    "thermal_violation_frac",  # rate of DCGM_FI_DEV_THERMAL_VIOLATION / 1e9
    "power_violation_frac",  # rate of DCGM_FI_DEV_POWER_VIOLATION / 1e9
    "pcie_link_gen",  # DCGM_FI_DEV_PCIE_LINK_GEN, the link's current generation
    "pcie_link_gen_max",  # DCGM_FI_DEV_PCIE_MAX_LINK_GEN
    "pcie_link_width",  # DCGM_FI_DEV_PCIE_LINK_WIDTH, lanes
    "pcie_link_width_max",  # DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH
    "ecc_sbe",  # increase of DCGM_FI_DEV_ECC_SBE_VOL_TOTAL
    "row_remap_failure",  # DCGM_FI_DEV_ROW_REMAP_FAILURE
    "row_remap_pending",  # DCGM_FI_DEV_ROW_REMAP_PENDING
    "remapped_rows_uncorrectable",  # DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS
    "remapped_rows_correctable",  # DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS
)
_PCIE_LINK = ("pcie_link_gen", "pcie_link_gen_max", "pcie_link_width", "pcie_link_width_max")
_ROW_REMAPS = ("row_remap_failure", "row_remap_pending", "remapped_rows_uncorrectable", "remapped_rows_correctable")
#: Signals gathering reads only where they are non-zero (errors, flags) or differ (a link's maxima where it runs
#: below them): their absence reads as zero (as "at its maximum"), never as unscraped.
SPARSE_SIGNALS: Final = frozenset(
    {"xid", "ecc_dbe", "ecc_sbe", "pcie_link_gen_max", "pcie_link_width_max", *_ROW_REMAPS}
)
#: Signals many exporters' default counters leave out: their absence is no note.
OPTIONAL_SIGNALS: Final = frozenset({*_PCIE_LINK, "ecc_sbe", *_ROW_REMAPS})

#: The NIC signals (node-exporter's infiniband collector); the counters are increases per step.
NIC_SIGNALS: Final = ("rate_gbps", "symbol_errors", "link_downed", "rcv_errors")

#: ``transient``: a departure that recovered (its window in the evidence, never acted on); ``hang``: the job
#: stopped stepping while its GPUs stayed busy.
LAYERS: Final = ("gpu", "nvlink", "network", "node", "event", "transient", "hang")
VERDICTS: Final = ("gpu", "network", "event", "hang", "transient", "elsewhere", "healthy", "no-data")

# Column kinds: "ts" tz-aware UTC datetime, "str" text (nullable where the contract says so), "int" integer
# (nullable integers are pandas' Int64), "float" any real number, NaN for missing.
_TS, _STR, _INT, _FLOAT = "ts", "str", "int", "float"
_KINDS: Final[Mapping[str, Mapping[str, str]]] = {
    "telemetry": {"ts": _TS, "node": _STR, "gpu": _INT, "gpu_uuid": _STR, "pod": _STR, "signal": _STR, "value": _FLOAT},
    "nic": {"ts": _TS, "node": _STR, "device": _STR, "port": _INT, "signal": _STR, "value": _FLOAT},
    "steps": {"ts": _TS, "pod": _STR, "node": _STR, "step": _INT, "step_time_s": _FLOAT},
    "collectives": {
        "ts": _TS,
        "node": _STR,
        "gpu": _INT,
        "comm": _STR,
        "collective": _STR,
        "busbw_gbps": _FLOAT,
        "exec_time_us": _FLOAT,
    },
    "events": {
        "ts": _TS,
        "object_kind": _STR,
        "object_name": _STR,
        "namespace": _STR,
        "node": _STR,
        "reason": _STR,
        "type": _STR,
        "note": _STR,
    },
    "record": {
        "node": _STR,
        "last_run_id": _STR,
        "last_decision": _STR,
        "last_certified_at": _TS,
        "open_tickets": _STR,
        "drift_alarms": _INT,
        "deviations": _STR,
    },
}

#: The columns of each frame, by the frame's name.
FRAME_COLUMNS: Final[Mapping[str, tuple[str, ...]]] = {name: tuple(kinds) for name, kinds in _KINDS.items()}
COLLECTIVES_COLUMNS: Final = FRAME_COLUMNS["collectives"]
EVENTS_COLUMNS: Final = FRAME_COLUMNS["events"]
RECORD_COLUMNS: Final = FRAME_COLUMNS["record"]

_EMPTY_DTYPES: Final[Mapping[str, object]] = {
    _TS: pd.DatetimeTZDtype(unit="ns", tz="UTC"),
    _STR: "object",
    _INT: "Int64",
    _FLOAT: "float64",
}


def empty_frame(name: str) -> pd.DataFrame:
    """An empty frame ``name`` ("telemetry", "nic", …) with the contract's columns and dtypes (``KeyError`` for
    a name that is not a frame of the contract)."""
    return pd.DataFrame({c: pd.Series(dtype=_EMPTY_DTYPES[k]) for c, k in _KINDS[name].items()})  # type: ignore[call-overload]


# The empty frame of each name, as gathering and the tests start them.
empty_telemetry = functools.partial(empty_frame, "telemetry")
empty_nic = functools.partial(empty_frame, "nic")
empty_steps = functools.partial(empty_frame, "steps")
empty_collectives = functools.partial(empty_frame, "collectives")
empty_events = functools.partial(empty_frame, "events")
empty_record = functools.partial(empty_frame, "record")


def _kind_ok(series: pd.Series, kind: str) -> str | None:
    """``None`` when ``series`` fits ``kind``, else what is wrong with it."""
    dtype = series.dtype
    if kind == _TS:
        if not isinstance(dtype, pd.DatetimeTZDtype):
            return f"must be tz-aware UTC timestamps, not {dtype}"
        return f"must be in UTC, not {dtype.tz}" if str(dtype.tz) != "UTC" else None
    if kind == _STR:
        text = isinstance(dtype, pd.CategoricalDtype) or pd.api.types.is_string_dtype(dtype) or dtype.kind == "O"
        # An all-missing nullable column (e.g. no pod labels at all) is fine.
        return None if text or series.isna().all() else f"must be text, not {dtype}"
    if pd.api.types.is_bool_dtype(dtype):
        return f"must be numbers, not {dtype}"
    if kind == _INT:
        if pd.api.types.is_integer_dtype(dtype):
            return None
        if pd.api.types.is_float_dtype(dtype):
            values = series.dropna()
            return None if (values == values.round()).all() else "must be whole numbers"
        return None if series.isna().all() else f"must be integers, not {dtype}"
    if pd.api.types.is_numeric_dtype(dtype) or series.isna().all():
        return None
    return f"must be numbers, not {dtype}"


def check_frame(name: str, frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` itself when it has the columns and types of the contract's frame ``name``.

    Extra columns are allowed. Raises :class:`~gpucert.errors.InputError` naming the frame and the first column
    that is missing or of the wrong type, or ``name`` when it is no frame of the contract.
    """
    kinds = _KINDS.get(name)
    if kinds is None:
        raise InputError(f"{name!r} is not a frame of gpucert explain (one of {', '.join(_KINDS)})")
    if not isinstance(frame, pd.DataFrame):
        raise InputError(f"{name} frame: expected a pandas DataFrame, not {type(frame).__name__}")
    missing = [c for c in kinds if c not in frame.columns]
    if missing:
        raise InputError(
            f"{name} frame: missing column {missing[0]!r}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    for column, kind in kinds.items():
        problem = _kind_ok(frame[column], kind)
        if problem is not None:
            raise InputError(f"{name} frame: column {column!r} {problem}")
    return frame


@dataclass(frozen=True)
class Suspect:
    """One thing the diagnosis blames, with the evidence behind it.

    ``gpu`` is ``None`` when the node as a whole is blamed (its NIC, an event); ``layer`` is one of
    :data:`LAYERS`; ``onset`` is the first scrape instant from which it departs from its peers; ``evidence`` is
    plain sentences with numbers.
    """

    node: str
    gpu: int | None
    gpu_uuid: str | None
    layer: str
    score: float
    onset: pd.Timestamp | None
    evidence: tuple[str, ...]
    #: Where it recovered (a ``transient``): the last instant it departed.
    until: pd.Timestamp | None = None
    #: Named by the job's own timings (collectives, per-pod steps) while its telemetry shows no cause.
    silent: bool = False


@dataclass(frozen=True)
class StepChange:
    """The step time went from ``before_s`` to ``after_s`` at ``at``; ``change_pct`` = (after/before − 1) × 100."""

    before_s: float
    after_s: float
    at: pd.Timestamp
    change_pct: float


@dataclass(frozen=True)
class Explanation:
    """Why the job is slow: the verdict (one of :data:`VERDICTS`), the ranked suspects and the answer in three lines.

    ``recommendations`` are text only: acting on them is ``--act``'s; ``notes`` say what could not be read.
    """

    job: str
    window: tuple[pd.Timestamp, pd.Timestamp]
    verdict: str
    suspects: tuple[Suspect, ...]
    step_change: StepChange | None
    events_of_note: tuple[str, ...]
    answer: tuple[str, str, str]
    recommendations: tuple[str, ...]
    notes: tuple[str, ...]
