"""Training jobs on the simulated cluster (``sim/gpucert_sim/_training.py``), driven with the official client over HTTP.

One cluster of 24 nodes runs six Jobs at once, each held to its own nodes by node affinity and begun in the
past (``sim.gpucert.io/training-start``: time compressed), with its faults in the fault document's
``training:`` section before it starts: a 16-node job one of whose GPUs throttles from minute 30, a 2-node
job whose input pipeline slows from minute 20, a 2-node job one of whose pods is evicted at minute 20, a
2-node job with a flapping NIC at half rate from minute 10, a job that trained its 10 minutes and ended,
and one whose annotation is wrong.
What is checked is what a reader of the cluster sees: pod logs, pod status, Events, the DCGM exporters and
the job's exporter scraped live, and the OpenMetrics history, read as text and through the real ``promtool``
and Prometheus (the binaries of ``tests/test_telemetry_prometheus.py``).
"""

from __future__ import annotations

import json
import math
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from gpucert.errors import InputError
from gpucert_sim import SimCluster, parse_fault_plan

from .conftest import eventually
from .test_telemetry_prometheus import IDLE_CONFIG, PromBins, prom_bins, running_prometheus  # noqa: F401

STEP = 15
HOT = ("gpu-node-00005", 3)
#: The labels NCCL Inspector's Prometheus dump writes (NVIDIA/nccl ext-profiler/inspector/inspector_prom.cc).
INSPECTOR_LABELS = (
    "comm_id",
    "hostname",
    "rank",
    "slurm_job",
    "slurm_job_id",
    "nranks",
    "n_nodes",
    "gpu_device_id",
    "collective",
    "coll_sn",
    "timestamp",
    "message_size",
)
THERMAL, INPUT, EVICT, NET = "thermal/pretrain", "input/finetune", "evict/sft", "net/ddp"
DONE, BAD = "done/short", "bad/typo"
NODES = {
    THERMAL: [f"gpu-node-{i:05d}" for i in range(16)],
    INPUT: ["gpu-node-00016", "gpu-node-00017"],
    EVICT: ["gpu-node-00018", "gpu-node-00019"],
    NET: ["gpu-node-00020", "gpu-node-00021"],
    DONE: ["gpu-node-00022"],
    BAD: ["gpu-node-00023"],
}
#: What each job's pods come to: training, done, refused.
PHASE = {THERMAL: "Running", INPUT: "Running", EVICT: "Running", NET: "Running", DONE: "Succeeded", BAD: "Failed"}
NOTES = {DONE: {"sim.gpucert.io/training-seconds": "600"}, BAD: {"sim.gpucert.io/step-seconds": "fast"}}
GAUGES = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
)


@dataclass(frozen=True)
class World:
    sim: SimCluster
    core: client.CoreV1Api
    #: job → when it began (unix seconds, on a minute)
    start: dict[str, float]


def training_job(name: str, nodes: list[str], start: float, extra: dict[str, str]) -> dict[str, Any]:
    notes = {
        "sim.gpucert.io/training": "true",
        "sim.gpucert.io/training-start": datetime.fromtimestamp(start, UTC).isoformat(),
        **extra,
    }
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}
                ]
            }
        }
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": len(nodes),
            "completions": len(nodes),
            "backoffLimit": 1 if extra else 3,
            "template": {
                "metadata": {"annotations": notes},
                "spec": {
                    "restartPolicy": "Never",
                    "affinity": affinity,
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "ghcr.io/example/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": "8"}},
                        }
                    ],
                },
            },
        },
    }


