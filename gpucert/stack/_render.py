"""The stack's manifests: a :class:`StackPlan` rendered through ``templates/stack/``, parsed back, checked.

What the templates get is data, never text to paste: every value is computed here and serialised by the
environment's ``finalize`` (:mod:`gpucert._templates`), so a model name, version or image read from a
cluster or a matrix cannot add a key, a document or an anchor. What comes back is parsed with a loader that
refuses anchors, aliases, tags, merge keys and duplicate keys, none of which the templates use: if one ever
appears, something bent a manifest. The manifests name no node: node labels that configure writes say
which nodes run the stack (``_rollout.desired_target_labels``), so a node that joins changes no manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import yaml
from yaml.events import AliasEvent, CollectionStartEvent, NodeEvent, ScalarEvent
from yaml.nodes import MappingNode

from .._io import check_out_folder
from .._templates import template_dir, yaml_environment
from ..errors import InputError, StackRenderError
from ._labels import DEPLOY_PREFIX, MANAGED, PRE_INSTALLED, dns_label_ok, driver_label, stack_label
from ._model import COMPONENTS, DriverVariant, Manifest, StackPlan
from ._record import RECORD_NAME, StackRecord

__all__ = [
    "COMMON_LABELS",
    "COUNTERS_FILE",
    "EXPORTER_PORT",
    "STACK_SERVICE_ACCOUNT",
    "STEPS",
    "TEMPLATES",
    "StackRenderError",
    "load_manifests",
    "record_manifest",
    "render_rbac",
    "render_stack",
    "write_manifests",
]

#: Install steps, in order: the namespace, RBAC, then the components (docs/design/configure.md, "Why this order").
STEPS: tuple[str, ...] = ("namespace", "rbac", *COMPONENTS)
#: Step → template, relative to ``templates/``.
TEMPLATES: Mapping[str, str] = {step: f"stack/{step}.yaml.j2" for step in STEPS}
#: The DCGM exporter's counters, relative to ``templates/``; served as ``dcgm-metrics.csv``.
COUNTERS_FILE = "stack/dcgm-metrics.csv"
#: The ServiceAccount of every stack pod (bound to nothing: no stack pod calls the API server).
STACK_SERVICE_ACCOUNT = "nvidia-stack"
EXPORTER_PORT = 9400

#: Labels on every object gpucert creates (docs/reference/labels-taints-conditions.md, "GPU stack (configure)").
COMMON_LABELS: Mapping[str, str] = {"app.kubernetes.io/part-of": "gpucert", "app.kubernetes.io/managed-by": "gpucert"}

#: The container each component's pods are about (``kubectl logs`` picks it by default).
_MAIN_CONTAINER: Mapping[str, str] = {
    "driver": "nvidia-driver",
    "container-toolkit": "nvidia-container-toolkit",
    "device-plugin": "nvidia-device-plugin",
    "dcgm-exporter": "nvidia-dcgm-exporter",
    "gpu-feature-discovery": "gpu-feature-discovery",
}


# --- the templates' context -----------------------------------------------------------------------------


def _affinity(component: str) -> dict[str, Any]:
    # The GPU Operator's per-node opt-out: `nvidia.com/gpu.deploy.<component>=false` keeps a component off
    # a node. NotIn also matches nodes without the label, so nothing has to be written to opt in. For the
    # driver, `pre-installed` (the GPU Operator's mark of a host driver) keeps it off too: configure never
    # labels such a node for a driver variant, and this holds even if someone else did.
    refused = ["false", PRE_INSTALLED] if component == "driver" else ["false"]
    affinity: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": f"{DEPLOY_PREFIX}{component}", "operator": "NotIn", "values": refused}
                        ]
                    }
                ]
            }
        }
    }
    if component == "driver":
        # Never two driver pods on one node: while a node moves from one variant to another (its
        # <prefix>/driver label changed), the new pod waits until the old one has unloaded its modules.
        affinity["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {**COMMON_LABELS, "app.kubernetes.io/component": "driver"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    return affinity


def _daemonset(
    plan: StackPlan,
    component: str,
    *,
    name: str,
    version: str,
    image: str,
    node_selector: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    pod_annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    selector = {"app.kubernetes.io/name": f"nvidia-{component}", "app.kubernetes.io/instance": name}
    labels = {
        **COMMON_LABELS,
        "app.kubernetes.io/component": component,
        **selector,
        "app.kubernetes.io/version": version,
    }
    # The rolling-update budget. A driver pod being replaced takes every GPU of its node away (running jobs
    # lose them), so drivers go one node at a time. The other components restart without touching running GPU
    # work (a device plugin restart keeps allocated devices; an exporter restart is a gap in metrics): 10 %
    # keeps a rollout on a thousand nodes short while a broken image still stops after a tenth of the fleet
    # (the controller waits for the replaced pods to be Ready).
    max_unavailable = 1 if component == "driver" else "10%"
    return {
        "name": name,
        "namespace": plan.namespace,
        "labels": labels,
        "annotations": {f"{plan.label_prefix}/release": plan.release, **(annotations or {})},
        # The selector is immutable: it names the DaemonSet, never a version, so upgrades roll in place.
        "selector": selector,
        "pod_labels": dict(labels),
        "pod_annotations": {
            "kubectl.kubernetes.io/default-container": _MAIN_CONTAINER[component],
            **(pod_annotations or {}),
        },
        "node_selector": {stack_label(plan.label_prefix): MANAGED, **(node_selector or {})},
        "affinity": _affinity(component),
        # gpucert's own taints: a node being onboarded or found unfit still runs its stack, which
        # certification and diagnosis need.
        "tolerations": [
            {"key": key, "operator": "Exists", "effect": "NoSchedule"}
            for key in (f"{plan.label_prefix}/uncertified", f"{plan.label_prefix}/unhealthy", "nvidia.com/gpu")
        ],
        "update_strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": max_unavailable}},
        "image": image,
        "service_account": STACK_SERVICE_ACCOUNT,
    }


def _driver_context(plan: StackPlan, variant: DriverVariant) -> dict[str, Any]:
    # The GPU models this variant's driver version was chosen for: for a person reading the cluster
    # (`kubectl describe`), and the one place model names (read from nodes) reach a manifest.
    models = sorted(model for model, version in plan.model_driver.items() if version == variant.version)
    return _daemonset(
        plan,
        "driver",
        name=f"nvidia-driver-{variant.id}",
        version=variant.version,
        image=variant.image,
        node_selector={driver_label(plan.label_prefix): variant.id},
        annotations={
            f"{plan.label_prefix}/driver-version": variant.version,
            f"{plan.label_prefix}/driver-os": variant.os_tag,
            f"{plan.label_prefix}/gpu-models": json.dumps(models, ensure_ascii=False),
        },
    )


def _component_context(plan: StackPlan, component: str, **pod_annotations: str) -> dict[str, Any]:
    try:
        version, image = plan.versions[component], plan.images[component]
    except KeyError as exc:
        raise StackRenderError(f"{TEMPLATES[component]}: the plan has no version or image for {exc}") from None
    return _daemonset(
        plan, component, name=f"nvidia-{component}", version=version, image=image, pod_annotations=pod_annotations
    )


# --- rendering and parsing ------------------------------------------------------------------------------


def _refuse(problem: str, mark: Any) -> yaml.constructor.ConstructorError:
    return yaml.constructor.ConstructorError(None, None, f"{problem} is not allowed in a manifest", mark)


#: libyaml's parser where PyYAML was built with it (a benchmark Job per node is parsed; the pure-Python
#: composer was 7 % of a 1,000-node certify), else PyYAML's own: the same events and marks either way.
_SafeBase: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _refuse_references(text: str) -> None:
    """Raise for anchors, aliases and explicit tags, which no template writes: a value that smuggled one
    in is caught here, before any document is built (an alias bomb never expands)."""
    for event in yaml.parse(text, Loader=_SafeBase):
        if isinstance(event, AliasEvent):
            raise _refuse("an alias (*name)", event.start_mark)
        if isinstance(event, NodeEvent) and event.anchor is not None:
            raise _refuse("an anchor (&name)", event.start_mark)
        if isinstance(event, ScalarEvent | CollectionStartEvent) and event.tag is not None:
            raise _refuse(f"an explicit tag ({event.tag})", event.start_mark)


class _StrictLoader(_SafeBase):  # type: ignore[valid-type,misc]
    """A SafeLoader that refuses merge keys and duplicate keys (:func:`_refuse_references` the rest)."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _refuse("a merge key (<<)", key_node.start_mark)
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise _refuse("a key that is a mapping or a list", key_node.start_mark) from None
            if key in seen:
                raise _refuse(f"a duplicate key ({key!r})", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]


