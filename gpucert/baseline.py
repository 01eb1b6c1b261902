"""Building baselines from runs: the rules are docs/design/data-contracts.md, "Baselines".

Why they are so:

* an own baseline (``gpu``, ``node``) is seeded from passing runs, each judged against the baseline as it
  stands, so a GPU already slow when it arrives never teaches gpucert that slow is normal (a mild warn
  against peers alone still seeds: :func:`_seedable`); then held, so slow drift stays measurable against it.
  ``center`` and ``spread`` are merged run by run (Welford): a build never needs earlier builds' samples;
* a run counts once (the ``runs`` column), so merging a run again (a file built twice, a certify restarted
  under its run id) changes nothing. Rows written before the column have unknown provenance: only runs
  merged since are recognised;
* one impossible value (beyond the model's ceiling in ``gpucert/data/physical_bounds.csv``, or not a finite
  number ≥ 0) says that GPU's benchmark was broken in that run: its run × entity × metric teaches nothing
  (:attr:`BuildReport.implausible`). A passing median far *above* its cohort is not merged either: the
  verdict passes it, but as a baseline it would fail every healthy run after it (:attr:`BuildReport.outliers`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from .metrics import PERF_METRICS, bound_arrays
from .policy import Policy, default_policy, spec_floors
from .store import BASELINE_COLUMNS, BaselineStore, empty_baseline, validate_baseline
from .verdict import evaluate_run

__all__ = ["BaselineUpdate", "BuildReport", "build_baseline", "forget", "trimmed_mean", "update_store"]

_KEY = ["level", "key", "metric"]
#: The columns that name one sample's series: a run × entity × metric.
_SERIES = ["run_id", "node", "gpu", "peer", "metric"]
#: How many skipped values a report spells out; the rest are counted.
_NOTES = 10
_MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class BuildReport:
    """What a build did, for the command line to print."""

    runs: tuple[str, ...]
    seeded: int  # own baselines created or extended (entity × metric)
    held: int  # own baselines that were complete and kept as they were
    rejected: int  # entities left out because their run's verdict was not a pass
    models: int  # per-model references rebuilt
    repeated: int = 0  # own baselines that already rested on the run, kept as they were: a run counts once
    implausible: int = 0  # run × entity × metric beyond the physical bounds of its GPU model: never merged
    outliers: int = 0  # passing medians far above their cohort: not merged
    #: The first few implausible values and outliers, one line each, naming run, node, GPU and metric.
    notes: tuple[str, ...] = ()


def trimmed_mean(samples: np.ndarray, trim_pct: float, *, max_rounds: int = 50) -> tuple[float, float, int]:
    """SuperBench's iterated mean: (center, spread of the kept samples, how many were kept).

    NaN and infinite samples are ignored; with none left it returns (nan, nan, 0).
    """
    kept = samples[np.isfinite(samples)]
    if len(kept) == 0:
        return float("nan"), float("nan"), 0
    # Huge finite samples may overflow a sum: the median below takes over, so no warning is wanted.
    with np.errstate(over="ignore", invalid="ignore"):
        center = float(kept.mean())
        if not math.isfinite(center):
            center = float(np.median(kept))
        restarted = False
        for _ in range(max_rounds):
            inside = np.abs(kept - center) <= abs(center) * trim_pct / 100
            if inside.all():
                break
            if not inside.any():
                if restarted:
                    break
                # One wild sample can drag the mean so far that no sample lies near it, and SuperBench's
                # rule would then keep the dragged mean: start once more from the median, which it cannot.
                center, restarted = float(np.median(kept)), True
                continue
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
    """The new baseline table: ``previous`` merged with what the passing results of every run teach, and
    the build's report. ``results`` is a canonical results frame (:mod:`gpucert.results`). Raises
    :class:`~gpucert.errors.BaselineFormatError` when ``previous`` breaks the baseline contract."""
    policy = policy or default_policy()
    floors = dict(spec_floors(policy) if floors is None else floors)
    stack_json = json.dumps(dict(stack or {}), sort_keys=True)
    table = validate_baseline(previous, "the previous baseline") if len(previous) else empty_baseline()
    # Stable, so runs that start at the same instant keep the (sorted) order of their ids.
    order = results.groupby("run_id", observed=True)["ts"].min().sort_values(kind="stable")
    usable, implausible, notes = _without_implausible(results)
    passing_model_samples: list[pd.DataFrame] = []
    seeded = held = rejected = repeated = outliers = 0
    for run_id in order.index:
        # One run (every certify's merge): its rows as they are, not a copy of the fleet's.
        part = usable if len(order) == 1 else usable[usable["run_id"] == run_id]
        if part.empty:
            continue
        evaluation = evaluate_run(part, table, policy, floors, with_medians=True)
        accepted = _accepted(evaluation.verdicts, evaluation.medians, policy)
        rejected += int(_rejected_entities(evaluation.verdicts, policy))
        high = _high_outliers(accepted, evaluation.medians, policy)
        if high.any():
            outliers += int(high.sum())
            notes += _outlier_notes(accepted, high, evaluation.medians, str(run_id), _NOTES - len(notes))
            accepted = accepted[~high]
        ts = pd.Timestamp(order[run_id])
        table, s, h, r = _extend_own(table, accepted, ts, policy.baseline.seed_runs, stack_json, str(run_id))
        seeded += s
        held += h
        repeated += r
        passing_model_samples.append(accepted[accepted["scope"] != "pair"].assign(run_id=str(run_id)))
    table, models = _rebuild_models(table, passing_model_samples, policy, stack_json, order)
    report = BuildReport(
        tuple(str(r) for r in order.index),
        seeded,
        held,
        rejected,
        models,
        repeated=repeated,
        implausible=implausible,
        outliers=outliers,
        notes=tuple(notes),
    )
    return validate_baseline(table, "the built baseline"), report


def forget(table: pd.DataFrame, nodes: Sequence[str]) -> tuple[pd.DataFrame, int]:
    """Drop the own baselines of ``nodes`` and of the GPUs last measured on them, to be seeded again;
    returns the table left and how many rows were dropped."""
    wanted = set(nodes)
    drop = ((table["level"] == "node") & table["key"].isin(wanted)) | (
        (table["level"] == "gpu") & table["node"].isin(wanted)
    )
    return table[~drop].reset_index(drop=True), int(drop.sum())


@dataclass(frozen=True)
class BaselineUpdate:
    """What :func:`update_store` did: the current version after it, the build's report (None when nothing
    was merged), how many own baselines were forgotten first, and whether a version was written (False:
    the update changed nothing, e.g. every run was already merged)."""

    version: str
    report: BuildReport | None
    forgotten: int
    changed: bool = True


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
    (or of a function of the current table: the nodes whose stack changed), merge what ``results`` teach,
    and write a new version moved to current by compare-and-swap (re-done if another writer got there
    first). An update that changes nothing writes no version: the current one is returned. Raises
    :class:`~gpucert.errors.StoreError` when the store fails."""
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

    # Merge once against the current version first: a merge that changes nothing must not add a version
    # (a run merged twice changes nothing, not even the history), and one that does is reused below
    # unless another writer moved current in between.
    current = store.current_version()
    first: tuple[pd.DataFrame, pd.DataFrame, BuildReport | None, int] | None = None
    if current is not None:
        before = store.read(current)
        after = merge(before.copy())
        if after.equals(before):
            return BaselineUpdate(current, reports[-1], forgotten[-1], changed=False)
        first = (before, after, reports[-1], forgotten[-1])

    def apply(table: pd.DataFrame) -> pd.DataFrame:
        if first is not None and table.equals(first[0]):
            reports.append(first[2])
            forgotten.append(first[3])
            return first[1].copy()
        return merge(table)

    version = store.update(apply, message=message)
    return BaselineUpdate(version, reports[-1], forgotten[-1])


