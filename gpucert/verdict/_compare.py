"""Stages 2 and 3 (docs/design/verdict-engine.md): each median against its references, flagged only when the drop
is both large (a deviation gate) and strong (a z gate).

The references, per entity × metric, in the order they are preferred: **own** (the GPU's or node's own baseline,
corrected by the *fleet factor*: the median ratio of the whole cohort to its own baselines, so a fleet-wide shift
flags no GPU and is reported once, as a ``fleet`` row), **peer** (the run's cohort of the same model), **model**
(the stored per-model reference). Beside them, **node** (the other GPUs of the node, leave-one-out, on
baseline-normalised values) and **spec**, a floor that fails only when something backs the miss, else warns
(docs/reference/policy.md, "Spec floors"); a host-side metric (:data:`HOST_METRICS`) under the floor on most GPUs
of a node whose links are at spec is one node finding, cause ``config``, and its GPUs only warn.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..policy import Policy
from ._findings import SEVERITY, concat_findings, entity_findings, make_findings
from ._index import MCODE, METRIC_NAMES, N_METRICS, SCOPE_GPU, SCOPE_NODE, RunIndex, group_positions, nan_median

__all__ = ["HOST_METRICS", "REF_WORDS", "StoredReferences", "compare_references", "link_signature", "per_metric"]

_MAD_TO_SIGMA = 1.4826
#: The kinds of primary reference, in order of preference ("" where there is none).
_KINDS = pd.Index(["own", "peer", "model", ""])

#: Metrics whose path runs through the host (CPU, memory controller, root complex, IOMMU), so the host's
#: NUMA binding, CPU load or BIOS moves them with the GPU healthy: copy engines over PCIe, and storage
#: reads into host memory. GEMM, HBM and the NVLink all-reduce stay on the GPU or its baseboard.
HOST_METRICS = frozenset({"h2d_gbps", "d2h_gbps", "storage_read_gbps"})
_IS_HOST = np.isin(np.array(METRIC_NAMES, dtype=object), list(HOST_METRICS))


@dataclass(frozen=True)
class Comparison:
    """Every entity × metric with its primary reference and what the comparisons found."""

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


@dataclass(frozen=True)
class _Baseline:
    """The store's table as the lookups need it: text columns in Arrow (hashed in C++), numbers in numpy."""

    level: pa.Array
    key: pa.Array
    mcode: np.ndarray
    center: np.ndarray
    spread: np.ndarray

    @classmethod
    def of(cls, baseline: pd.DataFrame) -> _Baseline:
        return cls(
            level=_arrow_text(baseline["level"]),
            key=_arrow_text(baseline["key"]),
            mcode=_positions(_arrow_text(baseline["metric"]), pd.Index(METRIC_NAMES)),
            center=baseline["center"].to_numpy(dtype=float),
            spread=baseline["spread"].to_numpy(dtype=float),
        )


def _arrow_text(values: pd.Series | pd.Index) -> pa.Array:
    text: pa.Array = pa.array(values, type=pa.large_string(), from_pandas=True)
    return text


def _positions(values: pa.Array, names: pd.Index) -> np.ndarray:
    """Position of each value in ``names`` (-1 when absent), from one hash of ``names`` in Arrow: the
    fastest string → position mapping at 400,000 baseline rows. A stretch of equal values (a GPU's
    metrics stand together in a baseline) is looked up once."""
    starts = _stretches(values)
    lookup = values if starts is None else values.take(pa.array(starts, type=pa.int64()))
    found = pc.index_in(lookup, value_set=_arrow_text(names))
    positions: np.ndarray = np.asarray(pc.fill_null(found, -1).to_numpy(), dtype=np.int64)
    if starts is None:
        return positions
    return np.repeat(positions, np.diff(np.append(starts, len(values))))


def _stretches(values: pa.Array) -> np.ndarray | None:
    """Where each stretch of equal values starts; ``None`` when they are too short to be worth it."""
    if len(values) < 2:
        return None
    changes = pc.fill_null(pc.not_equal(values[1:], values[:-1]), True)
    starts = np.flatnonzero(changes.to_numpy(zero_copy_only=False)) + 1
    if len(starts) > len(values) // 2:
        return None
    return np.concatenate(([0], starts))


