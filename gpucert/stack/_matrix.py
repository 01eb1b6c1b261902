"""The compatibility matrix: which driver, toolkit, device plugin and exporter go together, and where.

:func:`load_matrix` reads ``gpucert/data/compatibility.yaml`` (docs/design/configure.md, "The compatibility
matrix"), or a user's file of the same shape, into frozen models that forbid unknown keys and check every
fact the planner relies on. A bad file is a :class:`~gpucert.errors.MatrixError` whose lines each name the
file and the field path (``compatibility.yaml: releases[1].kubernetes.max: ...``).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .._yaml import UniqueKeyLoader
from ..errors import MatrixError
from ._model import COMPONENTS

__all__ = [
    "RELEASE_COMPONENTS",
    "ComponentPin",
    "DriverBranch",
    "DriverChoice",
    "KubernetesRange",
    "Matrix",
    "Release",
    "driver_key",
    "load_matrix",
    "minor_key",
    "model_key",
]

#: The components a release pins for every node; the driver is chosen per GPU model and OS instead.
RELEASE_COMPONENTS: tuple[str, ...] = tuple(c for c in COMPONENTS if c != "driver")

_DRIVER_VERSION = r"^\d{3,4}\.\d{1,3}(\.\d{1,3})?$"
_BRANCH = r"^\d{3,4}$"
_RELEASE_NAME = r"^\d{2}\.\d{1,2}\.\d{1,3}$"
_K8S_MINOR = r"^1\.\d{1,3}$"
_OS_TAG = r"^(ubuntu\d{2}\.\d{2}|rhel\d{1,2}\.\d{1,2}|rocky\d{1,2}\.\d{1,2})$"
_COMPONENT_VERSION = r"^v?\d+(\.\d+){1,3}(-[0-9A-Za-z][0-9A-Za-z.]*)*$"
# An OCI tag: at most 128 characters of word characters, dots and dashes, not starting with either.
_IMAGE_TAG = r"^\w[\w.-]{0,127}$"
# A repository with its registry host first: ``host[:port]/path/name``, lower case as OCI requires.
_IMAGE_REPO = r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:\d+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+$"
_CUDA = r"^\d{1,2}(\.\d{1,2})?$"


def driver_key(version: str) -> tuple[int, ...]:
    """The driver version as numbers, for ordering (``"580.95.05"`` → ``(580, 95, 5)``); ``ValueError``
    when ``version`` is not a dotted number."""
    return tuple(int(part) for part in version.split("."))


def minor_key(minor: str) -> tuple[int, int]:
    """A Kubernetes minor version (``"1.30"``) as numbers; ``ValueError`` when it is not one."""
    major, _, rest = minor.partition(".")
    return int(major), int(rest)


def model_key(model: str) -> str:
    """The form GPU model names are compared in: case-folded, dashes as spaces, single spaces.

    GPU feature discovery publishes the NVML name with spaces as dashes (``NVIDIA-A100-SXM4-80GB``) and
    readers turn them back into spaces, so ``NVIDIA A100-SXM4-80GB`` must match ``NVIDIA A100 SXM4 80GB``.
    """
    return " ".join(model.replace("-", " ").split()).casefold()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _unique(values: list[str], what: str) -> list[str]:
    dups = dict.fromkeys(v for i, v in enumerate(values) if v in values[:i])
    if dups:
        raise ValueError(f"{what} listed more than once: {', '.join(dups)}")
    return values


def _unique_list(what: str) -> AfterValidator:
    """A field validator refusing a list that names one ``what`` twice."""
    return AfterValidator(lambda values: _unique(values, what))


class KubernetesRange(_Strict):
    """The Kubernetes minor versions a release supports, both ends included."""

    min: str = Field(pattern=_K8S_MINOR)
    max: str = Field(pattern=_K8S_MINOR)

    @field_validator("max")
    @classmethod
    def _not_below_min(cls, value: str, info: ValidationInfo) -> str:
        low = info.data.get("min")
        if low is not None and minor_key(value) < minor_key(low):
            raise ValueError(f"{value} is below min {low}")
        return value

    def covers(self, minor: tuple[int, int]) -> bool:
        """Whether the Kubernetes minor version ``minor`` (``(1, 30)``) lies in the range."""
        return minor_key(self.min) <= minor <= minor_key(self.max)

    def __str__(self) -> str:
        return f"{self.min}–{self.max}"


class ComponentPin(_Strict):
    """A component's version in a release and the image tag that carries it."""

    version: str = Field(pattern=_COMPONENT_VERSION)
    tag: str = Field(pattern=_IMAGE_TAG)

    @model_validator(mode="after")
    def _tag_carries_version(self) -> ComponentPin:
        # The tag may add an image variant (``-ubuntu20.04``, ``-distroless``) but not another version.
        if self.tag != self.version and not self.tag.startswith(self.version + "-"):
            raise ValueError(f"tag {self.tag!r} is not version {self.version!r} or a variant of it")
        return self


