"""Read, validate and write results tables: the "Results" data contract of DESIGN.md.

The reader's contract
---------------------
:func:`read_results` reads one or more files, the format chosen by suffix:

* ``.csv`` — a header line with the contract's column names, then one sample a line. ``gpu``, ``gpu_uuid``
  and ``peer`` may be empty; ``ts`` is ISO 8601 (a timestamp without an offset is taken as UTC).
* ``.parquet`` / ``.pq`` — the same columns; strings, numbers and timestamps of any unit or zone.
* ``.jsonl`` / ``.ndjson`` / ``.json`` / ``.log`` — JSON lines, one object a line with the contract's column
  names: what the in-pod benchmark prints. So that a Kubernetes Pod log can be read as it is, blank lines and
  lines that do not start with ``{`` (after leading blanks) are skipped, and so are objects carrying none of
  the contract's columns (structured log lines of other tools); a line that starts with ``{`` but is not
  valid JSON is an error naming its line.

Every file is validated on its own and every problem found is collected: a bad file raises one
:class:`~gpucert.errors.ResultsError` naming the file and, for each problem, its row (the line number of a
CSV or JSON-lines file, counting the header and any skipped lines; the 1-based row of a Parquet file) and
its column. Unreadable, malformed and corrupt files raise the same error, never a traceback. Several files
are then concatenated and checked once more across files (duplicated samples, conflicting identities).
Columns outside the contract are dropped.

What comes back is canonical, the shape every consumer takes (:data:`gpucert._frames.RESULT_DTYPES`):
columns in :data:`~gpucert.metrics.RESULT_COLUMNS` order; string columns ``category`` (string categories,
sorted and all in use, so the same table reads the same from any format), a missing ``gpu_uuid`` or
``peer`` being NaN; ``gpu`` nullable ``Int64``; ``value`` float64; ``repeat`` int64; ``ts``
``datetime64[us, UTC]``. :func:`parse_results` validates a frame built in memory and returns it in the same
dtypes (a column that already has its canonical dtype comes back as it is, categories in their order);
:func:`write_results` writes a frame so that :func:`read_results` gives it back identically.

Speed matters: a fleet of 100,000 GPUs gives millions of rows, read inside a command with a time budget of
seconds. So no check loops over rows in Python: string rules are checked on the few categories and mapped to
rows through the codes, numbers are checked with array operations, and Problem objects are built only for
the first few bad rows of each rule (the rest are counted).
"""

from __future__ import annotations

import codecs
import csv
import difflib
import io
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from ._frames import CATEGORY_COLUMNS, RESULT_DTYPES
from .errors import Problem, ResultsError
from .metrics import EVENT_METRICS, METRICS, RESULT_COLUMNS

__all__ = ["parse_results", "read_results", "write_results"]

PathArg = str | os.PathLike[str]
Bools = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Codes = npt.NDArray[np.integer[Any]]

_REQUIRED_TEXT: Final = frozenset({"run_id", "node", "gpu_model", "metric"})
_RUN_ID: Final = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
#: Problems built per rule; further hits are only counted, so a file wrong on every row stays fast.
_CAP: Final = 50
#: Rows listed in one message about a group of rows (a duplicated sample, a conflicting identity).
_LISTED: Final = 5
_STR: Final = pd.Index([], dtype="str").dtype
_TS: Final = RESULT_DTYPES["ts"]
_CSV: Final = frozenset({".csv"})
_PARQUET: Final = frozenset({".parquet", ".pq"})
_JSONL: Final = frozenset({".jsonl", ".ndjson", ".json", ".log"})
_NAN_TEXT: Final = frozenset({"nan", "+nan", "-nan"})

# Level of each registry metric, as a small integer so that a whole column maps through one gather.
_UNKNOWN, _GPU, _NODE, _PAIR, _GPU_OR_NODE = range(5)
_LEVEL_CODE: Final = {"gpu": _GPU, "node": _NODE, "pair": _PAIR}
_LEVEL_WORDS: Final = {_GPU: "a per-GPU", _NODE: "a node-level", _PAIR: "a pair", _GPU_OR_NODE: "an event"}


# ---------------------------------------------------------------------------------------------------------
# Public interface


def read_results(paths: PathArg | Sequence[PathArg]) -> pd.DataFrame:
    """Read and validate one or more results files; return one canonical frame.

    Raises :class:`ResultsError` for the first file that breaks the contract (with every problem of that
    file), or for problems that only show across files, such as a sample present in two of them.
    """
    files = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not files:
        raise ResultsError("results", [Problem("no results files given")])
    parts: list[pd.DataFrame] = []
    numbers: list[Ints] = []
    for path in files:
        raw = _read_file(path)
        found = _Findings(_Rows(raw.rows), len(raw.frame), raw.problems, raw.total)
        try:
            canonical = _validate(raw.frame, found, raw.duplicated_columns)
        except (TypeError, ValueError, pa.ArrowException) as exc:
            # Values of a type no rule foresaw (a list in a Parquet column, say): still no traceback.
            problem = Problem(f"cannot read the values: {_one_line(exc)}")
            raise ResultsError(os.fspath(path), [*found.problems, problem], total=found.total + 1) from None
        found.raise_for(os.fspath(path))
        parts.append(_tidy_categories(canonical))
        numbers.append(raw.rows)
    if len(parts) == 1:
        return parts[0]
    combined = _concat(parts)
    names = tuple(os.fspath(p) for p in files)
    rows = _Rows(
        np.concatenate(numbers),
        files=np.repeat(np.arange(len(parts)), [len(p) for p in parts]),
        names=names,
    )
    found = _Findings(rows, len(combined))
    _check_relations(_Codes.of(combined), found)
    found.raise_for(", ".join(names) if len(names) <= 3 else f"{names[0]} and {len(names) - 1} more files")
    return combined


