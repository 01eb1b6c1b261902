"""The file store's own behaviour: its layout, crashes mid-write, temp files, bad tables, keys, roots and URIs.

Everything runs against real files under ``tmp_path``. The contract every backend keeps (versions, the
conditional ``current`` pointer, concurrent threads and processes, rollback, listing, run files) is checked
once for both backends in ``test_store_contract.py``.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Callable
from datetime import date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpucert.cli import main
from gpucert.errors import BaselineFormatError, InputError, StoreConflict, StoreError, StoreUnavailable, VersionNotFound
from gpucert.results import write_results
from gpucert.store import (
    BASELINE_COLUMNS,
    BaselineStore,
    FileObjectStore,
    ObjectStore,
    StoreNotFound,
    StoreURIError,
    UnknownVersion,
    empty_baseline,
    open_object_store,
    open_store,
    validate_baseline,
)
from gpucert.tickets import LocalTickets
from gpucert_sim.fleet import Fleet

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


def test_layout_and_meta_follow_the_design(store: BaselineStore, tmp_path: Path) -> None:
    v1 = store.update(add_key("GPU-1"), message="m")
    root = tmp_path / "store"
    assert (root / "baselines" / "current").read_text() == f"{v1}\n"
    assert (root / "baselines" / f"v={v1}" / "baseline.parquet").is_file()
    meta = json.loads((root / "baselines" / f"v={v1}" / "meta.json").read_text())
    assert meta == {"version": v1, "parent": None, "created_at": meta["created_at"], "message": "m", "rows": 1}
    assert meta["created_at"].endswith("Z")
    assert datetime.fromisoformat(meta["created_at"]).tzinfo is not None
    assert (root / "baselines" / f"v={v1}" / "made-current").read_text() == f"{v1}\n"
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
    # The new version was complete before the pointer was tried, but it never was the baseline.
    infos = store.versions()
    assert [(i.version, i.is_current) for i in infos] == [(v1, True)]


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


@pytest.mark.parametrize("key", ["../x", "a/../b", "/etc/passwd", "a//b", "a/", "", ".hidden", "a/.lock", "a\\b"])
def test_unsafe_keys_are_refused(tmp_path: Path, key: str) -> None:
    objects = FileObjectStore(tmp_path / "root")
    with pytest.raises(ValueError, match="store key"):
        objects.put(key, b"x")
    with pytest.raises(ValueError, match="store key"):
        objects.get(key)
    with pytest.raises(ValueError, match="store key"):
        objects.put_if(key, b"x", if_match=None)
    assert not (tmp_path / "root").exists()


def test_an_unwritable_root_is_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store = open_store(str(blocker / "store"))
    assert store.read().empty, "a writer's absent root reads as an empty store"
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


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("gs://bucket/x", "unknown scheme 'gs'"),
        ("ftp://", "unknown scheme 'ftp'"),
        ("http://host/store", "unknown scheme 'http'"),
        ("s3://", "names a bucket"),
        ("s3:///prefix", "names a bucket"),
        ("s3:bucket/prefix", "names a bucket"),
        ("s3://[oops/x", "not a valid URI"),
        ("s3://bucket:port/x", "not a valid URI"),
        ("s3://bad bucket/x", "not an S3 bucket name"),
        ("file://host/x", "three slashes"),
        ("file:", "no path"),
        ("file:///srv/gpucert?x=1", r"no \?query"),
        ("   ", "empty"),
    ],
)
def test_a_uri_that_cannot_be_opened_is_input_naming_it(uri: str, words: str) -> None:
    with pytest.raises(StoreURIError, match=words) as caught:
        open_store(uri)
    assert isinstance(caught.value, InputError)
    assert isinstance(caught.value, StoreError)
    if uri.strip():
        assert repr(uri) in str(caught.value)


# --- run files -------------------------------------------------------------------------------------


def test_run_files_do_not_disturb_baselines(store: BaselineStore) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    store.write_run_file("run-1", date(2026, 12, 1), "results.parquet", b"x")
    assert [i.version for i in store.versions()] == [v1]
    assert np.array_equal(store.read()["key"].to_numpy(), np.array(["GPU-1"], dtype=object))


# --- versions that never were current ---------------------------------------------------------------


def _recording_writes(store: BaselineStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The id of every version ``store`` writes from now on (its own method, called through)."""
    written: list[str] = []
    original = store.write_version

    def write_version(frame: pd.DataFrame, *, parent: str | None, message: str) -> str:
        version = original(frame, parent=parent, message=message)
        written.append(version)
        return version

    monkeypatch.setattr(store, "write_version", write_version)
    return written


