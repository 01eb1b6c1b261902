"""Preflight's decision: which stack each GPU node gets, or every reason why it cannot have one.

:func:`plan_stack` is a pure function of the inventory (:class:`~._model.NodeInfo`), the request
(:class:`~._model.StackRequest`) and the compatibility matrix: it returns a :class:`~._model.StackPlan` or
raises one :class:`~gpucert.errors.StackConflict` naming every conflict and its nodes, so configure refuses
an incompatible request before it touches the cluster. The rules it applies are listed in
docs/design/configure.md, "How the plan is made". Nodes are grouped by the facts that matter (model,
driver, OS), so the cost is linear in the nodes for each of the handful of releases tried.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import StackConflict
from ._matrix import RELEASE_COMPONENTS, Matrix, Release, driver_key, model_key
from ._model import COMPONENTS, DriverVariant, NodeInfo, StackPlan, StackRequest

__all__ = ["NODES_SHOWN", "os_tag", "plan_stack"]

#: How many node names a conflict spells out before it counts the rest ("and 12 more").
NODES_SHOWN = 5

_KUBELET = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$")
_DRIVER = re.compile(r"^\d{3,4}\.\d{1,3}(?:\.\d{1,3})?$")
_UBUNTU = re.compile(r"^Ubuntu (\d{2}\.\d{2})(?:\.\d+)?(?:\s|$)")
_RHEL = re.compile(r"^Red Hat Enterprise Linux (?:Server )?(\d{1,2}\.\d{1,2})(?:\s|$)")
_ROCKY = re.compile(r"^Rocky Linux (\d{1,2}\.\d{1,2})(?:\s|$)")
_REGISTRY = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:\d+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$")


def os_tag(os_image: str) -> str | None:
    """The driver image's OS tag for a node's ``osImage`` (``Ubuntu 22.04.4 LTS`` → ``ubuntu22.04``,
    ``Red Hat Enterprise Linux 9.4 (Plow)`` → ``rhel9.4``, ``Rocky Linux 9.7`` → ``rocky9.7``), or None."""
    text = os_image.strip()
    for pattern, prefix in ((_UBUNTU, "ubuntu"), (_RHEL, "rhel"), (_ROCKY, "rocky")):
        found = pattern.match(text)
        if found:
            return prefix + found.group(1)
    return None


def _kubelet_minor(version: str) -> tuple[int, int] | None:
    found = _KUBELET.match(version.strip())
    return (int(found.group(1)), int(found.group(2))) if found else None


def _minor_text(minor: tuple[int, int]) -> str:
    return f"{minor[0]}.{minor[1]}"


def shown_nodes(nodes: Sequence[str]) -> str:
    """``a, b, c, d, e and 12 more``: at most :data:`NODES_SHOWN` names, the rest counted."""
    if len(nodes) <= NODES_SHOWN:
        return ", ".join(nodes)
    return f"{', '.join(nodes[:NODES_SHOWN])} and {len(nodes) - NODES_SHOWN} more"


def _same_version(a: str, b: str) -> bool:
    # "1.19.0" and "v1.19.0" name the same release; the matrix keeps the tag's spelling.
    return a.strip().removeprefix("v") == b.strip().removeprefix("v")


class _Conflicts:
    """Conflicts in the order found; those about nodes are merged per sentence, nodes kept in order."""

    def __init__(self) -> None:
        self._plain: list[str] = []
        self._nodes: dict[tuple[str, str], list[str]] = {}

    def add(self, text: str, node: str | None = None, subject: str = "") -> None:
        if node is None:
            if text not in self._plain:
                self._plain.append(text)
        else:
            self._nodes.setdefault((text, subject), []).append(node)

    def __bool__(self) -> bool:
        return bool(self._plain or self._nodes)

    def lines(self) -> list[str]:
        out = list(self._plain)
        for (text, subject), nodes in self._nodes.items():
            where = f"{subject} on {shown_nodes(nodes)}" if subject else f"on {shown_nodes(nodes)}"
            out.append(f"{text} ({where})")
        return out


@dataclass(frozen=True)
class _Facts:
    """What planning needs of one node, parsed once whatever the release."""

    name: str
    model: str | None
    architecture: str | None
    minor: tuple[int, int] | None
    runtime: str | None
    os_tag: str | None
    host_driver: str | None


@dataclass(frozen=True)
class _Base:
    """The release-independent part of planning: node facts and the conflicts no release can fix."""

    facts: tuple[_Facts, ...]
    #: (conflict, node) for each node whatever the release.
    node_conflicts: tuple[tuple[str, str], ...]
    request_conflicts: tuple[str, ...]
    minors: tuple[tuple[int, int], ...]
    driver: str | None


def _inventory(nodes: Sequence[NodeInfo], request: StackRequest, matrix: Matrix) -> _Base:
    ordered = sorted(nodes, key=lambda n: n.name)
    problems: list[tuple[str, str]] = []
    request_conflicts: list[str] = []
    if not ordered:
        request_conflicts.append("no GPU nodes to configure")
    seen: set[str] = set()
    facts: list[_Facts] = []
    for node in ordered:
        if node.name in seen:
            request_conflicts.append(f"node {node.name} is listed more than once")
            continue
        seen.add(node.name)
        found, wrong = _node_facts(node, matrix)
        facts.append(found)
        problems += [(text, node.name) for text in wrong]
    minors = tuple(sorted({f.minor for f in facts if f.minor is not None}))
    request_conflicts.extend(_request_conflicts(request, matrix))
    wanted = request.versions.get("driver")
    driver = wanted.strip() if wanted is not None else None
    return _Base(tuple(facts), tuple(problems), tuple(request_conflicts), minors, driver)


def _node_facts(node: NodeInfo, matrix: Matrix) -> tuple[_Facts, list[str]]:
    """What planning needs of ``node``, and what is wrong with it whatever the release."""
    problems = []
    model = node.gpu_model.strip() if node.gpu_model and node.gpu_model.strip() else None
    architecture = None
    if model is None:
        problems.append("cannot tell the GPU model: no nvidia.com/gpu.product label")
    else:
        architecture = matrix.architecture(model)
        if architecture is None:
            problems.append(f"unknown GPU model {model!r}: not in the compatibility matrix")
    minor = _kubelet_minor(node.kubelet_version)
    if minor is None:
        problems.append(f"cannot read the kubelet version {node.kubelet_version!r}")
    scheme, sep, _ = node.container_runtime.partition("://")
    runtime = scheme if sep and scheme else None
    if runtime is None:
        problems.append(f"cannot read the container runtime {node.container_runtime!r}")
    host = node.host_driver.strip() if node.host_driver is not None else None
    if host == "":
        # Marked pre-installed, but no label says which driver: it cannot be checked against the matrix.
        problems.append(
            "host driver of unknown version: nvidia.com/gpu.deploy.driver=pre-installed without "
            "nvidia.com/cuda.driver-version.full"
        )
    elif host is not None and not _DRIVER.match(host):
        problems.append(f"host driver version {host!r} is not a driver version (like 580.95.05)")
    tag = os_tag(node.os_image)
    if tag is None and host is None:
        # Only a node that gets gpucert's driver needs a driver image for its OS.
        problems.append(f"no driver image for OS {node.os_image!r}: gpucert knows Ubuntu, RHEL and Rocky Linux")
    return _Facts(node.name, model, architecture, minor, runtime, tag, host), problems


def _request_conflicts(request: StackRequest, matrix: Matrix) -> list[str]:
    known = ", ".join(COMPONENTS)
    out = [
        f"unknown component {c!r} in the requested versions (known: {known})"
        for c in request.versions
        if c not in COMPONENTS
    ]
    if request.registry is not None and not _REGISTRY.match(request.registry.strip().rstrip("/")):
        out.append(
            f"registry {request.registry!r} is not a registry host with an optional path "
            "(like registry.example.com:5000/mirror)"
        )
    wanted = request.versions.get("driver")
    if wanted is not None:
        version = wanted.strip()
        branch = version.partition(".")[0]
        if not _DRIVER.match(version):
            out.append(f"requested driver {wanted!r} is not a driver version (like 580.95.05)")
        elif branch not in matrix.drivers:
            out.append(
                f"requested driver {version}: branch {branch} is not in the compatibility matrix "
                f"(known branches: {', '.join(sorted(matrix.drivers, key=int, reverse=True))})"
            )
        elif not matrix.is_known_driver(version):
            # A driver image exists only for releases NVIDIA shipped; the matrix lists the ones it knows.
            out.append(
                f"requested driver {version} is not a known release of branch {branch} "
                f"(known: {', '.join(matrix.drivers[branch].releases)})"
            )
    return out


def _with_registry(repository: str, registry: str | None) -> str:
    if not registry:
        return repository
    _, _, path = repository.partition("/")
    return f"{registry.strip().rstrip('/')}/{path}"


@dataclass
class _Driver:
    """The driver decision for one GPU model under one release: a version, or why there is none."""

    version: str | None
    problem: str | None = None


class _Planner:
    """Plans the stack under one release; ``conflicts`` says what that release cannot accept."""

    def __init__(self, release: Release, base: _Base, request: StackRequest, matrix: Matrix) -> None:
        self.release, self.base, self.request, self.matrix = release, base, request, matrix
        self.conflicts = _Conflicts()
        self._drivers: dict[str, _Driver] = {}
        for text, node in base.node_conflicts:
            self.conflicts.add(text, node)

    # --- release-wide components -----------------------------------------------------------------

    def components(self) -> tuple[dict[str, str], dict[str, str]]:
        versions: dict[str, str] = {}
        images: dict[str, str] = {}
        minors = self.base.minors
        for component in RELEASE_COMPONENTS:
            pin = self.release.components[component]
            wanted = self.request.versions.get(component)
            if wanted is not None and not _same_version(wanted, pin.version):
                donors = [r for r in self.matrix.releases_newest_first() if _same_version(wanted, r.version(component))]
                fitting = [r for r in donors if all(r.kubernetes.covers(m) for m in minors)]
                if fitting:
                    pin = fitting[0].components[component]
                elif donors:
                    self.conflicts.add(
                        f"{component} {wanted} comes only with {', '.join(r.label for r in donors)}, whose "
                        f"Kubernetes range does not cover the nodes' "
                        f"{', '.join(_minor_text(m) for m in minors)}"
                    )
                else:
                    known = sorted({r.version(component) for r in self.matrix.releases}, reverse=True)
                    self.conflicts.add(
                        f"{component} {wanted} is not in the compatibility matrix ({self.release.label} pins "
                        f"{pin.version}; known: {', '.join(known)})"
                    )
            versions[component] = pin.version
            repository = _with_registry(self.matrix.image(component), self.request.registry)
            images[component] = f"{repository}:{pin.tag}"
        return versions, images

    def _covering(self, minor: tuple[int, int]) -> str:
        """Which releases of the matrix do support ``minor``: the way out of a kubelet conflict."""
        names = [r.name for r in self.matrix.releases_newest_first() if r.kubernetes.covers(minor)]
        return f"supported by {', '.join(names)}" if names else "no release of the matrix supports it"

    # --- drivers ---------------------------------------------------------------------------------

    def _requested_driver_usable(self) -> bool:
        version = self.base.driver
        if version is None or not self.matrix.is_known_driver(version):
            return False  # malformed or unknown: already a request conflict
        refused = self._branch_refused("requested driver", version)
        if refused:
            self.conflicts.add(refused)
        return not refused

    def _branch_refused(self, what: str, version: str) -> str | None:
        """Why the release refuses driver ``version`` (``what``: whose) for its branch, or None."""
        branch = version.partition(".")[0]
        if branch in self.release.driver.branches:
            return None
        supported = ", ".join(self.release.driver.branches)
        return f"{what} {version}: {self.release.label} does not support branch {branch} (it supports {supported})"

    def _fits(self, version: str, architecture: str, model: str) -> str | None:
        """Why ``version`` cannot drive ``model`` (of ``architecture``), or None when it can."""
        if not self.matrix.supports(version.partition(".")[0], architecture):
            return f"does not support {architecture}"
        first = self.matrix.min_driver(model)
        if first is not None and driver_key(version) < driver_key(first):
            return f"is older than {first}, the first for {model}"
        return None

    def driver_for(self, model: str, architecture: str, requested_ok: bool) -> _Driver:
        key = model_key(model)
        if key not in self._drivers:
            self._drivers[key] = self._decide(model, architecture, requested_ok)
        return self._drivers[key]

    def _decide(self, model: str, architecture: str, requested_ok: bool) -> _Driver:
        requested = self.base.driver
        if requested is not None:
            if not requested_ok:
                return _Driver(None)  # the request's own conflict says why
            why = self._fits(requested, architecture, model)
            return _Driver(None, f"driver {requested} {why}") if why else _Driver(requested)
        default = self.release.driver.default
        if self._fits(default, architecture, model) is None:
            return _Driver(default)
        for branch in sorted(self.release.driver.branches, key=int, reverse=True):
            if branch in self.matrix.drivers:
                candidate = self.matrix.newest_driver(branch)
                if self._fits(candidate, architecture, model) is None:
                    return _Driver(candidate)
        return _Driver(
            None,
            f"no driver branch of {self.release.label} supports {architecture} "
            f"(branches {', '.join(self.release.driver.branches)})",
        )

    def _host_driver(self, facts: _Facts, architecture: str) -> bool:
        version = facts.host_driver
        assert version is not None
        if not _DRIVER.match(version):
            return False  # already a node conflict
        refused = self._branch_refused("host driver", version)
        if refused:
            self.conflicts.add(refused, facts.name)
            return False
        why = self._fits(version, architecture, facts.model or "")
        if why:
            self.conflicts.add(f"host driver {version} {why}", facts.name, facts.model or "")
            return False
        return True

    # --- the plan --------------------------------------------------------------------------------

    def plan(self, namespace: str, label_prefix: str) -> StackPlan | None:
        release = self.release
        versions, images = self.components()
        requested_ok = self._requested_driver_usable() if self.base.driver is not None else True
        driver_repo = _with_registry(self.matrix.image("driver"), self.request.registry)
        variants: dict[str, DriverVariant] = {}
        node_driver: dict[str, str] = {}
        host_driver: dict[str, str] = {}
        model_driver: dict[str, str] = {}
        for facts in self.base.facts:
            if facts.minor is not None and not release.kubernetes.covers(facts.minor):
                self.conflicts.add(
                    f"kubelet {_minor_text(facts.minor)} is outside the Kubernetes versions {release.label} "
                    f"supports ({release.kubernetes}; {self._covering(facts.minor)})",
                    facts.name,
                )
            if facts.runtime is not None and facts.runtime not in release.runtimes:
                self.conflicts.add(
                    f"container runtime {facts.runtime} is not supported by {release.label} "
                    f"(supported: {', '.join(release.runtimes)})",
                    facts.name,
                )
            if facts.model is None or facts.architecture is None:
                continue  # already a node conflict: no model to choose a driver for
            if facts.host_driver is not None:
                if self._host_driver(facts, facts.architecture):
                    host_driver[facts.name] = facts.host_driver
                continue
            decision = self.driver_for(facts.model, facts.architecture, requested_ok)
            if decision.version is None:
                if decision.problem:
                    self.conflicts.add(decision.problem, facts.name, facts.model)
                continue
            if facts.os_tag is None:
                continue  # already a node conflict
            if facts.os_tag not in release.os:
                self.conflicts.add(
                    f"{release.label} has no driver image for {facts.os_tag} (it has {', '.join(release.os)})",
                    facts.name,
                )
                continue
            # A DNS label, as the version and OS patterns above make it (render_stack checks it again).
            variant_id = f"{decision.version}-{facts.os_tag}".replace(".", "-")
            image = f"{driver_repo}:{decision.version}-{facts.os_tag}"
            variants.setdefault(variant_id, DriverVariant(variant_id, decision.version, facts.os_tag, image))
            node_driver[facts.name] = variant_id
            model_driver[facts.model] = decision.version
        if self.conflicts:
            return None
        return StackPlan(
            release=release.name,
            namespace=namespace,
            label_prefix=label_prefix,
            nodes=tuple(f.name for f in self.base.facts),
            versions=versions,
            images=images,
            drivers=tuple(variants[k] for k in sorted(variants)),
            node_driver=dict(sorted(node_driver.items())),
            host_driver=dict(sorted(host_driver.items())),
            model_driver=dict(sorted(model_driver.items())),
            kubernetes_versions=tuple(_minor_text(m) for m in self.base.minors),
            request=self.request,
        )


def plan_stack(
    nodes: Sequence[NodeInfo],
    request: StackRequest,
    matrix: Matrix,
    *,
    namespace: str,
    label_prefix: str = "gpucert.io",
) -> StackPlan:
    """Choose the stack for ``nodes``: the release, a driver per GPU model, the images and their tags.

    Raises :class:`~gpucert.errors.StackConflict` with every conflict found (one line each, naming at most
    :data:`NODES_SHOWN` nodes) when the request names an unknown release or component, or when no release
    accepts all the nodes; the error then says why the newest release refuses them.
    """
    base = _inventory(nodes, request, matrix)

    def attempt(release: Release) -> tuple[StackPlan | None, list[str]]:
        planner = _Planner(release, base, request, matrix)
        return planner.plan(namespace, label_prefix), planner.conflicts.lines()

    if request.release is not None:
        release = matrix.find_release(request.release)
        if release is None:
            known = ", ".join(r.name for r in matrix.releases_newest_first())
            raise StackConflict(
                [*base.request_conflicts, f"unknown release {request.release!r} (the matrix knows {known})"]
            )
        plan, conflicts = attempt(release)
        if plan is None or base.request_conflicts:
            raise StackConflict([*base.request_conflicts, *conflicts])
        return plan
    refusal: list[str] | None = None
    for release in matrix.releases_newest_first():
        plan, conflicts = attempt(release)
        if plan is not None:
            if base.request_conflicts:
                raise StackConflict(list(base.request_conflicts))
            return plan
        if refusal is None:
            refusal = conflicts
    newest = matrix.newest_release()
    lines = [*base.request_conflicts, *(refusal or [])]
    raise StackConflict(
        lines,
        header=(
            f"no release of the compatibility matrix accepts these nodes and this request; the newest, "
            f"{newest.label}, refuses them: {len(lines)} conflict{'s' if len(lines) != 1 else ''}"
        ),
    )