def job_pods(world: World, job: str) -> list[client.V1Pod]:
    ns, name = job.split("/")
    return sorted(
        world.core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items,
        key=lambda p: (p.spec.node_name or "", p.status.start_time),
    )


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    now = time.time()
    start = {
        THERMAL: (now - 90 * 60) // 60 * 60,
        INPUT: (now - 40 * 60) // 60 * 60,
        EVICT: (now - 40 * 60) // 60 * 60,
        NET: (now - 20 * 60) // 60 * 60,
        DONE: (now - 30 * 60) // 60 * 60,
        BAD: now // 60 * 60,
    }
    with SimCluster(nodes=24, gpus=8, preconfigured=True, seed=21) as sim:
        core = client.CoreV1Api(sim.api_client())
        sim.inject(
            {
                "training": [
                    {
                        "kind": "gpu_throttle",
                        "job": THERMAL,
                        "node": HOT[0],
                        "gpu": HOT[1],
                        "from_minute": 30,
                        "params": {"clock_frac": 0.5},
                    },
                    {"kind": "slow_input", "job": INPUT, "from_minute": 20, "params": {"factor": 1.6}},
                    {
                        "kind": "evict",
                        "job": EVICT,
                        "node": NODES[EVICT][1],
                        "at_minute": 20,
                        "params": {"gap_minutes": 5},
                    },
                    {
                        "kind": "nic_half_rate",
                        "job": NET,
                        "node": NODES[NET][0],
                        "device": "mlx5_2",
                        "from_minute": 10,
                        "params": {"flapping": True},
                    },
                ]
            }
        )
        batch = client.BatchV1Api(sim.api_client())
        for job, nodes in NODES.items():
            ns, name = job.split("/")
            core.create_namespace({"metadata": {"name": ns}})
            batch.create_namespaced_job(ns, training_job(name, nodes, start[job], NOTES.get(job, {})))
        w = World(sim, core, start)
        for job, nodes in NODES.items():
            eventually(
                lambda job=job, nodes=nodes: (
                    set(nodes)
                    <= {  # type: ignore[misc]
                        p.spec.node_name for p in job_pods(w, job) if p.status.phase == PHASE[job]
                    }
                ),
                20,
            )
        yield w
        assert sim.runtime is not None
        assert sim.runtime.errors == []


def log_records(world: World, pod: client.V1Pod) -> list[dict[str, Any]]:
    text = world.core.read_namespaced_pod_log(pod.metadata.name, pod.metadata.namespace)
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def steps_of(records: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(unix time, step seconds) of each step line."""
    return [(datetime.fromisoformat(r["ts"]).timestamp(), r["step_time_s"]) for r in records if "step_time_s" in r]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def series(text: str, name: str, *needles: str) -> dict[float, float]:
    """timestamp → value of the samples of ``name`` whose labels contain every needle (one series)."""
    out: dict[float, float] = {}
    labels_seen = set()
    for line in text.splitlines():
        if line.startswith(name + "{") and all(n in line for n in needles):
            labels, value, ts = line.rsplit(" ", 2)
            labels_seen.add(labels)
            out[float(ts)] = float(value)
    assert len(labels_seen) <= 1, labels_seen
    return out


def scrape(url: str) -> dict[tuple[str, str], tuple[dict[str, str], float]]:
    """(metric, gpu) → (labels, value) of an exporter's text."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name.removesuffix("_total"), s.labels["gpu"]): (s.labels, s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if "gpu" in s.labels
    }


# --- the fault document -------------------------------------------------------------------------------------


