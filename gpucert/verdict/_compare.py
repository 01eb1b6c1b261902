"""Stages 2 and 3 (REFERENCE.md §4.4-4.5): each median against its references, flagged only when the drop
is both large (a deviation gate) and strong (a z gate).

References, per entity × metric:

* **own** — the GPU's (or node's) own baseline. The most precise reference, because a GPU's unit-to-unit
  offset is part of it; a GPU that has one is judged by it first. Corrected by the *fleet factor* — the
  median ratio of the whole cohort to its own baselines — so a new driver that makes every GPU 2 % slower
  flags no GPU and is reported once instead (a ``fleet`` row).
* **peer** — the run's cohort of the same model: robust median and MAD, the spread floored at a share of
  the expected GPU-to-GPU CV. It judges GPUs with no history (new or swapped); it needs ``peers.min_nodes``.
  A GPU with history is still warned when it sits a fail-size drop and ``with_history_z`` spreads below its
  peers, so a baseline seeded on an already-weak GPU cannot hide it for ever.
* **model** — the stored per-model reference, for a GPU with no history in a cohort too small for peers.
* **node** — the other GPUs of the same node (leave-one-out median), on baseline-normalised values, so a
  GPU that falls behind its neighbours fails at a smaller drop than against its own history alone.
* **spec** — the absolute floor per model, whatever the statistics say.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..policy import Policy
from ._findings import concat_findings, make_findings
from ._index import METRIC_NAMES, N_METRICS, SCOPE_GPU, SCOPE_NODE, RunIndex

__all__ = ["REF_WORDS", "Judged", "compare_references", "per_metric"]

_MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Judged:
    """Every entity × metric with the comparison that judged it, plus what it found."""

    #: eid, mcode, x, kind, ref, d, z, sigma, has_own, d_node; one row per measured entity × metric
    table: pd.DataFrame
    #: stat and spec findings (cause left empty: causes are attributed with the telemetry afterwards)
    findings: pd.DataFrame
    #: fleet-level findings (one per model × metric whose whole cohort shifted)
    fleet: pd.DataFrame


def per_metric(policy: Policy, field: str, default: float = np.nan) -> np.ndarray:
    out = np.full(N_METRICS, default)
    for i, name in enumerate(METRIC_NAMES):
        entry = policy.metrics.get(name)
        if entry is not None:
            value = getattr(entry, field)
            out[i] = np.nan if value is None else value
    return out


def _center_spread(
    index_keys: np.ndarray, rows: pd.DataFrame, keys: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The baseline ``center`` and ``spread`` at each of ``keys`` (NaN where absent), from one hash lookup
    (``index_keys`` are unique: the baseline's (level, key, metric) is)."""
    if len(index_keys) == 0:
        return np.full(len(keys), np.nan), np.full(len(keys), np.nan)
    position = pd.Index(index_keys).get_indexer(keys)
    found = position >= 0
    at = np.maximum(position, 0)
    center = np.where(found, rows["center"].to_numpy(float)[at], np.nan)
    spread = np.where(found, rows["spread"].to_numpy(float)[at], np.nan)
    return center, spread


def _positions(values: pd.Series, names: pd.Index) -> np.ndarray:
    """Position of each value in ``names`` (-1 when absent): each distinct value is looked up once,
    the fastest string → position mapping pandas offers at 400,000 baseline rows."""
    categorical = values.astype("category")
    lookup = np.r_[names.get_indexer(categorical.cat.categories), -1].astype(np.int64)
    positions: np.ndarray = lookup[np.asarray(categorical.cat.codes, dtype=np.int64)]
    return positions


def _baseline_keys(baseline: pd.DataFrame, level: str, names: pd.Index) -> tuple[np.ndarray, pd.DataFrame]:
    """The rows of one baseline level, keyed as run code × metric code (rows the run lacks dropped)."""
    rows = baseline[baseline["level"] == level]
    if not len(names):
        return np.zeros(0, dtype=np.int64), rows.iloc[:0]
    codes = _positions(rows["key"], names)
    known = codes >= 0
    rows = rows[known]
    mcodes = _positions(rows["metric"], pd.Index(METRIC_NAMES))
    return codes[known] * N_METRICS + mcodes, rows


