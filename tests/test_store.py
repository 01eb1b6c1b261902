"""The baseline store: versions, the conditional ``current`` pointer, concurrency, crashes, bad input.

Everything runs against real files under ``tmp_path``; the concurrency tests use real processes and
threads, since the lock and the atomic rename are what is being tested.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
from collections.abc import Callable
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucert.errors import (
    BaselineFormatError,
    StoreConflict,
    StoreError,
    StoreUnavailable,
    VersionNotFound,
)
from gpucert.store import (
    BASELINE_COLUMNS,
    BaselineStore,
    Blob,
    FileObjectStore,
    ObjectStore,
    empty_baseline,
    open_object_store,
    open_store,
    validate_baseline,
)

T0 = pd.Timestamp("2026-12-01T08:00:00Z")


def row(key: str, **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "level": "gpu",
        "key": key,
        "metric": "hbm_copy_gbps",
        "center": 4100.0,
        "spread": 12.5,
        "n": 5,
        "first_ts": T0,
        "last_ts": T0 + pd.Timedelta(hours=1),
        "stack": '{"driver": "570.86"}',
        "node": "node-a",
    }
    base.update(over)
    return base


def table(*keys: str) -> pd.DataFrame:
    return pd.DataFrame([row(k) for k in keys], columns=list(BASELINE_COLUMNS))


def add_key(key: str) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def fn(t: pd.DataFrame) -> pd.DataFrame:
        return pd.concat([t, validate_baseline(table(key), "new")], ignore_index=True)

    return fn


def keys_of(frame: pd.DataFrame) -> set[str]:
    return set(frame["key"])


def hidden_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(".") and p.name.endswith(".tmp")]


@pytest.fixture
def store(tmp_path: Path) -> BaselineStore:
    return open_store((tmp_path / "store").as_uri())


# --- round trip and versions ----------------------------------------------------------------------


def test_empty_store_reads_an_empty_typed_table(store: BaselineStore, tmp_path: Path) -> None:
    assert store.current_version() is None
    assert store.versions() == []
    got = store.read()
    assert got.empty
    assert list(got.columns) == list(BASELINE_COLUMNS)
    assert got.dtypes.equals(empty_baseline().dtypes)
    assert not (tmp_path / "store").exists(), "opening or reading must not create the root"


def test_write_then_read_round_trips(store: BaselineStore) -> None:
    frame = table("GPU-1", "GPU-2")
    v1 = store.write_version(frame, parent=None, message="first")
    assert store.current_version() is None, "writing a version does not move current"
    store.move_current(v1, expected=None)
    assert store.current_version() == v1
    expected = validate_baseline(frame, "test")
    pd.testing.assert_frame_equal(store.read(), expected)
    pd.testing.assert_frame_equal(store.read(v1), expected)
    assert str(store.read()["first_ts"].dtype) == "datetime64[us, UTC]"


def test_versions_list_the_parent_chain_oldest_first(store: BaselineStore) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    v2 = store.update(add_key("GPU-2"), message="two")
    v3 = store.update(add_key("GPU-3"), message="three")
    infos = store.versions()
    assert [i.version for i in infos] == [v1, v2, v3]
    assert [i.parent for i in infos] == [None, v1, v2]
    assert [i.rows for i in infos] == [1, 2, 3]
    assert [i.message for i in infos] == ["one", "two", "three"]
    assert [i.is_current for i in infos] == [False, False, True]
    assert all(i.created_at.tzinfo is not None for i in infos)
    assert keys_of(store.read()) == {"GPU-1", "GPU-2", "GPU-3"}
    assert keys_of(store.read(v1)) == {"GPU-1"}


def test_layout_and_meta_follow_the_design(store: BaselineStore, tmp_path: Path) -> None:
    v1 = store.update(add_key("GPU-1"), message="m")
    root = tmp_path / "store"
    assert (root / "baselines" / "current").read_text() == f"{v1}\n"
    assert (root / "baselines" / f"v={v1}" / "baseline.parquet").is_file()
    meta = json.loads((root / "baselines" / f"v={v1}" / "meta.json").read_text())
    assert meta == {
        "version": v1,
        "parent": None,
        "created_at": meta["created_at"],
        "message": "m",
        "rows": 1,
    }
    assert meta["created_at"].endswith("Z")
    assert datetime.fromisoformat(meta["created_at"]).tzinfo is not None
    stamp, _, suffix = v1.partition("-")
    assert datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").year >= 2026
    assert len(suffix) == 8
    # Other tools read the table directly.
    assert set(pd.read_parquet(root / "baselines" / f"v={v1}" / "baseline.parquet")["key"]) == {"GPU-1"}


# --- crashes: current moves only after a complete version -------------------------------------------


def _failing_replace(monkeypatch: pytest.MonkeyPatch, target_name: str) -> None:
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        if Path(dst).name == target_name:
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)


def test_a_failed_pointer_write_leaves_the_old_current(
    store: BaselineStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    _failing_replace(monkeypatch, "current")
    with pytest.raises(StoreUnavailable, match="current"):
        store.update(add_key("GPU-2"), message="two")
    monkeypatch.undo()
    assert store.current_version() == v1
    assert keys_of(store.read()) == {"GPU-1"}
    assert hidden_files(tmp_path / "store") == [], "the temp file of the failed write is cleaned up"
    # The new version was complete before the pointer was tried; it stays, unreferenced.
    infos = store.versions()
    assert len(infos) == 2
    assert [i.is_current for i in infos] == [True, False]


def test_a_failed_table_write_leaves_no_visible_version(
    store: BaselineStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    before = store.objects.list("baselines/")
    _failing_replace(monkeypatch, "baseline.parquet")
    with pytest.raises(StoreUnavailable, match=r"baseline\.parquet"):
        store.update(add_key("GPU-2"), message="two")
    monkeypatch.undo()
    assert store.objects.list("baselines/") == before
    assert hidden_files(tmp_path / "store") == []
    assert store.current_version() == v1
    assert [i.version for i in store.versions()] == [v1]


def test_leftover_temp_files_are_not_objects(store: BaselineStore, tmp_path: Path) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    folder = tmp_path / "store" / "baselines" / f"v={v1}"
    (folder / ".baseline.parquet.0123456789ab.tmp").write_bytes(b"PAR1 half a file")
    assert all(".tmp" not in k for k in store.objects.list(""))
    assert keys_of(store.read()) == {"GPU-1"}


# --- conditional writes ----------------------------------------------------------------------------


def test_put_if_is_compare_and_swap_on_the_etag(tmp_path: Path) -> None:
    objects = FileObjectStore(tmp_path / "root")
    etag = objects.put_if("a/b", b"one", if_match=None)
    with pytest.raises(StoreConflict, match="already exists"):
        objects.put_if("a/b", b"two", if_match=None)
    with pytest.raises(StoreConflict, match="expected etag"):
        objects.put_if("a/b", b"two", if_match="0" * 32)
    with pytest.raises(StoreConflict):
        objects.put_if("missing", b"x", if_match=etag)
    blob = objects.get("a/b")
    assert blob is not None
    assert blob.data == b"one"
    assert blob.etag == etag
    etag2 = objects.put_if("a/b", b"two", if_match=etag)
    assert etag2 != etag
    assert objects.get("a/b") == Blob(b"two", etag2)
    assert objects.put("a/b", b"two") == etag2, "the etag is a function of the content"


def test_move_current_with_a_stale_expectation_conflicts(store: BaselineStore) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    v2 = store.update(add_key("GPU-2"), message="two")
    v3 = store.write_version(table("GPU-9"), parent=v1, message="stale")
    with pytest.raises(StoreConflict, match="another writer"):
        store.move_current(v3, expected=v1)
    with pytest.raises(StoreConflict):
        store.move_current(v3, expected=None)
    assert store.current_version() == v2
    with pytest.raises(VersionNotFound):
        store.move_current("20990101T000000Z-deadbeef", expected=v2)


def test_update_reapplies_its_change_on_the_winners_table(store: BaselineStore, tmp_path: Path) -> None:
    store.update(add_key("GPU-1"), message="one")
    rival = open_store(str(tmp_path / "store"))
    calls = 0

    def racing(t: pd.DataFrame) -> pd.DataFrame:
        nonlocal calls
        calls += 1
        if calls == 1:  # another writer lands between our read and our pointer move
            rival.update(add_key("GPU-rival"), message="rival")
        return add_key("GPU-mine")(t)

    store.update(racing, message="mine")
    assert calls == 2
    assert keys_of(store.read()) == {"GPU-1", "GPU-rival", "GPU-mine"}


def test_update_gives_up_after_its_attempts(store: BaselineStore, tmp_path: Path) -> None:
    store.update(add_key("GPU-1"), message="one")
    rival = open_store(str(tmp_path / "store"))
    calls = 0

    def always_beaten(t: pd.DataFrame) -> pd.DataFrame:
        nonlocal calls
        calls += 1
        rival.update(add_key(f"GPU-rival-{calls}"), message="rival")
        return add_key("GPU-mine")(t)

    with pytest.raises(StoreConflict, match="3 attempts"):
        store.update(always_beaten, message="mine", attempts=3)
    assert calls == 3
    assert "GPU-mine" not in keys_of(store.read())


# --- concurrent writers ----------------------------------------------------------------------------


def _process_writer(uri: str, name: str, count: int, barrier: Any) -> None:
    writer = open_store(uri)
    barrier.wait()
    for i in range(count):
        writer.update(add_key(f"{name}-{i}"), message=f"{name} {i}", attempts=100)


def _assert_linear_history(store: BaselineStore, expected_keys: set[str]) -> None:
    assert keys_of(store.read()) == expected_keys, "an update was lost"
    parents = {i.version: i.parent for i in store.versions()}
    chain = []
    version = store.current_version()
    while version is not None:
        chain.append(version)
        version = parents[version]
    # One version per update on the current chain, each adding exactly one row to its parent.
    assert len(chain) == len(expected_keys)
    sizes = [len(store.read(v)) for v in reversed(chain)]
    assert sizes == list(range(1, len(expected_keys) + 1))


def test_concurrent_processes_never_lose_an_update(tmp_path: Path) -> None:
    uri = (tmp_path / "store").as_uri()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    count = 6
    workers = [ctx.Process(target=_process_writer, args=(uri, f"p{w}", count, barrier)) for w in range(2)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(timeout=60)
    assert [p.exitcode for p in workers] == [0, 0]
    expected = {f"p{w}-{i}" for w in range(2) for i in range(count)}
    _assert_linear_history(open_store(uri), expected)


def test_concurrent_threads_never_lose_an_update(tmp_path: Path) -> None:
    uri = str(tmp_path / "store")
    barrier = threading.Barrier(3)
    errors: list[BaseException] = []

    def work(name: str) -> None:
        try:
            _process_writer(uri, name, 4, barrier)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"t{w}",)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    _assert_linear_history(open_store(uri), {f"t{w}-{i}" for w in range(3) for i in range(4)})


# --- rollback --------------------------------------------------------------------------------------


def test_rollback_restores_an_earlier_version_and_keeps_the_rest(store: BaselineStore) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    v2 = store.update(add_key("GPU-2"), message="two")
    store.rollback(v1)
    assert store.current_version() == v1
    assert keys_of(store.read()) == {"GPU-1"}
    assert [i.version for i in store.versions()] == [v1, v2], "nothing is deleted"
    v3 = store.update(add_key("GPU-3"), message="three")
    assert store.versions()[-1].parent == v1
    assert keys_of(store.read(v3)) == {"GPU-1", "GPU-3"}
    store.rollback(v2)
    assert keys_of(store.read()) == {"GPU-1", "GPU-2"}
    store.rollback(v2)  # already current: nothing to do


@pytest.mark.parametrize("version", ["20990101T000000Z-deadbeef", "../../etc", "", "v=1/x"])
def test_rollback_to_an_unknown_version_fails(store: BaselineStore, version: str) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    with pytest.raises(VersionNotFound):
        store.rollback(version)
    with pytest.raises(VersionNotFound):
        store.read(version)
    assert store.current_version() == v1


# --- bad tables ------------------------------------------------------------------------------------


def test_a_corrupt_parquet_file_is_named(store: BaselineStore) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    key = f"baselines/v={v1}/baseline.parquet"
    store.objects.put(key, b"PAR1 this is not parquet")
    with pytest.raises(BaselineFormatError, match=rf"v={v1}/baseline\.parquet.*not a readable Parquet"):
        store.read()


def test_a_stored_table_with_wrong_columns_is_named(store: BaselineStore, tmp_path: Path) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    path = tmp_path / "store" / "baselines" / f"v={v1}" / "baseline.parquet"
    table("GPU-1").drop(columns=["spread"]).assign(extra=1).to_parquet(path, index=False)
    with pytest.raises(BaselineFormatError) as caught:
        store.read(v1)
    message = str(caught.value)
    assert f"baselines/v={v1}/baseline.parquet" in message
    assert "missing column 'spread'" in message
    assert "unknown column 'extra'" in message


def test_an_invalid_table_is_refused_before_anything_is_written(store: BaselineStore) -> None:
    with pytest.raises(BaselineFormatError, match="center"):
        store.update(lambda _t: table("GPU-1").assign(center=-1.0), message="bad")
    assert store.objects.list("") == []
    with pytest.raises(VersionNotFound):
        store.write_version(table("GPU-1"), parent="20990101T000000Z-deadbeef", message="orphan")


def test_a_garbled_current_pointer_is_an_error(store: BaselineStore) -> None:
    store.objects.put("baselines/current", b"\xff\xfe not a version")
    with pytest.raises(StoreError, match="does not hold a version id"):
        store.read()


@pytest.mark.parametrize(
    ("change", "column", "words"),
    [
        ({"level": "rack"}, "level", "not one of gpu, node, model"),
        ({"metric": "temp_max_c"}, "metric", "not a performance metric"),
        ({"metric": "gemm_bf17_tflops"}, "metric", "not a performance metric"),
        ({"center": 0.0}, "center", "finite number > 0"),
        ({"center": float("inf")}, "center", "finite number > 0"),
        ({"center": float("nan")}, "center", "finite number > 0"),
        ({"spread": -0.5}, "spread", "≥ 0"),
        ({"n": 0}, "n", "whole number ≥ 1"),
        ({"n": 2.5}, "n", "whole number ≥ 1"),
        ({"key": ""}, "key", "is empty"),
        ({"key": None}, "key", "is empty"),
        ({"key": 17}, "key", "must be text"),
        ({"stack": "{driver: 570"}, "stack", "not JSON"),
        ({"level": "node", "key": "node-a"}, "node", "only gpu rows name a node"),
        ({"last_ts": T0 - pd.Timedelta(days=1)}, "last_ts", "before first_ts"),
        ({"first_ts": None}, "first_ts", "is empty"),
        ({"center": "fast"}, "center", "not a number"),
        ({"first_ts": "yesterday"}, "first_ts", "not a timestamp"),
        ({"key": "GPU-1"}, "key", "repeats row 1"),
    ],
)
def test_validation_names_the_row_and_column(change: dict[str, Any], column: str, words: str) -> None:
    frame = pd.DataFrame([row("GPU-1"), {**row("GPU-2"), **change}, row("GPU-3")])
    with pytest.raises(BaselineFormatError) as caught:
        validate_baseline(frame, "s3://bucket/baselines/x.parquet")
    message = str(caught.value)
    assert message.startswith("s3://bucket/baselines/x.parquet: 1 problem ")
    assert f"row 2, column {column!r}" in message
    assert words in message


def test_validation_counts_what_it_does_not_show() -> None:
    frame = pd.DataFrame([row(f"GPU-{i}", center=-1.0, spread=-1.0) for i in range(30)])
    with pytest.raises(BaselineFormatError) as caught:
        validate_baseline(frame, "src")
    message = str(caught.value)
    assert message.startswith("src: 60 problems")
    assert "… and 48 more" in message
    assert "row 1, column 'center'" in message
    assert "row 1, column 'spread'" in message


def test_validation_canonicalises_dtypes() -> None:
    frame = pd.DataFrame(
        [
            row("GPU-1", first_ts="2026-12-01T08:00:00Z", last_ts="2026-12-01T09:00:00+01:00", n=3.0),
            row("node-a", level="node", metric="nccl_allreduce_busbw_gbps", node=None, stack=None),
            row("NVIDIA H200", level="model", node=""),
        ],
        index=[10, 20, 30],
    )
    frame["level"] = frame["level"].astype("category")
    got = validate_baseline(frame, "src")
    assert got.dtypes.equals(empty_baseline().dtypes)
    assert list(got.index) == [0, 1, 2]
    assert list(got["node"]) == ["node-a", "", ""]
    assert list(got["stack"])[1] == ""
    assert got["n"].tolist() == [3, 5, 5]
    assert got["first_ts"].iloc[0] == T0
    assert got["last_ts"].iloc[0] == T0, "09:00+01:00 is 08:00 UTC"
    naive = table("GPU-1").assign(first_ts=T0.tz_localize(None), last_ts=T0.tz_localize(None))
    assert validate_baseline(naive, "src")["first_ts"].iloc[0] == T0
    assert validate_baseline(empty_baseline(), "src").empty


def test_validation_refuses_what_is_not_a_table() -> None:
    with pytest.raises(BaselineFormatError, match="expected a table"):
        validate_baseline([1, 2], "src")  # type: ignore[arg-type]
    with pytest.raises(BaselineFormatError, match="must hold numbers"):
        validate_baseline(table("GPU-1").assign(center=True), "src")


# --- keys, roots, URIs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["../x", "a/../b", "/etc/passwd", "a//b", "a/", "", ".hidden", "a/.lock", "a\\b"]
)
def test_unsafe_keys_are_refused(tmp_path: Path, key: str) -> None:
    objects = FileObjectStore(tmp_path / "root")
    with pytest.raises(ValueError, match="store key"):
        objects.put(key, b"x")
    with pytest.raises(ValueError, match="store key"):
        objects.get(key)
    with pytest.raises(ValueError, match="store key"):
        objects.put_if(key, b"x", if_match=None)
    assert not (tmp_path / "root").exists()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="abz09-_=", min_size=1, max_size=6), min_size=1, max_size=4), st.binary())
def test_any_safe_key_round_trips(
    tmp_path_factory: pytest.TempPathFactory, parts: list[str], data: bytes
) -> None:
    objects = FileObjectStore(tmp_path_factory.mktemp("keys"))
    key = "/".join(parts)
    etag = objects.put(key, data)
    assert objects.get(key) == Blob(data, etag)
    assert objects.exists(key)
    assert key in objects.list(parts[0])


def test_list_is_a_sorted_string_prefix_match(tmp_path: Path) -> None:
    objects = FileObjectStore(tmp_path / "root")
    assert objects.list("") == []
    for key in ["b/2", "a/1", "a/10/x", "ab/3", "a/2"]:
        objects.put(key, b"")
    assert objects.list("") == ["a/1", "a/10/x", "a/2", "ab/3", "b/2"]
    assert objects.list("a/") == ["a/1", "a/10/x", "a/2"]
    assert objects.list("a/1") == ["a/1", "a/10/x"]
    assert objects.list("a") == ["a/1", "a/10/x", "a/2", "ab/3"]
    assert objects.list("zz/") == []
    assert not objects.exists("a"), "a folder is not an object"
    assert objects.get("a") is None


def test_an_unwritable_root_is_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store = open_store(str(blocker / "store"))
    assert store.read().empty, "reading an absent root is an empty store, not an error"
    with pytest.raises(StoreUnavailable, match=str(blocker)):
        store.update(add_key("GPU-1"), message="one")
    with pytest.raises(StoreUnavailable, match=str(blocker)):
        store.objects.put_if("baselines/current", b"x", if_match=None)


def test_open_object_store_understands_the_design_uris(tmp_path: Path) -> None:
    by_uri = open_object_store((tmp_path / "with space").as_uri())
    assert isinstance(by_uri, FileObjectStore)
    assert by_uri.root == tmp_path / "with space"
    assert isinstance(by_uri, ObjectStore)
    assert by_uri.uri == (tmp_path / "with space").as_uri()
    by_path = open_object_store(str(tmp_path / "plain"))
    assert isinstance(by_path, FileObjectStore)
    assert by_path.root == tmp_path / "plain"
    assert isinstance(open_object_store(f"file://localhost{tmp_path}"), FileObjectStore)
    assert not (tmp_path / "with space").exists()
    assert open_object_store("s3://bucket/prefix").uri == "s3://bucket/prefix"  # tests/test_store_s3.py
    with pytest.raises(StoreError, match=r"ftp://host/x.*unknown scheme"):
        open_object_store("ftp://host/x")
    with pytest.raises(StoreError, match="three slashes"):
        open_object_store("file://relative/path")
    with pytest.raises(StoreError, match="empty"):
        open_object_store("")


# --- run files -------------------------------------------------------------------------------------


def test_run_files_round_trip_and_list(store: BaselineStore) -> None:
    day1, day2 = date(2026, 12, 1), date(2026, 12, 2)
    key = store.write_run_file("run-42", day2, "results.parquet", b"r42")
    assert key == "runs/date=2026-12-02/run=run-42/results.parquet"
    store.write_run_file("run-42", day2, "report.html", b"<html>")
    store.write_run_file("run-7", day1, "stack.json", b"{}")
    store.write_run_file("run-9", datetime(2026, 12, 2, 23, 59, tzinfo=UTC), "verdicts.parquet", b"v")
    store.objects.put("runs/README", b"a person's note")
    assert store.read_run_file("run-42", day2, "results.parquet") == b"r42"
    assert store.list_runs() == [(day1, "run-7"), (day2, "run-42"), (day2, "run-9")]
    with pytest.raises(StoreError, match="no run file"):
        store.read_run_file("run-42", day1, "results.parquet")
    with pytest.raises(ValueError, match="DNS label"):
        store.write_run_file("Run_42", day1, "x", b"")
    with pytest.raises(ValueError, match="one plain file name"):
        store.write_run_file("run-42", day1, "../x", b"")


def test_run_files_do_not_disturb_baselines(store: BaselineStore) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    store.write_run_file("run-1", date(2026, 12, 1), "results.parquet", b"x")
    assert [i.version for i in store.versions()] == [v1]
    assert np.array_equal(store.read()["key"].to_numpy(), np.array(["GPU-1"], dtype=object))
