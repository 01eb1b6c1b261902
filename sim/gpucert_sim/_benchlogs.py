"""What a simulated pod prints: for a gpucert benchmark pod, what the in-pod payload would print there.

gpucert reads a benchmark pod's log (``pods/log``) and parses it as results, so the simulator must
answer with exactly the payload's output, measured on that node's simulated GPUs, faults included;
anything else would test a parser against a format nobody prints.

Which pods are benchmark pods
-----------------------------
A pod is a gpucert benchmark pod when it carries the label ``app.kubernetes.io/managed-by: gpucert``
and a run id: the label ``<prefix>/run-id`` (``gpucert.io/run-id`` with the default prefix;
docs/reference/labels-taints-conditions.md, "Benchmark Jobs, pods and ConfigMaps"), or an annotation of that
name when the label is absent. The label is what a benchmark Job's template carries, so ``kubectl get pods -l
gpucert.io/run-id=…`` finds a run's pods.

What its log holds
------------------
Pod logs mix both streams, as ``kubectl logs`` shows them. At container start (stderr): the stack record
line ``gpucert-stack: {…}`` (the payload's: the node's driver, see below; the benchmark image's CUDA,
torch and NCCL) and a ``gpucert-bench: run … on …`` line naming the devices. The record is taken once,
at start, as the payload takes it. When the container ends: the results rows on
stdout, one JSON object a line with the ten contract columns in order, as ``RowWriter`` prints them,
each ``error`` row preceded by its ``gpucert-bench: error: …`` line; then ``gpucert-bench: done …``.
The rows are the fleet model's for that node and run: ``fleet.run(run_id, nodes=[node], faults=<the
node's injected faults>, seed=<derived from cluster seed, run id and node>, ts=<container start>,
repeats=…, max_repeats=…, repeats_of=…)``, so the same run on the same node measures the same, and
another run measures afresh. The repeats are the container's ``--repeats``, ``--max-repeats`` and
``--repeats-of``, read with the payload's own parser (its defaults when its arguments do not parse):
like the payload, the fleet model measures a result whose repeats disagree again, up to the maximum,
and the log says so on a ``gpucert-bench: GPU i: <metric>: repeats disagree …`` line before the rows. The payload
exits 0 even when a GPU crashed (an ``error`` row reports it), so such a pod Succeeds.

Which driver it reports
-----------------------
The one loaded on its node, as NVML would read it (:func:`node_driver`): the version a running pod of
gpucert's driver DaemonSet on that node runs (the ``<version>-<os>`` tag of its image; the pod's
``app.kubernetes.io/version`` label when the tag says none), else the host driver a node marked
``nvidia.com/gpu.deploy.driver=pre-installed`` declares through GPU feature discovery's labels. So a
``--preconfigured`` cluster reports the driver of its preseeded stack, ``gpucert configure`` changes what
the next benchmark reports, and a driver DaemonSet rolled to another image is seen node by node.
``cuda_driver`` is the CUDA version of that driver's branch in the compatibility matrix (left out when
the matrix gives only a major version). A node with no driver loaded gets what the payload prints
there: a stack record without driver, CUDA driver or VBIOS, no device, and ``error`` rows for the
telemetry and for every benchmark (node level, ``gpu_model`` ``unknown``), beside ``gpu_count_expected``.

Besides the benchmarks, every benchmark pod's rows carry the node's InfiniBand port telemetry (``ib_*``,
the fleet model's ``nic=True``: 8 ports ACTIVE at 400 Gb/s and no counter moving on a healthy node; a NIC
fault shows there) unless ``--skip nic``, and, when its arguments give ``--storage-path`` (a mounted volume
to read), ``storage_read_gbps`` rows (``storage=True``) unless ``--skip storage``.

Pair pods
---------
A pod of gpucert's pair benchmark (its container's arguments start with ``pair``: the Indexed Job of
``gpucert.certify.pair_job``) logs what one side of the payload's two-node all-reduce prints
(:mod:`gpucert.bench._cli`): its stack record, ``pair run … on <node>``, the rendezvous, then
``nccl_pair_busbw_gbps`` rows with ``node`` its own node and ``peer`` the other of ``--nodes``. Its rank
is its completion index (``$JOB_COMPLETION_INDEX``), its repeats the pair payload's own arguments. The
values are the fleet model's for that pair (``pairs=[(a, b)]``, the faults of both nodes and of the fabric
between their leaves in force) under a seed of the cluster and the run, and the model keys the pair's
noise on its two sorted node names: both pods of the pair log the same values and repeats, as the
payload's two sides report the one collective they ran together. The pair's measurement is made once,
when the first of its two pods ends, and kept for the second. A pair that cannot be measured logs a
node-level ``error`` row instead: its peer's node is not Ready, gone or has no driver (the rendezvous
never completes), its own node has no driver, or a rank died (the fleet model's NCCL crash on either
node: a lost GPU, an uncontained ECC error, a hung GSP).

A benchmark pod on a node the fleet does not know (created through the API, without simulated GPUs)
logs that no GPU was found and no rows. Any other pod logs a line when it starts and one when it ends.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from gpucert import __version__
from gpucert._names import dns_label_ok
from gpucert.bench import ArgumentsError, RepeatRule, check_args
from gpucert.metrics import METRICS, RESULT_COLUMNS
from gpucert.stack import load_matrix, node_info

from ._gpufaults import GpuFaults
from ._jobs import pod_index
from ._objects import deleting, phase
from .fleet import Fault, Fleet

__all__ = ["MANAGED_BY", "PairPod", "PodLogs", "node_driver", "pair_pod", "payload_repeats", "rows_jsonl"]

MANAGED_BY = ("app.kubernetes.io/managed-by", "gpucert")
_STACK_PREFIX = "gpucert-stack: "
_SAY = "gpucert-bench: "
# The benchmark image's software, as the payload would read it from torch; the driver is the node's.
_IMAGE_STACK = {"cuda": "12.4", "torch": "2.4.1", "nccl": "2.20.5"}
_VBIOS = "96.00.9F.00.04"
_DRIVER_POD = {"app.kubernetes.io/part-of": "gpucert", "app.kubernetes.io/component": "driver"}
# The GPU Operator's driver pods (ClusterPolicy or NVIDIADriver DaemonSets) say the same with their labels.
_OPERATOR_DRIVER_POD = {"app.kubernetes.io/managed-by": "gpu-operator", "app.kubernetes.io/component": "nvidia-driver"}
# A driver container's tag is `<driver version>-<os>` (compatibility.yaml, `os`).
_DRIVER_TAG = re.compile(r"^(\d{3,4}\.\d{1,3}(?:\.\d{1,3})?)(?:-|$)")
# What the payload says on a node without a loaded driver (NVML and torch both fail to start).
_NO_NVML = "NVML cannot start: NVMLError_DriverNotLoaded: Driver Not Loaded"
_NO_CUDA = (
    f"CUDA is not available to torch {_IMAGE_STACK['torch']} (built for CUDA {_IMAGE_STACK['cuda']}); "
    "no GPU can be benchmarked"
)
_BENCHMARKS = ("gemm_bf16_tflops", "hbm_copy_gbps", "h2d_gbps", "d2h_gbps", "nccl_allreduce_busbw_gbps")
_PAIR_METRIC = "nccl_pair_busbw_gbps"
#: Pair measurements kept for the second pod of their pair (a few thousand pairs at once at most).
_PAIRS_KEPT = 8192


def _ts(value: pd.Timestamp | datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _image_driver(image: str) -> str | None:
    """The driver version in a driver image's tag (``…/driver:580.126.20-ubuntu22.04``), or None."""
    reference = image.split("@", 1)[0]
    _name, colon, tag = reference.rpartition(":")
    if not colon or "/" in tag:
        return None  # no tag (the colon was a registry port's)
    match = _DRIVER_TAG.match(tag)
    return match.group(1) if match else None


