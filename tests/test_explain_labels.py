"""``gpucert explain`` gathering and judging from a real Prometheus holding telemetry labelled the way real
clusters label it (issue 31).

One backfilled Prometheus per module holds several jobs side by side, each on its own nodes and in its own
namespace, each written the way one real setup writes it:

* ``operator``: dcgm-exporter behind the GPU Operator's ServiceMonitor (``honorLabels`` unset, so false): the
  workload's pod arrives as ``exported_pod`` / ``exported_namespace`` / ``exported_container``, and ``pod``,
  ``namespace``, ``container``, ``service``, ``endpoint``, ``instance`` are the exporter's own (see
  ``fixtures/gpu-operator/dcgm-exporter-servicemonitor.asset.yaml`` of tests/assets.py's folder); NCCL
  Inspector's Prometheus dump (``ext-profiler/inspector/inspector_prom.cc``: ``comm_id``, ``hostname`` — the
  pod's name without hostNetwork —, ``rank``, ``gpu_device_id="GPU<n>"``, ``coll_sn``/``timestamp`` new with
  every dump, …) read by node-exporter's textfile collector; one GPU 20 % slower with no DCGM sign;
* ``plain``: a plain scrape config honouring dcgm-exporter's labels (``pod``, ``namespace``, ``Hostname``), the
  training pods on hostNetwork (NCCL's ``hostname`` is the node's); one GPU whose PCIe link trained down to
  Gen4 x4, with replays, among peers whose replays are noisy;
* ``podhost``: dcgm-exporter without hostNetwork or NODE_NAME (its ``Hostname`` is its own pod's name) scraped
  with a ``node`` relabeling; the job shares a node with another team's pod (4 GPUs each): nothing wrong;
* ``hung``: the step gauge freezes while the GPUs stay busy;
* ``custom``: a custom relabeling explain cannot guess — the ServiceMonitor's metricRelabelings renamed
  ``exported_pod`` / ``exported_namespace`` to ``workload_pod`` / ``workload_namespace`` (``pod`` stays the
  exporter's own), dcgm-exporter runs without hostNetwork (its ``Hostname`` is its pod's name) and the node is
  relabeled into ``kube_node``; the job shares a node with another team's pod; one GPU throttles thermally:
  read only when told with ``--labels``;
* ``podsteps``: each pod reports its own step time (its compute, not the job's) and one pod's runs 20 % slower
  from the onset, with no DCGM sign and no NCCL Inspector: the pod's node is the straggler.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpucert.errors import InputError
from gpucert.explain import JobTarget, LabelMap, TargetPod, diagnose, empty_record, gather
from gpucert.kube import KubeError
from gpucert.telemetry import PrometheusSource

from .test_telemetry_prometheus import IDLE_CONFIG, PromBins, prom_bins, running_prometheus  # noqa: F401

STEP_S = 15
MINUTES = 60
ONSET_MINUTE = 30
GPUS = 8
NODES = 3
JOBS = ("operator", "plain", "podhost", "hung", "custom", "podsteps")
#: What the custom relabeling is, as ``--labels`` says it.
CUSTOM_LABELS = "pod=workload_pod,namespace=workload_namespace,node=kube_node"


def node_of(job: str, i: int) -> str:
    return f"{job}-gpu-{i:02d}"


def pod_of(job: str, i: int) -> str:
    return f"train-{job}-{i}"


@dataclass(frozen=True)
class World:
    url: str
    start: pd.Timestamp
    end: pd.Timestamp


class _NoEvents:
    """The cluster side is not under test here: no Events, nodes without condition changes."""

    def list_objects(self, *_: Any, **__: Any) -> list[dict[str, Any]]:
        return []

    def get(self, *_: Any, **__: Any) -> dict[str, Any]:
        raise KubeError("not here")


def _series(lines: list[str], name: str, labels: Mapping[str, object], times: np.ndarray, values: np.ndarray) -> None:
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    lines.extend(f"{name}{{{text}}} {v:.6g} {int(t)}" for t, v in zip(times, values, strict=True) if np.isfinite(v))


def _dcgm_labels(job: str, node: int, gpu: int, holder: tuple[str, str] | None) -> dict[str, object]:
    host = node_of(job, node)
    base: dict[str, object] = {
        "gpu": gpu,
        "UUID": f"GPU-{job}-{node}-{gpu}",
        "device": f"nvidia{gpu}",
        "modelName": "NVIDIA H100 80GB HBM3",
        "DCGM_FI_DRIVER_VERSION": "570.124.06",
    }
    if job == "operator":
        base |= {
            "Hostname": host,
            "container": "nvidia-dcgm-exporter",
            "endpoint": "gpu-metrics",
            "instance": f"10.1.0.{node}:9400",
            "job": "nvidia-dcgm-exporter",
            "namespace": "gpu-operator",
            "pod": f"nvidia-dcgm-exporter-{node:05x}",
            "service": "nvidia-dcgm-exporter",
        }
        if holder is not None:
            base |= {"exported_namespace": holder[0], "exported_pod": holder[1], "exported_container": "train"}
    elif job == "custom":
        base |= {
            "Hostname": f"nvidia-dcgm-exporter-{node:05x}",
            "kube_node": host,
            "container": "nvidia-dcgm-exporter",
            "instance": f"10.4.0.{node}:9400",
            "job": "nvidia-dcgm-exporter",
            "namespace": "gpu-operator",
            "pod": f"nvidia-dcgm-exporter-{node:05x}",
        }
        if holder is not None:
            base |= {"workload_namespace": holder[0], "workload_pod": holder[1]}
    elif job == "podhost":
        base |= {
            "Hostname": f"nvidia-dcgm-exporter-{node:05x}",
            "node": host,
            "instance": f"10.2.0.{node}:9400",
            "job": "dcgm-exporter",
        }
        if holder is not None:
            base |= {"namespace": holder[0], "pod": holder[1], "container": "train"}
    else:
        base |= {"Hostname": host, "instance": f"{host}:9400", "job": "dcgm-exporter"}
        if holder is not None:
            base |= {"namespace": holder[0], "pod": holder[1], "container": "train"}
    return base


def _history(start: int, end: int) -> str:
    rng = np.random.default_rng(31)
    times = np.arange(start, end + 1, STEP_S, dtype=np.int64)
    minute = (times - start) / 60.0
    after = minute >= ONSET_MINUTE
    fam: dict[str, list[str]] = {}

    def add(name: str, labels: Mapping[str, object], values: np.ndarray) -> None:
        _series(fam.setdefault(name, []), name, labels, times, values)

    for job in JOBS:
        for n in range(NODES):
            for g in range(GPUS):
                holder: tuple[str, str] | None = (job, pod_of(job, n))
                if job in ("podhost", "custom") and n == 0 and g >= 4:
                    holder = ("other-team", "notebook-7")  # the job holds GPUs 0-3 of this node only
                labels = _dcgm_labels(job, n, g, holder)
                noise = rng.standard_normal((8, len(times)))
                busy = np.ones(len(times))
                if job == "hung":
                    busy[:] = 1.0  # spinning in NCCL: busy to the end
                clock = np.rint(1980 + 6 * noise[0])
                reasons = np.where(rng.random(len(times)) < 0.3, 4.0, 0.0)
                if job == "custom" and (n, g) == (1, 2):
                    clock[after], reasons[after] = np.rint(0.7 * clock[after]), 0x48  # HW thermal + HW slowdown
                add("DCGM_FI_DEV_SM_CLOCK", labels, clock)
                add("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", labels, reasons)
                add("DCGM_FI_DEV_POWER_USAGE", labels, np.round(650 + 10 * noise[1], 1))
                add("DCGM_FI_DEV_GPU_TEMP", labels, np.rint(66 + 1.2 * noise[2]))
                add("DCGM_FI_DEV_GPU_UTIL", labels, np.clip(np.rint(95 * busy + 1.0 * noise[3]), 0, 100))
                add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, np.round(0.9 * busy + 0.01 * noise[4], 3))
                add("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", labels, np.cumsum(np.full(len(times), 300e9 * STEP_S)))
                add("DCGM_FI_PROF_PCIE_TX_BYTES", labels, np.rint(18e9 + 2e8 * noise[5]))
                add("DCGM_FI_PROF_PCIE_RX_BYTES", labels, np.rint(22e9 + 2e8 * noise[6]))
                add("DCGM_FI_DEV_XID_ERRORS", labels, np.zeros(len(times)))
                add("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", labels, np.zeros(len(times)))
                add("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", labels, np.zeros(len(times)))
                add("DCGM_FI_DEV_ROW_REMAP_FAILURE", labels, np.zeros(len(times)))
                add("DCGM_FI_DEV_THERMAL_VIOLATION", labels, np.zeros(len(times)))
                add("DCGM_FI_DEV_POWER_VIOLATION", labels, np.zeros(len(times)))
                gen, width = np.full(len(times), 5.0), np.full(len(times), 16.0)
                per_min = np.where(rng.random(len(times)) < 0.3, rng.random(len(times)) * 30, 0.0)
                if job == "plain" and (n, g) == (1, 6):
                    gen[after], width[after], per_min[after] = 4.0, 4.0, 400.0
                add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", labels, np.floor(np.cumsum(per_min * STEP_S / 60)))
                add("DCGM_FI_DEV_PCIE_LINK_GEN", labels, gen)
                add("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", labels, np.full(len(times), 5.0))
                add("DCGM_FI_DEV_PCIE_LINK_WIDTH", labels, width)
                add("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", labels, np.full(len(times), 16.0))
        # The job's step time, one gauge per pod (a PodMonitor: the pod's own labels).
        step = 1.0 + 0.02 * rng.standard_normal(len(times))
        if job in ("operator", "plain", "custom"):
            step[after] *= 1.2
        if job == "hung":
            step[after] = step[np.flatnonzero(after)[0]]
        for n in range(NODES):
            own = step
            if job == "podsteps":  # each pod's own compute time: pod 1's runs 20 % slower from the onset
                own = 1.0 + 0.02 * rng.standard_normal(len(times))
                if n == 1:
                    own[after] *= 1.2
            add(
                "train_step_seconds",
                {
                    "namespace": job,
                    "pod": pod_of(job, n),
                    "container": "train",
                    "instance": f"10.3.{n}.1:8000",
                    "job": f"{job}/train",
                },
                own,
            )
        # NCCL Inspector, one dump per rank and interval: coll_sn and timestamp make each a series of its own.
        if job in ("podhost", "custom", "podsteps"):
            continue
        for n in range(NODES):
            for g in range(GPUS):
                rank = n * GPUS + g
                exec_us = 300 * (1 + 0.015 * rng.standard_normal(len(times)))
                if job == "operator" and (n, g) != (2, 5):
                    exec_us[after] *= 440 / 300  # everyone waits for node 2's GPU 5
                if job == "hung":
                    exec_us[after] = np.nan  # nothing completes once it hangs
                host = pod_of(job, n) if job != "plain" else node_of(job, n)
                for k, (t, us) in enumerate(zip(times, exec_us, strict=True)):
                    if not np.isfinite(us):
                        continue
                    stamp = pd.Timestamp(int(t), unit="s", tz="UTC").strftime("%Y-%m-%dT%H:%M:%SZ")
                    labels = {
                        "comm_id": f"0x{job}c0ffee",
                        "hostname": host,
                        "rank": rank,
                        "slurm_job": "unknown",
                        "slurm_job_id": "unknown",
                        "nranks": NODES * GPUS,
                        "n_nodes": NODES,
                        "gpu_device_id": f"GPU{g}",
                        "collective": "AllReduce",
                        "coll_sn": 1000 + 97 * k,
                        "timestamp": stamp,
                        "message_size": "256.00MB",
                        "instance": f"{node_of(job, n)}:9100",
                        "job": "node-exporter",
                    }
                    one = np.array([t])
                    _series(
                        fam.setdefault("nccl_collective_exec_time_microseconds", []),
                        "nccl_collective_exec_time_microseconds",
                        labels,
                        one,
                        np.array([us]),
                    )
                    _series(
                        fam.setdefault("nccl_bus_bandwidth_gbs", []),
                        "nccl_bus_bandwidth_gbs",
                        labels,
                        one,
                        np.array([360 * 300 / us]),
                    )
    out = []
    for name, lines in fam.items():
        out.append(f"# TYPE {name} gauge")
        out.extend(lines)
    out.append("# EOF")
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def world(prom_bins: PromBins, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:  # noqa: F811
    end = (int(pd.Timestamp.now(tz="UTC").timestamp()) - 900) // 60 * 60
    start = end - MINUTES * 60
    work = tmp_path_factory.mktemp("explain-labels")
    (work / "history.om").write_text(_history(start, end), encoding="utf-8")
    made = subprocess.run(
        [str(prom_bins.promtool), "tsdb", "create-blocks-from", "openmetrics", "history.om", "data"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    with running_prometheus(prom_bins, work, IDLE_CONFIG) as url:
        yield World(url, pd.Timestamp(start, unit="s", tz="UTC"), pd.Timestamp(end, unit="s", tz="UTC"))


def target(
    world: World, job: str, *, gpus: int = GPUS, window: tuple[pd.Timestamp, pd.Timestamp] | None = None
) -> JobTarget:
    pods = tuple(
        TargetPod(
            namespace=job,
            name=pod_of(job, n),
            uid=f"uid-{job}-{n}",
            node=node_of(job, n),
            phase="Running",
            reason="",
            gpus=gpus if n == 0 else GPUS,
            node_gpus=GPUS,
            started=world.start - pd.Timedelta(minutes=5),
            ended=None,
            containers=("train",),
        )
        for n in range(NODES)
    )
    return JobTarget(
        job=f"{job}/train",
        kind="Job",
        namespace=job,
        selector=f"job-name={job}",
        pods=pods,
        window=window or (world.start, world.end),
    )


def explained(world: World, tgt: JobTarget, labels: str | None = None) -> Any:
    source = PrometheusSource(world.url)
    got = gather(_NoEvents(), source, tgt, read_logs=False, labels=LabelMap.parse(labels))  # type: ignore[arg-type]
    explanation, _, seconds = diagnose(tgt, got, empty_record(), list(got.notes))
    print(tgt.job, dict(got.seconds), seconds, got.queries)
    return got, explanation


def test_behind_the_operators_servicemonitor_the_silent_straggler_is_found_from_nccl_inspector(world: World) -> None:
    got, ex = explained(world, target(world, "operator"))
    assert got.telemetry["pod"].astype(str).unique().tolist() != []  # exported_pod tied every GPU to the job
    assert sorted(got.telemetry["pod"].astype(str).unique()) == [pod_of("operator", n) for n in range(NODES)]
    assert got.telemetry.groupby(["node", "gpu"], observed=True).ngroups == NODES * GPUS
    assert len(got.collectives)
    assert got.collectives["rank"].notna().all()
    assert set(got.collectives["gpu"].dropna().astype(int)) == set(range(GPUS))  # GPU<n> of the pod → GPU n
    assert ex.verdict == "gpu"
    top = ex.suspects[0]
    assert (top.node, top.gpu, top.silent) == (node_of("operator", 2), 5, True)
    assert "rank 21" in top.evidence[0]
    assert any(e.startswith("its telemetry shows no cause") for e in top.evidence)
    assert ex.answer[0].startswith(f"gpu: {node_of('operator', 2)} GPU 5 (GPU-operator-2-5) is the straggler")
    assert ex.recommendations[0].startswith(f"re-certify {node_of('operator', 2)} (GPU 5)")
    assert not [n for n in ex.notes if "make sure Prometheus scrapes" in n]


def test_a_plain_scrape_with_host_network_names_the_downtrained_pcie_link(world: World) -> None:
    _, ex = explained(world, target(world, "plain"))
    assert ex.verdict == "gpu"
    top = ex.suspects[0]
    assert (top.node, top.gpu) == (node_of("plain", 1), 6)
    text = " | ".join(top.evidence)
    assert "PCIe link trained down to Gen4 x4 vs its maximum Gen5 x16 (peers run Gen5 x16)" in text
    assert "PCIe replays 400 per minute" in text
    assert {s.node for s in ex.suspects} == {node_of("plain", 1)}  # the noisy peers are not blamed


def test_an_exporter_named_after_its_own_pod_and_a_shared_node_are_read_and_said(world: World) -> None:
    got, ex = explained(world, target(world, "podhost", gpus=4))
    assert got.telemetry.groupby(["node", "gpu"], observed=True).ngroups == NODES * GPUS - 4
    assert ex.verdict == "healthy", ex.answer
    assert any(
        n.startswith(
            f"4 GPU(s) on the job's nodes name pods outside the job and were left out ({node_of('podhost', 0)} GPU 4"
        )
        and "other-team/notebook-7" in n
        for n in ex.notes
    ), ex.notes


def test_a_hang_is_found_with_its_start(world: World) -> None:
    _, ex = explained(world, target(world, "hung"))
    assert ex.verdict == "hang"
    top = ex.suspects[0]
    start = world.start + pd.Timedelta(minutes=ONSET_MINUTE)
    assert top.onset is not None
    assert abs((top.onset - start).total_seconds()) <= STEP_S
    assert "its GPUs stayed busy" in top.evidence[0]
    assert top.evidence[1].startswith("collective in flight: AllReduce on communicator 0xhungc0ffee")


def test_a_window_with_no_data_is_no_data(world: World) -> None:
    before = (world.start - pd.Timedelta(hours=5), world.start - pd.Timedelta(hours=4))
    _, ex = explained(world, target(world, "operator", window=before))
    assert ex.verdict == "no-data"


# --- telling explain the labels (--labels) --------------------------------------------------------------------


@pytest.mark.parametrize(("job", "labels"), [("operator", "operator"), ("plain", "plain")])
def test_the_presets_read_what_detection_reads(world: World, job: str, labels: str) -> None:
    _, detected = explained(world, target(world, job))
    got, told = explained(world, target(world, job), labels)
    assert got.telemetry.groupby(["node", "gpu"], observed=True).ngroups == NODES * GPUS
    assert told.verdict == detected.verdict == "gpu"
    assert [(s.node, s.gpu) for s in told.suspects[:1]] == [(s.node, s.gpu) for s in detected.suspects[:1]]


def test_a_custom_relabeling_is_read_once_told_and_said_when_not(world: World) -> None:
    tgt = target(world, "custom", gpus=4)
    got, ex = explained(world, tgt)
    assert got.telemetry.empty  # nothing names the node by a label explain knows: it cannot guess
    assert ex.verdict == "no-data"
    assert any("--labels node=LABEL" in n for n in ex.notes), ex.notes

    got, ex = explained(world, tgt, CUSTOM_LABELS)
    # The job's GPUs only: node 0's other 4 belong to another team's pod, named as such.
    assert got.telemetry.groupby(["node", "gpu"], observed=True).ngroups == NODES * GPUS - 4
    assert sorted(got.telemetry["pod"].astype(str).unique()) == [pod_of("custom", n) for n in range(NODES)]
    assert ex.verdict == "gpu", ex.answer
    top = ex.suspects[0]
    assert (top.node, top.gpu, top.silent) == (node_of("custom", 1), 2, False)
    assert "HW thermal slowdown (0x40)" in top.evidence[0]
    assert any(
        n.startswith(
            f"4 GPU(s) on the job's nodes name pods outside the job and were left out ({node_of('custom', 0)} GPU 4"
        )
        and "other-team/notebook-7" in n
        for n in ex.notes
    ), ex.notes


@pytest.mark.parametrize(
    ("labels", "bad"),
    [
        ("operators", "'operators'"),
        ("pod=workload_pod", "together"),
        ("node=kube-node", "'node=kube-node'"),
        ("operator,pod=a,namespace=b", "together"),
        ("node=a,node=b", "'node=b'"),
    ],
)
def test_a_bad_label_mapping_is_one_line(labels: str, bad: str) -> None:
    with pytest.raises(InputError, match=f"^--labels '{labels}': .*") as exc:
        LabelMap.parse(labels)
    assert bad in str(exc.value)
    assert "\n" not in str(exc.value)


# --- per-pod step times -----------------------------------------------------------------------------------------


def test_a_pod_whose_own_step_time_lags_names_its_node(world: World) -> None:
    got, ex = explained(world, target(world, "podsteps"))
    assert got.collectives.empty  # no NCCL Inspector: the pods' own step times alone
    assert got.steps["pod"].nunique() == NODES
    assert ex.verdict == "gpu", ex.answer
    top = ex.suspects[0]
    assert (top.node, top.gpu, top.layer, top.silent) == (node_of("podsteps", 1), None, "node", True)
    # +20 % against the others; against the median of all three pods (its own among them) a little less.
    assert re.match(
        rf"pod {pod_of('podsteps', 1)}'s step time runs \+(1[5-9]|20) % against its peers' from ", top.evidence[0]
    ), top.evidence[0]
    assert top.evidence[1].startswith("its node's telemetry shows no cause")
    start = world.start + pd.Timedelta(minutes=ONSET_MINUTE)
    assert top.onset is not None
    assert abs((top.onset - start).total_seconds()) <= 2 * STEP_S
    assert [s.node for s in ex.suspects] == [node_of("podsteps", 1)]  # its peers are not blamed
    assert ex.recommendations[0].startswith(f"re-certify {node_of('podsteps', 1)} (all its GPUs)")
