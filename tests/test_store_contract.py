"""The store's contract, one suite run on both backends: the file store (real files under ``tmp_path``) and
the S3 store (SeaweedFS, a real Go S3 server on loopback, one per module, each test under a prefix of its own).

What a backend must do — versions and their parent chain, the conditional ``current`` pointer, updates that
are re-applied on the winner's table and never lost to concurrent threads or processes, rollback, listing,
run files — is checked here once. What only one backend has (the file store's lock and temp files, S3's
etags, retries and injected faults) stays in ``test_store.py`` and ``test_store_s3.py``.

In CI (``CI=true``) a SeaweedFS that cannot start fails the S3 half; elsewhere it is skipped with the reason.
"""

from __future__ import annotations

import multiprocessing
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucert.errors import InputError, StoreConflict, StoreError, VersionNotFound
from gpucert.store import (
    BASELINE_COLUMNS,
    BaselineStore,
    Blob,
    FileObjectStore,
    ObjectStore,
    S3ObjectStore,
    UnknownVersion,
    empty_baseline,
    open_store,
)

from .s3servers import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS, ServerDidNotStart, s3_client
from .test_store import add_key, keys_of, table
from .unavailable import unavailable

BUCKET = "gpucert-contract"


@dataclass(frozen=True)
class Backend:
    """One place a store lives: how to open its objects (a fresh view each time, as another writer would),
    its URI (what a process opens), and how to put a raw entry there behind the store's back."""

    name: str
    uri: str
    open_objects: Callable[[], ObjectStore]
    plant_raw: Callable[[str], None]
    #: What the store must not have made when it was only read.
    untouched: Callable[[], bool]

    def objects(self) -> ObjectStore:
        return self.open_objects()

    def store(self) -> BaselineStore:
        return BaselineStore(self.open_objects())


def require_s3_server(exc: ServerDidNotStart) -> None:
    """An S3 server that cannot start: a failure in CI, a skip with the reason elsewhere."""
    unavailable(f"SeaweedFS cannot start here: {exc}")


@pytest.fixture(scope="module")
def seaweedfs_endpoint() -> Iterator[str]:
    weed = SeaweedFS(BUCKET)
    try:
        endpoint = weed.start()
    except ServerDidNotStart as exc:
        require_s3_server(exc)
    try:
        yield endpoint
    finally:
        weed.stop()


def _s3_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, endpoint: str) -> None:
    """Test credentials and the endpoint from the environment (boto3's chain, which the processes a test
    starts inherit), nothing from the host's ~/.aws."""
    nowhere = str(tmp_path / "no-aws-config")
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (
        ("AWS_CONFIG_FILE", nowhere),
        ("AWS_SHARED_CREDENTIALS_FILE", nowhere),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
        ("AWS_DEFAULT_REGION", REGION),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("GPUCERT_S3_ENDPOINT", endpoint),
    ):
        monkeypatch.setenv(name, value)


def _file_backend(root: Path) -> Backend:
    def plant(key: str) -> None:
        path = root / key
        if key.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)  # a folder, which is no object
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")

    return Backend("file", root.as_uri(), lambda: FileObjectStore(root), plant, lambda: not root.exists())


def _s3_backend(endpoint: str) -> Backend:
    prefix = f"c/{secrets.token_hex(6)}"
    client = s3_client(endpoint)

    def plant(key: str) -> None:
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{key}", Body=b"")

    def untouched() -> bool:
        return not client.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/").get("KeyCount")

    def objects() -> ObjectStore:
        return S3ObjectStore(BUCKET, prefix, endpoint_url=endpoint, region=REGION)

    return Backend("s3", f"s3://{BUCKET}/{prefix}", objects, plant, untouched)


