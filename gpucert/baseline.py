"""Building baselines from runs (DESIGN.md, "The store"; REFERENCE.md §4.4 R1 and §4.9).

Three kinds of rows, in one table:

* ``gpu`` (keyed by GPU UUID) and ``node`` (keyed by node name): an entity's **own** baseline. It is
  seeded from the entity's first ``seed_runs`` *passing* runs — each run judged against the baseline as
  it stands, so a GPU that is already slow when it arrives never teaches gpucert that slow is normal
  (a mild warn against peers alone still seeds: see :func:`_seedable`) —
  and then **held**: later runs do not move it, so slow drift stays measurable against it. Only a
  deliberate re-baseline (:func:`forget`: a stack change, a repair, ``gpucert baseline rebuild``) clears
  it to be seeded again. ``center`` is the mean of the run medians and ``spread`` their standard
  deviation, merged run by run (Welford), so a build never needs the raw samples of earlier builds.
* ``model`` (keyed by the NVML GPU model): the per-model reference, rebuilt from the passing results of
  the build's runs, trimmed the SuperBench way: the mean of the samples, then drop every sample beyond
  ±``trim_pct`` of it, repeat until nothing drops.

A build *merges*: keys absent from its input keep their previous values.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .policy import Policy, default_policy, spec_floors
from .store import BASELINE_COLUMNS, BaselineStore, empty_baseline, validate_baseline
from .verdict import evaluate_run

__all__ = ["BaselineUpdate", "BuildReport", "build_baseline", "forget", "trimmed_mean", "update_store"]

_KEY = ["level", "key", "metric"]


@dataclass(frozen=True)
class BuildReport:
    """What a build did, for the command line to print."""

    runs: tuple[str, ...]
    seeded: int  # own baselines created or extended (entity × metric)
    held: int  # own baselines that were complete and kept as they were
    rejected: int  # entities left out because their run's verdict was not a pass
    models: int  # per-model references rebuilt


def trimmed_mean(samples: np.ndarray, trim_pct: float, *, max_rounds: int = 50) -> tuple[float, float, int]:
    """SuperBench's iterated mean: (center, spread of the kept samples, how many were kept)."""
    kept = samples[np.isfinite(samples)]
    if len(kept) == 0:
        return float("nan"), float("nan"), 0
    center = float(kept.mean())
    for _ in range(max_rounds):
        inside = np.abs(kept - center) <= abs(center) * trim_pct / 100
        if inside.all() or not inside.any():
            break
        kept = kept[inside]
        center = float(kept.mean())
    spread = float(kept.std(ddof=1)) if len(kept) > 1 else 0.0
    return center, spread, len(kept)


def build_baseline(
    previous: pd.DataFrame,
    results: pd.DataFrame,
    *,
    policy: Policy | None = None,
    floors: Mapping[tuple[str, str], float] | None = None,
    stack: Mapping[str, str] | None = None,
) -> tuple[pd.DataFrame, BuildReport]:
    """The new baseline table: ``previous`` merged with what the passing results of every run teach."""
    policy = policy or default_policy()
    floors = dict(spec_floors(policy) if floors is None else floors)
    stack_json = json.dumps(dict(stack or {}), sort_keys=True)
    table = validate_baseline(previous, "the previous baseline") if len(previous) else empty_baseline()
    order = results.groupby("run_id", observed=True)["ts"].min().sort_values()
    passing_model_samples: list[pd.DataFrame] = []
    seeded = held = rejected = 0
    for run_id in order.index:
        part = results[results["run_id"] == run_id]
        evaluation = evaluate_run(part, table, policy, floors, with_medians=True)
        accepted = _accepted(evaluation.verdicts, evaluation.medians, policy)
        rejected += int(_rejected_entities(evaluation.verdicts, policy))
        ts = pd.Timestamp(order[run_id])
        table, s, h = _extend_own(table, accepted, ts, policy.baseline.seed_runs, stack_json)
        seeded += s
        held += h
        passing_model_samples.append(accepted[accepted["scope"] != "pair"])
    table, models = _rebuild_models(table, passing_model_samples, policy, stack_json, order)
    report = BuildReport(tuple(str(r) for r in order.index), seeded, held, rejected, models)
    return validate_baseline(table, "the built baseline"), report


