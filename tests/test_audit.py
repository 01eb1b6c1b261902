"""The audit trail (gpucert/audit): a hash chain in the store that names what was changed, removed or moved;
appends that never fork under concurrent writers (files and SeaweedFS S3); every Kubernetes write and
baseline move recorded, each also an events.k8s.io Event the official client and kubectl see.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from kubernetes import client

from gpucert.audit import AuditAction, AuditLog, AuditRecorder, check_chain
from gpucert.cli import main
from gpucert.kube import Kube, connect
from gpucert.store import BaselineStore, FileObjectStore, empty_baseline
from gpucert_sim import SimCluster

from .s3servers import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS, ServerDidNotStart
from .unavailable import require, unavailable

KUBECTL = require(shutil.which("kubectl") is not None, "kubectl is not on PATH (apt-get install kubernetes-client)")


def _actions(n: int, node: str = "gpu-node-00001") -> list[AuditAction]:
    return [AuditAction("label", "Node", node, after={"gpucert.io/state": f"s{i}"}, why=f"step {i}") for i in range(n)]


@pytest.fixture
def trail(tmp_path: Path) -> AuditLog:
    log = AuditLog(FileObjectStore(tmp_path))
    for batch in (3, 1, 4):
        log.append(_actions(batch), run_id="r1", trigger="cli", actor="test")
    return log


def _segment_files(root: Path) -> list[Path]:
    return sorted(root.glob("audit/date=*/*.jsonl"), key=lambda p: p.name)


# --- the chain -----------------------------------------------------------------------------------------


def test_an_intact_trail_checks_out_in_order(trail: AuditLog) -> None:
    checked = trail.check()
    assert checked.ok, checked.problem
    assert [e["seq"] for e in checked.entries] == list(range(1, 9))
    head = trail.head()
    assert head is not None
    assert (head["seq"], head["hash"]) == (8, checked.entries[-1]["hash"])


def test_one_changed_byte_names_the_entry(trail: AuditLog, tmp_path: Path) -> None:
    path = _segment_files(tmp_path)[2]  # entries 5-8
    text = path.read_text()
    path.write_text(text.replace('"s1"', '"s9"', 1))
    checked = trail.check()
    assert not checked.ok
    assert checked.problem is not None
    assert checked.problem.startswith("entry #6 ")
    assert "changed" in checked.problem


def test_a_removed_entry_is_named(trail: AuditLog, tmp_path: Path) -> None:
    path = _segment_files(tmp_path)[0]  # entries 1-3
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + lines[2])
    checked = trail.check()
    assert checked.problem == "entry #2 (the one before #3) is missing: it was removed"


def test_the_last_entry_removed_is_named(trail: AuditLog, tmp_path: Path) -> None:
    path = _segment_files(tmp_path)[2]
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))
    assert trail.check().problem == "entry #8 (the last one, named by the head) is missing: it was removed"


def test_two_swapped_entries_are_named(trail: AuditLog, tmp_path: Path) -> None:
    path = _segment_files(tmp_path)[2]
    lines = path.read_text().splitlines(keepends=True)
    lines[1], lines[2] = lines[2], lines[1]
    path.write_text("".join(lines))
    problem = trail.check().problem
    assert problem is not None
    assert problem.startswith("entry #7 ")
    assert "out of order" in problem


def test_a_whole_segment_removed_breaks_the_chain(trail: AuditLog, tmp_path: Path) -> None:
    _segment_files(tmp_path)[1].unlink()  # entry 4
    assert trail.check().problem == "entry #4 (the one before #5) is missing: it was removed"


def test_an_orphan_segment_is_reported_not_failed(trail: AuditLog, tmp_path: Path) -> None:
    """A writer that died between its segment and the head leaves a segment no chain entry is in."""
    orphan = tmp_path / "audit/date=2026-12-03/000000000009-deadbeef.jsonl"
    orphan.parent.mkdir(parents=True, exist_ok=True)
    entry = {"seq": 9, "prev": trail.head()["hash"], "action": "label"}  # type: ignore[index]
    from gpucert.audit import entry_hash

    orphan.write_text(json.dumps({**entry, "hash": entry_hash(entry)}) + "\n")
    checked = trail.check()
    assert checked.ok
    assert checked.orphans == ("audit/date=2026-12-03/000000000009-deadbeef.jsonl",)
    # The next append goes on the head, not on the orphan.
    trail.append(_actions(1), run_id="r2", trigger="cli", actor="test")
    assert trail.check().ok
    assert [e["seq"] for e in trail.check().entries][-1] == 9


def test_no_head_with_segments_is_a_broken_trail() -> None:
    from gpucert.audit import Segment

    assert check_chain([Segment("audit/date=2026-12-03/000000000001-aa.jsonl", "{}\n")], None).problem
    assert check_chain([], None).ok


def _python_json(value: object) -> bytes:
    """How entries were hashed before RFC 8785: Python's JSON, keys sorted, floats as their repr."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def test_an_entry_hash_is_sha256_of_its_rfc_8785_json_without_gpucert(tmp_path: Path) -> None:
    log = AuditLog(FileObjectStore(tmp_path))
    moved = AuditAction("baseline.move", "Baseline", "v2", before={"deviation_pct": 5.0}, after={"floor": 1e-5})
    log.append([moved, *_actions(2)], run_id="r1", trigger="cli", actor="test")
    [segment] = _segment_files(tmp_path)
    entries = [json.loads(line) for line in segment.read_text(encoding="utf-8").splitlines()]
    for entry in entries:
        body = {k: v for k, v in entry.items() if k != "hash"}
        assert entry["canon"] == "rfc8785"
        assert hashlib.sha256(rfc8785.dumps(body)).hexdigest() == entry["hash"]
    # 5.0 and 1e-5 are written otherwise by Python's repr: a hash over those bytes would not match.
    first = {k: v for k, v in entries[0].items() if k != "hash"}
    assert hashlib.sha256(_python_json(first)).hexdigest() != entries[0]["hash"]


