"""gpucert.kube: errors mapped from real HTTP answers, retries, and every verb against the simulator."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpucert.errors import InputError
from gpucert.kube import (
    Kube,
    KubeConflict,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeServerError,
    KubeThrottled,
    KubeUnreachable,
    RetryPolicy,
    _client,
    connect,
)
from gpucert.kube._errors import from_response
from gpucert_sim import ApiFaults, SimCluster

FAST = RetryPolicy(attempts=8, base_delay_s=0.001, max_delay_s=0.01)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=3, controllers=False) as cluster:
        yield cluster


@pytest.fixture
def kube(sim: SimCluster) -> Iterator[Kube]:
    sim.set_faults(None)
    yield connect(sim.kubeconfig_path, retry=FAST)
    sim.set_faults(None)


def _configmap(name: str, data: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"},
        "data": data or {"k": "v"},
    }


# --- the mapping of answers to errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (404, KubeNotFound),
        (409, KubeConflict),
        (403, KubeForbidden),
        (401, KubeForbidden),
        (422, KubeInvalid),
        (400, KubeInvalid),
        (500, KubeServerError),
        (503, KubeServerError),
        (429, KubeThrottled),
    ],
)
def test_statuses_map_to_their_errors(status: int, kind: type) -> None:
    body = '{"kind":"Status","message":"nodes \\"x\\" is forbidden"}'
    error = from_response(status, body, {"Retry-After": "3"}, "get Node x")
    assert type(error) is kind
    assert str(error).startswith(f'get Node x: HTTP {status}: nodes "x" is forbidden')


def test_throttled_keeps_retry_after_and_ignores_an_http_date() -> None:
    assert from_response(429, "", {"Retry-After": "2"}, "x").retry_after == 2.0  # type: ignore[attr-defined]
    dated = from_response(429, "", {"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}, "x")
    assert dated.retry_after is None  # type: ignore[attr-defined]


def test_a_server_that_does_not_answer_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before use: nothing listens there
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }
    kube = connect(config_dict=config, retry=RetryPolicy(attempts=2, base_delay_s=0.001))
    with pytest.raises(KubeUnreachable, match="list nodes: no answer"):
        kube.nodes()


# --- retries -------------------------------------------------------------------------------------------


def test_retry_waits_retry_after_then_succeeds() -> None:
    answers: list[Exception | str] = [KubeThrottled("x", retry_after=1.5), KubeServerError("y", status=503), "ok"]
    slept: list[float] = []

    def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert RetryPolicy(base_delay_s=0.1).call(call, sleep=slept.append) == "ok"
    assert slept[0] == 1.5
    assert 0 <= slept[1] <= 0.2  # full jitter under the second back-off


def test_retry_gives_up_after_its_attempts_and_never_retries_a_4xx() -> None:
    calls = []

    def failing() -> None:
        calls.append(1)
        raise KubeServerError("boom", status=500)

    with pytest.raises(KubeServerError):
        RetryPolicy(attempts=3).call(failing, sleep=lambda s: None)
    assert len(calls) == 3

    calls.clear()

    def refused() -> None:
        calls.append(1)
        raise KubeNotFound("gone", status=404)

    with pytest.raises(KubeNotFound):
        RetryPolicy(attempts=3).call(refused, sleep=lambda s: None)
    assert len(calls) == 1


def test_a_long_retry_after_is_capped() -> None:
    answers: list[Exception | str] = [KubeThrottled("x", retry_after=600), "ok"]
    slept: list[float] = []

    def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert RetryPolicy(max_retry_after_s=5, deadline_s=60).call(call, sleep=slept.append) == "ok"
    assert slept == [5]


# --- verbs against the simulated API server ------------------------------------------------------------


def test_apply_creates_then_changes_nothing(kube: Kube) -> None:
    first = kube.apply(_configmap("apply-once"))
    again = kube.apply(_configmap("apply-once"))
    assert first["metadata"]["resourceVersion"] == again["metadata"]["resourceVersion"]
    changed = kube.apply(_configmap("apply-once", {"k": "w"}))
    assert changed["data"] == {"k": "w"}
    assert changed["metadata"]["resourceVersion"] != first["metadata"]["resourceVersion"]


def test_get_find_create_delete(kube: Kube) -> None:
    assert kube.find("v1", "ConfigMap", "nope", "default") is None
    with pytest.raises(KubeNotFound, match="get ConfigMap default/nope"):
        kube.get("v1", "ConfigMap", "nope", "default")
    kube.create(_configmap("made"))
    with pytest.raises(KubeConflict):
        kube.create(_configmap("made"))
    assert kube.get("v1", "ConfigMap", "made", "default")["data"] == {"k": "v"}
    assert kube.delete("v1", "ConfigMap", "made", "default") is True
    assert kube.delete("v1", "ConfigMap", "made", "default") is False


def test_list_pages_through_continue(kube: Kube, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(5):
        kube.apply(_configmap(f"page-{i}"))
    monkeypatch.setattr(_client, "_PAGE", 2)
    names = {c["metadata"]["name"] for c in kube.list_objects("v1", "ConfigMap", "default")}
    assert {f"page-{i}" for i in range(5)} <= names


def test_iterating_objects_asks_for_a_page_only_when_the_last_is_used(
    kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan of a fleet's pods holds one page at a time: the next is asked for when the caller gets to
    it, and the objects come as list_objects gives them."""
    for i in range(5):
        kube.apply(_configmap(f"page-{i}"))
    monkeypatch.setattr(_client, "_PAGE", 2)
    asked: list[str] = []
    request = kube.request

    def counting(method: str, path: str, **kwargs: Any) -> Any:
        asked.append(path)
        return request(method, path, **kwargs)

    monkeypatch.setattr(kube, "request", counting)
    objects = kube.iter_objects("v1", "ConfigMap", "default")
    assert asked == []
    first = [next(objects), next(objects)]
    assert len(asked) == 1
    rest = list(objects)
    assert len(asked) >= 3
    assert first + rest == kube.list_objects("v1", "ConfigMap", "default")


def test_label_node_sets_and_removes(kube: Kube) -> None:
    node = kube.nodes()[0]["metadata"]["name"]
    assert kube.label_node(node, {"gpucert.io/x": "1"})["metadata"]["labels"]["gpucert.io/x"] == "1"
    assert "gpucert.io/x" not in kube.label_node(node, {"gpucert.io/x": None})["metadata"]["labels"]
    assert kube.nodes("gpucert.io/x=1") == []


def test_unknown_kinds_are_refused(kube: Kube) -> None:
    with pytest.raises(ValueError, match="does not manage"):
        kube.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}})


def test_calls_ride_out_500s_and_429s(sim: SimCluster, kube: Kube) -> None:
    sim.set_faults(ApiFaults(error_rate=0.1, throttle_rate=0.05, retry_after_s=0, seed=7))
    for i in range(60):
        kube.apply(_configmap(f"flaky-{i % 3}", {"i": str(i)}))
        assert len(kube.nodes()) == 3


def test_connect_names_a_bad_kubeconfig(tmp_path: Path, sim: SimCluster) -> None:
    with pytest.raises(InputError, match="no such file"):
        connect(tmp_path / "missing")
    with pytest.raises(InputError, match="kubeconfig"):
        connect(sim.kubeconfig_path, context="no-such-context")
