"""gpucert/certify/_shards.py: cutting a run into shards, and joining what the shards left."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import pandas as pd
import pytest

from gpucert._frames import CATEGORY_COLUMNS
from gpucert.certify import CertificationRun, plan_shards, read_shards, write_shard
from gpucert.errors import InputError, StoreError
from gpucert.results import parse_results
from gpucert.store import open_store
from gpucert_sim.fleet import Fleet


def test_shards_are_contiguous_sorted_and_even() -> None:
    nodes = {f"n{i:03d}": 8 for i in reversed(range(10))}
    shards = plan_shards(nodes, 4)
    assert [len(s) for s in shards] == [3, 4, 3]  # ceil(10 / 4) = 3 shards, within one node of each other
    assert [n for s in shards for n in s] == sorted(nodes)
    assert plan_shards(nodes, 10) == [dict(sorted(nodes.items()))]
    assert plan_shards({}, 5) == [{}]
    with pytest.raises(InputError, match="shard size 0: must be at least 1"):
        plan_shards(nodes, 0)


def test_a_run_started_again_cuts_the_same_shards() -> None:
    nodes = {f"gpu-node-{i:05d}": 8 for i in range(1000)}
    assert plan_shards(nodes, 300) == plan_shards(dict(reversed(list(nodes.items()))), 300)


def _run(tmp_path: Path) -> CertificationRun:
    return CertificationRun(open_store(f"file://{tmp_path}", create=True), "cert-1", date(2026, 12, 3))


def test_the_shards_files_join_into_the_runs_results(tmp_path: Path) -> None:
    fleet = Fleet.generate(nodes=4, seed=3)
    frame = parse_results(fleet.run("cert-1", ts=datetime(2026, 12, 3, tzinfo=UTC), seed=4).results, "the fleet's run")
    shards = plan_shards(dict.fromkeys(fleet.node_names, 8), 2)
    run = _run(tmp_path)
    for index, nodes in enumerate(shards):
        part = frame[frame["node"].isin(list(nodes))]
        failed = {min(nodes): ("image_pull", "ErrImagePull")} if index else {}
        write_shard(
            run,
            index,
            part if not failed else part[part["node"] != min(nodes)],
            failed,
            {n: {"driver": "550.90.07"} for n in nodes},
        )
    parts = read_shards(_run(tmp_path), shards)
    assert parts.failed == {min(shards[1]): ("image_pull", "ErrImagePull")}
    assert sorted(parts.stacks) == sorted(fleet.node_names)
    joined, expected = _run(tmp_path).results(), frame[frame["node"] != min(shards[1])]
    assert len(joined) == parts.rows == len(expected)
    order = ["node", "gpu", "metric", "repeat"]

    def plain(frame: pd.DataFrame) -> pd.DataFrame:
        # The join's categories are canonical (sorted, all in use), the fleet's are in fleet order: compare
        # the values.
        return frame.astype(dict.fromkeys(CATEGORY_COLUMNS, "string")).sort_values(order).reset_index(drop=True)

    pd.testing.assert_frame_equal(plain(joined), plain(expected))


def test_a_shard_that_did_not_finish_is_named_and_nothing_is_joined(tmp_path: Path) -> None:
    shards = [{"a": 8}, {"b": 8}]
    run = _run(tmp_path)
    write_shard(run, 0, None, {"a": ("deadline", "DeadlineExceeded")}, {"a": {}})
    with pytest.raises(StoreError, match=r"cert-1: shard 1 \(1 nodes from b\) did not finish"):
        read_shards(run, shards)
    assert not run.has("results.parquet")


def test_a_shard_naming_a_node_it_did_not_hold_is_refused(tmp_path: Path) -> None:
    run = _run(tmp_path)
    write_shard(run, 0, None, {"zz": ("deadline", "x")}, {})
    with pytest.raises(InputError, match="shard 0 reports nodes it did not hold: zz"):
        read_shards(run, [{"a": 8}])