def test_a_trail_hashed_before_rfc_8785_still_checks_and_grows(tmp_path: Path) -> None:
    # Two entries as gpucert wrote them before: no ``canon``, hashed over Python's JSON.
    prev, lines = "0" * 64, []
    for seq in (1, 2):
        entry: dict[str, Any] = {"seq": seq, "prev": prev, "action": "label", "after": {"pct": 5.0}}
        entry["hash"] = prev = hashlib.sha256(_python_json(entry)).hexdigest()
        lines.append(json.dumps(entry))
    key = "audit/date=2026-01-01/000000000001-0a0b0c0d.jsonl"
    (tmp_path / key).parent.mkdir(parents=True)
    (tmp_path / key).write_text("\n".join(lines) + "\n")
    (tmp_path / "audit/HEAD").write_text(json.dumps({"seq": 2, "hash": prev, "segment": key}))
    log = AuditLog(FileObjectStore(tmp_path))
    assert log.check().ok, log.check().problem
    log.append(_actions(1), run_id="r2", trigger="cli", actor="test")
    checked = log.check()
    assert checked.ok, checked.problem
    assert [e.get("canon") for e in checked.entries] == [None, None, "rfc8785"]
    # A legacy entry changed is still caught.
    (tmp_path / key).write_text((tmp_path / key).read_text().replace("5.0", "6.0", 1))
    assert "entry #1" in str(log.check().problem)


