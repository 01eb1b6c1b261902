"""Stage 1 (docs/design/verdict-engine.md, "Stage 1: repeats"): repeats reduced to a median, their stability ruled.

A transient bad repeat moves no median but is still *named* (a technician should know it happened); repeats
that disagree as a whole make the result UNSTABLE, which warns and asks for a re-run. The payload applies the
same rule while it measures (``gpucert/bench/_stability.py``, whose constants this module shares), so a result
may have any number of repeats: those of each result are one row of a matrix of the results with as many
(no padding: three GEMM repeats never wait on twelve copies).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from .._background import on_two_threads
from ..bench import ABOVE_FACTOR, MAD_TO_SIGMA, MIN_JUDGED, TRANSIENT_SIGMAS
from ..policy import Policy
from ._compare import per_metric
from ._findings import concat_findings, entity_findings
from ._index import DIRECTION, IS_PERF, METRIC_NAMES, N_METRICS, RunIndex, group_positions, group_rows, nan_median

__all__ = ["RepeatStability", "nan_row_median", "reduce_repeats", "repeat_matrix_stability", "row_median"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# Median of 1.4826·MAD / σ over normal samples of n repeats (simulated, 400,000 draws each): the factor
# that turns the cohort's median robust CV into an estimate of its run-to-run CV.
_MAD_MEDIAN_FACTOR = np.array([np.nan, np.nan, 0.707, 0.5344, 0.6724, 0.7474, 0.7909, 0.8273, 0.849, 0.8692, 0.8813])
_MIN_COHORT = 30  # results needed before tonight's noise is estimated from the cohort


def row_median(matrix: FloatArray, counts: IntArray) -> FloatArray:
    """The median of each row's first ``counts`` values (the rest is padding), a repeat count at a time: the
    usual three repeats need no sort at all."""
    if len(counts) and counts.min() == counts.max() == matrix.shape[1]:
        return _full_row_median(matrix)  # no padding: every row at once, without selecting
    out = np.full(len(matrix), np.nan)
    for width in np.unique(counts):
        if width <= 0:
            continue
        sel = counts == width
        out[sel] = _full_row_median(matrix[sel, :width])
    return out


def _full_row_median(block: FloatArray) -> FloatArray:
    """The median of each row of ``block``, every cell a value (NaN for a row holding one)."""
    width = block.shape[1]
    if width == 3:
        a, b, c = block[:, 0], block[:, 1], block[:, 2]
        median: FloatArray = np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))
        return median
    # A sort of each short row and its middle: what np.median gives (the mean of the two middle values
    # for an even count, NaN for a row holding one), three times faster on these widths.
    ordered = np.sort(block, axis=1)
    middle = ordered[:, width // 2]
    if width % 2 == 0:
        middle = (ordered[:, width // 2 - 1] + middle) / 2
    out: FloatArray = np.where(np.isnan(ordered[:, -1]), np.nan, middle)
    return out


def nan_row_median(matrix: FloatArray) -> FloatArray:
    """The median of each row's finite values, wherever they sit (NaN where there are none)."""
    counts = np.isfinite(matrix).sum(axis=1)
    return row_median(np.sort(matrix, axis=1), counts)  # NaN sorts last


@dataclass(frozen=True)
class RepeatStability:
    """The rule's view of each result (one row of the repeat matrix)."""

    x: FloatArray  # median of all repeats
    rel: FloatArray  # each repeat's relative distance from it (NaN padding)
    transient: BoolArray  # repeats farther below it than the noise allows
    cv_mad: FloatArray  # robust CV of the other repeats
    n_far: IntArray
    n_above: IntArray
    n_good: IntArray
    unstable: BoolArray

    @property
    def settle(self) -> IntArray:
        """The fewest more repeats that could make each result stable: ``Stability.settle``, vectorised."""
        n = self.n_far + self.n_good
        suspects = np.maximum(self.n_far, np.where(self.n_above > 0, n - self.n_above, 0))
        more: IntArray = np.where(self.unstable, np.maximum(1, 2 * suspects + 1 - n), 0)
        return more


