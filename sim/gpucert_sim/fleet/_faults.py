"""The fault catalog: every fault the fleet model can inject, one declarative entry per kind.

Each :class:`FaultSpec` row transcribes one line of docs/design/simulator.md, "Fault
catalogue": its scope (one GPU, a whole node, or the fabric between nodes), the cause a
verdict should name (the verdict contract's vocabulary), whether it emits telemetry that names it, the
parameters it draws, the multiplicative effect on each performance metric, the telemetry it writes, the
clock-event bits it sets (docs/reference/telemetry.md, "Clock-event reasons"), the XIDs it logs, and the
benchmark steps it crashes. The catalog only *declares*; the fleet model (``_model.py``) applies a resolved
fault to its arrays, vectorised, so one entry reads as one table row and the numbers can be checked against
the reference at a glance.

Metric keys in ``perf``:

* ``gemm_bf16_tflops``, ``hbm_copy_gbps``, ``h2d_gbps``, ``d2h_gbps`` act on the fault's GPU (on every
  GPU of the node for a node fault);
* ``nccl_allreduce_busbw_gbps`` acts on the node's intra-node all-reduce. A node runs at the speed of its
  slowest GPU, so GPU faults on one node combine by their minimum, node faults multiply on top;
* ``nccl_pair_busbw_gbps`` acts on every pair the node is in (the catalogue's "NCCL inter / IB" column,
  docs/design/simulator.md: a GPUDirect rail at half speed halves the whole ring, so PCIe faults appear there
  too). A pair runs at the speed of its slower end. For a ``fabric`` fault (a slow uplink between two leaf
  switches) it acts on the pairs whose path crosses that link only: no node is faulty, and the fault names no
  node;
* ``storage_read_gbps`` acts on the node's storage read (its mount), measured when a wave asks for it.

Telemetry keys are the GPU telemetry of the results contract (written on the fault's GPU, or on every GPU
of the node), and for node faults also the node's InfiniBand port telemetry (:data:`NIC_TELEMETRY`): a
port at half rate, a port down, counters that rose during the benchmark.

Left out on purpose: silent data corruption (docs/design/simulator.md, "Fault catalogue"). It changes no speed and no
telemetry; only a correctness test (checksum or miscompare, DCGM r4) sees it, and the metric registry
has no correctness metric to carry that result. Add one to ``gpucert.metrics`` first, then a row here.

All multipliers and rates are the estimates of docs/design/simulator.md, "Fault catalogue", to be calibrated
on real hardware.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from gpucert._text import counted

if TYPE_CHECKING:
    from ._model import Fleet, ModelSpec

__all__ = [
    "CAUSES",
    "FAULTS",
    "NIC_TELEMETRY",
    "Bernoulli",
    "Choice",
    "Fault",
    "FaultSpec",
    "IntUniform",
    "LogUniform",
    "ResolvedFault",
    "Uniform",
    "random_faults",
]

Scope = Literal["gpu", "node", "fabric"]
Params = Mapping[str, float]
#: A multiplier on a performance metric, or a telemetry value, from the drawn parameters and the model.
Effect = Callable[[Params, "ModelSpec"], float]

#: The verdict contract's cause vocabulary (docs/reference/causes-and-actions.md, "Causes").
CAUSES: frozenset[str] = frozenset(
    {
        "thermal",
        "power",
        "pcie",
        "nvlink",
        "ecc",
        "row_remap",
        "xid",
        "slow_silicon",
        "network",
        "config",
        "storage",
        "unknown",
    }
)

GEMM = "gemm_bf16_tflops"
HBM = "hbm_copy_gbps"
H2D = "h2d_gbps"
D2H = "d2h_gbps"
NCCL = "nccl_allreduce_busbw_gbps"
PAIR = "nccl_pair_busbw_gbps"
STORAGE = "storage_read_gbps"
_PERF_KEYS = frozenset({GEMM, HBM, H2D, D2H, NCCL, PAIR, STORAGE})
#: Metrics a wave measures only when asked (``Fleet.run(storage=True)``): a kind acting on nothing else is
#: not drawn by :func:`random_faults` unless named, since a default wave would never see it.
_OPTIONAL_PERF = frozenset({STORAGE})
_TELEMETRY_KEYS = frozenset(
    {
        "pcie_gen",
        "pcie_width",
        "pcie_replays_per_min",
        "hw_slowdown_frac",
        "temp_max_c",
        "power_limit_w",
        "ecc_dbe_volatile",
        "ecc_sbe_volatile",
        "remapped_rows_pending",
        "remapped_rows_failure",
        "nvlink_down",
        "nvlink_crc_errors",
    }
)
#: The node's InfiniBand ports as the payload reads them from sysfs, once per benchmark (node level): how
#: many ports it found, how many are ACTIVE, the slowest and fastest active port's rate, and by how much
#: each error counter, summed over the ports, rose during the benchmark.
NIC_TELEMETRY: tuple[str, ...] = (
    "ib_ports",
    "ib_ports_active",
    "ib_rate_min_gbps",
    "ib_rate_max_gbps",
    "ib_symbol_errors",
    "ib_link_downed",
    "ib_rcv_errors",
)
#: NIC readings where a fault's lower value is the worse one (for the others, the higher is).
NIC_LOWER_IS_WORSE = frozenset({"ib_ports", "ib_ports_active", "ib_rate_min_gbps"})

# Clock-event reason bits (docs/reference/telemetry.md, "Clock-event reasons").
SW_POWER_CAP = 0x04
HW_SLOWDOWN = 0x08
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80


# --- parameter draws -------------------------------------------------------------------------------


class Draw(Protocol):
    def sample(self, rng: np.random.Generator) -> float: ...


@dataclass(frozen=True)
class Uniform:
    lo: float
    hi: float

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.lo, self.hi))


@dataclass(frozen=True)
class LogUniform:
    """Uniform in log space: rates span decades, and a linear draw would all but ignore the low end."""

    lo: float
    hi: float

    def sample(self, rng: np.random.Generator) -> float:
        return float(math.exp(rng.uniform(math.log(self.lo), math.log(self.hi))))


@dataclass(frozen=True)
class IntUniform:
    """An integer from ``lo`` to ``hi``, both included."""

    lo: int
    hi: int

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.integers(self.lo, self.hi + 1))


@dataclass(frozen=True)
class Choice:
    values: tuple[float, ...]

    def sample(self, rng: np.random.Generator) -> float:
        return float(self.values[int(rng.integers(len(self.values)))])


@dataclass(frozen=True)
class Bernoulli:
    """1.0 with probability ``p``, else 0.0: whether a probabilistic crash happens this wave."""

    p: float

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.random() < self.p)


# --- faults ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One injected fault: a catalog ``kind`` on a node (and a GPU index, for GPU-scope kinds).

    ``params`` pins some of the kind's random draws (``{"duty": 0.3}``, ``{"crash": 1}``); the others
    are drawn per wave from the wave's seed. A fabric kind names no node (``node`` stays empty) and takes
    the place it acts on as parameters it needs: ``Fault("slow_uplink", params={"leaf_a": 0, "leaf_b": 3})``
    (leaf numbers of :attr:`Fleet.leaf_names <gpucert_sim.fleet.Fleet.leaf_names>`).
    """

    kind: str
    node: str = ""
    gpu: int | None = None
    params: Mapping[str, float] = field(default_factory=dict)

    def __hash__(self) -> int:
        # The generated hash would hash the params dict and fail; faults go into sets in callers' code.
        return hash((self.kind, self.node, self.gpu, tuple(sorted(self.params.items()))))


