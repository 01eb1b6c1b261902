"""Gathering a job's signals over its window into the frames of :mod:`gpucert.explain._frames`.

What is read and how each source is tied to the job: docs/design/explain.md ("What explain reads"). The DCGM
telemetry comes from Prometheus range queries at the exporters' own scrape step (so the first scrape interval
where a GPU departs is its onset), chunked by node (:data:`NODES_PER_QUERY`) and by time so that no answer
holds more than Prometheus' 11,000 points per series; rates are ``irate`` over three scrape intervals, so a
counter's onset is not smeared over a long window. Kubernetes Events live an hour by default: what a pod's own
status says (an eviction, an OOM kill) stands in for an Event that has expired.

Nothing here diagnoses: what could not be read is a note, never an invented number.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pandas as pd

from .._memory import release_freed_memory
from ..kube import Kube, KubeError
from ..telemetry import HOST_LABELS, PrometheusSource
from ._frames import (
    COLLECTIVES_COLUMNS,
    EVENTS_COLUMNS,
    empty_collectives,
    empty_events,
    empty_nic,
    empty_steps,
    empty_telemetry,
)
from ._grid import column_codes
from ._target import JobTarget, LabelMap, TargetPod, assign_gpus, holders_at, parse_time, workload_of

__all__ = ["STEP_METRIC", "Gathered", "gather", "gather_events", "gather_steps", "gather_telemetry", "scrape_step"]

#: The job's step-time gauge (seconds per step, labelled ``namespace`` and ``pod``) unless told otherwise.
STEP_METRIC = "train_step_seconds"
#: Nodes named in one query: 8 nodes of 8 GPUs over 6 h at 15 s is 64 series of 1,441 points.
NODES_PER_QUERY = 8
#: Pods named in one query of the step metric (a regex of their names).
PODS_PER_QUERY = 100
#: Prometheus answers at most 11,000 points per series of a range query; a margin for the end points.
_MAX_POINTS = 10_900
_DEFAULT_STEP_S = 15.0
_LOG_WORKERS = 8

#: signal → PromQL over one selector function ``s(metric)`` and the rate window ``w`` / step ``step``
#: (seconds, as text). Every signal is read whole, zeros included: a zero is a reading, an absence is not.
SIGNAL_QUERIES: Mapping[str, Callable[[Callable[[str], str], str, str], str]] = {
    "sm_clock_mhz": lambda s, w, step: s("DCGM_FI_DEV_SM_CLOCK"),
    "clock_event_reasons": lambda s, w, step: s("DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
    "power_w": lambda s, w, step: s("DCGM_FI_DEV_POWER_USAGE"),
    "temp_c": lambda s, w, step: s("DCGM_FI_DEV_GPU_TEMP"),
    "util_pct": lambda s, w, step: s("DCGM_FI_DEV_GPU_UTIL"),
    "engine_active": lambda s, w, step: s("DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    "nvlink_gbps": lambda s, w, step: f"irate({s('DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL')}[{w}]) / 1e9",
    "pcie_gbps": lambda s, w, step: f"({s('DCGM_FI_PROF_PCIE_TX_BYTES')} + {s('DCGM_FI_PROF_PCIE_RX_BYTES')}) / 1e9",
    # Errors and flags are read only where they are non-zero (see SPARSE_SIGNALS): a healthy fleet's zeros are
    # most of the points of a large job, and an absence reads as zero.
    "xid": lambda s, w, step: f"{s('DCGM_FI_DEV_XID_ERRORS')} > 0",
    "ecc_dbe": lambda s, w, step: f"irate({s('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL')}[{w}]) * {step} > 0",
    "pcie_replays_per_min": lambda s, w, step: f"irate({s('DCGM_FI_DEV_PCIE_REPLAY_COUNTER')}[{w}]) * 60",
    "thermal_violation_frac": lambda s, w, step: f"clamp(irate({s('DCGM_FI_DEV_THERMAL_VIOLATION')}[{w}]) / 1e9, 0, 1)",
    "power_violation_frac": lambda s, w, step: f"clamp(irate({s('DCGM_FI_DEV_POWER_VIOLATION')}[{w}]) / 1e9, 0, 1)",
    "pcie_link_gen": lambda s, w, step: s("DCGM_FI_DEV_PCIE_LINK_GEN"),
    # The maxima only where the link runs below them (a link at its maximum needs no second figure).
    "pcie_link_gen_max": lambda s, w, step: f"{s('DCGM_FI_DEV_PCIE_MAX_LINK_GEN')} > {s('DCGM_FI_DEV_PCIE_LINK_GEN')}",
    "pcie_link_width": lambda s, w, step: s("DCGM_FI_DEV_PCIE_LINK_WIDTH"),
    "pcie_link_width_max": lambda s, w, step: (
        f"{s('DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH')} > {s('DCGM_FI_DEV_PCIE_LINK_WIDTH')}"
    ),
    "ecc_sbe": lambda s, w, step: f"irate({s('DCGM_FI_DEV_ECC_SBE_VOL_TOTAL')}[{w}]) * {step} > 0",
    "row_remap_failure": lambda s, w, step: f"{s('DCGM_FI_DEV_ROW_REMAP_FAILURE')} > 0",
    "row_remap_pending": lambda s, w, step: f"{s('DCGM_FI_DEV_ROW_REMAP_PENDING')} > 0",
    "remapped_rows_uncorrectable": lambda s, w, step: f"{s('DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS')} > 0",
    "remapped_rows_correctable": lambda s, w, step: f"{s('DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS')} > 0",
}
#: node-exporter's infiniband series → the nic frame's signal, and whether it is a counter (increase per step).
_NIC_SERIES = (
    ("node_infiniband_rate_bytes_per_second", "rate_gbps", False),
    ("node_infiniband_symbol_error_total", "symbol_errors", True),
    ("node_infiniband_link_downed_total", "link_downed", True),
    ("node_infiniband_port_errors_received_total", "rcv_errors", True),
)
_NCCL_BUSBW = "nccl_bus_bandwidth_gbs"
_NCCL_TIME = "nccl_collective_exec_time_microseconds"
#: A node's condition → (reason when it turns bad, reason when it turns good, the bad status).
_CONDITIONS = {
    "Ready": ("NodeNotReady", "NodeReady", "notTrue"),
    "MemoryPressure": ("NodeHasInsufficientMemory", "NodeHasSufficientMemory", "True"),
    "DiskPressure": ("NodeHasDiskPressure", "NodeHasNoDiskPressure", "True"),
    "PIDPressure": ("NodeHasInsufficientPID", "NodeHasSufficientPID", "True"),
    "NetworkUnavailable": ("NodeNetworkUnavailable", "NodeNetworkAvailable", "True"),
}
#: A pod's status reason that is an event in itself (its Event may have expired).
_POD_REASONS = frozenset({"Evicted", "Preempted", "OOMKilled", "DeadlineExceeded", "NodeLost", "Shutdown", "Error"})


@dataclass(frozen=True)
class Gathered:
    """Every frame of one job's window, the scrape step they were read at, and what could not be read."""

    telemetry: pd.DataFrame
    nic: pd.DataFrame
    steps: pd.DataFrame
    collectives: pd.DataFrame
    events: pd.DataFrame
    step_s: float
    notes: tuple[str, ...] = ()
    #: Seconds per part: ``prometheus`` (the queries: HTTP and JSON), ``frames`` (answers into frames),
    #: ``logs``, ``events``.
    seconds: Mapping[str, float] = field(default_factory=dict)
    queries: int = 0


