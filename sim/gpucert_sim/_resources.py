"""The resource table and the discovery documents built from it.

Every resource the project uses is one row here; the API layer serves all of them through one generic
code path, so adding a kind is adding a row. Discovery is derived from the same rows, so what kubectl and
the official client discover is exactly what the server serves (kubectl resolves ``no``, ``po``, ``ds`` …
from ``shortNames``, and finds nothing when ``groupVersion`` is wrong, as it is in kmock).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "KUBERNETES_VERSION",
    "RESOURCES",
    "ResourceType",
    "api_group",
    "api_group_list",
    "api_resource_list",
    "api_versions",
    "by_kind",
    "lookup",
    "version_info",
]

KUBERNETES_VERSION = "v1.36.2"

_RW = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
_META_FIELDS = frozenset({"apiVersion", "kind", "metadata"})
_SPEC_STATUS = frozenset({"spec", "status"})


@dataclass(frozen=True)
class ResourceType:
    """One served resource: where it lives, what it is called, and what its objects may hold."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    #: Subresources besides the main one: ``status`` (spec/status split) and ``log`` (pods).
    subresources: tuple[str, ...] = ()
    #: Top-level fields beyond apiVersion/kind/metadata; anything else is an unknown field.
    fields: frozenset[str] = _SPEC_STATUS
    categories: tuple[str, ...] = ()
    #: Field selectors the real server accepts beyond metadata.name and metadata.namespace.
    field_labels: tuple[str, ...] = ()
    #: Pods, Services and ServiceAccounts answer DELETE with the object (the official client parses it
    #: as one: ``delete_namespaced_service`` returns a ``V1Service``); most kinds answer with a ``Status``.
    returns_deleted_object: bool = False
    #: Path of the dict in the object that ``metadata.generation`` tracks (real strategies: ``spec``).
    generation_tracks: str | None = "spec"
    known_fields: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "known_fields", self.fields | _META_FIELDS)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """A unique, readable id: ``v1/nodes``, ``apps/v1/daemonsets``."""
        return f"{self.api_version}/{self.plural}"

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The URL path of the collection or of one object."""
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            root += f"/namespaces/{namespace}"
        root += f"/{self.plural}"
        return root if name is None else f"{root}/{name}"


_EVENT_FIELDS = frozenset(
    {
        "involvedObject",
        "reason",
        "message",
        "source",
        "firstTimestamp",
        "lastTimestamp",
        "count",
        "type",
        "eventTime",
        "series",
        "action",
        "related",
        "reportingComponent",
        "reportingInstance",
    }
)

_EVENTS_V1_FIELDS = frozenset(
    {
        "eventTime",
        "series",
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
        "regarding",
        "related",
        "note",
        "type",
        "deprecatedSource",
        "deprecatedFirstTimestamp",
        "deprecatedLastTimestamp",
        "deprecatedCount",
    }
)

RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "nodes", "Node", False, ("no",), ("status",), field_labels=("spec.unschedulable",)),
    ResourceType(
        "",
        "v1",
        "pods",
        "Pod",
        True,
        ("po",),
        ("status", "log"),
        categories=("all",),
        field_labels=(
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ),
        returns_deleted_object=True,
    ),
    ResourceType(
        "",
        "v1",
        "namespaces",
        "Namespace",
        False,
        ("ns",),
        ("status",),
        field_labels=("status.phase",),
        generation_tracks=None,
    ),
    ResourceType(
        "",
        "v1",
        "configmaps",
        "ConfigMap",
        True,
        ("cm",),
        fields=frozenset({"data", "binaryData", "immutable"}),
        generation_tracks=None,
    ),
    ResourceType(
        "",
        "v1",
        "services",
        "Service",
        True,
        ("svc",),
        ("status",),
        categories=("all",),
        returns_deleted_object=True,
        generation_tracks=None,
    ),
    ResourceType(
        "", "v1", "endpoints", "Endpoints", True, ("ep",), fields=frozenset({"subsets"}), generation_tracks=None
    ),
    # The field labels are the API server's (ToSelectableFields); ``source`` is the source's component,
    # else the reporting controller (see _selectors.py).
    ResourceType(
        "",
        "v1",
        "events",
        "Event",
        True,
        ("ev",),
        fields=_EVENT_FIELDS,
        field_labels=(
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ),
        generation_tracks=None,
    ),
    # The events.k8s.io shape gpucert writes its Events in (issue 16). As on a real server, the same
    # objects as core Events, in one store, converted on the way in and out (_events.py, _store.py); its
    # field labels are the core ones under their events.k8s.io names (AddFieldLabelConversionsForEvent).
    ResourceType(
        "events.k8s.io",
        "v1",
        "events",
        "Event",
        True,
        fields=_EVENTS_V1_FIELDS,
        field_labels=(
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "regarding.apiVersion",
            "regarding.resourceVersion",
            "regarding.fieldPath",
            "reason",
            "reportingController",
            "source",
            "type",
        ),
        generation_tracks=None,
    ),
    ResourceType(
        "",
        "v1",
        "serviceaccounts",
        "ServiceAccount",
        True,
        ("sa",),
        fields=frozenset({"secrets", "imagePullSecrets", "automountServiceAccountToken"}),
        returns_deleted_object=True,
        generation_tracks=None,
    ),
    ResourceType("apps", "v1", "daemonsets", "DaemonSet", True, ("ds",), ("status",), categories=("all",)),
    ResourceType(
        "batch", "v1", "jobs", "Job", True, (), ("status",), categories=("all",), field_labels=("status.successful",)
    ),
    # Node leases (one certify run per node at a time): no status, no generation (the real strategy sets
    # none); an update or delete carrying a stale resourceVersion is a 409 like any other kind's.
    ResourceType(
        "coordination.k8s.io", "v1", "leases", "Lease", True, fields=frozenset({"spec"}), generation_tracks=None
    ),
    *(
        ResourceType("rbac.authorization.k8s.io", "v1", plural, kind, namespaced, fields=fields, generation_tracks=None)
        for plural, kind, namespaced, fields in (
            ("roles", "Role", True, frozenset({"rules"})),
            ("rolebindings", "RoleBinding", True, frozenset({"subjects", "roleRef"})),
            ("clusterroles", "ClusterRole", False, frozenset({"rules", "aggregationRule"})),
            ("clusterrolebindings", "ClusterRoleBinding", False, frozenset({"subjects", "roleRef"})),
        )
    ),
)

_BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}
_BY_KIND = {(r.api_version, r.kind): r for r in RESOURCES}


def lookup(group: str, version: str, plural: str) -> ResourceType | None:
    return _BY_PATH.get((group, version, plural))


def by_kind(api_version: str, kind: str) -> ResourceType | None:
    """The resource that holds objects of ``apiVersion``/``kind`` (to seed objects from Python)."""
    return _BY_KIND.get((api_version, kind))


def _group_versions() -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for r in RESOURCES:
        if r.group and r.version not in groups.setdefault(r.group, []):
            groups[r.group].append(r.version)
    return groups


def version_info() -> dict[str, str]:
    """``/version``: what ``kubectl version`` and ``VersionApi`` print."""
    major, minor, _ = KUBERNETES_VERSION.lstrip("v").split(".")
    return {
        "major": major,
        "minor": minor,
        "gitVersion": KUBERNETES_VERSION,
        "gitCommit": "gpucert-sim",
        "gitTreeState": "clean",
        "buildDate": "2024-08-14T00:00:00Z",
        "goVersion": "go1.22.5",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(server_address: str) -> dict[str, Any]:
    """``/api``: the legacy core group's versions."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def api_group(name: str) -> dict[str, Any] | None:
    versions = _group_versions().get(name)
    if versions is None:
        return None
    entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": entries, "preferredVersion": entries[0]}


def api_group_list() -> dict[str, Any]:
    groups = [g for g in (api_group(name) for name in _group_versions()) if g is not None]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def _entries(resource: ResourceType) -> Iterable[dict[str, Any]]:
    main: dict[str, Any] = {
        "name": resource.plural,
        "singularName": resource.singular,
        "namespaced": resource.namespaced,
        "kind": resource.kind,
        "verbs": list(_RW),
    }
    if resource.short_names:
        main["shortNames"] = list(resource.short_names)
    if resource.categories:
        main["categories"] = list(resource.categories)
    yield main
    for sub in resource.subresources:
        verbs = ["get"] if sub == "log" else ["get", "patch", "update"]
        yield {
            "name": f"{resource.plural}/{sub}",
            "singularName": "",
            "namespaced": resource.namespaced,
            "kind": "Pod" if sub == "log" else resource.kind,
            "verbs": verbs,
        }


def api_resource_list(group: str, version: str) -> dict[str, Any] | None:
    """``/api/v1`` or ``/apis/{group}/{version}``: the resources served there, or None if none."""
    served = [r for r in RESOURCES if r.group == group and r.version == version]
    if not served:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": [entry for r in served for entry in _entries(r)],
    }
