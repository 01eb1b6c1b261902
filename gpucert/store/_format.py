"""The baseline table's contract: its columns, their canonical dtypes, and the rules a stored table obeys.

The columns are docs/design/data-contracts.md's, "Baselines". Every baseline entering or leaving the store
goes through :func:`validate_baseline`: a bad table is refused before it becomes a version, and a stored
file edited by hand, truncated or written by a foreign tool is refused on read, naming the object, instead
of surfacing later as a ``KeyError`` deep in the engine. Canonical dtypes (pandas' ``str``, ``float64``,
``int64``, ``datetime64[us, UTC]``) make a table read from the store compare equal to the one written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from ..errors import BaselineFormatError, Problem
from ..metrics import PERF_METRICS

__all__ = ["BASELINE_COLUMNS", "BASELINE_DTYPES", "BASELINE_LEVELS", "empty_baseline", "run_count", "validate_baseline"]

#: What a row's ``key`` names: a GPU UUID, a node name, or a GPU model (the per-model reference).
BASELINE_LEVELS: tuple[str, ...] = ("gpu", "node", "model")

_TS = pd.DatetimeTZDtype(unit="us", tz="UTC")

#: The columns (docs/design/data-contracts.md, "Baselines") and their canonical dtypes, in file order.
BASELINE_DTYPES: dict[str, Any] = {
    "level": "str",
    "key": "str",
    "metric": "str",
    "center": "float64",
    "spread": "float64",
    "n": "int64",
    "first_ts": _TS,
    "last_ts": _TS,
    "stack": "str",
    "node": "str",
    "runs": "str",
}
BASELINE_COLUMNS: tuple[str, ...] = tuple(BASELINE_DTYPES)

#: Text columns that identify a row and so may not be empty.
_REQUIRED_TEXT = ("level", "key", "metric")
#: Text columns where an empty value is meaningful (no stack recorded; not a GPU row; unknown runs).
_OPTIONAL_TEXT = ("stack", "node", "runs")
#: Columns a table written by an earlier gpucert may lack: read as empty (unknown provenance).
_ADDED_LATER = ("runs",)

#: How many problems the message spells out; the rest are counted (as for results files).
_SHOWN = 12


def empty_baseline() -> pd.DataFrame:
    """An empty baseline table with the contract's columns and canonical dtypes."""
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in BASELINE_DTYPES.items()})


class _Problems:
    """Collects problems cheaply: a 500,000-row table may fail one check everywhere, and building a
    :class:`Problem` per row would cost more than the check; only the first few of each are kept."""

    def __init__(self) -> None:
        self.found: list[Problem] = []
        self.total = 0

    def whole(self, message: str, column: str | None = None) -> None:
        self.found.append(Problem(message, column=column))
        self.total += 1

    def rows(self, mask: np.ndarray[Any, Any], column: str, describe: Callable[[int], str]) -> None:
        positions = np.flatnonzero(mask)
        self.total += len(positions)
        for pos in positions[:_SHOWN]:
            self.found.append(Problem(describe(int(pos)), row=int(pos) + 1, column=column))

    def raise_if_any(self, source: str) -> None:
        if not self.total:
            return
        order = {c: i for i, c in enumerate(BASELINE_COLUMNS)}
        # Whole-table problems first (they usually explain the row problems), then in file order.
        shown = sorted(self.found, key=lambda p: (p.row is not None, p.row or 0, order.get(p.column or "", -1)))[
            :_SHOWN
        ]
        plural = "s" if self.total != 1 else ""
        lines = [f"{source}: {self.total} problem{plural} in the baseline table"]
        lines += [f"  {p}" for p in shown]
        if self.total > len(shown):
            lines.append(f"  … and {self.total - len(shown)} more")
        raise BaselineFormatError("\n".join(lines))


def _text(col: pd.Series[Any], name: str, problems: _Problems, *, required: bool) -> pd.Series[Any] | None:
    """The column as canonical ``str`` (missing → empty), or ``None`` after naming what is not text.

    Everything after the type check stays in pandas' Arrow-backed strings: a column turned into a numpy
    array of Python strings costs more than every check on it (a fleet's table has 400,000 rows).
    """
    if isinstance(col.dtype, pd.CategoricalDtype) or (
        not pd.api.types.is_string_dtype(col.dtype) and bool(col.isna().all())
    ):
        # A column with no value at all has no type to speak of (pandas makes one of a missing key
        # float64): it is simply empty.
        col = col.astype(object)
    if col.dtype == object:
        values = col.to_numpy()
        null = col.isna().to_numpy()
        not_text = ~null & ~np.fromiter((isinstance(v, str) for v in values), bool, len(values))
        problems.rows(not_text, name, lambda i: f"must be text, not {values[i]!r}")
        if not_text.any():
            return None
    elif not pd.api.types.is_string_dtype(col.dtype):
        problems.whole(f"must hold text, not {col.dtype}", column=name)
        return None
    text = col.astype("str").fillna("")
    if required:
        problems.rows(_is(text, ""), name, lambda _i: "is empty")
    return text


