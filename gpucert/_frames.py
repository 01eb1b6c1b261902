"""The canonical in-memory shape of a results table, shared by every producer and consumer.

Readers (CSV, Parquet, JSON lines) and generators (the fleet model) all hand the engine this shape, so
the engine never re-validates or re-types: string columns are ``category`` (fast group-bys, small
memory at 100,000 GPUs), ``gpu`` is a nullable ``Int64``, ``ts`` is UTC.
"""

from __future__ import annotations

import pandas as pd

from .metrics import RESULT_COLUMNS

__all__ = ["CATEGORY_COLUMNS", "RESULT_DTYPES", "empty_results"]

CATEGORY_COLUMNS: tuple[str, ...] = ("run_id", "node", "gpu_uuid", "gpu_model", "metric", "peer")

RESULT_DTYPES: dict[str, str | pd.api.extensions.ExtensionDtype] = {
    "run_id": "category",
    "node": "category",
    "gpu": "Int64",
    "gpu_uuid": "category",
    "gpu_model": "category",
    "metric": "category",
    "value": "float64",
    "repeat": "int64",
    "peer": "category",
    "ts": pd.DatetimeTZDtype(unit="us", tz="UTC"),
}
assert tuple(RESULT_DTYPES) == RESULT_COLUMNS


def empty_results() -> pd.DataFrame:
    """An empty results table with the canonical columns and dtypes."""
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in RESULT_DTYPES.items()})