def _baseline_keys(baseline: _Baseline, level: str, names: pd.Index) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of one baseline level keyed as run code × metric code (rows the run lacks dropped), with
    their ``center`` and ``spread``."""
    if not len(names):
        return np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0)
    at_level = pc.fill_null(pc.equal(baseline.level, pa.scalar(level, pa.large_string())), False)
    rows = np.flatnonzero(at_level.to_numpy(zero_copy_only=False))
    codes = _positions(baseline.key.take(pa.array(rows, type=pa.int64())), names)
    known = codes >= 0
    rows = rows[known]
    return codes[known] * N_METRICS + baseline.mcode[rows], baseline.center[rows], baseline.spread[rows]


def _center_spread(
    index_keys: np.ndarray, centers: np.ndarray, spreads: np.ndarray, span: int, keys: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The baseline ``center`` and ``spread`` at each of ``keys`` (NaN where absent). ``index_keys`` are
    unique (the baseline's (level, key, metric) is) and below ``span``: a table lookup, no hash."""
    if len(index_keys) == 0:
        return np.full(len(keys), np.nan), np.full(len(keys), np.nan)
    table = np.full(span, -1, dtype=np.int64)
    table[index_keys] = np.arange(len(index_keys))
    position = table[keys]
    found = position >= 0
    at = np.maximum(position, 0)
    center = np.where(found, centers[at], np.nan)
    spread = np.where(found, spreads[at], np.nan)
    return center, spread


@dataclass(frozen=True)
class StoredReferences:
    """The store's references keyed on one run's codes, per level: each row's key (run code × metric code,
    rows the run does not name dropped), ``center`` and ``spread``."""

    gpu: tuple[np.ndarray, np.ndarray, np.ndarray]
    node: tuple[np.ndarray, np.ndarray, np.ndarray]
    model: tuple[np.ndarray, np.ndarray, np.ndarray]

    @classmethod
    def of(cls, run: RunIndex, baseline: pd.DataFrame) -> StoredReferences:
        """``baseline`` (the store's table) for ``run``: a hash of its text per level, made once."""
        base = _Baseline.of(baseline)
        return cls(
            gpu=_baseline_keys(base, "gpu", run.uuids),
            node=_baseline_keys(base, "node", run.nodes),
            model=_baseline_keys(base, "model", run.models),
        )


