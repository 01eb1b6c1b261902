"""Stage 1 (REFERENCE.md §4.3): repeated measurements reduced to a median, and their stability judged.

The median of the repeats is what the references compare, so one transient bad repeat among three moves
nothing; it is still *named*, because a technician reading the report should know it happened. When the
repeats disagree as a whole (robust CV above ``unstable_factor`` × the expected run-to-run CV) the result
is UNSTABLE — oscillating throttling or a noisy neighbour — which warns and asks for a re-run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..policy import Policy
from ._findings import concat_findings, make_findings
from ._index import DIRECTION, IS_PERF, METRIC_NAMES, N_METRICS, RunIndex

__all__ = ["reduce_repeats"]

_MAD_TO_SIGMA = 1.4826


# Median of 1.4826·MAD / σ over normal samples of n repeats (simulated, 400,000 draws each): the factor
# that turns the cohort's median robust CV into an estimate of its run-to-run CV.
_MAD_MEDIAN_FACTOR = np.array(
    [np.nan, np.nan, 0.707, 0.5344, 0.6724, 0.7474, 0.7909, 0.8273, 0.849, 0.8692, 0.8813]
)
_MIN_COHORT = 30  # results needed before tonight's noise is estimated from the cohort


def reduce_repeats(run: RunIndex, policy: Policy) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return (one row per entity × perf metric: eid, mcode, x, n, cv_mad, unstable; findings)."""
    rows = np.flatnonzero(IS_PERF[run.mcode])
    key = run.eid[rows] * N_METRICS + run.mcode[rows]
    values = run.value[rows]
    policy_cv = np.array([_cv_rep(policy, METRIC_NAMES[m]) for m in range(N_METRICS)])

    median = pd.Series(values).groupby(key, sort=False).transform("median").to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = (values - median) / median
    spread_all = pd.DataFrame({"k": key, "v": values, "dev": np.abs(values - median)})
    agg = spread_all.groupby("k", sort=False).agg(x=("v", "median"), n=("v", "size"), mad=("dev", "median"))
    keys = agg.index.to_numpy(dtype=np.int64)
    eids, mcodes = keys // N_METRICS, keys % N_METRICS
    n = agg["n"].to_numpy(dtype=np.int64)

    # The run-to-run noise to expect is the larger of the policy's and tonight's, measured on the whole
    # cohort: a benchmark that is noisier for everyone tonight makes no single GPU unstable.
    expected = np.maximum(policy_cv[mcodes], _cohort_noise(run, eids, mcodes, n, agg, policy_cv))
    expected_of_row = pd.Series(expected, index=keys).reindex(key).to_numpy()

    # A transient is a repeat farther *below* its median than the noise could put it (interference only
    # ever slows a benchmark down; the hardware caps the upside). It is named, and left out of the
    # stability judgement; with three repeats the median already ignores it.
    limit = np.maximum(policy.repeats.transient_pct / 100, 5 * expected_of_row)
    transient = DIRECTION[run.mcode[rows]] * rel < -limit

    good = ~transient
    good_median = pd.Series(values[good]).groupby(key[good], sort=False).transform("median").to_numpy()
    spread = pd.DataFrame({"k": key[good], "dev": np.abs(values[good] - good_median)})
    good_stats = spread.groupby("k", sort=False)["dev"].agg(["median", "size"])

    measured = pd.DataFrame({"eid": eids, "mcode": mcodes, "x": agg["x"].to_numpy(), "n": n})
    mad = good_stats["median"].reindex(keys).to_numpy()
    n_good = good_stats["size"].reindex(keys).fillna(0).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        measured["cv_mad"] = _MAD_TO_SIGMA * mad / measured["x"].to_numpy()
    n_far = n - n_good
    # 1.5 × the limit above: a median pulled down by two transients leaves the good repeat 7-40 % above
    # it, while plain noise on the noisiest metric (H2D, 1.5 %) reaches 6 % above a median now and then.
    above = pd.Series(DIRECTION[run.mcode[rows]] * rel > 1.5 * limit).groupby(key, sort=False).sum()
    n_above = above.reindex(keys).to_numpy()
    # Two repeats far below the median, or one far above it, mean the median itself may be a transient.
    unstable = (n >= 3) & (
        (n_far >= 2)
        | (n_above >= 1)
        | ((n_good >= 3) & (measured["cv_mad"].to_numpy() > policy.repeats.unstable_factor * expected))
    )
    measured["unstable"] = unstable
    named = transient & ~np.isin(key, keys[unstable])
    findings = [
        _unstable_findings(run, measured[unstable], expected[unstable]),
        _transient_notes(run, rows[named], rel[named]),
    ]
    return measured, concat_findings(findings)


