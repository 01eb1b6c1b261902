"""The fast paths of ``gpucert compare`` on a fleet's results (issue 17) give what the general ones give.

Each test takes the input a fast path is built for (a Parquet file as gpucert writes it, rows in the
payload's order, repeats numbered 0..n-1, a file decoded ahead) and the same data in a shape that sends it
down the general path (a dictionary out of order, shuffled rows, repeats renumbered, no read-ahead), and
checks that frames, verdicts and error messages agree.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpucert import _prefetch
from gpucert.baseline import build_baseline
from gpucert.certify import verdicts_with_links
from gpucert.certify._verdicts import _without
from gpucert.errors import ResultsError
from gpucert.policy import default_policy, spec_floors
from gpucert.results import (
    _relations,
    concat_results,
    parse_results,
    read_results,
    results_checked_alongside,
    write_results,
)
from gpucert.results._read import _dictionary_categorical
from gpucert.store import empty_baseline
from gpucert.verdict import evaluate_run, judge
from gpucert.verdict._compare import _leave_one_out_median, _positions
from gpucert.verdict._index import group_rows
from gpucert_sim.fleet import Fleet, random_faults

T0 = dt.datetime(2026, 11, 1, 2, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def night() -> tuple[pd.DataFrame, pd.DataFrame]:
    """A 40-node night (pairs included, faults injected) and the baseline of a seeding wave."""
    fleet = Fleet.generate(nodes=40, seed=11)
    baseline, _ = build_baseline(empty_baseline(), fleet.run("seed-1", ts=T0, seed=1).results)
    results = fleet.run(
        "night-1", ts=T0 + dt.timedelta(days=1), seed=2, faults=random_faults(fleet, 25, seed=3), pairs=True
    ).results
    return parse_results(results, "night"), baseline


def test_parquet_dictionary_out_of_order_reads_canonical(
    tmp_path: Path, night: tuple[pd.DataFrame, pd.DataFrame]
) -> None:
    """A dictionary column written by another tool (values unsorted, some unused, one blank) reads as the
    same canonical frame as gpucert's own file: sorted categories, all in use, the blank missing."""
    frame = night[0]
    ours = tmp_path / "ours.parquet"
    write_results(frame, ours)
    columns = {}
    for name in frame.columns:
        column = frame[name]
        if isinstance(column.dtype, pd.CategoricalDtype):
            categories = [*list(column.cat.categories)[::-1], "unused-value", " "]
            codes = column.cat.codes.to_numpy().astype(np.int32)
            codes = np.where(codes >= 0, len(column.cat.categories) - 1 - codes, -1)
            indices = pa.array(codes, mask=codes < 0)
            columns[name] = pa.DictionaryArray.from_arrays(indices, pa.array(categories))
        else:
            columns[name] = pa.array(column)
    theirs = tmp_path / "theirs.parquet"
    table = pa.table(columns)
    pq.write_table(table, theirs, row_group_size=len(frame) // 3)  # several chunks, one dictionary each
    expected = read_results([ours])
    pd.testing.assert_frame_equal(read_results([theirs]), expected, check_exact=True)
    csv = tmp_path / "night.csv"  # the general path: text, dictionary-encoded per block by Arrow
    write_results(frame, csv)
    pd.testing.assert_frame_equal(read_results([csv]), expected, check_exact=True)


def test_shuffled_rows_and_renumbered_repeats_judge_the_same(night: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    """Rows in any order, and repeats numbered other than 0..n-1, give the same verdicts and medians as
    the payload's order (which the repeat matrix and the entity ids are fast for)."""
    frame, baseline = night
    policy = default_policy()
    floors = spec_floors(policy)
    expected = evaluate_run(frame, baseline, policy, floors, with_medians=True)
    shuffled = frame.sample(frac=1.0, random_state=5).reset_index(drop=True)
    got = evaluate_run(shuffled, baseline, policy, floors, with_medians=True)
    pd.testing.assert_frame_equal(got.verdicts, expected.verdicts, check_exact=True)
    order = ["scope", "node", "gpu", "peer", "metric"]
    pd.testing.assert_frame_equal(
        got.medians.sort_values(order).reset_index(drop=True),
        expected.medians.sort_values(order).reset_index(drop=True),
        check_exact=True,
    )
    spaced = frame.assign(repeat=frame["repeat"] * 3 + 1)
    verdicts = judge(spaced, baseline, policy)
    # A transient's note names its repeat as written; everything else is the same.
    unchanged = ~expected.verdicts["reasons"].str.contains("was a transient")
    pd.testing.assert_frame_equal(verdicts[unchanged], expected.verdicts[unchanged], check_exact=True)


@pytest.mark.parametrize("kind", ["uuid", "model", "duplicate", "uuid_on_two_gpus"])
def test_conflicts_in_a_large_file_are_named_as_in_a_small_one(
    kind: str, night: tuple[pd.DataFrame, pd.DataFrame]
) -> None:
    """The identity checks look at one row per stretch of alike rows first; a conflict is still found and
    worded exactly as the row-by-row check words it."""
    frame = night[0].copy()
    assert len(frame) > 4096
    gpu3 = frame.index[(frame["gpu"] == 3) & (frame["node"] == frame["node"].iloc[0])]
    if kind == "uuid":
        frame["gpu_uuid"] = frame["gpu_uuid"].cat.add_categories(["GPU-zzz"])
        frame.loc[gpu3[5], "gpu_uuid"] = "GPU-zzz"
    elif kind == "model":
        frame["gpu_model"] = frame["gpu_model"].cat.add_categories(["NVIDIA H100 80GB HBM3"])
        frame.loc[400, "gpu_model"] = "NVIDIA H100 80GB HBM3"
    elif kind == "uuid_on_two_gpus":
        other = frame.index[(frame["gpu"] == 5) & (frame["node"] == frame["node"].iloc[0])][7]
        frame.loc[other, "gpu_uuid"] = frame.loc[gpu3[0], "gpu_uuid"]
    else:
        frame = pd.concat([frame, frame.iloc[[100]]], ignore_index=True)
    with pytest.raises(ResultsError) as fast:
        parse_results(frame, "x")
    original = _relations._stretches
    _relations._stretches = lambda rows: None  # every row, as a small file is checked
    try:
        with pytest.raises(ResultsError) as slow:
            parse_results(frame, "x")
    finally:
        _relations._stretches = original
    assert str(fast.value) == str(slow.value)
    assert {
        "uuid": "several gpu_uuid values",
        "model": "several gpu_model values",
        "duplicate": "duplicated sample",
        "uuid_on_two_gpus": "gpu_uuid",
    }[kind] in str(fast.value)


def test_read_ahead_is_the_file_as_read(tmp_path: Path, night: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    """A table decoded ahead is taken once, only while the file is unchanged, and reads to the same frame."""
    path = tmp_path / "night.parquet"
    write_results(night[0], path)
    expected = read_results([path])
    _prefetch.prefetch_parquet([str(path)])
    assert _prefetch.take(path) is not None
    assert _prefetch.take(path) is None  # once
    _prefetch.prefetch_parquet([str(path)])
    pd.testing.assert_frame_equal(read_results([path]), expected, check_exact=True)
    assert _prefetch.take(path) is None  # the reader took it
    _prefetch.prefetch_parquet([str(path)])
    write_results(night[0].iloc[:100], path)  # changed meanwhile: the reader reads the new file
    os.utime(path, ns=(1, 1))
    assert len(read_results([path])) == 100
    _prefetch.prefetch_parquet([str(path), str(tmp_path / "absent.parquet"), str(tmp_path / "x.csv")])
    _prefetch.discard()
    assert _prefetch.take(path) is None


def test_reading_ahead_does_not_wait_for_pandas(tmp_path: Path, night: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    """The read ahead decodes while the command imports pandas; a reader that imports pandas itself
    (``pq.read_table`` goes through ``pyarrow.dataset``, which does) would wait on that import instead."""
    path = tmp_path / "night.parquet"
    write_results(night[0].iloc[:1000], path)
    script = (
        "import sys; from gpucert import _prefetch; "
        f"_prefetch.prefetch_parquet([{str(path)!r}]); table = _prefetch.take({str(path)!r}); "
        "assert table is not None and table.num_rows == 1000, table; "
        "assert 'pandas' not in sys.modules, 'the read ahead imported pandas'"
    )
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)


def test_a_corrupt_file_read_ahead_is_still_reported(tmp_path: Path) -> None:
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR1 not really parquet")
    _prefetch.prefetch_parquet([str(path)])
    with pytest.raises(ResultsError, match="cannot parse the Parquet file"):
        read_results([path])


def test_leave_one_out_by_rows_matches_the_sort() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        sizes = rng.integers(1, 10, int(rng.integers(1, 40)))
        group = np.repeat(rng.permutation(len(sizes) * 3)[: len(sizes)] * 7, sizes)
        slot = np.concatenate([rng.permutation(12)[:k] for k in sizes])
        values = np.round(rng.normal(1, 0.05, len(group)), int(rng.integers(1, 4)))  # ties included
        shuffle = rng.permutation(len(group))
        group, slot, values = group[shuffle], slot[shuffle], values[shuffle]
        np.testing.assert_array_equal(_leave_one_out_median(group, values, slot), _leave_one_out_median(group, values))


def test_group_ids_name_the_same_groups_as_the_tuples() -> None:
    """Dense renumbering and the sparse digit (a peer most rows lack) partition rows as the tuples do."""
    rng = np.random.default_rng(1)
    for _ in range(100):
        n = int(rng.integers(1, 3000))
        parts = []
        for _ in range(int(rng.integers(1, 5))):
            high, offset = int(rng.choice([2, 50, 3000, 100_000])), int(rng.integers(0, 2))
            part = rng.integers(-offset, high, n)
            if offset:
                part[rng.random(n) < 0.9] = -1
            parts.append((part, offset))
        key, span = _relations._group_ids(parts)
        assert key.min() >= 0
        assert key.max() < span
        tuples = pd.factorize(pd.MultiIndex.from_arrays([p for p, _ in parts]))[0]
        np.testing.assert_array_equal(pd.factorize(key)[0], tuples)


def test_grouped_rows_give_what_the_scatter_gives() -> None:
    """Rows whose groups each form one stretch (the payload's order) take the pass over where the key
    changes; any other order the scatter into a table. Both number groups in order of first appearance,
    as pandas' factorize does, and lay each group's rows out in row order."""
    rng = np.random.default_rng(2)
    for _ in range(60):
        sizes = rng.integers(1, 14, int(rng.integers(1, 300)))
        span = int(len(sizes) * 3)
        names = rng.permutation(span)[: len(sizes)]
        key = np.repeat(names, sizes).astype(np.int32)
        for rows in (key, key[rng.permutation(len(key))]):
            grouping = group_rows(rows, span)
            assert grouping.contiguous == (rows is key)
            ids, uniques = pd.factorize(rows)
            np.testing.assert_array_equal(grouping.ids, ids)
            np.testing.assert_array_equal(rows[grouping.first], uniques)
            np.testing.assert_array_equal(grouping.counts, np.bincount(ids))
            seen = 0
            for groups, members in grouping.by_width():
                assert members.shape == (len(groups), int(grouping.counts[groups[0]]))
                for group, its_rows in zip(groups, members, strict=True):
                    np.testing.assert_array_equal(its_rows, np.flatnonzero(ids == group))
                seen += len(groups)
            assert seen == len(uniques)


def test_baseline_keys_looked_up_a_stretch_at_a_time_match_row_by_row() -> None:
    """A baseline's keys stand in stretches (a GPU's metrics together): each stretch is looked up once,
    and the positions are those of looking up every row."""
    rng = np.random.default_rng(3)
    names = pd.Index([f"GPU-{i:05d}" for i in range(500)], dtype="str")
    for stretch in (1, 4):
        keys = np.repeat(rng.choice([*names, "GPU-elsewhere"], 300), stretch)
        values = pa.array(keys, type=pa.large_string())
        expected = names.get_indexer(pd.Index(keys))
        np.testing.assert_array_equal(_positions(values, names), expected)


def test_pair_rows_after_the_nodes_are_left_out_without_a_copy(night: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    """The links step appends its rows after the nodes': the node rows are then a slice of the run's table,
    judged as the same rows taken out of an interleaved one."""
    frame, baseline = night
    is_pair = (frame["metric"] == "nccl_pair_busbw_gbps").to_numpy()
    assert is_pair.any()
    assert not is_pair[-1]  # interleaved, as the fleet model writes them
    appended = pd.concat([frame[~is_pair], frame[is_pair]], ignore_index=True)
    tail = (appended["metric"] == "nccl_pair_busbw_gbps").to_numpy()
    nodes_only = _without(appended, tail)
    assert np.shares_memory(nodes_only["value"].to_numpy(), appended["value"].to_numpy())
    pd.testing.assert_frame_equal(nodes_only, _without(frame, is_pair), check_exact=True)
    policy = default_policy()
    pd.testing.assert_frame_equal(
        verdicts_with_links(appended, baseline, policy), verdicts_with_links(frame, baseline, policy), check_exact=True
    )


def test_checks_across_rows_alongside_report_as_the_reader_does(
    tmp_path: Path, night: tuple[pd.DataFrame, pd.DataFrame]
) -> None:
    """compare judges while the checks across rows run: a duplicated sample is still reported in the same
    words, and in place of whatever the body raised; a bad value is reported before the body runs."""
    frame = night[0]
    path = tmp_path / "dup.parquet"
    pq.write_table(pa.Table.from_pandas(pd.concat([frame, frame.iloc[[7]]], ignore_index=True)), path)
    with pytest.raises(ResultsError) as reader:
        read_results([path])

    def judge_them(path: Path) -> None:
        with results_checked_alongside([path]) as got:
            assert len(got) == len(frame) + 1
            raise RuntimeError("what judging rows that break the contract might raise")

    with pytest.raises(ResultsError) as alongside:
        judge_them(path)
    assert str(alongside.value) == str(reader.value)
    assert "duplicated sample" in str(alongside.value)

    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pandas(frame.assign(value=frame["value"].where(frame.index != 3, -1.0))), bad)
    with pytest.raises(ResultsError, match="value"), results_checked_alongside([bad]):
        pytest.fail("the body ran on a value outside the contract")

    good = tmp_path / "good.parquet"
    write_results(frame, good)
    with results_checked_alongside([good]) as got:
        pd.testing.assert_frame_equal(got, read_results([good]), check_exact=True)


def test_canonical_frames_joined_as_parsing_their_concatenation(night: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    """A re-run joined to its first run's other nodes (certify's confirming judge): the frame parsing the
    concatenation gives, its categories sorted as the readers sort them, and a sample in both parts named
    in the same words."""
    frame = night[0]
    nodes = frame["node"].cat.categories[:3]
    rerun = frame[frame["node"].isin(nodes)]
    peers = frame[~frame["node"].isin(nodes)]  # categories of every node kept: not canonical on its own
    parsed = parse_results(pd.concat([rerun, peers], ignore_index=True), "x")
    pd.testing.assert_frame_equal(
        concat_results([rerun, peers], "x"), _relations._tidy_categories(parsed), check_exact=True
    )
    # A part as a flow keeps the table it wrote (text columns, not categoricals) is made canonical first.
    as_written = rerun.astype({"run_id": "str", "node": "str", "gpu_uuid": "str", "metric": "str"})
    pd.testing.assert_frame_equal(
        concat_results([as_written, peers], "x"), concat_results([rerun, peers], "x"), check_exact=True
    )
    twice = [rerun, frame.iloc[[int(np.flatnonzero(frame["node"] == nodes[0])[0])]]]
    with pytest.raises(ResultsError) as joined:
        concat_results(twice, "x")
    with pytest.raises(ResultsError) as parsed:
        parse_results(pd.concat(twice, ignore_index=True), "x")
    assert str(joined.value) == str(parsed.value)
    assert "duplicated sample" in str(joined.value)
    # A re-run of every node leaves no peers: the empty part adds nothing; nothing at all is no rows.
    pd.testing.assert_frame_equal(
        concat_results([rerun, peers.iloc[:0]], "x"), concat_results([rerun], "x"), check_exact=True
    )
    with pytest.raises(ResultsError, match="no result rows"):
        concat_results([rerun.iloc[:0], peers.iloc[:0]], "x")
    with pytest.raises(ResultsError, match="no result rows"):
        concat_results([], "x")


@pytest.mark.parametrize(
    ("indices", "dictionary", "expected"),
    [
        ([2, 0, 1, 1], ["b", "a", "c"], (["a", "b", "c"], [2, 1, 0, 0])),  # unsorted: sorted
        ([0, 0], ["b", "a", "c"], (["b"], [0, 0])),  # only what is used
        ([0, None, 2], ["a", "b", "c"], (["a", "c"], [0, -1, 1])),  # missing
        ([1, 0], ["a", "b"], (["a", "b"], [1, 0])),  # sorted already: codes as they are
        ([0, 1, 5], ["a", "b", "c"], None),  # beyond the dictionary: Arrow's conversion says so
        ([0, -2, 1], ["a", "b", "c"], None),
        ([0, None, 5], ["a", "b", "c"], None),  # beyond, beside a missing one
        ([0, 1, 2], ["a", "b", "b"], None),  # a value twice
    ],
)
def test_a_dictionary_column_becomes_the_categorical_of_the_values_in_use(
    indices: list[int | None], dictionary: list[str], expected: tuple[list[str], list[int]] | None
) -> None:
    column = pa.chunked_array(
        [pa.DictionaryArray.from_arrays(pa.array(indices, type=pa.int32()), pa.array(dictionary), safe=False)]
    )
    categorical = _dictionary_categorical(column)
    if expected is None:
        assert categorical is None
    else:
        assert categorical is not None
        assert (list(categorical.categories), categorical.codes.tolist()) == expected
