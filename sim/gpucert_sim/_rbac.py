"""Kubernetes RBAC, evaluated: may this subject make this request, under these roles and bindings?

The rules are those of the API server's RBAC authorizer (plugin/pkg/auth/authorizer/rbac/rbac.go and
pkg/apis/rbac/v1/evaluation_helpers.go), so a test can check recorded requests (``_requests.py``)
against rendered manifests exactly as a cluster would:

* a rule allows a resource request when its verb, API group, resource and (if the rule names any)
  resource name match; ``*`` matches any verb, group or resource; a subresource is matched as
  ``resource/subresource`` (``pods/log``), or by ``*/subresource``;
* a non-resource request (``/version``, ``/apis``) is allowed by a rule's ``nonResourceURLs``: an exact
  path, ``*``, or a prefix ending in ``*`` — only through a ClusterRoleBinding;
* a ClusterRoleBinding grants its ClusterRole's rules everywhere (cluster-scoped objects and every
  namespace); a RoleBinding grants its Role's (or ClusterRole's) rules in its own namespace only;
* a ServiceAccount ``system:serviceaccount:<ns>:<name>`` is also in the groups ``system:serviceaccounts``,
  ``system:serviceaccounts:<ns>`` and ``system:authenticated``.

RBAC only ever allows: there are no deny rules, so a request is allowed when any one rule allows it.
:data:`DISCOVERY_RULES` is what every authenticated user holds by default (the ``system:discovery`` and
``system:public-info-viewer`` ClusterRoles).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._requests import ApiRequest

__all__ = ["DISCOVERY_RULES", "Grants", "grants_of", "rule_allows", "subject_groups"]

Rule = Mapping[str, Any]
_RBAC_GROUP = "rbac.authorization.k8s.io"
_SA_PREFIX = "system:serviceaccount:"

#: The default ClusterRoles ``system:discovery`` and ``system:public-info-viewer``, bound to every
#: authenticated user: discovery and the server's version and health.
DISCOVERY_RULES: tuple[Rule, ...] = (
    {
        "verbs": ["get"],
        "nonResourceURLs": [
            "/api",
            "/api/*",
            "/apis",
            "/apis/*",
            "/healthz",
            "/livez",
            "/openapi",
            "/openapi/*",
            "/readyz",
            "/version",
            "/version/",
        ],
    },
)


def _matches(allowed: Iterable[str], value: str) -> bool:
    return any(a in ("*", value) for a in allowed)


def _resource_matches(rule: Rule, combined: str, sub: str) -> bool:
    for allowed in rule.get("resources") or ():
        if allowed in ("*", combined):
            return True
        if sub and allowed == f"*/{sub}":
            return True
    return False


def _url_matches(rule: Rule, path: str) -> bool:
    for allowed in rule.get("nonResourceURLs") or ():
        if allowed in ("*", path):
            return True
        if allowed.endswith("*") and path.startswith(allowed.rstrip("*")):
            return True
    return False


def rule_allows(rule: Rule, request: ApiRequest) -> bool:
    """Whether one PolicyRule (a mapping as in a manifest) allows ``request``, scope aside."""
    if not _matches(rule.get("verbs") or (), request.verb):
        return False
    if not request.resource_request:
        return _url_matches(rule, request.path)
    names = rule.get("resourceNames") or ()
    return (
        _matches(rule.get("apiGroups") or (), request.group)
        and _resource_matches(rule, request.combined_resource, request.subresource)
        and (not names or request.name in names)
    )


@dataclass(frozen=True)
class Grants:
    """What one subject holds: rules in force everywhere, and rules in force in one namespace each."""

    cluster: tuple[Rule, ...] = ()
    namespaced: Mapping[str, tuple[Rule, ...]] = field(default_factory=dict)

    def rules_for(self, request: ApiRequest) -> tuple[Rule, ...]:
        """The rules that apply where ``request`` is: the cluster's, plus its namespace's for a namespaced one."""
        if not request.resource_request or not request.namespace:
            return self.cluster
        return (*self.cluster, *self.namespaced.get(request.namespace, ()))

    def allows(self, request: ApiRequest) -> bool:
        """Whether any rule in force where ``request`` is allows it."""
        return any(rule_allows(rule, request) for rule in self.rules_for(request))

    def allowing(self, request: ApiRequest) -> list[Rule]:
        """The rules that allow ``request`` (empty when it is refused)."""
        return [rule for rule in self.rules_for(request) if rule_allows(rule, request)]


def subject_groups(user: str) -> tuple[str, ...]:
    """The groups the API server puts a user in: a ServiceAccount's three, or just ``system:authenticated``."""
    if user.startswith(_SA_PREFIX):
        namespace = user.removeprefix(_SA_PREFIX).split(":", 1)[0]
        return ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated")
    return ("system:authenticated",)


def _binds(subjects: Sequence[Mapping[str, Any]], user: str, groups: Sequence[str]) -> bool:
    for subject in subjects:
        kind, name = subject.get("kind"), subject.get("name")
        if kind == "ServiceAccount" and user == f"{_SA_PREFIX}{subject.get('namespace', '')}:{name}":
            return True
        if kind == "User" and name == user:
            return True
        if kind == "Group" and name in groups:
            return True
    return False


def grants_of(objects: Iterable[Mapping[str, Any]], user: str, *, extra_cluster_rules: Sequence[Rule] = ()) -> Grants:
    """What ``user`` holds through the Roles, ClusterRoles and their bindings among ``objects`` (other
    kinds are ignored), plus ``extra_cluster_rules`` (say, :data:`DISCOVERY_RULES`).

    A binding whose role is not among ``objects`` grants nothing, as on a cluster where it is missing.
    """
    objects = [o for o in objects if str(o.get("apiVersion", "")).startswith(f"{_RBAC_GROUP}/")]
    roles: dict[tuple[str, str, str], tuple[Rule, ...]] = {}
    for obj in objects:
        if obj.get("kind") in ("Role", "ClusterRole"):
            meta = obj.get("metadata") or {}
            where = meta.get("namespace", "") if obj["kind"] == "Role" else ""
            roles[(obj["kind"], where, meta.get("name", ""))] = tuple(obj.get("rules") or ())
    groups = subject_groups(user)
    cluster: list[Rule] = list(extra_cluster_rules)
    namespaced: dict[str, list[Rule]] = {}
    for obj in objects:
        kind = obj.get("kind")
        if kind not in ("RoleBinding", "ClusterRoleBinding") or not _binds(obj.get("subjects") or (), user, groups):
            continue
        ref = obj.get("roleRef") or {}
        if kind == "ClusterRoleBinding":
            if ref.get("kind") == "ClusterRole":  # the API server refuses any other roleRef here
                cluster.extend(roles.get(("ClusterRole", "", ref.get("name", "")), ()))
            continue
        namespace = (obj.get("metadata") or {}).get("namespace", "")
        where = namespace if ref.get("kind") == "Role" else ""
        rules = roles.get((str(ref.get("kind")), where, ref.get("name", "")), ())
        # A RoleBinding grants resource rules in its namespace only; nonResourceURLs do not apply there.
        namespaced.setdefault(namespace, []).extend(r for r in rules if r.get("resources"))
    return Grants(tuple(cluster), {ns: tuple(rules) for ns, rules in namespaced.items()})
