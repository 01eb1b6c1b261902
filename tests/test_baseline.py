"""Baselines: seeded from passing runs, then held; the model reference trimmed the SuperBench way; a run
counts once, in memory and through a file or S3 store."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import secrets
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpucert.baseline import build_baseline, forget, trimmed_mean, update_store
from gpucert.cli import main
from gpucert.results import write_results
from gpucert.store import BaselineStore, S3ObjectStore, empty_baseline, open_store, validate_baseline
from gpucert_sim.fleet import Fault, Fleet

from .conftest import T0, seed_waves
from .s3servers import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS, ServerDidNotStart, moto_server, s3_client
from .unavailable import unavailable

BUCKET = "gpucert-baseline-test"

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")


def own(table: pd.DataFrame, key: str, metric: str) -> pd.Series:
    hit = table[(table["key"] == key) & (table["metric"] == metric)]
    assert len(hit) == 1
    return hit.iloc[0]


def test_trimmed_mean_drops_rule_breakers_until_nothing_drops() -> None:
    samples = np.array([100.0] * 20 + [101.0] * 20 + [60.0, 150.0])
    center, spread, kept = trimmed_mean(samples, 5.0)
    assert kept == 40
    assert center == pytest.approx(100.5)
    assert spread == pytest.approx(np.std([100.0] * 20 + [101.0] * 20, ddof=1))
    assert trimmed_mean(np.array([np.nan]), 5.0)[2] == 0


def test_own_baselines_seed_over_five_passing_runs_then_hold() -> None:
    fleet = Fleet.generate(nodes=12, seed=3)
    table = empty_baseline()
    uuid = str(fleet.uuids[0])
    centers = []
    for i in range(7):
        wave = fleet.run(f"w-{i}", ts=T0 + dt.timedelta(days=i), seed=50 + i).results
        table, report = build_baseline(table, wave)
        row = own(table, uuid, "gemm_bf16_tflops")
        centers.append(row["center"])
        assert row["n"] == min(i + 1, 5)
    assert centers[5] == centers[4] == centers[6]  # held once five runs seeded it
    assert report.held > 0
    node = own(table, fleet.node_names[0], "nccl_allreduce_busbw_gbps")
    assert node["level"] == "node"
    assert node["n"] == 5
    gpu_row = own(table, uuid, "gemm_bf16_tflops")
    assert gpu_row["node"] == fleet.node_names[0]


def test_a_failing_gpu_never_teaches_its_baseline() -> None:
    fleet = Fleet.generate(nodes=12, seed=4)
    node = fleet.node_names[2]
    faulty = [Fault("slow_silicon", node=node, gpu=1, params={"gemm": 0.8, "hbm": 1.0})]
    waves = pd.concat(
        [fleet.run(f"w-{i}", ts=T0 + dt.timedelta(days=i), seed=60 + i, faults=faulty).results for i in range(3)],
        ignore_index=True,
    )
    table, report = build_baseline(empty_baseline(), waves)
    uuid = str(fleet.uuids[2 * 8 + 1])
    assert table[(table["key"] == uuid)].empty
    assert report.rejected >= 3
    healthy = str(fleet.uuids[2 * 8 + 2])
    assert own(table, healthy, "gemm_bf16_tflops")["n"] == 3


def test_a_build_merges_keys_absent_from_its_input_keep_their_values() -> None:
    fleet = Fleet.generate(nodes=12, seed=5)
    first, _ = build_baseline(empty_baseline(), seed_waves(fleet, 2, seed=70))
    part = fleet.run("later", ts=T0 + dt.timedelta(days=9), seed=79, nodes=fleet.node_names[:10]).results
    merged, _ = build_baseline(first, part)
    absent = str(fleet.uuids[11 * 8])
    pd.testing.assert_series_equal(
        own(first, absent, "hbm_copy_gbps"), own(merged, absent, "hbm_copy_gbps"), check_names=False
    )
    present = str(fleet.uuids[0])
    assert own(merged, present, "hbm_copy_gbps")["n"] == 3


def test_the_model_reference_is_rebuilt_from_passing_results() -> None:
    fleet = Fleet.generate(nodes=16, seed=6)
    table, report = build_baseline(empty_baseline(), seed_waves(fleet, 2, seed=80))
    model = own(table, "NVIDIA H200", "gemm_bf16_tflops")
    assert model["level"] == "model"
    assert 700 < model["center"] < 760
    assert model["n"] > 100
    assert report.models >= 5


def test_forget_drops_a_nodes_own_baselines_and_its_gpus() -> None:
    fleet = Fleet.generate(nodes=12, seed=7)
    table, _ = build_baseline(empty_baseline(), seed_waves(fleet, 1, seed=90))
    node = fleet.node_names[3]
    kept, dropped = forget(table, [node])
    assert dropped == 8 * 4 + 1
    assert not kept["key"].eq(node).any()
    assert not kept["node"].eq(node).any()
    assert len(kept) == len(table) - dropped


def test_trimmed_mean_is_not_dragged_off_by_one_wild_sample() -> None:
    # The mean of these is ≈ 35,500: nothing lies within 5 % of it, so SuperBench's rule alone would keep
    # that mean. The median restarts the trim instead.
    samples = np.array([730.0 + i % 7 for i in range(20)] + [730_000.0, np.inf, np.nan])
    center, _, kept = trimmed_mean(samples, 5.0)
    assert kept == 20
    assert 730 <= center <= 737


# --- a run counts once ---------------------------------------------------------------------------------------

FLEET = Fleet.generate(nodes=12, seed=21)
RUN_A = FLEET.run("run-a", ts=T0, seed=210).results
RUN_B = FLEET.run("run-b", ts=T0 + dt.timedelta(days=1), seed=211).results
RUN_C = FLEET.run("run-c", ts=T0 + dt.timedelta(days=2), seed=212).results


def parquet_bytes(table: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    table.to_parquet(buffer, index=False)
    return buffer.getvalue()


def runs_of(table: pd.DataFrame, level: str) -> set[str]:
    return set(table.loc[table["level"] == level, "runs"])


def test_merging_a_run_twice_leaves_every_baseline_byte_identical() -> None:
    once, first = build_baseline(empty_baseline(), RUN_A)
    twice, again = build_baseline(once, RUN_A)
    pd.testing.assert_frame_equal(twice, once)
    assert parquet_bytes(twice) == parquet_bytes(once)
    assert first.seeded > 0
    assert first.models == 5
    assert (again.seeded, again.held, again.models) == (0, 0, 0)
    assert again.repeated == first.seeded  # every own baseline says it already rests on the run


def test_one_run_never_fills_the_seed_slots() -> None:
    table = empty_baseline()
    for _ in range(6):  # more than seed_runs (5)
        table, _ = build_baseline(table, RUN_A)
    own = table[table["level"] != "model"]
    assert (own["n"] == 1).all()
    assert runs_of(table, "gpu") == runs_of(table, "node") == {'["run-a"]'}


def test_a_run_measured_again_under_its_id_counts_once() -> None:
    """A certify restarted with the same run id measures again (other values, later): it merges nothing."""
    once, _ = build_baseline(empty_baseline(), RUN_A)
    remeasured = FLEET.run("run-a", ts=T0 + dt.timedelta(hours=6), seed=219).results
    again, report = build_baseline(once, remeasured)
    pd.testing.assert_frame_equal(again, once)
    assert report.seeded == report.models == 0


def test_each_row_names_the_runs_it_rests_on() -> None:
    table, _ = build_baseline(empty_baseline(), RUN_A)
    table, _ = build_baseline(table, RUN_B)
    assert runs_of(table, "gpu") == runs_of(table, "node") == {'["run-a", "run-b"]'}
    assert runs_of(table, "model") == {'["run-b"]'}  # rebuilt from the build's runs
    assert (table.loc[table["level"] != "model", "n"] == 2).all()
    # Both runs again, together: already in every own baseline, and nothing newer for the references.
    again, report = build_baseline(table, pd.concat([RUN_A, RUN_B], ignore_index=True))
    pd.testing.assert_frame_equal(again, table)
    assert report.repeated == 2 * (len(table) - 5)
    assert report.models == 0


def test_the_model_reference_counts_each_run_once() -> None:
    table, _ = build_baseline(empty_baseline(), RUN_A)
    table, _ = build_baseline(table, RUN_B)
    gpus = FLEET.n_gpus
    # A build of a re-merged run with a new one: the reference is rebuilt from both, each run once.
    rebuilt, report = build_baseline(table, pd.concat([RUN_B, RUN_C], ignore_index=True))
    model = own(rebuilt, "NVIDIA H200", "gemm_bf16_tflops")
    assert model["runs"] == '["run-b", "run-c"]'
    assert gpus < model["n"] <= 2 * gpus  # one sample per GPU and run, never run-b's twice
    assert report.models == 5
    assert (rebuilt.loc[rebuilt["level"] != "model", "n"] == 3).all()
    # An older run than the reference's newest never rebuilds it: the reference follows the fleet forward.
    older, report = build_baseline(rebuilt, RUN_A)
    pd.testing.assert_frame_equal(older, rebuilt)
    assert report.models == 0


def test_a_table_from_before_the_runs_column_has_unknown_provenance() -> None:
    built, _ = build_baseline(empty_baseline(), RUN_A)
    legacy = validate_baseline(built.drop(columns="runs"), "an old baseline.parquet")
    assert set(legacy["runs"]) == {""}
    # The run it was built from cannot be named, but it is no newer than what each row last took.
    again, report = build_baseline(legacy, RUN_A)
    pd.testing.assert_frame_equal(again, legacy)
    assert report.seeded == report.models == 0
    # A newer run extends it and is named from then on (fewer runs named than counted).
    table, report = build_baseline(legacy, RUN_B)
    assert report.seeded == len(legacy) - 5
    assert runs_of(table, "gpu") == {'["run-b"]'}
    assert (table.loc[table["level"] == "gpu", "n"] == 2).all()
    pd.testing.assert_frame_equal(build_baseline(table, RUN_B)[0], table)


# --- the same, through the store: a file store and S3 (SeaweedFS and moto) ---------------------------------


@pytest.fixture(scope="module")
def s3_endpoints() -> Iterator[dict[str, str]]:
    """Both S3 servers of tests/s3servers.py, each with the test bucket; a server that cannot start here is
    left out (the file store is always tested)."""
    found: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        weed = SeaweedFS(BUCKET)
        try:
            found["seaweedfs"] = weed.start()
            stack.callback(weed.stop)
        except ServerDidNotStart:
            pass
        try:
            endpoint = stack.enter_context(moto_server())
        except ImportError:
            pass
        else:
            s3_client(endpoint).create_bucket(Bucket=BUCKET)
            found["moto"] = endpoint
        yield found


@pytest.fixture(params=["file", "seaweedfs", "moto"])
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> BaselineStore:
    if request.param == "file":
        return open_store((tmp_path / "store").as_uri())
    endpoint = request.getfixturevalue("s3_endpoints").get(request.param)
    if endpoint is None:
        unavailable(f"{request.param} cannot start here")
    # boto3's standard chain with the servers' test credentials, nothing from the host.
    nowhere = str(tmp_path / "no-aws-config")
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", nowhere)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", nowhere)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    prefix = f"t/{secrets.token_hex(6)}"
    return BaselineStore(S3ObjectStore(BUCKET, prefix, endpoint_url=endpoint, region=REGION))


def stored_table(store: BaselineStore) -> bytes:
    blob = store.objects.get(f"baselines/v={store.current_version()}/baseline.parquet")
    assert blob is not None
    return blob.data


def test_a_store_merging_a_run_twice_keeps_every_baseline_byte_identical(store: BaselineStore) -> None:
    first = update_store(store, RUN_A, message="certify run-a")
    table, data = store.read(), stored_table(store)
    # The same file built again, and a certify restarted under the run id (measured again).
    again = update_store(store, RUN_A, message="baseline build run-a")
    restarted = FLEET.run("run-a", ts=T0 + dt.timedelta(hours=6), seed=219).results
    third = update_store(store, restarted, message="certify run-a")
    assert again.version == third.version == first.version, "a merge that changes nothing writes no version"
    assert first.changed
    assert not again.changed
    assert not third.changed
    assert [v.version for v in store.versions()] == [first.version]
    assert stored_table(store) == data
    pd.testing.assert_frame_equal(store.read(), table)
    assert again.report is not None
    assert first.report is not None
    assert again.report.seeded == 0
    assert again.report.repeated == first.report.seeded
    # A new run is still merged, once.
    later = update_store(store, RUN_B, message="certify run-b")
    assert later.version != first.version
    assert (store.read().query("level != 'model'")["n"] == 2).all()
    assert update_store(store, RUN_B, message="certify run-b").version == later.version


def test_baseline_build_of_the_same_file_twice_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "run-a.parquet"
    write_results(RUN_A, path)
    uri = (tmp_path / "store").as_uri()
    assert main(["baseline", "build", str(path), "--store", uri]) == 0
    store = open_store(uri)
    version, data = store.current_version(), stored_table(store)
    assert main(["baseline", "build", str(path), "--store", uri]) == 0
    assert store.current_version() == version
    assert [v.version for v in store.versions()] == [version]
    assert stored_table(store) == data