def parse_results(frame: pd.DataFrame, source: str, *, rows: npt.ArrayLike | None = None) -> pd.DataFrame:
    """Validate an in-memory results frame; return it with the canonical columns and dtypes.

    ``source`` names the frame in the error; ``rows`` gives each row's number for messages (default: the
    1-based position). A frame that already is canonical comes back unchanged.
    """
    numbers = (
        np.arange(1, len(frame) + 1, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    )
    if numbers.shape != (len(frame),):
        raise ValueError(f"rows has {numbers.size} numbers for a frame of {len(frame)} rows")
    found = _Findings(_Rows(numbers), len(frame))
    duplicated = sorted({c for c in frame.columns[frame.columns.duplicated()] if c in RESULT_COLUMNS})
    canonical = _validate(frame, found, duplicated)
    found.raise_for(source)
    return canonical


def write_results(frame: pd.DataFrame, path: PathArg) -> None:
    """Write a results frame as CSV, Parquet or JSON lines (by suffix), readable by :func:`read_results`.

    The frame is validated first: a file this module would refuse to read is never written.
    """
    suffix = Path(path).suffix.lower()
    if suffix not in _CSV | _PARQUET | _JSONL:
        raise ResultsError(os.fspath(path), [Problem(_unknown_suffix(suffix))])
    canonical = parse_results(frame, f"results to write to {os.fspath(path)}")
    if suffix in _CSV:
        _write_csv(canonical, path)
    elif suffix in _PARQUET:
        _write_parquet(canonical, path)
    else:
        _write_jsonl(canonical, path)


# ---------------------------------------------------------------------------------------------------------
# Problems and where they are


@dataclass(frozen=True)
class _Rows:
    """Where each frame row came from: its row or line number and, across several files, its file."""

    numbers: Ints
    files: npt.NDArray[np.intp] | None = None
    names: tuple[str, ...] = ()

    def number(self, i: int) -> int:
        return int(self.numbers[i])

    def describe(self, positions: Sequence[int] | npt.NDArray[np.intp]) -> str:
        """``rows 2, 5``, or across files ``a.csv row 2, b.csv row 2``; long lists are cut short."""
        shown = [int(i) for i in positions[:_LISTED]]
        more = len(positions) - len(shown)
        if self.files is None:
            text = ("row " if len(shown) == 1 else "rows ") + ", ".join(str(self.number(i)) for i in shown)
        else:
            text = ", ".join(f"{self.names[self.files[i]]} row {self.number(i)}" for i in shown)
        return f"{text} and {more} more" if more else text


@dataclass
class _Findings:
    """Every problem found in one table: the first few of each rule built, all of them counted."""

    rows: _Rows
    size: int
    problems: list[Problem] = field(default_factory=list)
    total: int = 0
    #: Rows with a problem of their own: the checks across rows leave them out, so one bad value is not
    #: reported a second time as, say, a duplicate.
    bad: Bools = field(init=False)

    def __post_init__(self) -> None:
        self.bad = np.zeros(self.size, dtype=bool)

    def whole(self, message: str, column: str | None = None) -> None:
        self.problems.append(Problem(message, column=column))
        self.total += 1

    def each(self, mask: Bools, column: str, describe: Callable[[int], str]) -> None:
        """One problem per row flagged in ``mask``, described by ``describe(position)``."""
        hits = np.flatnonzero(mask)
        if hits.size == 0:
            return
        self.bad |= mask
        self.total += int(hits.size)
        self.problems.extend(
            Problem(describe(int(i)), row=self.rows.number(int(i)), column=column) for i in hits[:_CAP]
        )

    def groups(
        self,
        positions: Ints,
        keys: Codes,
        column: str,
        describe: Callable[[Ints, Codes | None], str],
        values: Codes | None = None,
    ) -> None:
        """One problem per group of flagged rows: ``positions`` (ascending) grouped by ``keys``.

        ``describe`` gets a group's positions in row order and, when given, their ``values``. The problem
        points at the first row whose value differs from the group's first, or without values at the
        second row (the first repeat). Groups are reported in the order of their first row.
        """
        if positions.size == 0:
            return
        order = np.argsort(keys, kind="stable")
        ordered, sorted_keys = positions[order], keys[order]
        starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
        ends = np.r_[starts[1:], sorted_keys.size]
        self.total += int(starts.size)
        for g in np.argsort(ordered[starts], kind="stable")[:_CAP]:
            members = ordered[starts[g] : ends[g]]
            member_values = None if values is None else values[order[starts[g] : ends[g]]]
            if member_values is None:
                pointer = members[min(1, members.size - 1)]
            else:
                pointer = members[np.argmax(member_values != member_values[0])]
            row = self.rows.number(int(pointer))
            self.problems.append(Problem(describe(members, member_values), row=row, column=column))

    def raise_for(self, source: str) -> None:
        if self.total:
            # Whole-file problems first, then in the order a reader of the file meets them.
            ordered = sorted(self.problems, key=lambda p: (p.row is not None, p.row or 0))
            raise ResultsError(source, ordered, total=self.total)


def _text_at(column: pd.Series, i: int) -> str:
    """The value at position ``i`` as the user wrote it (as near as the parsed file allows)."""
    value = column.iloc[i]
    if value is None or value is pd.NA or value is pd.NaT:
        return ""
    return str(value)


# ---------------------------------------------------------------------------------------------------------
# Validation


def _validate(frame: pd.DataFrame, found: _Findings, duplicated_columns: Sequence[str] = ()) -> pd.DataFrame:
    """Check ``frame`` against the contract, recording problems in ``found``; return the canonical frame.

    The returned frame is only meaningful when nothing was found.
    """
    missing = [c for c in RESULT_COLUMNS if c not in frame.columns]
    for name in duplicated_columns:
        found.whole("the header names this column more than once", column=name)
    if len(frame) == 0:
        if not found.total:  # a file whose every line was unreadable has said so already
            found.whole("no result rows")
        if 0 < len(missing) < len(RESULT_COLUMNS):
            found.whole(_missing_message(missing))
        return _empty_canonical()
    if missing:
        found.whole(_missing_message(missing))
    if missing or duplicated_columns:
        return _empty_canonical()

    # Each column comes back as it was when it already has its canonical dtype: no copy, no conversion.
    out = {name: _category_column(frame[name], name, found) for name in CATEGORY_COLUMNS}
    out["gpu"], gpu_given = _integer_column(frame["gpu"], "gpu", found, nullable=True)
    out["repeat"], _ = _integer_column(frame["repeat"], "repeat", found, nullable=False)
    out["ts"] = _ts_column(frame["ts"], found)
    levels = _check_metrics(out["metric"], found)
    _check_run_ids(out["run_id"], found)
    out["value"] = _value_column(frame["value"], out["metric"], levels, found)
    _check_levels(levels, gpu_given, out["peer"].cat.codes.to_numpy() >= 0, out["metric"], found)

    canonical = pd.DataFrame({name: out[name] for name in RESULT_COLUMNS}, copy=False)
    _check_relations(_Codes.of(canonical), found)
    return canonical


def _missing_message(missing: Sequence[str]) -> str:
    names = ", ".join(repr(c) for c in missing)
    return f"missing column{'s' if len(missing) > 1 else ''} {names} (the contract needs all of " + (
        ", ".join(RESULT_COLUMNS) + "; nullable ones may be empty)"
    )


def _empty_canonical() -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype=dtype) for name, dtype in RESULT_DTYPES.items()})


# Strings ------------------------------------------------------------------------------------------------


def _category_column(raw: pd.Series, name: str, found: _Findings) -> pd.Series:
    """A string column as a categorical of non-blank strings; a blank value becomes missing (NaN)."""
    column = _canonical_categories(_as_categorical(raw))
    if name in _REQUIRED_TEXT:
        found.each(column.cat.codes.to_numpy() < 0, name, lambda i: f"{name} is empty")
    return column


def _as_categorical(raw: pd.Series) -> pd.Series:
    if isinstance(raw.dtype, pd.CategoricalDtype):
        return raw
    try:
        return raw.astype("category")
    except TypeError:
        # Unhashable values (lists, dicts) of a frame built by hand: compare them by their text.
        return raw.map(_to_text, na_action="ignore").astype("category")


def _to_text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def _canonical_categories(column: pd.Series) -> pd.Series:
    """Make the categories strings, and blank ones missing; untouched when they already are."""
    categories = column.cat.categories
    as_text = categories
    if categories.dtype != _STR:
        as_text = pd.Index([_to_text(c) for c in categories], dtype=_STR)
    blank = np.asarray(as_text.str.strip() == "", dtype=bool)
    if categories.dtype == _STR and not blank.any():
        return column
    # Two categories can read the same once written as text (1 and "1"): factorize merges them.
    uniques_codes, uniques = pd.factorize(as_text[~blank])
    mapping = np.full(len(categories), -1, dtype=np.int64)
    mapping[~blank] = uniques_codes
    return _recode(column, mapping, pd.Index(uniques, dtype=_STR))