def load_manifests(text: str, source: str) -> list[dict[str, Any]]:
    """The Kubernetes objects of multi-document YAML, in order; raises :class:`StackRenderError` naming
    ``source`` for an anchor, alias, tag, merge key or duplicate key, or a document that is not a mapping
    with ``apiVersion``, ``kind`` and ``metadata.name`` (empty documents are skipped)."""
    try:
        # A SafeLoader subclass: no Python objects, and stricter still (see _StrictLoader).
        _refuse_references(text)
        documents = list(yaml.load_all(text, Loader=_StrictLoader))
    except yaml.YAMLError as exc:
        raise StackRenderError(f"{source}: not valid YAML: {exc}") from None
    objects = []
    for number, doc in enumerate(documents, start=1):
        if doc is None:
            continue
        where = f"{source}, document {number}"
        if not isinstance(doc, dict):
            raise StackRenderError(f"{where}: not a mapping but {type(doc).__name__}")
        for field in ("apiVersion", "kind"):
            if not isinstance(doc.get(field), str) or not doc[field]:
                raise StackRenderError(f"{where}: no {field}")
        metadata = doc.get("metadata")
        if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str) or not metadata["name"]:
            raise StackRenderError(f"{where} ({doc['kind']}): no metadata.name")
        objects.append(doc)
    return objects