class _Reader:
    """One gathering's range queries, at one step, from many threads: the notes they leave and the seconds
    spent per part."""

    def __init__(self, source: PrometheusSource, step_s: float, notes: list[str]) -> None:
        self.source, self.step_s, self.notes = source, step_s, notes
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}
        self.queries = 0

    def add(self, part: str, seconds: float, *, queries: int = 0) -> None:
        with self._lock:
            self.seconds[part] = self.seconds.get(part, 0.0) + seconds
            self.queries += queries

    def query(self, expr: str, span: tuple[float, float]) -> list[dict[str, Any]]:
        """The range query of ``expr`` over ``span``, its time counted as ``prometheus``."""
        began = time.perf_counter()
        answer = self.source.query_range_arrays(expr, span[0], span[1], self.step_s, self.notes)
        self.add("prometheus", time.perf_counter() - began, queries=1)
        return answer


# --- the whole gathering ----------------------------------------------------------------------------------


def gather(
    kube: Kube,
    source: PrometheusSource,
    target: JobTarget,
    *,
    step_metric: str | None = STEP_METRIC,
    read_logs: bool = True,
    labels: LabelMap | None = None,
) -> Gathered:
    """All frames of ``target``'s window, read at the exporters' scrape interval. ``step_metric``: the job's
    step gauge (None or ``""``: read the pods' logs only); ``read_logs``: False reads no pod log; ``labels``:
    the label mapping where detection cannot tell (``--labels``), default detected.

    Raises :class:`~gpucert.telemetry.PrometheusAuthError` / :class:`TelemetryError` when Prometheus refuses
    or does not answer, the :class:`~gpucert.kube.KubeError` of a cluster that does not answer.
    """
    notes: list[str] = list(target.notes)
    started = time.perf_counter()
    reader = _Reader(source, scrape_step(source, target, notes, labels=labels), notes)
    reader.add("prometheus", time.perf_counter() - started, queries=1)
    telemetry, nic = gather_telemetry(reader, target, labels)
    gpus_of_pod = _gpus_of_pod(telemetry)
    steps, collectives = gather_steps(kube, reader, target, step_metric, read_logs, gpus_of_pod, labels or LabelMap())
    began = time.perf_counter()
    events = gather_events(kube, target, notes=notes)
    reader.add("events", time.perf_counter() - began)
    if telemetry.empty:
        notes.append("no DCGM telemetry of the job's GPUs in Prometheus for the window")
    # The answers' bytes and arrays (from several threads' arenas) are garbage now: give them back before the
    # diagnosis builds its matrices, so the two do not add up.
    release_freed_memory()
    return Gathered(
        telemetry=telemetry,
        nic=nic,
        steps=steps,
        collectives=collectives,
        events=events,
        step_s=reader.step_s,
        notes=tuple(dict.fromkeys(notes)),
        seconds=dict(reader.seconds),
        queries=reader.queries,
    )