def _is_driver_pod(pod: Mapping[str, Any]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return any(all(labels.get(k) == v for k, v in known.items()) for known in (_DRIVER_POD, _OPERATOR_DRIVER_POD))


def node_driver(node: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]]) -> str | None:
    """The NVIDIA driver version loaded on ``node`` (its Node object; ``pods``: the pods bound to it).

    Returns the version of the newest running pod of gpucert's (or the GPU Operator's) driver DaemonSet
    there, else the host driver a pre-installed node declares, else None (no driver: NVML would not start).
    """
    running = [
        p
        for p in pods
        if _is_driver_pod(p)
        # Running, not Ready: the simulated driver pod's readiness is only a delay, and a benchmark pod
        # scheduled right after a preconfigured cluster starts must find the driver it was seeded with.
        and phase(p) == "Running"
        and not deleting(p)
    ]
    running.sort(key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
    for pod in reversed(running):
        containers = (pod.get("spec") or {}).get("containers") or ()
        version = _image_driver(str((containers[0] if containers else {}).get("image") or ""))
        label = ((pod.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/version")
        if version or label:
            return version or str(label)
    if node is not None:
        return node_info(node).host_driver or None
    return None


def _cuda_driver(driver: str) -> str | None:
    """The CUDA version ``driver``'s branch supports, per the compatibility matrix; None when unknown."""
    matrix = load_matrix()
    try:
        branch = matrix.drivers.get(matrix.branch_of(driver))
    except ValueError:
        return None
    # NVML reports major.minor; a branch the matrix knows only by its major is not guessed at.
    return branch.cuda if branch is not None and "." in branch.cuda else None


def _stack_of(head: str) -> dict[str, Any]:
    """The stack record a log's head carries (empty when it has none)."""
    for line in head.splitlines():
        if line.startswith(_STACK_PREFIX):
            record = json.loads(line.removeprefix(_STACK_PREFIX))
            return record if isinstance(record, dict) else {}
    return {}


def _row(run_id: str, node: str, metric: str, value: float, ts: datetime) -> dict[str, Any]:
    cells = (run_id, node, None, None, "unknown", metric, value, 0, None, _ts(ts))
    return dict(zip(RESULT_COLUMNS, cells, strict=True))


def rows_jsonl(frame: pd.DataFrame, *, with_errors: bool = True) -> str:
    """A results frame as the payload prints it: one JSON object a line, contract columns in order (the
    text ``json.dumps`` gives each row's dict).

    With ``with_errors``, each ``error`` row is preceded by the stderr line the payload writes for it.
    """
    # Column by column, each value's JSON made once (a wave's names and stamps repeat on every row), then
    # the lines joined: the simulator writes a log of a few hundred rows for every benchmark pod.
    columns = [_json_cells(frame[name], name) for name in RESULT_COLUMNS]
    lines = [_ROW_TEMPLATE % cells for cells in zip(*columns, strict=True)]
    if with_errors:
        metric, gpu = frame["metric"].tolist(), frame["gpu"].tolist()
        errors = [i for i, m in enumerate(metric) if m == "error"]
        for i in reversed(errors):
            where = "node" if _missing(gpu[i]) else f"GPU {gpu[i]}"
            lines.insert(i, f"{_SAY}error: benchmark step on {where}: the device reported a fault")
    return "".join(line + "\n" for line in lines)


#: A result row's line with its cells' JSON put in, as ``json.dumps`` writes the row's dict.
_ROW_TEMPLATE = "{" + ", ".join(f"{json.dumps(name)}: %s" for name in RESULT_COLUMNS) + "}"


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _json_cells(column: pd.Series, name: str) -> list[str]:
    """Each value of ``column`` as JSON (``null`` where missing; ``ts`` as the payload stamps it)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        names = [json.dumps(c) for c in column.cat.categories.tolist()] + ["null"]
        return [names[code] for code in column.cat.codes.tolist()]  # a missing value's code is -1
    missing = column.isna().tolist()
    if name == "value":
        return ["null" if gone else json.dumps(v) for v, gone in zip(column.tolist(), missing, strict=True)]
    texts: dict[Any, str] = {}
    cells = []
    for value, gone in zip(column.tolist(), missing, strict=True):
        if gone:
            cells.append("null")
            continue
        text = texts.get(value)
        if text is None:
            text = texts[value] = json.dumps(_ts(value) if name == "ts" else value)
        cells.append(text)
    return cells


def _args(pod: Mapping[str, Any]) -> list[str]:
    containers = (pod.get("spec") or {}).get("containers") or ()
    return [str(a) for a in ((containers[0] if containers else {}).get("args") or ())]


def payload_repeats(pod: Mapping[str, Any]) -> RepeatRule:
    """The repeat rule of a benchmark pod's payload (``--repeats``, ``--max-repeats``, ``--repeats-of``…);
    the payload's defaults when its arguments do not parse."""
    try:
        return check_args(_args(pod)).rule
    except ArgumentsError:
        return RepeatRule()


def _payload_steps(pod: Mapping[str, Any]) -> tuple[bool, bool]:
    """(NIC telemetry, storage read) of a benchmark pod's payload: the NIC is read unless ``--skip nic``;
    storage is measured when its arguments give ``--storage-path``, unless ``--skip storage``."""
    args = _args(pod)
    storage = any(a == "--storage-path" or a.startswith("--storage-path=") for a in args)
    try:
        skip = check_args(args).skip
    except ArgumentsError:
        skip = frozenset()
    return "nic" not in skip, storage and "storage" not in skip


@dataclass(frozen=True)
class PairPod:
    """One side of a pair benchmark, as its payload's arguments say (see the module docstring)."""

    node: str
    #: the other node of ``--nodes``; None when the pod's node is not one of them
    peer: str | None
    rank: int | None
    master: str
    rule: RepeatRule
    #: why the payload would refuse its arguments (None: they parse)
    refused: str | None = None


def pair_pod(pod: Mapping[str, Any], node: str) -> PairPod | None:
    """The pair side ``pod`` runs on ``node`` when it is a pair benchmark pod (its arguments start with
    ``pair``), else None. ``$(NODE_NAME)`` is the node, the rank its completion index."""
    args = _args(pod)
    if args[:1] != ["pair"]:
        return None
    from gpucert.bench import check_pair_args

    argv = [a.replace("$(NODE_NAME)", node) for a in args[1:]]
    index = pod_index(pod)
    if "--rank" not in argv and index >= 0:
        argv += ["--rank", str(index)]
    if "--node" not in argv:
        argv += ["--node", node]
    try:
        opts = check_pair_args(argv)
    except ArgumentsError as exc:
        return PairPod(node, None, None, "", RepeatRule(), refused=str(exc))
    peer = opts.peer
    if peer is None and opts.nodes is not None and opts.node in opts.nodes:
        peer = opts.nodes[1] if opts.nodes[0] == opts.node else opts.nodes[0]
    master = "" if opts.master is None else f"{opts.master[0]}:{opts.master[1]}"
    return PairPod(opts.node, peer, opts.rank, master, opts.rule)


def benchmark_lines(rows: pd.DataFrame, rule: RepeatRule) -> str:
    """What a benchmark pod prints between its head and its last line: a line for each result measured
    again, then its rows (:func:`rows_jsonl`)."""
    return _extra_repeat_lines(rows, rule) + rows_jsonl(rows)


#: The registry's order of the metrics: the order the payload reports them in.
_METRIC_ORDER = {name: i for i, name in enumerate(METRICS)}


def _extra_repeat_lines(rows: pd.DataFrame, rule: RepeatRule) -> str:
    """The payload's stderr line for each result it measured again because its repeats disagreed, GPU by
    GPU (the node's own results last), metric by metric.

    A loop over the rows rather than a group-by: they are one node's few hundred, and pandas' group-by
    cost 4 ms of setup for each of the simulator's pods."""
    last: dict[tuple[float, int, str], int] = {}  # (GPU or inf, registry position, metric) → last repeat
    gpus, metrics, repeats = rows["gpu"].tolist(), rows["metric"].tolist(), rows["repeat"].tolist()
    for gpu, metric, repeat in zip(gpus, metrics, repeats, strict=True):
        if not _missing(repeat):
            key = (math.inf if _missing(gpu) else gpu, _METRIC_ORDER.get(metric, -1), str(metric))
            last[key] = max(last.get(key, -1), int(repeat))
    lines = []
    for (gpu, _, metric), top in sorted(last.items()):
        where = "node" if gpu == math.inf else f"GPU {int(gpu)}"
        n, base = top + 1, rule.base(metric)
        if n > base:
            lines.append(
                f"{_SAY}{where}: {metric}: repeats disagree: {n - base} more, {n} of at most {rule.ceiling(metric)}"
            )
    return "".join(line + "\n" for line in lines)


class PodLogs:
    """The log text of simulated pods; see the module docstring.

    ``driver`` gives the driver version loaded on a node (None: none), as :func:`node_driver` finds it.
    """

    def __init__(
        self,
        fleet: Callable[[], Fleet],
        faults: GpuFaults,
        *,
        seed: int,
        driver: Callable[[str], str | None],
        label_prefix: str = "gpucert.io",
        node_up: Callable[[str], bool] | None = None,
    ) -> None:
        self._fleet = fleet
        self._faults = faults
        self._seed = seed
        self._driver = driver
        self._node_up = node_up or (lambda node: True)
        self._run_label = f"{label_prefix}/run-id"
        self._pairs: OrderedDict[tuple[Any, ...], list[float] | str] = OrderedDict()

    def run_id(self, pod: Mapping[str, Any]) -> str | None:
        """The run id of a gpucert benchmark pod; None for any other pod."""
        meta = pod.get("metadata") or {}
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        if labels.get(MANAGED_BY[0]) != MANAGED_BY[1]:
            return None
        value = labels.get(self._run_label) or annotations.get(self._run_label)
        return str(value) if value else None

    def started(self, pod: Mapping[str, Any], node: str) -> str:
        """What the container has printed once it started."""
        run_id = self.run_id(pod)
        if run_id is None:
            container = ((pod.get("spec") or {}).get("containers") or [{}])[0]
            return f"simulated container {container.get('name')} ({container.get('image')}) started on {node}\n"
        fleet = self._fleet()
        if node not in fleet.node_index:
            return f"{_SAY}no GPU found on {node}: nothing to benchmark\n"
        driver = self._driver(node)
        stack = self._stack(fleet, node, driver)
        pair = pair_pod(pod, node)
        if pair is not None:
            return self._pair_head(fleet, pair, run_id, stack, driver)
        if driver is None:
            return (
                f"{_STACK_PREFIX}{json.dumps(stack, sort_keys=True)}\n"
                f"{_SAY}run {run_id} on {node}: cuda, model 'unknown', devices none\n"
            )
        devices = ", ".join(f"{i}={u}" for i, u in enumerate(self._uuids(fleet, node)))
        return (
            f"{_STACK_PREFIX}{json.dumps(stack, sort_keys=True)}\n"
            f"{_SAY}run {run_id} on {node}: cuda, model {fleet.model.name!r}, devices {devices}\n"
        )

    def finished(
        self, pod: Mapping[str, Any], node: str, started_at: datetime, exit_code: int, head: str | None = None
    ) -> str:
        """The whole log once the container exited with ``exit_code``; ``head`` is what :meth:`started`
        printed (recomputed when not given, for a pod seeded already running)."""
        head = head or self.started(pod, node)
        run_id = self.run_id(pod)
        if run_id is None:
            return head + f"simulated container exited with code {exit_code}\n"
        fleet = self._fleet()
        if node not in fleet.node_index:
            return head + f"{_SAY}done in 0.0 s: 0 rows, 0 error row(s)\n"
        if not dns_label_ok(run_id):
            return head + f"{_SAY}error: --run-id {run_id!r} is not a DNS label\n"
        took = (datetime.now(UTC) - started_at).total_seconds()
        pair = pair_pod(pod, node)
        if pair is not None:
            body, count, errors = self._pair_body(
                fleet, pair, run_id, started_at.astimezone(UTC), bool(_stack_of(head).get("driver"))
            )
            return head + body + f"{_SAY}pair done in {took:.1f} s: {count} rows, {errors} error row(s)\n"
        if not _stack_of(head).get("driver"):
            # No driver was loaded when the container started: the payload found no GPU.
            body, count, errors = self._driverless(fleet, run_id, node, started_at.astimezone(UTC))
            return head + body + f"{_SAY}done in {took:.1f} s: {count} rows, {errors} error row(s)\n"
        rule = payload_repeats(pod)
        nic, storage = _payload_steps(pod)
        wave = fleet.run(
            run_id,
            ts=started_at.astimezone(UTC),
            seed=self.seed_for(run_id, node),
            nodes=[node],
            faults=self._faults.on_node(node),
            repeats=rule.repeats,
            max_repeats=rule.max_repeats,
            repeats_of=dict(rule.repeats_of),
            nic=nic,
            storage=storage,
            wave_draws=True,
        )  # a seed per (run, node): drawing the whole fleet would be O(N) a pod
        rows = wave.results
        errors = int((rows["metric"] == "error").sum())
        return (
            head
            + benchmark_lines(rows, rule)
            + f"{_SAY}done in {took:.1f} s: {len(rows)} rows, {errors} error row(s)\n"
        )

    def seed_for(self, run_id: str, node: str) -> int:
        """The wave seed of one run on one node: stable across reruns, different between runs and nodes."""
        digest = hashlib.sha256(f"{self._seed}/{run_id}/{node}".encode()).digest()
        return int.from_bytes(digest[:8], "big")

    def pair_seed(self, run_id: str) -> int:
        """The wave seed of a run's pairs: the fleet model keys each pair's noise on it and the pair's two
        node names, so both pods of a pair draw alike and every pair differently."""
        digest = hashlib.sha256(f"{self._seed}/{run_id}/pairs".encode()).digest()
        return int.from_bytes(digest[:8], "big")

    # --- pair pods ------------------------------------------------------------------------------------

    def _pair_head(self, fleet: Fleet, pair: PairPod, run_id: str, stack: Mapping[str, Any], driver: str | None) -> str:
        model = fleet.model.name if driver else "unknown"
        lines = [
            f"{_STACK_PREFIX}{json.dumps(stack, sort_keys=True)}",
            f"{_SAY}pair run {run_id} on {pair.node}: cuda, model {model!r}",
        ]
        if driver and pair.refused is None:
            lines.append(
                f"{_SAY}pair: node rank {pair.rank}, {fleet.gpus_per_node} local rank(s) (nccl); "
                f"rendezvous at {pair.master}"
            )
        return "".join(line + "\n" for line in lines)

    def _pair_body(
        self, fleet: Fleet, pair: PairPod, run_id: str, ts: datetime, has_driver: bool
    ) -> tuple[str, int, int]:
        """The lines after the head of a pair pod that ran: its rows (or its error row), their count and
        the error rows among them."""
        model = fleet.model.name if has_driver else "unknown"
        peer = pair.peer
        if pair.refused is not None:
            failure = f"the pair payload refuses its arguments: {pair.refused}"
        elif not has_driver:
            failure = _NO_CUDA
        elif peer is None:
            failure = f"{pair.node} is not one of the pair's --nodes"
        elif peer not in fleet.node_index or not self._node_up(peer) or self._driver(peer) is None:
            failure = f"the rendezvous with {peer} did not complete: its side never joined"
        else:
            measured = self._pair_measurement(fleet, run_id, pair.node, peer, pair.rule, ts)
            if isinstance(measured, str):
                failure = measured
            else:
                return self._pair_rows(fleet, pair, peer, run_id, ts, measured), len(measured), 0
        row = {**_row(run_id, pair.node, "error", 1.0, ts), "gpu_model": model}
        return f"{_SAY}error: {_PAIR_METRIC} on node: {failure}\n{json.dumps(row)}\n", 1, 1

    def _pair_rows(self, fleet: Fleet, pair: PairPod, peer: str, run_id: str, ts: datetime, values: list[float]) -> str:
        ranks = fleet.gpus_per_node
        lines = [f"{_SAY}pair: met {peer} ({ranks} ranks): {2 * ranks} ranks in all"]
        base = pair.rule.base(_PAIR_METRIC)
        if len(values) > base:
            lines.append(
                f"{_SAY}pair: {_PAIR_METRIC}: repeats disagree: {len(values) - base} more, "
                f"{len(values)} of at most {pair.rule.ceiling(_PAIR_METRIC)}"
            )
        size = 8 << 30
        busbw = sorted(values)[len(values) // 2]
        algbw = busbw * (2 * ranks) / (2 * (2 * ranks - 1))
        lines.append(
            f"{_SAY}pair: {size:>14,} B {size / (algbw * 1e9) * 1e6:12.1f} us  algbw {algbw:10.4g} GB/s  "
            f"busbw {busbw:10.4g} GB/s"
        )
        for repeat, value in enumerate(values):
            cells = (run_id, pair.node, None, None, fleet.model.name, _PAIR_METRIC, value, repeat, peer, _ts(ts))
            lines.append(json.dumps(dict(zip(RESULT_COLUMNS, cells, strict=True))))
        return "".join(line + "\n" for line in lines)

    def _pair_measurement(
        self, fleet: Fleet, run_id: str, node: str, peer: str, rule: RepeatRule, ts: datetime
    ) -> list[float] | str:
        """The pair's busbw per repeat (or why it has none), measured once for both of its pods."""
        lo, hi = sorted((node, peer))
        faults: tuple[Fault, ...] = (*self._faults.on_node(lo), *self._faults.on_node(hi), *self._faults.fabric())
        key = (id(fleet), run_id, lo, hi, rule, faults)
        kept = self._pairs.get(key)
        if kept is not None:
            return kept
        wave = fleet.run(
            run_id,
            ts=ts,
            seed=self.pair_seed(run_id),
            nodes=[lo, hi],
            pairs=[(lo, hi)],
            faults=list(faults),
            repeats=rule.repeats,
            max_repeats=rule.max_repeats,
            repeats_of=dict(rule.repeats_of),
            wave_draws=True,
        )
        rows = wave.results
        metric = rows["metric"].astype(str)
        found = rows[metric == _PAIR_METRIC].sort_values("repeat")
        result: list[float] | str = [float(v) for v in found["value"]]
        if not result:
            died = rows[(metric == "error") & rows["gpu"].isna()]["node"].astype(str).unique().tolist()
            result = f"a rank died on {' and '.join(sorted(died)) or 'a node of the pair'}: the all-reduce failed"
        self._pairs[key] = result
        while len(self._pairs) > _PAIRS_KEPT:
            self._pairs.popitem(last=False)
        return result

    def _uuids(self, fleet: Fleet, node: str) -> list[str]:
        first = fleet.node_index[node] * fleet.gpus_per_node
        return [str(u) for u in fleet.uuids[first : first + fleet.gpus_per_node]]

    def _stack(self, fleet: Fleet, node: str, driver: str | None) -> dict[str, str]:
        record = {
            "node": node,
            "hostname": node,
            "kernel": "5.15.0-119-generic",
            "python": platform.python_version(),
            "gpucert": __version__,
            "gpu_model": fleet.model.name if driver else "unknown",
            **_IMAGE_STACK,
        }
        if driver is None:
            return record  # NVML did not start: no driver, CUDA driver or VBIOS to read
        record["driver"] = driver
        cuda_driver = _cuda_driver(driver)
        if cuda_driver is not None:
            record["cuda_driver"] = cuda_driver
        record.update({f"vbios.{i}": _VBIOS for i in range(fleet.gpus_per_node)})
        return record

    def _driverless(self, fleet: Fleet, run_id: str, node: str, ts: datetime) -> tuple[str, int, int]:
        """The rows (and their stderr lines) of a run on a node without a driver, their count and the
        error rows among them: what the payload's steps write when NVML and CUDA cannot start."""
        lines = [json.dumps(_row(run_id, node, "gpu_count_expected", float(fleet.gpus_per_node), ts))]
        failures = [("telemetry", _NO_NVML), *((metric, _NO_CUDA) for metric in _BENCHMARKS)]
        for step, reason in failures:
            lines.append(f"{_SAY}error: {step} on node: {reason}")
            lines.append(json.dumps(_row(run_id, node, "error", 1.0, ts)))
        return "".join(line + "\n" for line in lines), 1 + len(failures), len(failures)
