"""What both telemetry sources share: the signals gpucert reads, the reading they return, and how raw
per-GPU readings become rows of the results contract (docs/design/data-contracts.md, "Results").

A source produces *readings*, one row per GPU, registry metric and value, already reduced over its window and
possibly with duplicates (two Prometheus jobs scraping one exporter, an exporter restarted within the window).
:func:`to_results` combines the duplicates as the metric's reduction says, settles the identities the results
contract requires to be unique within a run, adds XID events, GPU counts and NIC readings, and validates the frame.
"""

from __future__ import annotations

import ssl
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
import pandas as pd

from .._frames import empty_results
from ..errors import TelemetryError
from ..metrics import RESULT_COLUMNS, bound_arrays
from ..results import parse_results

__all__ = ["HOST_LABELS", "NIC_SERIES", "SIGNALS", "Signal", "Telemetry", "TelemetryError", "to_results"]

#: The DCGM exporter's host label: ``Hostname`` before NVIDIA/dcgm-exporter#655, ``hostname`` since.
HOST_LABELS: tuple[str, str] = ("hostname", "Hostname")

#: How a signal's samples over the window reduce to one value per GPU.
Reduce = Literal["max", "min", "last", "increase", "peak_rate_per_min", "bits_or", "hw_share"]


@dataclass(frozen=True)
class Signal:
    """One registry metric read from DCGM series: ``sources`` in order of preference (the first one a GPU has
    wins), ``reduce`` how the window's samples become one value."""

    metric: str
    sources: tuple[str, ...]
    reduce: Reduce


