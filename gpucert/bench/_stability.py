"""When a benchmark's repeats disagree, and how many more it takes to settle them
(docs/design/verdict-engine.md, "Stage 1: repeats").

The rule is the verdict engine's (``gpucert/verdict/_repeats.py`` imports its constants from here), with
the policy's expected run-to-run CVs mirrored below so the payload needs neither pandas nor the policy
file; a result is UNSTABLE when, with ``m`` the median of its ``n ≥ 3`` repeats and ``e`` the expected CV:

* at least half of its repeats are *transients*, farther below ``m`` than ``max(transient_pct, 5e)``
  (interference only slows a benchmark down): the median itself may then be one;
* one repeat is more than 1.5 × that limit *above* ``m``: the median sits among transients;
* or the robust CV (1.4826·MAD/median) of the other repeats exceeds ``unstable_factor`` × ``e``.

The verdict engine holds a result to the larger of ``e`` and tonight's cohort noise, which the payload
cannot know; so the payload (:meth:`RepeatRule.stability`) calls a result stable only when it would be at
every larger ``e`` too, else the verdict could still find unstable what the payload stopped measuring.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "ABOVE_FACTOR",
    "DEFAULT_CV_REP",
    "DEFAULT_MAX_REPEATS",
    "DEFAULT_REPEATS_OF",
    "DEFAULT_TRANSIENT_PCT",
    "DEFAULT_UNSTABLE_FACTOR",
    "MAD_TO_SIGMA",
    "MIN_JUDGED",
    "TRANSIENT_SIGMAS",
    "RepeatRule",
    "Stability",
    "repeat_stability",
]

MAD_TO_SIGMA = 1.4826
#: A transient is farther below the median than this many expected CVs (or ``transient_pct``).
TRANSIENT_SIGMAS = 5.0
# A median pulled down by two transients leaves the good repeat 7-40 % above it, while plain noise on the
# noisiest metric (H2D, 1.5 %) reaches 6 % above a median now and then: 1.5 × the transient limit.
ABOVE_FACTOR = 1.5
#: Fewer repeats than this are never judged unstable: there is no median to trust or doubt.
MIN_JUDGED = 3
DEFAULT_MAX_REPEATS = 7
DEFAULT_UNSTABLE_FACTOR = 5.0
DEFAULT_TRANSIENT_PCT = 5.0
#: ``metrics.<name>.cv_rep`` of gpucert/data/policy.yaml (a test keeps the two equal).
DEFAULT_CV_REP: Mapping[str, float] = {
    "gemm_bf16_tflops": 0.007,
    "gemm_fp8_tflops": 0.007,
    "hbm_copy_gbps": 0.004,
    "h2d_gbps": 0.015,
    "d2h_gbps": 0.015,
    "nccl_allreduce_busbw_gbps": 0.01,
    "nccl_pair_busbw_gbps": 0.04,
    "storage_read_gbps": 0.03,
}
#: ``metrics.<name>.repeats`` of gpucert/data/policy.yaml (a test keeps the two equal): metrics measured
#: more often than ``--repeats``. A host copy repeat takes about a second (a GEMM's 30), and at 1.5 % per
#: repeat three leave a run's median ±1.1 %, twelve ±0.5 %: what lets drift see a −0.5 %/night loss
#: within 6 nights and a −3 % step the first night (benchmarks/drift_speed.py); it costs a node ~2.5 min.
DEFAULT_REPEATS_OF: Mapping[str, int] = {"h2d_gbps": 12, "d2h_gbps": 12}


@dataclass(frozen=True)
class Stability:
    """Whether one result's repeats agree, and why not."""

    n: int
    #: repeats farther below the median than the noise allows
    n_far: int
    #: repeats farther above the median than the noise allows
    n_above: int
    #: robust CV of the repeats that are not transients (NaN with fewer than 3 of them)
    cv: float
    unstable: bool
    #: why, in words (empty when stable)
    why: str = ""

    @property
    def settle(self) -> int:
        """The fewest more repeats that could make this result stable (0 when it is): with ``k`` suspected
        transients the median is out of their reach from ``2k + 1`` repeats on; the suspects are the
        far-below repeats, or, when one stands far above, every repeat that does not."""
        if not self.unstable:
            return 0
        suspects = max(self.n_far, self.n - self.n_above if self.n_above else 0)
        return max(1, 2 * suspects + 1 - self.n)


def repeat_stability(
    values: Sequence[float],
    cv_rep: float,
    *,
    unstable_factor: float = DEFAULT_UNSTABLE_FACTOR,
    transient_pct: float = DEFAULT_TRANSIENT_PCT,
    or_noisier: bool = False,
) -> Stability:
    """The stability of ``values`` (one result's repeats) at the expected run-to-run CV ``cv_rep``; with
    ``or_noisier`` (the payload's view), unstable also when it would be at any larger expected CV."""
    found = _stability_at(values, cv_rep, unstable_factor, transient_pct)
    if found.unstable or not or_noisier or found.n_far == 0:
        return found
    # The verdict holds a result to the larger of the policy's CV and tonight's cohort noise, and at a
    # larger CV a transient becomes an ordinary repeat that may spread the others past the limit: so each
    # transient's breakpoint (the CV at which it stops being one) is tried too.
    median = statistics.median(values)
    limit = max(transient_pct / 100, TRANSIENT_SIGMAS * cv_rep)
    far = sorted((median - v) / median for v in values)
    for distance in (d for d in far if d > limit):
        again = _stability_at(values, distance / TRANSIENT_SIGMAS * (1 + 1e-9), unstable_factor, transient_pct)
        if again.unstable:
            return Stability(found.n, found.n_far, found.n_above, found.cv, True, f"{again.why}, were it noisier")
    return found


