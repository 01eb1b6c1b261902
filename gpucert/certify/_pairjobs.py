"""The pair benchmark: a two-node all-reduce as an Indexed Job and a headless Service, no operator needed.

A pair of nodes is measured by one Job of two pods (``templates/certify/pair-job.yaml.j2``), one on each
node, each with all its node's GPUs, running ``python -m gpucert.bench pair`` (:mod:`gpucert.bench._paircli`):
pod 0 serves the rendezvous, pod 1 reaches it at ``<job>-0.<service>.<namespace>.svc`` through the
headless Service (``templates/certify/pair-service.yaml.j2``), and the two run one all-reduce over every
GPU of both nodes. Each pod's log holds ``nccl_pair_busbw_gbps`` rows for the node it ran on, ``peer`` the
other, and is read with the same reader as a benchmark pod's (:func:`gpucert.certify.parse_pod_log`, with
the node the pod was bound to).

Names
-----
:func:`pair_name` — ``pair-<run id>-<node>-<node>`` (the two nodes in sorted order, so a pair is one Job
whichever way round it is asked for), cut to fit and ending in a hash of the run id and both nodes, like
:func:`gpucert.certify.job_name`: the same run and pair always give the same name, so a run started again
adopts its Job, and any other pair or run gets another. The Job and its Service share it. At most 61
characters: an Indexed Job's pods are named ``<job>-<index>`` as hostnames, which stop at 63; and it starts
with a letter, as a Service name must.

Objects
-------
The Job carries what the benchmark Job does (labels, tolerations, deadline, TTL, no service account
token; see :func:`gpucert.certify.benchmark_job`) but not the ``<prefix>/node`` label or annotation: it
is on two nodes. The annotation ``<prefix>/pair`` names both (``node-a,node-b``) and the label
``<prefix>/pair-job`` (the name) is what the Service and the pod anti-affinity select. Create the Job, then
its Service made the Job's with :func:`owned_by` (it needs the Job's uid), so that the Service goes when the
Job's TTL deletes the Job; the order costs nothing, since node rank 1 retries the rendezvous until its
name resolves.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._names import check_run_id
from ..stack import dns_subdomain_ok
from ._jobs import (
    _HASH,
    _START_ALLOWANCE_S,
    PAYLOAD_DIR,
    BenchmarkSettings,
    _kubelet_literal,
    _render_one,
    _tolerations,
    checked_args,
    payload_items,
)
from ._names import COMMON_LABELS

__all__ = [
    "PAIR_JOB_TEMPLATE",
    "PAIR_PORT",
    "PAIR_SERVICE_TEMPLATE",
    "PairJob",
    "check_pair_payload_args",
    "owned_by",
    "pair_job",
    "pair_name",
]

PAIR_JOB_TEMPLATE = "certify/pair-job.yaml.j2"
PAIR_SERVICE_TEMPLATE = "certify/pair-service.yaml.j2"
#: The rendezvous port (torch.distributed's customary one): node rank 0's payload listens on it.
PAIR_PORT = 29500
#: ``<job>-<index>`` is each pod's hostname, a DNS label: 63 characters less ``-0``/``-1``.
_MAX_NAME = 61
#: The pair flags this module sets itself; ``pair_args`` may not set them again.
_OWN_FLAGS = (
    "--run-id", "--node", "--nodes", "--peer", "--rank", "--master", "--repeats", "--deadline-seconds",
    "--cv-rep", "--repeats-of", "--unstable-factor", "--transient-pct", "--nccl-tests", "--mpi-hosts",
)  # fmt: skip
_CHECK_PREFIX = ("--run-id", "check", "--node", "a", "--rank", "0", "--master", "host:1")


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
        # One single-value term per node (see _affinity); a Job of the older form, one term naming both
        # (only a simulated cluster ever took it), is read too.
        a, b = sorted(str(v) for term in terms for req in term["matchFields"] for v in req["values"])
        return a, b


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
    """The pair's Job and Service name (see the module docstring): a DNS label of at most 61 characters
    that starts with a letter. Raises ``ValueError`` for a bad run id or node names (see :func:`pair_job`)."""
    check_run_id(run_id)
    a, b = _pair(node_a, node_b)
    digest = hashlib.sha256(f"pair\n{run_id}\n{a}\n{b}".encode()).hexdigest()[:_HASH]
    readable = re.sub(r"[^a-z0-9-]+", "-", f"pair-{run_id}-{a}-{b}".lower())
    head = readable[: _MAX_NAME - 1 - _HASH].rstrip("-")
    return f"{head}-{digest}"


def check_pair_payload_args(args: Sequence[str], *, prefix: Sequence[str] = _CHECK_PREFIX) -> tuple[str, ...]:
    """``args`` as a tuple when the pair payload's parser takes ``prefix`` + ``args`` strictly and none of
    ``args`` sets a flag the Job sets; raises :class:`~gpucert.certify._jobs.PayloadArgsError`."""
    from ..bench._paircli import check_pair_args

    return checked_args(args, field="pair_args", job="the pair Job", payload="the pair payload",
                        own_flags=_OWN_FLAGS, check=check_pair_args, prefix=prefix)  # fmt: skip


def _affinity(nodes: tuple[str, str], selector: Mapping[str, str]) -> dict[str, Any]:
    # One term per node (terms are ORed): the API server refuses a `metadata.name` matchFields requirement
    # with more than one value (422, "must be only one value when `operator` is 'In' or 'NotIn' for node
    # field selector"), so `In [a, b]` in one term is no Job a real cluster accepts.
    terms = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]} for node in nodes]
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

    Each pod requests ``gpus`` (all of a node's: the two nodes of a pair have as many) and runs ``python -m
    gpucert.bench pair --run-id RUN --node $(NODE_NAME) --nodes A B --master <job>-0.<svc>.<ns>.svc:PORT
    --repeats N --deadline-seconds D`` plus the settings' policy flags and ``pair_args`` (checked with the
    pair payload's own parser); ``settings.payload_args`` are the node benchmark's and do not apply. Returns
    a :class:`PairJob`. Raises ``ValueError`` for a bad run id, node names that are not DNS subdomains or
    the same node twice, fewer than 1 GPU, a bad port or a ConfigMap that is not a payload's,
    :class:`~gpucert.certify._jobs.PayloadArgsError` for arguments the payload refuses, and
    :class:`~gpucert.certify._jobs.JobRenderError` when a template does not render into its one object.
    """
    s = settings or BenchmarkSettings()
    name = pair_name(run_id, node_a, node_b)
    nodes = _pair(node_a, node_b)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"a pair Job requests at least 1 GPU per node, not {gpus!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"{port!r} is not a TCP port")
    payload_name = str((payload.get("metadata") or {}).get("name") or "")
    if not dns_subdomain_ok(payload_name):
        raise ValueError(f"payload ConfigMap name {payload_name!r} is not a DNS subdomain")
    items = payload_items(payload)
    selector = {f"{s.label_prefix}/pair-job": name}
    labels = {**COMMON_LABELS, f"{s.label_prefix}/run-id": run_id, **selector}
    annotations = {f"{s.label_prefix}/pair": ",".join(nodes)}
    master = f"{name}-0.{name}.{s.namespace}.svc:{port}"
    own = [
        "pair",
        "--run-id", run_id,
        # $(NODE_NAME): the node this pod was bound to, from the downward API (either of the two).
        "--node", "$(NODE_NAME)",
        "--nodes", *nodes,
        # No --rank: the payload takes $JOB_COMPLETION_INDEX, which the Job controller gives each pod.
        "--master", master,
        "--repeats", str(s.repeats),
        "--deadline-seconds", str(max(60, s.deadline_s - _START_ALLOWANCE_S)),
        *s.policy_args,
    ]  # fmt: skip
    # Checked as the payload will parse it, with the rank each pod takes from $JOB_COMPLETION_INDEX.
    extra = check_pair_payload_args(pair_args, prefix=[*own[1:], "--rank", "0"])
    # The Job's own arguments hold no `$` but $(NODE_NAME) (run ids and node names are DNS names); the
    # extra ones reach the payload as written.
    args = [*own, *(_kubelet_literal(arg) for arg in extra)]
    service = _render_one(
        PAIR_SERVICE_TEMPLATE,
        {"svc": {"name": name, "namespace": s.namespace, "labels": labels, "annotations": annotations,
                 "selector": selector, "port": port}},
        "Service",
    )  # fmt: skip
    context = {
        "name": name,
        "namespace": s.namespace,
        "labels": labels,
        "annotations": annotations,
        "pod_annotations": {**annotations, **s.pod_annotations},
        "deadline_s": s.deadline_s,
        "ttl_s": s.ttl_s,
        "priority_class": s.priority_class,
        "subdomain": name,
        "affinity": _affinity(nodes, selector),
        "tolerations": _tolerations(s.label_prefix),
        "image": s.image,
        "args": args,
        "port": port,
        "resources": {
            "limits": {"nvidia.com/gpu": str(gpus)},
            "requests": {"cpu": s.cpu_request, "memory": s.memory_request, "nvidia.com/gpu": str(gpus)},
        },
        "payload": payload_name,
        "payload_items": items,
        "payload_dir": PAYLOAD_DIR,
        "shm_size": s.shm_size,
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
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": uid,
             "controller": False, "blockOwnerDeletion": False}  # fmt: skip
    return {**service, "metadata": {**service["metadata"], "ownerReferences": [owner]}}
