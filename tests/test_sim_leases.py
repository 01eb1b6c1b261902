"""The simulated API server's ``coordination.k8s.io/v1`` Leases, driven with the official client's
``CoordinationV1Api``: served and discovered like a real server's, ``MicroTime`` kept to the microsecond,
and optimistic concurrency — an update, patch or delete carrying a stale ``resourceVersion`` is a 409
Conflict, so two writers racing for one Lease never both win."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpucert_sim import SimCluster


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=1, seed=3, controllers=False) as cluster:
        yield cluster


@pytest.fixture
def leases(api: client.ApiClient) -> client.CoordinationV1Api:
    return client.CoordinationV1Api(api)


T0 = datetime(2026, 3, 1, 2, 3, 4, 567891, tzinfo=UTC)


def lease(name: str, holder: str, *, at: datetime = T0, duration: int = 30) -> client.V1Lease:
    spec = client.V1LeaseSpec(
        holder_identity=holder, lease_duration_seconds=duration, acquire_time=at, renew_time=at, lease_transitions=0
    )
    return client.V1Lease(metadata=client.V1ObjectMeta(name=name), spec=spec)


def _status(err: pytest.ExceptionInfo[ApiException]) -> tuple[int, str]:
    return err.value.status, json.loads(err.value.body)["reason"]


def test_leases_are_discovered_as_a_namespaced_resource(api: client.ApiClient) -> None:
    groups = {g.name: g for g in client.ApisApi(api).get_api_versions().groups}
    assert groups["coordination.k8s.io"].preferred_version.group_version == "coordination.k8s.io/v1"
    served = {r.name: r for r in client.CoordinationV1Api(api).get_api_resources().resources}
    assert served["leases"].namespaced is True
    assert served["leases"].kind == "Lease"
    assert {"create", "get", "update", "delete", "list", "watch"} <= set(served["leases"].verbs)


def test_lease_crud_keeps_micro_time_and_lists_by_namespace(leases: client.CoordinationV1Api, ns: str) -> None:
    made = leases.create_namespaced_lease(ns, lease("gpucert-node-a", "run-1"))
    assert made.spec.holder_identity == "run-1"
    read = leases.read_namespaced_lease("gpucert-node-a", ns)
    assert (read.spec.acquire_time, read.spec.renew_time) == (T0, T0)  # microseconds and zone survive
    assert read.spec.lease_duration_seconds == 30
    assert read.metadata.generation is None  # the real Lease strategy keeps no generation
    assert [item.metadata.name for item in leases.list_namespaced_lease(ns).items] == ["gpucert-node-a"]
    with pytest.raises(ApiException) as err:
        leases.create_namespaced_lease(ns, lease("gpucert-node-a", "run-2"))
    assert _status(err) == (409, "AlreadyExists")
    with pytest.raises(ApiException) as err:
        leases.create_namespaced_lease("no-such-namespace", lease("gpucert-node-a", "run-2"))
    assert err.value.status == 404


def test_two_writers_from_one_read_one_wins_one_gets_a_conflict(leases: client.CoordinationV1Api, ns: str) -> None:
    leases.create_namespaced_lease(ns, lease("gpucert-node-b", "run-1"))
    seen_a = leases.read_namespaced_lease("gpucert-node-b", ns)
    seen_b = leases.read_namespaced_lease("gpucert-node-b", ns)
    later = T0 + timedelta(seconds=31)
    seen_a.spec.holder_identity, seen_a.spec.renew_time = "run-a", later
    won = leases.replace_namespaced_lease("gpucert-node-b", ns, seen_a)
    assert int(won.metadata.resource_version) > int(seen_a.metadata.resource_version)
    seen_b.spec.holder_identity = "run-b"  # still carries the resourceVersion both read
    with pytest.raises(ApiException) as err:
        leases.replace_namespaced_lease("gpucert-node-b", ns, seen_b)
    assert _status(err) == (409, "Conflict")
    stale_patch = {
        "metadata": {"resourceVersion": seen_b.metadata.resource_version},
        "spec": {"holderIdentity": "run-b"},
    }
    with pytest.raises(ApiException) as err:
        leases.patch_namespaced_lease("gpucert-node-b", ns, stale_patch)
    assert _status(err) == (409, "Conflict")
    now = leases.read_namespaced_lease("gpucert-node-b", ns)
    assert (now.spec.holder_identity, now.spec.renew_time) == ("run-a", later)
    # Without a resourceVersion an update is unconditional, as for Leases on a real server.
    now.metadata.resource_version = None
    now.spec.lease_transitions = 1
    assert leases.replace_namespaced_lease("gpucert-node-b", ns, now).spec.lease_transitions == 1


def test_delete_with_a_stale_resource_version_precondition_is_a_conflict(
    leases: client.CoordinationV1Api, ns: str
) -> None:
    first = leases.create_namespaced_lease(ns, lease("gpucert-node-c", "run-1"))
    first.spec.renew_time = T0 + timedelta(seconds=5)
    renewed = leases.replace_namespaced_lease("gpucert-node-c", ns, first)
    stale = client.V1DeleteOptions(
        preconditions=client.V1Preconditions(resource_version=first.metadata.resource_version)
    )
    with pytest.raises(ApiException) as err:
        leases.delete_namespaced_lease("gpucert-node-c", ns, body=stale)
    assert _status(err) == (409, "Conflict")
    assert leases.read_namespaced_lease("gpucert-node-c", ns).spec.holder_identity == "run-1"
    current = client.V1DeleteOptions(
        preconditions=client.V1Preconditions(resource_version=renewed.metadata.resource_version)
    )
    leases.delete_namespaced_lease("gpucert-node-c", ns, body=current)
    with pytest.raises(ApiException) as err:
        leases.read_namespaced_lease("gpucert-node-c", ns)
    assert err.value.status == 404