class DriverChoice(_Strict):
    """The driver branches a release supports and the driver it installs by default."""

    branches: list[str] = Field(min_length=1)
    default: str = Field(pattern=_DRIVER_VERSION)

    @field_validator("branches")
    @classmethod
    def _branches_well_formed(cls, value: list[str]) -> list[str]:
        bad = [b for b in value if not re.match(_BRANCH, b)]
        if bad:
            raise ValueError(f"not driver branches (3-4 digits): {', '.join(map(repr, bad))}")
        return _unique(value, "branch")

    @field_validator("default")
    @classmethod
    def _default_in_branches(cls, value: str, info: ValidationInfo) -> str:
        branches = info.data.get("branches")
        branch = value.partition(".")[0]
        if branches is not None and branch not in branches:
            raise ValueError(f"{value} is of branch {branch}, not one of the release's ({', '.join(branches)})")
        return value


class Release(_Strict):
    """One GPU Operator release's component matrix."""

    name: str = Field(pattern=_RELEASE_NAME)
    source: str = Field(min_length=1)
    kubernetes: KubernetesRange
    os: list[str] = Field(min_length=1)
    runtimes: Annotated[list[Literal["containerd", "cri-o"]], _unique_list("runtime")] = Field(min_length=1)
    driver: DriverChoice
    dcgm: str = Field(pattern=r"^\d+\.\d+\.\d+$")
    components: dict[str, ComponentPin]

    @field_validator("os")
    @classmethod
    def _os_tags(cls, value: list[str]) -> list[str]:
        bad = [t for t in value if not re.match(_OS_TAG, t)]
        if bad:
            raise ValueError(f"not driver-image OS tags (ubuntuNN.NN, rhelN.N, rockyN.N): {', '.join(bad)}")
        return _unique(value, "OS tag")

    @field_validator("components")
    @classmethod
    def _all_components(cls, value: dict[str, ComponentPin], info: ValidationInfo) -> dict[str, ComponentPin]:
        unknown = sorted(set(value) - set(RELEASE_COMPONENTS))
        missing = [c for c in RELEASE_COMPONENTS if c not in value]
        if unknown:
            raise ValueError(f"unknown components {', '.join(unknown)} (known: {', '.join(RELEASE_COMPONENTS)})")
        if missing:
            raise ValueError(f"missing components {', '.join(missing)}")
        dcgm = info.data.get("dcgm")
        exporter = value["dcgm-exporter"].version
        # The exporter's version is ``<dcgm>-<exporter>``: the DCGM it embeds comes first.
        if dcgm is not None and not exporter.startswith(f"{dcgm}-"):
            raise ValueError(f"dcgm-exporter {exporter} does not embed DCGM {dcgm} (expected {dcgm}-<exporter>)")
        return value

    @property
    def label(self) -> str:
        """How messages name the release (``GPU Operator 26.3.1``)."""
        return f"GPU Operator {self.name}"

    @property
    def key(self) -> tuple[int, ...]:
        """The release name as numbers, for ordering."""
        return tuple(int(p) for p in self.name.split("."))

    def version(self, component: str) -> str:
        """The version this release pins for ``component``; ``KeyError`` for the driver or an unknown one."""
        return self.components[component].version


