"""What a simulated pod prints: for a gpucert benchmark pod, what the in-pod payload would print there.

gpucert reads a benchmark pod's log (``pods/log``) and parses it as results, so the simulator must
answer with exactly the payload's output, measured on that node's simulated GPUs, faults included;
anything else would test a parser against a format nobody prints.

Which pods are benchmark pods
-----------------------------
A pod is a gpucert benchmark pod when it carries the label ``app.kubernetes.io/managed-by: gpucert``
and a run id: the label ``<prefix>/run-id`` (``gpucert.io/run-id`` with the default prefix; DESIGN.md
"Kubernetes conventions"), or an annotation of that name when the label is absent. The label is what a
benchmark Job's template carries, so ``kubectl get pods -l gpucert.io/run-id=…`` finds a run's pods.

What its log holds
------------------
Pod logs mix both streams, as ``kubectl logs`` shows them. At container start (stderr): the stack record
line ``gpucert-stack: {…}`` (the payload's; a simulated driver, CUDA and torch) and a
``gpucert-bench: run … on …`` line naming the devices. When the container ends: the results rows on
stdout, one JSON object a line with the ten contract columns in order, as ``RowWriter`` prints them,
each ``error`` row preceded by its ``gpucert-bench: error: …`` line; then ``gpucert-bench: done …``.
The rows are the fleet model's for that node and run: ``fleet.run(run_id, nodes=[node], faults=<the
node's injected faults>, seed=<derived from cluster seed, run id and node>, ts=<container start>)``,
so the same run on the same node measures the same, and another run measures afresh. The payload
exits 0 even when a GPU crashed (an ``error`` row reports it), so such a pod Succeeds.

A benchmark pod on a node the fleet does not know (created through the API, without simulated GPUs)
logs that no GPU was found and no rows. Any other pod logs a line when it starts and one when it ends.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from .. import __version__
from ..fleet import Fleet
from ..metrics import RESULT_COLUMNS
from ._gpufaults import GpuFaults

__all__ = ["MANAGED_BY", "PodLogs", "rows_jsonl"]

MANAGED_BY = ("app.kubernetes.io/managed-by", "gpucert")
_STACK_PREFIX = "gpucert-stack: "
_SAY = "gpucert-bench: "
_RUN_ID = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# The software stack of the simulated nodes, as the payload would read it (NVML, torch).
_STACK = {"driver": "550.90.07", "cuda_driver": "12.4", "cuda": "12.4", "torch": "2.4.1", "nccl": "2.20.5"}
_VBIOS = "96.00.9F.00.04"


def _ts(value: pd.Timestamp) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rows_jsonl(frame: pd.DataFrame, *, with_errors: bool = True) -> str:
    """A results frame as the payload prints it: one JSON object a line, contract columns in order.

    With ``with_errors``, each ``error`` row is preceded by the stderr line the payload writes for it.
    """
    columns: list[list[Any]] = []
    for name in RESULT_COLUMNS:
        values = frame[name].tolist()
        if name == "ts":
            values = [_ts(v) for v in values]
        else:
            values = [None if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else v
                      for v in values]
        columns.append(values)
    lines = []
    for cells in zip(*columns, strict=True):
        row = dict(zip(RESULT_COLUMNS, cells, strict=True))
        if with_errors and row["metric"] == "error":
            where = "node" if row["gpu"] is None else f"GPU {row['gpu']}"
            lines.append(f"{_SAY}error: benchmark step on {where}: the device reported a fault")
        lines.append(json.dumps(row))
    return "".join(line + "\n" for line in lines)


class PodLogs:
    """The log text of simulated pods; see the module docstring."""

    def __init__(self, fleet: Callable[[], Fleet], faults: GpuFaults, *, seed: int,
                 label_prefix: str = "gpucert.io") -> None:
        self._fleet = fleet
        self._faults = faults
        self._seed = seed
        self._run_label = f"{label_prefix}/run-id"

    def run_id(self, pod: Mapping[str, Any]) -> str | None:
        """The run id of a gpucert benchmark pod; None for any other pod."""
        meta = pod.get("metadata") or {}
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        if labels.get(MANAGED_BY[0]) != MANAGED_BY[1]:
            return None
        value = labels.get(self._run_label) or annotations.get(self._run_label)
        return str(value) if value else None

    def started(self, pod: Mapping[str, Any], node: str) -> str:
        """What the container has printed once it started."""
        run_id = self.run_id(pod)
        if run_id is None:
            container = ((pod.get("spec") or {}).get("containers") or [{}])[0]
            return f"simulated container {container.get('name')} ({container.get('image')}) started on {node}\n"
        fleet = self._fleet()
        if node not in fleet.node_index:
            return f"{_SAY}no GPU found on {node}: nothing to benchmark\n"
        stack = self._stack(fleet, node)
        devices = ", ".join(f"{i}={u}" for i, u in enumerate(self._uuids(fleet, node)))
        return (f"{_STACK_PREFIX}{json.dumps(stack, sort_keys=True)}\n"
                f"{_SAY}run {run_id} on {node}: cuda, model {fleet.model.name!r}, devices {devices}\n")

    def finished(self, pod: Mapping[str, Any], node: str, started_at: datetime, exit_code: int) -> str:
        """The whole log once the container exited with ``exit_code``."""
        head = self.started(pod, node)
        run_id = self.run_id(pod)
        if run_id is None:
            return head + f"simulated container exited with code {exit_code}\n"
        fleet = self._fleet()
        if node not in fleet.node_index:
            return head + f"{_SAY}done in 0.0 s: 0 rows, 0 error row(s)\n"
        if not _RUN_ID.match(run_id):
            return head + f"{_SAY}error: --run-id {run_id!r} is not a DNS label\n"
        wave = fleet.run(run_id, ts=started_at.astimezone(UTC), seed=self.seed_for(run_id, node),
                         nodes=[node], faults=self._faults.on_node(node))
        rows = wave.results
        errors = int((rows["metric"] == "error").sum())
        took = (datetime.now(UTC) - started_at).total_seconds()
        return (head + rows_jsonl(rows)
                + f"{_SAY}done in {took:.1f} s: {len(rows)} rows, {errors} error row(s)\n")

    def seed_for(self, run_id: str, node: str) -> int:
        """The wave seed of one run on one node: stable across reruns, different between runs and nodes."""
        digest = hashlib.sha256(f"{self._seed}/{run_id}/{node}".encode()).digest()
        return int.from_bytes(digest[:8], "big")

    def _uuids(self, fleet: Fleet, node: str) -> list[str]:
        first = fleet.node_index[node] * fleet.gpus_per_node
        return [str(u) for u in fleet.uuids[first:first + fleet.gpus_per_node]]

    def _stack(self, fleet: Fleet, node: str) -> dict[str, str]:
        record = {"node": node, "hostname": node, "kernel": "5.15.0-119-generic",
                  "python": platform.python_version(), "gpucert": __version__, "gpu_model": fleet.model.name,
                  **_STACK}
        record.update({f"vbios.{i}": _VBIOS for i in range(fleet.gpus_per_node)})
        return record
