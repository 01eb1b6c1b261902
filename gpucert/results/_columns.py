"""Column by column: each contract column parsed to its canonical dtype, every bad value a Problem."""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .._frames import CATEGORY_COLUMNS, RESULT_DTYPES
from .._names import DNS_LABEL, dns_subdomain_ok
from ..metrics import ANY_MODEL, METRICS, PERF_METRICS, RESULT_COLUMNS, bound_arrays, physical_bounds
from ._common import _STR, Bools, _cat_codes, _extremes, _Findings, _is_text, _per_category, _recode, _text_at
from ._relations import _check_relations, _Codes

Floats = npt.NDArray[np.float64]
_REQUIRED_TEXT: Final = frozenset({"run_id", "node", "gpu_model", "metric"})
_TS: Final = RESULT_DTYPES["ts"]
_NAN_TEXT: Final = frozenset({"nan", "+nan", "-nan"})
# Level of each registry metric, as a small integer so that a whole column maps through one gather.
_UNKNOWN, _GPU, _NODE, _PAIR, _GPU_OR_NODE = range(5)
_LEVEL_CODE: Final = {"gpu": _GPU, "node": _NODE, "pair": _PAIR}
_LEVEL_WORDS: Final = {_GPU: "a per-GPU", _NODE: "a node-level", _PAIR: "a pair", _GPU_OR_NODE: "an event"}
_NVML_MAX: Final = 95
#: Rows per block of a check that gathers per-row bounds: small enough to stay in cache.
_BLOCK: Final = 1 << 16
#: (level, gpu given, peer given) combinations of :func:`_check_levels`: five levels × 4.
_LEVEL_COMBOS: Final = 20
_RUN_ID_RULE: Final = (
    "is not a DNS label (at most 63 characters of a-z, 0-9 and '-', starting and ending with a letter or digit)"
)
_NODE_RULE: Final = "a node name is a DNS subdomain: lower-case a-z, 0-9, '-' and '.', at most 253 characters"


def _validate(
    frame: pd.DataFrame, found: _Findings, duplicated_columns: Sequence[str] = (), *, across_rows: bool = True
) -> pd.DataFrame:
    """Check ``frame`` against the contract, recording problems in ``found``; return the canonical frame
    (meaningful only when nothing was found). ``across_rows=False`` leaves the checks across rows
    (:func:`._relations._check_relations`) to the caller."""
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
    _check_names(out, found)
    out["value"] = _value_column(frame["value"], out["metric"], levels, found)
    _check_levels(levels, gpu_given, _cat_codes(out["peer"]) >= 0, out["metric"], found)

    canonical = pd.DataFrame({name: out[name] for name in RESULT_COLUMNS}, copy=False)
    if across_rows:
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
    codes = _cat_codes(column)
    if name in _REQUIRED_TEXT and codes.size and codes.min() < 0:
        found.each(codes < 0, name, lambda i: f"{name} is empty")
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


def _check_metrics(metric: pd.Series, found: _Findings) -> npt.NDArray[np.int8]:
    """Flag metric names outside the registry; return each row's level code (``_UNKNOWN`` if unknown)."""
    names = [str(c) for c in metric.cat.categories]
    levels = np.array([_level_code(n) for n in names] + [_UNKNOWN], dtype=np.int8)
    codes = _cat_codes(metric)
    unknown = np.array([n not in METRICS for n in names], dtype=bool)
    if unknown.any():
        messages = {int(i): _unknown_metric(names[i]) for i in np.flatnonzero(unknown)}
        found.each(_per_category(metric, unknown), "metric", lambda i: messages[int(codes[i])])
    return levels[codes]


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
    bad = np.array([DNS_LABEL.fullmatch(str(c)) is None for c in categories], dtype=bool)
    if bad.any():
        found.each(_per_category(run_id, bad), "run_id", lambda i: f"run_id {_text_at(run_id, i)!r} {_RUN_ID_RULE}")


#: The GPU UUID rule as one pattern: 1 to 95 characters, each visible ASCII (``!`` to ``~``: printable, no
#: space, no control character).
_UUID_PATTERN: Final = f"^[!-~]{{1,{_NVML_MAX}}}$"


def _bad_uuids(categories: pd.Index) -> Bools:
    """Which categories break the GPU UUID rule: one regular expression over them all, in Arrow."""
    text = pa.array(categories, type=pa.large_string(), from_pandas=True)
    ok = pc.fill_null(pc.match_substring_regex(text, _UUID_PATTERN), False)
    return ~np.asarray(ok.to_numpy(zero_copy_only=False), dtype=bool)


