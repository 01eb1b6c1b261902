"""What the fleet was configured with, kept in the cluster: the ConfigMap ``gpucert-stack``.

The stack's DaemonSets pick their nodes by label, so a configure limited to some nodes (onboarding one that
joined) re-applies the manifests the whole fleet runs: rendered from another release or registry they would
roll every node, and an air-gapped fleet would stop pulling images. So a full configure applies this record
with the stack, and a run limited to nodes takes from it whatever it was not given (:func:`follow_record`).
Its data is plain strings for ``kubectl get`` to read (:meth:`StackRecord.data`) and depends on neither the
nodes nor the time, so re-applying it on an unchanged fleet writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import InputError
from ..kube import Kube
from ._matrix import RELEASE_COMPONENTS
from ._model import COMPONENTS, StackPlan, StackRequest

__all__ = ["RECORD_FORMAT", "RECORD_NAME", "StackRecord", "follow_record", "read_record", "record_departures"]

#: The ConfigMap, in the stack's namespace (the configure role may read and write ConfigMaps there).
RECORD_NAME = "gpucert-stack"
RECORD_FORMAT = "1"

_PINNED, _VERSION, _IMAGE = "pinned.", "version.", "image."


@dataclass(frozen=True)
class StackRecord:
    """What a full configure applied: the request that renders its manifests again, and what they held."""

    release: str
    #: Component → version asked for (``--set``).
    pinned: Mapping[str, str] = field(default_factory=dict)
    #: The registry asked for; None: the matrix's.
    registry: str | None = None
    #: Release-wide component → version and → image, as rendered.
    versions: Mapping[str, str] = field(default_factory=dict)
    images: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, plan: StackPlan) -> StackRecord:
        """The record of ``plan``: its release, and the pins and registry of the request it was made from."""
        registry = plan.request.registry
        return cls(
            release=plan.release,
            # As the planner reads them, so that a rerun from the record asks for the same thing.
            pinned={c: v.strip() for c, v in sorted(plan.request.versions.items())},
            registry=registry.strip().rstrip("/") if registry is not None else None,
            versions=dict(plan.versions),
            images=dict(plan.images),
        )

    def data(self) -> dict[str, str]:
        """The ConfigMap's ``data``: ``format`` (``1``), ``release``, ``registry`` (when asked for), and per
        component ``pinned.<c>`` (asked for), ``version.<c>`` and ``image.<c>`` (as rendered)."""
        data = {"format": RECORD_FORMAT, "release": self.release}
        if self.registry is not None:
            data["registry"] = self.registry
        for prefix, values in ((_PINNED, self.pinned), (_VERSION, self.versions), (_IMAGE, self.images)):
            data.update({prefix + c: v for c, v in values.items()})
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, Any], where: str) -> StackRecord:
        """The record a ConfigMap's ``data`` holds; raises :class:`InputError` naming ``where`` and what is
        wrong (a format other than this gpucert's, no release, a key it does not know, a value not text)."""

        def refuse(problem: str) -> InputError:
            return InputError(
                f"{where}, the record of the stack the fleet was configured with: {problem}. A full configure "
                "rewrites it; a configure of some nodes given release, versions and registry does not read it"
            )

        if not isinstance(data, Mapping):
            raise refuse("its data is not a map")
        odd = sorted(str(k) for k, v in data.items() if not isinstance(k, str) or not isinstance(v, str))
        if odd:
            raise refuse(f"values that are not text: {', '.join(odd)}")
        if data.get("format") != RECORD_FORMAT:
            raise refuse(f"format {data.get('format')!r}, but this gpucert reads format {RECORD_FORMAT}")
        release = data.get("release", "").strip()
        if not release:
            raise refuse("no release")
        pinned: dict[str, str] = {}
        versions: dict[str, str] = {}
        images: dict[str, str] = {}
        unknown = []
        for key, value in data.items():
            prefix, _, component = key.partition(".")
            target = {_PINNED: pinned, _VERSION: versions, _IMAGE: images}.get(prefix + ".")
            known = COMPONENTS if prefix + "." == _PINNED else RELEASE_COMPONENTS
            if target is not None and component in known:
                target[component] = value
            elif key not in ("format", "release", "registry"):
                unknown.append(key)
        if unknown:
            raise refuse(f"keys it does not know: {', '.join(sorted(unknown))}")
        return cls(release, pinned, data.get("registry"), versions, images)


def read_record(kube: Kube, namespace: str) -> StackRecord | None:
    """The record in ``namespace``, or None when no full configure has written one yet; raises
    :class:`InputError` when the ConfigMap is there but is not a record this gpucert reads."""
    obj = kube.find("v1", "ConfigMap", RECORD_NAME, namespace)
    if obj is None:
        return None
    return StackRecord.from_data(obj.get("data") or {}, f"ConfigMap {namespace}/{RECORD_NAME}")


def follow_record(asked: StackRequest, record: StackRecord | None) -> tuple[StackRequest, tuple[str, ...]]:
    """``asked`` with what it leaves unset taken from ``record``, and the fields taken (``release``,
    ``versions``, ``registry``, in that order). Each field is taken on its own and whole: a version pinned
    in the call replaces every recorded pin; an explicit release keeps the recorded pins and registry."""
    if record is None:
        return asked, ()
    # No pins and no registry in the record are what an unset field means anyway: not counted as taken.
    offered: dict[str, Any] = {
        "release": record.release,
        "versions": dict(record.pinned) or None,
        "registry": record.registry,
    }
    taken = {name: value for name, value in offered.items() if name in asked.unset() and value is not None}
    return replace(asked, **taken), tuple(taken)


def record_departures(record: StackRecord | None, plan: StackPlan) -> list[str]:
    """What ``plan`` renders otherwise than ``record`` says the fleet runs, one line per change
    (``release 25.3.4 → 26.3.1``, ``device-plugin <image> → <image>``): each is a rollout of the whole
    fleet, since a run limited to some nodes re-applies the DaemonSets of every node."""
    if record is None:
        return []
    out = []
    if plan.release != record.release:
        out.append(f"release {record.release} → {plan.release}")
    for component in RELEASE_COMPONENTS:
        was, now = record.images.get(component), plan.images.get(component)
        if was is not None and was != now:
            out.append(f"{component} {was} → {now}")
    return out