#: The signals gpucert acts on between certifications (gates: docs/reference/causes-and-actions.md, "Gates";
#: names: docs/reference/telemetry.md). Why each reduction:
#:
#: * PCIe generation and width: the highest the link reached. Links train down when idle, so only a link
#:   that never reached its maximum in the window is trained down (the gate wants "under load").
#: * Replays: the worst 5-minute rate, per minute (a burst must not drown in a quiet night).
#: * Volatile ECC counts: the highest count since the last GPU reset seen in the window (what NVML's
#:   volatile counter, and so the certify gate, means). NVLink CRC errors: the increase over the window.
#: * Row remap: a failure seen at all counts; pending is the state at the end (a reset clears it).
#: * Clock-event reasons: the OR of every bit seen; ``hw_slowdown_frac``: the worst 10-minute share of
#:   time with a hardware slowdown, from the thermal-violation counter or the HW bits (0x08, 0x40, 0x80),
#:   whichever is higher. The power-violation counter also counts software power capping (a config fault
#:   the power-limit gate names), so it is not read as a hardware slowdown.
#: * Limits: the state at the end of the window (what a fix would change).
SIGNALS: tuple[Signal, ...] = (
    Signal("pcie_gen", ("DCGM_FI_DEV_PCIE_LINK_GEN",), "max"),
    Signal("pcie_gen_max", ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN",), "max"),
    Signal("pcie_width", ("DCGM_FI_DEV_PCIE_LINK_WIDTH",), "max"),
    Signal("pcie_width_max", ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",), "max"),
    Signal("pcie_replays_per_min", ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER",), "peak_rate_per_min"),
    Signal("remapped_rows_failure", ("DCGM_FI_DEV_ROW_REMAP_FAILURE",), "max"),
    Signal("remapped_rows_pending", ("DCGM_FI_DEV_ROW_REMAP_PENDING",), "last"),
    Signal("ecc_dbe_volatile", ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",), "max"),
    Signal("ecc_sbe_volatile", ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",), "max"),
    Signal("nvlink_crc_errors", ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",), "increase"),
    Signal("clocks_event_reasons", ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS",), "bits_or"),
    Signal("hw_slowdown_frac", ("DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"), "hw_share"),
    Signal("temp_max_c", ("DCGM_FI_DEV_GPU_TEMP",), "max"),
    Signal("temp_slowdown_c", ("DCGM_FI_DEV_SLOWDOWN_TEMP",), "min"),
    Signal("power_limit_w", ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_POWER_MGMT_LIMIT"), "last"),
    Signal("power_limit_default_w", ("DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF",), "last"),
)
#: Where duplicates of a reading disagree, the worse one stands: the lower of two minima (a lower
#: slowdown threshold), the higher of anything else (more errors, a hotter peak, a longer slowdown).
#: PCIe generation and width are the exception: their reading is already the best the link reached.
_LOWER_WINS = frozenset({"temp_slowdown_c"})

#: The bits of the clock-event reasons mask (docs/reference/telemetry.md, "Clock-event reasons").
CLOCK_EVENT_BITS: tuple[int, ...] = (0x001, 0x002, 0x004, 0x008, 0x010, 0x020, 0x040, 0x080, 0x100)

#: node-exporter's infiniband collector (prometheus/node_exporter ``collector/infiniband_linux.go``), one
#: series per RDMA port with labels ``device`` and ``port``, and the registry's NIC metrics made from them:
#: the port state (4 is ACTIVE) counts the ports and the active ones, the rate (bytes/s) of the active
#: ports gives the slowest and the fastest in Gb/s, and each error counter's increase over the window is
#: summed over the node's ports. Same rows, so the same gates, as the payload's (gpucert/bench/_nic.py).
NIC_SERIES: Mapping[str, str] = {
    "state": "node_infiniband_state_id",
    "rate": "node_infiniband_rate_bytes_per_second",
    "ib_symbol_errors": "node_infiniband_symbol_error_total",
    "ib_link_downed": "node_infiniband_link_downed_total",
    "ib_rcv_errors": "node_infiniband_port_errors_received_total",
}

XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
XID_LAST = "DCGM_FI_DEV_XID_ERRORS"
#: A series present for every GPU the exporter sees: what counts the GPUs a node reports.
PRESENCE = "DCGM_FI_DEV_GPU_TEMP"
#: At most this many rows per (GPU, XID) and reading: a storm of thousands of XID 92s would otherwise
#: blow up the frame, and the gates need only to know it repeated.
MAX_EVENTS_PER_XID = 1000

#: A GPU's identity in a reading or an event, then what each holds (and their dtypes, for an empty frame).
_IDENTITY: dict[str, Any] = {"node": object, "gpu": np.int64, "gpu_uuid": object, "gpu_model": object}
_READING: dict[str, Any] = {**_IDENTITY, "metric": object, "value": np.float64}
_EVENT: dict[str, Any] = {**_IDENTITY, "xid": np.int64, "count": np.int64, "ts": "datetime64[us, UTC]"}


@dataclass(frozen=True)
class Telemetry:
    """What a source read: rows of the results contract, and what it could not read.

    ``results``: canonical results rows (run_id, node, gpu, gpu_uuid, gpu_model, metric, value, repeat 0,
    peer empty, ts) — the registry's telemetry metrics per GPU, one row per XID event, and per node
    ``gpu_count`` (and ``gpu_count_expected`` when the caller said how many GPUs a node has). A value
    that could not be read is absent, never invented.
    ``problems``: node → why its telemetry is missing or partial (an exporter that did not answer, a GPU
    swapped within the window). ``notes``: source-wide remarks (series without a host label, Prometheus
    warnings). ``start``/``end``: the window read (``start`` is None for a single scrape). ``absent``: why
    the source had nothing to read at all (no exporter listed, no DCGM series in Prometheus), else None —
    a night with it judged no telemetry, however quiet ``problems`` looks.
    """

    results: pd.DataFrame
    problems: Mapping[str, str]
    notes: tuple[str, ...]
    start: datetime | None
    end: datetime
    source: str
    nodes: tuple[str, ...] = field(default=())
    absent: str | None = None

    def __post_init__(self) -> None:
        if not self.nodes:
            nodes = self.results["node"].astype(str).unique().tolist() if len(self.results) else []
            object.__setattr__(self, "nodes", tuple(sorted(nodes)))


def utc(moment: datetime) -> datetime:
    """``moment`` in UTC (a naive datetime is taken as UTC)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def host_of(labels: Mapping[str, str], host_label: str | None) -> str | None:
    """The node a series belongs to: its ``host_label``, or either spelling when that is None."""
    if host_label is not None:
        return labels.get(host_label) or None
    return labels.get("hostname") or labels.get("Hostname") or None


class Problems:
    """Per-node problems, several joined with '; ', in the order met."""

    def __init__(self) -> None:
        self._by_node: dict[str, list[str]] = {}

    def add(self, node: str, message: str) -> None:
        messages = self._by_node.setdefault(node, [])
        if message not in messages:
            messages.append(message)

    def __contains__(self, node: object) -> bool:
        return node in self._by_node

    def as_dict(self) -> dict[str, str]:
        return {node: "; ".join(messages) for node, messages in sorted(self._by_node.items())}


def empty_readings() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in _READING.items()})


def empty_events() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in _EVENT.items()})


def to_results(
    readings: pd.DataFrame,
    events: pd.DataFrame,
    *,
    run_id: str,
    ts: datetime,
    present: pd.DataFrame,
    expected_gpus: Mapping[str, int] | None,
    problems: Problems,
    source: str,
    node_readings: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The readings and events as one canonical results frame (see the module docstring).

    ``present``: the GPUs (node, gpu, gpu_uuid) reporting at the end of the window; they count the
    node's GPUs and win identity conflicts. ``expected_gpus``: node → GPUs it should have, written as
    ``gpu_count_expected`` for the nodes that reported. ``node_readings``: node-level rows (node, metric,
    value), kept for the nodes whose GPUs reported (a row needs the node's GPU model). Raises
    :class:`gpucert.errors.ResultsError` only if a row breaks the contract (a bug: every row is built here).
    """
    stamp = pd.Timestamp(utc(ts)).as_unit("us")
    readings = _combine(readings)
    identity = list(_IDENTITY)
    keep = _settle_identities(pd.concat([readings[identity], events[identity]], ignore_index=True), present, problems)
    readings = readings.merge(keep, on=identity, how="inner")
    events = events.merge(keep, on=identity, how="inner")

    parts: list[pd.DataFrame] = []
    if len(readings):
        parts.append(readings.assign(ts=stamp))
    if len(events):
        counts = np.minimum(events["count"].to_numpy(dtype=np.int64), MAX_EVENTS_PER_XID)
        repeated = events.loc[events.index.repeat(counts)].reset_index(drop=True)
        parts.append(
            repeated[identity].assign(
                metric="xid",
                value=repeated["xid"].to_numpy(dtype=np.float64),
                ts=pd.to_datetime(repeated["ts"], utc=True).dt.as_unit("us"),
            )
        )
    node_level = pd.concat([_node_counts(keep, present, expected_gpus, problems), node_readings], ignore_index=True)
    parts.append(_node_rows(keep, node_level, stamp))
    parts = [p for p in parts if len(p)]
    if not parts:
        return empty_results()
    frame = pd.concat(parts, ignore_index=True)
    frame["run_id"] = run_id
    frame["repeat"] = 0
    frame["peer"] = None
    frame["gpu"] = frame["gpu"].astype("Int64")
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True)
    frame = frame[list(RESULT_COLUMNS)].sort_values(["node", "gpu", "metric"], kind="stable", ignore_index=True)
    return parse_results(_within_bounds(frame, problems), f"telemetry from {source}")


def _within_bounds(frame: pd.DataFrame, problems: Problems) -> pd.DataFrame:
    """``frame`` without readings no GPU can give (an exporter's blank-value sentinel, a counter that
    wrapped): each dropped reading is a problem of its node, never a ResultsError for the whole night."""
    metrics = sorted(frame["metric"].astype(str).unique())
    low, high = bound_arrays([], metrics, per_model=False)
    column = {name: j for j, name in enumerate(metrics)}
    codes = frame["metric"].astype(str).map(column).to_numpy(dtype=np.int64)
    values = frame["value"].to_numpy(dtype=np.float64)
    bad = (values < low[-1, codes]) | (values > high[-1, codes])
    for node, metric, value in zip(frame["node"][bad], frame["metric"][bad], values[bad], strict=True):
        problems.add(str(node), f"{metric} reading {value:g} is outside what any GPU reports: dropped")
    kept: pd.DataFrame = frame[~bad].reset_index(drop=True)
    return kept


def _combine(readings: pd.DataFrame) -> pd.DataFrame:
    """One value per (GPU, metric): the worse of duplicates (see :data:`_LOWER_WINS`)."""
    finite = readings[np.isfinite(readings["value"].to_numpy(dtype=np.float64))]
    return worst_of(finite, [*_IDENTITY, "metric"], _LOWER_WINS) if len(finite) else empty_readings()


def worst_of(frame: pd.DataFrame, keys: list[str], lower_wins: Collection[str]) -> pd.DataFrame:
    """One ``value`` per ``keys`` (``metric`` among them): of duplicates the worse, the lower for the metrics
    of ``lower_wins``, else the higher."""
    lower = frame["metric"].isin(lower_wins).to_numpy()
    parts = [
        frame[rows].groupby(keys, sort=False)["value"].agg(worse).reset_index()
        for rows, worse in ((~lower, "max"), (lower, "min"))
        if rows.any()
    ]
    return pd.concat(parts, ignore_index=True)


def _settle_identities(ids: pd.DataFrame, present: pd.DataFrame, problems: Problems) -> pd.DataFrame:
    """The identities (node, gpu, gpu_uuid, gpu_model) to keep: within one reading a GPU slot has one UUID, a
    UUID one slot, a node one model (the results contract's rules for one run). Of two UUIDs in one slot (a GPU
    swapped) the one reporting at the end stays; the other is dropped and named in ``problems``."""
    ids = ids.drop_duplicates(ignore_index=True)
    if ids.empty:
        return ids
    now = present.assign(_now=True)[["node", "gpu", "gpu_uuid", "_now"]].drop_duplicates(["node", "gpu", "gpu_uuid"])
    ids = ids.merge(now, on=["node", "gpu", "gpu_uuid"], how="left")
    ids["_now"] = ids["_now"].fillna(False).astype(bool)
    # Rank candidates: reporting now first, then by name (stable, so a rerun keeps the same choice).
    ids = ids.sort_values(["_now", "node", "gpu", "gpu_uuid"], ascending=[False, True, True, True], kind="stable")
    for keys, what in ((["node", "gpu"], "slot"), (["gpu_uuid"], "uuid")):
        first = ~ids.duplicated(keys, keep="first")
        for row in ids[~first].itertuples(index=False):
            if what == "slot":
                kept = ids[first & (ids["node"] == row.node) & (ids["gpu"] == row.gpu)]["gpu_uuid"].iloc[0]
                problems.add(
                    str(row.node),
                    f"gpu {row.gpu} reported UUIDs {kept} and {row.gpu_uuid} within the window (a GPU "
                    f"swapped?): only {kept}'s telemetry is kept",
                )
            else:
                kept_row = ids[first & (ids["gpu_uuid"] == row.gpu_uuid)].iloc[0]
                problems.add(
                    str(row.node),
                    f"UUID {row.gpu_uuid} also reported as gpu {kept_row['gpu']} of node {kept_row['node']} "
                    f"within the window: its telemetry here (gpu {row.gpu}) is dropped",
                )
        ids = ids[first]
    # One model per node: the one most of its GPUs report.
    model_counts = ids.groupby(["node", "gpu_model"], sort=True).size().rename("n").reset_index()
    model_counts = model_counts.sort_values(["node", "n"], ascending=[True, False], kind="stable")
    main = model_counts.drop_duplicates("node")[["node", "gpu_model"]]
    odd = ids.merge(main, on=["node", "gpu_model"], how="left", indicator=True)["_merge"].to_numpy() == "left_only"
    for row in ids[odd].itertuples(index=False):
        problems.add(
            str(row.node), f"gpu {row.gpu} reports model {row.gpu_model!r} unlike the node's other GPUs: dropped"
        )
    settled: pd.DataFrame = ids[~odd][["node", "gpu", "gpu_uuid", "gpu_model"]].reset_index(drop=True)
    return settled


def _node_counts(
    ids: pd.DataFrame, present: pd.DataFrame, expected_gpus: Mapping[str, int] | None, problems: Problems
) -> pd.DataFrame:
    """``gpu_count`` (GPUs reporting at the end) and ``gpu_count_expected`` of the nodes with telemetry. A node
    none of whose GPUs reports at the end gets a problem, no count: its exporter (or the node) went away, which
    says nothing about how many GPUs it sees, and a count of 0 would fail every GPU of it."""
    reporting = present.drop_duplicates(["node", "gpu"]).groupby("node").size() if len(present) else pd.Series()
    rows: list[tuple[str, str, float]] = []
    for node in sorted(set(ids["node"].astype(str))):
        if node not in reporting.index:
            problems.add(
                node, "no GPU series at the end of the window (exporter or node down): its GPU count is unknown"
            )
            continue
        rows.append((node, "gpu_count", float(reporting[node])))
        if expected_gpus is not None and node in expected_gpus:
            rows.append((node, "gpu_count_expected", float(expected_gpus[node])))
    return pd.DataFrame(rows, columns=["node", "metric", "value"])


def _node_rows(ids: pd.DataFrame, node_readings: pd.DataFrame, stamp: pd.Timestamp) -> pd.DataFrame:
    """``node_readings`` (node, metric, value) of the nodes in ``ids``, as node-level rows with the node's GPU
    model."""
    model = ids.drop_duplicates("node").set_index("node")["gpu_model"]
    frame = node_readings[node_readings["node"].isin(model.index)]
    return pd.DataFrame(
        {
            "node": frame["node"].to_numpy(dtype=object),
            "gpu_model": model.reindex(frame["node"]).to_numpy(dtype=object),
            "metric": frame["metric"].to_numpy(dtype=object),
            "value": frame["value"].to_numpy(dtype=np.float64),
            "gpu": pd.NA,
            "gpu_uuid": None,
            "ts": stamp,
        }
    )


def transport_reason(exc: BaseException) -> str:
    """What went wrong below HTTP, in the system's words (``connection refused``, an untrusted certificate):
    the error httpx wraps, found along the chain of causes."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return f"{_UNTRUSTED} ({seen.verify_message}): {_GIVE_THE_CA}"
        if isinstance(seen, TimeoutError):
            return "connection timed out"
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror.lower()
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text:
        detail = text.split("certificate verify failed:", 1)[-1].split("(_ssl", 1)[0].strip()
        return f"{_UNTRUSTED} ({detail}): {_GIVE_THE_CA}"
    if "refused" in text.lower():
        return "connection refused"
    return text or type(exc).__name__


_UNTRUSTED = "TLS certificate not trusted"
_GIVE_THE_CA = "give the CA that signed it, or turn verification off"


def missing_nodes(expected: Iterable[str], reported: Iterable[str]) -> list[str]:
    """The expected nodes with no telemetry at all, sorted."""
    return sorted(set(expected) - set(reported))
