"""Shards: a certify of more nodes than one flow process should hold, cut into parts any worker can run.

A shard is a fixed set of the run's nodes benchmarked under the run's own id (its Jobs carry the run's name, and
a shard started again adopts them). It leaves ``shard<k>-results.parquet``, ``-failed.json`` and ``-stack.json``
in the run's folder, which the parent joins: the run is judged once, over the whole fleet, since peers are every
node of the model and not a shard's. :func:`plan_shards` cuts contiguous runs of sorted names (a rack named in
sequence stays together; a run started again cuts the same shards), all within one node of each other in size.
"""

from __future__ import annotations

import io
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError, StoreError
from ..results import join_parquet
from ._run import RESULTS, CertificationRun


def plan_shards(nodes: Mapping[str, int], shard_size: int) -> list[dict[str, int]]:
    """``nodes`` (node → GPUs) cut into shards of at most ``shard_size`` nodes, sorted by name; one shard
    when they fit in one. Raises ``InputError`` for a shard size below 1."""
    if shard_size < 1:
        raise InputError(f"shard size {shard_size}: must be at least 1")
    names = sorted(nodes)
    count = max(1, math.ceil(len(names) / shard_size))
    bounds = [round(i * len(names) / count) for i in range(count + 1)]
    return [{n: nodes[n] for n in names[lo:hi]} for lo, hi in itertools.pairwise(bounds)]


def _key(index: int, name: str) -> str:
    return f"shard{index}-{name}"


def write_shard(
    run: CertificationRun,
    index: int,
    frame: pd.DataFrame | None,
    failed: Mapping[str, tuple[str | None, str]],
    stacks: Mapping[str, Mapping[str, Any]],
) -> None:
    """Store shard ``index``'s results (when any), its failed Jobs and its stack records in ``run``'s folder.

    The failed list is written last: its presence says the shard finished (a shard killed half-way leaves
    no ``failed.json``, and the parent refuses to join it)."""
    if frame is not None:
        buffer = io.BytesIO()
        frame.to_parquet(buffer, index=False)
        run.write_file(_key(index, RESULTS), buffer.getvalue())
    run.write_file(_key(index, "stack.json"), json.dumps(stacks, sort_keys=True).encode())
    record = {node: [reason, message] for node, (reason, message) in failed.items()}
    run.write_file(_key(index, "failed.json"), json.dumps(record, sort_keys=True).encode())


@dataclass(frozen=True)
class ShardParts:
    """What the shards of a run left, joined: node → (reason, message) per failed Job, node → stack."""

    failed: dict[str, tuple[str | None, str]]
    stacks: dict[str, dict[str, Any]]
    rows: int


def read_shards(run: CertificationRun, shards: Sequence[Mapping[str, int]]) -> ShardParts:
    """Join the files ``shards`` left into ``run``'s ``results.parquet`` (when any shard measured) and return
    their failed Jobs and stacks. Raises :class:`~gpucert.errors.StoreError` naming a shard that did not
    finish (no ``failed.json``) and ``InputError`` for a shard whose files name a node it did not hold."""
    failed: dict[str, tuple[str | None, str]] = {}
    stacks: dict[str, dict[str, Any]] = {}
    measured: list[int] = []
    for index, nodes in enumerate(shards):
        try:
            record = json.loads(run.read_file(_key(index, "failed.json")))
        except StoreError as exc:
            raise StoreError(
                f"{run.run_id}: shard {index} ({len(nodes)} nodes from {min(nodes)}) did not finish: {exc}"
            ) from exc
        stack = json.loads(run.read_file(_key(index, "stack.json")))
        stray = sorted((set(record) | set(stack)) - set(nodes))
        if stray:
            raise InputError(f"{run.run_id}: shard {index} reports nodes it did not hold: {', '.join(stray[:5])}")
        failed.update({node: (reason, message) for node, (reason, message) in record.items()})
        stacks.update(stack)
        if run.has(_key(index, RESULTS)):
            measured.append(index)  # else no node of the shard logged results: every one is in failed.json
    rows = _join_results(run, measured)
    return ShardParts(failed=failed, stacks=stacks, rows=rows)


def _join_results(run: CertificationRun, measured: Sequence[int]) -> int:
    """Stream the results of the ``measured`` shards into the run's ``results.parquet``, one shard in memory
    at a time; returns the rows joined."""
    parts = (run.read_file(_key(index, RESULTS)) for index in measured)
    try:
        joined = join_parquet(parts)
    except (pa.ArrowException, KeyError) as exc:
        raise StoreError(f"{run.run_id}: a shard's results cannot be joined: {exc}") from exc
    if joined is None:
        return 0
    run.write_file(RESULTS, joined)
    return int(pq.ParquetFile(pa.BufferReader(joined)).metadata.num_rows)