def compare_references(
    run: RunIndex,
    measured: pd.DataFrame,
    baseline: pd.DataFrame,
    policy: Policy,
    floors: dict[tuple[str, str], float],
) -> Judged:
    eid = measured["eid"].to_numpy()
    mcode = measured["mcode"].to_numpy()
    x = measured["x"].to_numpy()
    scope = run.scope[eid]
    model = run.model_code[eid]
    node = run.node_code[eid]
    cv_rep = per_metric(policy, "cv_rep")[mcode]
    cv_unit = per_metric(policy, "cv_unit")[mcode]

    # -- own baselines: GPUs by UUID, nodes by name ------------------------------------------------
    own_center = np.full(len(x), np.nan)
    own_spread = np.full(len(x), np.nan)
    for level, scope_id, codes in (
        ("gpu", SCOPE_GPU, run.uuid_code[eid]),
        ("node", SCOPE_NODE, node),
    ):
        names = run.uuids if level == "gpu" else run.nodes
        bkeys, brows = _baseline_keys(baseline, level, names)
        if len(bkeys) == 0:
            continue
        mine = (scope == scope_id) & (codes >= 0)
        keys = codes[mine] * N_METRICS + mcode[mine]
        own_center[mine], own_spread[mine] = _center_spread(bkeys, brows, keys)
    has_own = np.isfinite(own_center) & (own_center > 0)

    # -- stored per-model reference ----------------------------------------------------------------
    mkeys, mrows = _baseline_keys(baseline, "model", run.models)
    model_center, model_spread = _center_spread(mkeys, mrows, model * N_METRICS + mcode)

    # -- the run's cohort: same scope, model and metric --------------------------------------------
    cohort = (scope * (len(run.models) + 1) + model) * N_METRICS + mcode
    frame = pd.DataFrame({"c": cohort, "x": x, "node": node})
    grouped = frame.groupby("c", sort=False)
    peer_median = grouped["x"].transform("median").to_numpy()
    frame["dev"] = np.abs(x - peer_median)
    peer_mad = frame.groupby("c", sort=False)["dev"].transform("median").to_numpy()
    peer_nodes = grouped["node"].transform("nunique").to_numpy()
    has_peers = peer_nodes >= policy.peers.min_nodes
    with np.errstate(divide="ignore", invalid="ignore"):
        peer_sigma = np.maximum(
            _MAD_TO_SIGMA * peer_mad / peer_median, policy.peers.cv_floor_factor * cv_unit
        )
        d_peer = x / peer_median - 1
        z_peer = d_peer / peer_sigma

    # -- the fleet factor: how the whole cohort moved against its own baselines --------------------
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(has_own, x / own_center, np.nan)
    fleet_frame = pd.DataFrame({"c": cohort, "q": ratio, "node": np.where(has_own, node, -1)})
    fleet_frame = fleet_frame[has_own]
    fg = fleet_frame.groupby("c", sort=False)
    fleet_stats = pd.DataFrame({"f": fg["q"].median(), "gpus": fg["q"].size(), "nodes": fg["node"].nunique()})
    scope_of_cohort = fleet_stats.index.to_numpy() // N_METRICS // (len(run.models) + 1)
    enough = (fleet_stats["nodes"].to_numpy() >= policy.fleet.min_nodes) & (
        (fleet_stats["gpus"].to_numpy() >= policy.fleet.min_gpus) | (scope_of_cohort != SCOPE_GPU)
    )
    fleet_stats["usable"] = enough
    factor_by_cohort = fleet_stats["f"].where(fleet_stats["usable"])
    fleet_factor = factor_by_cohort.reindex(cohort).to_numpy()
    fleet_factor = np.where(np.isfinite(fleet_factor), fleet_factor, 1.0)

    # -- the primary reference of each result ------------------------------------------------------
    has_model = np.isfinite(model_center) & (model_center > 0)
    kind = np.where(has_own, "own", np.where(has_peers, "peer", np.where(has_model, "model", "")))
    ref = np.select(
        [has_own, has_peers, has_model],
        [own_center * fleet_factor, peer_median, model_center * fleet_factor],
        default=np.nan,
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        own_sigma = np.maximum(own_spread / own_center, cv_rep)
        model_sigma = np.maximum(model_spread / model_center, cv_unit)
    sigma = np.select([has_own, has_peers, has_model], [own_sigma, peer_sigma, model_sigma], default=np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = x / ref - 1
        z = d / sigma

    # -- node-internal: leave-one-out median of the baseline-normalised GPUs of the node ------------
    d_node = np.full(len(x), np.nan)
    gpu_own = (scope == SCOPE_GPU) & has_own
    if gpu_own.any():
        idx = np.where(gpu_own, ratio / fleet_factor, np.nan)
        loo = _leave_one_out_median(node[gpu_own] * N_METRICS + mcode[gpu_own], idx[gpu_own])
        with np.errstate(divide="ignore", invalid="ignore"):
            d_node[gpu_own] = idx[gpu_own] / loo - 1

    table = pd.DataFrame(
        {
            "eid": eid,
            "mcode": mcode,
            "x": x,
            "kind": kind,
            "ref": ref,
            "d": d,
            "z": z,
            "sigma": sigma,
            "has_own": has_own,
            "d_node": d_node,
            "fleet_factor": fleet_factor,
        }
    )
    warn_drop = per_metric(policy, "warn_drop_pct")[mcode] / 100
    warn_z = per_metric(policy, "warn_z")[mcode]
    fail_drop = per_metric(policy, "fail_drop_pct")[mcode] / 100
    node_drop = per_metric(policy, "node_drop_pct")[mcode] / 100

    strong = z <= -warn_z
    # An unstable median is not judged to a fail: it warns, and the reasons ask for a re-run (§4.3).
    unstable = measured["unstable"].to_numpy() if "unstable" in measured else np.zeros(len(x), dtype=bool)
    primary_fail = strong & (d <= -fail_drop) & ~unstable
    primary_warn = strong & (d <= -warn_drop) & ~primary_fail
    peer_warn = has_own & has_peers & (d_peer <= -fail_drop) & (z_peer <= -policy.peers.with_history_z)
    node_fail = np.isfinite(d_node) & (d_node <= -node_drop) & ~unstable

    floor = _floors(run, model, mcode, floors)
    below_floor = np.isfinite(floor) & (x < floor) & ~unstable

    shift = np.where(
        np.abs(fleet_factor - 1) >= 5e-4, fleet_factor - 1, np.nan
    )  # shown when it rounds to 0.1 %
    findings = concat_findings(
        [
            _stat(run, table, primary_fail, "fail", ref, d, z, kind, shift),
            _stat(run, table, primary_warn, "warn", ref, d, z, kind, shift),
            _stat(run, table, peer_warn & ~primary_fail, "warn", peer_median, d_peer, z_peer, "peer", None),
            _stat(
                run, table, node_fail, "fail", x / (1 + d_node), d_node, np.full(len(x), np.nan), "node", None
            ),
            _spec(run, table, below_floor, floor),
        ]
    )
    fleet = _fleet_rows(run, fleet_stats, policy)
    return Judged(table=table, findings=findings, fleet=fleet)


def _leave_one_out_median(group: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each value, the median of the *other* values of its group (NaN for groups under 3)."""
    order = np.lexsort((values, group))
    g_sorted = group[order]
    v_sorted = values[order]
    starts = np.flatnonzero(np.r_[True, g_sorted[1:] != g_sorted[:-1]])
    sizes = np.diff(np.r_[starts, len(g_sorted)])
    size = np.repeat(sizes, sizes)
    start = np.repeat(starts, sizes)
    rank = np.arange(len(g_sorted)) - start
    m = size - 1  # how many others

    def pick(k: np.ndarray) -> np.ndarray:
        pos = start + k + (k >= rank)
        picked: np.ndarray = v_sorted[np.clip(pos, 0, len(v_sorted) - 1)]
        return picked

    lo = pick((m - 1) // 2)
    hi = pick(m // 2)
    out_sorted = np.where(m >= 2, (lo + hi) / 2, np.nan)
    out = np.empty_like(out_sorted)
    out[order] = out_sorted
    return out


def _floors(
    run: RunIndex, model: np.ndarray, mcode: np.ndarray, floors: dict[tuple[str, str], float]
) -> np.ndarray:
    if not floors:
        return np.full(len(model), np.nan)
    table = np.full((len(run.models) + 1, N_METRICS), np.nan)
    model_pos = {str(name): i for i, name in enumerate(run.models)}
    for (model_name, metric_name), value in floors.items():
        if model_name in model_pos and metric_name in METRIC_NAMES:
            table[model_pos[model_name], METRIC_NAMES.index(metric_name)] = value
    out: np.ndarray = table[model, mcode]
    return out


REF_WORDS = {
    "own": "its own baseline",
    "peer": "the median of its peers in this run",
    "model": "the stored reference for its model",
    "node": "the other GPUs of its node",
}


def _stat(
    run: RunIndex,
    table: pd.DataFrame,
    mask: np.ndarray,
    severity: str,
    ref: np.ndarray,
    d: np.ndarray,
    z: np.ndarray,
    kind: np.ndarray | str,
    shift: np.ndarray | None,
) -> pd.DataFrame:
    rows = np.flatnonzero(mask)
    if len(rows) == 0:
        return make_findings("gpu", [], severity=severity, rank="stat", reason=[])
    eids = table["eid"].to_numpy()[rows]
    names = np.array(METRIC_NAMES, dtype=object)[table["mcode"].to_numpy()[rows]]
    kinds = np.broadcast_to(np.asarray(kind, dtype=object), mask.shape)[rows]
    x = table["x"].to_numpy()[rows]
    shifts = shift[rows] if shift is not None else np.full(len(rows), np.nan)
    reason = [
        f"{m} {xv:.4g} is {-dv * 100:.1f} % below {REF_WORDS[k]} ({rv:.4g}"
        + (f", z {zv:.1f}" if np.isfinite(zv) else "")
        + (f", after the fleet-wide {sv * 100:+.1f} % shift" if k == "own" and np.isfinite(sv) else "")
        + ")"
        for m, xv, dv, k, rv, zv, sv in zip(names, x, d[rows], kinds, ref[rows], z[rows], shifts, strict=True)
    ]
    return make_findings(
        np.array(["gpu", "node", "pair"], dtype=object)[run.scope[eids]],
        run.node_names(eids),
        gpu=run.gpu[eids],
        peer=run.peer_names(eids),
        severity=severity,
        rank="stat",
        metric=names,
        value=x,
        reference=ref[rows],
        deviation_pct=d[rows] * 100,
        z=z[rows],
        reference_kind=kinds,
        reason=reason,
    )


def _spec(run: RunIndex, table: pd.DataFrame, mask: np.ndarray, floor: np.ndarray) -> pd.DataFrame:
    rows = np.flatnonzero(mask)
    if len(rows) == 0:
        return make_findings("gpu", [], severity="fail", rank="spec", reason=[])
    eids = table["eid"].to_numpy()[rows]
    names = np.array(METRIC_NAMES, dtype=object)[table["mcode"].to_numpy()[rows]]
    x = table["x"].to_numpy()[rows]
    f = floor[rows]
    models = run.model_names(eids)
    reason = [
        f"{m} {xv:.4g} is under the spec floor {fv:.4g} for {mo}"
        for m, xv, fv, mo in zip(names, x, f, models, strict=True)
    ]
    return make_findings(
        np.array(["gpu", "node", "pair"], dtype=object)[run.scope[eids]],
        run.node_names(eids),
        gpu=run.gpu[eids],
        peer=run.peer_names(eids),
        severity="fail",
        rank="spec",
        metric=names,
        value=x,
        reference=f,
        deviation_pct=(x / f - 1) * 100,
        reference_kind="spec",
        reason=reason,
    )


def _fleet_rows(run: RunIndex, stats: pd.DataFrame, policy: Policy) -> pd.DataFrame:
    """One fleet-level finding per GPU model whose cohort shifted against its own baselines (DESIGN.md:
    "one row with node and gpu empty"); the largest shift decides, every shifted metric is a reason."""
    shifted = stats[stats["usable"] & (np.abs(stats["f"] - 1) * 100 >= policy.fleet.report_pct)]
    if shifted.empty:
        return make_findings("fleet", [], severity="warn", rank="stat", reason=[])
    keys = shifted.index.to_numpy(dtype=np.int64)
    cohort = keys // N_METRICS
    frame = pd.DataFrame(
        {
            "model": np.asarray(run.models, dtype=object)[cohort % (len(run.models) + 1)],
            "metric": np.array(METRIC_NAMES, dtype=object)[keys % N_METRICS],
            "f": shifted["f"].to_numpy(),
            "count": shifted["gpus"].to_numpy(),
            "unit": np.where(cohort // (len(run.models) + 1) == SCOPE_GPU, "GPUs", "nodes"),
            "nodes": shifted["nodes"].to_numpy(),
        }
    )
    frame["size"] = np.abs(frame["f"] - 1)
    frame = frame.sort_values(["model", "size", "metric"], ascending=[True, False, True])
    # ", " between metrics: "; " separates whole reasons in the verdict table.
    frame["part"] = [
        f"{m} {(fv - 1) * 100:+.1f} % ({c} {u}" + (f" on {n} nodes)" if u == "GPUs" else ")")
        for m, fv, c, u, n in zip(
            frame["metric"], frame["f"], frame["count"], frame["unit"], frame["nodes"], strict=True
        )
    ]
    per_model = frame.groupby("model", sort=True).agg(
        metric=("metric", "first"), f=("f", "first"), parts=("part", ", ".join)
    )
    f = per_model["f"].to_numpy()
    reason = [
        f"the whole {model} cohort moved against its own baselines — {parts}: a fleet-wide shift points at the "
        "stack (driver, CUDA, firmware) or the benchmark, so no GPU is flagged for it"
        for model, parts in zip(per_model.index, per_model["parts"], strict=True)
    ]
    return make_findings(
        "fleet",
        np.full(len(per_model), "", dtype=object),
        severity="warn",
        rank="stat",
        metric=per_model["metric"].to_numpy(),
        value=f,
        reference=1.0,
        deviation_pct=(f - 1) * 100,
        reference_kind="fleet",
        cause="config",
        action="review_stack",
        reason=reason,
    )
