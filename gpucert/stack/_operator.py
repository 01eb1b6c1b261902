"""The NVIDIA GPU Operator a cluster already runs: recognise it, plan against it, change it, follow it.

gpucert never installs a second stack beside the operator (docs/design/configure.md, "A cluster that already
runs the GPU Operator"; docs/decisions/016). :func:`survey_stack` says what installs the stack and where,
:func:`choose_installer` picks configure's path or refuses two installers, :func:`operator_release` finds the
operator's release in the matrix, :func:`operator_changes` turns a plan into server-side applies to its
ClusterPolicy or NVIDIADrivers (never to its DaemonSets: the operator owns them and would put them back), and
:func:`rollout_pending` follows a driver change node by node through the upgrade controller's state label and
the driver pod's version (the ClusterPolicy reads ``ready`` before the last node is done).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from ..errors import InstallerConflict, StackConflict
from ..kube import Kube, KubeNotFound
from ..telemetry import EXPORTER_SELECTOR, OPERATOR_EXPORTER_SELECTOR, ExporterSource
from ._drift import Drift
from ._inventory import node_info
from ._labels import DEPLOY_PREFIX, PRE_INSTALLED, version_label
from ._matrix import Matrix, Release
from ._model import COMPONENTS, NodeInfo, StackPlan
from ._plan import shown_nodes
from ._render import check_output_dir
from ._rollout import pod_ready

__all__ = [
    "GPU_OPERATOR",
    "OWN",
    "UPGRADE_FAILED",
    "UPGRADE_STATE",
    "OperatorChange",
    "OperatorStack",
    "StackSurvey",
    "choose_installer",
    "configured_versions",
    "drift_since_configure",
    "exporter_sources",
    "normalise_version",
    "operand_versions",
    "operator_changes",
    "operator_drift",
    "operator_pods",
    "operator_release",
    "pending_operands",
    "rollout_check",
    "rollout_pending",
    "stack_pods",
    "survey_stack",
    "untolerated_taints",
    "write_operator_changes",
]

GPU_OPERATOR = "gpu-operator"
OWN = "gpucert"
#: What ``configure --installer`` accepts: ``auto`` adopts the operator where it runs, else gpucert's own.
INSTALLERS = ("auto", OWN, GPU_OPERATOR)
CLUSTER_POLICY = ("nvidia.com/v1", "ClusterPolicy")
NVIDIA_DRIVER = ("nvidia.com/v1alpha1", "NVIDIADriver")
#: The driver upgrade controller's per-node state (k8s-operator-libs ``upgrade``), ``upgrade-done`` last.
UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
UPGRADE_DONE = "upgrade-done"
UPGRADE_FAILED = "upgrade-failed"
#: Which NVIDIADriver a node's driver comes from (NVIDIADriver mode).
DRIVER_OWNER = "nvidia.com/gpu-operator.driver.owner"
_MANAGED_BY_OPERATOR = "app.kubernetes.io/managed-by=gpu-operator"
_PART_OF_GPUCERT = "app.kubernetes.io/part-of=gpucert"
#: Component → its section of the ClusterPolicy's spec (``spec.<key>.version``, ``.enabled``).
SPEC_KEYS = {
    "driver": "driver",
    "container-toolkit": "toolkit",
    "device-plugin": "devicePlugin",
    "dcgm-exporter": "dcgmExporter",
    "gpu-feature-discovery": "gfd",
}
#: Component → the pod label (key, value) of the operator's operand pods (both driver modes for the driver).
_OPERAND_PODS = {
    "driver": ("app.kubernetes.io/component", "nvidia-driver"),
    "container-toolkit": ("app", "nvidia-container-toolkit-daemonset"),
    "device-plugin": ("app", "nvidia-device-plugin-daemonset"),
    "dcgm-exporter": ("app", "nvidia-dcgm-exporter"),
    "gpu-feature-discovery": ("app", "gpu-feature-discovery"),
}
#: The image repositories' last path part of each operand (what tells a foreign installer's operand).
_OPERAND_IMAGES = {
    "driver": "driver",
    "container-toolkit": "container-toolkit",
    "device-plugin": "k8s-device-plugin",
    "dcgm-exporter": "dcgm-exporter",
}
_DRIVER_VERSION = re.compile(r"^(\d{3,4}\.\d{1,3}(?:\.\d{1,3})?)(?:-|$)")
# An image tag's OS or flavour suffix: `-distroless`, `-ubuntu22.04`, `-ubi9`, `-rhel9.4`.
_TAG_SUFFIX = re.compile(r"-(?:distroless|ubuntu\d+\.\d+|ubi\d+|rhel\d+(?:\.\d+)?|rocky\d+(?:\.\d+)?)$")


def normalise_version(component: str, value: str) -> str:
    """A version as the compatibility matrix writes it, from an image tag or a ClusterPolicy's ``version``:
    ``580.105.08-ubuntu22.04`` → ``580.105.08``, ``4.6.0-4.8.3-distroless`` → ``4.6.0-4.8.3``."""
    value = value.strip()
    if component == "driver":
        match = _DRIVER_VERSION.match(value)
        return match.group(1) if match else value
    return _TAG_SUFFIX.sub("", value)


def _tag(image: str) -> str:
    reference = image.split("@", 1)[0]
    _repo, colon, tag = reference.rpartition(":")
    return tag if colon and "/" not in tag else ""


def _repository_name(image: str) -> str:
    reference = image.split("@", 1)[0]
    repo = reference.rsplit(":", 1)[0] if _tag(image) else reference
    return repo.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class OperatorStack:
    """The GPU Operator as the cluster shows it."""

    #: The operator's release, e.g. ``v26.7.0``; None when nothing says.
    version: str | None
    #: Where the version was read (``Deployment gpu-operator/gpu-operator``, ``ClusterPolicy … labels`` …).
    version_from: str
    #: The ClusterPolicy the operator acts on (the oldest), None when there is none.
    policy: str | None
    #: Its ``status.state`` (``ready``, ``notReady``, or empty before the operator wrote one).
    state: str
    #: ``spec.driver.useNvidiaDriverCRD``: the driver comes from NVIDIADriver resources.
    uses_nvidia_drivers: bool
    #: ``spec.driver.upgradePolicy.autoUpgrade``: the operator rolls a driver change out itself.
    auto_upgrade: bool
    #: Component → the version the ClusterPolicy asks for (normalised), for enabled components.
    spec_versions: Mapping[str, str]
    #: Component → the ClusterPolicy's version field as written (an image tag).
    spec_tags: Mapping[str, str]
    #: Components the ClusterPolicy disables (``spec.<key>.enabled: false``).
    disabled: tuple[str, ...] = ()
    #: NVIDIADriver name → its ``spec.version``.
    drivers: Mapping[str, str] = field(default_factory=dict)
    #: The operand DaemonSets, ``namespace/name``.
    daemonsets: tuple[str, ...] = ()
    #: The tolerations the ClusterPolicy gives every operand DaemonSet (``spec.daemonsets.tolerations``).
    tolerations: tuple[Mapping[str, Any], ...] = ()

    def describe(self) -> str:
        policy = f"ClusterPolicy {self.policy} ({self.state or 'no state yet'})" if self.policy else "no ClusterPolicy"
        mode = f"; driver from NVIDIADriver {', '.join(sorted(self.drivers))}" if self.uses_nvidia_drivers else ""
        return (
            f"the NVIDIA GPU Operator {self.version or '(release unknown)'} ({policy}{mode}; "
            f"{len(self.daemonsets)} operand DaemonSets)"
        )


@dataclass(frozen=True)
class StackSurvey:
    """What installs the GPU stack on this cluster, and where."""

    operator: OperatorStack | None
    #: gpucert's own stack DaemonSets, ``namespace/name``.
    own_daemonsets: tuple[str, ...]
    #: DaemonSets of NVIDIA operands neither gpucert nor the operator made (a standalone Helm chart …).
    other_daemonsets: tuple[str, ...]
    #: Node → the installers running stack pods there (``gpu-operator``, ``gpucert``, ``other``).
    node_installers: Mapping[str, tuple[str, ...]]
    #: GPU nodes whose host has its own driver (``nvidia.com/gpu.deploy.driver=pre-installed``).
    host_driver_nodes: tuple[str, ...]
    #: Node → its driver upgrade state label, where the operator wrote one.
    upgrade_states: Mapping[str, str] = field(default_factory=dict)

    @property
    def installers(self) -> tuple[str, ...]:
        operator = self.operator is not None and bool(self.operator.policy or self.operator.daemonsets)
        present = {GPU_OPERATOR: operator, OWN: bool(self.own_daemonsets), "other": bool(self.other_daemonsets)}
        return tuple(name for name, there in present.items() if there)

    def lines(self) -> list[str]:
        """What was found, one plain sentence each."""
        out = []
        if self.operator is not None:
            where = [n for n, i in self.node_installers.items() if GPU_OPERATOR in i]
            out.append(
                f"{self.operator.describe()}; its operands run on {len(where)} nodes"
                + (f" ({shown_nodes(sorted(where))})" if where else "")
            )
        else:
            out.append("no NVIDIA GPU Operator (no ClusterPolicy, no operand DaemonSet)")
        if self.own_daemonsets:
            where = [n for n, i in self.node_installers.items() if OWN in i]
            out.append(f"gpucert's own stack: {len(self.own_daemonsets)} DaemonSets, pods on {len(where)} nodes")
        if self.other_daemonsets:
            out.append(f"NVIDIA operands from another installer: {', '.join(self.other_daemonsets)}")
        if self.host_driver_nodes:
            out.append(
                f"host drivers (pre-installed) on {len(self.host_driver_nodes)} nodes "
                f"({shown_nodes(sorted(self.host_driver_nodes))})"
            )
        both = [n for n, i in self.node_installers.items() if len(i) > 1]
        if both:
            out.append(f"{len(both)} nodes run stack pods of two installers: {shown_nodes(sorted(both))}")
        return out


def _list(kube: Kube, api_version: str, kind: str, **kwargs: Any) -> list[dict[str, Any]]:
    """The objects, or none where the API does not serve the kind (no CRD). A kind gpucert may not read
    is an error (``KubeForbidden``), never "none": a survey that could not look must not conclude that no
    other installer runs the stack and install a second one."""
    try:
        return kube.list_objects(api_version, kind, **kwargs)
    except KubeNotFound:
        return []


def _version_of_operator(kube: Kube, policy: Mapping[str, Any] | None) -> tuple[str | None, str]:
    """The operator's release: its Deployment's ``app.kubernetes.io/version`` label or image tag, else the
    ClusterPolicy's (the chart labels it), else the validator image the ClusterPolicy names (same tag)."""
    for deployment in _list(kube, "apps/v1", "Deployment", label_selector="app.kubernetes.io/component=gpu-operator"):
        meta = deployment.get("metadata") or {}
        where = f"Deployment {meta.get('namespace')}/{meta.get('name')}"
        label = (meta.get("labels") or {}).get("app.kubernetes.io/version")
        if label:
            return str(label), where
        containers = ((deployment.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or ()
        for container in containers:
            if _repository_name(str(container.get("image") or "")) == "gpu-operator":
                return _tag(str(container["image"])) or None, where
    if policy is not None:
        meta = policy.get("metadata") or {}
        label = (meta.get("labels") or {}).get("app.kubernetes.io/version")
        if label:
            return str(label), f"ClusterPolicy {meta.get('name')} labels"
        validator = ((policy.get("spec") or {}).get("validator") or {}).get("version")
        if validator:
            return str(validator), f"ClusterPolicy {meta.get('name')} validator image"
    return None, "nothing names it"


def _operator(kube: Kube, policies: list[dict[str, Any]], operands: list[dict[str, Any]]) -> OperatorStack | None:
    if not policies and not operands:
        return None
    # The operator acts on the oldest ClusterPolicy only (a second one gets no status at all).
    policies.sort(key=lambda p: (str(p["metadata"].get("creationTimestamp") or ""), str(p["metadata"]["name"])))
    policy = policies[0] if policies else None
    spec = (policy or {}).get("spec") or {}
    driver = spec.get("driver") or {}
    versions, tags, disabled = {}, {}, []
    for component, key in SPEC_KEYS.items():
        section = spec.get(key) or {}
        if section.get("enabled") is False:
            disabled.append(component)
        elif section.get("version"):
            tags[component] = str(section["version"])
            versions[component] = normalise_version(component, str(section["version"]))
    drivers = {
        str(d["metadata"]["name"]): str((d.get("spec") or {}).get("version") or "") for d in _list(kube, *NVIDIA_DRIVER)
    }
    version, where = _version_of_operator(kube, policy)
    return OperatorStack(
        version=version,
        version_from=where,
        policy=str(policy["metadata"]["name"]) if policy else None,
        state=str(((policy or {}).get("status") or {}).get("state") or ""),
        uses_nvidia_drivers=bool(driver.get("useNvidiaDriverCRD")),
        auto_upgrade=bool((driver.get("upgradePolicy") or {}).get("autoUpgrade")),
        spec_versions=versions,
        spec_tags=tags,
        disabled=tuple(disabled),
        drivers=drivers,
        daemonsets=tuple(sorted(f"{d['metadata']['namespace']}/{d['metadata']['name']}" for d in operands)),
        tolerations=tuple((spec.get("daemonsets") or {}).get("tolerations") or ()),
    )


def _foreign_operands(daemonsets: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """DaemonSets running an NVIDIA operand's image that neither gpucert nor the operator labelled."""
    out = []
    for ds in daemonsets:
        labels = ds["metadata"].get("labels") or {}
        if labels.get("app.kubernetes.io/managed-by") == GPU_OPERATOR or labels.get("app.kubernetes.io/part-of") == OWN:
            continue
        containers = ds["spec"]["template"]["spec"].get("containers") or ()
        if any(_repository_name(str(c.get("image") or "")) in _OPERAND_IMAGES.values() for c in containers):
            out.append(dict(ds))
    return out


def _pod_nodes(kube: Kube, selector: str) -> set[str]:
    pods = _list(kube, "v1", "Pod", label_selector=selector)
    return {str(p["spec"]["nodeName"]) for p in pods if (p.get("spec") or {}).get("nodeName")}


def survey_stack(kube: Kube, inventory: Sequence[NodeInfo]) -> StackSurvey:
    """What installs the stack on this cluster (see :class:`StackSurvey`); reads, never writes."""
    policies = _list(kube, *CLUSTER_POLICY)
    operands = _list(kube, "apps/v1", "DaemonSet", label_selector=_MANAGED_BY_OPERATOR)
    own = _list(kube, "apps/v1", "DaemonSet", label_selector=_PART_OF_GPUCERT)
    others = _foreign_operands(_list(kube, "apps/v1", "DaemonSet"))
    placed = {GPU_OPERATOR: _pod_nodes(kube, _MANAGED_BY_OPERATOR), OWN: _pod_nodes(kube, _PART_OF_GPUCERT)}
    other_nodes: set[str] = set()
    for ds in others:
        match = (ds["spec"].get("selector") or {}).get("matchLabels") or {}
        if match:
            other_nodes |= _pod_nodes(kube, ",".join(f"{k}={v}" for k, v in sorted(match.items())))
    placed["other"] = other_nodes
    gpu_nodes = [info.name for info in inventory]
    node_installers = {n: tuple(i for i in (GPU_OPERATOR, OWN, "other") if n in placed[i]) for n in gpu_nodes}
    return StackSurvey(
        operator=_operator(kube, policies, operands),
        own_daemonsets=tuple(sorted(f"{d['metadata']['namespace']}/{d['metadata']['name']}" for d in own)),
        other_daemonsets=tuple(sorted(f"{d['metadata']['namespace']}/{d['metadata']['name']}" for d in others)),
        node_installers=node_installers,
        host_driver_nodes=tuple(i.name for i in inventory if i.labels.get(f"{DEPLOY_PREFIX}driver") == PRE_INSTALLED),
        upgrade_states={i.name: i.labels[UPGRADE_STATE] for i in inventory if UPGRADE_STATE in i.labels},
    )


def choose_installer(survey: StackSurvey, asked: str = "auto") -> str:
    """``gpu-operator`` (adopt it) or ``gpucert`` (own manifests) for ``asked`` (one of :data:`INSTALLERS`);
    raises :class:`InstallerConflict` (exit 2, nothing written) when two installers would run the stack."""
    if asked not in INSTALLERS:
        raise InstallerConflict([f"unknown installer {asked!r} (known: {', '.join(INSTALLERS)})"])
    operator, found = survey.operator, survey.installers
    if GPU_OPERATOR in found and OWN in found:
        assert operator is not None
        both = [n for n, i in survey.node_installers.items() if GPU_OPERATOR in i and OWN in i]
        raise InstallerConflict(
            [
                f"{operator.describe()} and gpucert's own stack ({', '.join(survey.own_daemonsets)}) both install "
                f"the GPU stack"
                + (f"; both run pods on {len(both)} nodes ({shown_nodes(sorted(both))})" if both else ""),
                "remove one: gpucert's DaemonSets (kubectl delete -n <namespace> daemonset -l "
                "app.kubernetes.io/part-of=gpucert) to let configure adopt the operator, or the operator",
            ],
            header="two installers run the GPU stack on this cluster: the GPU Operator and gpucert",
        )
    if "other" in found:
        raise InstallerConflict(
            [
                f"NVIDIA operands from another installer run here: {', '.join(survey.other_daemonsets)}; "
                "gpucert installs no operand another installer already runs"
            ],
            header="another installer runs the GPU stack on this cluster",
        )
    if asked == OWN and GPU_OPERATOR in found:
        assert operator is not None
        raise InstallerConflict(
            [
                f"{operator.describe()} runs the GPU stack; gpucert will not install a second one beside it "
                "(run configure without --installer gpucert to adopt the operator)"
            ],
            header="--installer gpucert refused: the GPU Operator runs the GPU stack",
        )
    adoptable = operator is not None and operator.policy is not None
    if asked == GPU_OPERATOR and not adoptable:
        raise InstallerConflict(
            [
                "no ClusterPolicy: the GPU Operator does not run the stack here (run configure without "
                "--installer gpu-operator for gpucert's own manifests)"
            ],
            header="--installer gpu-operator refused: no GPU Operator runs the GPU stack",
        )
    if GPU_OPERATOR in found and not adoptable:
        raise InstallerConflict(
            [
                "operand DaemonSets of the GPU Operator run "
                f"({', '.join(operator.daemonsets if operator else ())}) "
                "but there is no ClusterPolicy to change them through"
            ],
            header="the GPU Operator's operands run without a ClusterPolicy",
        )
    return GPU_OPERATOR if GPU_OPERATOR in found else OWN


def operator_release(matrix: Matrix, version: str | None) -> Release:
    """The compatibility matrix's release for the operator's ``version`` (``v26.7.0`` → ``26.7.0``); a patch
    release it does not list is planned against its minor's newest listed one (``v26.7.3`` → ``26.7.0``).
    Raises :class:`StackConflict` when nothing says the version or the matrix has no release of its minor."""
    if not version:
        raise StackConflict(
            [
                "the GPU Operator's release cannot be read (no Deployment label or image tag, "
                "no ClusterPolicy label): gpucert cannot check it against the compatibility matrix"
            ]
        )
    name = version.strip().removeprefix("v")
    # find_release("26.7") is the newest release of that minor.
    found = matrix.find_release(name) or matrix.find_release(".".join(name.split(".")[:2]))
    if found is not None:
        return found
    known = ", ".join(r.name for r in matrix.releases_newest_first())
    raise StackConflict(
        [f"the GPU Operator {version} is not in the compatibility matrix (it knows {known})"],
        header=f"the GPU Operator {version} cannot be planned against",
    )


def configured_versions(
    operator: OperatorStack, plan: StackPlan, inventory: Sequence[NodeInfo] = ()
) -> dict[str, dict[str, str]]:
    """Node → component → the version the operator was told to run there: the ClusterPolicy's, the driver
    of the node's NVIDIADriver in NVIDIADriver mode (``inventory`` gives the owner labels), a host's own."""
    owners = {i.name: i.labels.get(DRIVER_OWNER, "") for i in inventory}
    out = {}
    for node in plan.nodes:
        versions = dict(operator.spec_versions)
        if operator.uses_nvidia_drivers:
            versions.pop("driver", None)
            if operator.drivers.get(owners.get(node, "")):
                versions["driver"] = normalise_version("driver", operator.drivers[owners[node]])
        if node in plan.host_driver:
            versions["driver"] = plan.host_driver[node]
        out[node] = versions
    return out


@dataclass(frozen=True)
class OperatorChange:
    """One object gpucert applies to the operator, and the version changes it carries."""

    obj: Mapping[str, Any]
    #: Component → (from, to), normalised versions.
    changes: Mapping[str, tuple[str, str]]
    #: The nodes whose operands the change rolls.
    nodes: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.obj['kind']} {self.obj['metadata']['name']}"


def _pools(inventory: Sequence[NodeInfo], nodes: Sequence[str]) -> dict[str, list[str]]:
    """NVIDIADriver name → the target nodes whose driver it owns (``nvidia.com/gpu-operator.driver.owner``)."""
    labels = pd.DataFrame(
        [(i.name, i.labels.get(DRIVER_OWNER, "")) for i in inventory if i.name in set(nodes)], columns=["node", "owner"]
    )
    owned = labels[labels["owner"] != ""]
    return {str(k): sorted(map(str, v)) for k, v in owned.groupby("owner")["node"]}


def operator_changes(
    operator: OperatorStack, plan: StackPlan, pinned: Mapping[str, str], inventory: Sequence[NodeInfo]
) -> list[OperatorChange]:
    """What to apply so the operator runs ``pinned`` (component → version asked for) on the plan's nodes:
    only what was asked and differs, in the ClusterPolicy's ``spec.<component>.version`` (the plan's image
    tag) or, in NVIDIADriver mode, the ``spec.version`` of each NVIDIADriver owning a target node."""
    if operator.policy is None:
        return []
    policy_spec: dict[str, Any] = {}
    policy_changes: dict[str, tuple[str, str]] = {}
    out = []
    for component in COMPONENTS:
        if component not in pinned or component in operator.disabled:
            continue
        want = plan.versions.get(component) if component != "driver" else normalise_version("driver", pinned[component])
        have = operator.spec_versions.get(component, "")
        if want is None:
            continue
        if component == "driver" and operator.uses_nvidia_drivers:
            for name, nodes in _pools(inventory, [n for n in plan.nodes if n not in plan.host_driver]).items():
                if normalise_version("driver", operator.drivers.get(name, "")) != want:
                    body = _object(NVIDIA_DRIVER, name, {"version": want})
                    out.append(OperatorChange(body, {"driver": (operator.drivers.get(name, ""), want)}, tuple(nodes)))
            continue
        if have == want:
            continue
        tag = want if component == "driver" else plan.images[component].rsplit(":", 1)[1]
        policy_spec[SPEC_KEYS[component]] = {"version": tag}
        policy_changes[component] = (have, want)
    if policy_spec:
        out.insert(0, OperatorChange(_object(CLUSTER_POLICY, operator.policy, policy_spec), policy_changes, plan.nodes))
    return out


def _object(kind: tuple[str, str], name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The object of the operator's ``kind`` (apiVersion, kind) named ``name`` that server-side applies ``spec``."""
    return {"apiVersion": kind[0], "kind": kind[1], "metadata": {"name": name}, "spec": dict(spec)}


def _image_of(pod: Mapping[str, Any], component: str) -> str:
    containers = (pod.get("spec") or {}).get("containers") or ()
    wanted = _OPERAND_IMAGES.get(component)
    for container in containers:
        if wanted and _repository_name(str(container.get("image") or "")) == wanted:
            return str(container["image"])
    return str((containers[0] if containers else {}).get("image") or "")


def _operand(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """An operator operand pod's component and version (normalised from its image tag)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    component = next((c for c, (k, v) in _OPERAND_PODS.items() if labels.get(k) == v), None)
    return (component, normalise_version(component, _tag(_image_of(pod, component)))) if component else None


def _own(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """A pod of gpucert's own stack: its component and version (its labels carry both)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    component, version = labels.get("app.kubernetes.io/component"), labels.get("app.kubernetes.io/version")
    return (str(component), str(version)) if component in COMPONENTS and version else None


def _pod_table(
    pods: Iterable[Mapping[str, Any]], what: Callable[[Mapping[str, Any]], tuple[str, str] | None]
) -> pd.DataFrame:
    """One row per placed pod ``what`` gives a (component, version): node, component, version, ready, created."""
    rows = []
    for pod in pods:
        node, found = (pod.get("spec") or {}).get("nodeName"), what(pod)
        if node and found:
            created = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
            rows.append((str(node), *found, pod_ready(pod), created))
    return pd.DataFrame(rows, columns=["node", "component", "version", "ready", "created"])


def _running(table: pd.DataFrame) -> dict[tuple[str, str], str]:
    """(node, component) → the version its Ready pod runs; of two (the old one going) the newest says."""
    ready = table.loc[table["ready"].astype(bool)].sort_values("created", kind="stable")
    latest = ready.drop_duplicates(["node", "component"], keep="last")
    return {(str(n), str(c)): str(v) for n, c, v in latest[["node", "component", "version"]].itertuples(index=False)}


def operand_versions(pods: Iterable[Mapping[str, Any]], nodes: Sequence[str]) -> dict[str, dict[str, str]]:
    """Node → component → the version its Ready operand pod runs (``pods``: the operator's operand pods)."""
    out: dict[str, dict[str, str]] = {n: {} for n in nodes}
    for (node, component), version in _running(_pod_table(pods, _operand)).items():
        if node in out:
            out[node][component] = version
    return out


def rollout_pending(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], targets: Sequence[str], driver: str
) -> dict[str, str]:
    """Target node → why its driver rollout to ``driver`` is not done: done is ``upgrade-done`` (or no state
    label, when auto-upgrade is off), a Ready driver pod running ``driver``, and the node schedulable again."""
    labels = {str(n["metadata"]["name"]): (n["metadata"].get("labels") or {}) for n in nodes}
    cordoned = {str(n["metadata"]["name"]) for n in nodes if (n.get("spec") or {}).get("unschedulable")}
    running = operand_versions(pods, targets)
    pending = {}
    for node in targets:
        state = labels.get(node, {}).get(UPGRADE_STATE, "")
        have = running.get(node, {}).get("driver", "")
        if node not in labels:
            pending[node] = "node gone"
        elif state == UPGRADE_FAILED:
            pending[node] = f"stuck in {UPGRADE_FAILED} (driver {have or 'not running'})"
        elif have != driver:
            pending[node] = f"{state or 'no upgrade state'}; driver {have or 'not running'}, not {driver}"
        elif state not in ("", UPGRADE_DONE) or node in cordoned:
            pending[node] = f"{state or 'cordoned'}; driver {driver} running"
    return pending


def stack_pods(kube: Kube) -> list[dict[str, Any]]:
    """The stack's pods of either installer, in every namespace: the operator's operands and gpucert's own."""
    return operator_pods(kube) + _list(kube, "v1", "Pod", label_selector=_PART_OF_GPUCERT)


def exporter_sources(kube: Kube, stack_namespace: str) -> list[ExporterSource]:
    """Where the DCGM exporters are: gpucert's own exporter Service in ``stack_namespace`` (always looked
    for), and the GPU Operator's in each namespace its exporter pods run in. The namespace is read from the
    pods, which the runtime role may list: its ClusterPolicy would need rights operate has no other use for.
    """
    pods = _list(kube, "v1", "Pod", label_selector=f"{_MANAGED_BY_OPERATOR},{OPERATOR_EXPORTER_SELECTOR}")
    namespaces = sorted({str(p["metadata"]["namespace"]) for p in pods if p["metadata"].get("namespace")})
    return [ExporterSource(stack_namespace, EXPORTER_SELECTOR)] + [
        ExporterSource(ns, OPERATOR_EXPORTER_SELECTOR) for ns in namespaces
    ]


def operator_pods(kube: Kube) -> list[dict[str, Any]]:
    """The operator's operand pods, in every namespace."""
    return _list(kube, "v1", "Pod", label_selector=_MANAGED_BY_OPERATOR)


def rollout_check(kube: Kube, targets: Sequence[str], driver: str) -> dict[str, str]:
    """:func:`rollout_pending` as the cluster is now."""
    return rollout_pending(kube.nodes(), operator_pods(kube), targets, driver)


def pending_operands(pods: Iterable[Mapping[str, Any]], wanted: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """Node → which operands do not yet run the version ``wanted`` (node → component → version) there."""
    running = operand_versions(pods, list(wanted))
    pending = {}
    for node, components in wanted.items():
        off = [
            f"{c} {running[node].get(c) or 'not running'}, not {v}"
            for c, v in components.items()
            if running[node].get(c) != v
        ]
        if off:
            pending[node] = "; ".join(off)
    return pending


def operator_drift(
    configured: Mapping[str, Mapping[str, str]],
    observed: Mapping[str, Mapping[str, str]],
    inventory: Sequence[NodeInfo],
) -> list[Drift]:
    """Every operand off the version the operator was told to run (``configured``: node → component →
    version), on the target nodes; a node's opt-out (``nvidia.com/gpu.deploy.<component>=false``) says why."""
    labels = {i.name: i.labels for i in inventory}
    out = []
    for node, components in configured.items():
        running = observed.get(node, {})
        for component, want in components.items():
            have = running.get(component, "")
            if have == want:
                continue
            if labels.get(node, {}).get(f"{DEPLOY_PREFIX}{component}") == "false":
                reason = f"opted out ({DEPLOY_PREFIX}{component}=false)"
            else:
                reason = "runs another version than the operator was told" if have else "not running"
            out.append(Drift(node, component, want, have, reason))
    return sorted(out, key=lambda d: (d.node, COMPONENTS.index(d.component)))


def write_operator_changes(changes: Sequence[OperatorChange], directory: Path) -> list[Path]:
    """``--dry-run DIR`` on an operator's cluster: the objects configure would server-side apply to the
    operator, in one file (``gpu-operator-changes.yaml``; an empty file when nothing would change)."""
    check_output_dir(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "gpu-operator-changes.yaml"
    header = "# gpucert configure --dry-run: adopt the NVIDIA GPU Operator; server-side apply, field manager gpucert\n"
    path.write_text(header + yaml.safe_dump_all([dict(c.obj) for c in changes], sort_keys=False))
    return [path]


def drift_since_configure(
    nodes: Sequence[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], prefix: str
) -> list[Drift]:
    """Every stack component whose running version moved since configure verified it (``nodes``: the GPU
    Node objects, whose ``<prefix>/stack.<component>`` labels say what configure saw running; ``pods``: the
    stack's pods, the operator's and gpucert's): an operator upgrade, a ``helm upgrade``, a hand edit.
    A node configure never labelled is not judged; a host driver is read from its node's labels."""
    pods = list(pods)
    running = _running(pd.concat([_pod_table(pods, _operand), _pod_table(pods, _own)], ignore_index=True))
    out = []
    for node in nodes:
        info = node_info(node)
        for component in COMPONENTS:
            configured = info.labels.get(version_label(prefix, component))
            if configured is None:
                continue
            have = (
                info.host_driver
                if component == "driver" and info.host_driver
                else running.get((info.name, component), "")
            )
            if have != configured:
                why = "moved outside gpucert since configure" if have else "not running since configure"
                out.append(Drift(info.name, component, configured, have, why))
    return sorted(out, key=lambda d: (d.node, COMPONENTS.index(d.component)))


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' rule: the effect matches (or is empty), the key matches (or is empty with Exists), and
    with ``Equal`` (the default) the value too."""
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("key") and toleration.get("key") != taint.get("key"):
        return False
    if not toleration.get("key") and toleration.get("operator") != "Exists":
        return False
    return toleration.get("operator") == "Exists" or toleration.get("value", "") == taint.get("value", "")


def untolerated_taints(nodes: Iterable[Mapping[str, Any]], tolerations: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Node → its NoSchedule/NoExecute taints the operator's DaemonSets do not tolerate (``key=value:effect``).

    On such a node the driver DaemonSet schedules one pod fewer than it runs, and the operator's upgrade
    controller then stops for every node ("driver DaemonSet should not have Unscheduled pods", seen on the
    real v26.7.0): gpucert's own ``<prefix>/unhealthy`` taint on a failed node does that.
    """
    out = {}
    for node in nodes:
        taints = [
            t for t in (node.get("spec") or {}).get("taints") or () if t.get("effect") in ("NoSchedule", "NoExecute")
        ]
        blocking = [t for t in taints if not any(_tolerates(tol, t) for tol in tolerations)]
        if blocking:
            out[str(node["metadata"]["name"])] = ", ".join(
                f"{t.get('key')}{'=' + t['value'] if t.get('value') else ''}:{t.get('effect')}" for t in blocking
            )
    return out
