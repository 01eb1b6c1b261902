"""The benchmark units' Kubernetes objects and their payload ConfigMap, rendered from ``templates/certify/``
(docs/design/certify-runbook.md, "Benchmark Jobs" and "Pair benchmarks").

A node is one Job on all its GPUs; a pair is one Indexed Job of two pods and the headless Service of their
rendezvous. The payload travels in a ConfigMap so that a stock PyTorch image serves: no image of gpucert's own
to build, publish and keep in step with the code. A template gets data computed here, and what comes back is
parsed by the strict loader of :func:`gpucert.stack.load_manifests`, so a node name read from the cluster
cannot add a key or a document to a manifest.

Names (:func:`job_name`, :func:`pair_name`) are readable DNS labels ending in a hash of what they name. The
payload ConfigMap is ``gpucert-payload-<hash of the files>``: a new payload is a new immutable object, so a
running Job never sees its files change (old ones are not deleted yet; ~90 kB each).

The node goes in the label ``<prefix>/node`` when it is a valid label value (label values stop at 63
characters, node names at 253), and always in the annotation of the same name. A pair Job names both nodes in
its annotation ``<prefix>/pair``; its label ``<prefix>/pair-job`` is what the Service and the pods'
anti-affinity select. The Service is made the Job's (:func:`owned_by`, after the Job is created: it needs the
uid), so it goes with the Job; node rank 1 retries the rendezvous until the name resolves.

Payload arguments are checked by the payload's own parser, strictly, when the settings are made and again on
the whole command line when a Job is rendered, so a typo fails as a :class:`PayloadArgsError` before any Job
exists. Each ``$`` is written ``$$``: the kubelet expands ``$(VAR)`` in a container's arguments.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jinja2

from .._names import check_run_id
from .._templates import yaml_environment
from ..errors import JobRenderError, PayloadArgsError
from ..kube import Kube, KubeConflict
from ..policy import Policy
from ..stack import (
    STACK_NAMESPACE,
    StackRenderError,
    check_label_prefix,
    dns_label_ok,
    dns_subdomain_ok,
    label_value_ok,
    load_manifests,
)
from ._names import COMMON_LABELS, DEFAULT_LABEL_PREFIX

#: NVIDIA's PyTorch container: a tested torch + CUDA + NCCL build for every data-centre GPU gpucert
#: certifies (Hopper, Blackwell), with ``python`` on the PATH and pynvml installed (it ships RAPIDS,
#: which depends on it), so the NVML telemetry runs as well as the benchmarks. The plain
#: ``pytorch/pytorch`` images have no pynvml: telemetry would be ``error`` rows there.
DEFAULT_IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"
#: gpucert's own namespace: where configure creates the namespace and grants the runtime role Jobs and
#: ConfigMaps (``templates/stack/rbac.yaml.j2``); a Job elsewhere would need more rights.
JOBS_NAMESPACE = STACK_NAMESPACE
#: Where the payload is mounted in the container (and what ``PYTHONPATH`` names).
PAYLOAD_DIR = "/opt/gpucert"
JOB_TEMPLATE = "certify/benchmark-job.yaml.j2"
PAYLOAD_TEMPLATE = "certify/payload-configmap.yaml.j2"
PAIR_JOB_TEMPLATE = "certify/pair-job.yaml.j2"
PAIR_SERVICE_TEMPLATE = "certify/pair-service.yaml.j2"
#: The rendezvous port (torch.distributed's customary one): node rank 0's payload listens on it.
PAIR_PORT = 29500

_KEY_WORD = re.compile(r"[-_a-zA-Z0-9]+")
_QUANTITY = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
#: A ConfigMap's data may hold at most 1 MiB (the API server refuses more).
_CONFIGMAP_LIMIT = 1 << 20
#: The payload flags a Job sets itself: ``payload_args`` (a pair Job's ``pair_args``) may not set them again.
#: The policy's have their one home there (metrics.<name>.cv_rep and .repeats, repeats.unstable_factor and
#: .transient_pct).
_POLICY_FLAGS = ("--cv-rep", "--repeats-of", "--unstable-factor", "--transient-pct")
_JOB_FLAGS = ("--run-id", "--node", "--repeats", "--deadline-seconds", *_POLICY_FLAGS)
_OWN_FLAGS = (*_JOB_FLAGS, "--expected-gpus")
_PAIR_OWN_FLAGS = (*_JOB_FLAGS, "--nodes", "--peer", "--rank", "--master", "--nccl-tests", "--mpi-hosts")
#: Of a Job's deadline, what image pull and scheduling may take before the payload starts.
_START_ALLOWANCE_S = 300
#: What the Job's own flags are checked with when ``payload_args`` are checked alone.
_CHECK_PREFIX = ("--run-id", "check", "--node", "check", "--repeats", "1", "--expected-gpus", "1")
_HASH = 8
#: ``<job>-<index>`` is each pair pod's hostname, a DNS label: 63 characters less ``-0``/``-1``.
_MAX_PAIR_NAME = 61


def policy_payload_args(policy: Policy) -> tuple[str, ...]:
    """The payload flags that carry ``policy``'s repeat rule where it differs from the payload's own defaults
    (which are the shipped policy's): expected CVs, per-metric repeats, the instability knobs."""
    from ..bench import DEFAULT_CV_REP, DEFAULT_REPEATS_OF, DEFAULT_TRANSIENT_PCT, DEFAULT_UNSTABLE_FACTOR

    args: list[str] = []
    for name, metric in sorted(policy.metrics.items()):
        if DEFAULT_CV_REP.get(name) != metric.cv_rep:
            args += ["--cv-rep", f"{name}={metric.cv_rep:g}"]
        if DEFAULT_REPEATS_OF.get(name) != metric.repeats:
            # No repeats of its own: as many as every metric gets (1 never raises a run's --repeats).
            args += ["--repeats-of", f"{name}={metric.repeats or 1}"]
    if policy.repeats.unstable_factor != DEFAULT_UNSTABLE_FACTOR:
        args += ["--unstable-factor", f"{policy.repeats.unstable_factor:g}"]
    if policy.repeats.transient_pct != DEFAULT_TRANSIENT_PCT:
        args += ["--transient-pct", f"{policy.repeats.transient_pct:g}"]
    return tuple(args)


def check_payload_args(
    args: Sequence[str], *, prefix: Sequence[str] = _CHECK_PREFIX, pair: bool = False
) -> tuple[str, ...]:
    """``args`` as a tuple when the payload's parser (the pair payload's, for ``pair``) takes ``prefix`` +
    ``args`` strictly (no abbreviation, no ``--help``) and none of ``args`` sets a flag the Job sets; raises
    :class:`PayloadArgsError` naming them."""
    from ..bench import ArgumentsError, check_args, check_pair_args

    field, job = ("pair_args", "the pair Job") if pair else ("payload_args", "the Job")
    if isinstance(args, str) or not all(isinstance(arg, str) for arg in args):
        raise PayloadArgsError(f"{field} must be a sequence of strings, not {args!r}")
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in (_PAIR_OWN_FLAGS if pair else _OWN_FLAGS):
            raise PayloadArgsError(f"{field} may not set {flag}: {job} sets it")
    try:
        (check_pair_args if pair else check_args)([*prefix, *args])
    except ArgumentsError as exc:
        payload = "the pair payload" if pair else "the payload"
        raise PayloadArgsError(f"{field} {list(args)!r}: {payload} refuses them: {exc}") from None
    return tuple(args)


def _kubelet_literal(arg: str) -> str:
    """``arg`` as a container argument the kubelet passes on unchanged: ``$$`` is its escape for ``$``."""
    return arg.replace("$", "$$")


#: Where the storage benchmark's volume is mounted in the pod (a folder per node under it).
STORAGE_MOUNT = "/gpucert-storage"
_HOST_PATH = re.compile(r"/[A-Za-z0-9._/-]*")


@dataclass(frozen=True)
class BenchmarkSettings:
    """How benchmark Jobs are made; every field has a default fit for an 8-GPU node.

    Raises ``ValueError`` on construction for a value Kubernetes or the payload would refuse.
    """

    #: The namespace of the Jobs and the payload ConfigMaps.
    namespace: str = JOBS_NAMESPACE
    #: Any image with ``python`` and torch (pynvml too, for telemetry); see :data:`DEFAULT_IMAGE`.
    image: str = DEFAULT_IMAGE
    label_prefix: str = DEFAULT_LABEL_PREFIX
    #: ``--repeats`` of the payload.
    repeats: int = 3
    #: The policy's repeat rule as payload flags (:func:`policy_payload_args`): what the payload's
    #: defaults do not already say.
    policy_args: tuple[str, ...] = ()
    #: The Job's ``activeDeadlineSeconds``: image pull (an NGC image is ~10 GB), scheduling and a full
    #: run of 8 GPUs (about 2 minutes each, then the all-reduce) with room to spare.
    deadline_s: int = 3600
    #: ``ttlSecondsAfterFinished``: a day to read a finished Job's pod and log by hand.
    ttl_s: int = 86400
    #: A low PriorityClass for the pods; None leaves it out (the cluster's default priority).
    priority_class: str | None = None
    #: More payload arguments (``--gemm-seconds=5``, ``--skip=copy``, ``--dcgm-level=2``,
    #: ``--nccl-tests-args=-d bfloat16``…), after the ones set here; checked (see the module docstring).
    payload_args: tuple[str, ...] = ()
    #: CPU and memory requested: enough for one process per GPU in the all-reduce, and a request at all
    #: keeps the pod out of the BestEffort class, the first evicted under node pressure.
    cpu_request: str = "4"
    memory_request: str = "16Gi"
    #: Size of the memory-backed /dev/shm.
    shm_size: str = "16Gi"
    #: Extra annotations on every benchmark pod (``sim.gpucert.io/…`` shapes a simulated pod).
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    #: Where ``storage_read_gbps`` is measured: a PersistentVolumeClaim of the namespace (the dataset's
    #: file system, shared) or a host path (a node's local NVMe), mounted read-write at
    #: :data:`STORAGE_MOUNT` with a folder per node (``subPathExpr``); at most one. None: not measured.
    storage_claim: str | None = None
    storage_host_path: str | None = None
    #: Whether a node under test carries ``<prefix>/testing=<run id>:NoSchedule`` while its Job runs. Off
    #: under an observe-only policy, whose promise is that gpucert taints nothing: the benchmark pods still
    #: hold every GPU of the node, so no GPU workload lands there mid-benchmark; a CPU-only pod may.
    taint_under_test: bool = True

    def __post_init__(self) -> None:
        if not dns_label_ok(self.namespace):
            raise ValueError(f"namespace {self.namespace!r} is not a DNS label")
        if not self.image or any(c.isspace() for c in self.image):
            raise ValueError(f"image {self.image!r} is not an image reference")
        check_label_prefix(self.label_prefix)
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, not {self.repeats}")
        if self.deadline_s < 1:
            raise ValueError(f"deadline_s must be at least 1 second, not {self.deadline_s}")
        if self.ttl_s < 0:
            raise ValueError(f"ttl_s must be 0 or more, not {self.ttl_s}")
        if self.priority_class is not None and (not dns_subdomain_ok(self.priority_class)):
            raise ValueError(f"priority class {self.priority_class!r} is not a DNS subdomain")
        if self.storage_claim is not None and self.storage_host_path is not None:
            raise ValueError("storage: a claim or a host path, not both")
        if self.storage_claim is not None and not dns_subdomain_ok(self.storage_claim):
            raise ValueError(f"storage claim {self.storage_claim!r} is not a DNS subdomain")
        host = self.storage_host_path
        if host is not None and (not _HOST_PATH.fullmatch(host) or ".." in host.split("/")):
            raise ValueError(
                f"storage host path {self.storage_host_path!r}: an absolute path without '..' and of plain characters"
            )
        # A list (a flow parameter read from JSON) is kept as a tuple: the settings stay hashable.
        object.__setattr__(self, "payload_args", check_payload_args(self.payload_args))
        for name in ("cpu_request", "memory_request", "shm_size"):
            if not _QUANTITY.fullmatch(getattr(self, name)):
                raise ValueError(f"{name} {getattr(self, name)!r} is not a Kubernetes quantity")


# --- names and labels -----------------------------------------------------------------------------------


def job_name(run_id: str, node: str) -> str:
    """The benchmark Job's name for ``run_id`` on ``node``: a DNS label of at most 63 characters (the Job
    controller copies it into its pods' ``job-name`` label). Raises ``ValueError`` when ``run_id`` is not a DNS
    label or ``node`` is empty."""
    check_run_id(run_id)
    if not node:
        raise ValueError("node name is empty")
    return _hashed_name(f"{run_id}-{node}", f"{run_id}\n{node}", 63)


def _hashed_name(readable: str, key: str, limit: int) -> str:
    """``readable`` as ``a-z0-9-``, cut to fit ``limit`` characters with ``-`` and 8 hex digits of a hash of
    ``key``: the same key always gives the same name, any other key another, however the texts line up
    (``a-b`` + ``c`` against ``a`` + ``b-c``) or get cut."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:_HASH]
    head = re.sub(r"[^a-z0-9-]+", "-", readable.lower())[: limit - 1 - _HASH].rstrip("-")
    return f"{head}-{digest}"


def _pair(node_a: str, node_b: str) -> tuple[str, str]:
    """The pair's two nodes in sorted order; ``ValueError`` for a name that is no node's or a node twice."""
    for node in (node_a, node_b):
        # Kubernetes node names are DNS subdomains; the results contract holds node and peer to it too.
        if not isinstance(node, str) or not dns_subdomain_ok(node):
            raise ValueError(f"node name {node!r} is not a DNS subdomain")
    if node_a == node_b:
        raise ValueError(f"a pair is two nodes, not {node_a} twice")
    a, b = sorted((node_a, node_b))
    return a, b


def pair_name(run_id: str, node_a: str, node_b: str) -> str:
    """The pair's Job and Service name: a DNS label of at most 61 characters that starts with a letter, as a
    Service name must. Raises ``ValueError`` for a bad run id or node names (see :func:`pair_job`)."""
    check_run_id(run_id)
    a, b = _pair(node_a, node_b)
    return _hashed_name(f"pair-{run_id}-{a}-{b}", f"pair\n{run_id}\n{a}\n{b}", _MAX_PAIR_NAME)


# --- the payload ConfigMap ------------------------------------------------------------------------------


def payload_key(path: str) -> str:
    """The ConfigMap key of a payload file: its path with ``/`` as ``.`` (``gpucert.bench._cli.py``).

    Reversible (:func:`payload_path`) because a payload path is held to directories and a file stem
    without dots and one suffix. Raises ``ValueError`` for a path that breaks that or holds characters
    other than ``-_a-zA-Z0-9`` besides.
    """
    parts = path.split("/")
    stem, dot, suffix = parts[-1].partition(".")
    words = [*parts[:-1], stem, suffix]
    if not dot or not all(_KEY_WORD.fullmatch(w) for w in words) or len(path) > 253:
        raise ValueError(
            f"payload file {path!r} cannot be a ConfigMap key (directories and a file name of -_a-zA-Z0-9, one suffix)"
        )
    return path.replace("/", ".")


def payload_path(key: str) -> str:
    """The file path a ConfigMap key of the payload stands for (the inverse of :func:`payload_key`).

    Raises ``ValueError`` for a key :func:`payload_key` cannot have made.
    """
    head, dot, suffix = key.rpartition(".")
    path = f"{head.replace('.', '/')}.{suffix}"
    with contextlib.suppress(ValueError):
        if dot and payload_key(path) == key:
            return path
    raise ValueError(f"{key!r} is not a payload ConfigMap key")


def _payload(files: Mapping[str, str] | None) -> dict[str, str]:
    if files is None:
        from ..bench import payload_files

        files = payload_files()
    if not files:
        raise ValueError("the payload has no files")
    return {path: files[path] for path in sorted(files)}


def payload_items(configmap: Mapping[str, Any]) -> list[dict[str, str]]:
    """The volume's ``items`` for a payload ConfigMap: each key of its ``data`` → the file's path under
    the mount, in key order. Raises ``ValueError`` for a key that is no payload file's, or no data."""
    data = configmap.get("data") or {}
    if not data:
        raise ValueError(f"ConfigMap {(configmap.get('metadata') or {}).get('name')!r} carries no payload")
    return [{"key": key, "path": payload_path(key)} for key in sorted(data)]


def _payload_digest(files: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for path, text in files.items():
        for part in (path, text):
            data = part.encode("utf-8")
            h.update(len(data).to_bytes(8, "big"))  # lengths first: no two file sets hash alike by splicing
            h.update(data)
    return h.hexdigest()


def payload_configmap(
    settings: BenchmarkSettings | None = None, files: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The ConfigMap carrying the payload: ``gpucert-payload-<10 hex digits of the files' hash>``.

    ``files`` (path → text) defaults to :func:`gpucert.bench.payload_files`; the full hash is in the
    annotation ``<prefix>/payload-sha256``. Returns the object as a dict. Raises ``ValueError`` when a
    path cannot be a key or the files exceed a ConfigMap's 1 MiB, and :class:`JobRenderError` when the
    template does not render into one ConfigMap.
    """
    s = settings or BenchmarkSettings()
    chosen = _payload(files)
    data = {payload_key(path): text for path, text in chosen.items()}
    size = sum(len(text.encode("utf-8")) + len(key) for key, text in data.items())
    if size > _CONFIGMAP_LIMIT:
        raise ValueError(f"the payload is {size:,} bytes: more than a ConfigMap holds (1 MiB)")
    digest = _payload_digest(chosen)
    context = {
        "name": f"gpucert-payload-{digest[:10]}",
        "namespace": s.namespace,
        "labels": dict(COMMON_LABELS),
        "annotations": {f"{s.label_prefix}/payload-sha256": digest},
        "data": data,
    }
    return _render_one(PAYLOAD_TEMPLATE, {"cm": context}, "ConfigMap")


def ensure_payload(kube: Kube, configmap: Mapping[str, Any]) -> dict[str, Any]:
    """Create the payload ConfigMap, or take the one already there (its name is its content's hash, so
    another run's is the same). Returns the object as stored. Raises :class:`~gpucert.kube.KubeConflict`
    when a ConfigMap of that name holds other files, and any other :class:`~gpucert.kube.KubeError` from
    the API."""
    try:
        return kube.create(configmap)
    except KubeConflict:
        meta = configmap["metadata"]
        stored = kube.get("v1", "ConfigMap", meta["name"], meta.get("namespace"))
        if (stored.get("data") or {}) != (configmap.get("data") or {}):
            raise KubeConflict(
                f"ConfigMap {meta.get('namespace')}/{meta['name']} exists with other files: it was not made "
                "by payload_configmap, or was edited",
                status=409,
            ) from None
        return stored


# --- the Job --------------------------------------------------------------------------------------------


def _node_term(node: str) -> dict[str, Any]:
    # matchFields on metadata.name: see the template's notes (why not nodeName, why not the hostname label).
    return {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}


def _affinity(node: str) -> dict[str, Any]:
    terms = [_node_term(node)]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def _tolerations(label_prefix: str) -> list[dict[str, str]]:
    return [
        {"key": f"{label_prefix}/uncertified", "operator": "Exists", "effect": "NoSchedule"},
        {"key": f"{label_prefix}/unhealthy", "operator": "Exists", "effect": "NoSchedule"},
        # The taint of a node under test (its run's Lease held): only the benchmark lands there.
        {"key": f"{label_prefix}/testing", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]


def benchmark_job(
    run_id: str, node: str, gpus: int, *, payload: Mapping[str, Any], settings: BenchmarkSettings | None = None
) -> dict[str, Any]:
    """The benchmark Job of ``run_id`` on ``node``, requesting ``gpus`` (all the node's GPUs), as a dict;
    ``payload`` is the payload ConfigMap (:func:`payload_configmap`, or as read back), mounted as the package tree.

    Raises ``ValueError`` for a bad run id, an empty node, fewer than 1 GPU or a ConfigMap that is not a
    payload's, :class:`PayloadArgsError` when the payload's parser refuses the whole command line, and
    :class:`JobRenderError` when the template does not render into one Job.
    """
    s = settings or BenchmarkSettings()
    name = job_name(run_id, node)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"a benchmark Job requests at least 1 GPU, not {gpus!r}")
    payload_name, items = _payload_ref(payload)
    node_annotation = {f"{s.label_prefix}/node": node}
    labels = {**COMMON_LABELS, f"{s.label_prefix}/run-id": run_id}
    if label_value_ok(node):  # node names run to 253 characters, label values stop at 63
        labels.update(node_annotation)
    # $(NODE_NAME) is expanded by the kubelet from the downward API: the node the pod ran on. Extra repeats (to
    # settle disagreeing ones) start only if they fit before the Job's own deadline, less image pull and scheduling.
    own = ["--run-id", run_id, "--node", "$(NODE_NAME)", "--repeats", str(s.repeats), "--expected-gpus", str(gpus)]
    own += ["--deadline-seconds", _payload_deadline(s), *s.policy_args]
    own += ["--storage-path", STORAGE_MOUNT] if _storage_volume(s) else []
    # The whole command line, as the payload will parse it: a typo fails here, before any Job exists.
    payload_args = check_payload_args(s.payload_args, prefix=own)
    args = [*own, *(_kubelet_literal(arg) for arg in payload_args)]
    context = {
        **_pod_context(s, name, labels, node_annotation, gpus, payload_name, items, args),
        "affinity": _affinity(node),
        "storage": _storage_volume(s),
        "storage_mount": STORAGE_MOUNT,
    }
    return _render_one(JOB_TEMPLATE, {"job": context}, "Job")


# --- the pair Job and its Service -----------------------------------------------------------------------


@dataclass(frozen=True)
class PairJob:
    """The two objects of one pair benchmark: create ``job``, then ``owned_by(service, the created job)``."""

    job: dict[str, Any]
    service: dict[str, Any]
    #: the rendezvous, ``<job>-0.<service>.<namespace>.svc:<port>``
    master: str

    @property
    def name(self) -> str:
        return str(self.job["metadata"]["name"])

    @property
    def nodes(self) -> tuple[str, str]:
        terms = self.job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        # One single-value term per node (see _pair_affinity); a Job of the older form, one term naming both
        # (only a simulated cluster ever took it), is read too.
        a, b = sorted(str(v) for term in terms for req in term["matchFields"] for v in req["values"])
        return a, b


def _pair_affinity(nodes: tuple[str, str], selector: Mapping[str, str]) -> dict[str, Any]:
    # One term per node (terms are ORed): the API server refuses a `metadata.name` matchFields requirement
    # with more than one value (422, "must be only one value when `operator` is 'In' or 'NotIn' for node
    # field selector"), so `In [a, b]` in one term is no Job a real cluster accepts.
    terms = [_node_term(node) for node in nodes]
    apart = {"labelSelector": {"matchLabels": dict(selector)}, "topologyKey": "kubernetes.io/hostname"}
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [apart]},
    }


def pair_job(
    run_id: str,
    node_a: str,
    node_b: str,
    gpus: int,
    *,
    payload: Mapping[str, Any],
    settings: BenchmarkSettings | None = None,
    pair_args: Sequence[str] = (),
    port: int = PAIR_PORT,
) -> PairJob:
    """The pair benchmark of ``node_a`` and ``node_b`` in ``run_id``: its Job and headless Service.

    Each pod requests ``gpus`` (all of a node's: the two nodes of a pair have as many) and runs the pair payload
    with the settings' policy flags and ``pair_args`` (``settings.payload_args`` are the node benchmark's). The
    Job carries what the node's does, but the pair's annotation and selector label instead of the node's. Raises
    ``ValueError`` for a bad run id, node names that are not DNS subdomains or the same node twice, fewer
    than 1 GPU, a bad port or a ConfigMap that is not a payload's, :class:`PayloadArgsError` for arguments
    the payload refuses, and :class:`JobRenderError` when a template does not render into its one object.
    """
    s = settings or BenchmarkSettings()
    name = pair_name(run_id, node_a, node_b)
    nodes = _pair(node_a, node_b)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"a pair Job requests at least 1 GPU per node, not {gpus!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"{port!r} is not a TCP port")
    payload_name, items = _payload_ref(payload)
    selector = {f"{s.label_prefix}/pair-job": name}
    labels = {**COMMON_LABELS, f"{s.label_prefix}/run-id": run_id, **selector}
    annotations = {f"{s.label_prefix}/pair": ",".join(nodes)}
    master = f"{name}-0.{name}.{s.namespace}.svc:{port}"
    # $(NODE_NAME): the node this pod was bound to, from the downward API (either of the two). No --rank: the
    # payload takes $JOB_COMPLETION_INDEX, which the Job controller gives each pod.
    own = ["pair", "--run-id", run_id, "--node", "$(NODE_NAME)", "--nodes", *nodes, "--master", master]
    own += ["--repeats", str(s.repeats), "--deadline-seconds", _payload_deadline(s), *s.policy_args]
    # Checked as the payload will parse it, with the rank each pod takes from $JOB_COMPLETION_INDEX.
    extra = check_payload_args(pair_args, prefix=[*own[1:], "--rank", "0"], pair=True)
    # The Job's own arguments hold no `$` but $(NODE_NAME) (run ids and node names are DNS names); the
    # extra ones reach the payload as written.
    args = [*own, *(_kubelet_literal(arg) for arg in extra)]
    svc = {"name": name, "namespace": s.namespace, "labels": labels, "annotations": annotations, "port": port}
    service = _render_one(PAIR_SERVICE_TEMPLATE, {"svc": {**svc, "selector": selector}}, "Service")
    context = {
        **_pod_context(s, name, labels, annotations, gpus, payload_name, items, args),
        "subdomain": name,
        "affinity": _pair_affinity(nodes, selector),
        "port": port,
    }
    job = _render_one(PAIR_JOB_TEMPLATE, {"job": context}, "Job")
    return PairJob(job=job, service=service, master=master)


def owned_by(service: Mapping[str, Any], job: Mapping[str, Any]) -> dict[str, Any]:
    """``service`` with an ownerReference to ``job`` as created (it needs the Job's uid), so the garbage
    collector deletes the Service with the Job. Raises ``ValueError`` for a Job without a uid."""
    meta = job.get("metadata") or {}
    uid = meta.get("uid")
    if not uid:
        raise ValueError(f"Job {meta.get('name')!r} has no uid: pass the Job as the API server returned it")
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": meta["name"],
        "uid": uid,
        "controller": False,
        "blockOwnerDeletion": False,
    }
    return {**service, "metadata": {**service["metadata"], "ownerReferences": [owner]}}


def _payload_ref(payload: Mapping[str, Any]) -> tuple[str, list[dict[str, str]]]:
    """The payload ConfigMap's name and its volume's items; ``ValueError`` for one that is not a payload's."""
    payload_name = str((payload.get("metadata") or {}).get("name") or "")
    if not dns_subdomain_ok(payload_name):
        raise ValueError(f"payload ConfigMap name {payload_name!r} is not a DNS subdomain")
    return payload_name, payload_items(payload)


def _payload_deadline(s: BenchmarkSettings) -> str:
    """The payload's ``--deadline-seconds``: the Job's deadline less image pull and scheduling."""
    return str(max(60, s.deadline_s - _START_ALLOWANCE_S))


def _pod_context(
    s: BenchmarkSettings,
    name: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    gpus: int,
    payload_name: str,
    items: list[dict[str, str]],
    args: list[str],
) -> dict[str, Any]:
    """What a node's and a pair's Job template get alike: names, the pod's deadline, TTL and priority, its
    tolerations, image, arguments, resources (``gpus`` a pod) and the payload volume."""
    return {
        "name": name,
        "namespace": s.namespace,
        "labels": dict(labels),
        "annotations": dict(annotations),
        "pod_annotations": {**annotations, **s.pod_annotations},
        "deadline_s": s.deadline_s,
        "ttl_s": s.ttl_s,
        "priority_class": s.priority_class,
        "tolerations": _tolerations(s.label_prefix),
        "image": s.image,
        "args": args,
        "resources": {
            # Extended resources go in limits (requests follow); a string, as the API server returns it.
            "limits": {"nvidia.com/gpu": str(gpus)},
            "requests": {"cpu": s.cpu_request, "memory": s.memory_request, "nvidia.com/gpu": str(gpus)},
        },
        "payload": payload_name,
        "payload_items": items,
        "payload_dir": PAYLOAD_DIR,
        "shm_size": s.shm_size,
    }


def _storage_volume(s: BenchmarkSettings) -> dict[str, Any] | None:
    """The pod volume of the storage benchmark's location, None when none is configured."""
    if s.storage_claim is not None:
        return {"name": "storage", "persistentVolumeClaim": {"claimName": s.storage_claim}}
    if s.storage_host_path is not None:
        return {"name": "storage", "hostPath": {"path": s.storage_host_path, "type": "DirectoryOrCreate"}}
    return None


# --- rendering ------------------------------------------------------------------------------------------


def _render_one(template: str, context: Mapping[str, Any], kind: str) -> dict[str, Any]:
    try:
        text = yaml_environment().get_template(template).render(**context)
        objects: Sequence[dict[str, Any]] = load_manifests(text, template)
    except jinja2.TemplateError as exc:
        raise JobRenderError(f"{template}: {exc}") from None
    except StackRenderError as exc:
        raise JobRenderError(str(exc)) from None
    except (TypeError, ValueError) as exc:
        # yaml_value could not serialise a value (not plain data, or NaN): a renderer bug.
        raise JobRenderError(f"{template}: a value cannot be written into a manifest: {exc}") from None
    if len(objects) != 1 or objects[0].get("kind") != kind:
        raise JobRenderError(f"{template}: rendered {len(objects)} object(s), not one {kind}")
    return objects[0]
