"""The simulated DCGM exporters: one Prometheus endpoint per GPU node, on the simulator's own port.

gpucert's operate phase reads GPU telemetry the way a platform team's Prometheus does, from
dcgm-exporter, so the simulator serves what that exporter would print on each node, built from the
same fleet model (and the same injected faults) as the node's benchmark logs: a fault that slows a
benchmark also shows its signature here (docs/design/simulator.md, "Fault catalogue": every injected
fault also emits its DCGM/NVML series).

Where: ``GET /dcgm/<node>/metrics`` (:data:`DCGM_PATH`). A node that does not exist, is NotReady, or has
no simulated GPUs answers 404 with no series, as an exporter that is not running would not answer at
all. How operate finds these paths: the exporter Service's Endpoints (``_endpoints.py``).

What: Prometheus text exposition 0.0.4 as dcgm-exporter writes it: per metric a ``# HELP`` and a
``# TYPE`` line, then one sample per GPU with the labels ``gpu``, ``UUID``, ``pci_bus_id``, ``device``
(``nvidia<i>``), ``modelName``, the host label (``hostname`` since NVIDIA/dcgm-exporter#655, ``Hostname``
before; configurable) and ``DCGM_FI_DRIVER_VERSION`` — the driver loaded on the node, as the benchmark pods
see it (:func:`~gpucert_sim._benchlogs.node_driver`: what configure installed, or the host's pre-installed
one), so ``gpucert configure`` changes what the exporters report. Names are DCGM's exactly (no ``_total`` is added
to counters: docs/reference/telemetry.md, "DCGM exporter"); help texts are those of
``etc/default-counters.csv`` where it has the field. Integers print as integers, doubles with six decimals, as
the exporter does. A GPU that fell off the bus has no series at all. A GPU a training pod holds
(``_training.py``) also carries ``pod``, ``namespace`` and ``container`` (the exporter's Kubernetes mode), and
its clock, clock-event reasons, power, temperature, utilisation, engine activity, NVLink and PCIe byte
counters and thermal violation time are the training model's at that instant; any other GPU shows no activity
(utilisation 0, no NVLink/PCIe bytes).

Values, per GPU, from two fleet-model waves on the node with a seed fixed per cluster and node: one
healthy, one with the node's injected faults (so a fault's drawn parameters stay put between scrapes;
pin them with ``params`` to match a benchmark run exactly). Gauges are the faulted wave's telemetry.
Counters grow with simulated time (the monotonic clock): the healthy rate since the cluster started plus
the fault's excess rate since the fault was injected, so they only grow while faults accumulate, and
``rate()`` sees the fault's rate; lifting a node's faults resets its counters, as the repair (a GPU
reset or reboot) would. Rates: PCIe replays from ``pcie_replays_per_min``, NVLink CRC flits from the
benchmark's per-minute count, SBEs from ``ecc_sbe_volatile`` per hour; DBEs and remapped rows are a step
at the fault's onset. A HW slowdown with duty D (``hw_thermal``, ``power_brake``) is active for the first
D of every minute since the fault began: the clock-event bits (0x40/0x80 with 0x08) and the halved SM
clock show only then, and ``DCGM_FI_DEV_THERMAL_VIOLATION`` (``_POWER_VIOLATION`` for the brake) grows by
the active time, in nanoseconds as docs/reference/telemetry.md has it (the CSV's help says "us"; DCGM's value is
NVML's violation time). A power cap below the default grows ``_POWER_VIOLATION`` half of the time.
``DCGM_EXP_XID_ERRORS_COUNT`` counts the XIDs logged within the last 5 minutes (fault XIDs at the
fault's onset, application XIDs of healthy GPUs at the cluster's start); ``DCGM_EXP_CLOCK_EVENTS_COUNT``
counts, per reason, the slowdowns that began in that window (a steady reason counts 1).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pandas as pd
from aiohttp import web

from ._gpufaults import GpuFaults
from ._objects import NODES, node_ready
from ._store import Store
from .fleet import GPU_TELEMETRY_METRICS, Fault, Fleet

if TYPE_CHECKING:
    from ._training import GpuNow

__all__ = ["DCGM_PATH", "HOST_LABELS", "DcgmExporters"]

#: The route of one node's exporter; ``{node}`` is the node name.
DCGM_PATH = "/dcgm/{node}/metrics"
HOST_LABELS = ("hostname", "Hostname")
_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_WINDOW_S = 300.0  # dcgm-exporter's default --xid-count-window-size / clock-events window
_DUTY_PERIOD_S = 60.0
_NS = 1_000_000_000

# Clock-event reason bits (docs/reference/telemetry.md, "Clock-event reasons") and the names dcgm-exporter gives them.
_CLOCK_EVENTS = {
    0x001: "gpu_idle",
    0x002: "clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal",
    0x040: "hw_thermal",
    0x080: "hw_power_brake",
    0x100: "display_clocks",
}
_DUTY_BITS = 0x008 | 0x040 | 0x080
# HGX baseboard bus ids of GPUs 0-7 (what nvidia-smi shows on an H100/H200 HGX box).
_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
# Per model: max SM clock and memory clock under load (MHz); the fleet model has no clocks of its own.
_CLOCKS = {"NVIDIA H100 80GB HBM3": (1980, 2619), "NVIDIA H200": (1980, 3201)}

#: (name, type, help) in the order the exporter prints them.
METRICS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_SLOWDOWN_TEMP", "gauge", "Slowdown temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - "
        "in bytes per second.",
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads - "
        "in bytes per second.",
    ),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Power management limit (in W)."),
    ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "gauge", "Effective power limit that the driver enforces (in W)."),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons (bitmask)."),
    ("DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "PCIe current link generation."),
    ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "gauge", "PCIe maximum link generation."),
    ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "PCIe current link width."),
    ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "gauge", "PCIe maximum link width."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Throttling duration due to power constraints (in us)."),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to thermal constraints (in us)."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink flow-control CRC errors."),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending"),
    (
        "DCGM_EXP_XID_ERRORS_COUNT",
        "gauge",
        "Count of XID Errors within user-specified time window (see xid-count-window-size param).",
    ),
    (
        "DCGM_EXP_CLOCK_EVENTS_COUNT",
        "gauge",
        "Count of clock events within the user-specified time window (see clock-events-count-window-size param).",
    ),
)
_TYPES = {name: kind for name, kind, _ in METRICS}


@dataclass(frozen=True)
class _Gpu:
    """One GPU's readings from the two waves: healthy and with the node's faults."""

    index: int
    uuid: str
    healthy: dict[str, float]
    faulted: dict[str, float]
    healthy_xids: tuple[int, ...]
    fault_xids: tuple[int, ...]
    since: float | None  # when the earliest fault touching this GPU was injected (monotonic)


def _active_time(elapsed: float, duty: float) -> float:
    """Seconds a slowdown of duty ``duty`` was active in ``elapsed`` s (active first in each period)."""
    if elapsed <= 0 or duty <= 0:
        return 0.0
    whole, part = divmod(elapsed, _DUTY_PERIOD_S)
    return whole * duty * _DUTY_PERIOD_S + min(part, duty * _DUTY_PERIOD_S)


def _onsets(elapsed: float) -> int:
    """Slowdown periods that began within the last window, ``elapsed`` s after the fault began."""
    if elapsed < 0:
        return 0
    last = math.floor(elapsed / _DUTY_PERIOD_S)
    first = max(0, math.floor((elapsed - _WINDOW_S) / _DUTY_PERIOD_S) + 1)
    return last - first + 1


class DcgmExporters:
    """The exporters of every node of a simulated cluster; see the module docstring."""

    def __init__(
        self,
        store: Store,
        fleet: Callable[[], Fleet],
        faults: GpuFaults,
        *,
        seed: int,
        started_at: float,
        host_label: str = "hostname",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if host_label not in HOST_LABELS:
            raise ValueError(f"the DCGM host label is one of {HOST_LABELS}, not {host_label!r}")
        self.store = store
        self._fleet = fleet
        self._faults = faults
        self._seed = seed
        self._started_at = started_at
        self.host_label = host_label
        self._clock = clock
        self._cache: dict[
            tuple[int, str, tuple[Fault, ...]], tuple[dict[int, dict[str, float]], dict[int, tuple[int, ...]]]
        ] = {}
        self._ts = datetime.now(UTC)
        #: GPUs a training pod holds (``_training.py``): node → GPU index → pod labels and busy values.
        self.training: Callable[[str], Mapping[int, GpuNow]] | None = None
        #: node → the driver version loaded there (``_kubelet.loaded_driver``), set once the controllers
        #: run; None (or no driver loaded) leaves ``DCGM_FI_DRIVER_VERSION`` out, never a made-up version.
        self.driver: Callable[[str], str | None] | None = None

    # --- HTTP ---------------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.Response:
        node = request.match_info["node"]
        text = self.scrape(node)
        if text is None:
            return web.Response(status=404, text=f"no DCGM exporter answers on node {node!r}\n")
        return web.Response(body=text.encode(), headers={"Content-Type": _CONTENT_TYPE})

    # --- the exposition -----------------------------------------------------------------------------

    def scrape(self, node: str) -> str | None:
        """The exposition text of ``node``'s exporter now; None when it has none (404)."""
        fleet = self._fleet()
        if node not in fleet.node_index or not node_ready(self.store.get(NODES, None, node)):
            return None
        gpus = self._gpus(fleet, node)
        now = self._clock()
        model = fleet.model.name
        samples: dict[str, list[tuple[str, float | int]]] = {name: [] for name, _, _ in METRICS}
        held = self.training(node) if self.training is not None else {}
        driver = self.driver(node) if self.driver is not None else None
        loaded = f',DCGM_FI_DRIVER_VERSION="{driver}"' if driver else ""
        for gpu in gpus:
            labels = (
                f'gpu="{gpu.index}",UUID="{gpu.uuid}",pci_bus_id="{_bus_id(gpu.index)}",'
                f'device="nvidia{gpu.index}",modelName="{model}",{self.host_label}="{node}"{loaded}'
            )
            training = held.get(gpu.index)
            if training is not None:  # dcgm-exporter's Kubernetes mode: the pod holding the GPU
                labels += training.labels
            for name, extra, value in self._series(gpu, model, now):
                busy = training is not None and not extra and name in training.values
                samples[name].append((labels + extra, training.values[name] if busy and training else value))
        lines: list[str] = []
        for name, kind, help_text in METRICS:
            if not samples[name]:
                continue
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines += [f"{name}{{{labels}}} {_number(value)}" for labels, value in samples[name]]
        return "".join(line + "\n" for line in lines)

    def _series(self, gpu: _Gpu, model: str, now: float) -> list[tuple[str, str, float | int]]:
        h, f = gpu.healthy, gpu.faulted
        up = max(0.0, now - self._started_at)
        faulted_for = max(0.0, now - gpu.since) if gpu.since is not None else 0.0
        bits = int(f["clocks_event_reasons"])
        duty = float(f["hw_slowdown_frac"])
        duty_bits = bits & _DUTY_BITS if duty > 0 else 0
        steady = bits & ~duty_bits
        active = duty_bits != 0 and faulted_for % _DUTY_PERIOD_S < duty * _DUTY_PERIOD_S
        now_bits = steady | (duty_bits if active else 0)

        sm_max, mem_clock = _CLOCKS.get(model, (1980, 2619))
        sm = sm_max * (0.5 if active else 1.0) * (0.9 if steady & 0x20 else 1.0) * (0.96 if steady & 0x04 else 1.0)
        limit, default_limit = float(f["power_limit_w"]), float(f["power_limit_default_w"])
        power = limit * (0.985 if steady & 0x04 else 0.86) * (0.6 if active and duty_bits & 0x80 else 1.0)
        temp = int(f["temp_max_c"])

        def excess(metric: str) -> float:
            return max(0.0, float(f[metric]) - float(h[metric]))

        replays = h["pcie_replays_per_min"] / 60 * up + excess("pcie_replays_per_min") / 60 * faulted_for
        crc = h["nvlink_crc_errors"] / 60 * up + excess("nvlink_crc_errors") / 60 * faulted_for
        sbe = h["ecc_sbe_volatile"] + excess("ecc_sbe_volatile") / 3600 * faulted_for
        active_s = _active_time(faulted_for, duty) if duty_bits else 0.0
        thermal_ns = active_s * _NS if duty_bits & 0x40 else 0.0
        power_s = (active_s if duty_bits & 0x80 else 0.0) + (0.5 * faulted_for if limit < default_limit else 0.0)
        xids = gpu.healthy_xids + gpu.fault_xids

        out: list[tuple[str, str, float | int]] = [
            ("DCGM_FI_DEV_SM_CLOCK", "", round(sm)),
            ("DCGM_FI_DEV_MEM_CLOCK", "", mem_clock),
            ("DCGM_FI_DEV_MEMORY_TEMP", "", temp + 4),
            ("DCGM_FI_DEV_GPU_TEMP", "", temp),
            ("DCGM_FI_DEV_SLOWDOWN_TEMP", "", int(f["temp_slowdown_c"])),
            ("DCGM_FI_DEV_POWER_USAGE", "", power),
            # Activity and traffic: a GPU no training pod holds idles (``_training.py`` gives the busy ones).
            ("DCGM_FI_DEV_GPU_UTIL", "", 0),
            ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "", 0.0),
            ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "", 0),
            ("DCGM_FI_PROF_PCIE_TX_BYTES", "", 0),
            ("DCGM_FI_PROF_PCIE_RX_BYTES", "", 0),
            ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "", int(limit)),
            ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "", int(limit)),
            ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "", now_bits),
            ("DCGM_FI_DEV_PCIE_LINK_GEN", "", int(f["pcie_gen"])),
            ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "", int(f["pcie_gen_max"])),
            ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "", int(f["pcie_width"])),
            ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "", int(f["pcie_width_max"])),
            ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "", math.floor(replays)),
            ("DCGM_FI_DEV_XID_ERRORS", "", xids[-1] if xids else 0),
            ("DCGM_FI_DEV_POWER_VIOLATION", "", round(power_s * _NS)),
            ("DCGM_FI_DEV_THERMAL_VIOLATION", "", round(thermal_ns)),
            ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "", math.floor(sbe)),
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "", int(f["ecc_dbe_volatile"])),
            ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "", math.floor(crc)),
            ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "", int(f["remapped_rows_pending"])),
            ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "", 0),
            ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "", int(f["remapped_rows_failure"])),
            ("DCGM_FI_DEV_ROW_REMAP_PENDING", "", int(f["remapped_rows_pending"])),
        ]
        window = f',window_size_in_ms="{int(_WINDOW_S * 1000)}"'
        counts: dict[int, int] = {}
        if up < _WINDOW_S:
            for x in gpu.healthy_xids:
                counts[x] = counts.get(x, 0) + 1
        if gpu.since is not None and faulted_for < _WINDOW_S:
            for x in gpu.fault_xids:
                counts[x] = counts.get(x, 0) + 1
        out += [("DCGM_EXP_XID_ERRORS_COUNT", f'{window},xid="{x}"', n) for x, n in sorted(counts.items())]
        for bit, name in _CLOCK_EVENTS.items():
            if bits & bit:
                n = _onsets(faulted_for) if duty_bits & bit else 1
                out.append(("DCGM_EXP_CLOCK_EVENTS_COUNT", f'{window},clock_event="{name}"', n))
        return out

    # --- the model ----------------------------------------------------------------------------------

    def readings(self, node: str) -> list[_Gpu]:
        """The fleet model's readings of ``node``'s GPUs (healthy and with its faults); none off the bus, none
        for a node the fleet does not have."""
        fleet = self._fleet()
        return self._gpus(fleet, node) if node in fleet.node_index else []

    def _gpus(self, fleet: Fleet, node: str) -> list[_Gpu]:
        with_since = self._faults.on_node_since(node)
        faults = tuple(f for f, _ in with_since)
        healthy, healthy_xids = self._wave(fleet, node, ())
        faulted, fault_xids = self._wave(fleet, node, faults) if faults else (healthy, healthy_xids)
        first = fleet.node_index[node] * fleet.gpus_per_node
        gpus = []
        for index in range(fleet.gpus_per_node):
            if index not in faulted:
                continue  # fallen off the bus: no series
            starts = [t for fault, t in with_since if fault.gpu is None or fault.gpu == index]
            extra = list(fault_xids.get(index, ()))
            for x in healthy_xids.get(index, ()):
                if x in extra:
                    extra.remove(x)
            gpus.append(
                _Gpu(
                    index=index,
                    uuid=str(fleet.uuids[first + index]),
                    healthy=healthy.get(index, faulted[index]),
                    faulted=faulted[index],
                    healthy_xids=healthy_xids.get(index, ()),
                    fault_xids=tuple(extra),
                    since=min(starts) if starts else None,
                )
            )
        return gpus

    def _wave(
        self, fleet: Fleet, node: str, faults: tuple[Fault, ...]
    ) -> tuple[dict[int, dict[str, float]], dict[int, tuple[int, ...]]]:
        key = (id(fleet), node, faults)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        digest = hashlib.sha256(f"{self._seed}/dcgm/{node}".encode()).digest()
        wave = fleet.run(
            "dcgm",
            ts=self._ts,
            seed=int.from_bytes(digest[:8], "big"),
            repeats=1,
            repeats_of={},
            nodes=[node],
            faults=list(faults),
            pairs=False,
        )
        rows = wave.results
        tele: dict[int, dict[str, float]] = {}
        xids: dict[int, list[int]] = {}
        for gpu, metric, value in zip(
            rows["gpu"].tolist(), rows["metric"].astype(str).tolist(), rows["value"].tolist(), strict=True
        ):
            if gpu is None or gpu is pd.NA:
                continue
            if metric in _TELEMETRY:
                tele.setdefault(int(gpu), {})[metric] = float(value)
            elif metric == "xid":
                xids.setdefault(int(gpu), []).append(int(value))
        result = (tele, {g: tuple(v) for g, v in xids.items()})
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[key] = result
        return result


_TELEMETRY = frozenset(GPU_TELEMETRY_METRICS)


def _bus_id(index: int) -> str:
    bus = _BUS_IDS[index] if index < len(_BUS_IDS) else f"{0xE0 + index:02X}"
    return f"00000000:{bus}:00.0"


def _number(value: float | int) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    return f"{value:f}"


def routes(exporters: DcgmExporters) -> Sequence[tuple[str, str, Any]]:
    """The exporter routes to add to the simulator's application."""
    return [("GET", DCGM_PATH, exporters.handle)]