def test_a_version_that_lost_the_race_is_deleted_and_never_listed(
    store: BaselineStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    rival = open_store(str(tmp_path / "store"))
    written = _recording_writes(store, monkeypatch)
    rival_versions: list[str] = []

    def racing(t: pd.DataFrame) -> pd.DataFrame:
        if not rival_versions:  # the rival moves current between our read and our pointer move
            rival_versions.append(rival.update(add_key("GPU-rival"), message="rival"))
        return add_key("GPU-mine")(t)

    mine = store.update(racing, message="mine")
    loser, winner = written
    assert winner == mine
    assert loser != mine
    assert [i.version for i in store.versions()] == [v1, rival_versions[0], mine]
    assert not (tmp_path / "store" / "baselines" / f"v={loser}").exists(), "the loser deletes what it wrote"
    for attempt in (store.rollback, store.read):
        with pytest.raises(UnknownVersion, match=loser):
            attempt(loser)
    assert store.current_version() == mine


def test_a_loser_that_crashed_before_cleaning_up_is_never_listed_nor_a_rollback_target(store: BaselineStore) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    v2 = store.update(add_key("GPU-2"), message="two")
    # A writer that read v1, wrote its version, lost the pointer and died: its version stays on disk.
    lost = store.write_version(table("GPU-9"), parent=v1, message="lost")
    with pytest.raises(StoreConflict):
        store.move_current(lost, expected=v1)
    # And one that died between writing its version and trying to move the pointer at all.
    crashed = store.write_version(table("GPU-8"), parent=v2, message="crashed")
    assert {lost, crashed} <= {k.split("/")[1].removeprefix("v=") for k in store.objects.list("baselines/")}
    assert [i.version for i in store.versions()] == [v1, v2]
    for version in (lost, crashed):
        with pytest.raises(UnknownVersion, match="never made current"):
            store.rollback(version)
        with pytest.raises(UnknownVersion):
            store.read(version)
        with pytest.raises(UnknownVersion):
            store.write_version(table("GPU-7"), parent=version, message="on a loser")
    assert store.current_version() == v2
    # The next update is built on the real current, as if the dead writers had never been.
    v3 = store.update(add_key("GPU-3"), message="three")
    assert [i.version for i in store.versions()] == [v1, v2, v3]
    assert keys_of(store.read()) == {"GPU-1", "GPU-2", "GPU-3"}


def test_a_crash_after_the_pointer_moved_loses_no_history(store: BaselineStore) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    # The writer moves current (the real conditional write) and dies before it marks its version.
    v2 = store.write_version(table("GPU-1", "GPU-2"), parent=v1, message="two")
    blob = store.objects.get("baselines/current")
    assert blob is not None
    store.objects.put_if("baselines/current", f"{v2}\n".encode(), if_match=blob.etag)
    assert not store.objects.exists(f"baselines/v={v2}/made-current")
    assert [(i.version, i.is_current) for i in store.versions()] == [(v1, False), (v2, True)]
    # Whoever moves the pointer away marks v2 first, so it stays listed and a rollback target.
    v3 = store.update(add_key("GPU-3"), message="three")
    assert store.objects.exists(f"baselines/v={v2}/made-current")
    assert [i.version for i in store.versions()] == [v1, v2, v3]
    store.rollback(v2)
    assert keys_of(store.read()) == {"GPU-1", "GPU-2"}
    store.rollback(v3)


def test_a_store_from_before_the_marker_keeps_its_history(store: BaselineStore, tmp_path: Path) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    v2 = store.update(add_key("GPU-2"), message="two")
    v3 = store.update(add_key("GPU-3"), message="three")
    for marker in (tmp_path / "store" / "baselines").glob("v=*/made-current"):
        marker.unlink()
    # Current and its parent chain count: a parent was current when its child was made.
    assert [i.version for i in store.versions()] == [v1, v2, v3]
    store.rollback(v1)
    assert keys_of(store.read()) == {"GPU-1"}
    assert [i.version for i in store.versions()] == [v1, v2, v3], "the rollback marked v3 as it left it"


def test_a_write_that_landed_despite_a_conflict_is_kept(store: BaselineStore) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    v2 = store.write_version(table("GPU-1", "GPU-2"), parent=v1, message="two")
    store.move_current(v2, expected=v1)
    # What update() does after a conflict its own write caused (an S3 answer lost on the wire).
    assert store._settle_lost(v2) is True
    assert [i.version for i in store.versions()] == [v1, v2]
    assert keys_of(store.read(v2)) == {"GPU-1", "GPU-2"}


def test_delete_removes_the_object_and_its_empty_folders(tmp_path: Path) -> None:
    objects = FileObjectStore(tmp_path / "root")
    objects.put("a/b/c", b"1")
    objects.put("a/d", b"2")
    objects.delete("a/b/c")
    assert objects.list("") == ["a/d"]
    assert not (tmp_path / "root" / "a" / "b").exists()
    objects.delete("a/b/c")  # missing: nothing to do
    objects.delete("a")  # a folder is not an object
    assert objects.list("") == ["a/d"]
    objects.delete("a/d")
    assert objects.list("") == []
    assert (tmp_path / "root").is_dir(), "the root itself stays"


# --- readers never create a store -------------------------------------------------------------------


@pytest.fixture(scope="module")
def results_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("results") / "night.parquet"
    write_results(Fleet.generate(nodes=2, seed=5).run("night-1", ts=T0, seed=1).results, path)
    return path


def test_opening_a_missing_root_to_read_is_input_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-store"
    for uri in (missing.as_uri(), str(missing)):
        with pytest.raises(StoreNotFound, match=str(missing)) as caught:
            open_store(uri, create=False)
        assert isinstance(caught.value, InputError)
        with pytest.raises(StoreNotFound):
            open_object_store(uri, create=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreNotFound, match="a-file"):
        open_store(str(blocker), create=False)
    assert not missing.exists()
    missing.mkdir()
    assert open_store(str(missing), create=False).versions() == [], "an existing empty root is an empty store"


@pytest.mark.parametrize(
    "argv",
    [
        ["compare", "{results}", "--baselines", "{store}", "--out", "{tmp}/v.csv"],
        ["baseline", "list", "--store", "{store}"],
        ["baseline", "rollback", "20990101T000000Z-00000000", "--store", "{store}"],
        ["baseline", "rebuild", "node-a", "--store", "{store}"],
    ],
    ids=["compare", "list", "rollback", "rebuild"],
)
def test_reading_commands_refuse_a_missing_store_root(
    tmp_path: Path, results_file: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    missing = tmp_path / "typo-store"
    args = [a.format(results=results_file, store=missing.as_uri(), tmp=tmp_path) for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert str(missing) in err
    assert "does not exist" in err
    assert "Traceback" not in err
    assert not missing.exists(), "a reading command created the store root"
    assert not (tmp_path / "v.csv").exists()


def test_baseline_build_creates_a_missing_root(
    tmp_path: Path, results_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "new" / "store"
    assert main(["baseline", "build", str(results_file), "--store", root.as_uri()]) == 0
    assert main(["baseline", "list", "--store", root.as_uri()]) == 0
    assert "* " in capsys.readouterr().out


@pytest.mark.parametrize("uri", ["gs://bucket/gpucert", "ftp://", "s3://", "s3:///prefix", "s3://[x/y"])
def test_commands_refuse_a_store_uri_they_cannot_open(
    tmp_path: Path, results_file: Path, capsys: pytest.CaptureFixture[str], uri: str
) -> None:
    assert main(["baseline", "list", "--store", uri]) == 2
    assert repr(uri) in capsys.readouterr().err
    assert main(["baseline", "build", str(results_file), "--store", uri]) == 2
    assert repr(uri) in capsys.readouterr().err
    out = tmp_path / "v.csv"
    assert main(["compare", str(results_file), "--baselines", uri, "--out", str(out)]) == 2
    assert repr(uri) in capsys.readouterr().err


def test_rollback_to_an_unknown_version_is_one_line_pointing_at_the_listing(
    store: BaselineStore, capsys: pytest.CaptureFixture[str]
) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    assert main(["baseline", "rollback", "20990101T000000Z-00000000", "--store", store.uri]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "20990101T000000Z-00000000" in err
    assert f"`gpucert baseline list --store {store.uri}`" in err
    assert store.current_version() == v1


def test_tickets_list_never_creates_a_ticket_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no" / "such" / "path"
    assert main(["tickets", "list", "--tickets", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err
    assert main(["tickets", "list", "--tickets", str(missing / "tickets.sqlite")]) == 2
    assert main(["tickets", "list", "--tickets", str(tmp_path / "typo.sqlite")]) == 2
    assert "typo.sqlite" in capsys.readouterr().err
    assert main(["tickets", "list", "--store", (tmp_path / "nope").as_uri()]) == 2
    assert list(tmp_path.iterdir()) == [], "listing created something"
    # A store root that exists but has no tickets yet simply has none.
    root = tmp_path / "store"
    root.mkdir()
    assert main(["tickets", "list", "--store", root.as_uri()]) == 0
    assert capsys.readouterr().out.strip() == "no tickets"
    assert main(["tickets", "list", "--tickets", str(root), "--state", "open"]) == 0
    assert capsys.readouterr().out.strip() == "no open tickets"
    assert list(root.iterdir()) == []
    # An existing ticket file is listed (and not re-created).
    LocalTickets(root / "tickets.sqlite").tickets()
    assert main(["tickets", "list", "--tickets", str(root / "tickets.sqlite")]) == 0
    assert capsys.readouterr().out.strip() == "no tickets"


# --- links ------------------------------------------------------------------------------------------


def test_a_file_store_links_to_a_file_uri_a_browser_opens(store: BaselineStore, tmp_path: Path) -> None:
    key = store.write_run_file("run-42", date(2026, 12, 1), "report.html", b"<html>report</html>")
    url = store.link(key)
    assert url == (tmp_path / "store" / key).as_uri()
    with urllib.request.urlopen(url) as answer:
        assert answer.read() == b"<html>report</html>"


def test_a_public_url_makes_links_under_it(tmp_path: Path) -> None:
    store = open_store((tmp_path / "store").as_uri(), public_url="https://gpucert.example.com/store/")
    assert store.public_url == "https://gpucert.example.com/store"
    key = "runs/date=2026-12-01/run=run-42/report.html"
    assert store.link(key) == f"https://gpucert.example.com/store/{key}"
    assert store.link("runs/a b/x#y.html").endswith("/store/runs/a%20b/x%23y.html")


@pytest.mark.parametrize("url", ["ftp://host/x", "gpucert.example.com", "https://", "https://h/x?sig=1", "http://[x"])
def test_a_public_url_that_is_not_one_is_refused(tmp_path: Path, url: str) -> None:
    with pytest.raises(StoreURIError, match="public URL") as caught:
        open_store(str(tmp_path), public_url=url)
    assert isinstance(caught.value, InputError)


def test_links_refuse_unsafe_keys_and_impossible_expiries(store: BaselineStore) -> None:
    with pytest.raises(ValueError, match="store key"):
        store.link("../etc/passwd")
    for expires_s in (0, -1, 7 * 24 * 3600 + 1):
        with pytest.raises(ValueError, match="expires_s"):
            store.link("runs/x", expires_s=expires_s)
    assert store.link("runs/x", expires_s=7 * 24 * 3600).startswith("file://")


# --- provenance: the runs a baseline rests on -------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"runs": "seed-0"}, "must be a JSON array of distinct run ids, not 'seed-0'"),
        ({"runs": '{"run": "seed-0"}'}, "must be a JSON array of distinct run ids"),
        ({"runs": '["seed-0", 7]'}, "must be a JSON array of distinct run ids"),
        ({"runs": '["seed-0", ""]'}, "must be a JSON array of distinct run ids"),
        ({"runs": '["seed-0", "seed-0"]'}, "must be a JSON array of distinct run ids"),  # a run merged twice
        ({"runs": '["a", "b", "c"]', "n": 2}, "names 3 runs, more than n = 2"),
        ({"runs": 17}, "must be text"),
    ],
)
def test_validation_names_a_bad_runs_value(change: dict[str, Any], words: str) -> None:
    frame = pd.DataFrame([row("GPU-1", runs='["seed-0"]'), {**row("GPU-2"), **change}])
    with pytest.raises(BaselineFormatError) as caught:
        validate_baseline(frame, "src")
    message = str(caught.value)
    assert message.startswith("src: 1 problem ")
    assert "row 2, column 'runs'" in message
    assert words in message


def test_a_model_reference_may_rest_on_more_runs_than_its_sample_count_says() -> None:
    # A model row's n counts samples (GPUs × runs), not runs; an own row's n counts runs.
    model = row("NVIDIA H200", level="model", node="", n=1, runs='["a", "b"]')
    assert validate_baseline(pd.DataFrame([model]), "src")["runs"].iloc[0] == '["a", "b"]'


def test_runs_round_trip_and_an_absent_runs_column_reads_as_unknown(store: BaselineStore) -> None:
    import io

    import pyarrow.parquet as pq

    frame = pd.DataFrame([row("GPU-1", runs='["seed-0", "seed-1"]', n=2), row("GPU-2")])
    version = store.update(lambda t: frame, message="with runs")
    got = store.read()
    assert list(got["runs"]) == ['["seed-0", "seed-1"]', ""]
    assert str(got["runs"].dtype) == "str"
    # A version written before the column existed: its Parquet file has no 'runs' at all.
    legacy = io.BytesIO()
    validate_baseline(frame, "x").drop(columns="runs").to_parquet(legacy, index=False)
    store.objects.put(f"baselines/v={version}/baseline.parquet", legacy.getvalue())
    old = store.read()
    assert list(old.columns) == list(BASELINE_COLUMNS)
    assert list(old["runs"]) == ["", ""]
    pd.testing.assert_frame_equal(old.drop(columns="runs"), got.drop(columns="runs"))
    # An update over it writes the column from then on.
    store.update(lambda t: t, message="rewrite")
    written = store.objects.get(f"baselines/v={store.current_version()}/baseline.parquet")
    assert written is not None
    assert "runs" in pq.read_schema(io.BytesIO(written.data)).names


def test_an_all_empty_optional_column_of_any_dtype_is_empty_text() -> None:
    # pandas makes a column of a key no row has float64 (NaN): it is empty, not "numbers in a text column".
    frame = pd.DataFrame([row("GPU-1"), row("GPU-2")], columns=list(BASELINE_COLUMNS))
    assert str(frame["runs"].dtype) == "float64"
    assert list(validate_baseline(frame, "src")["runs"]) == ["", ""]
    with pytest.raises(BaselineFormatError, match="must hold text"):
        validate_baseline(frame.assign(runs=[1.0, np.nan]), "src")