def _concurrent_appends(log_factory: type | object, writers: int, each: int) -> None:
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            log = log_factory()  # type: ignore[operator]
            for i in range(each):
                log.append(_actions(1, node=f"n{w}-{i}"), run_id=f"w{w}", trigger="cli", actor=f"writer-{w}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_concurrent_writers_never_fork_the_trail_on_files(tmp_path: Path) -> None:
    _concurrent_appends(lambda: AuditLog(FileObjectStore(tmp_path)), writers=4, each=10)
    checked = AuditLog(FileObjectStore(tmp_path)).check()
    assert checked.ok, checked.problem
    assert [e["seq"] for e in checked.entries] == list(range(1, 41))
    assert len({e["run_id"] for e in checked.entries}) == 4


@pytest.fixture(scope="module")
def seaweedfs() -> Iterator[str]:
    weed = SeaweedFS("gpucert-audit")
    try:
        endpoint = weed.start()
    except ServerDidNotStart as exc:
        unavailable(f"SeaweedFS cannot start here: {exc}")
    try:
        yield endpoint
    finally:
        weed.stop()


def test_concurrent_writers_never_fork_the_trail_on_s3(seaweedfs: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucert.store import S3ObjectStore

    for name, value in (
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
        ("AWS_DEFAULT_REGION", REGION),
    ):
        monkeypatch.setenv(name, value)

    def log() -> AuditLog:
        return AuditLog(S3ObjectStore("gpucert-audit", "trail", endpoint_url=seaweedfs, region=REGION))

    _concurrent_appends(log, writers=3, each=6)
    checked = log().check()
    assert checked.ok, checked.problem
    assert [e["seq"] for e in checked.entries] == list(range(1, 19))
    assert not checked.orphans  # losers deleted their segments


# --- recording ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=2) as cluster:
        yield cluster


@pytest.fixture
def kube(sim: SimCluster) -> Kube:
    return connect(str(sim.kubeconfig_path))


def test_every_write_is_recorded_with_what_it_changed_and_sent_as_an_event(
    sim: SimCluster, kube: Kube, tmp_path: Path
) -> None:
    store = BaselineStore(FileObjectStore(tmp_path))
    recorder = AuditRecorder(AuditLog(store.objects), run_id="cert-1", trigger="schedule").watch(kube, store)
    node = kube.get("v1", "Node", "gpu-node-00001")
    taint = {"key": "gpucert.io/unhealthy", "value": "row_remap", "effect": "NoSchedule"}
    recorder.because(per_object={"gpu-node-00001": "failed: row remap pending on GPU 3"})
    kube.merge_patch(
        "v1",
        "Node",
        "gpu-node-00001",
        {"metadata": {"labels": {"gpucert.io/state": "failed"}}, "spec": {"taints": [taint]}},
        before=node,
    )
    store.update(lambda table: empty_baseline(), message="baseline from cert-1")
    entries = recorder.flush()
    recorder.unwatch()

    by_action = {e["action"]: e for e in entries}
    assert set(by_action) == {"taint.add", "label", "baseline.write"}
    assert by_action["taint.add"]["after"] == taint
    assert by_action["taint.add"]["before"] is None
    assert by_action["label"]["before"] == {"gpucert.io/state": None}
    assert by_action["label"]["why"] == "failed: row remap pending on GPU 3"
    assert {e["trigger"] for e in entries} == {"schedule"}
    assert {e["run_id"] for e in entries} == {"cert-1"}
    assert AuditLog(store.objects).check().ok

    # The Events: on the node, with the reason; none for the baseline (no Kubernetes object).
    events = client.EventsV1Api(sim.api_client()).list_namespaced_event("default").items
    mine = [
        e
        for e in events
        if e.reporting_controller == "gpucert" and e.regarding is not None and e.regarding.name == "gpu-node-00001"
    ]
    assert {e.reason for e in mine} >= {"TaintAdded", "Labelled"}
    added = next(e for e in mine if e.reason == "TaintAdded")
    assert added.type == "Warning"
    assert "row remap" in str(added.note)
    assert "cert-1" in str(added.note)
    # Sent again (a retried step), an entry's Event is the same object: no duplicate.
    recorder._send_events(kube, entries)
    again = client.EventsV1Api(sim.api_client()).list_namespaced_event("default").items
    assert len([e for e in again if e.reporting_controller == "gpucert"]) == len(
        [e for e in events if e.reporting_controller == "gpucert"]
    )
    assert recorder.event_failures == 0


def test_each_change_is_stamped_when_it_happened_with_its_own_why_and_its_step(
    sim: SimCluster, kube: Kube, seaweedfs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A testing taint's add and lift, flushed together at the end of the benchmark step (as certify flushes),
    are two moments and two reasons — not the flush's one time and the step's one "why" — and both name the
    step that made them. On S3, as a team's store is."""
    import time
    from datetime import UTC, datetime

    from gpucert.kube import lift_testing_taint, taint_testing
    from gpucert.store import S3ObjectStore

    for name, value in (
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
        ("AWS_DEFAULT_REGION", REGION),
    ):
        monkeypatch.setenv(name, value)
    log = AuditLog(S3ObjectStore("gpucert-audit", "stamps", endpoint_url=seaweedfs, region=REGION))
    recorder = AuditRecorder(log, run_id="cert-9", trigger="schedule").watch(kube)
    recorder.because("certify cert-9: benchmark")
    before = datetime.now(UTC)
    assert taint_testing(kube, "gpu-node-00001", prefix="gpucert.io", run_id="cert-9")
    time.sleep(0.05)  # the benchmark runs
    between = datetime.now(UTC)
    assert lift_testing_taint(kube, "gpu-node-00001", prefix="gpucert.io")
    time.sleep(0.05)
    flushed = datetime.now(UTC)
    entries = recorder.flush()
    recorder.unwatch()
    added, lifted = entries
    assert (added["action"], lifted["action"]) == ("taint.add", "taint.lift")
    stamp = lambda t: t.isoformat(timespec="microseconds").replace("+00:00", "Z")  # noqa: E731
    assert stamp(before) <= added["ts"] < stamp(between) <= lifted["ts"] < stamp(flushed)
    assert added["why"] != lifted["why"]
    assert "benchmarks the node" in added["why"]
    assert "benchmark ended" in lifted["why"]
    assert added["step"] == lifted["step"] == "certify cert-9: benchmark"
    assert log.check().ok
    assert [e["ts"] for e in log.history(node="gpu-node-00001")] == [added["ts"], lifted["ts"]]


@KUBECTL
def test_kubectl_sees_the_events(sim: SimCluster, kube: Kube, tmp_path: Path) -> None:
    recorder = AuditRecorder(AuditLog(FileObjectStore(tmp_path)), run_id="cert-2", trigger="cli").watch(kube)
    node = kube.get("v1", "Node", "gpu-node-00000")
    kube.label_node("gpu-node-00000", {"gpucert.io/state": "certified"}, before=node)
    recorder.flush()
    out = subprocess.run(
        [
            "kubectl",
            "--kubeconfig",
            str(sim.kubeconfig_path),
            "get",
            "events.events.k8s.io",
            "-n",
            "default",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    notes = [item.get("note", "") for item in json.loads(out)["items"] if item.get("reportingController") == "gpucert"]
    assert any("cert-2" in note for note in notes)


def _describer_query(node: dict[str, Any]) -> str:
    """The field selector ``kubectl describe node`` lists a node's Events with (all namespaces, core v1)."""
    meta = node["metadata"]
    return (
        f"involvedObject.name={meta['name']},involvedObject.namespace=,involvedObject.kind=Node,"
        f"involvedObject.uid={meta['uid']}"
    )


def test_a_node_event_names_the_node_uid_and_the_describer_query_finds_it(
    sim: SimCluster, kube: Kube, tmp_path: Path
) -> None:
    """Issue 29: gpucert's Events (events.k8s.io) are listed by kubectl's node describer (core v1, by uid)."""
    recorder = AuditRecorder(AuditLog(FileObjectStore(tmp_path)), run_id="cert-29", trigger="cli").watch(kube)
    node = kube.get("v1", "Node", "gpu-node-00001")
    kube.label_node("gpu-node-00001", {"gpucert.io/state": "failed"}, before=node)
    # A ticket is no Kubernetes object: its Event goes to a node this run did not write, read for its uid.
    recorder.note(
        AuditAction(
            "ticket.open",
            "Ticket",
            "T-29",
            api_version="gpucert.io/v1",
            after={"node": "gpu-node-00000", "cause": "xid"},
            why="XID 79 on GPU 2",
        )
    )
    recorder.flush()
    recorder.unwatch()

    core = client.CoreV1Api(sim.api_client())
    found = core.list_event_for_all_namespaces(field_selector=_describer_query(node)).items
    [labelled] = [e for e in found if e.reason == "Labelled" and "cert-29" in str(e.message)]
    assert labelled.involved_object.kind == "Node"
    assert labelled.involved_object.api_version == "v1"
    assert labelled.involved_object.name == "gpu-node-00001"
    assert labelled.involved_object.uid == node["metadata"]["uid"]
    assert (labelled.type, labelled.action, labelled.reporting_component) == ("Normal", "label", "gpucert")
    assert labelled.reporting_instance
    assert labelled.event_time is not None
    # Another object's uid finds none of them: the uid is what the describer matches on.
    stale = {**node, "metadata": {**node["metadata"], "uid": "00000000-0000-0000-0000-000000000000"}}
    assert not [
        e
        for e in core.list_event_for_all_namespaces(field_selector=_describer_query(stale)).items
        if "cert-29" in str(e.message)
    ]

    other = kube.get("v1", "Node", "gpu-node-00000")
    [ticket] = [
        e
        for e in core.list_event_for_all_namespaces(field_selector=_describer_query(other)).items
        if e.reason == "TicketOpened"
    ]
    assert ticket.type == "Warning"
    assert "XID 79" in str(ticket.message)
    # And through the API gpucert wrote it with, the same object.
    mine = kube.list_objects(
        "events.k8s.io/v1",
        "Event",
        "default",
        field_selector=f"regarding.kind=Node,regarding.uid={node['metadata']['uid']},reportingController=gpucert",
    )
    assert labelled.metadata.uid in {e["metadata"]["uid"] for e in mine}


@KUBECTL
def test_kubectl_describe_node_shows_gpucerts_events(sim: SimCluster, kube: Kube, tmp_path: Path) -> None:
    recorder = AuditRecorder(AuditLog(FileObjectStore(tmp_path)), run_id="cert-30", trigger="cli").watch(kube)
    recorder.because(per_object={"gpu-node-00000": "failed: row remap pending on GPU 5"})
    node = kube.get("v1", "Node", "gpu-node-00000")
    taint = {"key": "gpucert.io/unhealthy", "value": "row_remap", "effect": "NoSchedule"}
    kube.merge_patch("v1", "Node", "gpu-node-00000", {"spec": {"taints": [taint]}}, before=node)
    recorder.flush()
    recorder.unwatch()
    out = subprocess.run(
        ["kubectl", "--kubeconfig", str(sim.kubeconfig_path), "describe", "node", "gpu-node-00000"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    events = out.split("\nEvents:", 1)[1]
    [line] = [line for line in events.splitlines() if "TaintAdded" in line]
    assert line.split()[:2] == ["Warning", "TaintAdded"]
    assert "gpucert" in line.split()  # the From column: the reporting controller
    assert "row remap pending on GPU 5 (run cert-30" in line
    kube.merge_patch("v1", "Node", "gpu-node-00000", {"spec": {"taints": None}})


def test_a_write_that_fails_records_nothing_and_a_failed_flush_keeps_its_actions(
    sim: SimCluster, kube: Kube, tmp_path: Path
) -> None:
    from gpucert.errors import StoreError
    from gpucert.kube import KubeNotFound

    recorder = AuditRecorder(AuditLog(FileObjectStore(tmp_path)), run_id="cert-3", trigger="cli").watch(kube)
    with pytest.raises(KubeNotFound):
        kube.merge_patch("v1", "Node", "no-such-node", {"metadata": {"labels": {"a": "b"}}})
    assert recorder.pending == 0
    recorder.note(*_actions(2))
    (tmp_path / "audit").mkdir()
    (tmp_path / "audit/HEAD").write_text("not json")
    with pytest.raises(StoreError, match="audit/HEAD"):
        recorder.flush()
    assert recorder.pending == 2


# --- the command line -----------------------------------------------------------------------------------


def test_audit_verify_and_show(trail: AuditLog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = tmp_path.as_uri()
    assert main(["audit", "verify", "--store", uri]) == 0
    assert "intact, 8 entries" in capsys.readouterr().out
    assert main(["audit", "show", "--store", uri, "--node", "gpu-node-00001", "--format", "json"]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["seq"] for e in shown] == list(range(1, 9))
    assert main(["audit", "show", "--store", uri, "--node", "gpu-node-00099"]) == 0
    assert "no audit entries for gpu-node-00099" in capsys.readouterr().out
    assert main(["audit", "show", "--store", uri, "--since", "yesterday"]) == 2
    assert "--since 'yesterday'" in capsys.readouterr().err

    path = _segment_files(tmp_path)[0]
    path.write_text(path.read_text().replace("step 0", "step X"))
    assert main(["audit", "verify", "--store", uri]) == 3
    assert "BROKEN: entry #1 " in capsys.readouterr().out
    # A broken trail is not shown as if it were whole.
    assert main(["audit", "show", "--store", uri]) == 1
    assert "does not check out" in capsys.readouterr().err


def test_a_baseline_rollback_from_the_command_line_is_recorded(tmp_path: Path) -> None:
    store = BaselineStore(FileObjectStore(tmp_path))
    first = store.update(lambda t: empty_baseline(), message="one")
    store.update(lambda t: empty_baseline(), message="two")
    assert main(["baseline", "rollback", first, "--store", tmp_path.as_uri()]) == 0
    entries = AuditLog(store.objects).history()
    assert [(e["action"], e["after"], e["trigger"]) for e in entries] == [
        ("baseline.rollback", {"version": first}, "cli")
    ]
    assert entries[0]["why"].startswith(f"gpucert baseline rollback {first} (rolled back from ")