def forget(table: pd.DataFrame, nodes: Sequence[str]) -> tuple[pd.DataFrame, int]:
    """Drop the own baselines of ``nodes`` and of the GPUs last measured on them, to be seeded again."""
    wanted = set(nodes)
    drop = ((table["level"] == "node") & table["key"].isin(wanted)) | (
        (table["level"] == "gpu") & table["node"].isin(wanted)
    )
    return table[~drop].reset_index(drop=True), int(drop.sum())


@dataclass(frozen=True)
class BaselineUpdate:
    """What :func:`update_store` did: the new current version, the build's report (None when nothing was
    merged), and how many own baselines were forgotten first."""

    version: str
    report: BuildReport | None
    forgotten: int


def update_store(
    store: BaselineStore,
    results: pd.DataFrame | None,
    *,
    message: str,
    policy: Policy | None = None,
    stack: Mapping[str, str] | None = None,
    forget_nodes: Sequence[str] | Callable[[pd.DataFrame], Sequence[str]] = (),
) -> BaselineUpdate:
    """The one baseline-update step: read the current version, forget the own baselines of ``forget_nodes``
    (a list, or a function of the current table: the nodes whose stack changed), merge what ``results``
    teach, and write it as a new version moved to current by compare-and-swap — re-done from the top if
    another writer got there first. Raises :class:`~gpucert.errors.StoreError` when the store fails."""
    reports: list[BuildReport | None] = []
    forgotten: list[int] = []

    def merge(table: pd.DataFrame) -> pd.DataFrame:
        nodes = forget_nodes(table) if callable(forget_nodes) else forget_nodes
        if nodes and len(table):
            table, count = forget(table, nodes)
        else:
            count = 0
        forgotten.append(count)
        report = None
        if results is not None:
            table, report = build_baseline(table, results, policy=policy, stack=stack)
        reports.append(report)
        return table

    version = store.update(merge, message=message)
    return BaselineUpdate(version, reports[-1], forgotten[-1])


def _rejected_entities(verdicts: pd.DataFrame, policy: Policy) -> int:
    entity = verdicts[verdicts["reference_kind"] != "fleet"]
    return int((~_seedable(entity, policy)).sum())


def _seedable(verdicts: pd.DataFrame, policy: Policy) -> pd.Series:
    """Which verdicts may teach an own baseline.

    A pass, and also a warn whose only ground is a mild deficit against peers or the model reference
    (weaker than ``peers.seed_z``): GPUs sit up to ~5 % apart by binning alone (REFERENCE.md §2),
    and one in the tail of that spread would otherwise warn at every seeding run, never get a history of
    its own, and warn every night for ever. A GPU clearly below its peers still never seeds.
    """
    mild = (
        (verdicts["verdict"] == "warn")
        & verdicts["reference_kind"].isin(["peer", "model"])
        & (verdicts["z"] > -policy.peers.seed_z)
        & (verdicts["cause"] == "slow_silicon")
    )
    return (verdicts["verdict"] == "pass") | mild


def _accepted(verdicts: pd.DataFrame, medians: pd.DataFrame, policy: Policy) -> pd.DataFrame:
    """The medians of the entities whose verdict in this run may seed their own baseline."""
    passed = verdicts[_seedable(verdicts, policy)]
    gpu_ok = passed[passed["gpu"].notna()]
    node_ok = passed[passed["gpu"].isna() & passed["peer"].isna() & passed["node"].notna()]
    gpus = medians[medians["scope"] == "gpu"].merge(
        gpu_ok[["node", "gpu"]].astype({"gpu": "int64"}), on=["node", "gpu"], how="inner"
    )
    nodes = medians[medians["scope"] == "node"].merge(node_ok[["node"]], on="node", how="inner")
    gpus = gpus[gpus["gpu_uuid"].notna()]
    return pd.concat([gpus, nodes], ignore_index=True)


