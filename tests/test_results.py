"""Tests of gpucert.results: reading, validating and writing the results contract
(docs/design/data-contracts.md, "Results")."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucert._frames import RESULT_DTYPES
from gpucert.errors import ResultsError
from gpucert.metrics import RESULT_COLUMNS
from gpucert.results import join_parquet, parse_parquet, parse_results, read_results, write_results

DATA = Path(__file__).parent / "data"
BAD = DATA / "bad_results"
GOOD_CSV = DATA / "good_results.csv"
GOOD_JSONL = DATA / "good_results.jsonl"

#: Every file of the bad-input corpus, with what its error must say besides the file's name: the row
#: and column (as ``row N, column 'x'``) and the gist of the problem.
CORPUS: dict[str, tuple[str, ...]] = {
    "missing_column.csv": ("missing column 'ts'",),
    "missing_key.jsonl": ("missing column 'peer'",),
    "duplicated_column.csv": ("column 'node'", "more than once"),
    "empty.csv": ("no result rows",),
    "header_only.csv": ("no result rows",),
    "json_array.json": ("no result rows", "JSON array"),
    "malformed.csv": ("row 3: 11 fields where the header has 10",),
    "blank_lines.csv": ("row 5, column 'value'", "value is empty"),
    "unknown_metric.csv": (
        "row 3, column 'metric'",
        "unknown metric 'gemm_bf16_tflop' (did you mean 'gemm_bf16_tflops'?)",
    ),
    "value_not_a_number.csv": ("row 4, column 'value'", "'fast' is not a number"),
    "value_not_a_number.jsonl": ("row 3, column 'value'", "'fast' is not a number"),
    "value_nan.csv": ("row 3, column 'value'", "'NaN' is not a finite number"),
    "value_inf.csv": ("row 2, column 'value'", "'inf' is not a finite number"),
    "negative_bandwidth.csv": ("row 4, column 'value'", "negative bandwidth/throughput '-12.5'", "h2d_gbps"),
    "negative_telemetry.csv": ("row 3, column 'value'", "negative value '-3'"),
    "negative_repeat.csv": ("row 3, column 'repeat'", "'-1' is negative"),
    "duplicated_sample.csv": ("row 4, column 'repeat'", "duplicated sample", "rows 2, 4"),
    "bad_run_id.csv": ("row 2, column 'run_id'", "'Cert_Run-1' is not a DNS label"),
    "empty_node.csv": ("row 3, column 'node'", "node is empty"),
    "gpu_fraction.csv": ("row 3, column 'gpu'", "gpu '1.5' is not an integer"),
    "gpu_fraction.ndjson": ("row 2, column 'gpu'", "gpu '1.5' is not an integer"),
    "gpu_letter.csv": ("row 4, column 'gpu'", "gpu 'a' is not an integer"),
    "gpu_metric_without_gpu.csv": ("row 3, column 'gpu'", "'hbm_copy_gbps' is a per-GPU metric: gpu must be set"),
    "node_metric_with_gpu.csv": ("row 3, column 'gpu'", "node-level metric: gpu must be empty"),
    "pair_without_peer.csv": ("row 3, column 'peer'", "pair metric: peer must name the other node"),
    "peer_on_gpu_metric.csv": ("row 2, column 'peer'", "peer is only for pair metrics"),
    "conflicting_uuid.csv": (
        "row 4, column 'gpu_uuid'",
        "node 'node-a' gpu 0 has several gpu_uuid values",
        "'GPU-aaaa-0000' (row 2), 'GPU-ffff-9999' (row 4)",
    ),
    "uuid_on_two_gpus.csv": ("row 4, column 'gpu_uuid'", "'GPU-aaaa-0000' is on several GPUs"),
    "conflicting_model.csv": ("row 3, column 'gpu_model'", "node 'node-a' has several gpu_model values"),
    "bad_ts.csv": ("row 3, column 'ts'", "'yesterday noon' is not a timestamp"),
    "pod_log_bad_json.log": ("row 5: not valid JSON",),
    "json_array_pretty.json": ("row 2: not valid JSON",),
    "not_results.txt": ("unknown file type '.txt'",),
}


@functools.cache
def _good() -> pd.DataFrame:
    """Both good example files, as one canonical frame (cached: hypothesis calls tests many times)."""
    return read_results([GOOD_CSV, GOOD_JSONL])


def _error(paths: Path | list[Path]) -> ResultsError:
    with pytest.raises(ResultsError) as info:
        read_results(paths)
    return info.value


def _assert_canonical(frame: pd.DataFrame) -> None:
    assert tuple(frame.columns) == RESULT_COLUMNS
    for name, dtype in RESULT_DTYPES.items():
        assert frame[name].dtype == dtype, name


# The bad-input corpus ------------------------------------------------------------------------------------


def test_the_corpus_table_lists_every_corpus_file() -> None:
    assert {p.name for p in BAD.iterdir()} == set(CORPUS)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_each_bad_file_names_itself_the_row_and_the_column(name: str) -> None:
    error = _error(BAD / name)
    message = str(error)
    assert error.source == str(BAD / name)
    assert message.startswith(str(BAD / name))
    for expected in CORPUS[name]:
        assert expected in message
    assert error.total == len(error.problems) == 1, message


def test_a_missing_file_is_a_results_error(tmp_path: Path) -> None:
    message = str(_error(tmp_path / "nowhere.parquet"))
    assert str(tmp_path / "nowhere.parquet") in message
    assert "No such file" in message


def test_a_directory_is_not_a_results_file(tmp_path: Path) -> None:
    (tmp_path / "run.csv").mkdir()
    assert "cannot read the file" in str(_error(tmp_path / "run.csv"))


def test_no_files_at_all() -> None:
    assert "no results files" in str(_error([]))


# Parquet, built here (binary files do not belong in the corpus) --------------------------------------------


def test_a_corrupt_parquet_file(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.parquet"
    path.write_bytes(b"PAR1" + bytes(range(256)) * 4 + b"PAR1")
    message = str(_error(path))
    assert str(path) in message
    assert "cannot parse the Parquet file" in message


def test_a_truncated_parquet_file(tmp_path: Path) -> None:
    path = tmp_path / "truncated.parquet"
    write_results(_good(), path)
    path.write_bytes(path.read_bytes()[:-200])
    assert "cannot parse the Parquet file" in str(_error(path))


def test_a_parquet_file_names_its_bad_row_one_based(tmp_path: Path) -> None:
    frame = _good().copy()
    frame.loc[3, "value"] = -7.5  # gemm_bf16_tflops
    path = tmp_path / "negative.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    message = str(_error(path))
    assert "row 4, column 'value': negative bandwidth/throughput '-7.5'" in message


def test_a_parquet_file_without_a_column(tmp_path: Path) -> None:
    path = tmp_path / "no_peer.parquet"
    pq.write_table(pa.Table.from_pandas(_good().drop(columns=["peer"]), preserve_index=False), path)
    assert "missing column 'peer'" in str(_error(path))


def test_a_parquet_file_of_another_tool_is_made_canonical(tmp_path: Path) -> None:
    # Plain strings, a float gpu with NaN, naive nanosecond timestamps, an extra column.
    good = _good()
    table = pa.table(
        {
            "run_id": good["run_id"].astype(str),
            "node": good["node"].astype(str),
            "gpu": good["gpu"].astype("float64"),
            "gpu_uuid": good["gpu_uuid"].astype(object),
            "gpu_model": good["gpu_model"].astype(str),
            "metric": good["metric"].astype(str),
            "value": good["value"],
            "repeat": good["repeat"].astype("int32"),
            "peer": good["peer"].astype(object),
            "ts": good["ts"].dt.tz_localize(None).astype("datetime64[ns]"),
            "site": ["dc-1"] * len(good),
        }
    )
    path = tmp_path / "other.pq"
    pq.write_table(table, path)
    frame = read_results(path)
    _assert_canonical(frame)
    pd.testing.assert_frame_equal(frame, good)


def test_an_all_empty_column_written_without_a_type_reads_fine(tmp_path: Path) -> None:
    good = read_results(GOOD_JSONL)
    good = good[good["peer"].isna()].reset_index(drop=True)
    for name in ("metric", "peer"):  # what the reader returns: only categories in use
        good[name] = good[name].cat.remove_unused_categories()
    path = tmp_path / "no_peers.parquet"
    # As pandas writes a categorical with no categories at all: Arrow's "null" type.
    table = pa.Table.from_pandas(good, preserve_index=False)
    table = table.set_column(RESULT_COLUMNS.index("peer"), "peer", pa.nulls(len(good)))
    pq.write_table(table, path)
    pd.testing.assert_frame_equal(read_results(path), good)
    write_results(good, path)
    assert pa.types.is_dictionary(pq.read_schema(path).field("peer").type)
    pd.testing.assert_frame_equal(read_results(path), good)


# Good files ----------------------------------------------------------------------------------------------


def test_the_good_csv_reads_in_canonical_dtypes() -> None:
    frame = read_results(GOOD_CSV)
    _assert_canonical(frame)
    assert len(frame) == 15
    assert frame["gpu"].isna().sum() == 4  # the node-level, pair and error rows
    assert frame["peer"].notna().sum() == 1
    assert frame["gpu_uuid"].isna().sum() == 4
    assert frame["ts"].iloc[0] == pd.Timestamp("2024-05-01T12:00:00Z")


def test_repeated_xid_events_are_not_duplicates() -> None:
    frame = read_results(GOOD_CSV)
    xids = frame[frame["metric"] == "xid"]
    assert len(xids) == 2
    assert xids[["node", "gpu", "repeat"]].duplicated().iloc[1]


def test_a_pod_log_reads_around_its_other_lines() -> None:
    frame = read_results(GOOD_JSONL)
    _assert_canonical(frame)
    assert len(frame) == 8  # the banner, NCCL line, blank line and a structured log object are skipped
    assert frame["value"].tolist()[:3] == [702.5, 699.0, 55.2]
    assert frame["ts"].iloc[2] == pd.Timestamp("2024-05-01T12:01:00.25Z")


def test_a_bad_line_in_a_pod_log_is_named_and_the_lines_around_it_are_fine() -> None:
    error = _error(BAD / "pod_log_bad_json.log")
    assert [(p.row, p.column) for p in error.problems] == [(5, None)]


def test_bad_lines_of_a_pod_log_are_reported_with_the_bad_values_of_good_lines(tmp_path: Path) -> None:
    lines = (BAD / "pod_log_bad_json.log").read_text().splitlines()
    lines[1] = lines[1].replace("812.4", "-1")
    path = tmp_path / "pod.log"
    path.write_text("\n".join(lines) + "\n")
    error = _error(path)
    assert [(p.row, p.column) for p in error.problems] == [(2, "value"), (5, None)]


def test_a_plain_json_lines_file_names_the_line_of_a_bad_value(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    write_results(_good(), path)
    lines = path.read_text().splitlines()
    lines[2] = lines[2].replace('"value": ', '"value": -')
    path.write_text("\n".join(lines) + "\n")
    error = _error(path)
    assert [(p.row, p.column) for p in error.problems] == [(3, "value")]


def test_two_objects_on_one_line_are_not_json_lines(tmp_path: Path) -> None:
    lines = (BAD / "pod_log_bad_json.log").read_text().splitlines()
    path = tmp_path / "joined.jsonl"
    path.write_text(f"{lines[1]} {lines[6]}\n")
    assert "row 1: not valid JSON: Extra data" in str(_error(path))


def test_naive_and_offset_timestamps_become_utc() -> None:
    frame = parse_results(
        pd.DataFrame(
            {
                "run_id": ["r1", "r1"],
                "node": ["n1", "n1"],
                "gpu": [0, 1],
                "gpu_uuid": ["GPU-0", "GPU-1"],
                "gpu_model": ["NVIDIA H200", "NVIDIA H200"],
                "metric": ["h2d_gbps", "h2d_gbps"],
                "value": [55.0, 56.0],
                "repeat": [0, 0],
                "peer": [None, None],
                "ts": ["2024-05-01T12:00:00", "2024-05-01T14:00:00+02:00"],
            }
        ),
        "frame",
    )
    _assert_canonical(frame)
    assert (frame["ts"] == pd.Timestamp("2024-05-01T12:00:00Z")).all()


# Several files -------------------------------------------------------------------------------------------


def test_several_files_concatenate_with_canonical_categories() -> None:
    frame = _good()
    _assert_canonical(frame)
    assert len(frame) == 23
    assert list(frame["gpu_model"].cat.categories) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert frame["node"].iloc[-1] == "node-c"


def test_a_sample_in_two_files_is_a_duplicate_naming_both(tmp_path: Path) -> None:
    other = tmp_path / "rerun.csv"
    header, first = GOOD_CSV.read_text().splitlines()[:2]
    other.write_text(f"{header}\n{first.replace('812.4', '799.0')}\n")
    error = _error([GOOD_CSV, other])
    message = str(error)
    assert f"{GOOD_CSV} row 2, {other} row 2" in message
    assert "duplicated sample" in message
    assert [(p.row, p.column) for p in error.problems] == [(2, "repeat")]


def test_duplicates_are_found_however_wide_the_key() -> None:
    # GPU indexes and repeats this large cannot index a table: the check falls back to hashing.
    frame = _good().copy()
    frame["gpu"] = frame["gpu"] * 10**12
    frame["repeat"] = frame["repeat"] + 2**40
    frame = pd.concat([frame, frame.iloc[[4]]], ignore_index=True)
    with pytest.raises(ResultsError) as info:
        parse_results(frame, "wide")
    assert [(p.row, p.column) for p in info.value.problems] == [(24, "repeat")]
    assert "rows 5, 24" in str(info.value)


def test_each_file_is_validated_on_its_own_first() -> None:
    error = _error([GOOD_CSV, BAD / "value_nan.csv", BAD / "bad_ts.csv"])
    assert error.source == str(BAD / "value_nan.csv")


# parse_results and write_results ---------------------------------------------------------------------------


def test_a_canonical_frame_passes_unchanged() -> None:
    frame = _good()
    pd.testing.assert_frame_equal(parse_results(frame, "frame"), frame)


def test_extra_columns_are_dropped_and_columns_reordered() -> None:
    frame = _good()
    shuffled = frame[list(reversed(RESULT_COLUMNS))].assign(site="dc-1")
    pd.testing.assert_frame_equal(parse_results(shuffled, "frame"), frame)


def test_a_frame_of_plain_python_values() -> None:
    frame = _good().astype(object)
    frame["gpu"] = [None if pd.isna(g) else int(g) for g in frame["gpu"]]
    frame["ts"] = frame["ts"].map(lambda t: t.isoformat())
    parsed = parse_results(frame, "frame")
    _assert_canonical(parsed)
    pd.testing.assert_frame_equal(parsed, _good(), check_categorical=False)


def test_rows_give_the_numbers_in_messages() -> None:
    frame = _good().copy()
    frame.loc[1, "value"] = np.inf
    with pytest.raises(ResultsError) as info:
        parse_results(frame, "generated", rows=np.arange(100, 100 + len(frame)))
    assert "generated" in str(info.value)
    assert info.value.problems[0].row == 101


def test_every_problem_is_counted_but_only_some_are_built(tmp_path: Path) -> None:
    header, first = GOOD_CSV.read_text().splitlines()[:2]
    lines = [first.replace(",0,,2024", f",{r},,2024").replace("gemm_bf16_tflops", "gemm") for r in range(300)]
    path = tmp_path / "many.csv"
    path.write_text("\n".join([header, *lines]) + "\n")
    error = _error(path)
    assert error.total == 300
    assert len(error.problems) < 300
    assert [p.row for p in error.problems[:3]] == [2, 3, 4]
    assert "… and 288 more" in str(error)


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".jsonl"])
def test_round_trip(tmp_path: Path, suffix: str) -> None:
    frame = _good()
    path = tmp_path / f"results{suffix}"
    write_results(frame, path)
    pd.testing.assert_frame_equal(read_results(path), frame)


def test_round_trip_keeps_every_float_and_microsecond(tmp_path: Path) -> None:
    frame = _good().copy()
    # Rows 0-3 are GEMM TFLOPS, 4-5 HBM GB/s: awkward floats within what a GPU can measure (the largest
    # is the GEMM bound for any GPU, the float just below the HBM one).
    awkward = [0.1 + 0.2, 1 / 3, 5e-324, 25000.0, np.nextafter(120000.0, 0.0), 2.5e-7]
    frame["value"] = [*awkward, *frame["value"].iloc[len(awkward) :]]
    frame["ts"] = frame["ts"] + pd.to_timedelta(np.arange(len(frame)), unit="us")
    for suffix in (".csv", ".parquet", ".jsonl"):
        path = tmp_path / f"precise{suffix}"
        write_results(frame, path)
        pd.testing.assert_frame_equal(read_results(path), frame)


def test_the_csv_writer_writes_integers_empties_and_utc(tmp_path: Path) -> None:
    path = tmp_path / "out.csv"
    write_results(read_results(GOOD_CSV), path)
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(RESULT_COLUMNS)
    assert lines[1].startswith("cert-20240501-a1,node-a,0,GPU-")
    assert lines[1].endswith(",812.4,0,,2024-05-01T12:00:00.000000Z")
    assert ",node-a,,,NVIDIA H200,nccl_allreduce_busbw_gbps," in lines[9]


def test_write_refuses_a_frame_it_could_not_read_back(tmp_path: Path) -> None:
    frame = _good().copy()
    frame.loc[0, "value"] = np.nan
    with pytest.raises(ResultsError, match="not a finite number"):
        write_results(frame, tmp_path / "out.parquet")
    with pytest.raises(ResultsError, match="unknown file type"):
        write_results(_good(), tmp_path / "out.xlsx")


# Properties ----------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(order=st.permutations(range(23)), again=st.integers(0, 22))
def test_shuffling_rows_does_not_change_validity(order: list[int], again: int) -> None:
    good = _good()
    shuffled = good.iloc[list(order)].reset_index(drop=True)
    key = ["node", "ts", "metric", "value"]
    pd.testing.assert_frame_equal(
        parse_results(shuffled, "shuffled").sort_values(key, ignore_index=True),
        good.sort_values(key, ignore_index=True),
    )
    # An invalid frame stays invalid wherever its bad rows are: a sample measured twice.
    samples = shuffled.index[~shuffled["metric"].isin(["xid", "error"])]
    duplicated = pd.concat([shuffled, shuffled.loc[[samples[again % len(samples)]]]], ignore_index=True)
    with pytest.raises(ResultsError) as info:
        parse_results(duplicated, "duplicated")
    assert [p.column for p in info.value.problems] == ["repeat"]
    assert info.value.problems[0].row == len(duplicated)


@settings(max_examples=60, deadline=None)
@given(
    order=st.permutations(range(23)),
    row=st.integers(0, 22),
    corruption=st.sampled_from(["nan", "negative", "unknown metric", "implausible"]),
)
def test_a_single_corrupted_value_is_reported_at_its_row(order: list[int], row: int, corruption: str) -> None:
    frame = _good().iloc[list(order)].reset_index(drop=True)
    if corruption == "unknown metric":
        frame["metric"] = frame["metric"].cat.add_categories(["gemm_bf16_tflopz"])
        frame.loc[row, "metric"] = "gemm_bf16_tflopz"
        column = "metric"
    elif corruption == "implausible":
        frame.loc[row, "value"] = 1e300  # beyond the physical bound of every metric, for any GPU
        column = "value"
    else:
        frame.loc[row, "value"] = np.nan if corruption == "nan" else -1 - float(frame["value"].iloc[row])
        column = "value"
    with pytest.raises(ResultsError) as info:
        parse_results(frame, "corrupted")
    assert [(p.row, p.column) for p in info.value.problems] == [(row + 1, column)]


# Physical bounds -----------------------------------------------------------------------------------------
# gpucert/data/physical_bounds.csv: a value no GPU can measure is refused with its row and the column
# 'value', whatever the metric; one at the edge of the range is fine.

# Row 6 of _good() is a per-GPU telemetry row (node-a GPU 0), row 9 the node's gpu_count, row 12 an XID,
# row 14 an error, row 17 an H2D measurement, row 8 the node's NCCL busbw.
_IMPOSSIBLE = [
    (6, "pcie_gen", 7.0, "1 to 6 generation"),
    (6, "pcie_gen", 0.0, "1 to 6 generation"),
    (6, "pcie_gen_max", 9.0, "1 to 6 generation"),
    (6, "pcie_width", 64.0, "1 to 32 lanes"),
    (6, "pcie_width_max", 0.0, "1 to 32 lanes"),
    (6, "temp_max_c", 300.0, "0 to 150 °C"),
    (6, "temp_slowdown_c", 1.7976931348623157e308, "0 to 150 °C"),
    (6, "hw_slowdown_frac", 1.5, "0 to 1 fraction"),
    (6, "remapped_rows_pending", 2.0, "0 to 1 flag"),
    (6, "remapped_rows_failure", 3.0, "0 to 1 flag"),
    (6, "nvlink_down", 19.0, "0 to 18 links"),
    (6, "power_limit_w", 70000.0, "0 to 5000 W"),
    (6, "ecc_sbe_volatile", 1e30, "0 to 1.84467e+19 count"),
    (6, "clocks_event_reasons", 2.0**70, "bitmask"),
    (6, "pcie_replays_per_min", 1e300, "1/min"),
    (9, "gpu_count", 1000.0, "0 to 64 GPUs"),
    (12, "xid", 0.0, "1 to 65535 code"),
    (14, "error", 2.0, "1 to 1 flag"),
    (0, "gemm_bf16_tflops", 1.7976931348623157e308, "0 to 25000 TFLOPS"),
    (0, "gemm_bf16_tflops", 812.4 * 1000, "0 to 25000 TFLOPS"),
    (4, "hbm_copy_gbps", 4310.5 * 1000, "0 to 120000 GB/s"),
    (17, "h2d_gbps", 55.2 * 1000, "0 to 1600 GB/s"),
    (8, "nccl_allreduce_busbw_gbps", 352.7 * 1000, "0 to 24000 GB/s"),
]


def _with_value(row: int, metric: str, value: float) -> pd.DataFrame:
    frame = _good().copy()
    if metric not in frame["metric"].cat.categories:
        frame["metric"] = frame["metric"].cat.add_categories([metric])
    frame.loc[row, "metric"] = metric
    frame.loc[row, "value"] = value
    return frame


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize(("row", "metric", "value", "words"), _IMPOSSIBLE)
def test_a_value_no_gpu_can_measure_is_refused_at_its_row(row: int, metric: str, value: float, words: str) -> None:
    with pytest.raises(ResultsError) as info:
        parse_results(_with_value(row, metric, value), "frame")
    assert [(p.row, p.column) for p in info.value.problems] == [(row + 1, "value")]
    message = str(info.value)
    assert f"is outside the physical range of {metric!r} for any GPU" in message
    assert words in message


@pytest.mark.parametrize(
    ("row", "metric", "value"),
    [
        (6, "pcie_gen", 6.0),
        (6, "pcie_gen", 1.0),
        (6, "temp_max_c", 150.0),
        (6, "temp_max_c", 0.0),
        (6, "hw_slowdown_frac", 1.0),
        (6, "nvlink_down", 18.0),
        (6, "clocks_event_reasons", float(0xFFFF)),
        (6, "pcie_replays_per_min", 12.5),
        (0, "gemm_bf16_tflops", 25000.0),  # beyond the H200's spec, yet a file may hold it (see the baseline)
        (0, "gemm_bf16_tflops", 0.0),  # a GPU that computed nothing is a failing GPU, not a broken file
        (14, "error", 1.0),
    ],
)
def test_a_value_at_the_edge_of_its_physical_range_reads(row: int, metric: str, value: float) -> None:
    assert parse_results(_with_value(row, metric, value), "frame")["value"].iloc[row] == value


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_file_with_an_impossible_value_names_its_line(tmp_path: Path) -> None:
    header, *lines = GOOD_CSV.read_text().splitlines()
    lines[7] = lines[7].replace(",temp_max_c,71,", ",temp_max_c,710,")
    lines[0] = lines[0].replace(",812.4,", ",1e308,")
    path = tmp_path / "spoilt.csv"
    path.write_text("\n".join([header, *lines]) + "\n")
    error = _error(path)
    assert [(p.row, p.column) for p in error.problems] == [(2, "value"), (9, "value")]
    assert "value '710' is outside the physical range of 'temp_max_c'" in str(error)


def test_every_metric_has_a_physical_bound_with_its_source() -> None:
    from gpucert.metrics import ANY_MODEL, METRICS, PERF_METRICS, physical_bounds
    from gpucert.policy import spec_floors

    bounds = physical_bounds()
    floors = spec_floors()
    assert {name for model, name in bounds if model == ANY_MODEL} == set(METRICS)
    assert all(bound.source for bound in bounds.values())
    for (model, name), bound in bounds.items():
        if model != ANY_MODEL:
            # A model's ceiling is tighter than the one for any GPU, and above its spec floor.
            assert name in PERF_METRICS
            assert bound.high <= bounds[(ANY_MODEL, name)].high
            assert floors.get((model, name), 0.0) < bound.high
    assert bounds[("NVIDIA H200", "gemm_bf16_tflops")].high < 1.1 * 989  # the spec peak, not far beyond
    assert bounds[("NVIDIA H100 80GB HBM3", "hbm_copy_gbps")].high < 1.1 * 3350


# Decoding edge cases: nesting, integers beyond int64, typed columns that are not what they name -----------


def _contract_row(**overrides: object) -> dict[str, object]:
    row: dict[str, object] = {
        "run_id": "r1",
        "node": "n1",
        "gpu": 0,
        "gpu_uuid": "GPU-1",
        "gpu_model": "NVIDIA H200",
        "metric": "gemm_bf16_tflops",
        "value": 700.0,
        "repeat": 0,
        "peer": None,
        "ts": "2026-11-01T02:00:00Z",
    }
    row.update(overrides)
    return row


def _contract_parquet(path: Path, **columns: pa.Array) -> Path:
    base = {name: pa.array([value]) for name, value in _contract_row().items() if name not in ("peer", "ts")}
    base["peer"] = pa.array([None], pa.string())
    base["ts"] = pa.array([pd.Timestamp("2026-11-01T02:00:00Z")])
    pq.write_table(pa.table({**base, **columns}), path)
    return path


def test_a_json_line_nested_too_deeply_is_a_problem_at_its_line(tmp_path: Path) -> None:
    import json

    good = json.dumps(_contract_row())
    path = tmp_path / "deep.jsonl"
    deep = '{"run_id": ' + "[" * 100_000 + "]" * 100_000 + "}"
    path.write_text("\n".join([good, deep, json.dumps(_contract_row(repeat=1))]) + "\n")
    error = _error(path)
    assert [(p.row, p.message) for p in error.problems] == [(2, "not valid JSON: nested too deeply")]


def test_a_value_too_deep_to_keep_as_text_is_a_problem_at_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from gpucert.results import _read

    path = tmp_path / "nested.jsonl"
    path.write_text(json.dumps(_contract_row(node={"a": [1]})) + "\n")

    def too_deep(value: object) -> str:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(_read.json, "dumps", too_deep)
    error = _error(path)
    assert [(p.row, p.message) for p in error.problems] == [(1, "not valid JSON: nested too deeply")]


@pytest.mark.parametrize("column", ["gpu", "repeat"])
def test_a_uint64_beyond_int64_is_too_large_not_negative(tmp_path: Path, column: str) -> None:
    big = 2**64 - 1 if column == "gpu" else 2**63
    error = _error(_contract_parquet(tmp_path / "big.parquet", **{column: pa.array([big], pa.uint64())}))
    assert [(p.row, p.column) for p in error.problems] == [(1, column)]
    assert f"{column} '{big}' is too large for a 64-bit integer" in str(error)
    assert "negative" not in str(error)


def test_a_uint64_gpu_with_a_null_beyond_int64_names_the_value(tmp_path: Path) -> None:
    path = _contract_parquet(tmp_path / "big.parquet", gpu=pa.array([2**64 - 1], pa.uint64()))
    table = pq.read_table(path)
    rows = pa.concat_tables([table, table.set_column(2, "gpu", pa.array([None], pa.uint64()))])
    pq.write_table(rows, path)
    error = _error(path)
    assert "gpu '18446744073709551615' is too large for a 64-bit integer" in str(error)


def test_uint64_columns_in_range_read_as_the_contract_dtypes(tmp_path: Path) -> None:
    path = _contract_parquet(
        tmp_path / "unsigned.parquet", gpu=pa.array([1], pa.uint64()), repeat=pa.array([2**62], pa.uint64())
    )
    frame = read_results(path)
    _assert_canonical(frame)
    assert (frame["gpu"].iloc[0], frame["repeat"].iloc[0]) == (1, 2**62)


def test_a_duration_column_is_a_problem_naming_its_column_not_a_crash(tmp_path: Path) -> None:
    error = _error(_contract_parquet(tmp_path / "duration.parquet", ts=pa.array([1_000], pa.duration("ns"))))
    assert [(p.row, p.column) for p in error.problems] == [(1, "ts")]
    assert "is not a timestamp" in str(error)
    durations = {c: pa.array([1_000], pa.duration("ns")) for c in ("gpu", "value", "repeat", "ts")}
    error = _error(_contract_parquet(tmp_path / "durations.parquet", **durations))
    assert sorted(p.column for p in error.problems if p.column) == ["gpu", "repeat", "ts", "value"]


# Results held in memory as Parquet (store objects) --------------------------------------------------------


def _parquet_bytes(frame: pd.DataFrame) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), sink)
    return sink.getvalue().to_pybytes()


def test_parquet_bytes_read_back_canonical_and_equal_to_the_file_reader(tmp_path: Path) -> None:
    good = _good()
    path = tmp_path / "good.parquet"
    write_results(good, path)
    from_bytes = parse_parquet(path.read_bytes(), "results of run x")
    _assert_canonical(from_bytes)
    pd.testing.assert_frame_equal(from_bytes, read_results(path))


def test_parquet_bytes_that_break_the_contract_name_the_object_and_row() -> None:
    bad = _good().astype({"value": "float64"})
    bad.loc[1, "value"] = -1.0
    with pytest.raises(ResultsError) as info:
        parse_parquet(_parquet_bytes(bad), "results of run night")
    assert "results of run night" in str(info.value)
    assert "row 2" in str(info.value)
    with pytest.raises(ResultsError, match=r"results of run night.*cannot parse the Parquet file"):
        parse_parquet(b"not parquet at all", "results of run night")


def test_parts_joined_into_one_parquet_file_read_as_their_concatenation() -> None:
    good = _good()
    # Parts typed differently, as shards written by different versions would be: plain strings in one,
    # dictionaries in another, a column that is all empty (Arrow's null type) in a third.
    plain = good.iloc[:5].astype(dict.fromkeys(("node", "gpu_uuid", "metric", "peer"), "object"))
    nulls = good.iloc[5:8].assign(peer=None)
    parts = [
        _parquet_bytes(plain),
        _parquet_bytes(good.iloc[8:0:-1].iloc[:0]),
        _parquet_bytes(nulls),
        _parquet_bytes(good.iloc[8:]),
    ]
    joined = join_parquet(iter(parts))
    assert joined is not None
    pd.testing.assert_frame_equal(parse_parquet(joined, "joined"), parse_results(good, "good"))
    assert join_parquet(iter([])) is None


def test_a_node_read_before_its_driver_loaded_is_one_node_not_two_models(tmp_path: Path) -> None:
    """Rows of ``gpu_model`` ``unknown`` (the payload's word where NVML cannot tell: no driver loaded yet) and
    rows of the node's real model in one run — its benchmark ran while its driver pod restarted, its pair
    benchmark after — read, as one node; two real models on one node are still refused."""
    rows = [
        "run_id,node,gpu,gpu_uuid,gpu_model,metric,value,repeat,peer,ts",
        "cert-1,node-a,,,unknown,error,1,0,,2024-05-01T12:00:00Z",
        "cert-1,node-a,0,GPU-aaaa-0000,NVIDIA H200,gemm_bf16_tflops,812.4,0,,2024-05-01T12:00:00Z",
    ]
    path = tmp_path / "mixed.csv"
    path.write_text("\n".join(rows) + "\n")
    frame = read_results(path)
    assert sorted(frame["gpu_model"].astype(str)) == ["NVIDIA H200", "unknown"]
    rows.append("cert-1,node-a,1,GPU-aaaa-0001,NVIDIA H100 80GB HBM3,gemm_bf16_tflops,615.0,0,,2024-05-01T12:00:00Z")
    path.write_text("\n".join(rows) + "\n")
    assert "node 'node-a' has several gpu_model values" in str(_error(path))