def _rejected_entities(verdicts: pd.DataFrame, policy: Policy) -> int:
    entity = verdicts[verdicts["reference_kind"] != "fleet"]
    return int((~_seedable(entity, policy)).sum())


def _seedable(verdicts: pd.DataFrame, policy: Policy) -> pd.Series:
    """Which verdicts may teach an own baseline.

    A pass, and also a warn whose only ground is a mild deficit against peers or the model reference
    (weaker than ``peers.seed_z``): GPUs sit up to ~5 % apart by binning alone
    (docs/reference/reference-values.md, "Noise model"), and one in the tail of that spread would otherwise
    warn at every seeding run, never get a history of its own, and warn every night for ever. A GPU clearly
    below its peers still never seeds.
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
    return pd.concat([gpus, nodes, _link_medians(passed, medians)], ignore_index=True)


def _link_medians(passed: pd.DataFrame, medians: pd.DataFrame) -> pd.DataFrame:
    """Each node's own link baseline sample: the median over its passing pairs (each row naming it as
    ``node``: both pods of a pair log one) of the pair's median, a ``node``-level ``nccl_pair_busbw_gbps``
    entry. A pair low for its partner's fault did not pass, so it teaches the node nothing."""
    pair_ok = passed[passed["peer"].notna() & passed["node"].notna() & passed["gpu"].isna()]
    pairs = medians[medians["scope"] == "pair"]
    if pair_ok.empty or pairs.empty:
        return medians.iloc[:0]
    ok = pd.DataFrame({"node": pair_ok["node"].astype(str).to_numpy(), "peer": pair_ok["peer"].astype(str).to_numpy()})
    measured = pairs.assign(node=pairs["node"].astype(str), peer=pairs["peer"].astype(str)).merge(
        ok.drop_duplicates(), on=["node", "peer"], how="inner"
    )
    per_node = measured.groupby(["node", "metric"], observed=True, sort=True).agg(
        x=("x", "median"), n=("n", "sum"), gpu_model=("gpu_model", "first")
    )
    out = per_node.reset_index()
    return out.assign(scope="node", gpu=-1, gpu_uuid=np.nan, peer=None)[list(medians.columns)]