def _render(template: str, context: Mapping[str, Any]) -> list[dict[str, Any]]:
    try:
        text = yaml_environment().get_template(template).render(**context)
    except jinja2.TemplateError as exc:  # StrictUndefined's UndefinedError among them
        raise StackRenderError(f"{template}: {exc}") from None
    except (TypeError, ValueError) as exc:
        # yaml_value could not serialise a value (not JSON data, or NaN): a renderer bug.
        raise StackRenderError(f"{template}: a value cannot be written into a manifest: {exc}") from None
    objects = load_manifests(text, template)
    if not objects:
        raise StackRenderError(f"{template}: rendered no object")
    return objects


def record_manifest(plan: StackPlan) -> Manifest:
    """The ConfigMap ``gpucert-stack`` recording what ``plan`` applies (:mod:`._record`), in the namespace step;
    built in code, not from a template, so no value (a version, a registry) passes through text."""
    obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": RECORD_NAME, "namespace": plan.namespace, "labels": dict(COMMON_LABELS)},
        "data": StackRecord.of(plan).data(),
    }
    return Manifest("namespace", obj)


def render_rbac(stack_namespace: str, operator_namespace: str | None = None) -> list[Manifest]:
    """gpucert's ServiceAccounts and roles (the ``rbac`` step); with ``operator_namespace`` (where the GPU
    Operator runs the stack) also the Roles there that let operate list the operator's exporter Endpoints
    (``gpucert-runtime-exporters``) and configure grant that (``gpucert-configure-exporters``)."""
    context = {"stack_namespace": stack_namespace, "labels": dict(COMMON_LABELS)}
    if operator_namespace:
        context["operator_namespace"] = operator_namespace
    return [Manifest("rbac", obj) for obj in _render(TEMPLATES["rbac"], context)]


