"""Benchmark Jobs: the manifests, how a Job's end is classified, and the results read from its pod's log.

Rendering is checked against Kubernetes' own schema (``kubernetes_validate``, 1.33, strict) and against
the payload's real command line. A simulated cluster (three 8-GPU nodes, the stack in place) then runs
Jobs end to end through :class:`gpucert.kube.Kube`, and produces each way a Job can fail outside the GPU;
every one must come out as that reason, never as a result.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pandas as pd
import pytest

from gpucert.bench import payload_files
from gpucert.bench._cli import parse_args
from gpucert.certify import (
    DEFAULT_IMAGE,
    JOBS_NAMESPACE,
    PAYLOAD_DIR,
    BenchmarkSettings,
    CollectedResults,
    JobOutcome,
    PodLog,
    _collect,
    abandon,
    benchmark_job,
    classify,
    collect_results,
    ensure_payload,
    job_name,
    observe,
    parse_pod_log,
    payload_configmap,
    payload_items,
    payload_key,
    payload_path,
    split_pod_log,
    validate_pod_logs,
)
from gpucert.certify._jobs import JobRenderError, PayloadArgsError
from gpucert.errors import InputError, ResultsError
from gpucert.kube import Kube, KubeConflict, RetryPolicy, connect
from gpucert_sim import (
    EXIT_CODE_ANNOTATION,
    RUN_SECONDS_ANNOTATION,
    TERMINATED_REASON_ANNOTATION,
    SimCluster,
    rows_jsonl,
)

from .conftest import eventually

K8S = "1.33"
PREFIX = "gpucert.io"
LONG_NODE = ".".join(["ip-10-0-0-1"] + ["compute-internal-zone-a" * 2] * 4 + ["example"])[:253].rstrip(".-")


def validate(obj: Mapping[str, Any]) -> None:
    kubernetes_validate.validate(dict(obj), K8S, strict=True)


@pytest.fixture(scope="module")
def cm() -> dict[str, Any]:
    return payload_configmap()


def container(job: Mapping[str, Any]) -> dict[str, Any]:
    [c] = job["spec"]["template"]["spec"]["containers"]
    return dict(c)


# --- the payload ConfigMap ------------------------------------------------------------------------------


def test_the_payload_configmap_is_valid_immutable_and_named_by_its_content(cm: dict[str, Any]) -> None:
    validate(cm)
    files = payload_files()
    assert cm["immutable"] is True
    assert cm["metadata"]["namespace"] == JOBS_NAMESPACE
    assert cm["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "gpucert",
        "app.kubernetes.io/part-of": "gpucert",
        "app.kubernetes.io/component": "benchmark",
    }
    assert cm["data"] == {payload_key(path): text for path, text in files.items()}
    assert all("/" not in key for key in cm["data"])
    digest = cm["metadata"]["annotations"][f"{PREFIX}/payload-sha256"]
    assert cm["metadata"]["name"] == f"gpucert-payload-{digest[:10]}"
    # The same files give the same name; one changed byte gives another, so a running Job keeps its own.
    assert payload_configmap()["metadata"]["name"] == cm["metadata"]["name"]
    changed = {**files, "gpucert/bench/_metrics.py": files["gpucert/bench/_metrics.py"] + "\n"}
    assert payload_configmap(files=changed)["metadata"]["name"] != cm["metadata"]["name"]
    other = payload_configmap(BenchmarkSettings(namespace="bench", label_prefix="example.com"))
    assert other["metadata"]["namespace"] == "bench"
    assert "example.com/payload-sha256" in other["metadata"]["annotations"]


def test_configmap_keys_map_back_to_the_package_tree(cm: dict[str, Any]) -> None:
    items = payload_items(cm)
    assert sorted(i["path"] for i in items) == sorted(payload_files())
    for item in items:
        assert payload_path(item["key"]) == item["path"]
        assert payload_key(item["path"]) == item["key"]
    for bad in ("gpucert/a.b/c.py", "gpucert/x.tar.gz", "/etc/passwd.py", "gpucert/../x.py", "noext"):
        with pytest.raises(ValueError, match="cannot be a ConfigMap key"):
            payload_key(bad)
    with pytest.raises(ValueError, match="not a payload ConfigMap key"):
        payload_path("gpucert..py")


def test_a_payload_too_large_for_a_configmap_is_refused() -> None:
    with pytest.raises(ValueError, match="more than a ConfigMap holds"):
        payload_configmap(files={"gpucert/big.py": "#" * (1 << 20)})


def test_the_payload_runs_from_the_configmap_layout_with_only_the_standard_library(
    cm: dict[str, Any], tmp_path: Path
) -> None:
    """The volume's items, written out as the kubelet would, are a package Python can run: no install, no
    site-packages (``-S``); without torch and pynvml every step is an ``error`` row, and the log reads."""
    mount = tmp_path / "mount"
    for item in payload_items(cm):
        target = mount / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(cm["data"][item["key"]], encoding="utf-8")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(mount), "NODE_NAME": "gpu-node-7"}
    job = benchmark_job("night-9", "gpu-node-7", 2, payload=cm)
    args = [a.replace("$(NODE_NAME)", env["NODE_NAME"]) for a in container(job)["args"]]
    done = subprocess.run(
        [sys.executable, "-S", "-m", "gpucert.bench", *args, "--device", "cpu"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    log = done.stderr + done.stdout  # what `kubectl logs` shows holds both streams
    collected = parse_pod_log(log, run_id="night-9", node="gpu-node-7", source="payload log")
    rows = collected.results
    assert set(rows["node"].astype(str)) == {"gpu-node-7"}
    assert "gpu_count_expected" in set(rows["metric"].astype(str))
    assert collected.stack is not None
    assert collected.stack["node"] == "gpu-node-7"
    assert any("torch" in message for message in collected.errors)


# --- the Job --------------------------------------------------------------------------------------------


def test_the_benchmark_job_is_valid_and_follows_the_conventions(cm: dict[str, Any]) -> None:
    job = benchmark_job("night-1", "gpu-node-00002", 8, payload=cm)
    validate(job)
    meta, spec = job["metadata"], job["spec"]
    assert meta["name"] == job_name("night-1", "gpu-node-00002")
    assert meta["namespace"] == JOBS_NAMESPACE
    labels = {
        "app.kubernetes.io/managed-by": "gpucert",
        "app.kubernetes.io/part-of": "gpucert",
        "app.kubernetes.io/component": "benchmark",
        f"{PREFIX}/run-id": "night-1",
        f"{PREFIX}/node": "gpu-node-00002",
    }
    assert meta["labels"] == labels
    assert meta["annotations"] == {f"{PREFIX}/node": "gpu-node-00002"}
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (0, 3600, 86400)
    template = spec["template"]
    assert template["metadata"]["labels"] == labels
    pod = template["spec"]
    assert pod["restartPolicy"] == "Never"
    assert "priorityClassName" not in pod
    assert pod["automountServiceAccountToken"] is False
    assert "nodeName" not in pod  # the scheduler must see the pod, to say Unschedulable
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-00002"]}]}]
    assert pod["tolerations"] == [
        {"key": f"{PREFIX}/uncertified", "operator": "Exists", "effect": "NoSchedule"},
        {"key": f"{PREFIX}/unhealthy", "operator": "Exists", "effect": "NoSchedule"},
        {"key": f"{PREFIX}/testing", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    c = container(job)
    assert c["image"] == DEFAULT_IMAGE
    assert c["command"] == ["python", "-m", "gpucert.bench"]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "8"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["PYTHONPATH"]["value"] == PAYLOAD_DIR
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["payload"] == {"name": "payload", "mountPath": PAYLOAD_DIR, "readOnly": True}
    assert mounts["dshm"]["mountPath"] == "/dev/shm"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["payload"]["configMap"]["name"] == cm["metadata"]["name"]
    assert volumes["payload"]["configMap"]["items"] == payload_items(cm)
    assert volumes["payload"]["configMap"]["defaultMode"] == 0o444
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"


def test_the_job_runs_the_payloads_real_command_line(cm: dict[str, Any]) -> None:
    settings = BenchmarkSettings(repeats=5, payload_args=("--gemm-seconds", "2", "--skip", "copy"))
    c = container(benchmark_job("night-1", "gpu-node-00002", 4, payload=cm, settings=settings))
    # The kubelet expands $(NODE_NAME) from the downward API; the payload's own parser takes the rest.
    args = [a.replace("$(NODE_NAME)", "gpu-node-00002") for a in c["args"]]
    opts = parse_args(args)
    assert (opts.run_id, opts.node, opts.rule.repeats, opts.expected_gpus) == ("night-1", "gpu-node-00002", 5, 4)
    assert opts.gemm_seconds == 2.0
    assert opts.skip == frozenset({"copy"})
    assert c["args"][c["args"].index("--node") + 1] == "$(NODE_NAME)"


def test_settings_are_rendered_and_checked(cm: dict[str, Any]) -> None:
    settings = BenchmarkSettings(
        namespace="bench",
        image="pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
        label_prefix="example.com",
        deadline_s=900,
        ttl_s=60,
        priority_class="gpucert-low",
        pod_annotations={"example.com/note": "x"},
    )
    job = benchmark_job("night-1", "n1", 8, payload=cm, settings=settings)
    validate(job)
    pod = job["spec"]["template"]
    assert pod["spec"]["priorityClassName"] == "gpucert-low"
    assert container(job)["image"] == settings.image
    assert job["metadata"]["labels"]["example.com/run-id"] == "night-1"
    assert pod["metadata"]["annotations"] == {"example.com/node": "n1", "example.com/note": "x"}
    assert pod["spec"]["tolerations"][0]["key"] == "example.com/uncertified"
    assert (job["spec"]["activeDeadlineSeconds"], job["spec"]["ttlSecondsAfterFinished"]) == (900, 60)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("namespace", "Not_A_Label", "namespace"),
        ("image", "two words", "image"),
        ("label_prefix", "UPPER.case", "label prefix"),
        ("repeats", 0, "repeats"),
        ("deadline_s", 0, "deadline_s"),
        ("ttl_s", -1, "ttl_s"),
        ("priority_class", "Low Priority", "priority class"),
        ("payload_args", ("--run-id", "x"), "may not set --run-id"),
        ("payload_args", ("--expected-gpus=4",), "may not set --expected-gpus"),
        ("memory_request", "lots", "quantity"),
        ("storage_claim", "Data_Set", "storage claim"),
        ("storage_host_path", "relative/path", "storage host path"),
        ("storage_host_path", "/mnt/../etc", "storage host path"),
    ],
)
def test_settings_refuse_what_kubernetes_or_the_payload_would(field: str, value: Any, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        BenchmarkSettings(**{field: value})


@pytest.mark.parametrize(
    ("where", "volume"),
    [
        ({"storage_claim": "datasets"}, {"persistentVolumeClaim": {"claimName": "datasets"}}),
        (
            {"storage_host_path": "/mnt/nvme0/gpucert"},
            {"hostPath": {"path": "/mnt/nvme0/gpucert", "type": "DirectoryOrCreate"}},
        ),
    ],
)
def test_a_storage_location_is_mounted_a_folder_per_node_and_measured(
    cm: dict[str, Any], where: dict[str, str], volume: dict[str, Any]
) -> None:
    settings = BenchmarkSettings(**where)
    job = benchmark_job("night-1", "gpu-node-00003", 8, payload=cm, settings=settings)
    validate(job)
    pod = job["spec"]["template"]["spec"]
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "storage"]
    assert mount == {"name": "storage", "mountPath": "/gpucert-storage", "subPathExpr": "$(NODE_NAME)"}
    assert {"name": "storage", **volume} in pod["volumes"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--storage-path") + 1] == "/gpucert-storage"
    plain = benchmark_job("night-1", "gpu-node-00003", 8, payload=cm)
    assert "--storage-path" not in plain["spec"]["template"]["spec"]["containers"][0]["args"]
    with pytest.raises(ValueError, match="not both"):
        BenchmarkSettings(storage_claim="datasets", storage_host_path="/mnt/x")


def kubelet_expand(arg: str, env: Mapping[str, str]) -> str:
    """A container argument as the kubelet hands it over: ``$(VAR)`` from ``env`` (an unknown one kept),
    ``$$`` as ``$``."""

    def one(match: re.Match[str]) -> str:
        return "$" if match.group(0) == "$$" else env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, arg)


def test_payload_args_follow_the_jobs_own_and_reach_the_payload_as_written(cm: dict[str, Any]) -> None:
    evil = 'x"\n  evil: {{ x }} &a *a $(PYTHONPATH)'
    given = [
        "--gemm-seconds=5",
        "--copy-bytes",
        "512M",
        "--dcgm-level=2",
        "--nccl-tests-args=-d bfloat16 -G 1",
        f"--stack-json=/tmp/$(NODE_NAME)-{evil}.json",
    ]
    settings = BenchmarkSettings(payload_args=given)  # type: ignore[arg-type]  # a list, as JSON gives one
    assert settings.payload_args == tuple(given)
    job = benchmark_job("night-1", "gpu-node-00002", 8, payload=cm, settings=settings)
    validate(job)
    args = container(job)["args"]
    assert args[:10] == [
        "--run-id",
        "night-1",
        "--node",
        "$(NODE_NAME)",
        "--repeats",
        "3",
        "--expected-gpus",
        "8",
        "--deadline-seconds",
        str(settings.deadline_s - 300),  # the Job's deadline less the start-up allowance
    ]
    # Each payload argument is one list item, whatever it holds; a `$` is escaped from the kubelet.
    assert args[10:-1] == given[:-1]
    assert args[-1] == f"--stack-json=/tmp/$$(NODE_NAME)-{evil.replace('$', '$$')}.json"
    env = {"NODE_NAME": "gpu-node-00002", "PYTHONPATH": PAYLOAD_DIR}
    opts = parse_args([kubelet_expand(a, env) for a in args])
    assert (opts.node, opts.rule.repeats, opts.expected_gpus) == ("gpu-node-00002", 3, 8)
    assert (opts.gemm_seconds, opts.copy_bytes) == (5.0, 512 << 20)
    assert (opts.dcgm, opts.dcgm_level) == (True, 2)
    assert opts.nccl_tests_args == ("-d", "bfloat16", "-G", "1")
    assert opts.stack_json == f"/tmp/$(NODE_NAME)-{evil}.json"


@pytest.mark.parametrize(
    ("payload_args", "words"),
    [
        (("--gemm-secs=2",), "unrecognized arguments: --gemm-secs=2"),
        # An abbreviation the pod's parser would complete, here of a flag the Job sets itself.
        (("--repeat=9",), "unrecognized arguments: --repeat=9"),
        (("--help",), "unrecognized arguments: --help"),
        (("--dcgm-level=5",), "argument --dcgm-level: invalid choice: 5"),
        (("--skip=gpu",), "argument --skip: invalid choice: 'gpu'"),
        (("--gemm-seconds",), "argument --gemm-seconds: expected one argument"),
        (("--copy-bytes=lots",), "argument --copy-bytes: 'lots' is not a size"),
        (("--nccl-tests-args=-g 1",), "'-g' sets all_reduce_perf's --ngpus"),
        (("--nccl-tests-args=--minbytes=1K",), "sets all_reduce_perf's --minbytes"),
        (("--node=gpu-node-00009",), "may not set --node"),
        (("--repeats", "9"), "may not set --repeats"),
        ("--dcgm", "a sequence of strings"),
        (("--repeats", 9), "a sequence of strings"),
    ],
)
def test_payload_args_the_payload_would_refuse_are_refused_naming_them(payload_args: Any, words: str) -> None:
    with pytest.raises(PayloadArgsError, match=re.escape(words)) as caught:
        BenchmarkSettings(payload_args=payload_args)
    # Bad input (exit 2), a bad setting like any other, and the module's render error.
    assert isinstance(caught.value, InputError)
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, JobRenderError)


def test_payload_args_are_checked_again_when_a_job_is_rendered(cm: dict[str, Any]) -> None:
    settings = BenchmarkSettings()
    object.__setattr__(settings, "payload_args", ("--gemm-secs=2",))  # settings that skipped their checks
    with pytest.raises(PayloadArgsError, match="--gemm-secs=2"):
        benchmark_job("night-1", "n1", 8, payload=cm, settings=settings)


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for dcgmi")
def test_the_payload_honours_a_payload_arg_from_the_job(cm: dict[str, Any], tmp_path: Path) -> None:
    """``--dcgm-level=3`` in the settings reaches ``dcgmi diag -r 3`` in the pod (a stand-in dcgmi)."""
    mount, tools = tmp_path / "mount", tmp_path / "bin"
    for item in payload_items(cm):
        target = mount / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(cm["data"][item["key"]], encoding="utf-8")
    tools.mkdir()
    called = tmp_path / "dcgmi-args"
    report = {
        "DCGM GPU Diagnostic": {
            "test_categories": [{"tests": [{"name": "Memory", "results": [{"gpu_id": "0", "status": "Pass"}]}]}]
        }
    }
    (tools / "report.json").write_text(json.dumps(report), encoding="utf-8")
    dcgmi = tools / "dcgmi"
    dcgmi.write_text(f"#!/bin/sh\necho \"$@\" > '{called}'\ncat '{tools / 'report.json'}'\n", encoding="utf-8")
    dcgmi.chmod(0o755)
    settings = BenchmarkSettings(payload_args=("--dcgm-level=3", "--skip=allreduce"))
    env = {"PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(mount), "NODE_NAME": "n7"}
    args = [
        kubelet_expand(a, env)
        for a in container(benchmark_job("night-8", "n7", 2, payload=cm, settings=settings))["args"]
    ]
    done = subprocess.run(
        [sys.executable, "-S", "-m", "gpucert.bench", *args, "--device", "cpu"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert called.read_text(encoding="utf-8").split() == ["diag", "-r", "3", "-j"]
    collected = parse_pod_log(done.stderr + done.stdout, run_id="night-8", node="n7", source="payload log")
    assert collected.dcgm == {"Memory": "pass"}
    assert not any("all-reduce" in message or "allreduce" in message for message in collected.errors)


@pytest.mark.parametrize(
    ("run_id", "node", "gpus", "words"),
    [
        ("Night_1", "n1", 8, "a run id is a DNS label"),
        ("night-1", "", 8, "node name is empty"),
        ("night-1", "n1", 0, "at least 1 GPU"),
        ("night-1", "n1", True, "at least 1 GPU"),
    ],
)
def test_bad_job_arguments_are_refused(cm: dict[str, Any], run_id: str, node: str, gpus: Any, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        benchmark_job(run_id, node, gpus, payload=cm)


def test_a_long_node_name_still_makes_a_valid_job(cm: dict[str, Any]) -> None:
    assert len(LONG_NODE) > 200
    name = job_name("night-1", LONG_NODE)
    assert len(name) <= 63
    assert name.startswith("night-1-ip-10-0-0-1-")
    job = benchmark_job("night-1", LONG_NODE, 8, payload=cm)
    validate(job)
    meta = job["metadata"]
    # No label (label values stop at 63 characters); the annotation holds the whole name.
    assert f"{PREFIX}/node" not in meta["labels"]
    assert meta["annotations"][f"{PREFIX}/node"] == LONG_NODE
    assert job["spec"]["template"]["metadata"]["annotations"][f"{PREFIX}/node"] == LONG_NODE
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [LONG_NODE]
    # Nodes that differ only past the cut still get different Jobs.
    assert job_name("night-1", LONG_NODE[:-1] + "x") != name


def test_job_names_are_dns_labels_that_never_collide() -> None:
    names = {
        job_name("a-b", "c"),
        job_name("a", "b-c"),
        job_name("a", "b.c"),
        job_name("a", "b-c.x"),
        job_name("a" * 63, "n1"),
        job_name("a" * 63, "n2"),
    }
    assert len(names) == 6
    for name in names:
        assert len(name) <= 63
        assert name[0].isalnum()
        assert name[-1].isalnum()
        assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    assert job_name("night-1", "gpu-node-00002") == job_name("night-1", "gpu-node-00002")


def test_a_node_name_cannot_bend_the_manifest(cm: dict[str, Any]) -> None:
    evil = 'n1"\n  evil: {{ x }} &a *a !!python/object'
    job = benchmark_job("night-1", evil, 8, payload=cm)
    assert job["metadata"]["annotations"] == {f"{PREFIX}/node": evil}
    assert set(job["metadata"]) == {"name", "namespace", "labels", "annotations"}
    assert f"{PREFIX}/node" not in job["metadata"]["labels"]


# --- classification, on objects -------------------------------------------------------------------------


def job_obj(*conditions: tuple[str, str | None], status: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "j1",
            "namespace": "gpucert-system",
            "labels": {f"{PREFIX}/run-id": "night-1"},
            "annotations": {f"{PREFIX}/node": "n1"},
        },
        "spec": {"backoffLimit": 0},
        "status": {
            **(status or {}),
            "conditions": [{"type": t, "status": "True", "reason": r, "message": "said"} for t, r in conditions],
        },
    }


def pod_obj(
    phase: str, *, name: str = "j1-abc", created: str = "2026-12-01T00:00:00Z", **status: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": {"nodeName": "n1"},
        "status": {"phase": phase, **status},
    }


def waiting(reason: str) -> dict[str, Any]:
    return {"containerStatuses": [{"name": "bench", "image": "img", "state": {"waiting": {"reason": reason}}}]}


def terminated(code: int, reason: str = "Error", message: str = "") -> dict[str, Any]:
    ended = {"exitCode": code, "reason": reason, "message": message}
    return {"containerStatuses": [{"name": "bench", "state": {"terminated": ended}}]}


BACKOFF = ("Failed", "BackoffLimitExceeded")
DEADLINE = ("Failed", "DeadlineExceeded")


@pytest.mark.parametrize(
    ("job", "pods", "state", "reason"),
    [
        (job_obj(("Complete", None)), [pod_obj("Succeeded")], "succeeded", None),
        (job_obj(("SuccessCriteriaMet", None)), [pod_obj("Succeeded")], "succeeded", None),
        (job_obj(("Complete", None)), [], "failed", "vanished"),
        (job_obj(DEADLINE), [], "failed", "deadline"),
        (job_obj(DEADLINE), [pod_obj("Running")], "failed", "deadline"),
        (job_obj(DEADLINE), [pod_obj("Pending", **waiting("ImagePullBackOff"))], "failed", "image_pull"),
        (job_obj(("FailureTarget", "DeadlineExceeded")), [], "failed", "deadline"),
        (job_obj(BACKOFF), [pod_obj("Failed", **terminated(137, "OOMKilled"))], "failed", "oom"),
        (job_obj(BACKOFF), [pod_obj("Failed", **terminated(137))], "failed", "oom"),
        (job_obj(BACKOFF), [pod_obj("Failed", **terminated(1, message="Traceback"))], "failed", "error"),
        (job_obj(BACKOFF), [], "failed", "error"),
        (job_obj(BACKOFF), [pod_obj("Failed", reason="Evicted")], "failed", "error"),
        (job_obj(BACKOFF), [pod_obj("Failed", reason="OutOfnvidia.com/gpu")], "failed", "unschedulable"),
        (job_obj(BACKOFF), [pod_obj("Failed", reason="UnexpectedAdmissionError")], "failed", "unschedulable"),
        (job_obj(("Failed", "PodFailurePolicy")), [], "failed", "error"),
        (job_obj(), [], "pending", None),
        (job_obj(), [pod_obj("Pending")], "pending", None),
        (job_obj(), [pod_obj("Pending", **waiting("ErrImagePull"))], "pending", "image_pull"),
        (job_obj(), [pod_obj("Pending", **waiting("InvalidImageName"))], "pending", "image_pull"),
        (job_obj(), [pod_obj("Pending", **waiting("CreateContainerConfigError"))], "pending", "error"),
        (job_obj(), [pod_obj("Pending", **waiting("ContainerCreating"))], "pending", None),
        (
            job_obj(),
            [
                pod_obj(
                    "Pending",
                    conditions=[
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": "0/3 nodes are available",
                        }
                    ],
                )
            ],
            "pending",
            "unschedulable",
        ),
        (job_obj(), [pod_obj("Running")], "running", None),
        (job_obj(), [pod_obj("Succeeded")], "running", None),
        (job_obj(), [pod_obj("Failed", **terminated(137, "OOMKilled"))], "failed", "oom"),
        (job_obj(), [pod_obj("Failed", **terminated(2))], "failed", "error"),
    ],
)
def test_classify(job: dict[str, Any], pods: list[dict[str, Any]], state: str, reason: str | None) -> None:
    outcome = classify(job, pods)
    assert (outcome.state, outcome.reason) == (state, reason), outcome.message
    assert (outcome.node, outcome.job, outcome.namespace, outcome.run_id) == ("n1", "j1", "gpucert-system", "night-1")
    assert outcome.message
    assert outcome.finished == (state in ("succeeded", "failed"))
    assert outcome.stuck == (not outcome.finished and reason is not None)


def test_classify_reads_the_newest_pod_and_quotes_the_termination_message() -> None:
    old = pod_obj("Failed", name="j1-old", created="2026-12-01T00:00:00Z", **terminated(137, "OOMKilled"))
    new = pod_obj("Failed", name="j1-new", created="2026-12-01T00:05:00Z", **terminated(3, message="CUDA error"))
    outcome = classify(job_obj(BACKOFF), [new, old])
    assert (outcome.reason, outcome.pod) == ("error", "j1-new")
    assert "exited 3" in outcome.message
    assert "CUDA error" in outcome.message
    succeeded = classify(job_obj(("Complete", None)), [old, pod_obj("Succeeded", name="j1-ok")])
    assert (succeeded.state, succeeded.pod) == ("succeeded", "j1-ok")


def test_a_retrying_job_is_still_running_until_its_backoff_limit() -> None:
    job = job_obj()
    job["spec"]["backoffLimit"] = 2
    outcome = classify(job, [pod_obj("Failed", **terminated(1))])
    assert (outcome.state, outcome.reason) == ("running", None)


# --- the log --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=3, gpus=8, model="NVIDIA H200", seed=5, preconfigured=True) as cluster:
        yield cluster
        assert cluster.runtime is not None
        assert cluster.runtime.errors == []


@pytest.fixture(scope="module")
def kube(sim: SimCluster) -> Kube:
    return connect(sim.kubeconfig_path, retry=RetryPolicy(attempts=8, base_delay_s=0.001, max_delay_s=0.01))


def node(i: int) -> str:
    return f"gpu-node-{i:05d}"


def sim_log(sim: SimCluster, run_id: str, target: str) -> str:
    """A benchmark log as the simulated payload prints it (stack record, messages, rows)."""
    wave = sim.fleet.run(run_id, ts=dt.datetime(2026, 12, 1, 2, tzinfo=dt.UTC), seed=7, nodes=[target])
    stack = {"node": target, "driver": "550.90.07"}
    return (
        f"gpucert-stack: {json.dumps(stack)}\n"
        f"gpucert-bench: run {run_id} on {target}: cuda, model 'NVIDIA H200'\n"
        + rows_jsonl(wave.results)
        + "gpucert-bench: done in 1.0 s\n"
    )


def test_a_log_with_foreign_lines_among_the_rows_reads_the_rows(sim: SimCluster) -> None:
    clean = sim_log(sim, "night-2", node(0))
    expected = parse_pod_log(clean, run_id="night-2", node=node(0), source="clean").results
    noisy: list[str] = []
    for i, line in enumerate(clean.splitlines()):
        noisy.append(line)
        if i % 7 == 3:
            noisy += [
                "NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
                "",
                "   ",
                '{"level": "info", "msg": "a structured line of another tool"}',
                "UserWarning: TypedStorage is deprecated",
            ]
    noisy.append("gpucert-bench: error: hbm_copy_gbps on GPU 3: out of memory")
    got = parse_pod_log("\n".join(noisy) + "\n", run_id="night-2", node=node(0), source="noisy")
    assert got.results.equals(expected)
    assert got.stack == {"node": node(0), "driver": "550.90.07"}
    assert got.errors == ["hbm_copy_gbps on GPU 3: out of memory"]
    [warning] = got.warnings
    assert "neither rows nor the payload's messages" in warning
    assert "NCCL INFO" in warning


def test_a_row_for_another_node_is_refused(sim: SimCluster) -> None:
    log = sim_log(sim, "night-3", node(0))
    stray = sim_log(sim, "night-3", node(1)).splitlines()[5]  # a row of node 1
    lines = log.splitlines()
    lines.insert(4, stray)
    with pytest.raises(ResultsError) as caught:
        parse_pod_log("\n".join(lines), run_id="night-3", node=node(0), source="log of Pod x (node gpu-node-00000)")
    err = caught.value
    assert err.source == "log of Pod x (node gpu-node-00000)"
    [problem] = err.problems
    assert (problem.row, problem.column) == (5, "node")
    assert node(1) in problem.message


def test_a_wave_s_logs_validated_together_read_as_each_alone(sim: SimCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """validate_pod_logs checks a batch at once; a bad log in it costs that log alone, with the very error
    parse_pod_log gives, and a clean log reads the same rows either way."""
    logs = {n: sim_log(sim, "night-5", node(n)) for n in range(3)}
    stray = logs[1].splitlines()[5]  # a row of node 1 in node 0's log: another node's row
    lines = logs[0].splitlines()
    lines.insert(4, stray)
    bad_node = "\n".join(lines) + "\n"
    short = "\n".join(line.replace('"peer": null, ', "") for line in logs[2].splitlines()) + "\n"
    assert short != logs[2]  # every row lost its peer key: the column is missing, not empty

    def split(text: str, i: int) -> PodLog:
        return split_pod_log(text, run_id="night-5", node=node(i), source=f"log {i}")

    alone_calls: list[str] = []
    validated = _collect._validated

    def counted(log: PodLog) -> CollectedResults:
        alone_calls.append(log.source)
        return validated(log)

    monkeypatch.setattr(_collect, "_validated", counted)
    clean = validate_pod_logs([split(logs[i], i) for i in range(3)])
    assert alone_calls == []  # a clean batch is checked once, as a whole
    for i, got in enumerate(clean):
        assert isinstance(got, CollectedResults), got
        alone = parse_pod_log(logs[i], run_id="night-5", node=node(i), source=f"log {i}").results
        pd.testing.assert_frame_equal(got.results.astype(object), alone.astype(object))
        assert got.stack == {"node": node(i), "driver": "550.90.07"}

    alone_calls.clear()
    mixed = validate_pod_logs([split(bad_node, 0), split(logs[1], 1), split(short, 2)])
    assert sorted(alone_calls) == ["log 0", "log 1", "log 2"]
    assert isinstance(mixed[1], CollectedResults)
    for i, text in ((0, bad_node), (2, short)):
        got = mixed[i]
        assert isinstance(got, ResultsError), got
        with pytest.raises(ResultsError) as alone_error:
            parse_pod_log(text, run_id="night-5", node=node(i), source=f"log {i}")
        assert str(got) == str(alone_error.value)
    assert "'peer'" in str(mixed[2])
    assert validate_pod_logs([]) == []


def test_a_row_of_another_run_is_refused(sim: SimCluster) -> None:
    log = sim_log(sim, "night-3", node(0))
    with pytest.raises(ResultsError) as caught:
        parse_pod_log(log, run_id="night-4", node=node(0), source="src")
    assert caught.value.total == len(log.splitlines()) - 3  # every row; the stack and two messages aside
    assert {p.column for p in caught.value.problems} == {"run_id"}


def test_bad_rows_and_an_empty_log_are_refused(sim: SimCluster) -> None:
    lines = sim_log(sim, "night-5", node(0)).splitlines()
    broken = [*lines[:4], '{"run_id": "night-5", "node": ', *lines[4:]]
    with pytest.raises(ResultsError, match="not valid JSON") as caught:
        parse_pod_log("\n".join(broken), run_id="night-5", node=node(0), source="src")
    assert caught.value.problems[0].row == 5
    bad_value = json.loads(lines[3])
    bad_value["metric"] = "no_such_metric"
    with pytest.raises(ResultsError, match="no_such_metric"):
        parse_pod_log("\n".join([*lines, json.dumps(bad_value)]), run_id="night-5", node=node(0), source="src")
    with pytest.raises(ResultsError, match="no results rows"):
        parse_pod_log("gpucert-bench: no GPU found\n", run_id="night-5", node=node(0), source="src")
    without_stack = parse_pod_log("\n".join(lines[1:]), run_id="night-5", node=node(0), source="src")
    assert without_stack.stack is None
    assert any("no gpucert-stack record" in w for w in without_stack.warnings)


# --- on the simulated cluster ---------------------------------------------------------------------------


def start(kube: Kube, run_id: str, target: str, gpus: int = 8, **settings: Any) -> tuple[JobOutcome, BenchmarkSettings]:
    s = BenchmarkSettings(**settings)
    payload = ensure_payload(kube, payload_configmap(s))
    job = kube.create(benchmark_job(run_id, target, gpus, payload=payload, settings=s))
    return observe(kube, s.namespace, job["metadata"]["name"], node=target), s


def until(kube: Kube, first: JobOutcome, done: Any = lambda o: o.finished, timeout_s: float = 10.0) -> JobOutcome:
    def probe() -> JobOutcome | None:
        outcome = observe(kube, first.namespace, first.job, node=first.node)
        return outcome if done(outcome) else None

    return eventually(probe, timeout_s)


def no_pods_left(kube: Kube, outcome: JobOutcome) -> None:
    eventually(
        lambda: (
            not kube.list_objects(
                "v1", "Pod", outcome.namespace, label_selector=f"batch.kubernetes.io/job-name={outcome.job}"
            )
        )
    )


def test_a_benchmark_job_runs_end_to_end_on_a_tainted_node(sim: SimCluster, kube: Kube) -> None:
    target = node(0)
    # A node being (re-)certified carries gpucert's taints: the Job must still get there.
    taints = [
        {"key": f"{PREFIX}/uncertified", "effect": "NoSchedule"},
        {"key": f"{PREFIX}/unhealthy", "value": "pcie", "effect": "NoSchedule"},
    ]
    kube.merge_patch("v1", "Node", target, {"spec": {"taints": taints}})
    try:
        first, settings = start(kube, "night-10", target)
        assert first.state in ("pending", "running", "succeeded")
        outcome = until(kube, first)
    finally:
        kube.merge_patch("v1", "Node", target, {"spec": {"taints": None}})
    assert (outcome.state, outcome.reason) == ("succeeded", None), outcome.message
    assert (outcome.node, outcome.run_id, outcome.namespace) == (target, "night-10", settings.namespace)
    assert outcome.job == job_name("night-10", target)
    assert outcome.pod is not None
    pod = kube.get("v1", "Pod", outcome.pod, outcome.namespace)
    assert pod["spec"]["nodeName"] == target

    collected = collect_results(kube, outcome)
    rows = collected.results
    assert set(rows["run_id"].astype(str)) == {"night-10"}
    assert set(rows["node"].astype(str)) == {target}
    assert set(rows["gpu"].dropna().astype(int)) == set(range(8))
    index = sim.fleet.node_index[target]
    assert set(rows["gpu_uuid"].dropna().astype(str)) == {str(u) for u in sim.fleet.uuids[index * 8 : (index + 1) * 8]}
    assert {"gemm_bf16_tflops", "hbm_copy_gbps", "nccl_allreduce_busbw_gbps"} <= set(rows["metric"].astype(str))
    assert collected.stack is not None
    assert collected.stack["node"] == target
    assert collected.warnings == []
    # The same through the pod itself, and the payload ConfigMap is shared, not made twice.
    again = collect_results(kube, pod)
    assert again.results.equals(rows)
    assert (
        ensure_payload(kube, payload_configmap(settings))["metadata"]["name"]
        == pod["spec"]["volumes"][0]["configMap"]["name"]
    )


def test_a_payload_configmap_with_other_files_is_a_conflict(kube: Kube) -> None:
    mine = payload_configmap()
    tampered = {**mine, "data": {**mine["data"], "gpucert.extra.py": "x = 1\n"}}
    ensure_payload(kube, mine)
    with pytest.raises(KubeConflict, match="other files"):
        ensure_payload(kube, tampered)


def test_an_image_that_cannot_be_pulled_is_classified_before_the_deadline(kube: Kube) -> None:
    first, _ = start(kube, "night-11", node(1), image="registry.example.com/does-not-exist:1", deadline_s=600)
    stuck = until(kube, first, lambda o: o.stuck)
    assert (stuck.state, stuck.reason) == ("pending", "image_pull")
    assert "does-not-exist" in stuck.message
    gave_up = abandon(kube, stuck)
    assert (gave_up.state, gave_up.reason) == ("failed", "image_pull")
    assert kube.find("batch/v1", "Job", stuck.job, stuck.namespace) is None
    no_pods_left(kube, stuck)  # its GPUs come free for the next test on this node


def test_a_job_asking_for_more_gpus_than_the_node_has_is_unschedulable(kube: Kube) -> None:
    first, _ = start(kube, "night-12", node(2), gpus=9)
    stuck = until(kube, first, lambda o: o.stuck)
    assert (stuck.state, stuck.reason) == ("pending", "unschedulable")
    assert "Insufficient nvidia.com/gpu" in stuck.message
    abandon(kube, stuck)
    no_pods_left(kube, stuck)


def test_an_untolerated_taint_is_unschedulable(kube: Kube) -> None:
    target = node(2)
    kube.merge_patch("v1", "Node", target, {"spec": {"taints": [{"key": "maintenance", "effect": "NoSchedule"}]}})
    try:
        first, _ = start(kube, "night-13", target)
        stuck = until(kube, first, lambda o: o.stuck)
    finally:
        kube.merge_patch("v1", "Node", target, {"spec": {"taints": None}})
    assert (stuck.state, stuck.reason) == ("pending", "unschedulable")
    assert "untolerated taint {maintenance: }" in stuck.message
    abandon(kube, stuck)
    no_pods_left(kube, stuck)


@pytest.mark.parametrize(
    ("annotations", "deadline_s", "reason"),
    [
        ({EXIT_CODE_ANNOTATION: "137", TERMINATED_REASON_ANNOTATION: "OOMKilled"}, 600, "oom"),
        ({EXIT_CODE_ANNOTATION: "1"}, 600, "error"),
        ({RUN_SECONDS_ANNOTATION: "60"}, 1, "deadline"),
    ],
)
def test_a_failed_job_is_classified_and_never_read(
    kube: Kube, annotations: dict[str, str], deadline_s: int, reason: str
) -> None:
    run_id = f"night-14-{reason}"
    first, _ = start(kube, run_id, node(1), pod_annotations=annotations, deadline_s=deadline_s)
    outcome = until(kube, first)
    assert (outcome.state, outcome.reason) == ("failed", reason), outcome.message
    with pytest.raises(ValueError, match="has not succeeded"):
        collect_results(kube, outcome)
    if reason == "deadline":
        no_pods_left(kube, outcome)  # the deadline deleted the pod (a pod that ended holds no GPU anyway)


def test_a_job_that_is_gone_has_vanished(kube: Kube) -> None:
    first, settings = start(kube, "night-15", node(2), ttl_s=0)
    # ttlSecondsAfterFinished 0: the Job goes as soon as it completes, before anyone read it.
    gone = until(kube, first, lambda o: o.reason == "vanished")
    assert (gone.state, gone.node, gone.job) == ("failed", node(2), first.job)
    missing = observe(kube, settings.namespace, "no-such-job", node="n9")
    assert (missing.state, missing.reason, missing.node) == ("failed", "vanished", "n9")