# --- implausible values -------------------------------------------------------------------------------


def _codes(column: pd.Series) -> tuple[npt.NDArray[np.intp], list[str]]:
    """A column's category codes (-1: missing) and its categories as text; any dtype."""
    categorical = column if isinstance(column.dtype, pd.CategoricalDtype) else column.astype("category")
    return categorical.cat.codes.to_numpy().astype(np.intp), [str(c) for c in categorical.cat.categories]


def _where(run: object, node: object, gpu: Any, peer: Any) -> str:
    """``run r1, node n1 GPU 3`` (or the node, or the pair), for a report line."""
    what = f"run {run}, node {node}"
    if pd.notna(gpu):
        return f"{what} GPU {gpu}"
    if pd.notna(peer):
        return f"{what} with {peer}"
    return what


def _without_implausible(results: pd.DataFrame) -> tuple[pd.DataFrame, int, list[str]]:
    """``results`` without every series (run × entity × metric) that holds a performance value outside its
    GPU model's physical bounds; also how many series went, and a line for each of the first few."""
    if results.empty:
        return results, 0, []
    mcodes, mnames = _codes(results["metric"])
    perf_of = np.array([name in PERF_METRICS for name in mnames] + [False], dtype=bool)
    perf = perf_of[mcodes]
    if not perf.any():
        return results, 0, []
    gcodes, models = _codes(results["gpu_model"])
    # One (model × metric) table of bounds, gathered by the codes; a missing model (-1) takes the last
    # row, the bounds for any GPU.
    low, high = bound_arrays(models, mnames)
    column = np.maximum(mcodes, 0)
    row_low, row_high = low[gcodes, column], high[gcodes, column]
    value = results["value"].to_numpy(dtype=np.float64, na_value=np.nan)
    with np.errstate(invalid="ignore"):
        bad = perf & ~(np.isfinite(value) & (value >= row_low) & (value <= row_high))
    if not bad.any():
        return results, 0, []
    series = results.groupby(_SERIES, observed=True, dropna=False, sort=False).ngroup().to_numpy()
    flagged, first = np.unique(series[bad], return_index=True)
    positions = np.flatnonzero(bad)[np.sort(first)[:_NOTES]]
    notes = []
    for i in positions:
        row = results.iloc[int(i)]
        model = models[gcodes[i]] if gcodes[i] >= 0 else "any GPU"
        notes.append(
            f"{_where(row['run_id'], row['node'], row['gpu'], row['peer'])}: {row['metric']} {value[i]:g} is "
            f"outside its physical range for {model} ({row_low[i]:g} to {row_high[i]:g}): a broken "
            "measurement, so this run merges nothing of it"
        )
    keep = ~np.isin(series, flagged)
    return results[keep], len(flagged), notes


def _per_metric(policy: Policy, metrics: pd.Series, field: str) -> npt.NDArray[np.float64]:
    """The policy's ``field`` for each row's metric (NaN for a metric without thresholds)."""
    values = {name: float(getattr(entry, field)) for name, entry in policy.metrics.items()}
    looked_up = metrics.map(values).to_numpy(dtype=np.float64, na_value=np.nan)
    return np.asarray(looked_up, dtype=np.float64)


