"""The metric registry (docs/reference/metrics.md): every metric a results row may carry, its level and direction.

The registry (:data:`METRICS`, :class:`Metric`, :data:`RESULT_COLUMNS`) is the payload's (:mod:`gpucert.bench`
writes the rows with the standard library only), re-exported here; this module adds the **physical bounds**
(``gpucert/data/physical_bounds.csv``, each with its source): the range no working or broken GPU can measure
beyond. A results file is validated against those of ``ANY_MODEL``; a GPU model's own, tighter ceilings (its
spec peaks) keep impossible values out of baselines.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

from .bench import EVENT_METRICS, METRICS, NIC_METRICS, PERF_METRICS, RESULT_COLUMNS, Kind, Level, Metric

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "ANY_MODEL",
    "EVENT_METRICS",
    "METRICS",
    "NIC_METRICS",
    "PERF_METRICS",
    "RESULT_COLUMNS",
    "Bound",
    "Kind",
    "Level",
    "Metric",
    "bound_arrays",
    "physical_bounds",
]


# ---------------------------------------------------------------------------------------------------------
# Physical bounds

#: The ``gpu_model`` of a bound that holds for every GPU.
ANY_MODEL = "*"


@dataclass(frozen=True)
class Bound:
    """The inclusive range ``low``..``high`` a metric's value can physically take, and where it comes from."""

    low: float
    high: float
    source: str


@cache
def physical_bounds() -> dict[tuple[str, str], Bound]:
    """The shipped bounds, keyed by (GPU model or ``ANY_MODEL``, metric); raises ``ValueError`` if the shipped
    file is broken (a packaging bug, not a user's input)."""
    text = resources.files("gpucert").joinpath("data/physical_bounds.csv").read_text(encoding="utf-8")
    # Comment lines carry the file's explanation; csv has no comments of its own.
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    bounds: dict[tuple[str, str], Bound] = {}
    for row in csv.DictReader(lines):
        model, name = row["gpu_model"], row["metric"]
        low, high = float(row["low"]), float(row["high"])
        if name not in METRICS or not (math.isfinite(low) and math.isfinite(high) and 0 <= low <= high):
            raise ValueError(f"physical_bounds.csv: bad bound for {model!r} {name!r}")
        if (model, name) in bounds:
            raise ValueError(f"physical_bounds.csv: {model!r} {name!r} is given twice")
        bounds[(model, name)] = Bound(low, high, row["source"])
    missing = sorted(set(METRICS) - {name for model, name in bounds if model == ANY_MODEL})
    if missing:
        raise ValueError(f"physical_bounds.csv: no bound for any GPU of {', '.join(missing)}")
    return bounds


def bound_arrays(
    models: Sequence[str], metrics: Sequence[str], *, per_model: bool = True
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``(low, high)``, each of shape ``(len(models) + 1, len(metrics))``: the bounds of each model and metric.

    A model's own bound when ``per_model`` and the file has one, else the bound for any GPU; an unknown
    metric is unbounded (-inf, inf). The extra last row holds the bounds for any GPU, so that a
    categorical's missing code (-1) gathers them.
    """
    bounds = physical_bounds()
    import numpy as np

    low = np.full((len(models) + 1, len(metrics)), -np.inf)
    high = np.full((len(models) + 1, len(metrics)), np.inf)
    for j, name in enumerate(metrics):
        generic = bounds.get((ANY_MODEL, name))
        if generic is not None:
            low[:, j], high[:, j] = generic.low, generic.high
        if not per_model:
            continue
        for i, model in enumerate(models):
            own = bounds.get((model, name))
            if own is not None:
                low[i, j], high[i, j] = own.low, own.high
    return low, high