def _gpus_of_pod(telemetry: pd.DataFrame) -> dict[str, list[int]]:
    """pod → the GPU indexes it held, from the telemetry's own labels (how a pod's CUDA devices map)."""
    if telemetry.empty:
        return {}
    codes, names = column_codes(telemetry["pod"])
    gpus = telemetry["gpu"].to_numpy(dtype=np.int64)
    keyed = np.unique(codes.astype(np.int64) * 65_536 + gpus)  # one pass over the codes, no row objects
    out: dict[str, list[int]] = {}
    for key in keyed[keyed >= 0]:
        out.setdefault(names[int(key) // 65_536], []).append(int(key) % 65_536)
    return out


# --- PromQL helpers ---------------------------------------------------------------------------------------


def _regex(names: Iterable[str]) -> str:
    """An RE2 alternation of literal ``names``, quoted for a PromQL string."""
    special = set(r".^$*+?()[]{}|\\")
    parts = ["".join("\\" + c if c in special else c for c in name) for name in names]
    return "|".join(parts).replace("\\", "\\\\").replace('"', '\\"')


def _host_labels(source: PrometheusSource) -> tuple[str, ...]:
    return (source.host_label,) if source.host_label else HOST_LABELS


def _node_labels(source: PrometheusSource, labels: LabelMap | None) -> tuple[str, ...]:
    """The labels a DCGM series may name its node by: the one told (``--labels node=…``), else the exporter's
    host label(s) and a scrape's ``node``."""
    return (labels.node,) if labels is not None and labels.node else (*_host_labels(source), "node")


def _over_hosts(
    source: PrometheusSource,
    nodes: Sequence[str],
    build: Callable[[Callable[[str], str]], str],
    labels: Sequence[str] | None = None,
) -> str:
    """``build(s)`` for each host label the source reads, joined by ``or`` (a fleet mid-upgrade carries
    either): ``s(metric)`` is the metric restricted to ``nodes``. ``labels``: the host labels the job's series
    were seen to carry (:func:`_seen_host_labels`), so that a fleet with one pays for one selector, not an
    ``or`` of three evaluated at every instant."""
    regex = _regex(nodes)
    exprs = []
    # A scrape that relabels the node into ``node`` (kube-prometheus' pod SD) is read too: dcgm-exporter's
    # host label is the exporter pod's own hostname when it runs without hostNetwork and NODE_NAME.
    for label in labels or (*_host_labels(source), "node"):
        exprs.append(build(lambda metric, label=label: f'{metric}{{{label}=~"{regex}"}}'))  # type: ignore[misc]
    return " or ".join(f"({e})" for e in exprs) if len(exprs) > 1 else exprs[0]


def _seen_host_labels(
    candidates: Sequence[str], series_labels: Iterable[Mapping[str, str]], nodes: Sequence[str]
) -> tuple[str, ...] | None:
    """The host labels (of ``candidates``, those :func:`_over_hosts` reads) whose value names a node of the job
    on some series; None when none does (then every label is asked, as before)."""
    wanted = set(nodes)
    seen = {label for labels in series_labels for label in candidates if labels.get(label) in wanted}
    return tuple(label for label in candidates if label in seen) or None


def _chunks(items: Sequence[str], size: int) -> list[list[str]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def _grid(window: tuple[pd.Timestamp, pd.Timestamp], step: float) -> list[tuple[float, float]]:
    """The window as (start, end) unix-second spans on one grid of ``step`` (every query of the job sees the
    same instants), each of at most ``_MAX_POINTS`` points."""
    start = math.ceil(window[0].timestamp() / step) * step
    end = math.floor(window[1].timestamp() / step) * step
    end = max(end, start)
    span = step * (_MAX_POINTS - 1)
    spans = []
    at = start
    while at <= end:
        spans.append((at, min(end, at + span)))
        at += span + step
    return spans


def scrape_step(
    source: PrometheusSource, target: JobTarget, notes: list[str] | None = None, *, labels: LabelMap | None = None
) -> float:
    """The DCGM exporters' scrape interval on the job's nodes, in whole seconds: the window over the most
    samples any GPU temperature series holds in it (``count_over_time``); 15 s when there are none."""
    start, end = target.window
    window = max(1, math.floor((end - start).total_seconds()))
    nodes = target.nodes[:NODES_PER_QUERY]
    if not nodes:
        return _DEFAULT_STEP_S
    expr = _over_hosts(
        source,
        nodes,
        lambda s: f"count_over_time({s('DCGM_FI_DEV_GPU_TEMP')}[{window}s])",
        _node_labels(source, labels),
    )
    series = source.query(expr, end.timestamp(), notes)
    counts = [v for s in series for _, v in s.values if math.isfinite(v) and v > 1]
    if not counts:
        return _DEFAULT_STEP_S
    return float(max(1, round(window / max(counts))))


# --- telemetry --------------------------------------------------------------------------------------------


def gather_telemetry(reader: _Reader, target: JobTarget, labels: LabelMap | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The telemetry frame (one row per GPU × signal × instant, the job's GPUs only) and the nic frame of
    ``target``'s window; ``labels`` as :func:`gather`. Raises as :meth:`PrometheusSource.query` does."""
    source, step_s, notes = reader.source, reader.step_s, reader.notes
    mapping = labels or LabelMap()
    candidates = _node_labels(source, labels)
    nodes = target.nodes
    if not nodes:
        return empty_telemetry(), empty_nic()
    step = f"{step_s:g}"
    w = f"{max(1, round(3 * step_s))}s"
    spans = _grid(target.window, step_s)
    end = target.window[1].timestamp()

    # Which pod holds which GPU: the series' own labels, read once over the window.
    began = time.perf_counter()
    window = max(1, math.floor((target.window[1] - target.window[0]).total_seconds()))
    seen: list[tuple[str, int, dict[str, str]]] = []
    for chunk in _chunks(nodes, NODES_PER_QUERY * 4):
        expr = _over_hosts(
            source, chunk, lambda s: f"last_over_time({s('DCGM_FI_DEV_GPU_TEMP')}[{window}s])", candidates
        )
        for s in source.query(expr, end, notes):
            ident = _identity(s.labels, source.host_label, mapping.node)
            if ident is not None:
                seen.append((ident[0], ident[1], s.labels))
    host_labels = _seen_host_labels(candidates, (lab for _, _, lab in seen), nodes)
    holders, assigned = assign_gpus(target, seen, mapping)
    notes.extend(assigned)
    reader.add("prometheus", time.perf_counter() - began, queries=len(_chunks(nodes, NODES_PER_QUERY * 4)))

    frames = _Frames(target, holders, source.host_label, mapping)
    jobs: list[Callable[[], None]] = []
    for signal, build in SIGNAL_QUERIES.items():
        for chunk in _chunks(nodes, NODES_PER_QUERY):
            expr = _over_hosts(source, chunk, lambda s, build=build: build(s, w, step), host_labels)  # type: ignore[misc]
            jobs += [functools.partial(frames.read, reader, signal, expr, span) for span in spans]
    nic_frames: list[pd.DataFrame] = []
    read_nic = functools.partial(_read_nic, reader, nic_frames, nodes=set(nodes), node_label=mapping.node)
    for metric, signal, counter in _NIC_SERIES:
        for chunk in _chunks(nodes, NODES_PER_QUERY):  # 8 ports a node: as many series as a DCGM query
            expr = _nic_expr(metric, counter, chunk, w, step, mapping.node)
            jobs += [functools.partial(read_nic, signal, expr, span) for span in spans]
    _run_all(jobs, workers=source.workers)
    telemetry = frames.frame()
    notes.extend(frames.untied_notes(telemetry))
    if not nic_frames:
        return telemetry, empty_nic()
    return telemetry, _categorical(pd.concat(nic_frames, ignore_index=True), ("node", "device", "signal"))


def _categorical(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """``frame`` with its text ``columns`` as categoricals: millions of rows share a few hundred names."""
    return frame.astype(dict.fromkeys(columns, "category"))


def _run_all(jobs: Sequence[Callable[[], None]], *, workers: int) -> None:
    """Run ``jobs`` on ``workers`` threads; the first failure stops those not started and is raised."""
    failed = threading.Event()

    def guarded(job: Callable[[], None]) -> None:
        if failed.is_set():
            return
        try:
            job()
        except BaseException:
            failed.set()
            raise

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpucert-explain") as pool:
        futures = [pool.submit(guarded, job) for job in jobs]
        for future in futures:
            future.result()


def _identity(
    labels: Mapping[str, str], host_label: str | None, node_label: str | None = None
) -> tuple[str, int, str] | None:
    # A ``node`` a scrape's relabeling set is the Kubernetes node itself; dcgm-exporter's host label is its pod's
    # own hostname when it runs without hostNetwork and NODE_NAME. A label told (--labels node=…) is the only one.
    if node_label:
        node = labels.get(node_label)
    else:
        node = labels.get("node") or labels.get("kubernetes_node")
        node = node or (labels.get(host_label) if host_label else (labels.get("hostname") or labels.get("Hostname")))
    gpu = labels.get("gpu")
    if not node or gpu is None or not gpu.isdigit():
        return None
    return node, int(gpu), labels.get("UUID") or ""


class _Frames:
    """The telemetry answers as they come (from many threads), turned into columns at once per answer."""

    def __init__(
        self, target: JobTarget, holders: Mapping[str, Sequence[TargetPod]], host_label: str | None, labels: LabelMap
    ):
        self.host_label = host_label
        self.labels = labels
        self.job_pods = {(p.namespace, p.name) for p in target.pods}
        # Nodes where dcgm-exporter labels the job's pods: an unlabelled series there is a GPU the job does not hold.
        self.holders = {n: list(h) for n, h in holders.items()}
        self._lock = threading.Lock()
        self._parts: list[tuple[str, np.ndarray, np.ndarray, list[tuple[str, int, str, str | None, int]]]] = []
        self.skipped = 0
        #: GPUs of the job's nodes left out because a pod outside the job held them: (node, gpu) → pod.
        self.others: dict[tuple[str, int], str] = {}
        #: Whether some GPU came in two series of one answer (a pod label that changed): dedupe then.
        self.repeated = False

    def read(self, reader: _Reader, signal: str, expr: str, span: tuple[float, float]) -> None:
        answer = reader.query(expr, span)
        asked = time.perf_counter()
        self._add(signal, answer)
        reader.add("frames", time.perf_counter() - asked)

    def _add(self, signal: str, answer: Sequence[Mapping[str, Any]]) -> None:
        times: list[np.ndarray] = []
        texts: list[np.ndarray] = []
        meta: list[tuple[str, int, str, str | None, int]] = []
        skipped = 0
        gpus: set[tuple[str, int]] = set()
        repeated = False
        for series in answer:
            labels = series.get("metric") or {}
            ident = _identity(labels, self.host_label, self.labels.node)
            values = series.get("values") or ()
            if ident is None or not _n_points(values):
                skipped += ident is None
                continue
            node, gpu, uuid = ident
            repeated = repeated or (node, gpu) in gpus
            gpus.add((node, gpu))
            namespace, pod = workload_of(labels, self.labels.workload)
            if pod is not None and (namespace, pod) not in self.job_pods:
                if node in self.holders:
                    # A job pod holds every GPU of this node: the pod named is the exporter's own (a scrape
                    # that kept the target's pod label), not a workload.
                    pod = None
                else:
                    with self._lock:
                        self.others[(node, gpu)] = f"{namespace}/{pod}"
                    continue  # a GPU another workload held at the time
            if pod is None and node not in self.holders:
                continue  # dcgm-exporter labels this node's job GPUs: this one the job did not hold
            # Arrays cut from the answer's bytes (query_range_arrays): joined at once below.
            stamps, figures = _points(values)
            times.append(stamps)
            texts.append(figures)
            if pod is None:
                holders = self.holders[node]
                if len(holders) > 1:
                    # Pods that held the whole node one after the other: each sample to the one holding it then.
                    which = holders_at(holders, stamps)
                    cuts = np.flatnonzero(np.diff(which)) + 1
                    for part in np.split(np.arange(len(stamps)), cuts):
                        meta.append((node, gpu, uuid, holders[int(which[part[0]])].name, len(part)))
                    continue
                pod = holders[0].name
            meta.append((node, gpu, uuid, pod, len(stamps)))
        joined = (signal, np.concatenate(times), np.concatenate(texts), meta) if times else None
        with self._lock:
            self.skipped += skipped
            self.repeated = self.repeated or repeated
            if joined is not None:
                self._parts.append(joined)

    def untied_notes(self, telemetry: pd.DataFrame) -> list[str]:
        """What was read but could not be tied to the job, precisely: GPUs held by pods outside it, series
        without a host or GPU label."""
        out = []
        held: set[tuple[str, int]] = set()
        if self.others and len(telemetry):
            pairs = telemetry[["node", "gpu"]].drop_duplicates()
            held = set(zip(pairs["node"].astype(str), pairs["gpu"].astype(int), strict=True))
        others = {k: v for k, v in self.others.items() if k not in held}
        if others:
            pods = sorted(set(others.values()))
            listed = ", ".join(f"{n} GPU {g}" for n, g in sorted(others)[:5])
            out.append(
                f"{len(others)} GPU(s) on the job's nodes name pods outside the job and were left out "
                f"({listed}{', …' if len(others) > 5 else ''}; held by {', '.join(pods[:3])}"
                f"{', …' if len(pods) > 3 else ''})"
            )
        if self.skipped:
            out.append(f"{self.skipped} DCGM series on the job's nodes carry no host or gpu label: not tied to a GPU")
        return out

    def frame(self) -> pd.DataFrame:
        """The long telemetry frame; (ts, node, gpu, signal) unique (a GPU seen by two series counts once)."""
        if not self._parts:
            return empty_telemetry()
        parts, self._parts = self._parts, []  # the answers' arrays go as soon as they are joined
        value = np.concatenate([p[2] for p in parts])
        finite = np.isfinite(value)
        keep: np.ndarray | None = None if finite.all() else finite  # NaN answers, dropped column by column

        def cut(column: Any) -> Any:
            return column if keep is None else column[keep]

        meta = [m for p in parts for m in p[3]]
        counts = np.array([m[4] for m in meta], dtype=np.int64)
        per_part = np.array([len(p[1]) for p in parts], dtype=np.int64)
        ts = _unix(cut(np.concatenate([p[1] for p in parts])))
        signals = [p[0] for p in parts]
        del parts
        # Categoricals: millions of rows share a few hundred names (the frames' contract allows them).
        frame = pd.DataFrame(
            {
                "ts": ts,
                "node": cut(_repeat_category([m[0] for m in meta], counts)),
                "gpu": cut(np.repeat(np.array([m[1] for m in meta], dtype=np.int16), counts)),  # 2 bytes a row
                "gpu_uuid": cut(_repeat_category([m[2] for m in meta], counts)),
                "pod": cut(_repeat_category([m[3] for m in meta], counts)),
                "signal": cut(_repeat_category(signals, per_part)),
                "value": cut(value),
            },
            copy=False,
        )
        del value, ts
        if self.repeated:
            frame = frame.drop_duplicates(["ts", "node", "gpu", "signal"])
        # Unsorted: the answers come in the order the threads finished; every series is in time order.
        return frame.reset_index(drop=True)


def _n_points(values: Any) -> int:
    """How many points a series' values hold (arrays or Prometheus' list)."""
    return len(values[0]) if isinstance(values, tuple) else len(values)


def _points(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """A series' points as (unix seconds, values) arrays: as :meth:`PrometheusSource.query_range_arrays`
    hands them, or Prometheus' ``[[t, "v"], …]``."""
    if isinstance(values, tuple):
        return values[0], values[1]
    return (np.asarray([p[0] for p in values], dtype=np.float64), np.asarray([p[1] for p in values], dtype=np.float64))


def _series_frame(values: Any, column: str, **labels: Any) -> pd.DataFrame:
    """One series' points as rows: ``ts``, the ``labels`` as constant columns, and its values as ``column``."""
    times, figures = _points(values)
    return pd.DataFrame({"ts": _unix(times), **labels, column: figures})


def _unix(seconds: np.ndarray) -> pd.DatetimeIndex:
    """Unix seconds as the frames' timestamps (UTC, nanoseconds)."""
    return pd.to_datetime(seconds, unit="s", utc=True).as_unit("ns")


def _iso(texts: pd.Series) -> pd.Series:
    """RFC 3339 texts as the frames' timestamps; what does not parse is NaT."""
    return pd.to_datetime(texts, utc=True, errors="coerce", format="ISO8601").dt.as_unit("ns")


def _repeat_category(labels: Sequence[str | None], counts: np.ndarray) -> pd.Categorical[str]:
    """``labels[i]`` repeated ``counts[i]`` times, as a categorical (None: missing)."""
    categories = sorted({label for label in labels if label is not None})
    index = {label: i for i, label in enumerate(categories)}
    width = np.int8 if len(categories) < 127 else np.int16 if len(categories) < 32_767 else np.int32
    codes = np.array([index[label] if label is not None else -1 for label in labels], dtype=width)
    made: pd.Categorical[str] = pd.Categorical.from_codes(np.repeat(codes, counts), categories=pd.Index(categories))
    return made


# --- nic ---------------------------------------------------------------------------------------------------


def _nic_expr(
    metric: str, counter: bool, nodes: Sequence[str], w: str, step: str, node_label: str | None = None
) -> str:
    """node-exporter's ``metric`` on ``nodes`` (by its ``node`` label, the one told, or its ``instance`` without
    the port): a counter as its increase per step, the link rate in Gb/s."""
    regex = _regex(nodes)
    selectors = (f'{metric}{{{node_label or "node"}=~"{regex}"}}', f'{metric}{{instance=~"({regex})(:[0-9]+)?"}}')
    if counter:
        # Error counters only where they rose (an absence reads as zero): most of a large job's points.
        return " or ".join(f"irate({s}[{w}]) * {step} > 0" for s in selectors)
    return " or ".join(f"{s} * 8 / 1e9" for s in selectors)


def _read_nic(
    reader: _Reader,
    out: list[pd.DataFrame],
    signal: str,
    expr: str,
    span: tuple[float, float],
    *,
    nodes: set[str],
    node_label: str | None,
) -> None:
    """One range query of a NIC signal into ``out``, as rows of the nic frame of ``nodes``."""
    rows = []
    for series in reader.query(expr, span):
        labels = series.get("metric") or {}
        node = labels.get(node_label or "node") or (labels.get("instance") or "").rsplit(":", 1)[0]
        if node not in nodes:
            continue
        port = labels.get("port") or "1"
        values = series.get("values") or ()
        if not _n_points(values):
            continue
        port_no = int(port) if port.isdigit() else 1
        rows.append(
            _series_frame(values, "value", node=node, device=labels.get("device") or "", port=port_no, signal=signal)
        )
    if rows:
        out.append(pd.concat(rows, ignore_index=True))


# --- the job's own timings ---------------------------------------------------------------------------------


def gather_steps(
    kube: Kube,
    reader: _Reader,
    target: JobTarget,
    step_metric: str | None,
    read_logs: bool,
    gpus_of_pod: Mapping[str, Sequence[int]],
    labels: LabelMap,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The steps and collectives frames: Prometheus first (the step gauge ``step_metric``, NCCL Inspector's
    metrics), the pods' logs for what Prometheus does not have. Raises as :meth:`PrometheusSource.query`."""
    spans = _grid(target.window, reader.step_s)
    steps = empty_steps()
    if step_metric:
        steps = _steps_from_prometheus(reader, target, step_metric, spans, labels.job_workload)
    collectives = _collectives_from_prometheus(reader, target, spans, gpus_of_pod, labels)
    notes = reader.notes
    if (steps.empty or collectives.empty) and read_logs:
        started = time.perf_counter()
        log_steps, log_collectives = _from_logs(kube, target, notes)
        reader.add("logs", time.perf_counter() - started)
        if steps.empty:
            steps = log_steps
        if collectives.empty:
            collectives = log_collectives
    if steps.empty:
        how = f"no {step_metric} series in Prometheus and " if step_metric else ""
        notes.append(f"no step times: {how}no step lines in the pods' logs; the answer rests on telemetry")
    return steps, collectives


def _steps_from_prometheus(
    reader: _Reader,
    target: JobTarget,
    metric: str,
    spans: Sequence[tuple[float, float]],
    pairs: Sequence[tuple[str, str]],
) -> pd.DataFrame:
    """The job's step gauge ``metric`` as the steps frame, its pods named by the first of ``pairs`` set."""
    node_of = {p.name: p.node for p in target.pods}
    frames = []
    namespaces = sorted({p.namespace for p in target.pods})
    for chunk in _chunks(sorted({p.name for p in target.pods}), PODS_PER_QUERY):
        ns_re, pod_re = _regex(namespaces), _regex(chunk)
        expr = " or ".join(f'{metric}{{{ns}=~"{ns_re}",{pl}=~"{pod_re}"}}' for ns, pl in pairs)
        for span in spans:
            for series in reader.query(expr, span):
                pod = workload_of(series.get("metric") or {}, pairs)[1] or ""
                values = series.get("values") or ()
                if pod not in node_of or not _n_points(values):
                    continue
                no_step = pd.array([pd.NA] * _n_points(values), dtype="Int64")
                frames.append(_series_frame(values, "step_time_s", pod=pod, node=node_of[pod], step=no_step))
    if not frames:
        return empty_steps()
    steps = pd.concat(frames, ignore_index=True)
    steps = steps[np.isfinite(steps["step_time_s"].to_numpy())]
    ordered: pd.DataFrame = steps.sort_values("ts", kind="stable").reset_index(drop=True)
    return ordered


#: The labels a collective's series is told apart by: NCCL Inspector's own (``comm_id``, ``hostname`` — the
#: pod's name, or the node's under hostNetwork —, ``rank``, ``gpu_device_id`` ``GPU<n>``: the CUDA device
#: within the pod, ``collective``; see ``ext-profiler/inspector/inspector_prom.cc``), and the scrape's: a
#: relabeled ``node``, the pod labels of a scrape of the training pods. Every other label (``coll_sn``,
#: ``timestamp``, ``message_size``: new with each dump) is aggregated away.
_COLLECTIVE_KEYS = (
    "hostname",
    "rank",
    "comm_id",
    "gpu_device_id",
    "collective",
    "node",
    "pod",
    "namespace",
    "exported_pod",
    "exported_namespace",
)


def _collectives_from_prometheus(
    reader: _Reader,
    target: JobTarget,
    spans: Sequence[tuple[float, float]],
    gpus_of_pod: Mapping[str, Sequence[int]],
    mapping: LabelMap,
) -> pd.DataFrame:
    """NCCL Inspector's per-rank timings of the job, each tied to its node, GPU, pod and rank: the node from
    a scrape's ``node`` (or the label told) or ``hostname`` (a node's name under hostNetwork, else the pod's:
    its node), the GPU from ``gpu_device_id`` (the pod's n-th GPU by index, as the device plugin exposes them)."""
    nodes = set(target.nodes)
    pods = {p.name: p for p in target.pods if p.node}
    parts: dict[str, list[pd.DataFrame]] = {"busbw_gbps": [], "exec_time_us": []}
    untied: set[str] = set()
    told = [label for pair in mapping.workload for label in pair] + ([mapping.node] if mapping.node else [])
    by = ", ".join(dict.fromkeys([*_COLLECTIVE_KEYS, *told]))
    pod_labels = [pod for _, pod in mapping.job_workload]
    name_labels = list(dict.fromkeys(["hostname", mapping.node or "node", *pod_labels]))
    for metric, column in ((_NCCL_BUSBW, "busbw_gbps"), (_NCCL_TIME, "exec_time_us")):
        for node_chunk in _chunks(sorted(nodes), NODES_PER_QUERY):
            # The nodes and their pods: a rank is named by either, as many ranks as a DCGM query has GPUs.
            chunk = [*node_chunk, *sorted(p.name for p in pods.values() if p.node in node_chunk)]
            regex = _regex(chunk)
            # Each dump is a new series (its coll_sn and timestamp labels change): only the samples of the last
            # step count, as they do live once Prometheus marks the older dumps stale (a backfill has no stale
            # markers, and the 5-minute lookback would mix ten dumps of one rank).
            selectors = [f'last_over_time({metric}{{{label}=~"{regex}"}}[{reader.step_s:g}s])' for label in name_labels]
            expr = f"max by ({by}) ({' or '.join(selectors)})"
            for span in spans:
                for series in reader.query(expr, span):
                    found = series.get("metric") or {}
                    values = series.get("values") or ()
                    tied = _tie_collective(found, nodes, pods, gpus_of_pod, mapping)
                    if tied is None:
                        untied.add(next((found[n] for n in name_labels if found.get(n)), "?"))
                        continue
                    if not _n_points(values):
                        continue
                    node, pod, gpu, rank = tied
                    parts[column].append(
                        _series_frame(
                            values,
                            column,
                            node=node,
                            gpu=float(gpu) if gpu is not None else np.nan,
                            comm=found.get("comm_id") or "",
                            collective=found.get("collective") or "",
                            rank=float(rank) if rank is not None else np.nan,
                            pod=pod or "",
                        )
                    )
    if untied:
        reader.notes.append(
            f"NCCL series of {len(untied)} host(s) could not be tied to a node of the job: "
            f"{', '.join(sorted(untied)[:5])}"
        )
    keys = ["ts", "node", "gpu", "comm", "collective", "rank", "pod"]
    frames = [pd.concat(p, ignore_index=True) for p in parts.values() if p]
    if not frames:
        return empty_collectives()
    merged = functools.reduce(lambda a, b: a.merge(b, on=keys, how="outer"), frames)
    merged = merged.assign(**{column: np.nan for column in parts if column not in merged})
    merged["gpu"] = merged["gpu"].astype("Int64")
    merged["rank"] = merged["rank"].astype("Int64")
    ordered = _categorical(merged[[*COLLECTIVES_COLUMNS, "rank", "pod"]], ("node", "comm", "collective", "pod"))
    return ordered.sort_values("ts", kind="stable").reset_index(drop=True)


def _tie_collective(
    labels: Mapping[str, str],
    nodes: set[str],
    pods: Mapping[str, TargetPod],
    gpus_of_pod: Mapping[str, Sequence[int]],
    mapping: LabelMap | None = None,
) -> tuple[str, str | None, int | None, int | None] | None:
    """(node, pod, physical GPU index, rank) of one collective series, or None when it names nothing of the job."""
    mapping = mapping or LabelMap()
    host = labels.get("hostname") or ""
    _, pod = workload_of(labels, mapping.job_workload)
    if pod not in pods:
        pod = host if host in pods else None
    scraped = labels.get(mapping.node or "node")
    node = scraped if scraped in nodes else (host if host in nodes else None)
    if node is None and pod is not None:
        node = pods[pod].node
    if node is None:
        return None
    gpu: int | None = None
    device = (labels.get("gpu_device_id") or "").removeprefix("GPU")
    if device.isdigit():
        local = int(device)
        held = sorted(gpus_of_pod.get(pod or "", ()))
        if local < len(held):
            gpu = held[local]  # the pod's n-th visible device: its n-th GPU by index
        elif pod is None or (pods[pod].holds_node if pod in pods else False) or not held:
            gpu = local  # the whole node (hostNetwork, or a pod holding every GPU): the index itself
    rank_text = labels.get("rank") or ""
    rank = int(rank_text) if rank_text.isdigit() else None
    return node, pod, gpu, rank


def parse_step_log(text: str, *, pod: str, node: str | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The steps and collectives in one pod's log: JSON lines with ``ts`` (RFC 3339) and ``step_time_s``
    (``step`` optional), or ``collective`` (``comm``, ``busbw_gbps``, ``exec_time_us``, ``gpu`` optional);
    every other line, and a line whose fields do not parse, is ignored."""
    step_rows: list[dict[str, Any]] = []
    coll_rows: list[dict[str, Any]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith("{") or ('"step_time_s"' not in line and '"collective"' not in line):
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(record, dict) or not isinstance(record.get("ts"), str):
            continue
        if "step_time_s" in record:
            step_rows.append(record)
        elif "collective" in record:
            coll_rows.append(record)

    def column(rows: list[dict[str, Any]], key: str) -> pd.Series:
        return pd.Series([r.get(key) for r in rows], dtype=object)

    def numbers(rows: list[dict[str, Any]], key: str) -> pd.Series:
        return pd.to_numeric(column(rows, key), errors="coerce")

    steps = empty_steps()
    if step_rows:
        steps = pd.DataFrame(
            {
                "ts": _iso(column(step_rows, "ts")),
                "pod": pod,
                "node": node,
                "step": numbers(step_rows, "step").astype("Int64"),
                "step_time_s": numbers(step_rows, "step_time_s"),
            }
        ).dropna(subset=["ts", "step_time_s"])
    collectives = empty_collectives()
    if coll_rows:
        collectives = pd.DataFrame(
            {
                "ts": _iso(column(coll_rows, "ts")),
                "node": node,
                "gpu": numbers(coll_rows, "gpu").astype("Int64"),
                "comm": column(coll_rows, "comm").fillna("").astype(str),
                "collective": column(coll_rows, "collective").fillna("").astype(str),
                "busbw_gbps": numbers(coll_rows, "busbw_gbps"),
                "exec_time_us": numbers(coll_rows, "exec_time_us"),
            }
        ).dropna(subset=["ts"])
    return steps, collectives


def _from_logs(kube: Kube, target: JobTarget, notes: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Steps and collectives from every scheduled pod's log, within the window."""
    pods = [p for p in target.pods if p.node]
    unread: list[str] = []

    def read(pod: TargetPod) -> tuple[pd.DataFrame, pd.DataFrame]:
        try:
            text = kube.pod_log(pod.name, pod.namespace)
        except KubeError:
            unread.append(pod.name)
            return empty_steps(), empty_collectives()
        return parse_step_log(text, pod=pod.name, node=pod.node)

    with ThreadPoolExecutor(max_workers=_LOG_WORKERS, thread_name_prefix="gpucert-logs") as pool:
        parts = list(pool.map(read, pods))
    if unread:
        notes.append(f"the logs of {len(unread)} pod(s) could not be read: {', '.join(sorted(unread)[:5])}")
    start, end = target.window

    def joined(frames: list[pd.DataFrame], empty: pd.DataFrame) -> pd.DataFrame:
        frame = pd.concat(frames, ignore_index=True) if frames else empty
        inside = frame[(frame["ts"] >= start) & (frame["ts"] <= end)]
        return inside.sort_values("ts", kind="stable").reset_index(drop=True)

    steps = joined([s for s, _ in parts if len(s)], empty_steps())
    return steps, joined([c for _, c in parts if len(c)], empty_collectives())


# --- events ------------------------------------------------------------------------------------------------


def gather_events(kube: Kube, target: JobTarget, *, notes: list[str]) -> pd.DataFrame:
    """The events frame of ``target``'s window: Events about its pods and nodes (both APIs, each Event
    once), node condition changes, and pod status reasons whose Event is gone. Raises the
    :class:`~gpucert.kube.KubeError` of a cluster that does not answer (a refused list is a note)."""
    start, end = target.window
    pods = {(p.namespace, p.name): p for p in target.pods}
    node_of_pod = {key: p.node for key, p in pods.items()}
    nodes = set(target.nodes)
    rows: list[tuple[Any, ...]] = []  # in the order of EVENTS_COLUMNS
    seen_uids: set[str] = set()

    def add(item: Mapping[str, Any], new_api: bool) -> None:
        meta = item.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if uid and uid in seen_uids:
            return
        about = (item.get("regarding") if new_api else item.get("involvedObject")) or {}
        kind, name, namespace = about.get("kind"), str(about.get("name") or ""), about.get("namespace") or None
        if kind == "Pod" and (str(namespace or ""), name) in pods:
            node = node_of_pod[(str(namespace or ""), name)]
        elif kind == "Node" and name in nodes:
            node = name
        else:
            return
        ts = _event_time(item, new_api)
        if ts is None or not (start <= ts <= end):
            return
        seen_uids.add(uid)
        note = str((item.get("note") if new_api else item.get("message")) or "")
        rows.append(
            (ts, kind, name, namespace, node, str(item.get("reason") or ""), str(item.get("type") or "Normal"), note)
        )

    namespaces = sorted({p.namespace for p in target.pods})
    for api_version, kind_field in (("events.k8s.io/v1", "regarding.kind"), ("v1", "involvedObject.kind")):
        new_api = api_version != "v1"
        for namespace in namespaces:
            for item in _events(kube, api_version, namespace, f"{kind_field}=Pod", notes):
                add(item, new_api)
        for item in _events(kube, api_version, None, f"{kind_field}=Node", notes):
            add(item, new_api)
    rows += _condition_changes(kube, sorted(nodes), start, end)
    frame = pd.DataFrame(rows, columns=list(EVENTS_COLUMNS)) if rows else empty_events()
    frame = _dedupe_events(frame)
    frame = pd.concat([frame, _pod_status_events(pods.values(), frame, start, end)], ignore_index=True)
    if frame.empty:
        return empty_events()
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True).dt.as_unit("ns")
    return frame.sort_values("ts", kind="stable").reset_index(drop=True)


def _events(
    kube: Kube, api_version: str, namespace: str | None, field_selector: str, notes: list[str]
) -> list[dict[str, Any]]:
    try:
        return kube.list_objects(api_version, "Event", namespace, field_selector=field_selector)
    except KubeError as exc:
        if exc.status in (401, 403, 404):
            notes.append(f"Events ({api_version}) could not be listed: {exc}")
            return []
        raise


def _event_time(item: Mapping[str, Any], new_api: bool) -> pd.Timestamp | None:
    series = item.get("series") or {}
    candidates: tuple[Any, ...]
    if new_api:
        candidates = (series.get("lastObservedTime"), item.get("eventTime"), item.get("deprecatedLastTimestamp"))
    else:
        candidates = (
            item.get("lastTimestamp"),
            series.get("lastObservedTime"),
            item.get("eventTime"),
            item.get("firstTimestamp"),
        )
    created = (item.get("metadata") or {}).get("creationTimestamp")
    return next((t for t in map(parse_time, (*candidates, created)) if t is not None), None)


def _dedupe_events(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per happening: a recorder that writes one through both Event APIs makes two Events, under
    two UIDs (and a core message may word the note otherwise); the same object and reason within one
    second is the same Event."""
    if frame.empty:
        return frame
    second = pd.to_datetime(frame["ts"], utc=True).dt.floor("s")
    keys = frame.assign(_s=second)[["_s", "object_kind", "object_name", "reason"]]
    return frame[~keys.duplicated()].reset_index(drop=True)


def _condition_changes(
    kube: Kube, nodes: Sequence[str], start: pd.Timestamp, end: pd.Timestamp
) -> list[tuple[Any, ...]]:
    """Each node condition whose last transition falls in the window, as the event it stands for (a row of the
    events frame)."""
    rows = []
    for name in nodes:
        try:
            node = kube.get("v1", "Node", name)
        except KubeError:
            continue
        for cond in (node.get("status") or {}).get("conditions") or ():
            kind = str(cond.get("type") or "")
            ts = parse_time(cond.get("lastTransitionTime"))
            if kind not in _CONDITIONS or ts is None or not (start <= ts <= end):
                continue
            bad_reason, good_reason, bad = _CONDITIONS[kind]
            status = str(cond.get("status") or "Unknown")
            is_bad = status != "True" if bad == "notTrue" else status == "True"
            reason, type_ = (bad_reason, "Warning") if is_bad else (good_reason, "Normal")
            why = f" ({cond.get('reason')}: {cond.get('message')})" if cond.get("reason") else ""
            rows.append((ts, "Node", name, None, name, reason, type_, f"condition {kind}={status}{why}"))
    return rows


def _pod_status_events(
    pods: Iterable[TargetPod], seen: pd.DataFrame, start: pd.Timestamp, end: pd.Timestamp
) -> pd.DataFrame:
    """What a pod's own status says happened — its reason (``Evicted`` …), a container killed for memory or
    that failed (``OOMKilled``, ``Error``, the previous run of a restarted one) — as events, where no Event of
    that reason about the pod is in ``seen`` (Events expire after an hour by default; the status stays)."""
    have = set(zip(seen["object_name"], seen["reason"], strict=True)) if len(seen) else set()
    rows = []
    for pod in pods:
        happened = [(pod.reason, pod.ended, f"pod {pod.phase}: {pod.reason} (from its status)")]
        happened += [
            (reason, when, f"container {container} terminated: {reason} (from the pod's status)")
            for reason, when, container in pod.terminations
        ]
        for reason, when, note in happened:
            wanted = reason in _POD_REASONS and (pod.name, reason) not in have
            if wanted and when is not None and start <= when <= end:
                have.add((pod.name, reason))
                rows.append((when, "Pod", pod.name, pod.namespace, pod.node, reason, "Warning", note))
    return pd.DataFrame(rows, columns=list(EVENTS_COLUMNS)) if rows else empty_events()
