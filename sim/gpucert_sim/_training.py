"""Training jobs on the simulated cluster: step times, pod logs, exporter series and their history.

``gpucert explain`` answers "why is this job slow" from a job's telemetry, its own timings and its events on
one time axis; to test it the simulated cluster must run jobs whose signals tell a consistent story. This
module is that story, one pure function of a job's spec, its faults and where its pods ran, so that the
live exporters, the pod logs and the backfilled history all say the same thing.

Which pods train
----------------
A pod annotated ``sim.gpucert.io/training: "true"`` (:data:`TRAINING_ANNOTATION`; a Job's pod template
carries it to its pods). Its job is the Job that controls it (else its ``job-name`` label, else the pod
itself): ``namespace/name``. Each pod holds the GPUs it requests on its node (``nvidia.com/gpu: 8``: all of
them). Annotations, on the Job or the pod template (the pod's win):

* ``sim.gpucert.io/training-start`` (RFC 3339): when the job began. History is synthesised from then, which
  is how time is compressed: a job that began 6 h ago has 6 h of steps, logs and telemetry at once. Default:
  when its first pod started. At most :data:`MAX_STEPS` steps of history.
* ``sim.gpucert.io/step-seconds``: the healthy step time (default 1.0; 0.05 to 3600).
* ``sim.gpucert.io/training-seconds``: how long the job trains from its start; its pods (``restartPolicy``
  Never or OnFailure) then succeed. Absent: it trains until deleted.

A bad annotation fails the pod at once (exit code 2, the reason on its log), as a payload refusing its
arguments would.

The model
---------
A healthy step is 70 % compute and 30 % collective (``AllReduce``). Synchronous training waits for the
slowest rank, so the job's step time at each instant is
``max(max over GPUs of compute / clock_frac + collective × nic_factor, healthy × input_factor)``, plus 1 %
noise per step. Faults (the fault document's ``training:`` section, :func:`parse_training_fault`), minutes
from the job's start:

* ``gpu_throttle`` (``node``, ``gpu``, ``params.clock_frac`` default 0.5): while the GPU trains its SM clock
  is ``clock_frac`` of the maximum, the HW thermal clock-event bit 0x40 is set with 0x08 (HW slowdown), its
  temperature sits just above its slowdown threshold, its power falls and ``DCGM_FI_DEV_THERMAL_VIOLATION``
  grows by 1 s per second. Its compute takes ``1/clock_frac`` as long; the others wait in the collective:
  their utilisation and engine activity fall a little, their clocks stay where they were, and NCCL
  Inspector sees *their* collectives take longer (the straggler arrives last and waits least).
* ``nic_half_rate`` (``node``, optional ``device`` default ``mlx5_0``, ``params.flapping`` default false):
  the link trains at half its 400 Gb/s (node-exporter's ``node_infiniband_rate_bytes_per_second`` shows
  25e9), the collectives of the whole job take twice as long; a flapping link also counts symbol errors,
  receive errors and a link-down every 10 minutes.
* ``evict`` (``node``, ``at_minute``, ``params.gap_minutes`` default 5): the job's pod on that node is
  evicted then (pod Failed with reason ``Evicted``; an ``Evicted`` Warning Event, read through
  ``events.k8s.io`` and core alike, at that time even when the time is in the past). Steps stall until the
  replacement pod (the Job controller makes one) resumes ``gap_minutes`` after the eviction; meanwhile every
  GPU of the job idles.
* ``slow_input`` (``params.factor`` default 1.6): steps take ``factor`` as long; the GPUs are healthy but
  wait for data: utilisation and engine activity drop on every GPU alike, clocks stay at the maximum.

``until_minute`` ends a ``gpu_throttle``, ``nic_half_rate`` or ``slow_input``. A fault injected after its
minute has passed rewrites the job's history as if it had been there from the start (a pod's log keeps the
lines it already printed).

GPU values: busy ~95 % utilisation, engine activity ~0.9, power ~0.8 of the limit, SM clock at the
model's maximum; idle (no step in progress: before the start, in a stall, not held) 345 MHz with the
GPU-idle bit 0x1, 75 W, no traffic. Gauge noise changes every 15 s (a lattice of unix time, so any instant
reads the same value live and in the history); counters (NVLink and PCIe bytes, violation times) are exact
integrals of their rates. Values are rounded as printed, so a live scrape and the backfill agree exactly.

Where it shows
--------------
* pod logs: JSON lines ``{"ts", "step", "step_time_s"}`` for every step the pod took part in, and every
  :data:`COLLECTIVE_EVERY` steps one ``{"ts", "collective": "AllReduce", "comm", "gpu", "busbw_gbps",
  "exec_time_us"}`` line per GPU; the whole history up to now when the job began in the past;
* the DCGM exporters (``_dcgm.py``): a GPU held by a training pod carries ``pod``, ``namespace`` and
  ``container`` labels and the values above;
* :data:`TRAINING_METRICS_PATH`: the job's ``train_step_seconds{namespace,pod}`` and NCCL Inspector's
  ``nccl_bus_bandwidth_gbs`` / ``nccl_collective_exec_time_microseconds`` with the labels its Prometheus dump
  writes (NVIDIA/nccl ``ext-profiler/inspector/inspector_prom.cc``): ``comm_id``, ``hostname`` (the pod's
  name: training pods run without hostNetwork), ``rank`` (a replacement pod takes the ranks of the pod it
  replaces), ``slurm_job``/``slurm_job_id`` (``unknown`` outside Slurm), ``nranks``, ``n_nodes``,
  ``gpu_device_id`` (``GPU<n>``: the pod's n-th CUDA device, its n-th GPU by index), ``collective``,
  ``coll_sn``, ``timestamp``, ``message_size``;
* :data:`INFINIBAND_PATH`: node-exporter's infiniband collector for one node (8 ports, ``mlx5_0``–``mlx5_7``);
* :meth:`TrainingModel.history`: OpenMetrics text with timestamps of all of these over a window, for
  ``promtool tsdb create-blocks-from openmetrics``; :meth:`TrainingModel.frames`: the same as the frames of
  ``gpucert explain`` (``gpucert/explain/_frames.py``), without Prometheus in between.

The history's DCGM series carry the labels gpucert reads (``gpu``, ``UUID``, the host label, and ``pod``,
``namespace``, ``container`` while held), not the exporter's descriptive ones: a 64-node, 6-hour backfill is
large enough already. Its NCCL Inspector series are as node-exporter's textfile collector serves the dumps
(``instance="<node>:9100"``, ``job="node-exporter"``) to a scrape that drops ``coll_sn`` and ``timestamp``
(``metric_relabel_configs: labeldrop``, as ``gpucert explain``'s documentation advises): each dump would
otherwise be a series of its own. Static series (XID, DBE, PCIe replays, power violation) come from the fleet model's
values of that GPU, counted from the job's start.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pandas as pd
from aiohttp import web

from gpucert.errors import InputError

from ._objects import JOBS, NODES, PODS, controller_ref, node_ready, set_condition
from ._store import Store
from .fleet import Fleet

__all__ = [
    "COLLECTIVE_EVERY",
    "INFINIBAND_PATH",
    "MAX_STEPS",
    "STEP_SECONDS_ANNOTATION",
    "TRAINING_ANNOTATION",
    "TRAINING_FAULT_KINDS",
    "TRAINING_METRICS_PATH",
    "TRAINING_SECONDS_ANNOTATION",
    "TRAINING_START_ANNOTATION",
    "GpuNow",
    "TrainingFault",
    "TrainingModel",
    "TrainingTick",
    "parse_training_fault",
    "routes",
]

TRAINING_ANNOTATION = "sim.gpucert.io/training"
TRAINING_START_ANNOTATION = "sim.gpucert.io/training-start"
STEP_SECONDS_ANNOTATION = "sim.gpucert.io/step-seconds"
TRAINING_SECONDS_ANNOTATION = "sim.gpucert.io/training-seconds"
#: The job's own exporter (step gauge, NCCL Inspector): ``{namespace}`` and ``{job}`` (the Job's name).
TRAINING_METRICS_PATH = "/training/{namespace}/{job}/metrics"
#: node-exporter's infiniband collector on one node.
INFINIBAND_PATH = "/node-exporter/{node}/metrics"
TRAINING_FAULT_KINDS = ("gpu_throttle", "nic_half_rate", "evict", "slow_input")
#: A job's history holds at most this many steps (its start that far back at its step time).
MAX_STEPS = 500_000
#: Every this many steps a pod logs one collective line per GPU.
COLLECTIVE_EVERY = 50

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

_INF = math.inf
_COMPUTE_SHARE = 0.7  # of a healthy step; the rest is the collective
_IDLE_CLOCK_MHZ = 345.0
_IDLE_POWER_W = 75.0
_IDLE_TEMP_C = 34.0
_BUSY_POWER_SHARE = 0.9  # of the power limit at full engine activity
_ENGINE_HEALTHY = 0.905  # engine activity of a healthy step (the temperature model's reference)
_NVLINK_BPS = 150e9  # bytes/s per GPU over NVLink in a healthy step; PCIe: data in, RDMA out
_PCIE_TX_BPS = 18e9
_PCIE_RX_BPS = 22e9
_BUSBW_GBPS = 360.0  # the job's AllReduce bus bandwidth when healthy
_IB_DEVICES = tuple(f"mlx5_{i}" for i in range(8))
_IB_RATE = 50e9  # 400 Gb/s in bytes per second, as node-exporter reports the link rate
_FLAP_SYMBOLS_PER_S = 40 / 60
_FLAP_RCV_ERRORS_PER_S = 6 / 60
_FLAP_DOWN_EVERY_S = 600.0
_NOISE_S = 15.0  # gauge noise holds for this long (a lattice of unix time)
_STEP_NOISE = 0.01
_LOG_REFRESH_S = 2.0  # a running training pod's log gains its new steps this often
_STEPS_AHEAD_S = 600.0  # steps are computed this far past what was asked, for the next asks
_DEFAULT_CLOCK_MHZ = 1980.0
_CLOCK_FRAC = ("clock_frac", 0.5)
_FACTOR = ("factor", 1.6)
_GAP = ("gap_minutes", 5.0)
_FLAPPING = ("flapping", 0.0)
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_EVICTION_MESSAGE = (
    "The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. "
    "Container {container} was using 1702Gi, request is 0, has larger consumption of memory."
)


# --- faults ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingFault:
    """One fault of a training job (the fault document's ``training:`` entries; see the module docstring).

    ``minute`` is ``from_minute`` (``at_minute`` for ``evict``) after the job's start."""

    kind: str
    job: str
    minute: float
    node: str | None = None
    gpu: int | None = None
    device: str | None = None
    until_minute: float | None = None
    params: tuple[tuple[str, float], ...] = ()

    def param(self, name: str, default: float) -> float:
        return dict(self.params).get(name, default)

    @property
    def namespace(self) -> str:
        return self.job.split("/", 1)[0]

    def to_mapping(self) -> dict[str, Any]:
        """The fault as a document entry (what ``GET /gpucert/inject`` shows)."""
        out: dict[str, Any] = {"kind": self.kind, "job": self.job}
        for key, value in (("node", self.node), ("gpu", self.gpu), ("device", self.device)):
            if value is not None:
                out[key] = value
        out["at_minute" if self.kind == "evict" else "from_minute"] = self.minute
        if self.until_minute is not None:
            out["until_minute"] = self.until_minute
        if self.params:
            out["params"] = {k: (bool(v) if k == _FLAPPING[0] else v) for k, v in self.params}
        return out


#: kind → (required keys, optional keys, params with (low, high, low inclusive))
_KINDS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...], Mapping[str, tuple[float, float, bool]]]] = {
    "gpu_throttle": (("node", "gpu", "from_minute"), ("until_minute", "params"), {"clock_frac": (0.0, 1.0, False)}),
    "nic_half_rate": (("node", "from_minute"), ("device", "until_minute", "params"), {"flapping": (0.0, 1.0, True)}),
    "evict": (("node", "at_minute"), ("params",), {"gap_minutes": (0.0, 24 * 60.0, True)}),
    "slow_input": (("from_minute",), ("until_minute", "params"), {"factor": (1.0, 100.0, True)}),
}