@dataclass(frozen=True)
class ResolvedFault:
    """A fault with its parameters drawn: plain numbers the fleet model applies to its arrays."""

    params: dict[str, float]
    perf: dict[str, float]
    telemetry: dict[str, float]
    bits: int
    xids: tuple[int, ...]
    crashes: tuple[str, ...]
    missing: bool

    @property
    def cost(self) -> float:
        """The largest fractional loss on any metric; 1.0 when a value goes missing."""
        if self.missing or self.crashes:
            return 1.0
        return max((1.0 - f for f in self.perf.values()), default=0.0)


@dataclass(frozen=True)
class FaultSpec:
    """One catalog row. See the module docstring for what the ``perf`` keys act on."""

    kind: str
    scope: Scope
    cause: str
    #: True when the fault emits telemetry (bits, link state, counters, XIDs) that names it.
    signature: bool
    draws: Mapping[str, Draw] = field(default_factory=dict)
    perf: Mapping[str, Effect] = field(default_factory=dict)
    telemetry: Mapping[str, Effect] = field(default_factory=dict)
    bits: int = 0
    xids: tuple[int, ...] | Callable[[Params], tuple[int, ...]] = ()
    #: Benchmark steps (metric names) that crash: an ``error`` row replaces their values.
    crashes: tuple[str, ...] = ()
    #: The 0/1 parameter that decides whether ``crashes`` happen this wave; None: they always do.
    crash_when: str | None = None
    #: The GPU drops off the bus: its perf and telemetry rows vanish and the node counts one GPU fewer.
    missing: bool = False
    #: Parameters that are never drawn and must be given: where a fabric fault is (``leaf_a``, ``leaf_b``).
    needs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        assert self.cause in CAUSES, self.cause
        assert set(self.perf) <= _PERF_KEYS, set(self.perf) - _PERF_KEYS
        node_keys = _TELEMETRY_KEYS | set(NIC_TELEMETRY) if self.scope == "node" else _TELEMETRY_KEYS
        assert set(self.telemetry) <= node_keys, set(self.telemetry) - node_keys
        assert set(self.crashes) <= _PERF_KEYS
        assert self.crash_when is None or self.crash_when in self.draws
        # A fabric fault slows the pairs through its link and nothing on any node.
        assert self.scope != "fabric" or (
            set(self.perf) <= {PAIR} and not (self.telemetry or self.crashes or self.xids or self.bits)
        )
        assert self.scope != "gpu" or STORAGE not in self.perf  # storage is the node's mount

    @property
    def drawn_at_random(self) -> bool:
        """Whether :func:`random_faults` draws this kind when not told which: not a fabric kind (it has no
        node to land on) nor one acting only on metrics a default wave does not measure."""
        return self.scope != "fabric" and not (self.perf and set(self.perf) <= _OPTIONAL_PERF)

    def resolve(self, fault: Fault, rng: np.random.Generator, model: ModelSpec) -> ResolvedFault:
        """Draw the parameters ``fault.params`` leaves open and evaluate every effect."""
        unknown = set(fault.params) - set(self.draws) - set(self.needs)
        if unknown:
            raise ValueError(
                f"fault {self.kind!r} has no parameter(s) {sorted(unknown)}; it draws {sorted(self.draws)}"
                + (f" and needs {list(self.needs)}" if self.needs else "")
            )
        missing = [name for name in self.needs if name not in fault.params]
        if missing:
            raise ValueError(f"fault {self.kind!r} needs the parameter(s) {missing}")
        # Draw every parameter, pinned or not, so pinning one leaves the others' draws unchanged.
        drawn = {name: draw.sample(rng) for name, draw in self.draws.items()}
        params = {**drawn, **{k: float(v) for k, v in fault.params.items()}}
        crashes = self.crashes if self.crash_when is None or params[self.crash_when] >= 0.5 else ()
        xids = self.xids(params) if callable(self.xids) else self.xids
        return ResolvedFault(
            params=params,
            perf={m: float(f(params, model)) for m, f in self.perf.items()},
            telemetry={m: float(f(params, model)) for m, f in self.telemetry.items()},
            bits=self.bits,
            xids=xids,
            crashes=crashes,
            missing=self.missing,
        )


