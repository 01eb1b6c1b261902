"""The record of what the fleet was configured with (ConfigMap ``gpucert-stack``): what a full configure
writes, what a run for some nodes takes from it, what it refuses to read, and reading it over HTTP."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import kubernetes_validate
import pytest

from gpucert.errors import InputError
from gpucert.kube import connect
from gpucert.stack import (
    RECORD_NAME,
    RELEASE_COMPONENTS,
    NodeInfo,
    StackRecord,
    StackRequest,
    follow_record,
    load_matrix,
    plan_stack,
    read_record,
    record_departures,
    record_manifest,
    render_stack,
)
from gpucert_sim import SimCluster

NS = "gpucert-system"
MIRROR = "registry.local:5000/mirror"


def _node(name: str = "gpu-a") -> NodeInfo:
    return NodeInfo(
        name=name,
        gpu_model="NVIDIA H200",
        gpu_count=8,
        kernel="5.15.0-119-generic",
        os_image="Ubuntu 22.04.4 LTS",
        container_runtime="containerd://1.7.20",
        kubelet_version="v1.33.5",
    )


REQUEST = StackRequest(release="25.10.0", versions={"driver": " 570.195.03 "}, registry=MIRROR + "/")


def test_a_full_run_records_its_release_pins_registry_and_images() -> None:
    plan = plan_stack([_node()], REQUEST, load_matrix(), namespace=NS)
    manifest = record_manifest(plan)
    assert (manifest.step, manifest.kind, manifest.name, manifest.namespace) == (
        "namespace",
        "ConfigMap",
        RECORD_NAME,
        NS,
    )
    data = manifest.obj["data"]
    assert data["format"] == "1"
    assert data["release"] == "25.10.0"
    assert data["registry"] == MIRROR  # as the planner reads it: no trailing slash
    assert data["pinned.driver"] == "570.195.03"
    for component in RELEASE_COMPONENTS:
        assert data[f"version.{component}"] == plan.versions[component]
        assert data[f"image.{component}"] == plan.images[component]
        assert data[f"image.{component}"].startswith(MIRROR + "/")
    assert manifest.obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpucert"
    kubernetes_validate.validate(dict(manifest.obj), "1.33", strict=True)
    assert StackRecord.from_data(data, "here") == StackRecord.of(plan)


def test_the_record_comes_right_after_the_namespace_and_only_when_asked() -> None:
    plan = plan_stack([_node()], REQUEST, load_matrix(), namespace=NS)
    full = render_stack(plan)
    assert [(m.kind, m.name) for m in full[:2]] == [("Namespace", NS), ("ConfigMap", RECORD_NAME)]
    limited = render_stack(plan, record=False)
    assert limited == [m for m in full if m.name != RECORD_NAME or m.kind != "ConfigMap"]


def test_the_record_does_not_depend_on_the_nodes() -> None:
    # A joining node must not change it, or onboarding would rewrite it.
    one = plan_stack([_node("a")], REQUEST, load_matrix(), namespace=NS)
    many = plan_stack([_node("b"), _node("c"), _node("d")], REQUEST, load_matrix(), namespace=NS)
    assert record_manifest(one) == record_manifest(many)


def test_no_registry_and_no_pins_leave_no_keys() -> None:
    plan = plan_stack([_node()], StackRequest(), load_matrix(), namespace=NS)
    data = StackRecord.of(plan).data()
    assert "registry" not in data
    assert not [k for k in data if k.startswith("pinned.")]
    assert data["release"] == load_matrix().newest_release().name  # the one chosen, not "the newest"


RECORD = StackRecord(release="25.10.0", pinned={"driver": "570.195.03"}, registry=MIRROR)
PINS = {"driver": "570.195.03"}


@pytest.mark.parametrize(
    ("asked", "want", "taken"),
    [
        (StackRequest(), StackRequest("25.10.0", PINS, MIRROR), ("release", "versions", "registry")),
        (StackRequest(release="26.3.1"), StackRequest("26.3.1", PINS, MIRROR), ("versions", "registry")),
        (
            StackRequest(versions={"device-plugin": "v0.18.1"}),
            StackRequest("25.10.0", {"device-plugin": "v0.18.1"}, MIRROR),
            ("release", "registry"),
        ),
        (StackRequest(registry="nvcr.io"), StackRequest("25.10.0", PINS, "nvcr.io"), ("release", "versions")),
        (StackRequest("25.3.4", {"driver": "570.124.06"}, "r.local"), None, ()),
    ],
)
def test_explicit_fields_win_each_on_its_own(
    asked: StackRequest, want: StackRequest | None, taken: tuple[str, ...]
) -> None:
    assert follow_record(asked, RECORD) == (want or asked, taken)


def test_without_a_record_the_request_stands() -> None:
    assert follow_record(StackRequest(), None) == (StackRequest(), ())


def test_a_default_registry_and_no_pins_are_not_counted_as_taken() -> None:
    bare = StackRecord(release="25.10.0")
    assert follow_record(StackRequest(), bare) == (StackRequest(release="25.10.0"), ("release",))


def test_departures_name_each_change_the_fleet_would_see() -> None:
    plan = plan_stack([_node()], REQUEST, load_matrix(), namespace=NS)
    record = StackRecord.of(plan)
    assert record_departures(record, plan) == []
    assert record_departures(None, plan) == []
    moved = dataclasses.replace(record, release="25.3.4", images={**record.images, "device-plugin": "old:1"})
    assert record_departures(moved, plan) == [
        f"release 25.3.4 → {plan.release}",
        f"device-plugin old:1 → {plan.images['device-plugin']}",
    ]
    # A hand-made record without images only compares the release.
    assert record_departures(StackRecord(release=plan.release), plan) == []


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"release": "25.10.0"}, "format None"),
        ({"format": "2", "release": "25.10.0"}, "format '2'"),
        ({"format": "1"}, "no release"),
        ({"format": "1", "release": "  "}, "no release"),
        ({"format": "1", "release": "25.10.0", "pined.driver": "570.195.03"}, "keys it does not know: pined.driver"),
        ({"format": "1", "release": "25.10.0", "pinned.kernel": "6.1"}, "pinned.kernel"),
        ({"format": "1", "release": "25.10.0", "image.driver": "x"}, "image.driver"),
        ({"format": "1", "release": 25.1}, "values that are not text: release"),
        ([], "not a map"),
    ],
)
def test_a_record_that_is_not_one_is_refused_by_name(data: object, problem: str) -> None:
    with pytest.raises(InputError, match="ConfigMap ns/gpucert-stack") as caught:
        StackRecord.from_data(data, "ConfigMap ns/gpucert-stack")  # type: ignore[arg-type]
    assert problem in str(caught.value)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=1) as cluster:
        yield cluster


def test_read_over_http(sim: SimCluster) -> None:
    kube = connect(sim.kubeconfig_path)
    assert read_record(kube, "nowhere") is None  # no namespace yet: nothing recorded
    plan = plan_stack([_node()], REQUEST, load_matrix(), namespace="rec")
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "rec"}})
    assert read_record(kube, "rec") is None
    kube.apply(record_manifest(plan).obj)
    assert read_record(kube, "rec") == StackRecord.of(plan)
    kube.merge_patch("v1", "ConfigMap", RECORD_NAME, {"data": {"format": "9"}}, "rec")
    with pytest.raises(InputError, match=r"ConfigMap rec/gpucert-stack.*format '9'"):
        read_record(kube, "rec")