def repeat_matrix_stability(
    matrix: FloatArray,
    counts: IntArray,
    direction: FloatArray,
    expected: FloatArray,
    *,
    unstable_factor: float,
    transient_pct: float,
    x: FloatArray | None = None,
    mad: FloatArray | None = None,
    or_noisier: bool = False,
) -> RepeatStability:
    """The stability rule on each row of ``matrix``: a result's ``counts`` repeats first, NaN after.

    ``direction`` is +1 where higher is better; ``expected`` the run-to-run CV each row is held to.
    ``x`` and ``mad`` (median of the repeats, median absolute deviation from it) when already known.
    ``or_noisier`` (the payload's view): unstable also when it would be at any larger expected CV.
    """
    x = row_median(matrix, counts) if x is None else x
    judged = _stability(matrix, counts, direction, expected, x, mad, unstable_factor, transient_pct)
    if not or_noisier:
        return judged
    # The verdict holds a result to the larger of the policy's CV and tonight's cohort noise, and at a
    # larger CV a transient becomes an ordinary repeat that may spread the others past the limit: so each
    # transient's breakpoint (the CV at which it stops being one) is tried too. Few results have one.
    unstable = judged.unstable.copy()
    hit = np.flatnonzero((judged.n_far > 0) & ~unstable)
    signed = direction[hit, None] * judged.rel[hit]
    edges = np.sort(np.where(judged.transient[hit], -signed / TRANSIENT_SIGMAS * (1 + 1e-9), np.nan), axis=1)
    for k in range(edges.shape[1]):
        some = np.flatnonzero(np.isfinite(edges[:, k]))
        if not len(some):
            break
        rows = hit[some]
        again = _stability(
            matrix[rows], counts[rows], direction[rows], edges[some, k], x[rows], None, unstable_factor, transient_pct
        )
        unstable[rows] |= again.unstable
    return replace(judged, unstable=unstable)