def render_stack(plan: StackPlan, *, record: bool = True) -> list[Manifest]:
    """Every object of the stack, in install order: the namespace and (``record``) :func:`record_manifest`,
    RBAC, then the components in :data:`COMPONENTS` order (one driver DaemonSet per ``plan.drivers`` variant).

    Raises :class:`StackRenderError` when a template is missing a value, does not render into Kubernetes
    objects, or the plan lacks a component's version or image.
    """
    for variant in plan.drivers:
        # The id is a DaemonSet name suffix and a label value: a DNS label, which the planner promises.
        if not dns_label_ok(variant.id) or len(f"nvidia-driver-{variant.id}") > 63:
            raise StackRenderError(f"{TEMPLATES['driver']}: driver variant id {variant.id!r} is not a DNS label")
    manifests: list[Manifest] = []

    def add(step: str, context: Mapping[str, Any]) -> None:
        manifests.extend(Manifest(step, obj) for obj in _render(TEMPLATES[step], context))

    add(
        "namespace",
        {
            # Not `namespace`: that name is a Jinja global, which a forgotten value would silently become.
            "stack_namespace": plan.namespace,
            # The driver and toolkit pods are privileged: Pod Security admission must allow them here.
            "labels": {**COMMON_LABELS, "pod-security.kubernetes.io/enforce": "privileged"},
            "annotations": {f"{plan.label_prefix}/release": plan.release},
        },
    )
    if record:
        manifests.append(record_manifest(plan))
    manifests += render_rbac(plan.namespace)
    for variant in plan.drivers:
        add("driver", {"ds": _driver_context(plan, variant)})
    add("container-toolkit", {"ds": _component_context(plan, "container-toolkit")})
    add("device-plugin", {"ds": _component_context(plan, "device-plugin")})
    csv_text = (template_dir() / COUNTERS_FILE).read_text(encoding="utf-8")
    digest = hashlib.sha256(csv_text.encode()).hexdigest()
    exporter = _component_context(plan, "dcgm-exporter", **{f"{plan.label_prefix}/counters-sha256": digest})
    add(
        "dcgm-exporter",
        {
            "ds": exporter,
            "counters": {
                "name": "nvidia-dcgm-exporter-counters",
                "labels": exporter["labels"],
                "data": {"dcgm-metrics.csv": csv_text},
            },
            "service": {
                "name": "nvidia-dcgm-exporter",
                # part-of + component are what the simulator's Endpoints controller keys on.
                "labels": exporter["labels"],
                "selector": exporter["selector"],
                "port": EXPORTER_PORT,
            },
        },
    )
    add("gpu-feature-discovery", {"ds": _component_context(plan, "gpu-feature-discovery")})
    return manifests


# --- --dry-run DIR --------------------------------------------------------------------------------------


class _NoAliasDumper(yaml.SafeDumper):
    """SafeDumper that writes a shared object out twice instead of as an anchor and an alias, so the
    files read back through the same strict loader, and multi-line strings (scripts, the counters file)
    as literal blocks a person can read."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # The emitter falls back to a quoted scalar by itself where a literal block cannot hold the value
    # exactly (trailing spaces, control characters), so this never changes what is read back.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_NoAliasDumper.add_representer(str, _represent_str)


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; these are manifests to read and apply, not secrets
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_manifests(manifests: Iterable[Manifest], directory: Path) -> list[Path]:
    """Write ``manifests`` for ``--dry-run DIR``, one file per install step, ``NN-<step>.yaml`` in install
    order (``kubectl apply -f DIR`` keeps it), each written whole or not at all; returns the paths written.

    A file an earlier run left for a step without manifests now is removed, so the folder never holds
    objects the plan does not. Raises :class:`InputError` when ``directory`` cannot be made or written
    (before anything is written), ValueError for an unknown step.
    """
    check_output_dir(directory)
    by_step: dict[str, list[Mapping[str, Any]]] = {}
    for manifest in manifests:
        if manifest.step not in STEPS:
            raise ValueError(f"unknown install step {manifest.step!r}")
        by_step.setdefault(manifest.step, []).append(manifest.obj)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for number, step in enumerate(STEPS, start=1):
        path = directory / f"{number:02d}-{step}.yaml"
        if step not in by_step:
            path.unlink(missing_ok=True)
            continue
        text = yaml.dump_all(
            [_plain(obj) for obj in by_step[step]],
            Dumper=_NoAliasDumper,
            sort_keys=False,
            explicit_start=True,
            default_flow_style=False,
        )
        _atomic_write(path, text)
        written.append(path)
    return written


def check_output_dir(directory: Path) -> None:
    """Return if ``directory`` is a folder that can be written, or can be made where it is named; raise
    :class:`InputError` naming ``--dry-run`` and the path otherwise (an existing file, a path through a file, a
    folder that cannot be written)."""
    if directory.exists() and not directory.is_dir():
        raise InputError(f"--dry-run {directory}: is a file, not a folder; name a folder for the manifests")
    check_out_folder(directory, f"--dry-run {directory}")


def _plain(value: Any) -> Any:
    # Manifest.obj is a Mapping (perhaps read-only); the dumper wants dicts and lists.
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_plain(v) for v in value]
    return value