class DriverBranch(_Strict):
    """A driver branch: the newest CUDA it runs, the architectures it drives, its known releases."""

    cuda: str = Field(pattern=_CUDA)
    architectures: Annotated[list[str], _unique_list("architecture")] = Field(min_length=1)
    releases: list[str] = Field(min_length=1)

    @field_validator("releases")
    @classmethod
    def _releases_newest_first(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if not re.match(_DRIVER_VERSION, v)]
        if bad:
            raise ValueError(f"not driver versions: {', '.join(map(repr, bad))}")
        _unique(value, "driver")
        # Newest first, so the first entry is what "the newest driver of this branch" means.
        if [driver_key(v) for v in value] != sorted((driver_key(v) for v in value), reverse=True):
            raise ValueError("list the releases newest first")
        return value


def _path(*parts: str | int) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


class Matrix(_Strict):
    """The whole compatibility matrix, with the queries the planner asks of it."""

    images: dict[str, str]
    architectures: Annotated[list[str], _unique_list("architecture")] = Field(min_length=1)
    drivers: dict[str, DriverBranch] = Field(min_length=1)
    gpu_models: dict[str, str] = Field(min_length=1)
    minimum_drivers: dict[str, str] = Field(default_factory=dict)
    releases: list[Release] = Field(min_length=1)

    _models: dict[str, tuple[str, str]] = PrivateAttr(default_factory=dict)

    @field_validator("images")
    @classmethod
    def _images(cls, value: dict[str, str]) -> dict[str, str]:
        missing = [c for c in COMPONENTS if c not in value]
        unknown = sorted(set(value) - set(COMPONENTS))
        if missing or unknown:
            raise ValueError(f"needs exactly the components {', '.join(COMPONENTS)}")
        bad = [f"{c}: {r!r}" for c, r in value.items() if not re.match(_IMAGE_REPO, r)]
        if bad:
            raise ValueError(f"not image repositories (host/path, no tag): {'; '.join(bad)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Matrix:
        problems: list[str] = []
        known = set(self.architectures)
        for name, branch in self.drivers.items():
            if not re.match(_BRANCH, name):
                problems.append(f"{_path('drivers', name)}: not a driver branch (3-4 digits)")
            for i, arch in enumerate(branch.architectures):
                if arch not in known:
                    problems.append(f"{_path('drivers', name, 'architectures', i)}: unknown architecture {arch!r}")
            for i, version in enumerate(branch.releases):
                if version.partition(".")[0] != name:
                    problems.append(f"{_path('drivers', name, 'releases', i)}: {version} is not of branch {name}")
        seen: dict[str, str] = {}
        for model, arch in self.gpu_models.items():
            if arch not in known:
                problems.append(f"{_path('gpu_models', model)}: unknown architecture {arch!r}")
            key = model_key(model)
            if key in seen:
                problems.append(f"{_path('gpu_models', model)}: the same model as {seen[key]!r}")
            seen[key] = model
        for model, version in self.minimum_drivers.items():
            if model_key(model) not in seen:
                problems.append(f"{_path('minimum_drivers', model)}: not a model of gpu_models")
            if not re.match(_DRIVER_VERSION, version):
                problems.append(f"{_path('minimum_drivers', model)}: {version!r} is not a driver version")
        names: set[str] = set()
        for i, release in enumerate(self.releases):
            if release.name in names:
                problems.append(f"{_path('releases', i, 'name')}: release {release.name} appears twice")
            names.add(release.name)
            for j, branch_name in enumerate(release.driver.branches):
                if branch_name not in self.drivers:
                    problems.append(
                        f"{_path('releases', i, 'driver', 'branches', j)}: branch {branch_name} is not in drivers"
                    )
            default = release.driver.default
            default_branch = default.partition(".")[0]
            known_releases = self.drivers[default_branch].releases if default_branch in self.drivers else None
            if known_releases is not None and default not in known_releases:
                problems.append(
                    f"{_path('releases', i, 'driver', 'default')}: {default} is not a release listed in "
                    f"drivers['{default_branch}'].releases"
                )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def model_post_init(self, context: Any, /) -> None:
        # Index the models once by their comparison form; the planner asks per model, not per node.
        for model, arch in self.gpu_models.items():
            self._models[model_key(model)] = (model, arch)

    # --- queries -------------------------------------------------------------------------------

    def releases_newest_first(self) -> list[Release]:
        """The releases, newest first (by their version, whatever the file's order)."""
        return sorted(self.releases, key=lambda r: r.key, reverse=True)

    def newest_release(self) -> Release:
        """The newest release of the matrix."""
        return self.releases_newest_first()[0]

    def find_release(self, name: str) -> Release | None:
        """The release called ``name`` (``26.3.1``, ``v26.3.1``), or the newest patch of ``YY.M``; else None."""
        wanted = name.strip().removeprefix("v")
        releases = self.releases_newest_first()
        return next((r for r in releases if r.name == wanted or r.name.startswith(wanted + ".")), None)

    def architecture(self, model: str) -> str | None:
        """The architecture of the GPU model ``model`` (NVML name, dashes or spaces), None when unknown."""
        hit = self._models.get(model_key(model))
        return hit[1] if hit else None

    def min_driver(self, model: str) -> str | None:
        """The first driver version ``model`` runs on when later than its branch's start, else None."""
        wanted = model_key(model)
        return next((v for name, v in self.minimum_drivers.items() if model_key(name) == wanted), None)

    @staticmethod
    def branch_of(driver_version: str) -> str:
        """The branch of a driver version (``"580.95.05"`` → ``"580"``); ``ValueError`` when malformed."""
        if not re.match(_DRIVER_VERSION, driver_version):
            raise ValueError(f"{driver_version!r} is not a driver version (like 580.95.05)")
        return driver_version.partition(".")[0]

    def supports(self, branch: str, architecture: str) -> bool:
        """Whether driver branch ``branch`` drives GPUs of ``architecture`` (False for an unknown branch)."""
        found = self.drivers.get(branch)
        return found is not None and architecture in found.architectures

    def newest_driver(self, branch: str) -> str:
        """The newest known release of ``branch``; ``KeyError`` for an unknown branch."""
        return self.drivers[branch].releases[0]

    def is_known_driver(self, version: str) -> bool:
        """Whether ``version`` is a driver release the matrix lists."""
        branch = self.drivers.get(version.partition(".")[0])
        return branch is not None and version in branch.releases

    def image(self, component: str) -> str:
        """The image repository of ``component`` (registry host first, no tag)."""
        return self.images[component]


def _problems(exc: ValidationError) -> list[str]:
    lines: list[str] = []
    for err in exc.errors():
        message = str(err["msg"]).removeprefix("Value error, ")
        where = _path(*err["loc"])
        if where:
            lines.append(f"{where}: {message}")
        else:
            # Cross-field checks already name their field paths, one per line.
            lines.extend(message.splitlines())
    return lines


def _parse(text: str, source: str) -> Matrix:
    try:
        # Keys are unique in YAML; PyYAML would keep the last of two, half ignoring a section given twice.
        loaded = yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise MatrixError(f"{source}: not valid YAML ({' '.join(str(exc).split())})") from None
    except RecursionError:
        raise MatrixError(f"{source}: not valid YAML (nested too deeply)") from None
    except TypeError:  # the duplicate-key check meets a list or mapping as a key
        raise MatrixError(f"{source}: not valid YAML (a mapping key is a list or a mapping)") from None
    if not isinstance(loaded, dict):
        raise MatrixError(f"{source}: a compatibility matrix is a mapping of sections, got {type(loaded).__name__}")
    try:
        return Matrix.model_validate(loaded)
    except ValidationError as exc:
        raise MatrixError("\n".join(f"{source}: {line}" for line in _problems(exc))) from None


@cache
def _packaged() -> Matrix:
    text = resources.files("gpucert").joinpath("data/compatibility.yaml").read_text(encoding="utf-8")
    return _parse(text, "compatibility.yaml")


def load_matrix(path: Path | None = None) -> Matrix:
    """The compatibility matrix: the packaged one, or the YAML file at ``path``; raises
    :class:`~gpucert.errors.MatrixError` when the file cannot be read, is not YAML, or breaks the rules."""
    if path is None:
        return _packaged()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise MatrixError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise MatrixError(f"{path}: cannot read the compatibility matrix ({exc.strerror or exc})") from None
    return _parse(text, str(path))