def _stability(
    matrix: FloatArray,
    counts: IntArray,
    direction: FloatArray,
    expected: FloatArray,
    x: FloatArray,
    mad: FloatArray | None,
    unstable_factor: float,
    transient_pct: float,
) -> RepeatStability:
    rel = matrix - x[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        rel /= x[:, None]
    signed = direction[:, None] * rel
    # A transient is a repeat farther *below* its median than the noise could put it (interference only
    # ever slows a benchmark down; the hardware caps the upside). It is named, and left out of the
    # stability judgement; the median of enough repeats already ignores it.
    limit = np.maximum(transient_pct / 100, TRANSIENT_SIGMAS * expected)
    with np.errstate(invalid="ignore"):
        transient = signed < -limit[:, None]
        above = signed > ABOVE_FACTOR * limit[:, None]
    n_far = transient.sum(axis=1)
    n_good = counts - n_far
    # Without a transient the good repeats are all of them; the (few) others are recomputed without theirs.
    mad = row_median(np.abs(matrix - x[:, None]), counts) if mad is None else mad.copy()
    hit = np.flatnonzero(n_far > 0)
    if len(hit):
        good = np.where(transient[hit], np.nan, matrix[hit])
        mad[hit] = nan_row_median(np.abs(good - nan_row_median(good)[:, None]))
    with np.errstate(divide="ignore", invalid="ignore"):
        cv_mad = MAD_TO_SIGMA * mad / x
        noisy = (n_good >= MIN_JUDGED) & (cv_mad > unstable_factor * expected)
    n_above = above.sum(axis=1)
    # Half the repeats far below the median, or one far above it, mean the median itself may be a transient.
    unstable = (counts >= MIN_JUDGED) & ((2 * n_far >= counts) | (n_above >= 1) | noisy)
    return RepeatStability(x, rel, transient, cv_mad, n_far, n_above, n_good, unstable)


def reduce_repeats(run: RunIndex, policy: Policy) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return (one row per entity × perf metric: eid, mcode, x, n, cv_mad, unstable; findings)."""
    rows = np.flatnonzero(IS_PERF[run.mcode])
    policy_cv = per_metric(policy, "cv_rep", np.inf)

    # Results (entity × metric) numbered in order of first appearance, from a dense key: no hash.
    key: npt.NDArray[np.integer[Any]] = run.eid[rows].astype(
        np.int32 if run.n_entities * N_METRICS < 2**31 else np.int64
    )
    key *= N_METRICS
    key += run.mcode[rows]
    grouping = group_rows(key, run.n_entities * N_METRICS)
    n = grouping.counts
    keys = key[grouping.first].astype(np.int64)
    eids, mcodes = keys // N_METRICS, keys % N_METRICS
    values = run.value[rows]
    # The repeats of each result are one row of a matrix of the results with as many repeats, each
    # repeat a cell (the median and the stability rule do not depend on which); the rule runs over blocks
    # of such rows, so its temporaries stay small and are reused, the blocks shared by two threads.
    classes = [(results, members, values[members]) for results, members in grouping.by_width()]

    # The run-to-run noise to expect is the larger of the policy's and tonight's, measured on the whole
    # cohort: a benchmark that is noisier for everyone tonight makes no single GPU unstable.
    blocks = [
        (results, members, matrix, block) for results, members, matrix in classes for block in _blocks(len(results))
    ]
    x_all = np.empty(len(keys))
    mad_all = np.empty(len(keys))

    def center(part: tuple[IntArray, IntArray, FloatArray, slice]) -> None:
        results, _, matrix, block = part
        at, cells = results[block], matrix[block]
        x_all[at] = row_median(cells, n[at])
        deviation = cells - x_all[at, None]
        mad_all[at] = row_median(np.abs(deviation, out=deviation), n[at])

    on_two_threads(center, blocks)
    expected = np.maximum(policy_cv[mcodes], _cohort_noise(run, eids, mcodes, n, x_all, mad_all, policy_cv))
    direction = DIRECTION[mcodes]
    cv_mad = np.empty(len(keys))
    unstable = np.empty(len(keys), dtype=bool)
    transient = np.empty(len(rows), dtype=bool)  # per result row, in the run's order

    def rule(part: tuple[IntArray, IntArray, FloatArray, slice]) -> None:
        results, members, matrix, block = part
        at = results[block]
        judged = _stability(
            matrix[block],
            n[at],
            direction[at],
            expected[at],
            x_all[at],
            mad_all[at],
            policy.repeats.unstable_factor,
            policy.repeats.transient_pct,
        )
        cv_mad[at], unstable[at] = judged.cv_mad, judged.unstable
        transient[members[block]] = judged.transient

    on_two_threads(rule, blocks)
    measured = pd.DataFrame({"eid": eids, "mcode": mcodes, "x": x_all, "n": n, "cv_mad": cv_mad, "unstable": unstable})
    # The transients worth a note, in the run's order.
    named = np.flatnonzero(transient & ~unstable[grouping.ids])
    at = grouping.ids[named]
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = (values[named] - x_all[at]) / x_all[at]  # as the rule computes it
    findings = [
        _unstable_findings(run, measured[unstable], expected[unstable]),
        _transient_notes(run, rows[named], rel),
    ]
    return measured, concat_findings(findings)


#: Results per block of the repeat rule: a few megabytes of temporaries at the widest repeat counts.
_BLOCK = 1 << 15


def _blocks(count: int) -> list[slice]:
    return [slice(start, min(start + _BLOCK, count)) for start in range(0, count, _BLOCK)]


def _cohort_noise(
    run: RunIndex, eids: IntArray, mcodes: IntArray, n: IntArray, x: FloatArray, mad: FloatArray, policy_cv: FloatArray
) -> FloatArray:
    """Tonight's run-to-run CV of each result's cohort (scope, model, metric), the policy's where too few.

    The median over the cohort of each result's robust CV, unbiased for its repeat count: robust to the
    few results that carry a transient or a fault, precise over hundreds of GPUs.
    """
    usable = (n >= MIN_JUDGED) & (n < len(_MAD_MEDIAN_FACTOR))
    with np.errstate(divide="ignore", invalid="ignore"):
        cv = MAD_TO_SIGMA * mad / x
        estimate = np.where(usable, cv / _MAD_MEDIAN_FACTOR[np.minimum(n, len(_MAD_MEDIAN_FACTOR) - 1)], np.nan)
    cohort = (run.scope[eids] * (len(run.models) + 1) + run.model_code[eids]) * N_METRICS + mcodes
    result = np.full(len(cohort), np.nan)
    for members in group_positions(cohort):
        values = estimate[members]
        if np.count_nonzero(~np.isnan(values)) >= _MIN_COHORT:
            result[members] = nan_median(values)
    filled: FloatArray = np.where(np.isfinite(result), result, policy_cv[mcodes])
    return filled


def _unstable_findings(run: RunIndex, unstable: pd.DataFrame, expected_cv: FloatArray) -> pd.DataFrame:
    eids = unstable["eid"].to_numpy()
    names = np.array(METRIC_NAMES, dtype=object)[unstable["mcode"].to_numpy()]
    cv = unstable["cv_mad"].to_numpy() * 100
    expected = expected_cv * 100
    reason = [
        f"{m}: repeats unstable ({k} of them; robust CV {c:.1f} % vs {e:.1f} % expected, or several far from "
        "their median): oscillating throttling or a noisy neighbour; re-run before judging"
        for m, k, c, e in zip(names, unstable["n"].to_numpy(), np.nan_to_num(cv), expected, strict=True)
    ]
    return entity_findings(
        run,
        eids,
        severity="warn",
        rank="stat",
        metric=names,
        value=unstable["x"].to_numpy(),
        cause="unknown",
        action="retest",
        reason=reason,
    )


def _transient_notes(run: RunIndex, rows: IntArray, rel: FloatArray) -> pd.DataFrame:
    eids = run.eid[rows]
    names = np.array(METRIC_NAMES, dtype=object)[run.mcode[rows]]
    # As Python numbers (tolist): formatting NumPy scalars costs twice as much, on thousands of notes.
    reason = [
        f"{m}: repeat {r} was a transient ({p:+.1f} % from the median of its repeats), ignored"
        for m, r, p in zip(names.tolist(), run.repeat[rows].tolist(), (rel * 100).tolist(), strict=True)
    ]
    return entity_findings(run, eids, severity="note", rank="note", reason=reason)