def _cohort_stats(accepted: pd.DataFrame, medians: pd.DataFrame) -> pd.DataFrame:
    """For each accepted median, its run cohort's (same scope, model and metric) median, MAD and size."""
    keys = ["scope", "gpu_model", "metric"]
    pool = medians.loc[medians["scope"].isin(["gpu", "node"]), [*keys, "x"]].copy()
    pool["gpu_model"] = pool["gpu_model"].fillna("")
    grouped = pool.groupby(keys, sort=False)["x"]
    pool["dev"] = np.abs(pool["x"].to_numpy() - grouped.transform("median").to_numpy())
    stats = pd.DataFrame(
        {"center": grouped.median(), "mad": pool.groupby(keys, sort=False)["dev"].median(), "size": grouped.size()}
    ).reset_index()
    wanted = accepted[keys].assign(gpu_model=accepted["gpu_model"].fillna(""))
    # A left merge on unique keys keeps the accepted rows in their order, one each.
    return wanted.merge(stats, on=keys, how="left")


def _high_outliers(accepted: pd.DataFrame, medians: pd.DataFrame, policy: Policy) -> npt.NDArray[np.bool_]:
    """Which accepted medians sit far above their cohort: by the rise that would make the next run at
    the cohort's level warn against them (warn_drop / (1 - warn_drop)), and by ``peers.seed_z``
    spreads (the cohort's robust spread, floored like the engine's peer reference)."""
    if accepted.empty:
        return np.zeros(0, dtype=bool)
    stats = _cohort_stats(accepted, medians)
    x = accepted["x"].to_numpy(dtype=np.float64)
    center = stats["center"].to_numpy(dtype=np.float64, na_value=np.nan)
    mad = stats["mad"].to_numpy(dtype=np.float64, na_value=np.nan)
    size = stats["size"].to_numpy(dtype=np.float64, na_value=0.0)
    cv_unit = _per_metric(policy, accepted["metric"], "cv_unit")
    warn = _per_metric(policy, accepted["metric"], "warn_drop_pct") / 100
    with np.errstate(divide="ignore", invalid="ignore"):
        sigma = np.maximum(_MAD_TO_SIGMA * mad / center, policy.peers.cv_floor_factor * cv_unit)
        rise = x / center - 1
        z = rise / sigma
        high: npt.NDArray[np.bool_] = (
            (size >= policy.peers.min_nodes) & (center > 0) & (rise >= warn / (1 - warn)) & (z >= policy.peers.seed_z)
        )
    return high


def _outlier_notes(
    accepted: pd.DataFrame, high: npt.NDArray[np.bool_], medians: pd.DataFrame, run_id: str, room: int
) -> list[str]:
    if room <= 0:
        return []
    rows = accepted[high].head(room)
    stats = _cohort_stats(rows, medians)
    return [
        f"{_where(run_id, r.node, r.gpu if r.scope == 'gpu' else None, None)}: {r.metric} {r.x:.4g} is "
        f"{(r.x / c - 1) * 100:+.0f} % above the median of its {int(k)} peers ({c:.4g}): not merged"
        for r, c, k in zip(rows.itertuples(), stats["center"], stats["size"], strict=True)
    ]


# --- merging ----------------------------------------------------------------------------------------------


def _extend_own(
    table: pd.DataFrame, accepted: pd.DataFrame, ts: pd.Timestamp, seed_runs: int, stack_json: str, run_id: str
) -> tuple[pd.DataFrame, int, int, int]:
    """Add one run's accepted medians to the own baselines still being seeded (Welford merge), except
    those that already rest on the run; returns the table and how many rows were extended, held, and
    left as they were because they already name the run."""
    if accepted.empty:
        return table, 0, 0, 0
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
    # A fleet's rows share few distinct run lists (its GPUs are seeded by the same nights): each is
    # parsed once and the answers gathered back by code.
    codes, lists = pd.factorize(merged["runs"].fillna("").astype(object))
    parsed: list[list[str]] = [json.loads(u) if u else [] for u in lists]
    named = np.array([run_id in p for p in parsed], dtype=bool)[codes]
    listed = np.array([len(p) for p in parsed], dtype=np.int64)[codes]
    extended = np.array([json.dumps([*p, run_id]) for p in parsed], dtype=object)
    # A row that names fewer runs than it counts has runs from before the column: a run no newer than
    # the last one it took (seeding goes forward in time) is taken to be one of those.
    not_newer = (merged["last_ts"] >= ts).fillna(False).to_numpy(dtype=bool)
    already = named | (known & (listed < n) & not_newer)
    growing = (n < seed_runs) & ~already
    held = int((known & ~growing & ~already).sum())
    repeated = int(already.sum())
    if not growing.any():
        return table, 0, held, repeated
    grow = merged[growing]
    n0 = n[growing].astype(float)
    mean0 = grow["center"].fillna(0.0).to_numpy()
    m2 = np.where(n0 > 1, grow["spread"].fillna(0.0).to_numpy() ** 2 * (n0 - 1), 0.0)
    x = grow["x"].to_numpy()
    n1 = n0 + 1
    mean1 = mean0 + (x - mean0) / n1
    m2 = m2 + (x - mean0) * (x - mean1)
    first, last = grow["first_ts"].fillna(ts), grow["last_ts"].fillna(ts)
    updated = pd.DataFrame(
        {
            "level": grow["level"].to_numpy(),
            "key": grow["key"].to_numpy(),
            "metric": grow["metric"].to_numpy(),
            "center": mean1,
            # Rounding can leave a tiny negative m2 when every value is equal: that spread is 0.
            "spread": np.sqrt(np.maximum(np.where(n1 > 1, m2 / np.maximum(n1 - 1, 1), 0.0), 0.0)),
            "n": n1.astype(np.int64),
            # Two runs overlapping in time may merge out of the order they started in: the span only widens.
            "first_ts": first.where(first <= ts, ts).to_numpy(),
            "last_ts": last.where(last >= ts, ts).to_numpy(),
            # A new row has no stack yet (the join left it empty): this run's. Not np.where, which would
            # write the JSON into a fixed-width array, four bytes a character, once per row.
            "stack": grow["stack"].fillna(stack_json).to_numpy(dtype=object),
            "node": grow["node_of"].to_numpy(),
            "runs": extended[codes[growing]],
        }
    )
    keep = table.merge(updated[_KEY], on=_KEY, how="left", indicator=True)["_merge"].to_numpy() == "left_only"
    out = pd.concat([table[keep], updated], ignore_index=True)[list(BASELINE_COLUMNS)]
    return out, len(updated), held, repeated


