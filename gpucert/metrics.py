"""The metric registry of DESIGN.md: every metric a results row may carry, its level and direction.

``level`` says which identity columns a row must fill: ``gpu`` rows name a GPU index (and UUID),
``node`` rows leave ``gpu`` empty, ``pair`` rows name a ``peer`` node. ``kind`` separates what is
judged statistically (``perf``) from what is read as a rule (``telemetry``), from events that may
repeat (``event``: XIDs and benchmark-step errors).

Every metric also has **physical bounds** (``gpucert/data/physical_bounds.csv``, each with its source):
the range no working or broken GPU can measure beyond. The bounds of ``ANY_MODEL`` hold for every GPU and
are what a results file is validated against; a GPU model's own, tighter ceilings (its spec peaks) keep
impossible performance values out of baselines.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # the in-pod payload imports this module with the standard library only
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "ANY_MODEL",
    "EVENT_METRICS",
    "METRICS",
    "NIC_METRICS",
    "PERF_METRICS",
    "RESULT_COLUMNS",
    "Bound",
    "Metric",
    "bound_arrays",
    "metric",
    "physical_bounds",
]

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

    @property
    def is_bandwidth_or_rate(self) -> bool:
        return self.kind == "perf"


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


def metric(name: str) -> Metric:
    """Return the registry entry for ``name``; raises ``KeyError`` for an unknown metric."""
    return METRICS[name]


# ---------------------------------------------------------------------------------------------------------
# Physical bounds

#: The ``gpu_model`` of a bound that holds for every GPU.
ANY_MODEL = "*"


@dataclass(frozen=True)
class Bound:
    """The inclusive range ``low``..``high`` a metric's value can physically take, and where it comes from."""

    low: float
    high: float
    source: str


@cache
def physical_bounds() -> dict[tuple[str, str], Bound]:
    """The shipped bounds, keyed by (GPU model or ``ANY_MODEL``, metric); raises ``ValueError`` if the shipped
    file is broken (a packaging bug, not a user's input)."""
    text = resources.files("gpucert").joinpath("data/physical_bounds.csv").read_text(encoding="utf-8")
    # Comment lines carry the file's explanation; csv has no comments of its own.
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    bounds: dict[tuple[str, str], Bound] = {}
    for row in csv.DictReader(lines):
        model, name = row["gpu_model"], row["metric"]
        low, high = float(row["low"]), float(row["high"])
        if name not in METRICS or not (math.isfinite(low) and math.isfinite(high) and 0 <= low <= high):
            raise ValueError(f"physical_bounds.csv: bad bound for {model!r} {name!r}")
        if (model, name) in bounds:
            raise ValueError(f"physical_bounds.csv: {model!r} {name!r} is given twice")
        bounds[(model, name)] = Bound(low, high, row["source"])
    missing = sorted(set(METRICS) - {name for model, name in bounds if model == ANY_MODEL})
    if missing:
        raise ValueError(f"physical_bounds.csv: no bound for any GPU of {', '.join(missing)}")
    return bounds


def bound_arrays(
    models: Sequence[str], metrics: Sequence[str], *, per_model: bool = True
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``(low, high)``, each of shape ``(len(models) + 1, len(metrics))``: the bounds of each model and metric.

    A model's own bound when ``per_model`` and the file has one, else the bound for any GPU; an unknown
    metric is unbounded (-inf, inf). The extra last row holds the bounds for any GPU, so that a
    categorical's missing code (-1) gathers them.
    """
    bounds = physical_bounds()
    import numpy as np

    low = np.full((len(models) + 1, len(metrics)), -np.inf)
    high = np.full((len(models) + 1, len(metrics)), np.inf)
    for j, name in enumerate(metrics):
        generic = bounds.get((ANY_MODEL, name))
        if generic is not None:
            low[:, j], high[:, j] = generic.low, generic.high
        if not per_model:
            continue
        for i, model in enumerate(models):
            own = bounds.get((model, name))
            if own is not None:
                low[i, j], high[i, j] = own.low, own.high
    return low, high