def _cohort_noise(
    run: RunIndex,
    eids: np.ndarray,
    mcodes: np.ndarray,
    n: np.ndarray,
    agg: pd.DataFrame,
    policy_cv: np.ndarray,
) -> np.ndarray:
    """Tonight's run-to-run CV of each result's cohort (scope, model, metric), NaN where too few results.

    The median over the cohort of each result's robust CV, unbiased for its repeat count: robust to the
    few results that carry a transient or a fault, precise over hundreds of GPUs.
    """
    usable = (n >= 3) & (n < len(_MAD_MEDIAN_FACTOR))
    with np.errstate(divide="ignore", invalid="ignore"):
        cv = _MAD_TO_SIGMA * agg["mad"].to_numpy() / agg["x"].to_numpy()
        estimate = np.where(
            usable, cv / _MAD_MEDIAN_FACTOR[np.minimum(n, len(_MAD_MEDIAN_FACTOR) - 1)], np.nan
        )
    cohort = (run.scope[eids] * (len(run.models) + 1) + run.model_code[eids]) * N_METRICS + mcodes
    frame = pd.DataFrame({"c": cohort, "e": estimate})
    stats = frame.groupby("c", sort=False)["e"].agg(["median", "count"])
    noise = stats["median"].where(stats["count"] >= _MIN_COHORT)
    result: np.ndarray = noise.reindex(cohort).to_numpy(dtype=np.float64)
    return np.where(np.isfinite(result), result, policy_cv[mcodes])


def _cv_rep(policy: Policy, metric: str) -> float:
    entry = policy.metrics.get(metric)
    return entry.cv_rep if entry is not None else np.inf


def _unstable_findings(run: RunIndex, unstable: pd.DataFrame, expected_cv: np.ndarray) -> pd.DataFrame:
    eids = unstable["eid"].to_numpy()
    names = np.array(METRIC_NAMES, dtype=object)[unstable["mcode"].to_numpy()]
    cv = unstable["cv_mad"].to_numpy() * 100
    expected = expected_cv * 100
    reason = [
        f"{m}: repeats unstable (robust CV {c:.1f} % vs {e:.1f} % expected, or several far from their "
        "median): oscillating throttling or a noisy neighbour; re-run before judging"
        for m, c, e in zip(names, np.nan_to_num(cv), expected, strict=True)
    ]
    return make_findings(
        _scope_name(run, eids),
        run.node_names(eids),
        gpu=run.gpu[eids],
        peer=run.peer_names(eids),
        severity="warn",
        rank="stat",
        metric=names,
        value=unstable["x"].to_numpy(),
        cause="unknown",
        action="retest",
        reason=reason,
    )


def _transient_notes(run: RunIndex, rows: np.ndarray, rel: np.ndarray) -> pd.DataFrame:
    eids = run.eid[rows]
    names = np.array(METRIC_NAMES, dtype=object)[run.mcode[rows]]
    reason = [
        f"{m}: repeat {r} was a transient ({p:+.1f} % from the median of its repeats), ignored"
        for m, r, p in zip(names, run.repeat[rows], rel * 100, strict=True)
    ]
    return make_findings(
        _scope_name(run, eids),
        run.node_names(eids),
        gpu=run.gpu[eids],
        peer=run.peer_names(eids),
        severity="note",
        rank="note",
        reason=reason,
    )


def _scope_name(run: RunIndex, eids: np.ndarray) -> np.ndarray:
    names: np.ndarray = np.array(["gpu", "node", "pair"], dtype=object)[run.scope[eids]]
    return names
