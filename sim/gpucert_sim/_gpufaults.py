"""GPU faults injected into the simulated cluster's fleet, which its benchmark pods then measure.

The fleet model (:mod:`gpucert_sim.fleet`) applies faults per benchmark wave; a cluster needs them to
persist instead: a GPU that has lost PCIe lanes stays slow for every benchmark run on its node until
the fault is cleared (the part is "repaired"). This is that list, shared by the kubelets' benchmark
logs and the DCGM exporters, changed from Python, the ``--faults`` file and ``POST /gpucert/inject``.
A fault is checked against the fleet when injected, so a bad one fails at once rather than inside a pod.
Each fault remembers when it was injected (monotonic seconds): the DCGM exporters derive their counters
from the time a fault has been in force, so ``rate()`` over them sees the fault's rate. A fabric fault (a
slow uplink between two leaves) names no node: :meth:`GpuFaults.fabric` lists those, which the pair
benchmarks crossing their leaves measure, and only clearing every fault lifts them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from threading import Lock

from gpucert.errors import InputError

from .fleet import FAULTS, Fault, Fleet

__all__ = ["GpuFaults"]


class GpuFaults:
    """The GPU and node faults in force, per node; thread-safe."""

    def __init__(self, fleet: Callable[[], Fleet]) -> None:
        self._fleet = fleet
        self._lock = Lock()
        self._faults: list[Fault] = []
        self._since: dict[Fault, float] = {}

    def check(self, fault: Fault) -> None:
        """An :class:`InputError` unless ``fault`` is a catalog kind that fits a node of the fleet."""
        fleet = self._fleet()
        spec = FAULTS.get(fault.kind)
        where = "the fabric" if spec is not None and spec.scope == "fabric" else repr(fault.node)
        try:
            # The fleet model's own checks (kind, node, GPU index, scope, leaves), on a one-repeat wave of the
            # fault's node, or of a node under each of a fabric fault's leaves.
            nodes = self._check_nodes(fleet, fault)
            fleet.run("sim-check", ts=datetime.now(UTC), seed=0, repeats=1, repeats_of={}, nodes=nodes, faults=[fault])
        except ValueError as exc:
            raise InputError(f"sim: cannot inject {fault.kind!r} on {where}: {exc}") from exc

    @staticmethod
    def _check_nodes(fleet: Fleet, fault: Fault) -> list[str]:
        spec = FAULTS.get(fault.kind)
        if spec is None or spec.scope != "fabric" or fault.node:
            return [fault.node]
        first = [
            fleet.leaf_number(fault.params[k]) * fleet.nodes_per_leaf for k in ("leaf_a", "leaf_b") if k in fault.params
        ]
        return [fleet.node_names[i] for i in first]

    def inject(self, fault: Fault) -> None:
        """Add ``fault`` (a fault catalog kind on a node of the fleet); an invalid one is an InputError."""
        self.check(fault)
        with self._lock:
            if fault not in self._faults:
                self._faults.append(fault)
                self._since[fault] = time.monotonic()

    def clear(self, node: str | None = None) -> int:
        """Remove the faults of ``node`` (all faults when None); returns how many were removed."""
        with self._lock:
            kept = [f for f in self._faults if node is not None and f.node != node]
            removed = len(self._faults) - len(kept)
            self._faults = kept
            self._since = {f: self._since[f] for f in kept}
            return removed

    def on_node(self, node: str) -> list[Fault]:
        with self._lock:
            return [f for f in self._faults if f.node == node]

    def fabric(self) -> list[Fault]:
        """The faults in force that name no node: those of the fabric between the leaves."""
        with self._lock:
            return [f for f in self._faults if not f.node]

    def on_node_since(self, node: str) -> list[tuple[Fault, float]]:
        """The faults of ``node`` with when each was injected (``time.monotonic()`` seconds)."""
        with self._lock:
            return [(f, self._since[f]) for f in self._faults if f.node == node]

    def all(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)
