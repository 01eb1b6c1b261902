"""The rows of the run's Prefect table artifact: what did not pass, worst first, then how much did."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from .._text import counted
from ._common import NON_PASS, entity_kinds, json_value, ordered_non_pass, require_columns

__all__ = ["DECISION_KEYS", "ROW_KEYS", "decision_table", "is_summary_row", "verdict_rows"]

#: The keys of every row :func:`verdict_rows` returns, in display order.
ROW_KEYS: tuple[str, ...] = (
    "verdict",
    "node",
    "gpu",
    "peer",
    "cause",
    "action",
    "ticket",
    "metric",
    "value",
    "reference",
    "deviation_pct",
    "z",
    "reference_kind",
    "reasons",
    "gpu_model",
    "gpu_uuid",
)
_DIGITS = {"value": 4, "reference": 4, "deviation_pct": 2, "z": 2}


def _note(verdict: str | None, text: str) -> dict[str, Any]:
    return {**dict.fromkeys(ROW_KEYS), "verdict": verdict, "reasons": text}  # the keys in ROW_KEYS' order


def is_summary_row(row: dict[str, Any]) -> bool:
    """Whether ``row`` (one of :func:`verdict_rows`) is a summary row rather than a verdict."""
    return all(row.get(k) is None for k in ROW_KEYS if k not in ("verdict", "reasons"))


def verdict_rows(verdicts: pd.DataFrame, *, limit: int = 500) -> list[dict[str, Any]]:
    """JSON-able rows for a Prefect table artifact of ``verdicts``: up to ``limit`` rows that are not ``pass``
    (in :func:`ordered_non_pass`'s order), each a dict with the keys of :data:`ROW_KEYS` (None where empty,
    numbers rounded for reading), then at most two *summary rows*, only ``verdict`` and ``reasons`` set: how
    many rows were left out (``verdict`` None) and how many passed, per kind (``verdict`` ``"pass"``).

    Raises ``ValueError`` when the table lacks a column it reads or ``limit`` < 0.
    """
    if limit < 0:
        raise ValueError(f"limit must be >= 0: {limit}")
    require_columns(verdicts, ("verdict", "node", "gpu", "reference_kind"), "verdicts")
    ordered = ordered_non_pass(verdicts)
    shown = ordered.iloc[:limit]
    present = [k for k in ROW_KEYS if k in shown.columns]
    rows: list[dict[str, Any]] = []
    # Only the listed rows are converted: at most ``limit`` of them, whatever the fleet's size.
    for record in shown[present].astype(object).to_dict("records"):
        row = dict.fromkeys(ROW_KEYS)
        for key, value in record.items():
            row[str(key)] = json_value(value, _DIGITS.get(str(key)))
        if row["gpu"] is not None:
            row["gpu"] = int(row["gpu"])
        rows.append(row)

    left_out = ordered.iloc[limit:]
    if len(left_out):
        counts = left_out["verdict"].astype(object).value_counts()
        order = [v for v in NON_PASS if v in counts] + [v for v in counts.index if v not in NON_PASS]
        per = ", ".join(f"{v} {int(counts[v]):,}" for v in order)
        rows.append(
            _note(None, f"{len(left_out):,} more rows that did not pass are not listed ({per}): see the report")
        )

    passing = verdicts[(verdicts["verdict"].astype(object) == "pass").to_numpy(dtype=bool)]
    if len(passing):
        kinds = pd.Series(entity_kinds(passing)).value_counts()
        words = {"gpu": "GPU", "node": "node", "pair": "pair", "fleet": "fleet check"}
        per_kind = ", ".join(counted(int(kinds[k]), words[k]) for k in words if k in kinds)
        rows.append(_note("pass", f"{len(passing):,} passing rows not listed: {per_kind}"))
    return rows


#: The columns of the decisions artifact: what a person scanning the fleet's outcome reads, nothing repeated.
DECISION_KEYS: tuple[str, ...] = ("node", "state", "verdict", "cause", "taint", "confirmed", "summary")
#: What the decisions artifact may weigh as JSON: Prefect's server refuses to publish an event over
#: ``PREFECT_SERVER_EVENTS_MAXIMUM_SIZE_BYTES`` (1.5 MB by default), and the artifact's event carries it whole.
DECISIONS_MAX_BYTES = 1_000_000


def decision_table(
    decisions: pd.DataFrame, *, max_bytes: int = DECISIONS_MAX_BYTES
) -> tuple[dict[str, list[Any]], int]:
    """The settled decisions (``decisions.parquet``) as a column-wise table artifact, and how many nodes it
    leaves out.

    Every node is listed while the table fits in ``max_bytes`` of JSON (10,000 nodes take about 0.6 MB);
    past that the nodes certified without a taint are left out and the count says how many:
    ``decisions.parquet`` holds them all."""
    require_columns(decisions, DECISION_KEYS, "decisions")
    table = _columns(decisions)
    if len(json.dumps(table)) <= max_bytes:
        return table, 0
    quiet = (decisions["state"].astype("string") == "certified").fillna(False) & (
        decisions["taint"].astype("string").fillna("none") == "none"
    )
    return _columns(decisions[~quiet.to_numpy()]), int(quiet.sum())


def _columns(frame: pd.DataFrame) -> dict[str, list[Any]]:
    return {name: [json_value(v) for v in frame[name].astype(object)] for name in DECISION_KEYS}