def _recode(column: pd.Series, mapping: Ints, categories: pd.Index) -> pd.Series:
    """Map each old category code through ``mapping`` (-1: missing) onto ``categories``."""
    codes = column.cat.codes.to_numpy()
    # Appending -1 makes the missing code (-1) map to itself in the same gather; the codes keep their
    # (small) integer type, as there are never more new categories than old ones.
    new_codes = np.append(mapping, -1).astype(codes.dtype)[codes]
    categorical = pd.Categorical.from_codes(new_codes, dtype=pd.CategoricalDtype(categories))
    return pd.Series(categorical, index=column.index, name=column.name, copy=False)


def _per_category(column: pd.Series, flags: Bools, *, missing: bool = False) -> Bools:
    """Spread a per-category flag to rows; ``missing`` is the flag of rows without a value."""
    return np.append(flags, missing)[column.cat.codes.to_numpy()]


def _check_metrics(metric: pd.Series, found: _Findings) -> npt.NDArray[np.int8]:
    """Flag metric names outside the registry; return each row's level code (``_UNKNOWN`` if unknown)."""
    names = [str(c) for c in metric.cat.categories]
    levels = np.array([_level_code(n) for n in names] + [_UNKNOWN], dtype=np.int8)
    row_levels = levels[metric.cat.codes.to_numpy()]
    unknown = np.array([n not in METRICS for n in names], dtype=bool)
    if unknown.any():
        codes = metric.cat.codes.to_numpy()
        messages = {int(i): _unknown_metric(names[i]) for i in np.flatnonzero(unknown)}
        found.each(_per_category(metric, unknown), "metric", lambda i: messages[int(codes[i])])
    return row_levels


def _level_code(name: str) -> int:
    entry = METRICS.get(name)
    if entry is None:
        return _UNKNOWN
    # ``error`` is written at the level of the step that failed, a GPU's or the node's.
    return _GPU_OR_NODE if name == "error" else _LEVEL_CODE[entry.level]