def _is(text: pd.Series[Any], *values: str) -> np.ndarray[Any, Any]:
    """Where ``text`` (canonical ``str``) is one of ``values``, compared in Arrow."""
    found = text == values[0] if len(values) == 1 else text.isin(values)
    return found.to_numpy(dtype=bool)


def _numbers(col: pd.Series[Any], name: str, problems: _Problems) -> np.ndarray[Any, Any] | None:
    if pd.api.types.is_bool_dtype(col.dtype):
        problems.whole(f"must hold numbers, not {col.dtype}", column=name)
        return None
    if pd.api.types.is_numeric_dtype(col.dtype):
        return col.to_numpy(dtype="float64", na_value=np.nan)
    # Text that spells numbers (a table built from CSV) is accepted; anything else is named.
    converted = pd.to_numeric(col, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    raw = col.to_numpy()
    bad = np.isnan(converted) & ~col.isna().to_numpy()
    problems.rows(bad, name, lambda i: f"is not a number: {raw[i]!r}")
    return None if bad.any() else converted


def _times(col: pd.Series[Any], name: str, problems: _Problems) -> pd.Series[Any] | None:
    if isinstance(col.dtype, pd.DatetimeTZDtype):
        ts = col.dt.tz_convert("UTC")
    elif pd.api.types.is_datetime64_dtype(col.dtype):
        # docs/design/data-contracts.md keeps every timestamp in UTC; a naive one can only have meant UTC.
        ts = col.dt.tz_localize("UTC")
    else:
        ts = pd.to_datetime(col, utc=True, errors="coerce", format="ISO8601")
        raw = col.to_numpy()
        bad = ts.isna().to_numpy() & ~col.isna().to_numpy()
        problems.rows(bad, name, lambda i: f"is not a timestamp: {raw[i]!r}")
        if bad.any():
            return None
    problems.rows(ts.isna().to_numpy(), name, lambda _i: "is empty")
    converted: pd.Series[Any] = ts.astype(_TS)
    return converted


def run_count(runs: str) -> int | None:
    """How many run ids a ``runs`` value names; ``None`` when it is not a JSON array of distinct, non-empty
    strings. The empty value (unknown provenance) names none."""
    if not runs:
        return 0
    try:
        parsed = json.loads(runs)
    except ValueError:
        return None
    if not isinstance(parsed, list) or not all(isinstance(r, str) and r for r in parsed):
        return None
    return len(parsed) if len(set(parsed)) == len(parsed) else None


def _check_runs(
    runs: pd.Series[Any], level: pd.Series[Any] | None, n: np.ndarray[Any, Any] | None, problems: _Problems
) -> None:
    # Rows share few distinct values (a fleet's GPUs are seeded by the same runs): each is parsed once.
    codes, uniques = pd.factorize(runs)
    counts = np.array([run_count(str(u)) if u else 0 for u in uniques], dtype=object)
    broken = np.array([c is None for c in counts], dtype=bool)[codes]
    problems.rows(broken, "runs", lambda i: f"must be a JSON array of distinct run ids, not {runs.iat[i]!r}")
    if level is None or n is None:
        return
    named = np.array([-1 if c is None else c for c in counts], dtype=np.int64)[codes]
    # An own baseline is a mean over its runs, one value each: naming more runs than it counts would
    # mean a run was merged twice.
    own = _is(level, "gpu", "node")
    with np.errstate(invalid="ignore"):
        too_many = own & ~broken & np.isfinite(n) & (named > n)
    problems.rows(too_many, "runs", lambda i: f"names {int(named[i])} runs, more than n = {float(n[i]):g}")


def validate_baseline(frame: pd.DataFrame, source: str) -> pd.DataFrame:
    """Check ``frame`` against the baseline contract and return it with the canonical columns and dtypes
    (row order kept, index reset). ``source`` (an object key, a file) starts the message of the
    :class:`~gpucert.errors.BaselineFormatError` raised on any problem; rows are numbered from 1."""
    problems = _Problems()
    if not isinstance(frame, pd.DataFrame):
        problems.whole(f"expected a table, got {type(frame).__name__}")
        problems.raise_if_any(source)
    columns = [str(c) for c in frame.columns]
    legacy = [c for c in _ADDED_LATER if c not in columns]
    missing = [c for c in BASELINE_COLUMNS if c not in columns and c not in legacy]
    unknown = [c for c in columns if c not in BASELINE_DTYPES]
    if missing:
        problems.whole(f"missing column{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
    if unknown:
        # The contract is closed: an older gpucert that dropped a column it does not know would write
        # the next version without it, so a foreign column is refused rather than silently lost.
        plural = "s" if len(unknown) > 1 else ""
        problems.whole(f"unknown column{plural} {', '.join(map(repr, unknown))}")
    if len(set(columns)) != len(columns):
        problems.whole("a column name repeats")
    problems.raise_if_any(source)

    frame = frame.reset_index(drop=True)
    if legacy:
        frame = frame.assign(**dict.fromkeys(legacy, ""))
    text = {c: _text(frame[c], c, problems, required=True) for c in _REQUIRED_TEXT}
    text |= {c: _text(frame[c], c, problems, required=False) for c in _OPTIONAL_TEXT}
    numbers = {c: _numbers(frame[c], c, problems) for c in ("center", "spread", "n")}
    times = {c: _times(frame[c], c, problems) for c in ("first_ts", "last_ts")}

    level, metric, node, stack = text["level"], text["metric"], text["node"], text["stack"]
    if level is not None:
        bad = ~_is(level, *BASELINE_LEVELS) & ~_is(level, "")
        problems.rows(bad, "level", lambda i: f"{level.iat[i]!r} is not one of {', '.join(BASELINE_LEVELS)}")
        if node is not None:
            # Only a valid non-gpu level is judged here; an unknown level is already reported above.
            stray = _is(level, "node", "model") & ~_is(node, "")
            problems.rows(stray, "node", lambda i: f"is {node.iat[i]!r}; only gpu rows name a node")
    if metric is not None:
        bad = ~_is(metric, *PERF_METRICS) & ~_is(metric, "")
        problems.rows(bad, "metric", lambda i: f"{metric.iat[i]!r} is not a performance metric of the registry")
    if stack is not None:
        # Few distinct stacks exist in a fleet, so parsing each distinct value once stays cheap.
        broken = []
        for value in stack.unique():
            if value:
                try:
                    json.loads(value)
                except ValueError:
                    broken.append(value)
        if broken:
            problems.rows(_is(stack, *broken), "stack", lambda i: f"is not JSON: {stack.iat[i]!r}")

    if text["runs"] is not None:
        _check_runs(text["runs"], level, numbers["n"], problems)

    center, spread, n = numbers["center"], numbers["spread"], numbers["n"]
    if center is not None:
        c = center
        bad = ~(np.isfinite(c) & (c > 0))
        problems.rows(bad, "center", lambda i: f"must be a finite number > 0, not {float(c[i])!r}")
    if spread is not None:
        s = spread
        bad = ~(np.isfinite(s) & (s >= 0))
        problems.rows(bad, "spread", lambda i: f"must be a finite number ≥ 0, not {float(s[i])!r}")
    if n is not None:
        k = n
        bad = ~(np.isfinite(k) & (k >= 1) & (k == np.floor(k)))
        problems.rows(bad, "n", lambda i: f"must be a whole number ≥ 1, not {float(k[i]):g}")

    first, last = times["first_ts"], times["last_ts"]
    if first is not None and last is not None:
        reversed_ = (first > last).fillna(False).to_numpy(dtype=bool)
        problems.rows(reversed_, "last_ts", lambda i: f"is before first_ts ({last[i]} < {first[i]})")

    if all(text[c] is not None for c in _REQUIRED_TEXT):
        ident = pd.DataFrame({c: text[c] for c in _REQUIRED_TEXT})
        dup = ident.duplicated(keep="first").to_numpy()
        if dup.any():
            rows = ident.to_numpy()

            def first_of(i: int) -> str:
                same = np.flatnonzero((rows == rows[i]).all(axis=1))
                return f"(level, key, metric) = {tuple(rows[i])!r} repeats row {int(same[0]) + 1}"

            problems.rows(dup, "key", first_of)

    problems.raise_if_any(source)
    out = {**text, **numbers, **times, "n": np.asarray(numbers["n"]).astype("int64")}
    return pd.DataFrame({c: pd.Series(out[c], dtype=BASELINE_DTYPES[c]) for c in BASELINE_COLUMNS})