def _const(value: float) -> Effect:
    return lambda p, m: value


def _param(name: str) -> Effect:
    return lambda p, m: p[name]


def _pcie(effect: Effect) -> dict[str, Effect]:
    """The same effect on both copy directions: a PCIe link fault does not pick a side."""
    return {H2D: effect, D2H: effect}


def _catalog(*specs: FaultSpec) -> dict[str, FaultSpec]:
    return {s.kind: s for s in specs}


# The catalog. Read each entry as a row of docs/design/simulator.md, "Fault catalogue".
FAULTS: dict[str, FaultSpec] = _catalog(
    FaultSpec(
        "hw_thermal",
        "gpu",
        "thermal",
        signature=True,
        draws={"duty": Uniform(0.05, 0.6), "over_c": Uniform(0.0, 4.0)},
        perf={
            GEMM: lambda p, m: 1 - 0.5 * p["duty"],  # SM clock halves while the slowdown is active
            HBM: lambda p, m: 1 - 0.1 * p["duty"],
            NCCL: lambda p, m: 1 - 0.1 * p["duty"],
        },
        bits=HW_THERMAL | HW_SLOWDOWN,
        telemetry={
            "hw_slowdown_frac": _param("duty"),
            "temp_max_c": lambda p, m: m.temp_slowdown_c + round(p["over_c"]),
        },
    ),
    FaultSpec(
        "sw_thermal",
        "gpu",
        "thermal",
        signature=True,  # degraded thermal interface
        draws={"gemm": Uniform(0.85, 0.97), "hbm": Uniform(0.97, 1.0), "margin_c": Uniform(1.0, 5.0)},
        perf={GEMM: _param("gemm"), HBM: _param("hbm")},
        bits=SW_THERMAL,
        telemetry={"temp_max_c": lambda p, m: m.temp_slowdown_c - round(p["margin_c"])},
    ),
    FaultSpec(
        "power_brake",
        "node",
        "power",
        signature=True,  # PSU/PDU asserts the brake on every GPU at once
        draws={"duty": Uniform(0.05, 0.6)},
        perf={
            GEMM: lambda p, m: 1 - 0.5 * p["duty"],
            HBM: lambda p, m: 1 - 0.1 * p["duty"],
            NCCL: lambda p, m: 1 - 0.2 * p["duty"],
        },
        bits=HW_POWER_BRAKE | HW_SLOWDOWN,
        telemetry={"hw_slowdown_frac": _param("duty")},
    ),
    FaultSpec(
        "power_cap",
        "node",
        "config",
        signature=True,  # enforced limit below default (BMC/host policy)
        # One draw: the lower the cap, the slower the GEMM, from ×0.75 at 400 W to ×0.92 at 600 W.
        draws={"limit_w": Uniform(400.0, 600.0)},
        perf={GEMM: lambda p, m: 0.75 + 0.17 * (round(p["limit_w"]) - 400) / 200},
        bits=SW_POWER_CAP,
        telemetry={"power_limit_w": lambda p, m: round(p["limit_w"])},
    ),
    FaultSpec(
        "pcie_gen4",
        "gpu",
        "pcie",
        signature=True,  # link trained at 16 GT/s instead of 32
        perf={**_pcie(_const(0.5)), PAIR: _const(0.5)},
        telemetry={"pcie_gen": _const(4)},
    ),
    FaultSpec(
        "pcie_width",
        "gpu",
        "pcie",
        signature=True,  # x16 trained down to x8 or x4
        draws={"width": Choice((8.0, 4.0))},
        perf={**_pcie(lambda p, m: p["width"] / 16), PAIR: lambda p, m: p["width"] / 16},
        telemetry={"pcie_width": _param("width")},
    ),
    FaultSpec(
        "pcie_replay",
        "gpu",
        "pcie",
        signature=True,  # marginal signal integrity
        draws={"h2d": Uniform(0.90, 0.98), "rail": Uniform(0.90, 1.0), "replays_per_min": LogUniform(10.0, 1000.0)},
        perf={**_pcie(_param("h2d")), PAIR: _param("rail")},
        telemetry={"pcie_replays_per_min": _param("replays_per_min")},
    ),
    FaultSpec(
        "nvlink_access_lost",
        "gpu",
        "nvlink",
        signature=True,  # FM init lost the GPU: P2P falls back to PCIe
        draws={"nccl": Uniform(0.03, 0.10)},
        perf={NCCL: _param("nccl")},
        telemetry={"nvlink_down": lambda p, m: m.nvlinks},
    ),
    FaultSpec(
        "nvlink_one_down",
        "gpu",
        "nvlink",
        signature=True,
        perf={NCCL: lambda p, m: (m.nvlinks - 1) / m.nvlinks},  # 17/18 = 0.944
        telemetry={"nvlink_down": _const(1)},
        xids=(74,),
    ),
    FaultSpec(
        "nvswitch_degraded",
        "node",
        "nvlink",
        signature=True,  # NVSwitch pair disabled, FM mode 1
        draws={"nccl": Uniform(0.75, 0.83)},
        perf={NCCL: _param("nccl")},
        # As many links down per GPU as the bandwidth lost (3-5 of 18), and never fewer than one.
        telemetry={"nvlink_down": lambda p, m: max(1, round(m.nvlinks * (1 - p["nccl"])))},
    ),
    FaultSpec(
        "nvlink_crc",
        "gpu",
        "nvlink",
        signature=True,
        draws={"nccl": Uniform(0.97, 1.0), "crc_per_s": Uniform(1.0, 1000.0)},
        perf={NCCL: _param("nccl")},
        telemetry={"nvlink_crc_errors": lambda p, m: round(p["crc_per_s"] * 60)},  # over a ~60 s benchmark
    ),
    FaultSpec(
        "sbe_storm",
        "gpu",
        "ecc",
        signature=True,
        draws={"hbm": Uniform(0.99, 1.0), "sbe": Uniform(100.0, 5000.0), "xid92_rows": IntUniform(2, 5)},
        perf={HBM: _param("hbm")},
        telemetry={"ecc_sbe_volatile": lambda p, m: round(p["sbe"])},
        xids=lambda p: (92,) * int(p["xid92_rows"]),
    ),
    FaultSpec(
        "remap_pending",
        "gpu",
        "row_remap",
        signature=True,  # uncorrectable ECC, row remap awaits a reset
        draws={"crash": Bernoulli(0.3)},
        crashes=(GEMM,),
        crash_when="crash",
        telemetry={"ecc_dbe_volatile": _const(1), "remapped_rows_pending": _const(1)},
        xids=(48, 63),
    ),
    FaultSpec(
        "remap_failure",
        "gpu",
        "row_remap",
        signature=True,  # no spare row left: the RMA path
        draws={"crash": Bernoulli(0.5)},
        crashes=(GEMM,),
        crash_when="crash",
        telemetry={"remapped_rows_failure": _const(1)},
        xids=(64,),
    ),
    FaultSpec(
        "uncontained_ecc",
        "gpu",
        "ecc",
        signature=True,
        draws={"dbe": IntUniform(1, 4)},
        crashes=(GEMM, NCCL),  # the GEMM dies, and so does the node's NCCL job
        telemetry={"ecc_dbe_volatile": _param("dbe")},
        xids=(95,),
    ),
    FaultSpec(
        "fallen_off_bus",
        "gpu",
        "xid",
        signature=True,  # NVML_ERROR_GPU_IS_LOST: the GPU's series vanish
        missing=True,
        crashes=(NCCL,),
        xids=(79,),
    ),
    FaultSpec(
        "gsp_timeout",
        "gpu",
        "xid",
        signature=True,
        draws={"xid": Choice((119.0, 120.0)), "hang": Bernoulli(0.5)},
        # A hung GSP stalls the GEMM and the node's NCCL job until they time out.
        crashes=(GEMM, NCCL),
        crash_when="hang",
        xids=lambda p: (int(p["xid"]),),
    ),
    FaultSpec(
        "slow_silicon",
        "gpu",
        "slow_silicon",
        signature=False,  # a "lemon": statistics are the only witness
        draws={"gemm": Uniform(0.85, 0.95), "hbm": Uniform(0.97, 1.0)},
        perf={GEMM: _param("gemm"), HBM: _param("hbm")},
    ),
    FaultSpec(
        "host_contention",
        "node",
        "config",
        signature=False,  # CPU contention or NUMA misbinding
        draws={"h2d": Uniform(0.6, 0.9), "rail": Uniform(0.9, 1.0)},
        perf={**_pcie(_param("h2d")), PAIR: _param("rail")},
    ),
    FaultSpec(
        "ib_port_down",
        "node",
        "network",
        signature=True,  # NCCL rebalances over the 7 ports left
        perf={PAIR: _const(7 / 8)},
        telemetry={"ib_ports_active": lambda p, m: m.ib_ports - 1},  # port state Down
    ),
    FaultSpec(
        "ib_downshift",
        "node",
        "network",
        signature=True,  # one port trained NDR→HDR
        draws={"pair": Uniform(0.5, 0.8)},
        perf={PAIR: _param("pair")},
        telemetry={"ib_rate_min_gbps": lambda p, m: m.ib_rate_gbps / 2},  # 200 vs 400 Gb/s
    ),
    FaultSpec(
        # One NIC's link at half its rate: a ring over the node's rails runs at its slowest, so every pair
        # the node is in runs at about half (docs/design/simulator.md, "Fault catalogue": that GPUDirect rail ×0.5).
        "nic_half_rate",
        "node",
        "network",
        signature=True,
        draws={"pair": Uniform(0.45, 0.55)},
        perf={PAIR: _param("pair")},
        telemetry={"ib_rate_min_gbps": lambda p, m: m.ib_rate_gbps / 2},
    ),
    FaultSpec(
        # A port that goes down and up during the benchmark: intermittent loss (docs/design/simulator.md: −20…−100 %
        # while it flaps), link-down and symbol-error counters that rise, receive errors with them.
        "ib_flapping_port",
        "node",
        "network",
        signature=True,
        draws={
            "pair": Uniform(0.6, 0.9),
            "link_downed": IntUniform(1, 12),
            "symbol_errors": LogUniform(10.0, 10_000.0),
            "rcv_errors": IntUniform(1, 200),
        },
        perf={PAIR: _param("pair")},
        telemetry={
            "ib_link_downed": _param("link_downed"),
            "ib_symbol_errors": lambda p, m: round(p["symbol_errors"]),
            "ib_rcv_errors": _param("rcv_errors"),
        },
    ),
    FaultSpec(
        # The uplinks between two leaf switches (a bad cable or optic, a misconfigured ECMP group): only the
        # pairs with one node under each leaf are slow, and no node has anything to show for it.
        "slow_uplink",
        "fabric",
        "network",
        signature=False,
        needs=("leaf_a", "leaf_b"),
        draws={"factor": Uniform(0.4, 0.6)},
        perf={PAIR: _param("factor")},
    ),
    FaultSpec(
        # A node's storage mount reads slowly (a degraded RAID member, an NFS mount over the wrong
        # interface, a throttled volume): storage_read_gbps only, seen by a wave that measures storage.
        "slow_storage",
        "node",
        "storage",
        signature=False,
        draws={"storage": Uniform(0.25, 0.35)},
        perf={STORAGE: _param("storage")},
    ),
)


