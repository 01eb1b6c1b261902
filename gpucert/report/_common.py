"""What the report's three renderings share: verdict order, entity kinds, run selection, small formatters."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

__all__ = [
    "KIND_WORDS",
    "NON_PASS",
    "VERDICT_ORDER",
    "entity_kinds",
    "for_run",
    "format_gpus",
    "gpu_keys",
    "json_value",
    "ordered_non_pass",
    "records",
    "require_columns",
    "text_or_none",
]

#: The order a reader wants: what is broken first, then what needs a look, then what could not be judged.
NON_PASS: tuple[str, ...] = ("fail", "warn", "inconclusive")
VERDICT_ORDER: dict[str, int] = {"fail": 0, "warn": 1, "inconclusive": 2, "pass": 3}
#: The kinds of rows a report counts apart, and their words.
KIND_WORDS = (("gpu", "GPUs"), ("node", "nodes"), ("pair", "node pairs"))


def require_columns(frame: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    """Raises ``ValueError`` naming the columns of ``columns`` that ``frame`` lacks."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what} table lacks column(s) {missing}")


def for_run(frame: pd.DataFrame, run_id: str) -> pd.DataFrame:
    """The rows of ``frame`` for ``run_id``; the whole frame when it holds that run only (no copy)."""
    if "run_id" not in frame.columns or frame.empty:
        return frame
    column = frame["run_id"]
    if isinstance(column.dtype, pd.CategoricalDtype) and list(column.cat.categories) == [run_id]:
        return frame
    keep = (column == run_id).to_numpy(dtype=bool, na_value=False)
    return frame if keep.all() else frame[keep]


def gpu_keys(gpu: pd.Series) -> npt.NDArray[np.int64]:
    """GPU indices as int64, -1 where the row is not a GPU's (node, pair and fleet rows)."""
    return pd.to_numeric(gpu, errors="coerce").fillna(-1).to_numpy(dtype=np.int64)


def _blank(series: pd.Series) -> npt.NDArray[np.bool_]:
    """Where ``series`` is NA or the empty string; per category, not per row, for categoricals."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        codes = series.cat.codes.to_numpy()
        empty = np.append(np.asarray(series.cat.categories.astype(str) == "", dtype=bool), True)
        return empty[np.where(codes < 0, len(empty) - 1, codes)]
    values = series.to_numpy(dtype=object)
    return np.asarray(pd.isna(values) | (values == ""), dtype=bool)


def entity_kinds(verdicts: pd.DataFrame) -> npt.NDArray[np.object_]:
    """Per verdict row, what it judges: ``fleet`` (no node), ``pair`` (a peer), ``node`` (no GPU) or ``gpu``."""
    no_node = _blank(verdicts["node"])
    has_peer = ~_blank(verdicts["peer"]) if "peer" in verdicts.columns else np.zeros(len(verdicts), bool)
    no_gpu = gpu_keys(verdicts["gpu"]) < 0
    fleet = no_node | (verdicts["reference_kind"].astype(object).to_numpy() == "fleet")
    return np.select([fleet, has_peer, no_gpu], ["fleet", "pair", "node"], default="gpu").astype(object)


def ordered_non_pass(verdicts: pd.DataFrame) -> pd.DataFrame:
    """The rows that are not ``pass``, fail → warn → inconclusive (unknown verdicts last).

    Within a verdict: fleet findings first (they explain many rows at once), then by node, the node's
    own row before its GPUs' and pairs'. Adds the columns ``_kind`` (see :func:`entity_kinds`), ``_gpu``
    (:func:`gpu_keys`), and ``_node`` and ``_peer`` (names as str, ``""`` when empty).
    """
    verdict = verdicts["verdict"].astype(object)
    rows = verdicts[(verdict != "pass").to_numpy(dtype=bool)]
    kinds = entity_kinds(rows)
    rows = rows.assign(
        _kind=kinds,
        _gpu=gpu_keys(rows["gpu"]),
        _sev=rows["verdict"].astype(object).map(VERDICT_ORDER).fillna(len(VERDICT_ORDER)).to_numpy(),
        _fleet=(kinds != "fleet").astype(np.int8),
        _node=rows["node"].astype(object).fillna("").astype(str).to_numpy(),
        _peer=(rows["peer"].astype(object).fillna("").astype(str).to_numpy() if "peer" in rows.columns else ""),
    )
    rows = rows.sort_values(["_sev", "_fleet", "_node", "_gpu", "_peer"], kind="stable")
    return rows.drop(columns=["_sev", "_fleet"])


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """``frame``'s rows as dicts keyed by column name."""
    return [{str(k): v for k, v in row.items()} for row in frame.to_dict("records")]


def json_value(value: Any, digits: int | None = None) -> Any:
    """``value`` as plain JSON data: None for NA/NaN/inf, Python int/float/str for numpy and pandas scalars."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return round(value, digits) if digits is not None else value
    if isinstance(value, bool | int | str):
        return value
    return str(value)


def text_or_none(value: Any) -> str | None:
    """A non-empty string, or None for NA and empty values."""
    value = json_value(value)
    if value is None or value == "":
        return None
    return str(value)


def format_gpus(gpus: Iterable[int]) -> str:
    """GPU indices as short ranges: ``[0, 1, 2, 3, 5]`` → ``"0–3, 5"``."""
    # Consecutive indices keep the same difference to their position in the sorted list.
    runs = [[g for _, g in run] for _, run in itertools.groupby(enumerate(sorted(set(gpus))), lambda p: p[1] - p[0])]
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}–{run[-1]}" for run in runs)