def _brings_news(rested_on: tuple[set[str], pd.Timestamp] | None, runs: list[str], starts: pd.Series) -> bool:
    """Whether a build's ``runs`` give a model reference (the runs it rests on, the start of its newest)
    something new: a run it does not rest on (measured again or not: a restarted certify measures again),
    started no earlier than its newest (the reference follows the fleet forward; a reference from before the
    ``runs`` column names none, so only a strictly newer run is new to it)."""
    if rested_on is None:
        return True
    named, newest = rested_on
    for run in runs:
        if run in named:
            continue
        start = starts[run]
        if start > newest or (named and start == newest):
            return True
    return False


def _rebuild_models(
    table: pd.DataFrame, samples: list[pd.DataFrame], policy: Policy, stack_json: str, order: pd.Series
) -> tuple[pd.DataFrame, int]:
    """Rebuild each per-model reference the build has samples for from all of them (each run once), when
    the build brings it a new run (:func:`_brings_news`); returns the table and how many were rebuilt."""
    pooled = pd.concat(samples, ignore_index=True) if samples else pd.DataFrame()
    if pooled.empty:
        return table, 0
    previous = table[table["level"] == "model"]
    rested_on = {
        (str(k), str(m)): (set(json.loads(r) if r else []), pd.Timestamp(t))
        for k, m, r, t in zip(previous["key"], previous["metric"], previous["runs"], previous["last_ts"], strict=True)
    }
    position = {str(r): i for i, r in enumerate(order.index)}
    starts = pd.Series(pd.DatetimeIndex(order.to_numpy()), index=[str(r) for r in order.index])
    rows = []
    # A loop over (model, metric) pairs — a handful — each reduced with numpy.
    for (model, metric), group in pooled.groupby(["gpu_model", "metric"], sort=True):
        runs = sorted({str(r) for r in group["run_id"].unique()}, key=position.__getitem__)
        if not _brings_news(rested_on.get((str(model), str(metric))), runs, starts):
            continue
        center, spread, kept = trimmed_mean(group["x"].to_numpy(dtype=float), policy.baseline.trim_pct)
        if kept < policy.baseline.min_model_samples or not np.isfinite(center) or center <= 0:
            continue
        when = starts[runs]
        rows.append((str(model), str(metric), center, spread, kept, when.min(), when.max(), json.dumps(runs)))
    if not rows:
        return table, 0
    models = pd.DataFrame(rows, columns=["key", "metric", "center", "spread", "n", "first_ts", "last_ts", "runs"])
    models.insert(0, "level", "model")
    models["stack"] = stack_json
    models["node"] = None
    keep = table.merge(models[_KEY], on=_KEY, how="left", indicator=True)["_merge"].to_numpy() == "left_only"
    out = pd.concat([table[keep], models[list(BASELINE_COLUMNS)]], ignore_index=True)
    return out, len(models)