def test_the_training_section_of_a_fault_document_is_checked_entry_by_entry(world: World) -> None:
    plan = parse_fault_plan(
        {
            "training": [
                {
                    "kind": "gpu_throttle",
                    "job": "a/b",
                    "node": "gpu-node-00001",
                    "gpu": 2,
                    "from_minute": 30,
                    "until_minute": 90,
                    "params": {"clock_frac": 0.4},
                },
                {
                    "kind": "nic_half_rate",
                    "job": "a/b",
                    "node": "gpu-node-00002",
                    "device": "mlx5_3",
                    "from_minute": 5,
                    "params": {"flapping": True},
                },
                {"kind": "evict", "job": "a/b", "node": "gpu-node-00003", "at_minute": 60},
                {"kind": "slow_input", "job": "a/b", "from_minute": 0},
            ]
        },
        "doc.yaml",
    )
    assert [(f.kind, f.node, f.gpu, f.minute) for f in plan.training] == [
        ("gpu_throttle", "gpu-node-00001", 2, 30.0),
        ("nic_half_rate", "gpu-node-00002", None, 5.0),
        ("evict", "gpu-node-00003", None, 60.0),
        ("slow_input", None, None, 0.0),
    ]
    assert plan.training[0].param("clock_frac", 0.5) == 0.4
    assert plan.training[1].param("flapping", 0) == 1.0
    assert plan.training[2].param("gap_minutes", 5.0) == 5.0
    assert plan.training[1].device == "mlx5_3"

    good = {"kind": "slow_input", "job": "a/b", "from_minute": 1}
    bad = [
        ({"kind": "gpu_melt", "job": "a/b"}, "unknown training fault kind 'gpu_melt'"),
        ({"kind": "gpu_throttle", "job": "a/b", "node": "n", "from_minute": 3}, "gpu_throttle needs 'gpu'"),
        ({"kind": "evict", "job": "b", "node": "n", "at_minute": 3}, "'job' must be NAMESPACE/NAME"),
        ({"kind": "slow_input", "job": "a/b", "from_minute": -1}, "'from_minute' must be a number of minutes"),
        ({"kind": "slow_input", "job": "a/b", "from_minute": 9, "until_minute": 3}, "must come after"),
        (
            {"kind": "slow_input", "job": "a/b", "from_minute": 1, "params": {"factor": 0.5}},
            "training[1].params.factor: must be within [1, 100]",
        ),
        ({"kind": "evict", "job": "a/b", "node": "n", "at_minute": 1, "gpu": 2}, "unknown keys ['gpu'] for evict"),
    ]
    for entry, message in bad:
        with pytest.raises(InputError) as err:
            parse_fault_plan({"training": [good, entry]}, "doc.yaml")
        assert str(err.value).startswith("doc.yaml: training[1]"), str(err.value)
        assert message in str(err.value), str(err.value)

    # Over HTTP: checked against the cluster too (the node), all or nothing, the entry named.
    before = world.sim.training.faults()
    doc = {
        "training": [good | {"job": "x/y"}, {"kind": "evict", "job": "x/y", "node": "gpu-node-09999", "at_minute": 1}]
    }
    request = urllib.request.Request(
        f"{world.sim.url}/gpucert/inject",
        data=json.dumps(doc).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    message = json.loads(refused.value.read())["error"]
    assert "training[1]" in message
    assert "gpu-node-09999" in message
    assert world.sim.training.faults() == before


# --- a GPU throttling ---------------------------------------------------------------------------------------


def test_a_throttled_gpu_changes_at_its_minute_in_the_history_and_shows_in_the_live_scrape(world: World) -> None:
    onset = world.start[THERMAL] + 30 * 60
    text = world.sim.training_history(THERMAL, onset - 5 * 60, onset + 5 * 60, step_s=STEP)
    assert text.endswith("# EOF\n")
    hot = next(p for p in job_pods(world, THERMAL) if p.spec.node_name == HOT[0])
    me = (
        f'gpu="{HOT[1]}",',
        f'hostname="{HOT[0]}"',
        f'pod="{hot.metadata.name}"',
        'namespace="thermal"',
        'container="trainer"',
    )
    clock = series(text, "DCGM_FI_DEV_SM_CLOCK", *me)
    bits = series(text, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", *me)
    temp = series(text, "DCGM_FI_DEV_GPU_TEMP", *me)
    assert sorted(clock) == [onset + STEP * k for k in range(-20, 21)]
    assert {v for t, v in clock.items() if t < onset} == {1980}
    assert {v for t, v in clock.items() if t >= onset} == {990}
    assert {v for t, v in bits.items() if t < onset} == {0}
    assert {v for t, v in bits.items() if t >= onset} == {0x48}
    assert min(v for t, v in temp.items() if t >= onset) > max(v for t, v in temp.items() if t < onset)
    # Its neighbour keeps its clock; its peers wait in the collective: a little less busy, clocks as they were.
    neighbour = (f'gpu="{HOT[1] - 1}",', f'hostname="{HOT[0]}"')
    assert set(series(text, "DCGM_FI_DEV_SM_CLOCK", *neighbour).values()) == {1980}
    util = series(text, "DCGM_FI_DEV_GPU_UTIL", 'gpu="0",', 'hostname="gpu-node-00009"')
    before = mean([v for t, v in util.items() if t < onset])
    after = mean([v for t, v in util.items() if t >= onset])
    assert before >= 90
    assert after < before - 1
    assert after > 80
    thermal = series(text, "DCGM_FI_DEV_THERMAL_VIOLATION", *me)
    assert thermal[onset] == 0
    assert thermal[onset + 60] == 60e9

    # Live: the same GPU, labelled with its pod; and the same values as the history at the same instant.
    for _ in range(5):
        t0 = time.time()
        live = scrape(f"{world.sim.url}/dcgm/{HOT[0]}/metrics")
        t1 = time.time()
        if t0 // STEP == t1 // STEP:
            break
    labels, value = live["DCGM_FI_DEV_SM_CLOCK", str(HOT[1])]
    assert value == 990
    assert live["DCGM_FI_DEV_CLOCKS_EVENT_REASONS", str(HOT[1])][1] == 0x48
    assert (labels["pod"], labels["namespace"], labels["container"]) == (hot.metadata.name, "thermal", "trainer")
    at = t0 // STEP * STEP
    now_text = world.sim.training_history(THERMAL, at - 60, at + 0.5, step_s=STEP)
    for name in GAUGES:
        for gpu in range(8):
            past = series(now_text, name, f'gpu="{gpu}",', f'hostname="{HOT[0]}"')
            assert past[at] == pytest.approx(live[name, str(gpu)][1], abs=1e-9), (name, gpu)


def test_the_step_time_rises_after_the_throttle_in_the_logs_and_the_job_metrics(world: World) -> None:
    onset = world.start[THERMAL] + 30 * 60
    pods = job_pods(world, THERMAL)
    records = log_records(world, pods[0])
    steps = steps_of(records)
    assert steps[0][0] >= world.start[THERMAL]
    assert steps[-1][0] > time.time() - 10
    before = mean([s for t, s in steps if world.start[THERMAL] + 60 < t < onset])
    after = mean([s for t, s in steps if t > onset + 10])
    assert before == pytest.approx(1.0, rel=0.02)
    assert after == pytest.approx(0.7 / 0.5 + 0.3, rel=0.02)  # the throttled GPU's compute, twice as long
    slow = next(t for t, s in steps if s > 1.35)
    assert onset - 2 < slow < onset + 3
    other = steps_of(log_records(world, pods[7]))  # each log gains its steps on its own beat: a few apart
    common = min(len(other), len(steps))
    assert other[:common] == steps[:common]
    assert abs(len(other) - len(steps)) < 5

    # NCCL Inspector's view in the logs: after the onset the straggler waits least, its peers longest.
    collectives = [
        r
        for r in log_records(world, next(p for p in pods if p.spec.node_name == HOT[0]))
        if r.get("collective") == "AllReduce" and datetime.fromisoformat(r["ts"]).timestamp() > onset
    ]
    busbw = {g: mean([r["busbw_gbps"] for r in collectives if r["gpu"] == g]) for g in range(8)}
    assert max(busbw, key=busbw.__getitem__) == HOT[1]
    assert busbw[HOT[1]] > 2 * busbw[0]

    with urllib.request.urlopen(f"{world.sim.url}/training/thermal/pretrain/metrics", timeout=10) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    gauge = {s.labels["pod"]: s.value for s in families["train_step_seconds"].samples}
    assert set(gauge) == {p.metadata.name for p in pods}
    assert len(set(gauge.values())) == 1
    assert next(iter(gauge.values())) == pytest.approx(1.7, rel=0.05)
    assert len(families["nccl_bus_bandwidth_gbs"].samples) == 16 * 8
    # NCCL Inspector's own label set (inspector_prom.cc), one dump per rank: no simplified node/gpu/comm.
    samples = families["nccl_collective_exec_time_microseconds"].samples
    assert {frozenset(x.labels) for x in samples} == {frozenset(INSPECTOR_LABELS)}
    assert sorted(int(x.labels["rank"]) for x in samples) == list(range(16 * 8))
    [hot] = [p for p in pods if p.spec.node_name == HOT[0]]
    mine = {x.labels["gpu_device_id"]: x for x in samples if x.labels["hostname"] == hot.metadata.name}
    assert sorted(mine) == [f"GPU{g}" for g in range(8)]  # the pod holds all 8: GPU<n> is GPU n
    assert {x.labels["nranks"] for x in samples} == {"128"}
    assert {x.labels["n_nodes"] for x in samples} == {"16"}
    assert len({x.labels["comm_id"] for x in samples}) == 1
    # The straggler arrives last and waits least: the shortest collective is its rank's.
    assert min(samples, key=lambda x: x.value) is mine[f"GPU{HOT[1]}"]


# --- a slow input pipeline ----------------------------------------------------------------------------------


def test_a_slow_input_pipeline_slows_the_steps_and_idles_the_gpus_but_leaves_clocks_untouched(world: World) -> None:
    onset = world.start[INPUT] + 20 * 60
    text = world.sim.training_history(INPUT, onset - 5 * 60, onset + 5 * 60, step_s=STEP)
    for node in NODES[INPUT]:
        for gpu in range(8):
            me = (f'gpu="{gpu}",', f'hostname="{node}"')
            assert set(series(text, "DCGM_FI_DEV_SM_CLOCK", *me).values()) == {1980}
            assert set(series(text, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", *me).values()) == {0}
            util = series(text, "DCGM_FI_DEV_GPU_UTIL", *me)
            assert min(v for t, v in util.items() if t < onset) > 90
            assert max(v for t, v in util.items() if t >= onset) < 65  # idle more, all alike
    live = scrape(f"{world.sim.url}/dcgm/{NODES[INPUT][0]}/metrics")
    assert {live["DCGM_FI_DEV_SM_CLOCK", str(g)][1] for g in range(8)} == {1980}
    assert max(live["DCGM_FI_DEV_GPU_UTIL", str(g)][1] for g in range(8)) < 65
    steps = steps_of(log_records(world, job_pods(world, INPUT)[0]))
    assert mean([s for t, s in steps if t < onset - 1]) == pytest.approx(1.0, rel=0.02)
    assert mean([s for t, s in steps if t > onset + 2]) == pytest.approx(1.6, rel=0.02)


# --- an eviction ---------------------------------------------------------------------------------------------


def test_an_evicted_pod_fails_with_its_event_in_the_past_and_its_replacement_resumes_after_the_gap(
    world: World,
) -> None:
    at = world.start[EVICT] + 20 * 60
    node = NODES[EVICT][1]
    pods = job_pods(world, EVICT)
    evicted = [p for p in pods if p.status.phase == "Failed"]
    assert [(p.spec.node_name, p.status.reason) for p in evicted] == [(node, "Evicted")]
    gone = evicted[0]
    assert "low on resource: memory" in gone.status.message
    assert {c.type: c.status for c in gone.status.conditions}["DisruptionTarget"] == "True"
    assert gone.status.container_statuses[0].state.terminated.exit_code == 137
    assert gone.status.start_time.timestamp() == world.start[EVICT]

    # By reason: the Job controller's Events carry no eventTime (a legacy recorder's, served through
    # events.k8s.io as a real server serves them), which the official client's EventsV1Event refuses.
    events = client.EventsV1Api(world.sim.api_client()).list_namespaced_event("evict", field_selector="reason=Evicted")
    [event] = events.items
    assert (event.regarding.kind, event.regarding.name, event.type) == ("Pod", gone.metadata.name, "Warning")
    assert event.event_time.timestamp() == at
    assert event.reporting_instance == node

    replacement = next(p for p in pods if p.spec.node_name == node and p.status.phase == "Running")
    assert replacement.status.start_time.timestamp() == at  # it holds the GPUs from the eviction on
    other = next(p for p in pods if p.spec.node_name == NODES[EVICT][0])
    assert max(t for t, _ in steps_of(log_records(world, gone))) < at
    resumed = min(t for t, _ in steps_of(log_records(world, replacement)))
    assert at + 5 * 60 < resumed < at + 5 * 60 + 2
    stalled = [t for t, _ in steps_of(log_records(world, other)) if at <= t <= at + 5 * 60]
    assert stalled == []  # every rank waits for the replacement
    job = client.BatchV1Api(world.sim.api_client()).read_namespaced_job("sft", "evict")
    assert job.status.failed == 1
    assert job.status.active == 2
    frames = world.sim.training_frames(EVICT, at - 60, at + 60)
    assert list(frames["events"]["reason"]) == ["Evicted"]
    assert frames["events"]["ts"].iloc[0].timestamp() == at


# --- the history in a real Prometheus ------------------------------------------------------------------------


def test_the_history_backfilled_by_promtool_answers_a_range_query(
    world: World,
    prom_bins: PromBins,  # noqa: F811
    tmp_path: Path,
) -> None:
    onset = world.start[THERMAL] + 30 * 60
    lo, hi = onset - 10 * 60, onset + 10 * 60
    written = world.sim.write_training_history(THERMAL, tmp_path / "history.om", lo, hi, step_s=STEP)
    assert written == (tmp_path / "history.om").stat().st_size
    made = subprocess.run(
        [str(prom_bins.promtool), "tsdb", "create-blocks-from", "openmetrics", "history.om", "data"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stderr

    def query(url: str, expr: str) -> list[dict[str, Any]]:
        args = urllib.parse.urlencode({"query": expr, "start": onset - 60, "end": onset + 60, "step": STEP})
        with urllib.request.urlopen(f"{url}/api/v1/query_range?{args}", timeout=30) as response:
            answer = json.loads(response.read())
        assert answer["status"] == "success"
        return list(answer["data"]["result"])

    with running_prometheus(prom_bins, tmp_path, IDLE_CONFIG) as url:
        [clock] = query(url, f'DCGM_FI_DEV_SM_CLOCK{{hostname="{HOT[0]}",gpu="{HOT[1]}"}}')
        [hot] = [p for p in job_pods(world, THERMAL) if p.spec.node_name == HOT[0]]
        assert clock["metric"]["pod"] == hot.metadata.name
        assert [(float(t) - onset, float(v)) for t, v in clock["values"]] == [
            (dt, 1980.0 if dt < 0 else 990.0) for dt in range(-60, 61, STEP)
        ]
        [violation] = query(url, f'irate(DCGM_FI_DEV_THERMAL_VIOLATION{{hostname="{HOT[0]}",gpu="{HOT[1]}"}}[45s])')
        assert [float(v) / 1e9 for t, v in violation["values"]] == [0.0] * 5 + [1.0] * 4
        steps = query(url, "train_step_seconds")
        assert len(steps) == 16
        late = [float(v) for t, v in steps[0]["values"] if float(t) > onset + 15]
        assert all(math.isclose(v, 1.7, rel_tol=0.05) for v in late)
        assert len(query(url, 'node_infiniband_rate_bytes_per_second{device="mlx5_0"}')) == 16
        # NCCL Inspector as node-exporter's textfile collector serves it, coll_sn and timestamp dropped.
        [nccl] = query(
            url, f'nccl_collective_exec_time_microseconds{{hostname="{hot.metadata.name}",gpu_device_id="GPU{HOT[1]}"}}'
        )
        assert set(nccl["metric"]) == {"__name__", *INSPECTOR_LABELS} - {"coll_sn", "timestamp"} | {"instance", "job"}
        assert nccl["metric"]["instance"] == f"{HOT[0]}:9100"


# --- a NIC at half rate, a job that ended, a job refused ---------------------------------------------------


def test_a_flapping_nic_at_half_rate_slows_the_collectives_and_shows_in_its_node_exporter(world: World) -> None:
    onset = world.start[NET] + 10 * 60
    flaky, fine = NODES[NET]
    with urllib.request.urlopen(f"{world.sim.url}/node-exporter/{flaky}/metrics", timeout=10) as response:
        ib = {
            (s.name, s.labels["device"]): s.value
            for f in text_string_to_metric_families(response.read().decode())
            for s in f.samples
        }
    rate = {d: v for (name, d), v in ib.items() if name == "node_infiniband_rate_bytes_per_second"}
    assert rate.pop("mlx5_2") == 25e9
    assert set(rate.values()) == {50e9}
    assert len(rate) == 7
    assert ib["node_infiniband_symbol_error_total", "mlx5_2"] > 0
    assert ib["node_infiniband_link_downed_total", "mlx5_2"] >= 1
    assert ib["node_infiniband_symbol_error_total", "mlx5_1"] == 0
    with urllib.request.urlopen(f"{world.sim.url}/node-exporter/{fine}/metrics", timeout=10) as response:
        healthy = response.read().decode()
    assert "25000000000" not in healthy
    assert 'node_infiniband_symbol_error_total{device="mlx5_2",port="1"} 0' in healthy

    steps = steps_of(log_records(world, job_pods(world, NET)[1]))
    assert mean([s for t, s in steps if t < onset - 1]) == pytest.approx(1.0, rel=0.02)
    assert mean([s for t, s in steps if t > onset + 2]) == pytest.approx(0.7 + 2 * 0.3, rel=0.02)  # collective ×2
    with urllib.request.urlopen(f"{world.sim.url}/training/net/ddp/metrics", timeout=10) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    busbw = [s.value for s in families["nccl_bus_bandwidth_gbs"].samples]
    assert len(busbw) == 16
    # Half of the healthy 360 GB/s; each gauge jitters by 1.5 % (2.7 GB/s), so ±30 GB/s is 11 σ: 16 a run.
    assert median(busbw) == pytest.approx(180.0, rel=0.02)
    assert all(150 < v < 210 for v in busbw)
    clocks = scrape(f"{world.sim.url}/dcgm/{fine}/metrics")
    assert {clocks["DCGM_FI_DEV_SM_CLOCK", str(g)][1] for g in range(8)} == {1980}


def test_a_job_past_its_duration_succeeded_and_a_bad_annotation_fails_its_pod(world: World) -> None:
    end = world.start[DONE] + 600
    [done] = job_pods(world, DONE)
    terminated = done.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason, terminated.finished_at.timestamp()) == (0, "Completed", end)
    text = world.core.read_namespaced_pod_log(done.metadata.name, "done")
    last = text.splitlines()[-1]
    assert last.startswith("training complete: ")
    assert 590 <= int(last.split()[2]) <= 610
    assert max(t for t, _ in steps_of(log_records(world, done))) <= end
    job = client.BatchV1Api(world.sim.api_client()).read_namespaced_job("short", "done")
    assert [c.type for c in job.status.conditions if c.status == "True"] == ["SuccessCriteriaMet", "Complete"]

    bad = job_pods(world, BAD)[0]  # and its retry, refused alike
    assert bad.status.container_statuses[0].state.terminated.exit_code == 2
    log = world.core.read_namespaced_pod_log(bad.metadata.name, "bad")
    assert log == (
        "gpucert-sim: training pod refused: annotation sim.gpucert.io/step-seconds: 'fast' is not a number of seconds\n"
    )