@pytest.fixture(params=["file", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Backend:
    if request.param == "file":
        return _file_backend(tmp_path / "store")
    endpoint: str = request.getfixturevalue("seaweedfs_endpoint")
    _s3_env(monkeypatch, tmp_path, endpoint)
    return _s3_backend(endpoint)


@pytest.fixture
def store(backend: Backend) -> BaselineStore:
    return backend.store()


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
    # Every race lost on current was cleaned up by its loser: only the chain is listed, or stored.
    assert set(parents) == set(chain), "a version that lost the race on current is listed"
    stored = {k.split("/")[1].removeprefix("v=") for k in store.objects.list("baselines/v=")}
    assert stored == set(chain), "a losing version was left behind"


# --- versions ---------------------------------------------------------------------------------------


def test_empty_store_reads_an_empty_typed_table(backend: Backend, store: BaselineStore) -> None:
    assert store.current_version() is None
    assert store.versions() == []
    got = store.read()
    assert got.empty
    assert list(got.columns) == list(BASELINE_COLUMNS)
    assert got.dtypes.equals(empty_baseline().dtypes)
    assert store.objects.list("") == []
    assert backend.untouched(), "opening or reading must not write anything"


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


def test_a_garbled_current_pointer_is_an_error(store: BaselineStore) -> None:
    store.objects.put("baselines/current", b"\xff\xfe not a version")
    with pytest.raises(StoreError, match="does not hold a version id"):
        store.read()


# --- the conditional pointer and concurrent writers ------------------------------------------------


def test_put_if_is_compare_and_swap_on_the_etag(backend: Backend) -> None:
    objects = backend.objects()
    etag = objects.put_if("a/b", b"one", if_match=None)
    with pytest.raises(StoreConflict, match="already exists"):
        objects.put_if("a/b", b"two", if_match=None)
    with pytest.raises(StoreConflict, match="expected etag"):
        objects.put_if("a/b", b"two", if_match="0" * 32)
    with pytest.raises(StoreConflict):  # the same bytes under a stale etag: still a conflict
        objects.put_if("a/b", b"one", if_match="0" * 32)
    with pytest.raises(StoreConflict):
        objects.put_if("missing", b"x", if_match=etag)
    assert objects.get("a/b") == Blob(b"one", etag)
    etag2 = objects.put_if("a/b", b"two", if_match=etag)
    assert etag2 != etag
    assert objects.get("a/b") == Blob(b"two", etag2)
    assert objects.put("a/b", b"two") == etag2, "the etag is a function of the content"
    assert objects.exists("a/b")
    assert not objects.exists("missing")
    assert objects.get("missing") is None


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


def test_update_reapplies_its_change_on_the_winners_table(backend: Backend, store: BaselineStore) -> None:
    store.update(add_key("GPU-1"), message="one")
    rival = backend.store()
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


def test_update_gives_up_after_its_attempts(backend: Backend, store: BaselineStore) -> None:
    store.update(add_key("GPU-1"), message="one")
    rival = backend.store()
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


def test_concurrent_threads_never_lose_an_update(backend: Backend) -> None:
    barrier = threading.Barrier(3)
    errors: list[BaseException] = []

    def work(name: str) -> None:
        try:
            _process_writer(backend.uri, name, 4, barrier)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"t{w}",)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    _assert_linear_history(backend.store(), {f"t{w}-{i}" for w in range(3) for i in range(4)})


def test_concurrent_processes_never_lose_an_update(backend: Backend) -> None:
    # The child processes open the store from its URI alone (an S3 endpoint and credentials come from the
    # environment they inherit, as on a real host).
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    count = 5
    workers = [ctx.Process(target=_process_writer, args=(backend.uri, f"p{w}", count, barrier)) for w in range(2)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(timeout=120)
    assert [p.exitcode for p in workers] == [0, 0]
    _assert_linear_history(open_store(backend.uri), {f"p{w}-{i}" for w in range(2) for i in range(count)})


# --- rollback ---------------------------------------------------------------------------------------


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
    assert store.current_version() == v2


@pytest.mark.parametrize("version", ["20990101T000000Z-deadbeef", "../../etc", "", "v=1/x"])
def test_rollback_to_an_unknown_version_fails(store: BaselineStore, version: str) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    with pytest.raises(UnknownVersion, match=f"no baseline version {version!r}"):
        store.rollback(version)
    with pytest.raises(UnknownVersion) as caught:
        store.read(version)
    assert isinstance(caught.value, InputError), "a mistyped version is the user's to fix (exit 2)"
    assert isinstance(caught.value, VersionNotFound)
    assert store.current_version() == v1


# --- objects and run files --------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(alphabet="abz09-_=", min_size=1, max_size=6), min_size=1, max_size=4), st.binary())
def test_any_safe_key_round_trips(backend: Backend, parts: list[str], data: bytes) -> None:
    # Each example under a folder of its own: the backend is shared by the examples of one test.
    key = "/".join([f"h{secrets.token_hex(4)}", *parts])
    objects = backend.objects()
    etag = objects.put(key, data)
    assert objects.get(key) == Blob(data, etag)
    assert objects.exists(key)
    assert key in objects.list(key.split("/")[0])


def test_list_is_a_sorted_string_prefix_match(backend: Backend) -> None:
    objects = backend.objects()
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
    # Names no store key can have (a hidden part, a folder) are not listed.
    backend.plant_raw("a/.hidden")
    backend.plant_raw("c/")
    assert objects.list("") == ["a/1", "a/10/x", "a/2", "ab/3", "b/2"]


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
