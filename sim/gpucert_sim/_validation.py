"""Object validation: the 422s a real API server answers for specs it refuses.

The simulator stores what it is sent, so a manifest the real server refuses would pass every test and
fail only on a real cluster. A few of kube-apiserver's validation rules are checked here, ones gpucert's
own manifests have got wrong or could:

* a ``batch/v1`` Job needs its ``spec`` with a pod ``template`` (the real server answers, among others,
  ``spec.template.spec.containers: Required value``);
* a node selector term's ``matchFields`` requirement (a Pod's, or a Job's or DaemonSet's pod template's,
  required or preferred node affinity) has key ``metadata.name``, operator ``In`` or ``NotIn`` and exactly
  one value: ``In [a, b]`` is refused with "must be only one value when `operator` is 'In' or 'NotIn' for
  node field selector", so a pod for either of two nodes takes two terms (terms are ORed);
* an Event is in the namespace of the object it is about, one about a cluster-scoped object (a Node) in
  ``default`` (``involvedObject.namespace: … does not match event.namespace``).

The first refusal found is answered, with its field path (``spec.template.spec.affinity.nodeAffinity.
requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].values``), as
:func:`~gpucert_sim._status.invalid` reports it; the real server lists every one. Writes through the
``status`` subresource are not validated, as the real server checks only the status there.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ._resources import ResourceType
from ._status import invalid

__all__ = ["validate"]

# Where each kind the simulator serves keeps a pod spec.
_POD_SPECS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "Job": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
}
_NODE_FIELD_KEYS = frozenset({"metadata.name"})
_ONE_VALUE = "must be only one value when `operator` is 'In' or 'NotIn' for node field selector"


def validate(resource: ResourceType, obj: Mapping[str, Any]) -> None:
    """Raise a 422 ``ApiError`` when the real API server would refuse to store ``obj`` (see the module
    docstring for which refusals are modelled)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or meta.get("generateName") or "")
    spec = obj.get("spec")
    if resource.kind == "Job" and not (isinstance(spec, Mapping) and isinstance(spec.get("template"), Mapping)):
        raise invalid(
            resource.kind, resource.group, name, "spec.template.spec.containers", "FieldValueRequired", "Required value"
        )
    if resource.kind == "Event":
        _check_event_namespace(resource, obj, name)
    path = _POD_SPECS.get(resource.kind)
    if path is None:
        return
    pod_spec: Any = obj
    for key in path:
        pod_spec = pod_spec.get(key) if isinstance(pod_spec, Mapping) else None
    if not isinstance(pod_spec, Mapping):
        return
    for field, reason, message in _node_affinity_errors(pod_spec, ".".join(path)):
        raise invalid(resource.kind, resource.group, name, field, reason, message)


def _check_event_namespace(resource: ResourceType, event: Mapping[str, Any], name: str) -> None:
    """An Event lives in its object's namespace; one about a cluster-scoped object (a Node) in ``default``
    (through either Event API: the real server stores both as core Events and checks them alike)."""
    involved = _mapping(event.get("involvedObject") or event.get("regarding"))
    involved_ns = str(involved.get("namespace") or "")
    event_ns = str(_mapping(event.get("metadata")).get("namespace") or "")
    if event_ns != involved_ns and not (involved_ns == "" and event_ns == "default"):
        raise invalid(
            "Event",
            resource.group,
            name,
            "involvedObject.namespace",
            "FieldValueInvalid",
            f'Invalid value: "{involved_ns}": does not match event.namespace',
        )


def _node_affinity_errors(pod_spec: Mapping[str, Any], at: str) -> Iterator[tuple[str, str, str]]:
    """(field, cause reason, message) of each ``matchFields`` requirement the real server refuses."""
    node_affinity = _mapping(_mapping(pod_spec.get("affinity")).get("nodeAffinity"))
    at = f"{at}.affinity.nodeAffinity"
    required = _mapping(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    for i, term in enumerate(_list(required.get("nodeSelectorTerms"))):
        yield from _term_errors(term, f"{at}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]")
    for i, preferred in enumerate(_list(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution"))):
        yield from _term_errors(
            _mapping(preferred).get("preference"),
            f"{at}.preferredDuringSchedulingIgnoredDuringExecution[{i}].preference",
        )


def _term_errors(term: Any, at: str) -> Iterator[tuple[str, str, str]]:
    # The real server's validateNodeFieldSelectorRequirement, in its order.
    for j, item in enumerate(_list(_mapping(term).get("matchFields"))):
        req = _mapping(item)
        here = f"{at}.matchFields[{j}]"
        operator, key, values = req.get("operator"), req.get("key"), _list(req.get("values"))
        if operator in ("In", "NotIn"):
            if len(values) != 1:
                yield f"{here}.values", "FieldValueRequired", f"Required value: {_ONE_VALUE}"
        else:
            yield f"{here}.operator", "FieldValueInvalid", f'Invalid value: "{operator}": not a valid selector operator'
        if key not in _NODE_FIELD_KEYS:
            yield f"{here}.key", "FieldValueInvalid", f'Invalid value: "{key}": not a valid field selector key'


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