def _extend_own(
    table: pd.DataFrame, accepted: pd.DataFrame, ts: pd.Timestamp, seed_runs: int, stack_json: str
) -> tuple[pd.DataFrame, int, int]:
    """Add one run's accepted medians to the own baselines still being seeded (Welford merge)."""
    if accepted.empty:
        return table, 0, 0
    new = pd.DataFrame(
        {
            "level": np.where(accepted["scope"] == "gpu", "gpu", "node"),
            "key": np.where(accepted["scope"] == "gpu", accepted["gpu_uuid"], accepted["node"]),
            "metric": accepted["metric"].to_numpy(),
            "x": accepted["x"].to_numpy(),
            "node_of": accepted["node"].where(accepted["scope"] == "gpu").to_numpy(),
        }
    )
    merged = new.merge(table, on=_KEY, how="left")
    known = merged["n"].notna().to_numpy()
    n = merged["n"].fillna(0).to_numpy(dtype=np.int64)
    growing = n < seed_runs
    held = int((known & ~growing).sum())
    grow = merged[growing]
    n0 = n[growing].astype(float)
    mean0 = grow["center"].fillna(0.0).to_numpy()
    m2 = np.where(n0 > 1, grow["spread"].fillna(0.0).to_numpy() ** 2 * (n0 - 1), 0.0)
    x = grow["x"].to_numpy()
    n1 = n0 + 1
    mean1 = mean0 + (x - mean0) / n1
    m2 = m2 + (x - mean0) * (x - mean1)
    updated = pd.DataFrame(
        {
            "level": grow["level"].to_numpy(),
            "key": grow["key"].to_numpy(),
            "metric": grow["metric"].to_numpy(),
            "center": mean1,
            "spread": np.sqrt(np.where(n1 > 1, m2 / np.maximum(n1 - 1, 1), 0.0)),
            "n": n1.astype(np.int64),
            "first_ts": grow["first_ts"].fillna(ts).to_numpy(),
            "last_ts": ts,
            "stack": np.where(grow["n"].isna(), stack_json, grow["stack"].fillna(stack_json)),
            "node": grow["node_of"].to_numpy(),
        }
    )
    keep = table.merge(updated[_KEY], on=_KEY, how="left", indicator=True)["_merge"].to_numpy() == "left_only"
    out = pd.concat([table[keep], updated], ignore_index=True)[list(BASELINE_COLUMNS)]
    return out, len(updated), held


def _rebuild_models(
    table: pd.DataFrame,
    samples: list[pd.DataFrame],
    policy: Policy,
    stack_json: str,
    order: pd.Series,
) -> tuple[pd.DataFrame, int]:
    pooled = pd.concat(samples, ignore_index=True) if samples else pd.DataFrame()
    if pooled.empty:
        return table, 0
    rows = []
    # A loop over (model, metric) pairs — a handful — each reduced with numpy.
    for (model, metric), group in pooled.groupby(["gpu_model", "metric"], sort=True):
        center, spread, kept = trimmed_mean(group["x"].to_numpy(dtype=float), policy.baseline.trim_pct)
        if kept < policy.baseline.min_model_samples or not np.isfinite(center) or center <= 0:
            continue
        rows.append((str(model), str(metric), center, spread, kept))
    if not rows:
        return table, 0
    models = pd.DataFrame(rows, columns=["key", "metric", "center", "spread", "n"])
    models.insert(0, "level", "model")
    models["first_ts"] = pd.Timestamp(order.min())
    models["last_ts"] = pd.Timestamp(order.max())
    models["stack"] = stack_json
    models["node"] = None
    keep = table.merge(models[_KEY], on=_KEY, how="left", indicator=True)["_merge"].to_numpy() == "left_only"
    out = pd.concat([table[keep], models[list(BASELINE_COLUMNS)]], ignore_index=True)
    return out, len(models)