def random_faults(fleet: Fleet, count: int, *, seed: int, kinds: Sequence[str] | None = None) -> list[Fault]:
    """``count`` faults on distinct targets, kinds spread evenly, parameters left to each wave's draws.

    ``kinds`` defaults to every kind a default wave can observe (:attr:`FaultSpec.drawn_at_random`): not the
    fabric kinds, which name leaves rather than a node, nor ``slow_storage``, seen only by a storage wave.

    Node faults take whole nodes that no other fault touches, so each truth row owns its node's
    node-level metrics. GPU faults go to distinct GPUs on the remaining nodes, one per node until every
    node has one, then a second GPU per node, and so on.
    """
    kinds = [k for k, s in FAULTS.items() if s.drawn_at_random] if kinds is None else list(kinds)
    unknown = [k for k in kinds if k not in FAULTS]
    if unknown or not kinds:
        raise ValueError(f"unknown fault kinds {unknown}; the catalog has {sorted(FAULTS)}")
    fabric = [k for k in kinds if FAULTS[k].scope == "fabric"]
    if fabric:
        raise ValueError(f"fabric faults {fabric} are placed by hand: they need the leaves they act between")
    if count < 0:
        raise ValueError("count must be >= 0")
    rng = np.random.default_rng([seed, 0x6661756C74])
    # Every kind count // len(kinds) times; the remainder goes to kinds picked at random.
    chosen = kinds * (count // len(kinds)) + [kinds[i] for i in rng.permutation(len(kinds))[: count % len(kinds)]]
    chosen = [chosen[i] for i in rng.permutation(len(chosen))]

    n_nodes, per_node = len(fleet.node_names), fleet.gpus_per_node
    node_kinds = [k for k in chosen if FAULTS[k].scope == "node"]
    gpu_kinds = [k for k in chosen if FAULTS[k].scope == "gpu"]
    free_nodes = n_nodes - len(node_kinds)
    if free_nodes < 0 or len(gpu_kinds) > max(free_nodes, 0) * per_node or (gpu_kinds and free_nodes == 0):
        raise ValueError(
            f"{count} faults do not fit on {counted(n_nodes, 'node')} × {counted(per_node, 'GPU')} "
            f"({len(node_kinds)} need a node of their own)"
        )
    order = rng.permutation(n_nodes)
    faults = [Fault(k, fleet.node_names[order[i]]) for i, k in enumerate(node_kinds)]
    rest = order[len(node_kinds) :]
    local = rng.permuted(np.tile(np.arange(per_node), (len(rest), 1)), axis=1)
    for i, k in enumerate(gpu_kinds):
        row, rnd = i % len(rest), i // len(rest)
        faults.append(Fault(k, fleet.node_names[rest[row]], int(local[row, rnd])))
    return faults