def compare_references(
    run: RunIndex,
    measured: pd.DataFrame,
    references: StoredReferences,
    policy: Policy,
    floors: dict[tuple[str, str], float],
) -> Comparison:
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
    for (bkeys, centers, spreads), scope_id, codes, names in (
        (references.gpu, SCOPE_GPU, run.uuid_code[eid], run.uuids),
        (references.node, SCOPE_NODE, node, run.nodes),
    ):
        if len(bkeys) == 0:
            continue
        mine = (scope == scope_id) & (codes >= 0)
        keys = codes[mine] * N_METRICS + mcode[mine]
        own_center[mine], own_spread[mine] = _center_spread(bkeys, centers, spreads, len(names) * N_METRICS, keys)
    has_own = np.isfinite(own_center) & (own_center > 0)

    # -- stored per-model reference ----------------------------------------------------------------
    mkeys, centers, spreads = references.model
    model_center, model_spread = _center_spread(
        mkeys, centers, spreads, len(run.models) * N_METRICS, model * N_METRICS + mcode
    )

    # -- the run's cohort: same scope, model and metric --------------------------------------------
    cohort = (scope * (len(run.models) + 1) + model) * N_METRICS + mcode
    peer_median = np.empty(len(x))
    peer_mad = np.empty(len(x))
    peer_nodes = np.empty(len(x), dtype=np.int64)
    for members in group_positions(cohort):
        values = x[members]
        peer_median[members] = center = nan_median(values)
        peer_mad[members] = nan_median(np.abs(values - center))
        peer_nodes[members] = np.count_nonzero(np.bincount(node[members]))
    has_peers = peer_nodes >= policy.peers.min_nodes
    with np.errstate(divide="ignore", invalid="ignore"):
        peer_sigma = np.maximum(_MAD_TO_SIGMA * peer_mad / peer_median, policy.peers.cv_floor_factor * cv_unit)
        d_peer = x / peer_median - 1
        z_peer = d_peer / peer_sigma

    # -- the fleet factor: how the whole cohort moved against its own baselines --------------------
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(has_own, x / own_center, np.nan)
    fleet_stats = _fleet_stats(cohort[has_own], ratio[has_own], node[has_own])
    scope_of_cohort = fleet_stats.index.to_numpy() // N_METRICS // (len(run.models) + 1)
    enough = (fleet_stats["nodes"].to_numpy() >= policy.fleet.min_nodes) & (
        (fleet_stats["gpus"].to_numpy() >= policy.fleet.min_gpus) | (scope_of_cohort != SCOPE_GPU)
    )
    fleet_stats["usable"] = enough
    fleet_factor = fleet_stats["f"].where(enough).reindex(cohort).to_numpy()
    fleet_factor = np.where(np.isfinite(fleet_factor), fleet_factor, 1.0)

    # -- the primary reference of each result ------------------------------------------------------
    primary = [has_own, has_peers, np.isfinite(model_center) & (model_center > 0)]
    kind = pd.Categorical.from_codes(np.select(primary, [0, 1, 2], default=3), categories=_KINDS)
    ref = np.select(primary, [own_center * fleet_factor, peer_median, model_center * fleet_factor], default=np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        own_sigma = np.maximum(own_spread / own_center, cv_rep)
        model_sigma = np.maximum(model_spread / model_center, cv_unit)
    sigma = np.select(primary, [own_sigma, peer_sigma, model_sigma], default=np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = x / ref - 1
        z = d / sigma

    # -- node-internal: leave-one-out median of the baseline-normalised GPUs of the node ------------
    d_node = np.full(len(x), np.nan)
    gpu_own = (scope == SCOPE_GPU) & has_own
    if gpu_own.any():
        idx = np.where(gpu_own, ratio / fleet_factor, np.nan)
        loo = _leave_one_out_median(node[gpu_own] * N_METRICS + mcode[gpu_own], idx[gpu_own], run.gpu[eid[gpu_own]])
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
    backing = _floor_backing(run, table, own_center * fleet_factor, own_sigma, warn_drop, warn_z, policy)
    node_low = _host_low_nodes(run, table, floor, below_floor, backing, policy)

    shift = np.where(np.abs(fleet_factor - 1) >= 5e-4, fleet_factor - 1, np.nan)  # shown when it rounds to 0.1 %
    findings = concat_findings(
        [
            _stat(run, table, primary_fail, "fail", ref, d, z, kind, shift),
            _stat(run, table, primary_warn, "warn", ref, d, z, kind, shift),
            _stat(run, table, peer_warn & ~primary_fail, "warn", peer_median, d_peer, z_peer, "peer", None),
            _stat(run, table, node_fail, "fail", x / (1 + d_node), d_node, np.full(len(x), np.nan), "node", None),
            _spec(run, table, below_floor, floor, backing, node_low),
            _host_node_spec(run, node_low),
        ]
    )
    fleet = _fleet_rows(run, fleet_stats, policy)
    return Comparison(table=table, findings=findings, fleet=fleet)


def _fleet_stats(cohort: np.ndarray, ratio: np.ndarray, node: np.ndarray) -> pd.DataFrame:
    """Per cohort (the index, in order of first appearance): ``f`` the median ratio to the own baselines,
    ``gpus`` how many results, ``nodes`` on how many nodes."""
    groups = group_positions(cohort)
    return pd.DataFrame(
        {
            "f": [nan_median(ratio[g]) for g in groups],
            "gpus": np.array([len(g) for g in groups], dtype=np.int64),
            "nodes": np.array([np.count_nonzero(np.bincount(node[g])) for g in groups], dtype=np.int64),
        },
        index=pd.Index(np.array([cohort[g[0]] for g in groups], dtype=cohort.dtype), name="c"),
    )


def _leave_one_out_median(group: np.ndarray, values: np.ndarray, slot: np.ndarray | None = None) -> np.ndarray:
    """For each value, the median of the *other* values of its group (NaN for groups under 3).

    ``slot``, when given, is each value's place in its group (a GPU's index in its node × metric): then
    each group is one short row of a matrix, sorted on its own, instead of a sort of every value.
    """
    if slot is not None and len(values):
        by_rows = _leave_one_out_by_rows(group, values, slot)
        if by_rows is not None:
            return by_rows
    # Sorted by group, then by value: two stable sorts (the order np.lexsort gives, faster).
    by_value = np.argsort(values, kind="stable")
    order = by_value[np.argsort(group[by_value], kind="stable")]
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


def _leave_one_out_by_rows(group: np.ndarray, values: np.ndarray, slot: np.ndarray) -> np.ndarray | None:
    """:func:`_leave_one_out_median` with each group a row of a matrix; ``None`` when the slots do not
    make one (two values in one cell) or a value is not finite."""
    if not (np.isfinite(values).all() and slot.min() >= 0 and slot.max() < 1024):
        return None
    present = np.zeros(int(group.max()) + 1, dtype=bool)
    present[group] = True
    row_of = np.cumsum(present) - 1
    row = row_of[group]
    rows, width = int(row_of[-1]) + 1, int(slot.max()) + 1
    matrix = np.full((rows, width), np.inf)  # the padding sorts last
    matrix[row, slot] = values
    if np.count_nonzero(np.isfinite(matrix)) != len(values):
        return None
    matrix.sort(axis=1)
    size = np.bincount(row, minlength=rows)[row]
    # A value's rank among its group, the first of equal ones: leaving out any of equal values leaves the
    # same others.
    rank = (matrix[row] < values[:, None]).sum(axis=1)
    m = size - 1  # how many others

    def pick(k: np.ndarray) -> np.ndarray:
        picked: np.ndarray = matrix[row, np.clip(k + (k >= rank), 0, width - 1)]
        return picked

    lo = pick((m - 1) // 2)
    hi = pick(m // 2)
    out: np.ndarray = np.where(m >= 2, (lo + hi) / 2, np.nan)
    return out


def _floors(run: RunIndex, model: np.ndarray, mcode: np.ndarray, floors: dict[tuple[str, str], float]) -> np.ndarray:
    table = np.full((len(run.models) + 1, N_METRICS), np.nan)
    model_pos = {str(name): i for i, name in enumerate(run.models)}
    for (model_name, metric_name), value in floors.items():
        if model_name in model_pos and metric_name in MCODE:
            table[model_pos[model_name], MCODE[metric_name]] = value
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
    kind: pd.Categorical[str] | str,
    shift: np.ndarray | None,
) -> pd.DataFrame:
    rows = np.flatnonzero(mask)
    if len(rows) == 0:
        return make_findings("gpu", [], severity=severity, rank="stat", reason=[])
    eids = table["eid"].to_numpy()[rows]
    names = np.array(METRIC_NAMES, dtype=object)[table["mcode"].to_numpy()[rows]]
    # Only the flagged rows' kinds as objects, not the whole table's.
    kinds = np.asarray(kind[rows] if isinstance(kind, pd.Categorical) else np.full(len(rows), kind), dtype=object)
    x = table["x"].to_numpy()[rows]
    shifts = shift[rows] if shift is not None else np.full(len(rows), np.nan)
    reason = [
        f"{m} {xv:.4g} is {-dv * 100:.1f} % below {REF_WORDS[k]} ({rv:.4g}"
        + (f", z {zv:.1f}" if np.isfinite(zv) else "")
        + (f", after the fleet-wide {sv * 100:+.1f} % shift" if k == "own" and np.isfinite(sv) else "")
        + ")"
        for m, xv, dv, k, rv, zv, sv in zip(names, x, d[rows], kinds, ref[rows], z[rows], shifts, strict=True)
    ]
    return entity_findings(
        run,
        eids,
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


def link_signature(telemetry: np.ndarray, policy: Policy) -> np.ndarray:
    """Rows of ``telemetry`` (entity × metric code) whose PCIe link is below spec: trained down in
    generation or width, or replaying over the gate. NaN (not reported) is no signature."""

    def t(name: str) -> np.ndarray:
        column: np.ndarray = telemetry[:, MCODE[name]]
        return column

    with np.errstate(invalid="ignore"):
        low: np.ndarray = (
            (t("pcie_gen") < t("pcie_gen_max"))
            | (t("pcie_width") < t("pcie_width_max"))
            | (t("pcie_replays_per_min") > policy.gates.pcie_replays_per_min)
        )
    return low


@dataclass(frozen=True)
class _Backing:
    """What stands behind a floor miss, per result. A floor catches gross faults
    (docs/reference/reference-values.md, "Initial hard floors"), so a miss fails only with one of these;
    without any it is noise at the floor."""

    #: the value against its own baseline after the night's fleet-wide shift; NaN without one
    d_own: np.ndarray
    own_center: np.ndarray
    fleet_factor: np.ndarray
    d_node: np.ndarray
    #: a warn-size drop against the own baseline
    own: np.ndarray
    #: its whole cohort moved a warn-size drop against its own baselines: the floor is what still holds
    fleet: np.ndarray
    #: a GPU the other GPUs of its node do not agree with (a warn-size drop against them, or no
    #: leave-one-out reference to say they agree)
    node: np.ndarray
    #: a host-side metric on a GPU whose PCIe link is below spec
    link: np.ndarray
    #: no own baseline: nothing to weigh the floor against, and the floor is then the only absolute
    no_history: np.ndarray

    @property
    def backed(self) -> np.ndarray:
        backed: np.ndarray = self.own | self.fleet | self.node | self.link | self.no_history
        return backed


def _floor_backing(
    run: RunIndex,
    table: pd.DataFrame,
    own_center: np.ndarray,
    own_sigma: np.ndarray,
    warn_drop: np.ndarray,
    warn_z: np.ndarray,
    policy: Policy,
) -> _Backing:
    """What backs each result's floor miss (``table``: :class:`Comparison`'s); ``own_center`` is already
    shifted by the fleet factor."""
    eid, mcode, x, has_own = (table[c].to_numpy() for c in ("eid", "mcode", "x", "has_own"))
    fleet_factor, d_node = table["fleet_factor"].to_numpy(), table["d_node"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        d_own = np.where(has_own, x / own_center - 1, np.nan)
        own = has_own & (d_own <= -warn_drop) & (d_own / own_sigma <= -warn_z)
    fleet = has_own & (fleet_factor - 1 <= -warn_drop)
    gpu = run.scope[eid] == SCOPE_GPU
    node = gpu & ~(np.isfinite(d_node) & (d_node > -warn_drop))
    link = gpu & _IS_HOST[mcode] & link_signature(run.telemetry, policy)[eid]
    return _Backing(d_own, own_center, fleet_factor, d_node, own, fleet, node, link, no_history=~has_own)


@dataclass(frozen=True)
class _HostLow:
    """Host-side metrics under the floor on most GPUs of a node whose PCIe links are at spec."""

    #: per result: a GPU of such a node (its own link at spec), on that metric
    rows: np.ndarray
    #: node code, mcode, x and d_own (medians of its GPUs), fleet, floor, gpus, below, backed; per
    #: node × metric
    nodes: pd.DataFrame


def _host_low_nodes(
    run: RunIndex, table: pd.DataFrame, floor: np.ndarray, below_floor: np.ndarray, backing: _Backing, policy: Policy
) -> _HostLow:
    """The nodes whose GPUs, links at spec, sit under a host-side floor by their median (at least half of
    them under it): the host moves them all, so the finding is the node's (docs/reference/causes-and-actions.md,
    "Remediation playbook": H2D low with the link at spec). It is backed (a fail) when the GPUs' median also
    dropped against their own baselines, or they have none; a node that has always measured this low only
    warns."""
    eid, mcode, x = (table[c].to_numpy() for c in ("eid", "mcode", "x"))
    scope = run.scope[eid]
    host = (scope == SCOPE_GPU) & _IS_HOST[mcode] & np.isfinite(floor) & ~backing.link
    node = run.node_code[eid]
    key = node * N_METRICS + mcode
    # Only a node × metric with a GPU under the floor can be low: on a healthy fleet, none is grouped.
    missed = np.zeros(len(run.nodes) * N_METRICS, dtype=bool)
    missed[key[host & below_floor]] = True
    host &= missed[key]
    if not host.any():
        empty = pd.DataFrame(columns=["node", "mcode", "x", "d_own", "fleet", "floor", "gpus", "below", "backed"])
        return _HostLow(rows=np.zeros(len(x), dtype=bool), nodes=empty)
    frame = pd.DataFrame(
        {
            "node": node[host],
            "mcode": mcode[host],
            "x": x[host],
            "floor": floor[host],
            "below": below_floor[host],
            "d_own": backing.d_own[host],
            "fleet": backing.fleet[host],
        }
    )
    grouped = frame.groupby(["node", "mcode"], sort=True)
    how = {"x": "median", "floor": "first", "below": "sum", "d_own": "median", "fleet": "any"}
    agg = grouped.agg(how).assign(gpus=grouped.size()).reset_index()
    low = agg[(agg["gpus"] >= 3) & (agg["x"] < agg["floor"])].reset_index(drop=True)
    warn_drop = per_metric(policy, "warn_drop_pct")[low["mcode"].to_numpy()] / 100
    # NaN (no history) is backed, and so is a fleet that collapsed under the floor as a whole.
    low["backed"] = ~(low["d_own"].to_numpy() > -warn_drop) | low["fleet"].to_numpy(dtype=bool)
    is_low = np.zeros(len(run.nodes) * N_METRICS, dtype=bool)
    is_low[low["node"].to_numpy(dtype=np.int64) * N_METRICS + low["mcode"].to_numpy(dtype=np.int64)] = True
    rows = host & below_floor & is_low[key]
    return _HostLow(rows=rows, nodes=low)


def _spec(
    run: RunIndex, table: pd.DataFrame, mask: np.ndarray, floor: np.ndarray, backing: _Backing, host_low: _HostLow
) -> pd.DataFrame:
    """One finding per floor miss: a fail when something backs it, else a warn (see the module)."""
    rows = np.flatnonzero(mask)
    if len(rows) == 0:
        return make_findings("gpu", [], severity="fail", rank="spec", reason=[])
    eids = table["eid"].to_numpy()[rows]
    scope = run.scope[eids]
    names = np.array(METRIC_NAMES, dtype=object)[table["mcode"].to_numpy()[rows]]
    x = table["x"].to_numpy()[rows]
    f = floor[rows]
    models = run.model_names(eids)
    on_host_node = host_low.rows[rows]
    # What backs each miss, the first that applies (the order of the words a technician reads).
    backer = np.select(
        [on_host_node, *(getattr(backing, k)[rows] for k in ("link", "own", "fleet", "no_history", "node"))],
        ["host", "link", "own", "fleet", "no_history", "node"],
        default="",
    )
    backed = backing.backed[rows] & ~on_host_node
    why = [_floor_words(b, backing, i, s == SCOPE_GPU) for b, i, s in zip(backer, rows.tolist(), scope, strict=True)]
    reason = [
        f"{m} {xv:.4g} is under the spec floor {fv:.4g} for {mo}{w}"
        for m, xv, fv, mo, w in zip(names, x, f, models, why, strict=True)
    ]
    return entity_findings(
        run,
        eids,
        severity=np.where(backed, SEVERITY["fail"], SEVERITY["warn"]),
        rank="spec",
        metric=names,
        value=x,
        reference=f,
        deviation_pct=(x / f - 1) * 100,
        reference_kind="spec",
        # The host's on a host-low node, as its node row says; noise at the floor names no cause; a backed
        # miss is attributed with the telemetry afterwards.
        cause=np.where(on_host_node, "config", np.where(backed, "", "unknown")),
        action=np.where(on_host_node, "fix_config", np.where(backed, "none", "retest")),
        reason=reason,
    )


def _floor_words(backer: str, backing: _Backing, i: int, is_gpu: bool) -> str:
    """What backs the floor miss of result ``i``, or why it does not fail (``backer`` empty)."""
    d_own, own_center, d_node = backing.d_own[i], backing.own_center[i], backing.d_node[i]
    fleet_factor = backing.fleet_factor[i]
    # The own baseline shown is the one judged: shifted as the whole cohort moved tonight.
    shifted = f", after the fleet-wide {(fleet_factor - 1) * 100:+.1f} % shift" if abs(fleet_factor - 1) >= 5e-4 else ""
    if backer == "host":
        return ", as are most GPUs of its node, PCIe links at spec: the host's, not the GPU's (see the node's row)"
    if backer == "link":
        return ", with its PCIe link below spec"
    if backer == "own":
        return f", {-d_own * 100:.1f} % below its own baseline ({own_center:.4g}{shifted})"
    if backer == "fleet":
        return f", with its whole cohort {(fleet_factor - 1) * 100:+.1f} % against their own baselines"
    if backer == "no_history":
        return ", with no history of its own to weigh it against"
    if backer == "node":
        if np.isfinite(d_node):
            return f", {-d_node * 100:.1f} % behind the other GPUs of its node"
        return ", with no other GPUs of its node to weigh it against"
    agree = " and the other GPUs of its node agree" if is_gpu else " agrees"
    return (
        f", but its own baseline ({own_center:.4g}{shifted}){agree} with it: noise at the floor, not a fault; re-test"
    )


def _host_node_spec(run: RunIndex, host_low: _HostLow) -> pd.DataFrame:
    """The node finding of a host-side metric under its floor on most of a node's GPUs (links at spec)."""
    low = host_low.nodes
    if low.empty:
        return make_findings("node", [], severity="fail", rank="spec", reason=[])
    node_names = np.asarray(run.nodes, dtype=object)[low["node"].to_numpy(dtype=np.int64)]
    names = np.array(METRIC_NAMES, dtype=object)[low["mcode"].to_numpy(dtype=np.int64)]
    node_model = np.zeros(len(run.nodes), dtype=np.int64)
    node_model[run.node_code] = run.model_code
    models = np.asarray(run.models, dtype=object)[node_model[low["node"].to_numpy(dtype=np.int64)]]
    x = low["x"].to_numpy(dtype=float)
    f = low["floor"].to_numpy(dtype=float)
    backed = low["backed"].to_numpy(dtype=bool)
    reason = [
        f"{m}: {int(b)} of the node's {int(n)} GPUs are under the spec floor {fv:.4g} for {mo} (median "
        f"{xv:.4g}) with their PCIe links at spec: the host, not the GPUs — fix NUMA/CPU affinity, stop noisy "
        "processes, check the BIOS and IOMMU settings"
        + ("" if bk else "; they have always measured this low (their own baselines agree)")
        for m, b, n, fv, mo, xv, bk in zip(names, low["below"], low["gpus"], f, models, x, backed, strict=True)
    ]
    return make_findings(
        "node",
        node_names,
        severity=np.where(backed, SEVERITY["fail"], SEVERITY["warn"]),
        rank="spec",
        metric=names,
        value=x,
        reference=f,
        deviation_pct=(x / f - 1) * 100,
        reference_kind="spec",
        cause="config",
        action="fix_config",
        ticket=np.where(backed, "remediation", "none"),
        reason=reason,
    )


def _fleet_rows(run: RunIndex, stats: pd.DataFrame, policy: Policy) -> pd.DataFrame:
    """One fleet-level finding per GPU model whose cohort shifted against its own baselines
    (docs/design/data-contracts.md, "Verdicts": one row with node and gpu empty); the largest shift decides,
    every shifted metric is a reason."""
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