def _unknown_metric(name: str) -> str:
    close = difflib.get_close_matches(name.lower(), list(METRICS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown metric {name!r}{hint}"


def _check_run_ids(run_id: pd.Series, found: _Findings) -> None:
    categories = run_id.cat.categories
    bad = np.array([_RUN_ID.fullmatch(str(c)) is None for c in categories], dtype=bool)
    if bad.any():
        found.each(
            _per_category(run_id, bad),
            "run_id",
            lambda i: (
                f"run_id {_text_at(run_id, i)!r} is not a DNS label (at most 63 characters of "
                "a-z, 0-9 and '-', starting and ending with a letter or digit)"
            ),
        )


# Numbers ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Numbers:
    """A column read as numbers: NaN where a value is missing or is not a number."""

    values: Floats
    missing: Bools
    garbage: Bools


def _parse_numbers(raw: pd.Series, *, nan_is_missing: bool) -> _Numbers:
    """Read any column as float64, telling apart missing values, text that is no number, and numbers.

    ``nan_is_missing``: whether a NaN of a numeric column means "no value" (it does for ``gpu``, which a
    float column stores as NaN) rather than a NaN measured (it does not for ``value``).
    """
    n = len(raw)
    dtype = raw.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        # Parse the few categories, then gather: a categorical of numbers is parsed once per distinct value.
        parsed = _parse_numbers(pd.Series(dtype.categories), nan_is_missing=nan_is_missing)
        codes = raw.cat.codes.to_numpy()
        return _Numbers(
            np.append(parsed.values, np.nan)[codes],
            np.append(parsed.missing, True)[codes],
            np.append(parsed.garbage, False)[codes],
        )
    if pd.api.types.is_bool_dtype(dtype) or pd.api.types.is_datetime64_any_dtype(dtype):
        values = np.full(n, np.nan)
        missing = raw.isna().to_numpy(dtype=bool)
        return _Numbers(values, missing, ~missing)
    if pd.api.types.is_numeric_dtype(dtype):
        values = raw.to_numpy(dtype=np.float64, na_value=np.nan)
        if nan_is_missing:
            missing = np.isnan(values)
        else:
            # Only a masked (nullable) array can say "no value" apart from a NaN measured.
            masked = isinstance(dtype, pd.api.extensions.ExtensionDtype)
            missing = raw.isna().to_numpy(dtype=bool) if masked else np.zeros(n, dtype=bool)
        return _Numbers(values, missing, np.zeros(n, dtype=bool))
    return _parse_number_text(raw, nan_is_missing=nan_is_missing)


def _parse_number_text(raw: pd.Series, *, nan_is_missing: bool) -> _Numbers:
    fast = _arrow_cast(raw, pa.float64())
    if fast is not None:
        cast, missing = fast
        values = np.asarray(pc.fill_null(cast, np.nan).to_numpy(zero_copy_only=False), dtype=np.float64)
        return _Numbers(values, missing, np.zeros(len(raw), dtype=bool))
    # Slow path, taken only when some value is not a clean number: find which, keeping the text.
    blank = _blank(raw, nan_is_missing=nan_is_missing)
    values = pd.to_numeric(raw.where(~blank), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    unparsed = np.isnan(values) & ~blank
    if unparsed.any():
        idx = np.flatnonzero(unparsed)
        # "nan" is a number (a NaN); whether one is allowed is the column's rule, not the parser's.
        is_nan = raw.iloc[idx].map(lambda v: _to_text(v).strip().lower() in _NAN_TEXT).to_numpy(dtype=bool)
        unparsed[idx[is_nan]] = False
    return _Numbers(values, blank, unparsed)


def _blank(raw: pd.Series, *, nan_is_missing: bool = True) -> Bools:
    """Missing or only white space. Among Python objects (a JSON line, a frame built by hand) a float NaN
    is a NaN measured unless ``nan_is_missing``; elsewhere NaN is how pandas marks a missing string."""
    missing = np.array(raw.isna(), dtype=bool)  # a copy: it is written to below
    if raw.dtype != object:
        return missing | (raw.str.strip() == "").to_numpy(dtype=bool)
    if not nan_is_missing and missing.any():
        idx = np.flatnonzero(missing)
        missing[idx] = [not isinstance(v, float) for v in raw.iloc[idx]]
    text = raw.map(_to_text, na_action="ignore")
    return missing | (text.str.strip() == "").to_numpy(dtype=bool)


def _arrow_cast(raw: pd.Series, to: pa.DataType) -> tuple[Any, Bools] | None:
    """Cast a text column with Arrow (fast); ``None`` when some value does not cast cleanly.

    Empty strings count as missing. Returns the cast Arrow array and the mask of missing values.
    """
    if raw.dtype == object:
        return None  # mixed Python objects: only the exact path knows what to make of them
    try:
        text = pa.array(raw)
        if not (pa.types.is_string(text.type) or pa.types.is_large_string(text.type)):
            return None
        empty = pc.equal(text, pa.scalar("", text.type))
        cast = pc.cast(pc.if_else(empty, pa.scalar(None, text.type), text), to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    return cast, np.asarray(cast.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def _integer_column(
    raw: pd.Series, name: str, found: _Findings, *, nullable: bool
) -> tuple[pd.Series, Bools]:
    """An integer ≥ 0 column: ``Int64`` when ``nullable``, else ``int64`` and required.

    Also returns where a value was given, even a bad one (the level checks ask whether ``gpu`` is set).
    """
    dtype = raw.dtype
    if pd.api.types.is_integer_dtype(dtype) and not isinstance(dtype, pd.CategoricalDtype):
        # The usual case (Parquet, a generated frame): no float round trip, no text.
        missing = raw.isna().to_numpy(dtype=bool)
        values = raw.to_numpy(dtype=np.int64, na_value=0)
        not_integer = np.zeros(len(raw), dtype=bool)
    else:
        parsed = _parse_numbers(raw, nan_is_missing=True)
        missing = parsed.missing
        with np.errstate(invalid="ignore"):
            whole = np.isfinite(parsed.values) & (parsed.values == np.trunc(parsed.values))
            whole &= np.abs(parsed.values) <= 2.0**53
        not_integer = ~missing & ~whole
        values = np.where(whole, parsed.values, 0).astype(np.int64)
    negative = ~missing & ~not_integer & (values < 0)
    if not nullable:
        found.each(missing, name, lambda i: f"{name} is empty")
    found.each(not_integer, name, lambda i: f"{name} {_text_at(raw, i)!r} is not an integer")
    found.each(negative, name, lambda i: f"{name} {_text_at(raw, i)!r} is negative")
    given = ~missing
    if dtype == RESULT_DTYPES[name]:
        return raw, given
    unusable = missing | not_integer | negative
    if unusable.any():
        values = np.where(unusable, 0, values)
    column = pd.arrays.IntegerArray(values, unusable) if nullable else values
    return pd.Series(column, index=raw.index, name=name, copy=False), given


def _value_column(
    raw: pd.Series, metric: pd.Series, levels: npt.NDArray[np.int8], found: _Findings
) -> pd.Series:
    parsed = _parse_numbers(raw, nan_is_missing=False)
    values = parsed.values
    found.each(parsed.missing, "value", lambda i: "value is empty")
    found.each(parsed.garbage, "value", lambda i: f"value {_text_at(raw, i)!r} is not a number")
    not_finite = ~parsed.missing & ~parsed.garbage & ~np.isfinite(values)
    found.each(not_finite, "value", lambda i: f"value {_text_at(raw, i)!r} is not a finite number")
    with np.errstate(invalid="ignore"):
        negative = values < 0
    if negative.any():
        perf = np.array(
            [METRICS[str(c)].kind == "perf" if str(c) in METRICS else False for c in metric.cat.categories],
            dtype=bool,
        )
        row_perf = _per_category(metric, perf)

        def describe(i: int) -> str:
            text, name = _text_at(raw, i), _text_at(metric, i)
            if row_perf[i]:
                return f"negative bandwidth/throughput {text!r} for {name!r}"
            return f"negative value {text!r}: {name!r} is never negative"

        found.each(negative & (levels != _UNKNOWN), "value", describe)
    if raw.dtype == np.float64:
        return raw
    return pd.Series(values, index=raw.index, name="value", copy=False)


# Timestamps ---------------------------------------------------------------------------------------------


def _ts_column(raw: pd.Series, found: _Findings) -> pd.Series:
    """Timestamps in UTC, microseconds; a timestamp without a zone is taken as UTC."""
    dtype = raw.dtype
    garbage = np.zeros(len(raw), dtype=bool)
    if dtype == _TS:
        ts = raw
    elif isinstance(dtype, pd.DatetimeTZDtype):
        ts = raw.dt.tz_convert("UTC")
    elif pd.api.types.is_datetime64_dtype(dtype):
        ts = raw.dt.tz_localize("UTC")
    elif pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype):
        # An epoch number is ambiguous (seconds? nanoseconds?): the contract asks for ISO 8601.
        ts = pd.Series(pd.NaT, index=raw.index, dtype=_TS)
        garbage = raw.notna().to_numpy(dtype=bool)
    else:
        ts, garbage = _parse_ts_text(raw)
    utc: pd.Series = ts if ts.dtype == _TS else ts.dt.as_unit("us")
    missing = utc.isna().to_numpy(dtype=bool) & ~garbage
    found.each(missing, "ts", lambda i: "ts is empty")
    found.each(
        garbage,
        "ts",
        lambda i: f"ts {_text_at(raw, i)!r} is not a timestamp (ISO 8601, e.g. 2024-05-01T12:00:00Z)",
    )
    return utc if utc.name == "ts" else utc.rename("ts")


def _parse_ts_text(raw: pd.Series) -> tuple[pd.Series, Bools]:
    """Parse ISO 8601 text to UTC; also returns the mask of values that are not timestamps."""
    if isinstance(raw.dtype, pd.CategoricalDtype):
        parsed, garbage = _parse_ts_text(pd.Series(raw.cat.categories, dtype=object))
        codes = raw.cat.codes.to_numpy()
        values = np.append(parsed.to_numpy(dtype="datetime64[us]"), np.datetime64("NaT", "us"))[codes]
        ts = pd.Series(values, index=raw.index, copy=False).dt.tz_localize("UTC")
        return ts, np.append(garbage, False)[codes]
    # Arrow first (fast): with offsets, or else all without one, which are UTC by the contract.
    for arrow_type in (pa.timestamp("us", tz="UTC"), pa.timestamp("us")):
        fast = _arrow_cast(raw, arrow_type)
        if fast is not None:
            cast = fast[0] if arrow_type.tz else pc.assume_timezone(fast[0], "UTC")
            return pd.Series(cast.to_pandas().array, index=raw.index), np.zeros(len(raw), dtype=bool)
    # Slow path: offsets and no offsets mixed, or some bad text.
    blank = _blank(raw)
    text = raw if raw.dtype != object else raw.map(_to_text, na_action="ignore")
    ts = pd.to_datetime(text.where(~blank), utc=True, format="ISO8601", errors="coerce")
    return ts, ts.isna().to_numpy(dtype=bool) & ~blank


# Levels -------------------------------------------------------------------------------------------------


def _check_levels(
    levels: npt.NDArray[np.int8], gpu_given: Bools, peer_given: Bools, metric: pd.Series, found: _Findings
) -> None:
    """Each metric's level fixes which of ``gpu`` and ``peer`` a row fills (DESIGN.md, metric registry)."""

    def words(i: int) -> str:
        return f"{_text_at(metric, i)!r} is {_LEVEL_WORDS[int(levels[i])]} metric"

    found.each((levels == _GPU) & ~gpu_given, "gpu", lambda i: f"{words(i)}: gpu must be set")
    found.each(
        ((levels == _NODE) | (levels == _PAIR)) & gpu_given, "gpu", lambda i: f"{words(i)}: gpu must be empty"
    )
    found.each(
        (levels == _PAIR) & ~peer_given, "peer", lambda i: f"{words(i)}: peer must name the other node"
    )
    found.each(
        (levels != _PAIR) & (levels != _UNKNOWN) & peer_given,
        "peer",
        lambda i: f"{words(i)}: peer is only for pair metrics and must be empty",
    )


# Across rows --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Codes:
    """A canonical frame as integer arrays (category codes as they are, -1 where missing): what the
    checks across rows compare. ``pos`` maps a subset's rows back to the frame's positions."""

    frame: pd.DataFrame
    run: Codes
    node: Codes
    gpu: Ints
    uuid: Codes
    model: Codes
    metric: Codes
    repeat: Ints
    peer: Codes
    event: Bools
    pos: Ints | None = None

    @classmethod
    def of(cls, frame: pd.DataFrame) -> _Codes:
        def codes(name: str) -> Codes:
            return frame[name].cat.codes.to_numpy()

        metric = frame["metric"]
        is_event = np.array([str(c) in EVENT_METRICS for c in metric.cat.categories], dtype=bool)
        return cls(
            frame=frame,
            run=codes("run_id"),
            node=codes("node"),
            gpu=frame["gpu"].to_numpy(dtype=np.int64, na_value=-1),
            uuid=codes("gpu_uuid"),
            model=codes("gpu_model"),
            metric=codes("metric"),
            repeat=frame["repeat"].to_numpy(dtype=np.int64),
            peer=codes("peer"),
            event=_per_category(metric, is_event),
        )

    def take(self, mask: Bools) -> _Codes:
        """The rows of ``mask``; unchanged (no copy) when that is every row."""
        if mask.all():
            return self
        idx = np.flatnonzero(mask)
        return _Codes(
            frame=self.frame,
            run=self.run[idx],
            node=self.node[idx],
            gpu=self.gpu[idx],
            uuid=self.uuid[idx],
            model=self.model[idx],
            metric=self.metric[idx],
            repeat=self.repeat[idx],
            peer=self.peer[idx],
            event=self.event[idx],
            pos=idx if self.pos is None else self.pos[idx],
        )

    def positions(self, mask: Bools) -> tuple[Ints, Ints]:
        """Where ``mask`` is set: the indices into this subset and the frame's positions."""
        idx = np.flatnonzero(mask)
        return idx, (idx if self.pos is None else self.pos[idx])

    def text(self, name: str, i: int) -> str:
        return _text_at(self.frame[name], i)

    def gpu_words(self, i: int) -> str:
        gpu = self.frame["gpu"].iloc[i]
        return f"node {self.text('node', i)!r} gpu {gpu}"

    def in_run(self, i: int) -> str:
        """`` in run 'x'`` when the table holds several runs (else it goes without saying)."""
        several = len(self.frame["run_id"].cat.categories) > 1
        return f" in run {self.text('run_id', i)!r}" if several else ""


def _check_relations(codes: _Codes, found: _Findings) -> None:
    """Duplicated samples and conflicting identities, among the rows without a problem of their own."""
    rows = codes.take(~found.bad)
    _check_duplicates(codes, rows, found)
    _check_identities(codes, rows, found)


def _check_duplicates(codes: _Codes, rows: _Codes, found: _Findings) -> None:
    """A sample is (run_id, node, gpu, metric, repeat, peer); events (XIDs, errors) may repeat.

    A key holds one metric, so its rows are all events or none: dropping event rows afterwards is exact.
    """
    key, span = _group_ids(
        [(rows.run, 0), (rows.node, 0), (rows.gpu, 1), (rows.metric, 0), (rows.repeat, 0), (rows.peer, 1)]
    )
    repeated = _repeated(key, span)
    if repeated is not None:
        repeated &= ~rows.event

    def describe(members: Ints, _: Codes | None) -> str:
        i = int(members[0])
        peer = f", peer {codes.text('peer', i)!r}" if codes.peer[i] >= 0 else ""
        gpu = f", gpu {codes.gpu[i]}" if codes.gpu[i] >= 0 else ""
        return (
            f"duplicated sample (node {codes.text('node', i)!r}{gpu}, metric {codes.text('metric', i)!r}, "
            f"repeat {codes.repeat[i]}{peer}){codes.in_run(i)}: {found.rows.describe(members)}"
        )

    _report(found, rows, repeated, keys=key, column="repeat", describe=describe)


def _check_identities(codes: _Codes, rows: _Codes, found: _Findings) -> None:
    """Within a run, one GPU (node, index) has one UUID, one UUID is one GPU, one node one GPU model.

    Rows without a GPU index or without a UUID (node-level rows) say nothing about the first two.
    """
    has_gpu = (rows.gpu >= 0) & (rows.uuid >= 0)
    gpu_key, gpu_span = _group_ids([(rows.run, 0), (rows.node, 0), (rows.gpu, 1)])
    uuid_key, uuid_span = _group_ids([(rows.run, 0), (rows.uuid, 1)])
    node_key, node_span = _group_ids([(rows.run, 0), (rows.node, 0)])

    def quoted(name: str) -> Callable[[int], str]:
        return lambda i: repr(codes.text(name, i))

    def several_uuids(members: Ints, values: Codes | None) -> str:
        i = int(members[0])
        listed = _values_with_rows(members, values, quoted("gpu_uuid"), found.rows)
        return f"{codes.gpu_words(i)}{codes.in_run(i)} has several gpu_uuid values: {listed}"

    def several_gpus(members: Ints, values: Codes | None) -> str:
        i = int(members[0])
        listed = _values_with_rows(members, values, codes.gpu_words, found.rows)
        return f"gpu_uuid {codes.text('gpu_uuid', i)!r}{codes.in_run(i)} is on several GPUs: {listed}"

    def several_models(members: Ints, values: Codes | None) -> str:
        i = int(members[0])
        listed = _values_with_rows(members, values, quoted("gpu_model"), found.rows)
        return f"node {codes.text('node', i)!r}{codes.in_run(i)} has several gpu_model values: {listed}"

    uuid_conflicts = _conflicting(gpu_key, rows.uuid, gpu_span, has_gpu)
    _report(
        found, rows, uuid_conflicts, keys=gpu_key, column="gpu_uuid", describe=several_uuids, values=rows.uuid
    )
    gpu_conflicts = _conflicting(uuid_key, gpu_key, uuid_span, has_gpu)
    _report(
        found, rows, gpu_conflicts, keys=uuid_key, column="gpu_uuid", describe=several_gpus, values=gpu_key
    )
    model_conflicts = _conflicting(node_key, rows.model, node_span)
    _report(
        found,
        rows,
        model_conflicts,
        keys=node_key,
        column="gpu_model",
        describe=several_models,
        values=rows.model,
    )


def _report(
    found: _Findings,
    subset: _Codes,
    flagged: Bools | None,
    *,
    keys: Codes,
    column: str,
    describe: Callable[[Ints, Codes | None], str],
    values: Codes | None = None,
) -> None:
    """Record the groups of ``flagged`` rows of ``subset`` (``None``: none) as problems."""
    if flagged is None:
        return
    idx, positions = subset.positions(flagged)
    found.groups(positions, keys[idx], column, describe, None if values is None else values[idx])


def _values_with_rows(members: Ints, values: Codes | None, words: Callable[[int], str], where: _Rows) -> str:
    """``'A' (rows 2, 3), 'B' (row 7)``: each distinct value of a group, in the order met, with its rows."""
    assert values is not None
    parts = []
    _, first = np.unique(values, return_index=True)
    for j in np.sort(first)[:_LISTED]:
        rows = members[values == values[j]]
        parts.append(f"{words(int(rows[0]))} ({where.describe(rows)})")
    return ", ".join(parts)


def _group_ids(parts: Sequence[tuple[Codes, int]]) -> tuple[Codes, int]:
    """One id per row naming its combination of ``parts`` (each an array and an offset making it ≥ 0).

    Mixed radix, so no hashing, and in int32 when the ids fit (less memory to touch). Ids stay below the
    returned span, which is kept small enough (by factorizing, if ever needed) for the checks to index a
    table by id.
    """
    n = parts[0][0].size
    digits = [(part, offset, int(part.max(initial=-offset)) + offset + 1) for part, offset in parts]
    # A part with one value only (a single run, no peers) tells no rows apart.
    digits = [d for d in digits if d[2] > 1]
    span = int(np.prod([radix for _, _, radix in digits], dtype=object))
    if span > _dense_limit(n):
        return _hashed_group_ids(digits, n)
    key: Codes = np.zeros(n, dtype=np.int32) if span < 2**31 else np.zeros(n, dtype=np.int64)
    for part, offset, radix in digits:
        key *= radix
        np.add(key, part, out=key, casting="unsafe")  # bounded by the radix, so never truncated
        if offset:
            key += offset
    return key, span


def _hashed_group_ids(digits: Sequence[tuple[Codes, int, int]], n: int) -> tuple[Codes, int]:
    """Dense ids for a key too wide for a table: mixed radix in int64, factorized as it would overflow."""
    key = np.zeros(n, dtype=np.int64)
    span = 1
    for part, offset, radix in digits:
        if span * radix >= 2**62:
            codes, uniques = pd.factorize(key)
            key, span = codes.astype(np.int64), len(uniques)
        key *= radix
        key += part
        if offset:
            key += offset
        span *= radix
    codes, uniques = pd.factorize(key)
    return codes.astype(np.int64), len(uniques)


def _dense_limit(n: int) -> int:
    # A table indexed by id costs 4 to 8 bytes an entry: a few entries per row, or 4M, is cheap; a wider
    # key goes through a hash factorization instead.
    return 4 * n + (1 << 22)


def _repeated(key: Codes, span: int) -> Bools | None:
    """Rows whose key occurs more than once; ``None`` when none does.

    No sort, no hash: every row writes its position to its key's slot and one write per key survives, so
    a key is repeated exactly when some row finds another row's position in its slot.
    """
    n = key.size
    slot = np.empty(span, dtype=np.int32 if n < 2**31 else np.int64)
    position = np.arange(n, dtype=slot.dtype)
    slot[key] = position
    overwritten = slot[key] != position
    if not overwritten.any():
        return None
    slot[key[overwritten]] = -1
    repeated: Bools = slot[key] == -1
    return repeated


def _conflicting(group: Codes, value: Codes, span: int, among: Bools | None = None) -> Bools | None:
    """Rows of groups holding more than one distinct ``value``; ``None`` when no group does.

    The same idea as :func:`_repeated`: one write per group survives, so a group conflicts exactly when
    one of its rows disagrees with its slot. Rows outside ``among`` share one extra slot, never reported
    (cheaper than taking the subset of every array).
    """
    if among is not None and not among.all():
        group = np.where(among, group, span)
        span += 1
    slot = np.empty(span, dtype=value.dtype)
    slot[group] = value
    differs = slot[group] != value
    if among is not None:
        differs &= among
    if not differs.any():
        return None
    bad = np.zeros(span, dtype=bool)
    bad[group[differs]] = True
    conflicting: Bools = bad[group]
    if among is not None:
        conflicting &= among
    return conflicting


# ---------------------------------------------------------------------------------------------------------
# Canonical categories and concatenation


def _tidy_categories(frame: pd.DataFrame) -> pd.DataFrame:
    """Sorted categories, each one used: the same table reads the same from any format."""
    changed = {}
    for name in CATEGORY_COLUMNS:
        column = frame[name]
        categories = column.cat.categories
        seen = np.zeros(len(categories) + 1, dtype=bool)
        seen[column.cat.codes.to_numpy()] = True  # a missing value (-1) marks the extra last slot
        used = seen[:-1]
        if used.all() and categories.is_monotonic_increasing:
            continue
        kept = categories[used]
        order = kept.argsort()
        mapping = np.full(len(categories), -1, dtype=np.int64)
        mapping[np.flatnonzero(used)[order]] = np.arange(order.size)
        changed[name] = _recode(column, mapping, pd.Index(kept[order], dtype=_STR))
    return frame.assign(**changed) if changed else frame


def _concat(parts: Sequence[pd.DataFrame]) -> pd.DataFrame:
    columns: dict[str, Any] = {}
    for name in RESULT_COLUMNS:
        if name in CATEGORY_COLUMNS:
            union = pd.api.types.union_categoricals([p[name] for p in parts], sort_categories=True)
            columns[name] = pd.Series(union, name=name)
        else:
            columns[name] = pd.concat([p[name] for p in parts], ignore_index=True)
    return pd.DataFrame(columns, copy=False)


# ---------------------------------------------------------------------------------------------------------
# Reading files


@dataclass
class _Raw:
    """A file as read, before validation: the frame, each row's number, and problems of the reading."""

    frame: pd.DataFrame
    rows: Ints
    problems: list[Problem] = field(default_factory=list)
    total: int = 0
    duplicated_columns: list[str] = field(default_factory=list)


def _read_file(path: PathArg) -> _Raw:
    source = os.fspath(path)
    suffix = Path(path).suffix.lower()
    if suffix not in _CSV | _PARQUET | _JSONL:
        raise ResultsError(source, [Problem(_unknown_suffix(suffix))])
    try:
        if not Path(path).is_file():
            os.stat(path)  # raises the precise OSError (no such file, permission denied)
            raise IsADirectoryError(21, "not a regular file")
        if suffix in _CSV:
            return _read_csv(path)
        if suffix in _PARQUET:
            return _read_parquet(path)
        return _read_jsonl(path)
    except OSError as exc:
        raise ResultsError(source, [Problem(f"cannot read the file: {exc.strerror or exc}")]) from None
    except (pa.ArrowException, ValueError, UnicodeDecodeError, csv.Error) as exc:
        kind = {".csv": "CSV", ".parquet": "Parquet", ".pq": "Parquet"}.get(suffix, "JSON-lines")
        raise ResultsError(source, [Problem(f"cannot parse the {kind} file: {_one_line(exc)}")]) from None


def _unknown_suffix(suffix: str) -> str:
    return (
        f"unknown file type {suffix or '(no suffix)'!r}: results are .csv, .parquet (.pq) or JSON lines "
        "(.jsonl, .ndjson, .json, .log)"
    )


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "…"


_CSV_DICT: Final = pa.dictionary(pa.int32(), pa.string())
#: The Arrow type of each contract column, as written to Parquet.
_ARROW_TYPES: Final = {
    **dict.fromkeys(CATEGORY_COLUMNS, _CSV_DICT),
    "gpu": pa.int64(),
    "value": pa.float64(),
    "repeat": pa.int64(),
    "ts": pa.timestamp("us", tz="UTC"),
}


def _read_csv(path: PathArg) -> _Raw:
    with open(path, newline="", encoding="utf-8-sig") as f:
        header = next(csv.reader(f), None)
    if header is None:
        return _Raw(pd.DataFrame(), np.empty(0, dtype=np.int64))
    wanted = [c for c in RESULT_COLUMNS if c in header]
    duplicated = [c for c in wanted if header.count(c) > 1]
    table, skipped = _csv_table(path, wanted, threads=True)
    rows = np.arange(2, table.num_rows + 2, dtype=np.int64)
    problems: list[Problem] = []
    if skipped:
        # Arrow numbers the lines it skips only when it reads on one thread: read again to say where.
        table, skipped = _csv_table(path, wanted, threads=False)
        lines = np.arange(2, table.num_rows + len(skipped) + 2, dtype=np.int64)
        rows = lines[~np.isin(lines, [line for line, _, _ in skipped])]
        ragged = [(line, expected, actual) for line, expected, actual in skipped if actual]
        problems = [
            Problem(f"{actual} fields where the header has {expected}", row=line)
            for line, expected, actual in ragged[:_CAP]
        ]
        total = len(ragged)
    else:
        total = 0
    frame, rows = _drop_blank_lines(_arrow_to_frame(table), rows)
    return _Raw(frame, rows, problems, total, duplicated)


def _csv_table(
    path: PathArg, wanted: list[str], *, threads: bool
) -> tuple[pa.Table, list[tuple[int, int, int]]]:
    """The wanted columns as text, and the lines Arrow skipped as ``(line, expected, actual)`` fields
    (``actual`` 0 for a line of blanks)."""
    skipped: list[tuple[int, int, int]] = []

    def skip(row: Any) -> str:
        actual = row.actual_columns if str(row.text).strip() else 0
        skipped.append((row.number or 0, row.expected_columns, actual))
        return "skip"

    # Everything is read as text so that a bad value can be shown as written; strings of the category
    # columns come dictionary-encoded, so they arrive as categoricals without a conversion pass. Empty
    # lines are kept (as rows of empty strings, dropped later) so that every row keeps its line number.
    types = {c: _CSV_DICT if c in CATEGORY_COLUMNS else pa.string() for c in wanted}
    table = pa_csv.read_csv(
        path,
        read_options=pa_csv.ReadOptions(block_size=32 << 20, use_threads=threads),
        parse_options=pa_csv.ParseOptions(ignore_empty_lines=False, invalid_row_handler=skip),
        convert_options=pa_csv.ConvertOptions(
            include_columns=wanted,
            column_types=types,
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        ),
    )
    return table, skipped


def _drop_blank_lines(frame: pd.DataFrame, rows: Ints) -> tuple[pd.DataFrame, Ints]:
    """Drop the rows that were empty lines: every contract column an empty string."""
    blank: Bools | None = None
    for name in (c for c in RESULT_COLUMNS if c in frame.columns):
        column = frame[name]
        if isinstance(column.dtype, pd.CategoricalDtype):
            empty = np.asarray(column.cat.categories == "", dtype=bool)
            this = _per_category(column, empty)
        else:
            this = (column == "").to_numpy(dtype=bool)
        blank = this if blank is None else blank & this
        if not blank.any():
            return frame, rows  # the usual case, known after the first column
    if blank is None:
        return frame, rows
    return frame[~blank].reset_index(drop=True), rows[~blank]


def _read_parquet(path: PathArg) -> _Raw:
    schema = pq.read_schema(path)
    names: list[str] = list(schema.names)
    wanted = [c for c in RESULT_COLUMNS if c in names]
    text = [
        c
        for c in wanted
        if c in CATEGORY_COLUMNS
        and (pa.types.is_string(schema.field(c).type) or pa.types.is_large_string(schema.field(c).type))
    ]
    table = pq.read_table(path, columns=wanted, read_dictionary=text)
    frame = _arrow_to_frame(table)
    return _Raw(
        frame,
        np.arange(1, len(frame) + 1, dtype=np.int64),
        duplicated_columns=[c for c in wanted if names.count(c) > 1],
    )


def _arrow_to_frame(table: pa.Table) -> pd.DataFrame:
    """An Arrow table as pandas, strings of the category columns as categoricals, ``gpu`` as ``Int64``."""
    for name in table.column_names:
        if pa.types.is_null(table.schema.field(name).type) and name in _ARROW_TYPES:
            # An all-empty column written without a type (no pair metric, no peer): typing it here spares a
            # column of Python ``None`` objects.
            i = table.schema.get_field_index(name)
            table = table.set_column(i, name, table.column(name).cast(_ARROW_TYPES[name]))
    gpu = None
    if "gpu" in table.column_names and pa.types.is_integer(table.schema.field("gpu").type):
        # Arrow turns an integer column with nulls into float64; build the nullable array directly.
        column = table.column("gpu")
        gpu = pd.arrays.IntegerArray(
            np.asarray(pc.fill_null(column, 0).to_numpy(), dtype=np.int64),
            np.asarray(column.is_null().to_numpy(), dtype=bool),
        )
        table = table.drop_columns(["gpu"])
    for name in CATEGORY_COLUMNS:
        if name in table.column_names:
            field_type = table.schema.field(name).type
            if pa.types.is_string(field_type) or pa.types.is_large_string(field_type):
                i = table.schema.get_field_index(name)
                table = table.set_column(i, name, table.column(name).combine_chunks().dictionary_encode())
    # The pandas metadata is ignored on purpose: this module sets every dtype itself, faster.
    frame: pd.DataFrame = table.to_pandas(ignore_metadata=True, split_blocks=True, self_destruct=True)
    if gpu is not None:
        frame["gpu"] = gpu
    return frame


def _read_jsonl(path: PathArg) -> _Raw:
    data = Path(path).read_bytes()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    lines = _count_object_lines(data)
    if lines is not None:
        # A plain JSON-lines file (the common large case): no line classification needed.
        fast = _jsonl_fast(data, np.arange(1, lines + 1, dtype=np.int64))
        if fast is not None:
            return fast
    starts, ends, objects, all_objects = _object_lines(data)
    if objects.size == 0:
        raw = _Raw(pd.DataFrame(), np.empty(0, dtype=np.int64))
        if data.lstrip().startswith(b"["):
            raw.problems.append(
                Problem("no result rows: a JSON array; results are JSON lines, one object a line")
            )
            raw.total = 1
        return raw
    # A Pod log loses its other lines first (blank lines Arrow skips by itself).
    payload = data if all_objects else b"\n".join(data[starts[i] : ends[i]] for i in objects)
    fast = _jsonl_fast(payload, objects + 1)
    return fast if fast is not None else _jsonl_slow(data, starts, ends, objects)


def _count_object_lines(data: bytes) -> int | None:
    """The number of lines if every line starts with ``{`` (no blank or other line), else ``None``.

    Two byte counts in C, instead of classifying every line: a raw newline cannot occur inside JSON.
    """
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    objects = data.count(b"\n{") + data.startswith(b"{")
    return lines if data and objects == lines else None


def _object_lines(data: bytes) -> tuple[Ints, Ints, Ints, bool]:
    """Line bounds, the lines holding a JSON object, and whether every non-blank line does.

    Vectorised over the bytes; only lines that start with a blank are looked at one by one.
    """
    buf = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(buf == 0x0A)
    starts = np.r_[0, newlines + 1].astype(np.int64)
    ends = np.r_[newlines, buf.size].astype(np.int64)
    nonempty = starts < ends
    first = np.zeros(starts.size, dtype=np.uint8)
    first[nonempty] = buf[starts[nonempty]]
    is_object = first == ord("{")
    indented = nonempty & ~is_object & np.isin(first, np.frombuffer(b" \t\r\x0b\x0c", dtype=np.uint8))
    blank = ~nonempty
    for i in np.flatnonzero(indented):
        line = data[starts[i] : ends[i]].lstrip()
        is_object[i] = line.startswith(b"{")
        blank[i] = not line
    return starts, ends, np.flatnonzero(is_object), bool(np.all(is_object | blank))


_JSON_TYPES: Final = {
    "run_id": pa.string(),
    "node": pa.string(),
    "gpu": pa.int64(),
    "gpu_uuid": pa.string(),
    "gpu_model": pa.string(),
    "metric": pa.string(),
    "value": pa.float64(),
    "repeat": pa.int64(),
    "peer": pa.string(),
    "ts": pa.string(),
}


def _jsonl_fast(payload: bytes, rows: Ints) -> _Raw | None:
    """Parse with Arrow when every object line is clean; ``None`` sends the file to the exact parser.

    ``payload`` holds only object lines (and maybe blank ones); ``rows`` is each object's line number.
    """
    try:
        table = pa_json.read_json(
            io.BytesIO(payload),
            read_options=pa_json.ReadOptions(block_size=16 << 20),
            parse_options=pa_json.ParseOptions(
                explicit_schema=pa.schema(list(_JSON_TYPES.items())), unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if table.num_rows != rows.size:
        return None  # two objects on a line, say: line numbers would not match
    # The explicit schema fills an absent key with nulls; a key named nowhere in the file is a missing
    # column. The first object usually names them all, which saves scanning a large file for each.
    # (A key inside a string value would hide a missing column; the exact parser is not worth that cost.)
    first = payload[: payload.find(b"\n")]
    present = [c for c in RESULT_COLUMNS if (key := f'"{c}"'.encode()) in first or key in payload]
    if not present:
        return _Raw(pd.DataFrame(), np.empty(0, dtype=np.int64))
    table = table.select(present)
    # Objects without any contract column are other tools' structured log lines.
    nothing = np.logical_and.reduce(
        [np.asarray(c.is_null().to_numpy(zero_copy_only=False), dtype=bool) for c in table.columns]
    )
    if nothing.any():
        rows = rows[~nothing]
        table = table.filter(pa.array(~nothing))
    return _Raw(_arrow_to_frame(table), rows)


def _jsonl_slow(data: bytes, starts: Ints, ends: Ints, objects: Ints) -> _Raw:
    """Parse line by line with :mod:`json`, naming each bad line; values are kept as written."""
    records: list[dict[str, object]] = []
    rows: list[int] = []
    problems: list[Problem] = []
    total = 0
    for i in objects:
        line_no = int(i) + 1
        try:
            obj = json.loads(data[starts[i] : ends[i]])
        except (ValueError, UnicodeDecodeError) as exc:
            total += 1
            if len(problems) < _CAP:
                problems.append(Problem(f"not valid JSON: {_json_error(exc)}", row=line_no))
            continue
        if not isinstance(obj, dict) or not any(c in obj for c in RESULT_COLUMNS):
            continue
        records.append({c: _json_value(obj[c]) for c in RESULT_COLUMNS if c in obj})
        rows.append(line_no)
    present = [c for c in RESULT_COLUMNS if any(c in r for r in records)]
    columns = {c: pd.Series([r.get(c) for r in records], dtype=object) for c in present}
    frame = pd.DataFrame(columns, index=pd.RangeIndex(len(rows)))
    return _Raw(frame, np.asarray(rows, dtype=np.int64), problems, total)


def _json_value(value: object) -> object:
    """Numbers and strings as they are; anything else as its JSON text, so no check mistakes its type."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        return json.dumps(value)
    return value


def _json_error(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} (column {exc.colno})"
    return _one_line(exc)


# ---------------------------------------------------------------------------------------------------------
# Writing files


def _write_parquet(frame: pd.DataFrame, path: PathArg) -> None:
    # Categoricals become dictionary columns, which the reader takes back as categoricals directly; the
    # explicit schema also types a column that is all empty (Arrow would write its "null" type, which
    # outside tools read badly).
    schema = pa.schema([(name, _ARROW_TYPES[name]) for name in RESULT_COLUMNS])
    pq.write_table(pa.Table.from_pandas(frame, schema=schema, preserve_index=False), path)


def _write_csv(frame: pd.DataFrame, path: PathArg) -> None:
    columns = {name: pa.array(frame[name]) for name in RESULT_COLUMNS}
    for name in CATEGORY_COLUMNS:
        columns[name] = pc.cast(columns[name], pa.large_string())
    columns["ts"] = pa.array(_iso_utc(frame["ts"]))
    table = pa.table(columns)
    with open(path, "wb") as f:
        # Unquoted, as people and other tools write CSV, unless some value holds a comma, quote or newline.
        for quoting in ("none", "needed"):
            f.seek(0)
            f.truncate()
            f.write((",".join(RESULT_COLUMNS) + "\n").encode())
            try:
                pa_csv.write_csv(table, f, pa_csv.WriteOptions(include_header=False, quoting_style=quoting))
                break
            except pa.ArrowInvalid:
                continue


def _write_jsonl(frame: pd.DataFrame, path: PathArg) -> None:
    """JSON lines in the payload's shape, built column-wise by Arrow rather than row by row."""
    text = pa.large_string()
    pieces: list[Any] = []
    for k, name in enumerate(RESULT_COLUMNS):
        pieces.append(pa.scalar(("{" if k == 0 else ", ") + json.dumps(name) + ": ", text))
        pieces.append(_json_texts(frame[name], name))
    pieces.append(pa.scalar("}\n", text))
    lines = pc.binary_join_element_wise(*pieces, pa.scalar("", text))
    if isinstance(lines, pa.ChunkedArray):
        lines = lines.combine_chunks()
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[lines.offset : lines.offset + len(lines) + 1]
    with open(path, "wb") as f:
        f.write(memoryview(lines.buffers()[2])[int(offsets[0]) : int(offsets[-1])])


def _json_texts(column: pd.Series, name: str) -> pa.Array:
    """Each value of ``column`` as JSON text (``null`` where missing), as an Arrow large_string array."""
    text = pa.large_string()
    if name in CATEGORY_COLUMNS:
        words = [json.dumps(str(c)) for c in column.cat.categories] + ["null"]
        codes = column.cat.codes.to_numpy()
        return pa.array(words, text).take(pa.array(np.where(codes < 0, len(words) - 1, codes)))
    if name == "ts":
        quote = pa.scalar('"', text)
        iso = pa.array(_iso_utc(column), text)
        return pc.binary_join_element_wise(quote, iso, quote, pa.scalar("", text))
    return pc.fill_null(pc.cast(pa.array(column), text), pa.scalar("null", text))


def _iso_utc(ts: pd.Series) -> npt.NDArray[np.str_]:
    """ISO 8601 with a ``Z``, to the microsecond: ``2024-05-01T12:00:00.000000Z``."""
    values = ts.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy(dtype="datetime64[us]")
    iso: npt.NDArray[np.str_] = np.datetime_as_string(values, unit="us", timezone="UTC")
    return iso
