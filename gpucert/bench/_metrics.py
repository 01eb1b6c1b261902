"""The metric registry (docs/reference/metrics.md): every metric a results row may carry, its level, kind
and direction, and the results contract's columns.

The payload owns these definitions (it writes the rows; standard library only) and :mod:`gpucert.metrics`
re-exports them beside the physical bounds: the dependency points from the product to the payload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["EVENT_METRICS", "METRICS", "NIC_METRICS", "PERF_METRICS", "RESULT_COLUMNS", "Kind", "Level", "Metric"]

Level = Literal["gpu", "node", "pair"]
Kind = Literal["perf", "telemetry", "event"]

#: The results contract, in order.
RESULT_COLUMNS: tuple[str, ...] = (
    "run_id",
    "node",
    "gpu",
    "gpu_uuid",
    "gpu_model",
    "metric",
    "value",
    "repeat",
    "peer",
    "ts",
)


@dataclass(frozen=True)
class Metric:
    name: str
    level: Level
    kind: Kind
    unit: str
    #: +1 when higher is better, -1 when lower is better, 0 for telemetry read by rules.
    direction: int = 0
    optional: bool = False


def _perf(name: str, level: Level, unit: str, *, optional: bool = False) -> Metric:
    return Metric(name, level, "perf", unit, direction=+1, optional=optional)


def _tele(name: str, unit: str, level: Level = "gpu") -> Metric:
    return Metric(name, level, "telemetry", unit)


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        _perf("gemm_bf16_tflops", "gpu", "TFLOPS"),
        _perf("gemm_fp8_tflops", "gpu", "TFLOPS", optional=True),
        _perf("hbm_copy_gbps", "gpu", "GB/s"),
        _perf("h2d_gbps", "gpu", "GB/s"),
        _perf("d2h_gbps", "gpu", "GB/s"),
        _perf("nccl_allreduce_busbw_gbps", "node", "GB/s"),
        _perf("nccl_pair_busbw_gbps", "pair", "GB/s"),
        _perf("storage_read_gbps", "node", "GB/s", optional=True),
        _tele("pcie_gen", "generation"),
        _tele("pcie_gen_max", "generation"),
        _tele("pcie_width", "lanes"),
        _tele("pcie_width_max", "lanes"),
        _tele("pcie_replays_per_min", "1/min"),
        _tele("clocks_event_reasons", "bitmask"),
        _tele("hw_slowdown_frac", "fraction"),
        _tele("temp_max_c", "°C"),
        _tele("temp_slowdown_c", "°C"),
        _tele("power_limit_w", "W"),
        _tele("power_limit_default_w", "W"),
        _tele("ecc_dbe_volatile", "count"),
        _tele("ecc_sbe_volatile", "count"),
        _tele("remapped_rows_pending", "flag"),
        _tele("remapped_rows_failure", "flag"),
        _tele("nvlink_down", "links"),
        _tele("nvlink_crc_errors", "count"),
        _tele("gpu_count", "GPUs", level="node"),
        _tele("gpu_count_expected", "GPUs", level="node"),
        # The node's RDMA NICs (/sys/class/infiniband in the payload, node-exporter's infiniband collector in
        # operate): ports found and ACTIVE, the slowest and fastest active port's rate, and each error
        # counter's increase during the benchmark (or the window), summed over the node's ports.
        _tele("ib_ports", "ports", level="node"),
        _tele("ib_ports_active", "ports", level="node"),
        _tele("ib_rate_min_gbps", "Gb/s", level="node"),
        _tele("ib_rate_max_gbps", "Gb/s", level="node"),
        _tele("ib_symbol_errors", "count", level="node"),
        _tele("ib_link_downed", "count", level="node"),
        _tele("ib_rcv_errors", "count", level="node"),
        # Events: one row per occurrence, so rows may repeat. ``error`` is written at the level of the
        # step that failed (a GPU benchmark or a node-wide one), so it may have either shape.
        Metric("xid", "gpu", "event", "code"),
        Metric("error", "gpu", "event", "flag"),
    )
}

PERF_METRICS: tuple[str, ...] = tuple(n for n, m in METRICS.items() if m.kind == "perf")
EVENT_METRICS: frozenset[str] = frozenset(n for n, m in METRICS.items() if m.kind == "event")
#: The node-level RDMA NIC telemetry, in registry order.
NIC_METRICS: tuple[str, ...] = tuple(n for n in METRICS if n.startswith("ib_"))