def _number(entry: Mapping[str, Any], key: str, where: str) -> float:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise InputError(f"{where}: {key!r} must be a number of minutes >= 0, got {value!r}")
    return float(value)


def parse_training_fault(raw: Any, where: str) -> TrainingFault:
    """A :class:`TrainingFault` from one decoded ``training:`` entry; an :class:`InputError` naming ``where``
    (``--faults f.yaml: training[2]``) and the key at fault otherwise."""
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: expected a mapping, got {type(raw).__name__}")
    kind = raw.get("kind")
    if not isinstance(kind, str) or kind not in _KINDS:
        raise InputError(f"{where}: unknown training fault kind {kind!r}; known: {list(TRAINING_FAULT_KINDS)}")
    required, optional, allowed = _KINDS[kind]
    known = ("kind", "job", *required, *optional)
    unknown = sorted(set(map(str, raw)) - set(known))
    if unknown:
        raise InputError(f"{where}: unknown keys {unknown} for {kind}; known: {list(known)}")
    missing = [k for k in ("job", *required) if k not in raw]
    if missing:
        raise InputError(f"{where}: {kind} needs {missing[0]!r}")
    job = raw.get("job")
    parts = job.split("/") if isinstance(job, str) else []
    if len(parts) != 2 or not all(_NAME.match(p) for p in parts):
        raise InputError(f"{where}: 'job' must be NAMESPACE/NAME, got {job!r}")
    node = raw.get("node")
    if "node" in required and (not isinstance(node, str) or not node):
        raise InputError(f"{where}: 'node' must be a node name, got {node!r}")
    gpu = raw.get("gpu")
    if "gpu" in required and (isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0):
        raise InputError(f"{where}: 'gpu' must be a GPU index (an integer >= 0), got {gpu!r}")
    device = raw.get("device")
    if device is not None and (not isinstance(device, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", device)):
        raise InputError(f"{where}: 'device' must be an RDMA device name such as 'mlx5_0', got {device!r}")
    minute = _number(raw, "at_minute" if kind == "evict" else "from_minute", where)
    until = _number(raw, "until_minute", where) if raw.get("until_minute") is not None else None
    if until is not None and until <= minute:
        raise InputError(f"{where}: 'until_minute' ({until:g}) must come after 'from_minute' ({minute:g})")
    params_raw = raw.get("params") or {}
    if not isinstance(params_raw, Mapping):
        raise InputError(f"{where}.params: expected a mapping, got {type(params_raw).__name__}")
    params: list[tuple[str, float]] = []
    for name, given in params_raw.items():
        if name not in allowed:
            raise InputError(f"{where}.params: unknown parameter {name!r} for {kind}; known: {list(allowed)}")
        value = float(given) if name == _FLAPPING[0] and isinstance(given, bool) else given
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise InputError(f"{where}.params.{name}: must be a number, got {value!r}")
        low, high, inclusive = allowed[name]
        if not (low <= value <= high if inclusive else low < value < high):
            span = f"[{low:g}, {high:g}]" if inclusive else f"({low:g}, {high:g})"
            raise InputError(f"{where}.params.{name}: must be within {span}, got {value!r}")
        params.append((str(name), float(value)))
    return TrainingFault(
        kind=kind,
        job=str(job),
        minute=minute,
        node=node if isinstance(node, str) else None,
        gpu=gpu if isinstance(gpu, int) and not isinstance(gpu, bool) else None,
        device=device if kind == "nic_half_rate" else None,
        until_minute=until,
        params=tuple(sorted(params)),
    )


# --- the spec of a job and where its pods ran ---------------------------------------------------------------


class GpuReading(Protocol):
    """What the DCGM exporters know of one GPU from the fleet model (``_dcgm._Gpu``)."""

    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> str: ...
    @property
    def faulted(self) -> dict[str, float]: ...
    @property
    def healthy_xids(self) -> tuple[int, ...]: ...
    @property
    def fault_xids(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class _Spec:
    key: str
    namespace: str
    name: str
    start: float
    step_s: float
    end: float  # +inf: trains until deleted
    owner_uid: str | None
    comm: str


@dataclass
class _Inc:
    """One pod of the job: where it ran, from when it held its GPUs and from when it took steps."""

    uid: str
    namespace: str
    pod: str
    node: str
    gpus: tuple[int, ...]
    container: str
    hold: float
    active: float
    replaces: str | None = None
    gone: float | None = None
    #: Once its eviction was carried out: the uids of the job's pods that existed then (not its replacement).
    evicted_among: frozenset[str] | None = None
    log: str = ""
    logged_until: float = -_INF
    log_signature: bytes = b""
    closed: bool = False


@dataclass
class _Job:
    spec: _Spec
    incs: list[_Inc] = field(default_factory=list)
    version: int = 0
    timeline: tuple[int, _Timeline] | None = None  # (version, timeline)
    steps: tuple[int, float, Floats, Ints, Floats] | None = None  # version, horizon, ends, index, durations


def _rfc3339(t: float, *, micro: bool = False) -> str:
    stamp = datetime.fromtimestamp(t, UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if micro else stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(raw: str, where: str) -> float:
    try:
        stamp = datetime.fromisoformat(raw.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InputError(f"{where}: {raw!r} is not an RFC 3339 time") from None
    if stamp.tzinfo is None:
        raise InputError(f"{where}: {raw!r} has no time zone (write e.g. 2026-11-01T02:00:00Z)")
    return stamp.timestamp()


def _annotation_seconds(notes: Mapping[str, Any], name: str, low: float, high: float) -> float | None:
    raw = notes.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise InputError(f"annotation {name}: {raw!r} is not a number of seconds") from None
    if not low <= value <= high:
        raise InputError(f"annotation {name}: {value:g} s is outside [{low:g}, {high:g}]")
    return value


def _job_of(pod: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """(namespace, job name, owning Job's uid) of a training pod."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    ref = controller_ref(pod)
    if ref is not None and ref.get("kind") == "Job":
        return namespace, str(ref.get("name")), str(ref.get("uid") or "") or None
    labels = meta.get("labels") or {}
    name = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name") or meta.get("name")
    return namespace, str(name), None


def _hash64(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "big")


# --- deterministic noise -----------------------------------------------------------------------------------

_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finaliser: a counter-based hash, so noise is a function of (key, counter) alone."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _normal(keys: npt.NDArray[np.uint64], counters: npt.NDArray[np.int64]) -> Floats:
    """Standard normal draws, one per (key, counter) broadcast pair (Box-Muller on two hashes)."""
    base = keys ^ (counters.astype(np.uint64) * _GOLD)
    a, b = _mix(base), _mix(base ^ _GOLD)
    u1 = ((a >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
    u2 = (b >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


# --- the timeline: a job's state, constant between breakpoints ----------------------------------------------


@dataclass(frozen=True)
class _Column:
    node: str
    gpu: int
    uuid: str
    key: int  # noise key
    limit_w: float
    busy_temp_c: float
    slowdown_c: float
    xid: int
    dbe: float
    replays_per_s: float
    power_capped: bool


@dataclass(frozen=True)
class _Timeline:
    """Per segment (between consecutive ``cuts``; segment 0 is before the first cut) the job's state."""

    spec: _Spec
    incs: tuple[_Inc, ...]
    ends: Floats  # per incarnation: when it stopped holding its GPUs
    evicted: Mapping[int, float]  # incarnation index → when it was evicted
    gaps: Mapping[int, float]  # incarnation index → seconds its replacement waits after the eviction
    columns: tuple[_Column, ...]
    col_index: Mapping[tuple[str, int], int]
    cuts: Floats  # (S-1,)
    progress: Bools  # (S,)
    step_mean: Floats  # (S,)
    holder: Ints  # (S, G) incarnation index, -1: not held by the job
    act: Bools  # (S, G) training in this segment
    frac: Floats  # (S, G) clock fraction
    util: Floats
    engine: Floats
    power: Floats
    temp: Floats
    rates: Mapping[str, Floats]  # counter → (S, G) per second
    cums: Mapping[str, Floats]  # counter → (S, G) at each segment's start
    exec_us: Floats  # (S, G), NaN where not training
    busbw: Floats
    max_clock: float
    #: Changes exactly when the job's steps do (a fault, an eviction, a replacement): logs are printed again.
    signature: bytes

    @property
    def seg_lo(self) -> Floats:
        return np.concatenate([[-_INF], self.cuts])

    @property
    def seg_hi(self) -> Floats:
        return np.concatenate([self.cuts, [_INF]])

    def segment(self, times: Floats) -> Ints:
        return np.searchsorted(self.cuts, times, side="right").astype(np.int64)

    def inc_end(self, i: int) -> float:
        return float(self.ends[i])


def _active(fault: TrainingFault, start: float, t: float) -> bool:
    lo = start + 60.0 * fault.minute
    hi = start + 60.0 * fault.until_minute if fault.until_minute is not None else _INF
    return lo <= t < hi


def _build_timeline(
    spec: _Spec,
    incs: Sequence[_Inc],
    faults: Sequence[TrainingFault],
    readings: Callable[[str], Sequence[GpuReading]],
    model: str,
    seed: int,
) -> _Timeline:
    start, end = spec.start, spec.end
    evicts = sorted((spec.start + 60.0 * f.minute, f) for f in faults if f.kind == "evict")
    # Evictions in registration order: each pod is evicted by the first evict of its node at or after it
    # began to train (a replacement began after the eviction it replaces, so that one does not hit it again).
    evicted: dict[int, float] = {}
    gaps: dict[int, float] = {}
    ends = np.empty(len(incs))
    for i, inc in enumerate(incs):
        limit = min(inc.gone if inc.gone is not None else _INF, end)
        hit = next(((t, f) for t, f in evicts if f.node == inc.node and inc.active <= t < limit), None)
        ends[i] = limit
        if hit is not None:
            evicted[i], gaps[i] = hit[0], 60.0 * hit[1].param(*_GAP)
            ends[i] = min(limit, hit[0])
    successor = {inc.replaces: i for i, inc in enumerate(incs) if inc.replaces is not None}
    stalls = []
    for i, t in evicted.items():
        j = successor.get(incs[i].uid)
        stalls.append((t, incs[j].active if j is not None else _INF))

    cuts_set = {start, end}
    for i, inc in enumerate(incs):
        cuts_set.update((inc.hold, inc.active, float(ends[i])))
    for f in faults:
        cuts_set.add(start + 60.0 * f.minute)
        if f.until_minute is not None:
            cuts_set.add(start + 60.0 * f.until_minute)
    for lo, hi in stalls:
        cuts_set.update((lo, hi))
    cuts = np.array(sorted(t for t in cuts_set if math.isfinite(t)), dtype=np.float64)
    reps = np.concatenate([[cuts[0] - 1.0], cuts]) if len(cuts) else np.array([start - 1.0])
    n_seg = len(reps)

    nodes = sorted({inc.node for inc in incs})
    columns: list[_Column] = []
    for node in nodes:
        for r in readings(node):
            tele = r.faulted
            xids = r.healthy_xids + r.fault_xids
            columns.append(
                _Column(
                    node=node,
                    gpu=r.index,
                    uuid=r.uuid,
                    key=_hash64(seed, "train", r.uuid),
                    limit_w=float(tele["power_limit_w"]),
                    busy_temp_c=float(tele["temp_max_c"]),
                    slowdown_c=float(tele["temp_slowdown_c"]),
                    xid=xids[-1] if xids else 0,
                    dbe=float(tele["ecc_dbe_volatile"]),
                    replays_per_s=float(tele["pcie_replays_per_min"]) / 60.0,
                    power_capped=float(tele["power_limit_w"]) < float(tele["power_limit_default_w"]),
                )
            )
    col_index = {(c.node, c.gpu): g for g, c in enumerate(columns)}
    n_col = len(columns)
    max_clock = _max_clock(model)

    holder = np.full((n_seg, n_col), -1, dtype=np.int64)
    act = np.zeros((n_seg, n_col), dtype=bool)
    frac = np.ones((n_seg, n_col))
    progress = np.zeros(n_seg, dtype=bool)
    nic_slow = np.ones(n_seg)
    input_factor = np.ones(n_seg)
    job_faults = [f for f in faults if f.kind != "evict"]
    for s, t in enumerate(reps):
        stalled = any(lo <= t < hi for lo, hi in stalls)
        training = [i for i, inc in enumerate(incs) if inc.active <= t < ends[i]]
        progress[s] = start <= t < end and not stalled and bool(training)
        for i, inc in enumerate(incs):  # later pods on a node win: they hold it after the earlier ones
            if inc.hold <= t < ends[i]:
                for gpu in inc.gpus:
                    g = col_index.get((inc.node, gpu))
                    if g is not None:
                        holder[s, g] = i
                        act[s, g] = bool(progress[s]) and i in training
        active_nodes = {columns[g].node for g in np.flatnonzero(act[s])}
        for f in job_faults:
            if not _active(f, start, float(t)):
                continue
            if f.kind == "gpu_throttle":
                g = col_index.get((str(f.node), int(f.gpu or 0)))
                if g is not None and act[s, g]:
                    frac[s, g] = min(frac[s, g], f.param(*_CLOCK_FRAC))
            elif f.kind == "nic_half_rate" and f.node in active_nodes:
                nic_slow[s] = 2.0
            elif f.kind == "slow_input":
                input_factor[s] = max(input_factor[s], f.param(*_FACTOR))

    compute_h = _COMPUTE_SHARE * spec.step_s
    comm_h = (1.0 - _COMPUTE_SHARE) * spec.step_s
    compute = np.where(act, compute_h / frac, 0.0)
    max_compute = np.where(act.any(axis=1), compute.max(axis=1, initial=0.0), compute_h)
    bound = max_compute + comm_h * nic_slow
    step_mean = np.where(progress, np.maximum(bound, spec.step_s * input_factor), np.nan)
    wait = np.where(progress, step_mean - bound, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        coll = step_mean[:, None] - compute - wait[:, None]
        util = np.where(act, 100.0 * (0.98 * compute + 0.90 * coll + 0.02 * wait[:, None]) / step_mean[:, None], 0.0)
        engine = np.where(act, (0.95 * compute + 0.80 * coll) / step_mean[:, None], 0.0)
        limit_w = np.array([c.limit_w for c in columns]) if columns else np.zeros(0)
        power = np.where(
            act, _IDLE_POWER_W + (_BUSY_POWER_SHARE * limit_w - _IDLE_POWER_W) * engine * frac**0.7, _IDLE_POWER_W
        )
        busy_t = np.array([c.busy_temp_c for c in columns]) if columns else np.zeros(0)
        slow_t = np.array([c.slowdown_c for c in columns]) if columns else np.zeros(0)
        temp = _IDLE_TEMP_C + (busy_t - _IDLE_TEMP_C) * np.clip(engine / _ENGINE_HEALTHY * frac**0.7, 0.0, 1.1)
        temp = np.where(act & (frac < 1.0), slow_t + 2.0, np.minimum(temp, slow_t - 1.0))
        speed = np.where(act, spec.step_s / step_mean[:, None], 0.0)
        exec_s = np.where(act, comm_h * nic_slow[:, None] + (max_compute[:, None] - compute), np.nan)
        busbw = _BUSBW_GBPS * comm_h / exec_s
    rates = {
        "nvlink": _NVLINK_BPS * speed,
        "pcie_tx": _PCIE_TX_BPS * speed,
        "pcie_rx": _PCIE_RX_BPS * speed,
        "thermal": np.where(act & (frac < 1.0), 1e9, 0.0),
    }
    # Counters at each segment's start: the integral of their rate over the segments before (the first,
    # before anything began, and the last, open-ended, add nothing before any segment).
    seg_len = np.zeros(n_seg)
    if n_seg > 2:
        seg_len[1:-1] = np.diff(cuts)
    cums = {
        name: np.concatenate([np.zeros((1, n_col)), np.cumsum((r * seg_len[:, None])[:-1], axis=0)])
        for name, r in rates.items()
    }
    return _Timeline(
        spec=spec,
        incs=tuple(incs),
        ends=ends,
        evicted=evicted,
        gaps=gaps,
        columns=tuple(columns),
        col_index=col_index,
        cuts=cuts,
        progress=progress,
        step_mean=step_mean,
        holder=holder,
        act=act,
        frac=frac,
        util=util,
        engine=engine,
        power=power,
        temp=temp,
        rates=rates,
        cums=cums,
        exec_us=exec_s * 1e6,
        busbw=busbw,
        max_clock=max_clock,
        # Not the columns: a pod joining on another node changes no step (and must not reprint every log).
        signature=hashlib.sha256(cuts.tobytes() + progress.tobytes() + np.nan_to_num(step_mean).tobytes()).digest(),
    )


def _max_clock(model: str) -> float:
    from ._dcgm import _CLOCKS

    return float(_CLOCKS.get(model, (_DEFAULT_CLOCK_MHZ, 0))[0])


# --- sampling the timeline ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sample:
    """The job's state at instants ``times`` (T,) for columns ``cols`` (G,): every array (T, G)."""

    times: Floats
    cols: Ints
    holder: Ints
    act: Bools
    values: Mapping[str, Floats]  # DCGM series name → values as printed


def _sample(tl: _Timeline, times: Floats, cols: Ints | None = None) -> _Sample:
    if cols is None:
        cols = np.arange(len(tl.columns), dtype=np.int64)
    seg = tl.segment(times)
    pick = np.ix_(seg, cols)
    holder, act, frac = tl.holder[pick], tl.act[pick], tl.frac[pick]
    keys = np.array([tl.columns[g].key for g in cols], dtype=np.uint64)
    bucket = np.floor(times / _NOISE_S).astype(np.int64)[:, None]

    def noise(signal: int) -> Floats:
        return _normal(keys[None, :] ^ np.uint64(signal), bucket)

    util = np.where(act, np.clip(np.rint(tl.util[pick] + 0.7 * noise(1)), 0, 100), 0.0)
    engine = np.where(act, np.clip(np.round(tl.engine[pick] + 0.006 * noise(2), 3), 0, 1), 0.0)
    power = np.round(tl.power[pick] * (1.0 + 0.012 * noise(3)), 1)
    temp = np.rint(tl.temp[pick] + 0.6 * noise(4))
    clock = np.where(act, np.rint(tl.max_clock * frac), _IDLE_CLOCK_MHZ)
    bits = np.where(act, np.where(frac < 1.0, 0x48, 0), 0x01).astype(np.float64)
    lo = tl.seg_lo[seg][:, None]
    since = np.maximum(0.0, times - tl.spec.start)[:, None]

    def counter(name: str) -> Floats:
        elapsed = np.where(np.isfinite(lo), times[:, None] - lo, 0.0)
        return np.floor(tl.cums[name][pick] + tl.rates[name][pick] * elapsed)

    def gauge(name: str) -> Floats:  # a rate the exporter reports as it is (DCGM_FI_PROF_*: bytes per second)
        return np.where(np.isfinite(lo), np.rint(tl.rates[name][pick]), 0.0)

    cols_list = [tl.columns[g] for g in cols]
    replays = np.array([c.replays_per_s for c in cols_list])
    capped = np.array([c.power_capped for c in cols_list], dtype=np.float64)
    values = {
        "DCGM_FI_DEV_SM_CLOCK": clock,
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": bits,
        "DCGM_FI_DEV_POWER_USAGE": power,
        "DCGM_FI_DEV_GPU_TEMP": temp,
        "DCGM_FI_DEV_GPU_UTIL": util,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": engine,
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": counter("nvlink"),
        "DCGM_FI_PROF_PCIE_TX_BYTES": gauge("pcie_tx"),
        "DCGM_FI_PROF_PCIE_RX_BYTES": gauge("pcie_rx"),
        "DCGM_FI_DEV_XID_ERRORS": np.broadcast_to(np.array([float(c.xid) for c in cols_list]), clock.shape),
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": np.broadcast_to(np.array([c.dbe for c in cols_list]), clock.shape),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": np.floor(replays[None, :] * since),
        "DCGM_FI_DEV_THERMAL_VIOLATION": counter("thermal"),
        "DCGM_FI_DEV_POWER_VIOLATION": np.floor(0.5e9 * capped[None, :] * since),
    }
    return _Sample(times=times, cols=cols, holder=holder, act=act, values=values)


def _nccl(tl: _Timeline, sample: _Sample) -> tuple[Floats, Floats]:
    """NCCL Inspector's (bus bandwidth GB/s, exec time µs) of the sampled GPUs; NaN where not training."""
    seg = tl.segment(sample.times)
    pick = np.ix_(seg, sample.cols)
    keys = np.array([tl.columns[g].key for g in sample.cols], dtype=np.uint64)
    bucket = np.floor(sample.times / _NOISE_S).astype(np.int64)[:, None]
    jitter = 1.0 + 0.015 * _normal(keys[None, :] ^ np.uint64(7), bucket)
    exec_us = np.rint(tl.exec_us[pick] * jitter)
    busbw = np.round(tl.busbw[pick] / jitter, 2)
    return np.where(sample.act, busbw, np.nan), np.where(sample.act, exec_us, np.nan)


# --- steps ------------------------------------------------------------------------------------------------


def _compute_steps(tl: _Timeline, horizon: float, key: int) -> tuple[Floats, Ints, Floats]:
    """(end time, index, duration) of every step the job finished by ``horizon``.

    A step that a change of state interrupts keeps the time it began with (it finishes in the next
    segment), unless training stops there (an eviction): then it is lost."""
    ends: list[Floats] = []
    durations: list[Floats] = []
    count = 0
    cursor: float | None = None
    lo_all, hi_all = tl.seg_lo, tl.seg_hi
    seed = np.array([key], dtype=np.uint64)
    for s in range(len(tl.progress)):
        if not tl.progress[s]:
            cursor = None
            continue
        lo, hi = float(lo_all[s]), float(hi_all[s])
        if lo >= horizon:
            break
        at = lo if cursor is None or cursor < lo else cursor
        stop = min(hi, horizon)
        stops_after = hi <= horizon and not (s + 1 < len(tl.progress) and tl.progress[s + 1])
        mean = float(tl.step_mean[s])
        while at < stop:
            n = min(int((stop - at) / mean * 1.05) + 16, MAX_STEPS + 16)
            index = np.arange(count, count + n, dtype=np.int64)
            d = np.round(mean * np.clip(1.0 + _STEP_NOISE * _normal(seed, index), 0.5, 1.5), 4)
            e = at + np.cumsum(d)
            keep = e <= hi if stops_after else (e - d) < stop
            kept = int(np.count_nonzero(keep)) if keep.all() else int(np.argmin(keep))
            if kept:
                ends.append(e[:kept])
                durations.append(d[:kept])
                count += kept
                at = float(e[kept - 1])
            if kept < n:
                break
            if count > MAX_STEPS * 4:
                break
        cursor = at
    if not ends:
        return np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0)
    end_arr = np.concatenate(ends)
    return end_arr, np.arange(1, len(end_arr) + 1, dtype=np.int64), np.concatenate(durations)


# --- rendering OpenMetrics fast ---------------------------------------------------------------------------


_POW10 = 10 ** np.arange(19, dtype=np.int64)


def _digits(scaled: Ints, width: int) -> npt.NDArray[np.uint8]:
    out = np.empty((scaled.shape[0], width), dtype=np.uint8)
    rest = scaled.copy()
    for j in range(width - 1, -1, -1):
        out[:, j] = rest % 10
        rest //= 10
    out += 48
    return out


def _numbers(values: Floats, decimals: int) -> tuple[npt.NDArray[np.uint8], Bools]:
    """The numbers as fixed-width ASCII and the mask of the characters to print: no leading zeros, no
    trailing fraction zeros (nor a bare point), at most ``decimals`` decimals. Values must be >= 0."""
    scaled = np.rint(np.maximum(values, 0.0) * 10.0**decimals).astype(np.int64)
    width = max(len(str(int(scaled.max()))) if scaled.size else 1, decimals + 1)
    digits = _digits(scaled, width)
    # How many digits each number has (at least one before the point), and its fraction's trailing zeros.
    shown = np.maximum(np.searchsorted(_POW10, scaled, side="right"), decimals + 1)
    whole = width - decimals
    lead = np.arange(whole)[None, :] >= (width - shown)[:, None]
    if not decimals:
        return digits, lead
    fraction = scaled % (10**decimals)
    zeros = np.zeros(len(scaled), dtype=np.int64)
    for k in range(1, decimals + 1):
        zeros += fraction % (10**k) == 0
    buf = np.empty((digits.shape[0], width + 1), dtype=np.uint8)
    buf[:, :whole] = digits[:, :whole]
    buf[:, whole] = 46
    buf[:, whole + 1 :] = digits[:, whole:]
    keep = np.empty(buf.shape, dtype=bool)
    keep[:, :whole] = lead
    keep[:, whole] = zeros < decimals
    keep[:, whole + 1 :] = np.arange(decimals)[None, :] < (decimals - zeros)[:, None]
    return buf, keep


def _render(
    prefixes: Sequence[str], values: Floats, stamps: npt.NDArray[np.uint8], mask: Bools, decimals: int
) -> list[bytes]:
    """OpenMetrics sample lines, one bytes block per row r: ``prefixes[r] value timestamp`` at the masked
    instants (``stamps``: one `` <timestamp>\\n`` per instant, fixed width).

    The numbers and timestamps are built as one ASCII array, then each row's block gets its prefix by a
    bytes replace of a marker: ~10x faster than formatting line by line."""
    counts = mask.sum(axis=1)
    if not counts.any():
        return []
    rows_t = np.nonzero(mask)[1]
    number, keep_number = _numbers(values[mask], decimals)
    width_n = number.shape[1]
    buf = np.empty((number.shape[0], 1 + width_n + stamps.shape[1]), dtype=np.uint8)
    buf[:, 0] = 1  # the marker the prefix replaces
    buf[:, 1 : 1 + width_n] = number
    buf[:, 1 + width_n :] = stamps[rows_t]
    keep = np.ones(buf.shape, dtype=bool)
    keep[:, 1 : 1 + width_n] = keep_number
    flat = buf[keep].tobytes()
    line_ends = np.cumsum(keep.sum(axis=1))
    row_ends = line_ends[np.cumsum(counts) - 1]
    row_starts = np.concatenate([[0], row_ends[:-1]])
    return [
        flat[a:b].replace(b"\x01", prefix.encode() + b" ")
        for prefix, a, b, n in zip(prefixes, row_starts.tolist(), row_ends.tolist(), counts.tolist(), strict=True)
        if n
    ]


def _stamps(times: Floats) -> npt.NDArray[np.uint8]:
    """`` <timestamp>\\n`` per instant as a fixed-width ASCII array: unix seconds, with milliseconds when the
    instants are not whole seconds (zero-padded to one width, which a window of this era never needs)."""
    whole = bool(np.all(times == np.round(times)))
    text = [f"{t:.0f}" if whole else f"{t:.3f}" for t in times.tolist()]
    width = max(map(len, text))
    joined = "".join(f" {t:0>{width}}\n" for t in text).encode()
    return np.frombuffer(joined, dtype=np.uint8).reshape(len(text), width + 2)


def _labels(pairs: Sequence[tuple[str, object]]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in pairs)


#: NCCL Inspector's ``message_size`` of the job's AllReduce (its human-readable form).
_MESSAGE_SIZE = "256.00MB"


def _inspector_labels(tl: _Timeline, g: int, h: int) -> list[tuple[str, object]]:
    """NCCL Inspector's static labels (``inspectorPromCacheStaticLabels``) and ``collective`` for GPU column
    ``g`` held by incarnation ``h``: ranks are numbered pod by pod in the order the job's first pods were made,
    GPU by GPU within a pod; a replacement takes the ranks of the pod it replaces."""
    firsts = [i for i, inc in enumerate(tl.incs) if inc.replaces is None]
    by_uid = {inc.uid: i for i, inc in enumerate(tl.incs)}
    first = h
    while tl.incs[first].replaces is not None and tl.incs[first].replaces in by_uid:
        first = by_uid[tl.incs[first].replaces]  # type: ignore[index]
    inc = tl.incs[h]
    devices = sorted(inc.gpus)
    local = devices.index(tl.columns[g].gpu)
    base = sum(len(tl.incs[i].gpus) for i in firsts[: firsts.index(first)]) if first in firsts else 0
    return [
        ("comm_id", tl.spec.comm),
        ("hostname", inc.pod),
        ("rank", base + local),
        ("slurm_job", "unknown"),
        ("slurm_job_id", "unknown"),
        ("nranks", sum(len(tl.incs[i].gpus) for i in firsts)),
        ("n_nodes", len({tl.incs[i].node for i in firsts})),
        ("gpu_device_id", f"GPU{local}"),
        ("collective", "AllReduce"),
    ]


def _family(
    name: str,
    kind: str,
    prefixes: Sequence[str],
    values: Floats,
    stamps: npt.NDArray[np.uint8],
    mask: Bools,
    decimals: int,
) -> Iterator[bytes]:
    """One OpenMetrics family: its ``# TYPE`` line (a counter's without ``_total``) and its rows' samples;
    nothing when no sample is masked in."""
    body = _render(prefixes, values, stamps, mask, decimals)
    if body:
        family = name.removesuffix("_total") if kind == "counter" else name
        yield f"# TYPE {family} {kind}\n".encode()
        yield from body


def _categorical(codes: Ints, names: Sequence[str]) -> pd.Categorical[str]:
    """A categorical of ``names`` from codes made in range here (pandas' check of every code skipped)."""
    return pd.Categorical.from_codes(codes, categories=pd.Index(list(names)), validate=False)


# --- the model --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuNow:
    """What one GPU's DCGM exporter shows now while a training pod holds it: extra labels and values."""

    labels: str  # ',pod="…",namespace="…",container="…"'
    values: Mapping[str, float | int]


@dataclass(frozen=True)
class TrainingTick:
    """What the kubelet does for a training pod now (``_kubelet.py``): all optional."""

    status: dict[str, Any] | None = None  # the pod's new status
    log: str | None = None  # the pod's whole log
    events: tuple[dict[str, Any], ...] = ()  # Events to create (either API: one store serves both)
    wake_s: float | None = None  # look at the pod again in this many seconds


#: DCGM series of the history → (decimals printed, the series the live exporter overrides with it).
_DCGM_SERIES: tuple[tuple[str, int], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", 0),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0),
    ("DCGM_FI_DEV_POWER_USAGE", 1),
    ("DCGM_FI_DEV_GPU_TEMP", 0),
    ("DCGM_FI_DEV_GPU_UTIL", 0),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 3),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", 0),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", 0),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", 0),
    ("DCGM_FI_DEV_XID_ERRORS", 0),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 0),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", 0),
    ("DCGM_FI_DEV_POWER_VIOLATION", 0),
)
#: The series a live exporter takes from the model for a GPU a training pod holds (the rest stay the fleet's).
LIVE_SERIES = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
)
_INTEGER_SERIES = frozenset(n for n, d in _DCGM_SERIES if d == 0)
_IB_SERIES = (
    ("node_infiniband_rate_bytes_per_second", "gauge", "Maximum signal transfer rate"),
    (
        "node_infiniband_symbol_error_total",
        "counter",
        "Number of minor link errors detected on one or more physical lanes.",
    ),
    (
        "node_infiniband_link_downed_total",
        "counter",
        "Number of times the link failed to recover from an error state and went down",
    ),
    (
        "node_infiniband_port_errors_received_total",
        "counter",
        "Number of packets containing an error that were received on this port",
    ),
)


class TrainingModel:
    """The training jobs of one simulated cluster: their specs, pods, faults, and every signal they give.

    ``readings(node)`` gives the fleet model's view of a node's GPUs (the DCGM exporters' waves); ``clock``
    is wall time in unix seconds (a test may pin it)."""

    def __init__(
        self,
        store: Store,
        fleet: Callable[[], Fleet],
        readings: Callable[[str], Sequence[GpuReading]],
        *,
        seed: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._fleet = fleet
        self._readings = readings
        self._seed = seed
        self._clock = clock
        self._lock = threading.RLock()
        self._faults: list[TrainingFault] = []
        self._jobs: dict[str, _Job] = {}
        self._by_uid: dict[str, tuple[str, int]] = {}
        #: Called when faults change, so that the kubelet looks at the training pods again.
        self.on_change: Callable[[], None] | None = None

    # --- faults -------------------------------------------------------------------------------------

    def check(self, fault: TrainingFault) -> None:
        """An :class:`InputError` unless ``fault`` names a node (and GPU) of the fleet."""
        fleet = self._fleet()
        if fault.node is not None and fault.node not in fleet.node_index:
            raise InputError(f"no node {fault.node!r} in the fleet")
        if fault.gpu is not None and fault.gpu >= fleet.gpus_per_node:
            raise InputError(f"{fault.node} has GPUs 0-{fleet.gpus_per_node - 1}, not {fault.gpu}")

    def inject(self, fault: TrainingFault) -> None:
        """Add ``fault`` (checked first); the job's history follows from now on."""
        self.check(fault)
        with self._lock:
            if fault not in self._faults:
                self._faults.append(fault)
                self._touch(fault.job)
        if self.on_change is not None:
            self.on_change()

    def clear(self, node: str | None = None) -> int:
        """Lift the training faults naming ``node`` (every one when None); returns how many."""
        with self._lock:
            kept = [f for f in self._faults if node is not None and f.node != node]
            lifted = [f for f in self._faults if f not in kept]
            self._faults = kept
            for f in lifted:
                self._touch(f.job)
        if lifted and self.on_change is not None:
            self.on_change()
        return len(lifted)

    def faults(self) -> list[TrainingFault]:
        with self._lock:
            return list(self._faults)

    def _touch(self, key: str) -> None:
        job = self._jobs.get(key)
        if job is not None:
            job.version += 1

    # --- pods ---------------------------------------------------------------------------------------

    @staticmethod
    def is_training(pod: Mapping[str, Any]) -> bool:
        notes = (pod.get("metadata") or {}).get("annotations") or {}
        return str(notes.get(TRAINING_ANNOTATION, "")).lower() == "true"

    def training_pods(self) -> list[tuple[str, str]]:
        """(namespace, name) of every pod registered and still training (for the kubelet to look at)."""
        with self._lock:
            return [
                (i.namespace, i.pod) for j in self._jobs.values() for i in j.incs if i.gone is None and not i.closed
            ]

    def _spec(self, pod: Mapping[str, Any], namespace: str, name: str, owner: str | None, now: float) -> _Spec:
        notes: dict[str, Any] = {}
        job_obj = self.store.get(JOBS, namespace, name) if owner else None
        if job_obj is not None:
            notes.update((job_obj.get("metadata") or {}).get("annotations") or {})
        notes.update((pod.get("metadata") or {}).get("annotations") or {})
        raw_start = notes.get(TRAINING_START_ANNOTATION)
        start = _parse_time(str(raw_start), f"annotation {TRAINING_START_ANNOTATION}") if raw_start else now
        step_s = _annotation_seconds(notes, STEP_SECONDS_ANNOTATION, 0.05, 3600.0) or 1.0
        duration = _annotation_seconds(notes, TRAINING_SECONDS_ANNOTATION, 1.0, 366 * 86400.0)
        if (now - start) / step_s > MAX_STEPS:
            raise InputError(
                f"annotation {TRAINING_START_ANNOTATION}: {raw_start} is {(now - start) / 3600:.1f} h "
                f"ago: more than {MAX_STEPS} steps of {step_s:g} s; start later or raise "
                f"{STEP_SECONDS_ANNOTATION}"
            )
        key = f"{namespace}/{name}"
        return _Spec(
            key=key,
            namespace=namespace,
            name=name,
            start=start,
            step_s=step_s,
            end=start + duration if duration is not None else _INF,
            owner_uid=owner,
            comm=f"0x{_hash64(self._seed, 'comm', key, owner):016x}",
        )

    def _register(self, pod: Mapping[str, Any], node: str, now: float) -> tuple[_Job, _Inc]:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or meta.get("name"))
        where = self._by_uid.get(uid)
        if where is not None:
            known = self._jobs[where[0]]
            return known, known.incs[where[1]]
        namespace, name, owner = _job_of(pod)
        key = f"{namespace}/{name}"
        found = self._jobs.get(key)
        if found is None or (owner is not None and found.spec.owner_uid != owner):
            found = _Job(self._spec(pod, namespace, name, owner, now))
            self._jobs[key] = found
        job = found
        from ._scheduler import gpu_request

        per_node = self._fleet().gpus_per_node
        asked = gpu_request(pod)
        gpus = tuple(range(min(asked, per_node) if asked else per_node))
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        tl = self._timeline(job)
        taken = {j.replaces for j in job.incs if j.replaces}
        # A replacement is a pod made after an eviction was carried out (the Job controller's answer to it);
        # a pod that already existed then is one of the job's first pods, however late it starts.
        orphan = next(
            (
                job.incs[i]
                for i, _ in sorted(tl.evicted.items(), key=lambda kv: kv[1])
                if job.incs[i].uid not in taken and uid not in (job.incs[i].evicted_among or {uid})
            ),
            None,
        )
        if orphan is not None:
            # The replacement the Job controller made: it holds its GPUs from the eviction on and resumes
            # the job's steps after the restart gap (in compressed time both may lie in the past).
            o = job.incs.index(orphan)
            hold, active = tl.evicted[o], tl.evicted[o] + tl.gaps[o]
        else:
            hold, active = min(job.spec.start, now), job.spec.start
        inc = _Inc(
            uid=uid,
            namespace=namespace,
            pod=str(meta.get("name")),
            node=node,
            gpus=gpus,
            container=str(containers[0].get("name") or "main"),
            hold=hold,
            active=active,
            replaces=orphan.uid if orphan is not None else None,
        )
        job.incs.append(inc)
        job.version += 1
        self._by_uid[uid] = (key, len(job.incs) - 1)
        return job, inc

    def _pods_of(self, job: _Job) -> list[str]:
        """The uids of the pods of ``job`` in the store now."""
        out = []
        for pod in self.store.list(PODS, job.spec.namespace)[0]:
            namespace, name, owner = _job_of(pod)
            if f"{namespace}/{name}" == job.spec.key and owner == job.spec.owner_uid:
                out.append(str(pod["metadata"].get("uid")))
        return out

    def forget(self, uid: str) -> None:
        """The pod ``uid`` was deleted: from now on it holds no GPU (if it still did)."""
        with self._lock:
            where = self._by_uid.get(uid)
            if where is None:
                return
            job = self._jobs[where[0]]
            inc = job.incs[where[1]]
            if inc.gone is None:
                inc.gone = self._clock()
                inc.closed = True
                job.version += 1

    def _job_faults(self, key: str) -> list[TrainingFault]:
        return [f for f in self._faults if f.job == key]

    def _timeline(self, job: _Job) -> _Timeline:
        if job.timeline is not None and job.timeline[0] == job.version:
            return job.timeline[1]
        tl = _build_timeline(
            job.spec,
            list(job.incs),
            self._job_faults(job.spec.key),
            self._readings,
            self._fleet().model.name,
            self._seed,
        )
        job.timeline = (job.version, tl)
        return tl

    def _steps(self, job: _Job, until: float) -> tuple[Floats, Ints, Floats]:
        cached = job.steps
        if cached is None or cached[0] != job.version or cached[1] < until:
            tl = self._timeline(job)
            horizon = until + _STEPS_AHEAD_S
            ends, index, durations = _compute_steps(tl, horizon, _hash64(self._seed, "steps", job.spec.key))
            job.steps = cached = (job.version, horizon, ends, index, durations)
        return cached[2], cached[3], cached[4]

    # --- the kubelet's view --------------------------------------------------------------------------

    def tick(self, pod: Mapping[str, Any], node: str) -> TrainingTick:
        """What a training pod shows now: its status (start time, or how it ended), log and when to look again."""
        now = self._clock()
        status = dict(pod.get("status") or {})
        with self._lock:
            try:
                job, inc = self._register(pod, node, now)
            except InputError as exc:
                message = f"gpucert-sim: training pod refused: {exc}"
                return TrainingTick(
                    status=_terminated(status, code=2, reason="Error", started=now, finished=now), log=message + "\n"
                )
            tl = self._timeline(job)
            i = job.incs.index(inc)
            evicted = tl.evicted.get(i)
            ends = (pod.get("spec") or {}).get("restartPolicy", "Always") != "Always"
            done = job.spec.end if ends and math.isfinite(job.spec.end) else None
            new_status: dict[str, Any] | None = None
            if status.get("startTime") != _rfc3339(inc.hold):
                new_status = _started(status, inc.hold)
            events: tuple[dict[str, Any], ...] = ()
            if evicted is not None and evicted <= now:
                self._log(job, inc, evicted, final=f"gpucert-sim: evicted at {_rfc3339(evicted, micro=True)}")
                new_status = _evicted(new_status or status, inc, evicted)
                events = _eviction_events(pod, node, inc, evicted)
                inc.closed = True
                inc.evicted_among = frozenset(self._pods_of(job))
                return TrainingTick(status=new_status, log=inc.log, events=events)
            if done is not None and done <= now:
                _, index, _ = self._steps(job, done)
                self._log(job, inc, done, final=f"training complete: {len(index)} steps")
                inc.closed = True
                return TrainingTick(
                    status=_terminated(
                        new_status or status, code=0, reason="Completed", started=inc.hold, finished=done
                    ),
                    log=inc.log,
                )
            self._log(job, inc, now)
            wake = _LOG_REFRESH_S
            for at in (evicted, done):
                if at is not None:
                    wake = min(wake, max(0.0, at - now) + 1e-3)
            return TrainingTick(status=new_status, log=inc.log, events=events, wake_s=wake)

    def _log(self, job: _Job, inc: _Inc, until: float, *, final: str | None = None) -> None:
        """Append to ``inc``'s log the steps it took part in up to ``until`` (and ``final``, once)."""
        if inc.closed:
            return
        tl = self._timeline(job)
        if inc.log and inc.log_signature != tl.signature:
            # The job's past changed (a fault injected late, a replacement that resumed in compressed time):
            # the pod's log is printed again, as it would have been had the job run that way all along.
            inc.log, inc.logged_until = "", -_INF
        inc.log_signature = tl.signature
        if not inc.log:
            head = (
                f"gpucert-sim: training job {job.spec.key}: pod {inc.pod} on {inc.node}, GPUs "
                f"{','.join(map(str, inc.gpus))}, healthy step {job.spec.step_s:g} s, began "
                f"{_rfc3339(job.spec.start)}"
            )
            if inc.replaces is not None:
                head += f"; replaces an evicted pod and resumes at {_rfc3339(inc.active)}"
            inc.log = head + "\n"
        i = job.incs.index(inc)
        stop = min(until, tl.inc_end(i))
        lo = max(inc.logged_until, inc.active)
        if stop > lo:
            ends, index, durations = self._steps(job, stop)
            a, b = np.searchsorted(ends, [lo, stop], side="right")
            if inc.logged_until == -_INF:
                a = int(np.searchsorted(ends, inc.active, side="left"))
            inc.log += self._step_lines(tl, inc, ends[a:b], index[a:b], durations[a:b])
            inc.logged_until = stop
        if final is not None:
            inc.log += final + "\n"

    def _step_lines(self, tl: _Timeline, inc: _Inc, ends: Floats, index: Ints, durations: Floats) -> str:
        if not len(ends):
            return ""
        stamps = np.datetime_as_string((ends * 1e3).astype("datetime64[ms]"), unit="ms")
        lines = [
            f'{{"ts": "{s}Z", "step": {n}, "step_time_s": {d:.4f}}}\n'
            for s, n, d in zip(stamps.tolist(), index.tolist(), durations.tolist(), strict=True)
        ]
        every = np.flatnonzero(index % COLLECTIVE_EVERY == 0)
        cols = np.array(
            [tl.col_index[(inc.node, g)] for g in inc.gpus if (inc.node, g) in tl.col_index], dtype=np.int64
        )
        if len(every) and len(cols):
            sample = _sample(tl, ends[every] - 1e-6, cols)
            busbw, exec_us = _nccl(tl, sample)
            for row, k in enumerate(every.tolist()):
                extra = "".join(
                    f'{{"ts": "{stamps[k]}Z", "collective": "AllReduce", "comm": "{tl.spec.comm}", '
                    f'"gpu": {tl.columns[g].gpu}, "busbw_gbps": {busbw[row, c]:.2f}, '
                    f'"exec_time_us": {exec_us[row, c]:.0f}}}\n'
                    for c, g in enumerate(cols.tolist())
                    if np.isfinite(busbw[row, c])
                )
                lines[k] += extra
        return "".join(lines)

    # --- live exporters ------------------------------------------------------------------------------

    def gpus_now(self, node: str) -> dict[int, GpuNow]:
        """The DCGM view of ``node``'s GPUs a training pod holds now (GPU index → labels and values)."""
        now = self._clock()
        out: dict[int, GpuNow] = {}
        with self._lock:
            found = [
                (job, i, inc)
                for job in self._jobs.values()
                for i, inc in enumerate(job.incs)
                if inc.node == node and inc.hold <= now and inc.gone is None
            ]
            for job, i, inc in found:
                tl = self._timeline(job)
                if now >= tl.inc_end(i):
                    continue
                cols = np.array(
                    [tl.col_index[(node, g)] for g in inc.gpus if (node, g) in tl.col_index], dtype=np.int64
                )
                if not len(cols):
                    continue
                sample = _sample(tl, np.array([now]), cols)
                labels = f',pod="{inc.pod}",namespace="{inc.namespace}",container="{inc.container}"'
                for c, g in enumerate(cols.tolist()):
                    values = {
                        name: (
                            int(sample.values[name][0, c])
                            if name in _INTEGER_SERIES
                            else float(sample.values[name][0, c])
                        )
                        for name in LIVE_SERIES
                    }
                    out[tl.columns[g].gpu] = GpuNow(labels, values)
        return out

    def job_metrics(self, namespace: str, name: str) -> str | None:
        """The job's exporter text now (step gauge and NCCL Inspector), or None for a job never seen."""
        now = self._clock()
        with self._lock:
            job = self._jobs.get(f"{namespace}/{name}")
            if job is None:
                return None
            tl = self._timeline(job)
            ends, _, durations = self._steps(job, now)
            last = int(np.searchsorted(ends, now, side="right")) - 1
            sample = _sample(tl, np.array([now]))
            busbw, exec_us = _nccl(tl, sample)
        step_lines, bw_lines, time_lines = [], [], []
        for i, inc in enumerate(tl.incs):
            if inc.hold <= now < tl.inc_end(i) and inc.gone is None and last >= 0 and ends[last] >= inc.active:
                step_lines.append(
                    f'train_step_seconds{{namespace="{inc.namespace}",pod="{inc.pod}"}} {durations[last]:.4f}'
                )
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for g, _column in enumerate(tl.columns):
            h = int(sample.holder[0, g])
            if h < 0 or not np.isfinite(busbw[0, g]):
                continue
            # The last dump, as the plugin writes it: its collective's sequence number and time are labels.
            labels = _labels(
                [
                    *_inspector_labels(tl, g, h),
                    ("coll_sn", max(0, last)),
                    ("timestamp", stamp),
                    ("message_size", _MESSAGE_SIZE),
                ]
            )
            bw_lines.append(f"nccl_bus_bandwidth_gbs{{{labels}}} {busbw[0, g]:.2f}")
            time_lines.append(f"nccl_collective_exec_time_microseconds{{{labels}}} {exec_us[0, g]:.0f}")
        text = [
            "# HELP train_step_seconds Seconds the last training step took.",
            "# TYPE train_step_seconds gauge",
            *step_lines,
            "# HELP nccl_bus_bandwidth_gbs NCCL Inspector: bus bandwidth of the last collective (GB/s).",
            "# TYPE nccl_bus_bandwidth_gbs gauge",
            *bw_lines,
            "# HELP nccl_collective_exec_time_microseconds NCCL Inspector: execution time of the last collective.",
            "# TYPE nccl_collective_exec_time_microseconds gauge",
            *time_lines,
        ]
        return "".join(line + "\n" for line in text)

    def _nic_faults(self) -> list[tuple[TrainingFault, float]]:
        """Every NIC fault of a job that has begun, with that job's start."""
        return [
            (f, self._jobs[f.job].spec.start) for f in self._faults if f.kind == "nic_half_rate" and f.job in self._jobs
        ]

    def _nic_values(self, node: str, times: Floats) -> dict[str, Floats]:
        """node-exporter's infiniband series of ``node`` at ``times``: name → (T, devices)."""
        n_dev = len(_IB_DEVICES)
        rate = np.full((len(times), n_dev), _IB_RATE)
        symbols = np.zeros((len(times), n_dev))
        downed = np.zeros((len(times), n_dev))
        rcv = np.zeros((len(times), n_dev))
        for fault, start in self._nic_faults():
            if fault.node != node:
                continue
            d = _IB_DEVICES.index(fault.device) if fault.device in _IB_DEVICES else 0
            lo = start + 60.0 * fault.minute
            hi = start + 60.0 * fault.until_minute if fault.until_minute is not None else _INF
            on = (times >= lo) & (times < hi)
            rate[on, d] = _IB_RATE / 2
            if fault.param(*_FLAPPING):
                elapsed = np.clip(np.minimum(times, hi) - lo, 0.0, None)
                began = times >= lo
                symbols[:, d] += np.floor(_FLAP_SYMBOLS_PER_S * elapsed)
                rcv[:, d] += np.floor(_FLAP_RCV_ERRORS_PER_S * elapsed)
                downed[:, d] += np.where(began, np.floor(elapsed / _FLAP_DOWN_EVERY_S) + 1, 0)
        return {
            "node_infiniband_rate_bytes_per_second": rate,
            "node_infiniband_symbol_error_total": symbols,
            "node_infiniband_link_downed_total": downed,
            "node_infiniband_port_errors_received_total": rcv,
        }

    def infiniband(self, node: str) -> str | None:
        """node-exporter's infiniband collector text for ``node`` now; None for a node not in the fleet."""
        if node not in self._fleet().node_index:
            return None
        with self._lock:
            values = self._nic_values(node, np.array([self._clock()]))
        lines: list[str] = []
        for name, kind, help_text in _IB_SERIES:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            for d, device in enumerate(_IB_DEVICES):
                lines.append(f'{name}{{device="{device}",port="1"}} {values[name][0, d]:.0f}')
        return "".join(line + "\n" for line in lines)

    # --- history ------------------------------------------------------------------------------------

    def jobs(self) -> list[str]:
        with self._lock:
            return sorted(self._jobs)

    def _window(
        self, key: str, start: datetime | float, end: datetime | float, step_s: float
    ) -> tuple[_Job, _Timeline, Floats]:
        if not math.isfinite(step_s) or step_s <= 0:
            raise InputError(f"sim: training history: step_s must be > 0, got {step_s!r}")
        lo, hi = (t.timestamp() if isinstance(t, datetime) else float(t) for t in (start, end))
        if hi <= lo:
            raise InputError(f"sim: training history of {key}: the window ends before it starts")
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                known = ", ".join(sorted(self._jobs)) or "none"
                raise InputError(f"sim: no training job {key!r} has run on the cluster (known: {known})")
            tl = self._timeline(job)
        hi = min(hi, self._clock())
        first = math.ceil(lo / step_s) * step_s
        # Counted, not arange(…, hi + ε): at unix times a float's resolution is coarser than any ε.
        count = math.floor((hi - first) / step_s + 1e-6) + 1 if hi >= first else 0
        if count > 5_000_000:
            raise InputError(f"sim: training history of {key}: {count} instants; use a larger step_s")
        times = first + step_s * np.arange(count, dtype=np.float64)
        return job, tl, times

    def history_chunks(
        self,
        key: str,
        start: datetime | float,
        end: datetime | float,
        *,
        step_s: float = 15.0,
        host_label: str = "hostname",
    ) -> Iterator[bytes]:
        """The OpenMetrics text of :meth:`history` in pieces (a family's ``# TYPE`` line, its series), ``# EOF``
        last."""
        job, tl, times = self._window(key, start, end, step_s)
        if len(times) and len(tl.columns):
            stamps = _stamps(times)
            sample = _sample(tl, times)
            # One row per (GPU, holder): dcgm-exporter's series change labels when another pod holds the GPU.
            holder = np.ascontiguousarray(sample.holder.T)  # (G, T)
            rows = [(g, int(h)) for g in range(len(tl.columns)) for h in np.unique(holder[g])]
            row_g = np.array([g for g, _ in rows], dtype=np.int64)
            mask = holder[row_g] == np.array([h for _, h in rows])[:, None]
            bases = []
            for g, h in rows:
                c = tl.columns[g]
                pairs: list[tuple[str, object]] = [("gpu", c.gpu), ("UUID", c.uuid), (host_label, c.node)]
                if h >= 0:
                    inc = tl.incs[h]
                    pairs += [("namespace", inc.namespace), ("pod", inc.pod), ("container", inc.container)]
                bases.append(_labels(pairs))
            for name, decimals in _DCGM_SERIES:
                yield from _family(
                    name,
                    "gauge",
                    [f"{name}{{{b}}}" for b in bases],
                    sample.values[name].T[row_g],
                    stamps,
                    mask,
                    decimals,
                )
            yield from self._job_series(job, tl, sample, stamps)
            yield from self._nic_series(tl, times, stamps)
        yield b"# EOF\n"

    def _job_series(self, job: _Job, tl: _Timeline, sample: _Sample, stamps: npt.NDArray[np.uint8]) -> Iterator[bytes]:
        times = sample.times
        with self._lock:
            ends, _, durations = self._steps(job, float(times[-1]))
        last = np.searchsorted(ends, times, side="right") - 1
        step_value = np.where(last >= 0, durations[np.maximum(last, 0)], 0.0)
        step_end = np.where(last >= 0, ends[np.maximum(last, 0)], -_INF)
        prefixes = [
            f"train_step_seconds{{{_labels([('namespace', inc.namespace), ('pod', inc.pod)])}}}" for inc in tl.incs
        ]
        masks = np.array(
            [(times >= inc.hold) & (times < tl.inc_end(i)) & (step_end >= inc.active) for i, inc in enumerate(tl.incs)]
        ).reshape(len(tl.incs), len(times))
        values = np.broadcast_to(step_value, masks.shape)
        yield from _family("train_step_seconds", "gauge", prefixes, values, stamps, masks, 4)
        busbw, exec_us = _nccl(tl, sample)
        holder = np.ascontiguousarray(sample.holder.T)
        rows = [(g, int(h)) for g in range(len(tl.columns)) for h in np.unique(holder[g]) if h >= 0]
        if not rows:
            return
        row_g = np.array([g for g, _ in rows], dtype=np.int64)
        mask = (holder[row_g] == np.array([h for _, h in rows])[:, None]) & sample.act.T[row_g]
        bases = [
            _labels(
                [
                    *_inspector_labels(tl, g, h),
                    ("message_size", _MESSAGE_SIZE),
                    ("instance", f"{tl.columns[g].node}:9100"),
                    ("job", "node-exporter"),
                ]
            )
            for g, h in rows
        ]
        for name, values_g, decimals in (
            ("nccl_bus_bandwidth_gbs", busbw, 2),
            ("nccl_collective_exec_time_microseconds", exec_us, 0),
        ):
            yield from _family(
                name,
                "gauge",
                [f"{name}{{{b}}}" for b in bases],
                np.nan_to_num(values_g.T[row_g]),
                stamps,
                mask,
                decimals,
            )

    def _nic_series(self, tl: _Timeline, times: Floats, stamps: npt.NDArray[np.uint8]) -> Iterator[bytes]:
        nodes = sorted({c.node for c in tl.columns})
        with self._lock:
            per_node = [self._nic_values(node, times) for node in nodes]
        for name, kind, _ in _IB_SERIES:
            prefixes = [
                f"{name}{{{_labels([('device', d), ('port', 1), ('node', n), ('instance', f'{n}:9100')])}}}"
                for n in nodes
                for d in _IB_DEVICES
            ]
            values = np.concatenate([v[name].T for v in per_node])
            yield from _family(name, kind, prefixes, values, stamps, np.ones(values.shape, dtype=bool), 0)

    def history(
        self,
        key: str,
        start: datetime | float,
        end: datetime | float,
        *,
        step_s: float = 15.0,
        host_label: str = "hostname",
    ) -> str:
        """OpenMetrics text with timestamps (``# EOF`` terminated) of job ``key``'s series over [start, end]
        (clipped to now) at ``step_s``: the DCGM series of the GPUs of every node its pods ran on, its step
        gauge, NCCL Inspector's and those nodes' infiniband series. Raises :class:`InputError` for a job never
        seen or an empty window."""
        chunks = self.history_chunks(key, start, end, step_s=step_s, host_label=host_label)
        return b"".join(chunks).decode("ascii")

    def write_history(
        self,
        key: str,
        path: str | Path,
        start: datetime | float,
        end: datetime | float,
        *,
        step_s: float = 15.0,
        host_label: str = "hostname",
    ) -> int:
        """:meth:`history` written to ``path`` family by family (no whole text in memory); returns its bytes."""
        written = 0
        with Path(path).open("wb") as out:
            for chunk in self.history_chunks(key, start, end, step_s=step_s, host_label=host_label):
                out.write(chunk)
                written += len(chunk)
        return written

    def frames(
        self, key: str, start: datetime | float, end: datetime | float, *, step_s: float = 15.0
    ) -> dict[str, pd.DataFrame]:
        """The frames ``gpucert explain`` gathers (``telemetry``, ``nic``, ``steps``, ``collectives``,
        ``events``; columns of ``gpucert/explain/_frames.py``) for job ``key`` over [start, end] at ``step_s``,
        straight from the model: what the backfill would give through Prometheus, without Prometheus. Only
        samples of GPUs the job's pods held; rates as ``irate`` would read them between scrapes."""
        job, tl, times = self._window(key, start, end, step_s)
        sample = _sample(tl, times)
        return {
            "telemetry": self._telemetry_frame(tl, sample),
            "nic": self._nic_frame(tl, times),
            "steps": self._steps_frame(job, tl, times),
            "collectives": self._collectives_frame(tl, sample),
            "events": self._events_frame(tl),
        }

    def _telemetry_frame(self, tl: _Timeline, sample: _Sample) -> pd.DataFrame:
        """Every signal of the GPUs the job held, one row per GPU × signal × instant (sparse ones where > 0)."""
        from gpucert import explain as _frames

        cols = tl.columns
        t_idx, g_idx = np.nonzero(sample.holder >= 0)
        if not len(t_idx) or not cols:
            return _frames.empty_telemetry()
        v = sample.values
        seg = tl.segment(sample.times)
        rate = {name: r[np.ix_(seg, sample.cols)] for name, r in tl.rates.items()}
        shape = sample.holder.shape
        signals: dict[str, Floats] = {
            "sm_clock_mhz": v["DCGM_FI_DEV_SM_CLOCK"],
            "clock_event_reasons": v["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"],
            "power_w": v["DCGM_FI_DEV_POWER_USAGE"],
            "temp_c": v["DCGM_FI_DEV_GPU_TEMP"],
            "util_pct": v["DCGM_FI_DEV_GPU_UTIL"],
            "engine_active": v["DCGM_FI_PROF_GR_ENGINE_ACTIVE"],
            "nvlink_gbps": rate["nvlink"] / 1e9,
            "pcie_gbps": (rate["pcie_tx"] + rate["pcie_rx"]) / 1e9,
            "xid": v["DCGM_FI_DEV_XID_ERRORS"],
            "pcie_replays_per_min": np.broadcast_to(np.array([c.replays_per_s * 60 for c in cols]), shape),
            "thermal_violation_frac": np.clip(rate["thermal"] / 1e9, 0, 1),
            "power_violation_frac": np.broadcast_to(np.array([0.5 * c.power_capped for c in cols]), shape),
        }
        held = sample.holder >= 0
        dense = [n for n in signals if n not in ("xid", "pcie_replays_per_min")]
        sparse = [n for n in signals if n in ("xid", "pcie_replays_per_min")]  # gathered only where not zero
        # The key columns of one signal's rows (the held samples in C order, as a boolean mask picks them);
        # every dense signal repeats them, each sparse one takes its non-zero part.
        node_names = sorted({c.node for c in cols})
        node_code = np.array([node_names.index(c.node) for c in cols], dtype=np.int64)
        pod_names = list(dict.fromkeys(inc.pod for inc in tl.incs))  # a bare pod made again keeps its name
        pod_code = np.array([pod_names.index(inc.pod) for inc in tl.incs], dtype=np.int64)
        keys = {
            "ts": (sample.times[t_idx] * 1e9).astype(np.int64),
            "node": node_code[g_idx],
            "gpu": np.array([c.gpu for c in cols], dtype=np.int64)[g_idx],
            "gpu_uuid": g_idx,
            "pod": pod_code[sample.holder[t_idx, g_idx]],
        }
        parts_v = [np.asarray(signals[n], dtype=np.float64)[held] for n in dense]
        picks: list[Ints | slice] = [slice(None)] * len(dense)
        for n in sparse:
            flat = np.asarray(signals[n], dtype=np.float64)[held]
            nz = np.flatnonzero(flat > 0)
            parts_v.append(flat[nz])
            picks.append(nz)
        sizes = [len(v) for v in parts_v]
        columns = {
            k: np.concatenate([np.tile(base, len(dense))] + [base[pick] for pick in picks[len(dense) :]])
            for k, base in keys.items()
        }
        return pd.DataFrame(
            {
                "ts": pd.DatetimeIndex(columns["ts"].view("datetime64[ns]")).tz_localize(UTC),
                "node": _categorical(columns["node"], node_names),
                "gpu": columns["gpu"],
                "gpu_uuid": _categorical(columns["gpu_uuid"], [c.uuid for c in cols]),
                "pod": _categorical(columns["pod"], pod_names),
                "signal": _categorical(np.repeat(np.arange(len(parts_v)), sizes), dense + sparse),
                "value": np.concatenate(parts_v),
            },
            copy=False,
        )

    def _nic_frame(self, tl: _Timeline, times: Floats) -> pd.DataFrame:
        """The job's nodes' infiniband ports, one row per node × port × signal × instant (counters as the
        increase since the instant before, the rate in Gb/s)."""
        from gpucert import explain as _frames

        nodes = sorted({c.node for c in tl.columns})
        if not nodes or not len(times):
            return _frames.empty_nic()
        names = (
            ("node_infiniband_rate_bytes_per_second", "rate_gbps"),
            ("node_infiniband_symbol_error_total", "symbol_errors"),
            ("node_infiniband_link_downed_total", "link_downed"),
            ("node_infiniband_port_errors_received_total", "rcv_errors"),
        )
        with self._lock:
            per_node = [self._nic_values(node, times) for node in nodes]
        blocks = []
        for values in per_node:
            for series, signal in names:
                arr = values[series]
                blocks.append(arr * 8 / 1e9 if signal == "rate_gbps" else np.diff(arr, axis=0, prepend=arr[:1]))
        # (nodes, signals, T, devices) flattened in that order: keys by repeat and tile, not by gathering.
        value = np.stack(blocks).reshape(-1)
        n_n, n_s, n_t, n_d = len(nodes), len(names), len(times), len(_IB_DEVICES)
        stamps = np.tile(np.repeat((times * 1e9).astype(np.int64), n_d), n_n * n_s)
        return pd.DataFrame(
            {
                "ts": pd.DatetimeIndex(stamps.view("datetime64[ns]")).tz_localize(UTC),
                "node": _categorical(np.repeat(np.arange(n_n), n_s * n_t * n_d), nodes),
                "device": _categorical(np.tile(np.arange(n_d), n_n * n_s * n_t), _IB_DEVICES),
                "port": np.ones(len(value), dtype=np.int64),
                "signal": _categorical(np.tile(np.repeat(np.arange(n_s), n_t * n_d), n_n), [n for _, n in names]),
                "value": value,
            },
            copy=False,
        )

    def _steps_frame(self, job: _Job, tl: _Timeline, times: Floats) -> pd.DataFrame:
        """One row per pod and instant it trained: the last step it finished by then, as the gauge reads."""
        from gpucert import explain as _frames

        if not len(times):
            return _frames.empty_steps()
        with self._lock:
            ends, index, durations = self._steps(job, float(times[-1]))
        last = np.searchsorted(ends, times, side="right") - 1
        parts = []
        for i, inc in enumerate(tl.incs):
            ok = (last >= 0) & (times >= inc.hold) & (times < tl.inc_end(i))
            ok &= np.where(last >= 0, ends[np.maximum(last, 0)], -_INF) >= inc.active
            if ok.any():
                k = last[ok]
                parts.append(
                    pd.DataFrame(
                        {
                            "ts": pd.to_datetime(times[ok] * 1e9, utc=True),
                            "pod": inc.pod,
                            "node": inc.node,
                            "step": pd.array(index[k], dtype="Int64"),
                            "step_time_s": durations[k],
                        }
                    )
                )
        return pd.concat(parts, ignore_index=True) if parts else _frames.empty_steps()

    def _collectives_frame(self, tl: _Timeline, sample: _Sample) -> pd.DataFrame:
        from gpucert import explain as _frames

        busbw, exec_us = _nccl(tl, sample)
        t_idx, g_idx = np.nonzero(np.isfinite(busbw))
        if not len(t_idx):
            return _frames.empty_collectives()
        return pd.DataFrame(
            {
                "ts": pd.to_datetime(sample.times[t_idx] * 1e9, utc=True),
                "node": [tl.columns[g].node for g in g_idx.tolist()],
                "gpu": pd.array([tl.columns[g].gpu for g in g_idx.tolist()], dtype="Int64"),
                "comm": tl.spec.comm,
                "collective": "AllReduce",
                "busbw_gbps": busbw[t_idx, g_idx],
                "exec_time_us": exec_us[t_idx, g_idx],
            }
        )

    def _events_frame(self, tl: _Timeline) -> pd.DataFrame:
        from gpucert import explain as _frames

        rows = [
            {
                "ts": pd.Timestamp(t, unit="s", tz="UTC"),
                "object_kind": "Pod",
                "object_name": tl.incs[i].pod,
                "namespace": tl.incs[i].namespace,
                "node": tl.incs[i].node,
                "reason": "Evicted",
                "type": "Warning",
                "note": _EVICTION_MESSAGE.format(container=tl.incs[i].container),
            }
            for i, t in sorted(tl.evicted.items(), key=lambda kv: kv[1])
        ]
        if not rows:
            return _frames.empty_events()
        return pd.DataFrame(rows, columns=list(_frames.EVENTS_COLUMNS))


# --- pod status ---------------------------------------------------------------------------------------------


def _started(status: Mapping[str, Any], hold: float) -> dict[str, Any]:
    """``status`` with the start times of a pod that has held its GPUs since ``hold`` (compressed time)."""
    stamp = _rfc3339(hold)
    out = {**status, "startTime": stamp}
    statuses = []
    for c in status.get("containerStatuses") or ():
        state = dict(c.get("state") or {})
        if "running" in state:
            state["running"] = {**state["running"], "startedAt": stamp}
        statuses.append({**c, "state": state})
    if statuses:
        out["containerStatuses"] = statuses
    return out


def _terminated(
    status: Mapping[str, Any], *, code: int, reason: str, started: float, finished: float, phase: str | None = None
) -> dict[str, Any]:
    """``status`` of a pod whose containers exited with ``code`` at ``finished``."""
    done = _rfc3339(finished)
    conditions = status.get("conditions")
    for kind in ("ContainersReady", "Ready"):
        conditions = set_condition(
            conditions,
            {
                "type": kind,
                "status": "False",
                "reason": "PodCompleted" if code == 0 else "PodFailed",
                "lastProbeTime": None,
                "lastTransitionTime": done,
            },
        )
    statuses = []
    for c in status.get("containerStatuses") or ():
        statuses.append(
            {
                **c,
                "ready": False,
                "started": False,
                "state": {
                    "terminated": {
                        "exitCode": code,
                        "reason": reason,
                        "startedAt": _rfc3339(started),
                        "finishedAt": done,
                        "containerID": c.get("containerID", ""),
                    }
                },
            }
        )
    return {
        **status,
        "phase": phase or ("Succeeded" if code == 0 else "Failed"),
        "conditions": conditions,
        "containerStatuses": statuses,
    }


def _evicted(status: Mapping[str, Any], inc: _Inc, at: float) -> dict[str, Any]:
    """``status`` of a pod the kubelet evicted at ``at`` (node pressure): Failed, reason Evicted."""
    message = _EVICTION_MESSAGE.format(container=inc.container)
    out = _terminated(status, code=137, reason="Error", started=inc.hold, finished=at, phase="Failed")
    out["conditions"] = set_condition(
        out.get("conditions"),
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "TerminationByKubelet",
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": _rfc3339(at),
        },
    )
    out.update(reason="Evicted", message=message)
    return out


def _eviction_events(pod: Mapping[str, Any], node: str, inc: _Inc, at: float) -> tuple[dict[str, Any], ...]:
    """The kubelet's ``Evicted`` Event, dated ``at``: once, as ``events.k8s.io/v1`` (the store serves it as
    a core Event too, with ``message`` and ``involvedObject``; a second, core copy would be a duplicate)."""
    meta = pod.get("metadata") or {}
    message = _EVICTION_MESSAGE.format(container=inc.container)
    name = f"{meta.get('name')}.{_hash64(meta.get('uid'), at) & 0xFFFFFFFFFFFF:012x}"
    regarding = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
    }
    v1 = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": meta.get("namespace")},
        "eventTime": _rfc3339(at, micro=True),
        "reportingController": "kubelet",
        "reportingInstance": node,
        "action": "Evict",
        "reason": "Evicted",
        "regarding": regarding,
        "note": message,
        "type": "Warning",
    }
    return (v1,)


# --- HTTP --------------------------------------------------------------------------------------------------

_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def routes(model: TrainingModel) -> list[tuple[str, str, Any]]:
    """The job exporters' and node-exporters' routes (404 for a job never seen, or a node that is not Ready)."""

    async def job(request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["job"]
        text = model.job_metrics(namespace, name)
        if text is None:
            return web.Response(status=404, text=f"no training job {namespace}/{name} has run here\n")
        return web.Response(body=text.encode(), headers={"Content-Type": _CONTENT_TYPE})

    async def infiniband(request: web.Request) -> web.Response:
        node = request.match_info["node"]
        text = model.infiniband(node) if node_ready(model.store.get(NODES, None, node)) else None
        if text is None:
            return web.Response(status=404, text=f"no node-exporter answers on node {node!r}\n")
        return web.Response(body=text.encode(), headers={"Content-Type": _CONTENT_TYPE})

    return [("GET", TRAINING_METRICS_PATH, job), ("GET", INFINIBAND_PATH, infiniband)]
