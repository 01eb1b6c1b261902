"""The certification policy: every threshold the verdict engine uses, with defaults (docs/reference/policy.md).

The defaults live in ``gpucert/data/policy.yaml`` (commented, one place to read them). A user's policy
file is merged over them key by key, so it names only what it changes; an unknown key, a wrong type or
an impossible value is a :class:`~gpucert.errors.PolicyError` that names the file and the key path.
Spec floors per GPU model come from ``gpucert/data/spec_floors.csv`` unless a policy names its own file.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ._yaml import read_yaml_mapping
from .errors import PolicyError
from .metrics import METRICS, PERF_METRICS

__all__ = ["DriftPolicy", "MetricPolicy", "Policy", "default_policy", "load_policy", "read_policy_file", "spec_floors"]


class _Strict(BaseModel):
    # A threshold of .inf or 1e400 is no threshold: refused, naming the key, like any impossible value.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class MetricPolicy(_Strict):
    cv_rep: float = Field(gt=0, lt=1, description="expected run-to-run coefficient of variation")
    cv_unit: float = Field(gt=0, lt=1, description="expected GPU-to-GPU (or node-to-node) CV")
    warn_drop_pct: float = Field(gt=0, lt=100)
    warn_z: float = Field(gt=0)
    fail_drop_pct: float = Field(gt=0, lt=100)
    node_drop_pct: float | None = Field(default=None, gt=0, lt=100)
    repeats: int | None = Field(
        default=None,
        ge=1,
        le=25,
        description="measure this metric this many times per run (never fewer than the run's repeats); "
        "cheap host copies get more, so a run's median is precise enough for drift",
    )

    @model_validator(mode="after")
    def _fail_beyond_warn(self) -> MetricPolicy:
        if self.fail_drop_pct < self.warn_drop_pct:
            raise ValueError("fail_drop_pct must be at least warn_drop_pct")
        return self


class RepeatsPolicy(_Strict):
    unstable_factor: float = Field(gt=1)
    transient_pct: float = Field(gt=0, lt=100)


class PeersPolicy(_Strict):
    min_nodes: int = Field(ge=2)
    cv_floor_factor: float = Field(gt=0, le=1)
    seed_z: float = Field(gt=0)
    with_history_z: float = Field(gt=0)


class NodeWidePolicy(_Strict):
    drop_factor: float = Field(gt=0, le=1)
    z: float = Field(gt=0)
    cause_share: float = Field(gt=0, le=1)


class FleetPolicy(_Strict):
    min_gpus: int = Field(ge=2)
    min_nodes: int = Field(ge=1)
    report_pct: float = Field(gt=0, lt=100)


class GatesPolicy(_Strict):
    pcie_replays_per_min: float = Field(ge=0)
    pcie_replays_replace_per_min: float = Field(ge=0)
    hw_slowdown_frac: float = Field(ge=0, le=1)
    temp_margin_c: float = Field(ge=0)
    power_limit_tolerance_pct: float = Field(ge=0, lt=100)
    sbe_volatile_warn: float = Field(ge=0)
    nvlink_crc_errors: float = Field(ge=0)
    xid_repeat_warn: int = Field(ge=1)
    ib_rate_gbps: float | None = Field(
        default=None,
        gt=0,
        description="the rate every active RDMA port should run at (Gb/s); None: compare a node's ports with "
        "one another only",
    )
    ib_symbol_errors: float = Field(ge=0)
    ib_link_downed: float = Field(ge=0)
    ib_rcv_errors: float = Field(ge=0)


class BaselinePolicy(_Strict):
    seed_runs: int = Field(ge=1, le=50)
    trim_pct: float = Field(gt=0, lt=100)
    min_model_samples: int = Field(ge=1)


class BlastRadiusPolicy(_Strict):
    min_nodes: int = Field(ge=0)
    fraction: float = Field(ge=0, le=1)


class DriftPolicy(_Strict):
    """Slow drift on each GPU's own history (docs/design/operate.md, "Drift", says why these)."""

    method: Literal["cusum", "ewma"]
    k: float = Field(gt=0)
    h: float = Field(gt=0)
    lam: float = Field(gt=0, le=1)
    L: float = Field(gt=0)
    shewhart: float = Field(gt=0)
    clip: float = Field(gt=0)
    clear: float = Field(ge=0)
    window_runs: int = Field(ge=2)
    lookback_days: float = Field(gt=0)
    min_baseline_runs: int = Field(ge=1)


class NetworkPolicy(_Strict):
    pairs: bool = Field(description="measure two-node all-reduce between nodes (issue 14's link benchmarks)")
    leaf_label: str = Field(description="the node label naming each node's leaf (rack) switch")
    zone_label: str = Field(description="the node label naming the tier above the leaves")
    partners: int = Field(ge=1, le=8, description="distinct partners each node meets per run")
    repair_rounds: int = Field(ge=0, le=5, description="re-pairing rounds for pairs nothing explains yet")