def _stability_at(values: Sequence[float], cv_rep: float, unstable_factor: float, transient_pct: float) -> Stability:
    """The stability of ``values`` at ``cv_rep``, a higher-is-better metric's (every performance metric is)."""
    n = len(values)
    if n < MIN_JUDGED or not math.isfinite(cv_rep):
        return Stability(n, 0, 0, math.nan, False)
    median = statistics.median(values)
    if median == 0:
        return Stability(n, 0, 0, math.nan, False)
    rel = [(v - median) / median for v in values]
    limit = max(transient_pct / 100, TRANSIENT_SIGMAS * cv_rep)
    good = [v for v, r in zip(values, rel, strict=True) if r >= -limit]
    n_far = n - len(good)
    n_above = sum(r > ABOVE_FACTOR * limit for r in rel)
    cv = math.nan
    if len(good) >= MIN_JUDGED:
        centre = statistics.median(good)
        cv = MAD_TO_SIGMA * statistics.median(abs(v - centre) for v in good) / median
    if 2 * n_far >= n:
        why = f"{n_far} of {n} repeats far below their median"
    elif n_above:
        why = f"{n_above} of {n} repeats far above their median"
    elif cv > unstable_factor * cv_rep:
        why = f"robust CV {cv * 100:.1f} % vs {cv_rep * 100:.1f} % expected"
    else:
        return Stability(n, n_far, n_above, cv, False)
    return Stability(n, n_far, n_above, cv, True, why)


@dataclass(frozen=True)
class RepeatRule:
    """The payload's stability rule: expected CVs per metric, the policy's knobs, and the repeat bounds."""

    repeats: int = 3
    #: at most this many repeats of a result measured ``repeats`` times (see :meth:`ceiling`)
    max_repeats: int = DEFAULT_MAX_REPEATS
    #: (metric, expected cv_rep) pairs; a metric not named here never gets more repeats
    cv_rep: tuple[tuple[str, float], ...] = tuple(DEFAULT_CV_REP.items())
    unstable_factor: float = DEFAULT_UNSTABLE_FACTOR
    transient_pct: float = DEFAULT_TRANSIENT_PCT
    #: (metric, base repeats) pairs for metrics measured more often than ``repeats``
    repeats_of: tuple[tuple[str, int], ...] = tuple(DEFAULT_REPEATS_OF.items())

    def base(self, metric: str) -> int:
        """The repeats ``metric`` always gets: its own count, never fewer than ``repeats``."""
        return max(self.repeats, dict(self.repeats_of).get(metric, self.repeats))

    def ceiling(self, metric: str) -> int:
        """The most repeats ``metric`` may get while they disagree: ``max_repeats``, and as many more for a
        metric with more base repeats than ``repeats`` (the same headroom)."""
        return self.base(metric) + max(0, self.max_repeats - self.repeats)

    def expected(self, metric: str) -> float:
        return dict(self.cv_rep).get(metric, math.inf)

    def stability(self, metric: str, values: Sequence[float]) -> Stability:
        """The payload's view: unstable at the expected CV or any larger one the verdict may use."""
        return repeat_stability(
            values,
            self.expected(metric),
            unstable_factor=self.unstable_factor,
            transient_pct=self.transient_pct,
            or_noisier=True,
        )

    def more(self, metric: str, values: Sequence[float]) -> tuple[int, Stability]:
        """(repeats to add now, their stability): 0 when they agree or the ceiling is reached."""
        stability = self.stability(metric, values)
        return min(stability.settle, max(0, self.ceiling(metric) - len(values))), stability

    def decide(
        self, metric: str, values: Sequence[float], where: str, late: Callable[[int], str | None]
    ) -> tuple[int, str]:
        """(repeats to add now, the line the payload says about it; empty when they agree): every benchmark
        of every unit decides here. 0 more when the repeats agree, at the ceiling, or when ``late(more)`` says
        the extra repeats would not fit before the deadline (the detail to say, ``""`` for none; None when
        they fit). ``where`` starts the line (``GPU 0``, ``node``, ``pair``)."""
        more, stability = self.more(metric, values)
        if not stability.unstable:
            return 0, ""
        n, ceiling, why = len(values), self.ceiling(metric), stability.why
        head = f"{where}: {metric}: repeats"
        if more == 0:
            return 0, f"{head} still disagree after {n} ({why}): at the maximum of {ceiling}"
        detail = late(more)
        if detail is not None:
            return 0, f"{head} disagree after {n} ({why}), but {more} more would not fit before the deadline{detail}"
        return more, f"{head} disagree ({why}): {more} more, {n + more} of at most {ceiling}"