def _bad_where(ok: Callable[[str], bool]) -> Callable[[pd.Index], Bools]:
    """Which categories ``ok`` refuses, category by category."""
    return lambda categories: np.array([not ok(str(c)) for c in categories.tolist()], dtype=bool)


#: What an identity must look like, per column: which categories break the rule, and the rule in words. A
#: node (and a pair's peer) is a Kubernetes node name; a GPU UUID is NVML's (``GPU-…``, ``MIG-…``: NVML's
#: buffer of 96 bytes holds at most 95); a model is NVML's device name. So no name read from a file can
#: carry a line break, a control character or a path into a report, a ticket or a terminal, and what is
#: allowed (``<``, quotes, ``{{ }}``) is escaped where it is written.
_NAME_RULES: Final[dict[str, tuple[Callable[[pd.Index], Bools], str]]] = {
    "node": (_bad_where(dns_subdomain_ok), _NODE_RULE),
    "peer": (_bad_where(dns_subdomain_ok), _NODE_RULE),
    "gpu_uuid": (
        _bad_uuids,
        f"a GPU UUID is at most {_NVML_MAX} visible ASCII characters (no space or control character)",
    ),
    "gpu_model": (
        _bad_where(lambda v: 0 < len(v) <= _NVML_MAX and v.isprintable()),
        f"a GPU model is at most {_NVML_MAX} printable characters (no line break or control character)",
    ),
}


def _check_names(out: dict[str, pd.Series], found: _Findings) -> None:
    """Flag the node, peer, GPU UUID and model values that break their rule (:data:`_NAME_RULES`); checked
    on the few categories, not the rows."""
    for name, (bad_of, rule) in _NAME_RULES.items():
        column = out[name]
        bad = bad_of(column.cat.categories)
        if bad.any():
            found.each(_per_category(column, bad), name, functools.partial(_name_problem, column, name, rule))


def _name_problem(column: pd.Series, name: str, rule: str, i: int) -> str:
    return f"{name} {_shown(_text_at(column, i))} is not valid: {rule}"