class Policy(_Strict):
    metrics: dict[str, MetricPolicy]
    repeats: RepeatsPolicy
    peers: PeersPolicy
    node_wide: NodeWidePolicy
    fleet: FleetPolicy
    gates: GatesPolicy
    baseline: BaselinePolicy
    blast_radius: BlastRadiusPolicy
    drift: DriftPolicy
    network: NetworkPolicy
    observe_only: bool = False
    spec_floors_file: str | None = Field(
        default=None, description="a CSV of gpu_model,metric,floor replacing the shipped floors"
    )

    @model_validator(mode="after")
    def _known_metrics(self) -> Policy:
        unknown = sorted(set(self.metrics) - set(PERF_METRICS))
        if unknown:
            raise ValueError(f"metrics: {', '.join(unknown)} not performance metrics of the registry")
        missing = sorted(set(PERF_METRICS) - set(self.metrics))
        if missing:
            raise ValueError(f"metrics: no thresholds for {', '.join(missing)}")
        return self

    def max_tainted_nodes(self, gpu_nodes: int) -> int:
        """How many nodes one run may taint before the blast-radius guard stops it
        (docs/design/certify-runbook.md, "Blast radius")."""
        return max(self.blast_radius.min_nodes, math.floor(self.blast_radius.fraction * gpu_nodes))


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _defaults() -> dict[str, Any]:
    text = resources.files("gpucert").joinpath("data/policy.yaml").read_text(encoding="utf-8")
    loaded = yaml.safe_load(text)
    assert isinstance(loaded, dict)
    return loaded


def _build(raw: Mapping[str, Any], source: str) -> Policy:
    try:
        return Policy.model_validate(_merge(_defaults(), raw))
    except ValidationError as exc:
        problems = [f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in exc.errors()]
        # One line however many problems: a command-line error is one line (they are few: keys, not rows).
        raise PolicyError(f"{source}: invalid policy: " + "; ".join(problems)) from None


@cache
def default_policy() -> Policy:
    """The shipped defaults (docs/reference/policy.md)."""
    return _build({}, "the default policy")


def read_policy_file(path: str | Path) -> dict[str, Any]:
    """The raw mapping a policy YAML file holds (not yet merged or validated); raises ``PolicyError`` naming
    the file for one that cannot be read, is not UTF-8, is not YAML, repeats a key or is not a mapping."""
    return read_yaml_mapping(path, str(path), what="a mapping of policy sections", error=PolicyError)


def load_policy(
    path: str | Path | None = None, overrides: Mapping[str, Any] | None = None, *, source: str | None = None
) -> Policy:
    """Load ``path`` (YAML) merged over the defaults, then ``overrides``; raises ``PolicyError`` naming
    ``source`` (default: the file, or "the policy") and the key."""
    raw: dict[str, Any] = read_policy_file(path) if path is not None else {}
    if overrides:
        raw = _merge(raw, overrides)
    if path is None and not overrides:
        return default_policy()
    return _build(raw, source or (str(path) if path is not None else "the policy"))


def spec_floors(policy: Policy | None = None) -> dict[tuple[str, str], float]:
    """The absolute floors per (GPU model, metric): the policy's file, else the shipped one."""
    path = policy.spec_floors_file if policy is not None else None
    return _read_floors(path)


@cache
def _read_floors(path: str | None) -> dict[tuple[str, str], float]:
    if path is None:
        text = resources.files("gpucert").joinpath("data/spec_floors.csv").read_text(encoding="utf-8")
        source = "spec_floors.csv"
    else:
        source = path
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise PolicyError(f"{path}: cannot read the spec floors ({exc.strerror or exc})") from None
    floors: dict[tuple[str, str], float] = {}
    reader = csv.DictReader(text.splitlines())
    for line, row in enumerate(reader, start=2):
        model, name, value = row.get("gpu_model"), row.get("metric"), row.get("floor")
        if not model or not name or value is None:
            raise PolicyError(f"{source}: line {line}: needs gpu_model, metric and floor")
        if name not in METRICS or METRICS[name].kind != "perf":
            raise PolicyError(f"{source}: line {line}: {name!r} is not a performance metric")
        try:
            floor = float(value)
        except ValueError:
            raise PolicyError(f"{source}: line {line}: floor {value!r} is not a number") from None
        if not math.isfinite(floor) or floor <= 0:
            raise PolicyError(f"{source}: line {line}: floor must be a positive number")
        floors[(model, name)] = floor
    return floors
