"""The fleet model: simulated GPUs with fixed identities, healthy noise, and benchmark waves over them.

One model feeds the tests, the detection benchmark, the demo and the simulated cluster, so all of them
see the same statistics. It encodes docs/reference/reference-values.md and
docs/design/simulator.md:

* the healthy reference values, per GPU model (:data:`MODELS`): sustained BF16 GEMM ≈730 TFLOPS, HBM copy
  2.90 / 4.01 TB/s, PCIe H2D/D2H 51-52 GB/s, 8-GPU NVLS all-reduce 478.9 / 480 GB/s, and ≈370 GB/s per
  node for a two-node all-reduce without in-network reduction;
* the noise model (:class:`NoiseModel`, the "Simulator start value" column) and the healthy generator::

      x = base_m · (1+ε_unit[g,m]) · (1+ε_node[n,m]) · (1+ε_rep[g,m,r]) · (1+ε_day)
          · slow_silicon[g] · (1+fleet_shift_m) · fault effects

  ``ε_unit``, ``ε_node`` and the optional slow-silicon heavy tail are drawn once, when a GPU or node
  joins the fleet (:meth:`Fleet.generate`, :meth:`Fleet.replace_gpus`, :meth:`Fleet.add_nodes`): they are
  the hardware's identity, the thing a GPU's own baseline learns. ``ε_rep``, transient bad samples,
  ``ε_day`` and faults belong to one wave (:meth:`Fleet.run`);
* the payload's adaptive repeats: a result whose ``repeats`` disagree by the payload's own rule
  (``gpucert/bench/_stability.py``, the verdict engine's rule with the policy's expected CVs) gets more,
  drawn the same way, up to ``max_repeats``, as the in-pod payload measures until its repeats agree;
* §3 fault effects, through the catalog in ``_faults.py``;
* the fabric: nodes under leaf switches and leaves in zones (:meth:`Fleet.topology`, the labels the
  simulated cluster gives its Nodes and the pairing plan reads). A two-node all-reduce runs at the pace of
  its slower end times what the path between the two leaves adds (a slow uplink: a fabric fault). Pairs
  come as a ring of the wave (``pairs=True``) or as a list (``pairs=[(a, b), …]``, what a pairing plan's
  round or one pair Job measures), each listed pair drawn from a stream keyed on the seed and its two node
  names, so a pair measures the same in any list and both pods of its Job log the same values;
* host readings a wave takes when asked: each node's storage read (``storage=True``, a 10 GB/s estimate)
  and its InfiniBand ports (``nic=True``: ports found and ACTIVE, slowest and fastest rate, error counters).

Everything is vectorised over GPUs with numpy (the Python loops run over metric names and the handful
of injected faults), so 100,000 GPUs generate and run in one to two seconds, and every draw comes from a
seed: the same seeds give the same frame. Noise is drawn for the whole fleet in a fixed order before
anything is selected, so a GPU measures the same in a wave of its node alone as in a wave of the whole
fleet, and injecting a fault changes only what that fault touches: the healthy wave with the same seed
is the fault's exact counterfactual.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache, cached_property
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpucert.bench import DEFAULT_MAX_REPEATS, DEFAULT_REPEATS_OF, MIN_JUDGED, RepeatRule
from gpucert.metrics import METRICS, PERF_METRICS, RESULT_COLUMNS
from gpucert.verdict import repeat_matrix_stability

from ._faults import (
    D2H,
    FAULTS,
    GEMM,
    H2D,
    HBM,
    NCCL,
    NIC_LOWER_IS_WORSE,
    NIC_TELEMETRY,
    PAIR,
    STORAGE,
    SW_POWER_CAP,
    Fault,
    ResolvedFault,
)

__all__ = [
    "DEFAULT_NOISE",
    "GPU_PERF_METRICS",
    "GPU_TELEMETRY_METRICS",
    "LEAF_LABEL",
    "MODELS",
    "NIC_METRICS",
    "NODE_PERF_METRICS",
    "ZONE_LABEL",
    "Fleet",
    "ModelSpec",
    "NoiseModel",
    "Wave",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
I32Array = npt.NDArray[np.int32]
U64Array = npt.NDArray[np.uint64]

#: Per-GPU benchmarks, in the column order of :attr:`Fleet.unit_factors`.
GPU_PERF_METRICS: tuple[str, ...] = (GEMM, HBM, H2D, D2H)
#: Node-level benchmarks, after the GPU ones in the column order of :attr:`Fleet.node_factors`.
NODE_PERF_METRICS: tuple[str, ...] = (NCCL, PAIR)
_ALL_PERF = GPU_PERF_METRICS + NODE_PERF_METRICS
#: Telemetry written once per GPU per wave (repeat 0), in row order.
GPU_TELEMETRY_METRICS: tuple[str, ...] = (
    "pcie_gen",
    "pcie_gen_max",
    "pcie_width",
    "pcie_width_max",
    "pcie_replays_per_min",
    "clocks_event_reasons",
    "hw_slowdown_frac",
    "temp_max_c",
    "temp_slowdown_c",
    "power_limit_w",
    "power_limit_default_w",
    "ecc_dbe_volatile",
    "ecc_sbe_volatile",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "nvlink_down",
    "nvlink_crc_errors",
)
_TELE = {m: i for i, m in enumerate(GPU_TELEMETRY_METRICS)}
# A fault's telemetry reading combines with what is already there by the worse of the two, so two
# faults on one GPU compose in any order: lower is worse for these, higher for every other reading.
_LOWER_IS_WORSE = frozenset({"pcie_gen", "pcie_width", "power_limit_w"})
_METRIC_CODE = {m: i for i, m in enumerate(METRICS)}
_METRIC_CATEGORIES = pd.Index(list(METRICS))
#: Application errors: a healthy GPU may log them (docs/reference/causes-and-actions.md, "XID classes").
_APP_XIDS = np.array([13, 31, 43])
_RUN_ID = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
#: The NIC telemetry the wave writes with ``nic=True``: those of :data:`NIC_TELEMETRY` the metric registry
#: knows (a results row may carry no other metric), in that order.
NIC_METRICS: tuple[str, ...] = tuple(m for m in NIC_TELEMETRY if m in METRICS)
#: Node labels of the fabric (what :meth:`Fleet.topology` names its columns and the simulator labels its
#: Nodes with): the well-known zone label and gpucert's leaf-switch (rack) label, as the pairing plan
#: (:func:`gpucert.network.plan_rounds`) reads them.
ZONE_LABEL = "topology.kubernetes.io/zone"
LEAF_LABEL = "gpucert.io/leaf"


@dataclass(frozen=True)
class ModelSpec:
    """A GPU model's healthy behaviour: the peer cohort's centre before any noise
    (docs/reference/reference-values.md)."""

    name: str
    #: Healthy value per performance metric (both per-GPU and node/pair metrics).
    base: Mapping[str, float]
    temp_slowdown_c: float = 89.0
    power_limit_default_w: float = 700.0
    nvlinks: int = 18
    pcie_gen_max: int = 5
    pcie_width_max: int = 16
    #: InfiniBand ports per node and their healthy rate: 8 × 400 Gb/s NDR, one per GPU
    #: (docs/reference/reference-values.md).
    ib_ports: int = 8
    ib_rate_gbps: float = 400.0


# Sequential read of the node's storage mount, large blocks: 10 GB/s is an estimate, to be calibrated (no
# published figure in docs/reference/reference-values.md): what a local NVMe RAID-0 of a few Gen4 drives
# sustains, and the order of a parallel file system's per-client ceiling over one 100-200 Gb/s front-end link.
# It is the host's, not the GPU's, so both models share it.
_STORAGE_READ_GBPS = 10.0

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec(
            "NVIDIA H100 80GB HBM3",
            base={
                GEMM: 730.0,
                HBM: 2900.0,
                H2D: 51.0,
                D2H: 52.0,
                NCCL: 478.9,
                PAIR: 370.0,
                STORAGE: _STORAGE_READ_GBPS,
            },
        ),
        ModelSpec(
            # H200 GEMM is not published; docs/reference/reference-values.md gives MAMF as "same as H100", so
            # the H100 burn.
            "NVIDIA H200",
            base={
                GEMM: 730.0,
                HBM: 4010.0,
                H2D: 52.0,
                D2H: 52.0,
                NCCL: 480.0,
                PAIR: 370.0,
                STORAGE: _STORAGE_READ_GBPS,
            },
        ),
    )
}


def _cv_rep() -> dict[str, float]:
    # Storage: the payload's expected CV for it (gpucert/bench/_stability.py), an estimate too.
    return {GEMM: 0.007, HBM: 0.004, H2D: 0.015, D2H: 0.015, NCCL: 0.01, PAIR: 0.04, STORAGE: 0.03}


def _cv_unit() -> dict[str, float]:
    # Node and pair benchmarks have no unit of their own: the node factor carries their spread.
    return {GEMM: 0.015, HBM: 0.008, H2D: 0.02, D2H: 0.02}


def _cv_node() -> dict[str, float]:
    # Pair busbw takes both ends' factor: ≈1.4 % between pairs, below its 4 % run-to-run noise. Storage
    # mounts differ more between nodes (drive lots, RAID layout, the file system's client): an estimate.
    return {GEMM: 0.005, HBM: 0.003, H2D: 0.01, D2H: 0.01, NCCL: 0.015, PAIR: 0.01, STORAGE: 0.03}


@dataclass(frozen=True)
class NoiseModel:
    """Healthy variation, as relative standard deviations (docs/reference/reference-values.md, "Noise model":
    "Simulator start value").

    ``cv_unit`` is fixed per GPU and ``cv_node`` per node when they join the fleet; ``cv_rep`` is drawn
    per repeat. All are estimates, to be replaced by the calibration protocol's measurements.
    """

    cv_rep: Mapping[str, float] = field(default_factory=_cv_rep)
    cv_unit: Mapping[str, float] = field(default_factory=_cv_unit)
    cv_node: Mapping[str, float] = field(default_factory=_cv_node)
    #: Multiplies every ``cv_rep``: run the benchmark at 0.5-1.2 % run-to-run noise without retyping.
    rep_scale: float = 1.0
    #: Peak-to-trough of the ambient-temperature swing, trough at 12:00 UTC (Llama 3 saw 1-2 %).
    diurnal_amplitude: float = 0.015
    #: Chance that one repeat is a transient bad sample (a noisy neighbour, a hiccup), ×U(range).
    transient_rate: float = 0.005
    transient_range: tuple[float, float] = (0.70, 0.95)
    #: Chance that a GPU is born slow (no signature): GEMM ×U(range), HBM a third as much.
    slow_silicon_rate: float = 0.005
    slow_silicon_range: tuple[float, float] = (0.90, 0.97)
    #: Chance per GPU per wave of an application XID (13, 31 or 43) that must not flag the GPU.
    app_xid_rate: float = 0.002
    #: Share of healthy GPUs that show SwPowerCap (0x4): normal at TDP under a GEMM burn.
    sw_power_cap_rate: float = 0.5
    #: Share of healthy GPUs with a few PCIe replays (under one a minute) or a few SBEs in a wave.
    replay_blip_rate: float = 0.01
    sbe_blip_rate: float = 0.002
    #: Healthy GPUs run at a fixed per-GPU peak temperature in this range (cooling position), ±1 °C.
    temp_range_c: tuple[float, float] = (58.0, 72.0)

    def __post_init__(self) -> None:
        for name, table, allowed in (
            ("cv_rep", self.cv_rep, (*_ALL_PERF, STORAGE)),
            ("cv_unit", self.cv_unit, GPU_PERF_METRICS),
            ("cv_node", self.cv_node, (*_ALL_PERF, STORAGE)),
        ):
            bad = set(table) - set(allowed)
            if bad:
                raise ValueError(f"NoiseModel.{name}: no such metric(s) {sorted(bad)}; known: {allowed}")
            if any(v < 0 for v in table.values()):
                raise ValueError(f"NoiseModel.{name}: a coefficient of variation cannot be negative")
        for name in (
            "transient_rate",
            "slow_silicon_rate",
            "app_xid_rate",
            "sw_power_cap_rate",
            "replay_blip_rate",
            "sbe_blip_rate",
        ):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"NoiseModel.{name} is a probability: {getattr(self, name)}")
        if self.rep_scale < 0:
            raise ValueError("NoiseModel.rep_scale cannot be negative")

    def vector(self, table: Mapping[str, float], metrics: Sequence[str]) -> FloatArray:
        return np.array([table.get(m, 0.0) for m in metrics], dtype=np.float64)


DEFAULT_NOISE = NoiseModel()


@dataclass(frozen=True, eq=False)
class Wave:
    """One benchmark wave: the results contract frame and one truth row per injected fault.

    ``truth`` columns: ``kind``, ``node`` (empty for a fabric fault: a fleet-level finding), ``gpu``
    (Int64, <NA> for node and fabric faults), ``gpu_uuid``, ``scope`` (``gpu``/``node``/``fabric``),
    ``expected_cause``, ``signature`` (it emits telemetry that names it), ``cost`` (the largest fractional
    loss it causes on its GPU's, node's or link's metrics from the drawn parameters; 1.0 when a value goes
    missing) and ``params`` (the drawn values, a dict; a fabric fault's leaves as leaf numbers).
    """

    results: pd.DataFrame
    truth: pd.DataFrame


@dataclass(frozen=True, eq=False)
class Fleet:
    """A fleet of identical nodes of one GPU model, with each GPU's and node's fixed hardware identity.

    GPU ``g`` (0-based over the fleet) is index ``g % gpus_per_node`` on node ``g // gpus_per_node``;
    the per-GPU arrays are in that order. Build one with :meth:`generate`; the other methods return a
    new fleet and leave this one as it was.

    The fabric: nodes sit under leaf switches (racks) in fleet order, ``nodes_per_leaf`` to a leaf, and
    leaves in zones, ``leaves_per_zone`` to a zone (:meth:`topology`). A pair of nodes measures at the
    pace of its slower end, times what the path between their leaves adds (a slow uplink).
    """

    model: ModelSpec
    noise: NoiseModel
    gpus_per_node: int
    node_prefix: str
    node_names: list[str]
    #: NVML UUID per GPU, ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``.
    uuids: npt.NDArray[np.str_]
    #: (1 + ε_unit) per GPU and metric of :data:`GPU_PERF_METRICS`.
    unit_factors: FloatArray
    #: (1 + ε_node) per node and metric of :data:`GPU_PERF_METRICS` + :data:`NODE_PERF_METRICS`.
    node_factors: FloatArray
    #: GEMM factor of the slow-silicon heavy tail per GPU; 1.0 for most GPUs.
    slow_silicon: FloatArray
    #: Each GPU's healthy peak temperature under load (its position in the airflow).
    temp_base_c: FloatArray
    #: (1 + ε_node) of each node's storage read: its mount's own speed.
    storage_factors: FloatArray
    #: Nodes per leaf switch: node ``i`` is on leaf ``i // nodes_per_leaf``.
    nodes_per_leaf: int = 8
    #: Leaves per zone: leaf ``k`` is in zone ``k // leaves_per_zone``.
    leaves_per_zone: int = 4

    def __repr__(self) -> str:
        return f"Fleet(model={self.model.name!r}, nodes={self.n_nodes}, gpus_per_node={self.gpus_per_node})"

    # --- building -----------------------------------------------------------------------------------

    @classmethod
    def generate(
        cls,
        *,
        nodes: int,
        gpus_per_node: int = 8,
        model: str = "NVIDIA H200",
        seed: int = 0,
        noise: NoiseModel = DEFAULT_NOISE,
        node_prefix: str = "gpu-node",
        nodes_per_leaf: int = 8,
        leaves_per_zone: int = 4,
    ) -> Fleet:
        """A fleet of ``nodes`` × ``gpus_per_node`` GPUs, every identity drawn from ``seed``, its nodes
        ``nodes_per_leaf`` to a leaf switch and its leaves ``leaves_per_zone`` to a zone."""
        if model not in MODELS:
            raise ValueError(f"unknown GPU model {model!r}; known: {sorted(MODELS)}")
        if nodes < 0 or gpus_per_node < 1:
            raise ValueError("need nodes >= 0 and gpus_per_node >= 1")
        if nodes_per_leaf < 1 or leaves_per_zone < 1:
            raise ValueError("need nodes_per_leaf >= 1 and leaves_per_zone >= 1")
        spec = MODELS[model]
        draws = _Streams(seed, 1)
        node_factors = _draw_nodes(draws, nodes, noise)
        uuids, unit, slow, temp = _draw_gpus(draws, nodes * gpus_per_node, noise)
        storage = _draw_storage(draws, nodes, noise)  # last: the draws before it stay what they were
        return cls(
            model=spec,
            noise=noise,
            gpus_per_node=gpus_per_node,
            node_prefix=node_prefix,
            node_names=_node_names(node_prefix, 0, nodes),
            uuids=uuids,
            unit_factors=unit,
            node_factors=node_factors,
            slow_silicon=slow,
            temp_base_c=temp,
            storage_factors=storage,
            nodes_per_leaf=nodes_per_leaf,
            leaves_per_zone=leaves_per_zone,
        )

    def replace_gpus(self, fraction: float, *, seed: int) -> Fleet:
        """Swap ``round(fraction · GPUs)`` GPUs picked at random for new ones: new UUIDs, new identities.

        The swapped GPUs have no history, as after an RMA or a baseboard swap.
        """
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be within [0, 1]: {fraction}")
        draws = _Streams(seed, 2)
        picked = draws().choice(self.n_gpus, size=round(fraction * self.n_gpus), replace=False)
        uuids, unit, slow, temp = _draw_gpus(draws, len(picked), self.noise)
        new = {
            "uuids": self.uuids.copy(),
            "unit_factors": self.unit_factors.copy(),
            "slow_silicon": self.slow_silicon.copy(),
            "temp_base_c": self.temp_base_c.copy(),
        }
        for name, values in zip(new, (uuids, unit, slow, temp), strict=True):
            new[name][picked] = values
        return self._with(**new)

    def add_nodes(self, count: int, *, seed: int) -> Fleet:
        """``count`` new nodes, named after the existing ones, with new GPUs and identities; they fill the
        last leaf and then new ones, as racks are filled."""
        if count < 0:
            raise ValueError("count must be >= 0")
        draws = _Streams(seed, 3)
        names = _node_names(self.node_prefix, self.n_nodes, count)
        clash = set(names) & set(self.node_names)
        if clash:
            raise ValueError(f"node names already in the fleet: {sorted(clash)[:5]}")
        node_factors = _draw_nodes(draws, count, self.noise)
        uuids, unit, slow, temp = _draw_gpus(draws, count * self.gpus_per_node, self.noise)
        storage = _draw_storage(draws, count, self.noise)
        return self._with(
            node_names=[*self.node_names, *names],
            node_factors=np.concatenate([self.node_factors, node_factors]),
            uuids=np.concatenate([self.uuids, uuids]),
            unit_factors=np.concatenate([self.unit_factors, unit]),
            slow_silicon=np.concatenate([self.slow_silicon, slow]),
            temp_base_c=np.concatenate([self.temp_base_c, temp]),
            storage_factors=np.concatenate([self.storage_factors, storage]),
        )

    def _with(self, **changes: Any) -> Fleet:
        fields = {
            name: getattr(self, name)
            for name in (
                "model",
                "noise",
                "gpus_per_node",
                "node_prefix",
                "node_names",
                "uuids",
                "unit_factors",
                "node_factors",
                "slow_silicon",
                "temp_base_c",
                "storage_factors",
                "nodes_per_leaf",
                "leaves_per_zone",
            )
        }
        return Fleet(**{**fields, **changes})

    # --- looking ------------------------------------------------------------------------------------

    @property
    def n_nodes(self) -> int:
        return len(self.node_names)

    @property
    def n_gpus(self) -> int:
        return len(self.uuids)

    @cached_property
    def node_index(self) -> dict[str, int]:
        """Position of each node name in :attr:`node_names`."""
        return {name: i for i, name in enumerate(self.node_names)}

    @cached_property
    def node_categories(self) -> pd.Index:
        """:attr:`node_names` as the categories of a results frame's ``node`` and ``peer`` (made once: a
        wave of one node, the simulator's pod, would otherwise pay for the whole fleet's names)."""
        return pd.Index(self.node_names)

    @cached_property
    def uuid_categories(self) -> pd.Index:
        """:attr:`uuids` as the categories of a results frame's ``gpu_uuid`` (made once, as above)."""
        return pd.Index(self.uuids)

    # --- the fabric -----------------------------------------------------------------------------------

    @cached_property
    def leaf_index(self) -> IntArray:
        """The leaf number of each node, in :attr:`node_names` order."""
        return np.arange(self.n_nodes, dtype=np.int64) // self.nodes_per_leaf

    @property
    def n_leaves(self) -> int:
        return -(-self.n_nodes // self.nodes_per_leaf)

    @property
    def leaf_names(self) -> list[str]:
        """The leaf label's value of each leaf number: ``leaf-00``, ``leaf-01``, …"""
        return [_leaf_name(k) for k in range(self.n_leaves)]

    def leaf_of(self, node: str) -> str:
        """The leaf label's value of ``node`` (``KeyError`` for a node not in the fleet)."""
        return _leaf_name(int(self.leaf_index[self.node_index[node]]))

    def zone_of(self, node: str) -> str:
        """The zone label's value of ``node``: ``zone-a``, ``zone-b``, …"""
        return _zone_name(int(self.leaf_index[self.node_index[node]]) // self.leaves_per_zone)

    def leaf_number(self, leaf: str | float) -> int:
        """The number of a leaf given by name (``leaf-03``) or number; ``ValueError`` for no leaf of the fleet."""
        if isinstance(leaf, str):
            match = re.fullmatch(r"leaf-(\d+)", leaf)
            number = int(match.group(1)) if match else -1
        else:
            number = int(leaf) if float(leaf).is_integer() else -1
        if not 0 <= number < self.n_leaves:
            raise ValueError(
                f"no leaf {leaf!r} in the fleet; it has {self.n_leaves}: leaf-00 … "
                f"{_leaf_name(max(self.n_leaves - 1, 0))}"
            )
        return number

    def topology(self, *, leaf_label: str = LEAF_LABEL, zone_label: str = ZONE_LABEL) -> pd.DataFrame:
        """One row per node: ``node``, then its zone and leaf under the label keys as columns, the nodes
        table :func:`gpucert.network.plan_rounds` takes (``leaf_label=LEAF_LABEL``)."""
        leaf = self.leaf_index
        leaves = np.array(self.leaf_names, dtype=object)
        zones = np.array([_zone_name(z) for z in range(-(-self.n_leaves // self.leaves_per_zone))], dtype=object)
        return pd.DataFrame(
            {"node": self.node_names, zone_label: zones[leaf // self.leaves_per_zone], leaf_label: leaves[leaf]}
        )

    def gpu_table(self) -> pd.DataFrame:
        """One row per GPU: ``node``, ``gpu``, ``gpu_uuid`` and its baked-in ``slow_silicon`` factor.

        Slow silicon born into the fleet is ground truth too (a detector should find it), but it is no
        injected fault, so it is here and not in a wave's truth.
        """
        g = np.arange(self.n_gpus)
        return pd.DataFrame(
            {
                "node": pd.Categorical.from_codes(g // self.gpus_per_node, categories=self.node_categories),
                "gpu": (g % self.gpus_per_node).astype(np.int64),
                "gpu_uuid": self.uuids,
                "slow_silicon": self.slow_silicon,
            }
        )

    # --- running ------------------------------------------------------------------------------------

    def run(
        self,
        run_id: str,
        *,
        ts: datetime,
        repeats: int = 3,
        max_repeats: int = DEFAULT_MAX_REPEATS,
        repeats_of: Mapping[str, int] = DEFAULT_REPEATS_OF,
        faults: Sequence[Fault] = (),
        seed: int,
        fleet_shift: Mapping[str, float] | float = 0.0,
        nodes: Sequence[str] | None = None,
        pairs: bool | Sequence[tuple[str, str]] = False,
        storage: bool = False,
        nic: bool = False,
        wave_draws: bool = False,
    ) -> Wave:
        """Benchmark the fleet once (or ``nodes`` of it, in fleet order) and return results and truth.

        ``ts`` stamps every row (a naive datetime is taken as UTC) and sets the diurnal term.
        ``fleet_shift`` is a fleet-wide relative shift on performance metrics (``-0.02``: a new driver
        makes everything 2 % slower), one number for all or a dict per metric. ``pairs=True`` adds a
        two-node all-reduce for a ring of the wave's nodes (each with the next; the last with the
        first). ``pairs=[(node_a, node_b), …]`` measures those pairs instead (both nodes in the wave, each
        unordered pair once; rows name ``node_a`` with ``peer`` ``node_b``): each pair's noise comes from a
        stream keyed on the seed and its two node names, sorted, so a pair measures the same whichever way
        round and wherever it stands in the list, and both pods of a pair Job can log the same values. A
        pair runs at the pace of its slower end, times the fabric between the two leaves (a slow uplink).
        ``storage=True`` adds each node's ``storage_read_gbps``; ``nic=True`` each node's InfiniBand port
        telemetry (:data:`NIC_METRICS`). Faults on nodes outside the wave are not observed and leave no
        truth row; a fabric fault is observed when the wave has nodes under both of its leaves.
        A result whose ``repeats`` disagree gets more, up to ``max_repeats`` (the payload's
        ``--max-repeats``; ``max_repeats=repeats`` turns that off), each drawn like the first ones.
        ``repeats_of`` gives metrics measured more often than ``repeats`` (the payload's ``--repeats-of``).
        ``wave_draws=True`` draws the run's noise for the wave's GPUs and nodes only, not the whole fleet's
        before selecting: a node's values then depend on which nodes share its wave, so use it for a wave
        of one node under a seed of its own (the simulator's pods: O(node), not O(fleet), per pod).
        """
        if not _RUN_ID.match(run_id):
            raise ValueError(f"run_id must be a DNS label (≤ 63 of a-z0-9-): {run_id!r}")
        if repeats < 1:
            raise ValueError("repeats must be >= 1")
        rule = RepeatRule(repeats=repeats, max_repeats=max(repeats, max_repeats), repeats_of=tuple(repeats_of.items()))
        width = max(rule.ceiling(m) for m in (*GPU_PERF_METRICS, NCCL, PAIR))
        ts = ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)
        shift = 1.0 + self._shift_vector(fleet_shift)
        hour = ts.hour + ts.minute / 60 + ts.second / 3600
        day = 1.0 - self.noise.diurnal_amplitude * (1.0 - np.cos(2 * np.pi * hour / 24)) / 2
        wave_nodes = self._wave_nodes(nodes)

        explicit = self._explicit_pairs(pairs, wave_nodes)

        eff = _Effects(self)
        truth = [eff.inject(f, seed) for f in self._checked(faults, wave_nodes)]
        rows = _Rows()
        drift = shift * day
        parts = [self._gpu_rows, self._node_rows] + ([self._pair_rows] if pairs is True else [])
        for part in parts:
            part(
                rows, eff, wave_nodes=wave_nodes, rule=rule, width=width, seed=seed, drift=drift, wave_draws=wave_draws
            )
        if explicit is not None:
            self._listed_pair_rows(rows, eff, explicit, rule=rule, width=width, seed=seed, drift=drift)
        if storage:
            self._storage_rows(
                rows,
                eff,
                wave_nodes=wave_nodes,
                rule=rule,
                seed=seed,
                shift=1.0 + self._storage_shift(fleet_shift),
                wave_draws=wave_draws,
            )
        if nic:
            self._nic_rows(rows, eff, wave_nodes)
        results = rows.frame(self, run_id, ts)
        return Wave(results=results, truth=_truth_frame(truth))

    def _shift_vector(self, fleet_shift: Mapping[str, float] | float) -> FloatArray:
        if isinstance(fleet_shift, Mapping):
            bad = set(fleet_shift) - set(PERF_METRICS)
            if bad:
                raise ValueError(f"fleet_shift: not performance metrics: {sorted(bad)}")
            return np.array([float(fleet_shift.get(m, 0.0)) for m in _ALL_PERF])
        return np.full(len(_ALL_PERF), float(fleet_shift))

    @staticmethod
    def _storage_shift(fleet_shift: Mapping[str, float] | float) -> float:
        if isinstance(fleet_shift, Mapping):
            return float(fleet_shift.get(STORAGE, 0.0))
        return float(fleet_shift)

    def _explicit_pairs(
        self, pairs: bool | Sequence[tuple[str, str]], wave_nodes: IntArray
    ) -> tuple[IntArray, IntArray] | None:
        """The listed pairs as fleet node numbers (None for ``pairs`` True or False), each checked."""
        if isinstance(pairs, bool):
            return None
        if isinstance(pairs, str):
            raise TypeError("pairs is True, False or a sequence of (node, node) pairs, not a node name")
        in_wave, seen = set(wave_nodes.tolist()), set()
        a, b = [], []
        for i, pair in enumerate(pairs):
            if isinstance(pair, str) or len(pair) != 2:
                raise TypeError(f"pairs[{i}] is not a (node, node) pair: {pair!r}")
            x, y = (self.node_index.get(str(n), -1) for n in pair)
            if x < 0 or y < 0:
                raise ValueError(f"pairs[{i}] {tuple(pair)}: node not in the fleet")
            if x not in in_wave or y not in in_wave:
                raise ValueError(f"pairs[{i}] {tuple(pair)}: both nodes must be in the wave's nodes")
            if x == y:
                raise ValueError(f"pairs[{i}] {tuple(pair)}: a pair is two nodes")
            key = (min(x, y), max(x, y))
            if key in seen:
                raise ValueError(f"pairs[{i}] {tuple(pair)}: the pair is listed twice")
            seen.add(key)
            a.append(x)
            b.append(y)
        return np.array(a, dtype=np.int64), np.array(b, dtype=np.int64)

    def _wave_nodes(self, nodes: Sequence[str] | None) -> IntArray:
        if nodes is None:
            return np.arange(self.n_nodes, dtype=np.int64)
        if isinstance(nodes, str):
            raise TypeError("nodes is a sequence of node names, not one name")
        unknown = [n for n in nodes if n not in self.node_index]
        if unknown:
            raise ValueError(f"nodes not in the fleet: {unknown[:5]}")
        return np.unique(np.array([self.node_index[n] for n in nodes], dtype=np.int64))

    def _checked(self, faults: Sequence[Fault], wave_nodes: IntArray) -> list[tuple[Fault, int]]:
        """The faults the wave observes, each with its node number (-1 for a fabric fault)."""
        in_wave = set(wave_nodes.tolist())
        checked = []
        for f in faults:
            spec = FAULTS.get(f.kind)
            if spec is None:
                raise ValueError(f"unknown fault kind {f.kind!r}; the catalog has {sorted(FAULTS)}")
            if spec.scope == "fabric":
                if self._fabric_observed(f, wave_nodes):
                    checked.append((f, -1))
                continue
            if f.node not in self.node_index:
                raise ValueError(f"fault {f.kind!r} on {f.node!r}: no such node in the fleet")
            if spec.scope == "gpu" and (f.gpu is None or not 0 <= f.gpu < self.gpus_per_node):
                raise ValueError(f"fault {f.kind!r} needs a GPU index 0..{self.gpus_per_node - 1}: {f.gpu}")
            if spec.scope == "node" and f.gpu is not None:
                raise ValueError(f"fault {f.kind!r} is node-wide: leave gpu empty")
            n = self.node_index[f.node]
            if n in in_wave:
                checked.append((f, n))
        return checked

    def _fabric_observed(self, f: Fault, wave_nodes: IntArray) -> bool:
        """Checks a fabric fault (no node or GPU; two distinct leaves of the fleet); whether the wave has
        nodes under both its leaves."""
        if f.node or f.gpu is not None:
            raise ValueError(f"fault {f.kind!r} is in the fabric: leave node and gpu empty")
        spec = FAULTS[f.kind]
        missing = [name for name in spec.needs if name not in f.params]
        if missing:
            raise ValueError(f"fault {f.kind!r} needs the parameter(s) {missing}")
        leaf_a, leaf_b = (self.leaf_number(f.params[name]) for name in ("leaf_a", "leaf_b"))
        if leaf_a == leaf_b:
            raise ValueError(f"fault {f.kind!r}: an uplink joins two leaves, not leaf {leaf_a} to itself")
        present = set(self.leaf_index[wave_nodes].tolist())
        return leaf_a in present and leaf_b in present

    def _gpu_rows(
        self,
        rows: _Rows,
        eff: _Effects,
        *,
        wave_nodes: IntArray,
        rule: RepeatRule,
        width: int,
        seed: int,
        drift: FloatArray,
        wave_draws: bool = False,
    ) -> None:
        """Per-GPU benchmarks (``rule``'s base repeats each, more where they disagree), telemetry and
        events of the wave's GPUs."""
        noise, model, per_node, repeats = self.noise, self.model, self.gpus_per_node, rule.repeats
        k = len(GPU_PERF_METRICS)
        g = (wave_nodes[:, None] * per_node + np.arange(per_node)).ravel()
        # Whole-fleet draws in a fixed order, before any selection (see the module docstring), unless the
        # caller asked for the wave's own; ``pick`` takes the wave's GPUs out of either.
        draws, n = _Streams(seed, 0), (len(g) if wave_draws else self.n_gpus)
        pick = np.arange(len(g)) if wave_draws else g
        cv = noise.vector(noise.cv_rep, GPU_PERF_METRICS) * noise.rep_scale
        rep = 1.0 + draws().standard_normal((n, k, repeats)) * cv[None, :, None]
        rep *= _transients(draws(), rep.shape, noise)
        temp_noise = draws().standard_normal(n)
        cap_bit = draws().random(n) < noise.sw_power_cap_rate
        # (whether, how much) pairs from one stream: [:, 0] decides, [:, 1] sizes.
        u = draws().random((n, 2))
        replay = np.where(u[:, 0] < noise.replay_blip_rate, 0.05 + 0.95 * u[:, 1], 0)
        u = draws().random((n, 2))
        sbe = np.where(u[:, 0] < noise.sbe_blip_rate, 1 + np.floor(3 * u[:, 1]), 0)
        u = draws().random((n, 2))
        app_xid = np.where(u[:, 0] < noise.app_xid_rate, _APP_XIDS[(len(_APP_XIDS) * u[:, 1]).astype(int)], 0)
        # The repeats the payload may add come last, so the draws above stay what they were without them.
        rep = _more_repeats(draws, rep, width, cv[None, :, None], noise)
        rep, temp_noise, cap_bit = rep[pick], temp_noise[pick], cap_bit[pick]
        replay, sbe, app_xid = replay[pick], sbe[pick], app_xid[pick]

        node_of = g // per_node
        present = ~eff.missing[g]

        # Performance: the generator's product, one (GPU, metric, repeat) cube.
        base = np.array([model.base[m] for m in GPU_PERF_METRICS])
        slow = np.ones((len(g), k))
        slow[:, 0] = self.slow_silicon[g]
        slow[:, 1] = 1.0 - (1.0 - self.slow_silicon[g]) / 3  # memory clocks barely care about binning
        level = (base * drift[:k]) * self.unit_factors[g] * self.node_factors[node_of, :k] * slow
        values = (level * eff.gpu_factor[g])[:, :, None] * rep
        ran = present[:, None] & ~eff.crash_gpu[g]
        counts = _repeat_counts(values, ran, rule, GPU_PERF_METRICS)
        gi, mi, ri = np.nonzero(np.arange(width) < counts[:, :, None])
        codes = np.array([_METRIC_CODE[m] for m in GPU_PERF_METRICS])
        rows.add(
            node=node_of[gi], gpu=g[gi] % per_node, uuid=g[gi], metric=codes[mi], value=values[gi, mi, ri], repeat=ri
        )
        gi, mi = np.nonzero(present[:, None] & eff.crash_gpu[g])
        rows.add(node=node_of[gi], gpu=g[gi] % per_node, uuid=g[gi], metric=_METRIC_CODE["error"], value=1.0)

        # Telemetry: healthy readings, then the faults' readings on top.
        tele = np.zeros((len(g), len(GPU_TELEMETRY_METRICS)))
        tele[:, _TELE["pcie_gen"]] = tele[:, _TELE["pcie_gen_max"]] = model.pcie_gen_max
        tele[:, _TELE["pcie_width"]] = tele[:, _TELE["pcie_width_max"]] = model.pcie_width_max
        tele[:, _TELE["pcie_replays_per_min"]] = replay
        tele[:, _TELE["temp_max_c"]] = np.clip(np.round(self.temp_base_c[g] + temp_noise), 45, 80)
        tele[:, _TELE["temp_slowdown_c"]] = model.temp_slowdown_c
        tele[:, _TELE["power_limit_w"]] = model.power_limit_default_w
        tele[:, _TELE["power_limit_default_w"]] = model.power_limit_default_w
        tele[:, _TELE["ecc_sbe_volatile"]] = sbe
        for m, j in _TELE.items():
            if eff.touched[m]:
                worse = np.minimum if m in _LOWER_IS_WORSE else np.maximum
                tele[:, j] = worse(tele[:, j], eff.telemetry[g, j])
        tele[:, _TELE["clocks_event_reasons"]] = np.where(cap_bit, SW_POWER_CAP, 0) | eff.bits[g]
        tg = g[present]
        codes = np.array([_METRIC_CODE[m] for m in GPU_TELEMETRY_METRICS])
        rows.add(
            node=np.repeat(tg // per_node, len(codes)),
            gpu=np.repeat(tg % per_node, len(codes)),
            uuid=np.repeat(tg, len(codes)),
            metric=np.tile(codes, len(tg)),
            value=tele[present].ravel(),
        )

        # Events: application XIDs on healthy GPUs, then the faults' XIDs (a lost GPU still logs its 79).
        struck = present & (app_xid > 0)
        xg = g[struck]
        rows.add(
            node=xg // per_node,
            gpu=xg % per_node,
            uuid=xg,
            metric=_METRIC_CODE["xid"],
            value=app_xid[struck].astype(np.float64),
        )
        xg, xc = np.array(eff.xid_gpu, dtype=np.int64), np.array(eff.xid_code, dtype=np.float64)
        rows.add(node=xg // per_node, gpu=xg % per_node, uuid=xg, metric=_METRIC_CODE["xid"], value=xc)

    def _node_rows(
        self,
        rows: _Rows,
        eff: _Effects,
        *,
        wave_nodes: IntArray,
        rule: RepeatRule,
        width: int,
        seed: int,
        drift: FloatArray,
        wave_draws: bool = False,
    ) -> None:
        """The intra-node all-reduce (``rule``'s base repeats per node, more where they disagree, or an
        error row) and the GPU counts."""
        noise, j, repeats = self.noise, len(GPU_PERF_METRICS), rule.repeats
        draws = _Streams(seed, 1)
        cv = noise.cv_rep.get(NCCL, 0.0) * noise.rep_scale
        w = wave_nodes
        rep = 1.0 + draws().standard_normal((len(w) if wave_draws else self.n_nodes, repeats)) * cv
        rep *= _transients(draws(), rep.shape, noise)
        rep = _more_repeats(draws, rep, width, cv, noise)
        rep = rep if wave_draws else rep[w]
        # A node's all-reduce runs at the pace of its slowest GPU; node-wide faults come on top.
        level = self.model.base[NCCL] * drift[j] * self.node_factors[w, j] * eff.nccl_gpu_min[w] * eff.nccl_node[w]
        values = level[:, None] * rep
        ok = ~eff.crash_nccl[w]
        counts = _repeat_counts(values[:, None, :], ok[:, None], rule, (NCCL,))[:, 0]
        ni, ri = np.nonzero(np.arange(width) < counts[:, None])
        rows.add(node=w[ni], metric=_METRIC_CODE[NCCL], value=values[ni, ri], repeat=ri)
        rows.add(node=w[~ok], metric=_METRIC_CODE["error"], value=1.0)
        seen = self.gpus_per_node - eff.missing.reshape(self.n_nodes, self.gpus_per_node)[w].sum(axis=1)
        rows.add(node=w, metric=_METRIC_CODE["gpu_count"], value=seen.astype(np.float64))
        rows.add(node=w, metric=_METRIC_CODE["gpu_count_expected"], value=float(self.gpus_per_node))

    def _pair_rows(
        self,
        rows: _Rows,
        eff: _Effects,
        *,
        wave_nodes: IntArray,
        rule: RepeatRule,
        width: int,
        seed: int,
        drift: FloatArray,
        wave_draws: bool = False,  # pairs are drawn per pair of the wave either way
    ) -> None:
        """A two-node all-reduce per ring neighbour, drawn by the pair's place in the ring."""
        noise, repeats = self.noise, rule.repeats
        w = wave_nodes
        if len(w) < 2:
            return
        a, b = (w[:1], w[1:]) if len(w) == 2 else (w, np.roll(w, -1))
        draws = _Streams(seed, 2)
        cv = noise.cv_rep.get(PAIR, 0.0) * noise.rep_scale
        rep = 1.0 + draws().standard_normal((len(a), repeats)) * cv
        rep *= _transients(draws(), rep.shape, noise)
        rep = _more_repeats(draws, rep, width, cv, noise)
        self._add_pairs(rows, eff, a, b, rep, rule=rule, width=width, drift=drift)

    def _listed_pair_rows(
        self,
        rows: _Rows,
        eff: _Effects,
        pairs: tuple[IntArray, IntArray],
        *,
        rule: RepeatRule,
        width: int,
        seed: int,
        drift: FloatArray,
    ) -> None:
        """A two-node all-reduce per listed pair, each drawn from its own stream (see :meth:`run`)."""
        a, b = pairs
        if not len(a):
            return
        noise = self.noise
        names = np.array(self.node_names, dtype=object)
        keys = _pair_keys(names[a], names[b], seed)
        cv = noise.cv_rep.get(PAIR, 0.0) * noise.rep_scale
        rep = 1.0 + _keyed_normal(keys, width, slot=0) * cv
        u = _keyed_uniform(keys, width, slot=1), _keyed_uniform(keys, width, slot=2)
        lo, hi = noise.transient_range
        rep *= np.where(u[0] < noise.transient_rate, lo + (hi - lo) * u[1], 1.0)
        self._add_pairs(rows, eff, a, b, rep, rule=rule, width=width, drift=drift)

    def _add_pairs(
        self,
        rows: _Rows,
        eff: _Effects,
        a: IntArray,
        b: IntArray,
        rep: FloatArray,
        *,
        rule: RepeatRule,
        width: int,
        drift: FloatArray,
    ) -> None:
        """Pairs ``a[i]``–``b[i]`` with their repeat factors ``rep`` (pairs × width): a pair runs at the pace
        of its slower end, times the fabric between its leaves."""
        j = len(GPU_PERF_METRICS) + 1
        end = eff.pair_gpu_min * eff.pair_node
        # Each factor symmetric in a and b (one product of the two ends' factors), so a pair gives the same
        # bits whichever way round it is named: the two pods of a pair log identical values.
        ends = self.node_factors[a, j] * self.node_factors[b, j]
        level = self.model.base[PAIR] * drift[j] * ends * np.minimum(end[a], end[b]) * eff.fabric(a, b)
        values = level[:, None] * rep
        # A node whose NCCL job dies (lost GPU, uncontained ECC, hung GSP) fails its pairs as well.
        # docs/design/data-contracts.md puts `error` rows at GPU or node level only, and the node's own NCCL
        # error is already written: the pair simply has no value, which the verdict engine reports as an
        # inconclusive pair.
        dead = eff.crash_nccl | eff.crash_pair
        ok = ~(dead[a] | dead[b])
        counts = _repeat_counts(values[:, None, :], ok[:, None], rule, (PAIR,))[:, 0]
        pi, ri = np.nonzero(np.arange(width) < counts[:, None])
        rows.add(node=a[pi], peer=b[pi], metric=_METRIC_CODE[PAIR], value=values[pi, ri], repeat=ri)

    def _storage_rows(
        self,
        rows: _Rows,
        eff: _Effects,
        *,
        wave_nodes: IntArray,
        rule: RepeatRule,
        seed: int,
        shift: float,
        wave_draws: bool,
    ) -> None:
        """Each node's sequential storage read (``rule``'s repeats, more where they disagree). A host
        benchmark: the fleet shift applies, the GPUs' diurnal swing does not."""
        noise, w = self.noise, wave_nodes
        width = max(rule.base(STORAGE), rule.ceiling(STORAGE))
        draws = _Streams(seed, 3)
        cv = noise.cv_rep.get(STORAGE, 0.0) * noise.rep_scale
        rep = 1.0 + draws().standard_normal((len(w) if wave_draws else self.n_nodes, rule.repeats)) * cv
        rep *= _transients(draws(), rep.shape, noise)
        rep = _more_repeats(draws, rep, width, cv, noise)
        rep = rep if wave_draws else rep[w]
        level = self.model.base[STORAGE] * shift * self.storage_factors[w] * eff.storage[w]
        values = level[:, None] * rep
        counts = _repeat_counts(values[:, None, :], np.ones((len(w), 1), dtype=bool), rule, (STORAGE,))[:, 0]
        ni, ri = np.nonzero(np.arange(width) < counts[:, None])
        rows.add(node=w[ni], metric=_METRIC_CODE[STORAGE], value=values[ni, ri], repeat=ri)

    def _nic_rows(self, rows: _Rows, eff: _Effects, wave_nodes: IntArray) -> None:
        """Each node's InfiniBand port telemetry (:data:`NIC_METRICS`): healthy, every port ACTIVE at the
        model's rate and no counter moving, then the faults' readings by the worse of the two."""
        if not NIC_METRICS:
            return
        m, w = self.model, wave_nodes
        healthy = {
            "ib_ports": m.ib_ports,
            "ib_ports_active": m.ib_ports,
            "ib_rate_min_gbps": m.ib_rate_gbps,
            "ib_rate_max_gbps": m.ib_rate_gbps,
        }
        table = np.empty((len(w), len(NIC_METRICS)))
        for k, name in enumerate(NIC_METRICS):
            worse = np.minimum if name in NIC_LOWER_IS_WORSE else np.maximum
            table[:, k] = worse(float(healthy.get(name, 0.0)), eff.nic[name][w])
        codes = np.array([_METRIC_CODE[name] for name in NIC_METRICS])
        rows.add(node=np.repeat(w, len(codes)), metric=np.tile(codes, len(w)), value=table.ravel())


# --- identities ------------------------------------------------------------------------------------


def _node_names(prefix: str, start: int, count: int) -> list[str]:
    width = max(5, len(str(start + count - 1)))
    return [f"{prefix}-{i:0{width}d}" for i in range(start, start + count)]


def _leaf_name(number: int) -> str:
    return f"leaf-{number:02d}"


def _zone_name(number: int) -> str:
    """``zone-a`` … ``zone-z``, then ``zone-aa``, ``zone-ab``, … (bijective base 26)."""
    letters = ""
    number += 1
    while number:
        number, rest = divmod(number - 1, 26)
        letters = chr(ord("a") + rest) + letters
    return f"zone-{letters}"


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_UUID_PATTERN = "GPU-00000000-0000-0000-0000-000000000000"  # each 0 becomes a random hex digit
_UUID_TEMPLATE = np.frombuffer(_UUID_PATTERN.encode(), dtype=np.uint8)
_UUID_HEX_AT = np.array([i for i, c in enumerate(_UUID_PATTERN) if c == "0"])


class _Streams:
    """Independent random streams under one seed, a fresh one per array drawn.

    Each array is drawn GPU-major (or node-major) from a stream of its own, so a GPU's draws do not
    depend on how many GPUs follow it: a bigger fleet, or a fleet with nodes added, measures its old
    GPUs exactly as the smaller one did under the same seeds.
    """

    def __init__(self, *key: int) -> None:
        self.key = key
        self.drawn = 0

    def __call__(self) -> np.random.Generator:
        self.drawn += 1
        return np.random.default_rng([*self.key, self.drawn])


def _uuids(rng: np.random.Generator, n: int) -> npt.NDArray[np.str_]:
    """``n`` random NVML-style UUIDs, built as a byte matrix (no Python loop over GPUs)."""
    chars = np.tile(_UUID_TEMPLATE, (n, 1))
    chars[:, _UUID_HEX_AT] = _HEX[rng.integers(0, 16, size=(n, len(_UUID_HEX_AT)))]
    return chars.view(f"S{_UUID_TEMPLATE.size}").ravel().astype(f"U{_UUID_TEMPLATE.size}")


def _draw_nodes(draws: _Streams, n: int, noise: NoiseModel) -> FloatArray:
    cv = noise.vector(noise.cv_node, _ALL_PERF)
    return 1.0 + draws().standard_normal((n, len(_ALL_PERF))) * cv


def _draw_gpus(
    draws: _Streams, n: int, noise: NoiseModel
) -> tuple[npt.NDArray[np.str_], FloatArray, FloatArray, FloatArray]:
    uuids = _uuids(draws(), n)
    cv = noise.vector(noise.cv_unit, GPU_PERF_METRICS)
    unit = 1.0 + draws().standard_normal((n, len(GPU_PERF_METRICS))) * cv
    lo, hi = noise.slow_silicon_range
    u = draws().random((n, 2))
    slow = np.where(u[:, 0] < noise.slow_silicon_rate, lo + (hi - lo) * u[:, 1], 1.0)
    temp = draws().uniform(*noise.temp_range_c, n)
    return uuids, unit, slow, temp


def _draw_storage(draws: _Streams, n: int, noise: NoiseModel) -> FloatArray:
    return 1.0 + draws().standard_normal(n) * noise.cv_node.get(STORAGE, 0.0)


# --- streams keyed on a pair -------------------------------------------------------------------------
#
# A listed pair's noise must not depend on where the pair stands in the list or on which other pairs are
# measured with it: each of the two pods of a pair Job runs a wave of that pair alone, and both must log
# the same values. So the draws are a counter-based generator (SplitMix64) of (seed, the two node names
# sorted, repeat, slot): vectorised over the pairs, no generator object per pair.

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix(x: U64Array) -> U64Array:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return np.asarray(z ^ (z >> np.uint64(31)), dtype=np.uint64)


def _name_hash(names: npt.NDArray[np.object_]) -> U64Array:
    """A 64-bit hash of each name that does not depend on the process (unlike ``hash``)."""
    unique, inverse = np.unique(names.astype(str), return_inverse=True)
    digests = [hashlib.blake2b(n.encode(), digest_size=8).digest() for n in unique.tolist()]
    return np.array([int.from_bytes(d, "big") for d in digests], dtype=np.uint64)[inverse]


def _pair_keys(a: npt.NDArray[np.object_], b: npt.NDArray[np.object_], seed: int) -> U64Array:
    """One key per pair from the seed and the pair's two node names in sorted order."""
    lo, hi = np.where(a.astype(str) <= b.astype(str), a, b), np.where(a.astype(str) <= b.astype(str), b, a)
    start = np.full(len(a), seed & 0xFFFF_FFFF_FFFF_FFFF, dtype=np.uint64)
    return _splitmix(_splitmix(start ^ _name_hash(lo)) ^ _name_hash(hi))


def _keyed_uniform(keys: U64Array, width: int, *, slot: int) -> FloatArray:
    """(pairs × width) uniform draws in (0, 1): column ``r`` of slot ``slot`` depends on the key, ``r`` and
    ``slot`` only, so a wider wave adds columns without changing the first ones."""
    with np.errstate(over="ignore"):
        counter = (np.arange(width, dtype=np.uint64) * np.uint64(8) + np.uint64(slot + 1)) * _GOLDEN
        bits = _splitmix(_splitmix(keys[:, None] ^ counter[None, :]))
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def _keyed_normal(keys: U64Array, width: int, *, slot: int) -> FloatArray:
    """Standard normal draws by Box-Muller from the uniforms of slots ``4·slot + 4`` and ``+ 5``."""
    u1 = _keyed_uniform(keys, width, slot=4 * slot + 4)
    u2 = _keyed_uniform(keys, width, slot=4 * slot + 5)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def _transients(rng: np.random.Generator, shape: tuple[int, ...], noise: NoiseModel) -> FloatArray:
    """1.0 almost everywhere; a transient bad sample's factor where one struck."""
    u = rng.random((*shape, 2))
    lo, hi = noise.transient_range
    return np.where(u[..., 0] < noise.transient_rate, lo + (hi - lo) * u[..., 1], 1.0)


def _more_repeats(
    draws: _Streams, rep: FloatArray, width: int, cv: FloatArray | float, noise: NoiseModel
) -> FloatArray:
    """``rep`` (…, repeats) followed by the repeats the payload may add, up to ``width``, drawn alike: one
    pair of streams per column, so a column's draws do not depend on how wide the wave is."""
    extra = width - rep.shape[-1]
    if extra <= 0:
        return rep
    columns = []
    for _ in range(extra):
        column = 1.0 + draws().standard_normal((*rep.shape[:-1], 1)) * cv
        columns.append(column * _transients(draws(), column.shape, noise))
    return np.concatenate([rep, *columns], axis=-1)


def _repeat_counts(values: FloatArray, ran: BoolArray, rule: RepeatRule, metrics: Sequence[str]) -> IntArray:
    """How many of its drawn repeats each result (``values``: results × metric × repeat) keeps.

    None where it did not run (``ran``); else its metric's base repeats, and while they disagree by the
    payload's rule (which knows the policy's expected CVs, not the noise this model draws), as many more
    as could settle them, up to its metric's ceiling: the payload's loop, over every result.
    """
    shape, width = values.shape[:-1], values.shape[-1]
    base = np.broadcast_to(np.array([rule.base(m) for m in metrics]), shape).ravel()
    ceiling = np.broadcast_to(np.array([min(rule.ceiling(m), width) for m in metrics]), shape).ravel()
    counts = np.where(ran.ravel(), np.minimum(base, width), 0).astype(np.int64)
    flat = values.reshape(-1, width)
    expected = np.broadcast_to(np.array([rule.expected(m) for m in metrics]), shape).ravel()
    active = np.flatnonzero(ran.ravel() & (base >= MIN_JUDGED) & (ceiling > base))
    columns = np.arange(width)
    while len(active):
        n = counts[active]
        shown = np.where(columns < n[:, None], flat[active], np.nan)
        judged = repeat_matrix_stability(
            shown,
            n,
            np.ones(len(active)),
            expected[active],
            unstable_factor=rule.unstable_factor,
            transient_pct=rule.transient_pct,
            or_noisier=True,
        )
        more = np.minimum(judged.settle, ceiling[active] - n)
        counts[active] = n + more
        active = active[more > 0]
    return counts.reshape(shape)


# --- faults applied --------------------------------------------------------------------------------


class _Effects:
    """The injected faults of one wave, accumulated as whole-fleet arrays the row builders read.

    Until a fault is applied every array is its neutral value broadcast (a read-only view of one row: no
    memory, no time): the simulator runs one wave per benchmark pod, nearly all without a fault, and
    whole-fleet arrays made and filled for each would cost O(fleet) a pod, O(fleet²) a certify.
    """

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        n_gpus, n_nodes = fleet.n_gpus, fleet.n_nodes
        per_gpu = (n_gpus, len(GPU_PERF_METRICS))
        self.gpu_factor = _neutral(1.0, per_gpu)
        self.crash_gpu = _neutral(False, per_gpu)
        self.missing = _neutral(False, n_gpus)
        self.bits = _neutral(np.int64(0), n_gpus)
        # Readings start at the neutral end of their combine rule (see _LOWER_IS_WORSE).
        start = [np.inf if m in _LOWER_IS_WORSE else 0.0 for m in GPU_TELEMETRY_METRICS]
        self.telemetry = _neutral(np.array(start), (n_gpus, len(GPU_TELEMETRY_METRICS)))
        self.touched = dict.fromkeys(GPU_TELEMETRY_METRICS, False)
        self.nccl_gpu_min = _neutral(1.0, n_nodes)
        self.nccl_node = _neutral(1.0, n_nodes)
        self.crash_nccl = _neutral(False, n_nodes)
        self.pair_gpu_min = _neutral(1.0, n_nodes)
        self.pair_node = _neutral(1.0, n_nodes)
        self.crash_pair = _neutral(False, n_nodes)
        self.storage = _neutral(1.0, n_nodes)
        # NIC readings start at the neutral end of their combine rule, as the GPUs' telemetry does.
        self.nic = {m: _neutral(np.inf if m in NIC_LOWER_IS_WORSE else 0.0, n_nodes) for m in NIC_TELEMETRY}
        #: (leaf, leaf, factor) of each slow link between two leaves
        self.uplinks: list[tuple[int, int, float]] = []
        self.xid_gpu: list[int] = []
        self.xid_code: list[int] = []

    def _writable(self) -> None:
        """Every array its own memory, to apply a fault to (once a wave; the first fault pays)."""
        for name, value in vars(self).items():
            if isinstance(value, np.ndarray) and not value.flags.writeable:
                setattr(self, name, value.copy())
        self.nic = {m: v if v.flags.writeable else v.copy() for m, v in self.nic.items()}

    def fabric(self, a: IntArray, b: IntArray) -> FloatArray:
        """What the path between the leaves of ``a[i]`` and ``b[i]`` does to a pair's bandwidth."""
        factor = np.ones(len(a))
        if not self.uplinks:
            return factor
        la, lb = self.fleet.leaf_index[a], self.fleet.leaf_index[b]
        for x, y, f in self.uplinks:
            factor[((la == x) & (lb == y)) | ((la == y) & (lb == x))] *= f
        return factor

    def inject(self, checked: tuple[Fault, int], seed: int) -> dict[str, Any]:
        fault, node = checked
        spec, per_node = FAULTS[fault.kind], self.fleet.gpus_per_node
        if spec.scope == "fabric":
            return self._inject_fabric(fault, seed)
        # Each fault draws from its own stream, keyed by what it is and where, so adding or removing
        # another fault never changes this one's parameters.
        gpu_key = -1 if fault.gpu is None else fault.gpu
        rng = np.random.default_rng([seed, 4, zlib.crc32(fault.kind.encode()), node, gpu_key + 1])
        r = spec.resolve(fault, rng, self.fleet.model)
        on_gpu = spec.scope == "gpu"
        first = node * per_node + (gpu_key if on_gpu else 0)
        gpus = slice(first, first + 1 if on_gpu else first + per_node)
        self._apply(r, node, gpus, on_gpu)
        return {
            "kind": fault.kind,
            "node": fault.node,
            "gpu": fault.gpu,
            "gpu_uuid": str(self.fleet.uuids[first]) if on_gpu else None,
            "scope": spec.scope,
            "expected_cause": spec.cause,
            "signature": spec.signature,
            "cost": r.cost,
            "params": r.params,
        }

    def _inject_fabric(self, fault: Fault, seed: int) -> dict[str, Any]:
        """A slow link between two leaves: every pair with one node under each is slower, no node is."""
        spec = FAULTS[fault.kind]
        x, y = sorted(self.fleet.leaf_number(fault.params[name]) for name in ("leaf_a", "leaf_b"))
        rng = np.random.default_rng([seed, 5, zlib.crc32(fault.kind.encode()), x, y])
        r = spec.resolve(fault, rng, self.fleet.model)
        self.uplinks.append((x, y, r.perf.get(PAIR, 1.0)))
        return {
            "kind": fault.kind,
            "node": None,
            "gpu": None,
            "gpu_uuid": None,
            "scope": spec.scope,
            "expected_cause": spec.cause,
            "signature": spec.signature,
            "cost": r.cost,
            "params": r.params,
        }

    def _apply(self, r: ResolvedFault, node: int, gpus: slice, on_gpu: bool) -> None:
        self._writable()
        for m, f in r.perf.items():
            if m == STORAGE:
                self.storage[node] *= f
            elif m in GPU_PERF_METRICS:
                self.gpu_factor[gpus, GPU_PERF_METRICS.index(m)] *= f
            elif m == NCCL and on_gpu:
                self.nccl_gpu_min[node] = min(self.nccl_gpu_min[node], f)
            elif m == NCCL:
                self.nccl_node[node] *= f
            elif on_gpu:
                self.pair_gpu_min[node] = min(self.pair_gpu_min[node], f)
            else:
                self.pair_node[node] *= f
        for m, v in r.telemetry.items():
            if m in self.nic:
                worse = np.minimum if m in NIC_LOWER_IS_WORSE else np.maximum
                self.nic[m][node] = worse(self.nic[m][node], v)
                continue
            j = _TELE[m]
            worse = np.minimum if m in _LOWER_IS_WORSE else np.maximum
            self.telemetry[gpus, j] = worse(self.telemetry[gpus, j], v)
            self.touched[m] = True
        self.bits[gpus] |= r.bits
        for m in r.crashes:
            if m in GPU_PERF_METRICS:
                self.crash_gpu[gpus, GPU_PERF_METRICS.index(m)] = True
            elif m == NCCL:
                self.crash_nccl[node] = True
            else:
                self.crash_pair[node] = True
        if r.missing:
            self.missing[gpus] = True
        for g in range(gpus.start, gpus.stop):
            self.xid_gpu += [g] * len(r.xids)
            self.xid_code += list(r.xids)


def _neutral(value: Any, shape: int | tuple[int, ...]) -> npt.NDArray[Any]:
    """``value`` (a scalar, or one row) as a read-only array of ``shape`` that takes no memory."""
    return np.broadcast_to(np.asarray(value), shape)


def _truth_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    if not rows:  # most waves of the simulator's pods: a copy of the empty frame, not nine new columns
        return _no_truth().copy()
    return _truth_columns(rows)


@cache
def _no_truth() -> pd.DataFrame:
    return _truth_columns([])


def _truth_columns(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "kind": pd.Series([r["kind"] for r in rows], dtype="str"),
            "node": pd.Series([r["node"] for r in rows], dtype="str"),
            "gpu": pd.Series([r["gpu"] for r in rows], dtype="Int64"),
            "gpu_uuid": pd.Series([r["gpu_uuid"] for r in rows], dtype="str"),
            "scope": pd.Series([r["scope"] for r in rows], dtype="str"),
            "expected_cause": pd.Series([r["expected_cause"] for r in rows], dtype="str"),
            "signature": pd.Series([r["signature"] for r in rows], dtype="bool"),
            "cost": pd.Series([r["cost"] for r in rows], dtype="float64"),
            "params": pd.Series([r["params"] for r in rows], dtype="object"),
        }
    )


# --- the frame ---------------------------------------------------------------------------------------


class _Rows:
    """Column blocks of integer codes (fleet node, fleet GPU, metric), joined into one frame at the end.

    ``gpu``, ``uuid`` and ``peer`` of -1 mean empty. ``uuid`` is the fleet-wide GPU number, the code of
    that GPU's UUID. Codes travel as int32 until the end: at 3 million rows, memory traffic is the cost.
    """

    def __init__(self) -> None:
        self.blocks: list[tuple[I32Array, ...]] = []
        self.values: list[FloatArray] = []

    def add(
        self,
        *,
        node: npt.ArrayLike,
        metric: npt.ArrayLike,
        value: npt.ArrayLike,
        gpu: npt.ArrayLike = -1,
        uuid: npt.ArrayLike = -1,
        repeat: npt.ArrayLike = 0,
        peer: npt.ArrayLike = -1,
    ) -> None:
        n = np.asarray(node, dtype=np.int32)
        if n.size == 0:
            return

        def col(x: npt.ArrayLike) -> I32Array:
            return np.broadcast_to(np.asarray(x, dtype=np.int32), n.shape)

        self.blocks.append((n, col(gpu), col(uuid), col(metric), col(repeat), col(peer)))
        self.values.append(np.broadcast_to(np.asarray(value, dtype=np.float64), n.shape))

    def frame(self, fleet: Fleet, run_id: str, ts: datetime) -> pd.DataFrame:
        if self.blocks:
            cols = [np.concatenate(c) for c in zip(*self.blocks, strict=True)]
            value = np.concatenate(self.values)
        else:
            cols, value = [np.zeros(0, dtype=np.int32) for _ in range(6)], np.zeros(0)
        # One node's rows together, as its benchmark Pod prints them: GPU by GPU, then the node's own.
        # Every block is already in that order, so the stable sort only merges a dozen sorted runs.
        per_node = fleet.gpus_per_node
        key = cols[0].astype(np.int64) * (per_node + 1) + np.where(cols[1] < 0, per_node, cols[1])
        order = np.argsort(key, kind="stable")
        node, gpu, uuid, metric, repeat, peer = (c[order] for c in cols)
        value = value[order]
        n = len(node)
        nodes = fleet.node_categories
        ts64 = np.datetime64(ts.replace(tzinfo=None), "us")
        one = np.zeros(n, dtype=np.int8)
        columns: dict[str, Any] = {
            "run_id": pd.Categorical.from_codes(one, categories=pd.Index([run_id])),
            "node": _categorical(node, nodes),
            "gpu": pd.arrays.IntegerArray(np.where(gpu < 0, 0, gpu).astype(np.int64), gpu < 0),
            "gpu_uuid": _categorical(uuid, fleet.uuid_categories),
            "gpu_model": pd.Categorical.from_codes(one, categories=pd.Index([fleet.model.name])),
            "metric": _categorical(metric, _METRIC_CATEGORIES),
            "value": value,
            "repeat": repeat.astype(np.int64),
            "peer": _categorical(peer, nodes),
            "ts": pd.DatetimeIndex(np.full(n, ts64)).tz_localize("UTC"),
        }
        return pd.DataFrame(columns, columns=list(RESULT_COLUMNS))


def _categorical(codes: I32Array, categories: pd.Index) -> pd.Categorical:
    """Codes into ``categories``, keeping only the categories used (what a reader of the file would see).

    A lookup table instead of ``remove_unused_categories``, which sorts all the codes; for fewer codes than
    categories (a wave of one node among thousands), the codes in use sorted instead: O(rows), not
    O(fleet).
    """
    if len(codes) < len(categories):
        used_codes = np.unique(codes)
        used_codes = used_codes[used_codes >= 0]
        new = np.searchsorted(used_codes, codes).astype(np.int32)
        new[codes < 0] = -1
        return pd.Categorical.from_codes(new, categories=categories[used_codes])
    used = np.bincount(codes + 1, minlength=len(categories) + 1)[1:] > 0
    remap = np.full(len(categories) + 1, -1, dtype=np.int32)
    remap[1:][used] = np.arange(int(used.sum()), dtype=np.int32)
    return pd.Categorical.from_codes(remap[codes + 1], categories=categories[used])