def _shown(text: str, limit: int = 80) -> str:
    """``text`` quoted with its control characters escaped (``repr``), cut at ``limit`` characters."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"… ({len(text)} characters)"


# Numbers ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Numbers:
    """A column read as numbers: NaN where a value is missing or is not a number."""

    values: Floats
    missing: Bools
    garbage: Bools


def _parse_numbers(raw: pd.Series, *, nan_is_missing: bool) -> _Numbers:
    """Read any column as float64, telling apart missing values, text that is no number, and numbers.
    ``nan_is_missing``: whether a NaN of a numeric column is "no value" (``gpu``) or a NaN measured (``value``)."""
    n = len(raw)
    dtype = raw.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        # Parse the few categories, then gather: a categorical of numbers is parsed once per distinct value.
        parsed = _parse_numbers(pd.Series(dtype.categories), nan_is_missing=nan_is_missing)
        codes = _cat_codes(raw)
        return _Numbers(
            np.append(parsed.values, np.nan)[codes],
            np.append(parsed.missing, True)[codes],
            np.append(parsed.garbage, False)[codes],
        )
    if pd.api.types.is_bool_dtype(dtype) or not (
        pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_string_dtype(dtype)
    ):
        # A timestamp, a duration (or a period, an interval): typed as something else than a number.
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
    """Cast a text column with Arrow (fast): the cast array and the mask of missing values (empty strings
    are); ``None`` when some value does not cast cleanly."""
    if raw.dtype == object:
        return None  # mixed Python objects: only the exact path knows what to make of them
    try:
        text = pa.array(raw)
        if not _is_text(text.type):
            return None
        empty = pc.equal(text, pa.scalar("", text.type))
        cast = pc.cast(pc.if_else(empty, pa.scalar(None, text.type), text), to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    return cast, np.asarray(cast.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def _integer_column(raw: pd.Series, name: str, found: _Findings, *, nullable: bool) -> tuple[pd.Series, Bools]:
    """An integer ≥ 0 column (``Int64`` when ``nullable``, else ``int64`` and required), and where a value
    was given, even a bad one (the level checks ask whether ``gpu`` is set)."""
    dtype = raw.dtype
    if dtype == RESULT_DTYPES[name]:
        # The usual case (Parquet, a generated frame): only a negative value or, for ``repeat``, a missing
        # one could be wrong, and the minimum tells whether any is; no row-sized copy.
        given = raw.notna().to_numpy(dtype=bool)
        lowest, _ = _extremes(raw)
        if (nullable or given.all()) and (lowest is None or lowest >= 0):
            return raw, given
    too_large = np.zeros(len(raw), dtype=bool)
    if pd.api.types.is_integer_dtype(dtype) and not isinstance(dtype, pd.CategoricalDtype):
        # The usual case (Parquet, a generated frame): no float round trip, no text.
        missing = raw.isna().to_numpy(dtype=bool)
        if pd.api.types.is_unsigned_integer_dtype(dtype):
            # A uint64 beyond int64 would wrap to a negative number in the cast: flag it first.
            wide = raw.to_numpy(dtype=np.uint64, na_value=0)
            too_large = wide > np.uint64(np.iinfo(np.int64).max)
            values = np.where(too_large, np.uint64(0), wide).astype(np.int64)
        else:
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
    negative = ~missing & ~not_integer & ~too_large & (values < 0)
    if not nullable:
        found.each(missing, name, lambda i: f"{name} is empty")
    found.each(not_integer, name, lambda i: f"{name} {_text_at(raw, i)!r} is not an integer")
    found.each(too_large, name, lambda i: f"{name} {_text_at(raw, i)!r} is too large for a 64-bit integer")
    found.each(negative, name, lambda i: f"{name} {_text_at(raw, i)!r} is negative")
    given = ~missing
    if dtype == RESULT_DTYPES[name]:
        return raw, given
    unusable = missing | not_integer | too_large | negative
    if unusable.any():
        values = np.where(unusable, 0, values)
    column = pd.arrays.IntegerArray(values, unusable) if nullable else values
    return pd.Series(column, index=raw.index, name=name, copy=False), given


def _value_column(raw: pd.Series, metric: pd.Series, levels: npt.NDArray[np.int8], found: _Findings) -> pd.Series:
    if raw.dtype == np.float64:
        values = raw.to_numpy()
        lowest, highest = (values.min(), values.max()) if values.size else (0.0, 0.0)
        if np.isfinite(lowest) and np.isfinite(highest) and lowest >= 0:
            # The usual case: every value a finite number ≥ 0 (a NaN or an infinity would be an extreme),
            # so only the physical ranges are left to check.
            _check_physical(values, None, raw, metric, found)
            return raw
    parsed = _parse_numbers(raw, nan_is_missing=False)
    values = parsed.values
    found.each(parsed.missing, "value", lambda i: "value is empty")
    found.each(parsed.garbage, "value", lambda i: f"value {_text_at(raw, i)!r} is not a number")
    not_finite = ~parsed.missing & ~parsed.garbage & ~np.isfinite(values)
    found.each(not_finite, "value", lambda i: f"value {_text_at(raw, i)!r} is not a finite number")
    with np.errstate(invalid="ignore"):
        negative = values < 0
    if negative.any():
        perf = np.array([str(c) in PERF_METRICS for c in metric.cat.categories], dtype=bool)
        row_perf = _per_category(metric, perf)

        def describe(i: int) -> str:
            text, name = _text_at(raw, i), _text_at(metric, i)
            if row_perf[i]:
                return f"negative bandwidth/throughput {text!r} for {name!r}"
            return f"negative value {text!r}: {name!r} is never negative"

        found.each(negative & (levels != _UNKNOWN), "value", describe)
    _check_physical(values, ~parsed.missing & ~parsed.garbage & ~not_finite & ~negative, raw, metric, found)
    if raw.dtype == np.float64:
        return raw
    return pd.Series(values, index=raw.index, name="value", copy=False)


def _check_physical(values: Floats, judged: Bools | None, raw: pd.Series, metric: pd.Series, found: _Findings) -> None:
    """Flag the values no GPU can measure: outside their metric's bounds for any GPU (``ANY_MODEL`` in
    ``gpucert/data/physical_bounds.csv``). Only ``judged`` rows (a finite value ≥ 0; ``None``: all) are
    looked at: the others have a problem of their own already."""
    names = [str(c) for c in metric.cat.categories]
    low, high = bound_arrays([], names, per_model=False)
    # One row of bounds (any GPU), one column per category, and unbounded for a missing metric (-1).
    row_low = np.append(low[0], -np.inf)
    row_high = np.append(high[0], np.inf)
    codes = _cat_codes(metric)
    outside: Bools | None = None
    # Block by block, so the gathered bounds stay small and in cache instead of two arrays of a fleet's
    # rows each.
    for start in range(0, len(values), _BLOCK):
        stop = start + _BLOCK
        block_codes = codes[start:stop]
        block_values = values[start:stop]
        with np.errstate(invalid="ignore"):
            bad = (block_values < row_low[block_codes]) | (block_values > row_high[block_codes])
        if judged is not None:
            bad &= judged[start:stop]
        if bad.any():
            if outside is None:
                outside = np.zeros(len(values), dtype=bool)
            outside[start:stop] = bad
    if outside is None:
        return
    bounds = physical_bounds()

    def describe(i: int) -> str:
        name = _text_at(metric, i)
        entry = METRICS[name]
        bound = bounds[(ANY_MODEL, name)]
        return (
            f"value {_text_at(raw, i)!r} is outside the physical range of {name!r} for any GPU, "
            f"{bound.low:g} to {bound.high:g} {entry.unit} ({bound.source})"
        )

    found.each(outside, "value", describe)


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
    elif isinstance(dtype, pd.CategoricalDtype) or pd.api.types.is_string_dtype(dtype):
        ts, garbage = _parse_ts_text(raw)
    else:
        # An epoch number is ambiguous (seconds? nanoseconds?): the contract asks for ISO 8601. A duration
        # (or any other typed column: a period, an interval) is no point in time either.
        ts = pd.Series(pd.NaT, index=raw.index, dtype=_TS)
        garbage = raw.notna().to_numpy(dtype=bool)
    utc: pd.Series = ts if ts.dtype == _TS else ts.dt.as_unit("us")
    missing = utc.isna().to_numpy(dtype=bool) & ~garbage
    found.each(missing, "ts", lambda i: "ts is empty")
    found.each(
        garbage, "ts", lambda i: f"ts {_text_at(raw, i)!r} is not a timestamp (ISO 8601, e.g. 2024-05-01T12:00:00Z)"
    )
    return utc if utc.name == "ts" else utc.rename("ts")


def _parse_ts_text(raw: pd.Series) -> tuple[pd.Series, Bools]:
    """Parse ISO 8601 text to UTC; also returns the mask of values that are not timestamps."""
    if isinstance(raw.dtype, pd.CategoricalDtype):
        parsed, garbage = _parse_ts_text(pd.Series(raw.cat.categories, dtype=object))
        codes = _cat_codes(raw)
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
    """Each metric's level fixes which of ``gpu`` and ``peer`` a row fills (docs/reference/metrics.md)."""

    def words(i: int) -> str:
        return f"{_text_at(metric, i)!r} is {_LEVEL_WORDS[int(levels[i])]} metric"

    # Each rule is a set of (level, gpu given, peer given) combinations: which combinations occur is one
    # pass over the rows, and a rule that none of them breaks costs nothing more.
    combo = levels.astype(np.int8) * 4
    combo += np.asarray(gpu_given, dtype=bool).view(np.int8) * 2
    combo += np.asarray(peer_given, dtype=bool).view(np.int8)
    # Counted block by block: np.bincount widens its input to intp, a copy as long as the rows.
    present = np.zeros(_LEVEL_COMBOS, dtype=bool)
    for start in range(0, len(combo), _BLOCK):
        present |= np.bincount(combo[start : start + _BLOCK], minlength=_LEVEL_COMBOS) > 0
    combos = np.arange(_LEVEL_COMBOS)
    level, gpu, peer = combos // 4, combos // 2 % 2 == 1, combos % 2 == 1
    rules = (
        ((level == _GPU) & ~gpu, "gpu", lambda i: f"{words(i)}: gpu must be set"),
        (((level == _NODE) | (level == _PAIR)) & gpu, "gpu", lambda i: f"{words(i)}: gpu must be empty"),
        ((level == _PAIR) & ~peer, "peer", lambda i: f"{words(i)}: peer must name the other node"),
        (
            (level != _PAIR) & (level != _UNKNOWN) & peer,
            "peer",
            lambda i: f"{words(i)}: peer is only for pair metrics and must be empty",
        ),
    )
    for broken, column, describe in rules:
        if (broken & present).any():
            found.each(broken[combo], column, describe)
