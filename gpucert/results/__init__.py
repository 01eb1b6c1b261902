"""Read, validate and write results tables: the "Results" data contract (docs/design/data-contracts.md,
where the formats and the rules are).

Every file is validated on its own and every problem found is collected: a bad file raises one
:class:`~gpucert.errors.ResultsError` naming the file and, per problem, its row (the line number of a CSV or
JSON-lines file, counting the header and skipped lines; the 1-based row of a Parquet file) and column.
Unreadable, malformed and corrupt files raise the same error, never a traceback. Several files are then
checked once more across files (duplicated samples, conflicting identities). Values are checked against
their metric's physical range for any GPU; the per-model spec ceilings are applied where baselines are built
(:func:`gpucert.baseline.build_baseline`), not here.

What comes back is canonical (:data:`gpucert._frames.RESULT_DTYPES`), categories sorted and all in use, so
the same table reads the same from any format; :func:`write_results` writes a frame so that
:func:`read_results` gives it back identically.

Speed matters: a fleet of 100,000 GPUs gives millions of rows, read inside a command with a time budget of
seconds. So no check loops over rows in Python: string rules are checked on the few categories and mapped to
rows through the codes, numbers with array operations, and Problem objects are built only for the first few
bad rows of each rule (the rest are counted).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .._background import in_background
from ..errors import Problem, ResultsError
from ..metrics import RESULT_COLUMNS
from ._columns import _validate
from ._common import _FORMATS, Ints, PathArg, _Findings, _Rows
from ._read import _one_line, _Raw, _read_file, _read_parquet, _unknown_suffix, result_record
from ._relations import _check_relations, _Codes, _tidy_categories, concat_frames
from ._write import PARQUET_SCHEMA, _write_csv, _write_jsonl, _write_parquet

__all__ = [
    "concat_frames",
    "concat_results",
    "join_parquet",
    "parse_parquet",
    "parse_results",
    "read_results",
    "result_record",
    "results_checked_alongside",
    "write_results",
]


def read_results(paths: PathArg | Sequence[PathArg]) -> pd.DataFrame:
    """Read and validate one or more results files; return one canonical frame. Raises :class:`ResultsError`
    for the first file that breaks the contract, or for problems across files (a sample in two of them)."""
    frame, check_across_rows = _read_and_check_values(paths, defer=False)
    check_across_rows()
    return frame


@contextlib.contextmanager
def results_checked_alongside(paths: PathArg | Sequence[PathArg]) -> Iterator[pd.DataFrame]:
    """:func:`read_results`, its checks across rows (duplicated samples, conflicting identities) made on a
    thread while the body works on the frame (``gpucert compare`` judges meanwhile). Every value is checked
    before the body runs; on leaving, a :class:`ResultsError` of those checks is raised, also in place of
    the body's own exception (which rows breaking the contract may have caused)."""
    frame, check_across_rows = _read_and_check_values(paths, defer=True)
    checked = in_background(check_across_rows, name="gpucert-results-check")
    try:
        yield frame
    except BaseException:
        checked()
        raise
    checked()


def _read_and_check_values(
    paths: PathArg | Sequence[PathArg], *, defer: bool
) -> tuple[pd.DataFrame, Callable[[], None]]:
    """Read the files and check every value (raising :class:`ResultsError`); return the canonical frame
    and the function that makes the checks across rows (raising it too). Unless ``defer``, each file's
    are made as it is read, so the first bad file is the one reported; a file with a problem of its own
    has them made at once either way, so that its one error lists every problem it has."""
    files = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not files:
        raise ResultsError("results", [Problem("no results files given")])
    parts: list[pd.DataFrame] = []
    numbers: list[Ints] = []
    pending: list[Callable[[], None]] = []
    for path in files:
        raw = _read_file(path)
        canonical, found = _validate_raw(raw, os.fspath(path), across_rows=False)
        check = functools.partial(_check_across_rows, canonical, found, os.fspath(path))
        if found.total or not defer:
            check()  # raises when anything was found
        else:
            pending.append(check)
        parts.append(_tidy_categories(canonical, raw.tidy))
        numbers.append(raw.rows)
    if len(parts) == 1:
        return parts[0], _each(pending)
    combined = concat_frames(parts)
    names = tuple(os.fspath(p) for p in files)
    rows = _Rows(np.concatenate(numbers), files=np.repeat(np.arange(len(parts)), [len(p) for p in parts]), names=names)
    source = ", ".join(names) if len(names) <= 3 else f"{names[0]} and {len(names) - 1} more files"
    pending.append(functools.partial(_check_across_rows, combined, _Findings(rows, len(combined)), source))
    return combined, _each(pending)


def _validate_raw(raw: _Raw, source: str, *, across_rows: bool) -> tuple[pd.DataFrame, _Findings]:
    """:func:`._columns._validate` of a file as read: the canonical frame and what was found."""
    found = _Findings(_Rows(raw.rows), len(raw.frame), raw.problems, raw.total)
    try:
        return _validate(raw.frame, found, raw.duplicated_columns, across_rows=across_rows), found
    except (TypeError, ValueError, pa.ArrowException) as exc:
        # Values of a type no rule foresaw (a list in a Parquet column, say): still no traceback.
        problem = Problem(f"cannot read the values: {_one_line(exc)}")
        raise ResultsError(source, [*found.problems, problem], total=found.total + 1) from None


def _each(checks: Sequence[Callable[[], None]]) -> Callable[[], None]:
    """One check that makes ``checks`` in order."""

    def check_all() -> None:
        for check in checks:
            check()

    return check_all


def _check_across_rows(canonical: pd.DataFrame, found: _Findings, source: str) -> None:
    """Duplicated samples and conflicting identities; raises the :class:`ResultsError` of ``found``."""
    _check_relations(_Codes.of(canonical), found)
    found.raise_for(source)


def parse_results(frame: pd.DataFrame, source: str, *, rows: npt.ArrayLike | None = None) -> pd.DataFrame:
    """Validate an in-memory results frame; return it canonical (unchanged when it already is). ``source``
    names it in the error, ``rows`` each row's number (default: the 1-based position)."""
    numbers = np.arange(1, len(frame) + 1, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    if numbers.shape != (len(frame),):
        raise ValueError(f"rows has {numbers.size} numbers for a frame of {len(frame)} rows")
    return _parse(frame, source, numbers, across_rows=True)


def _parse(frame: pd.DataFrame, source: str, numbers: Ints, *, across_rows: bool) -> pd.DataFrame:
    found = _Findings(_Rows(numbers), len(frame))
    duplicated = sorted({c for c in frame.columns[frame.columns.duplicated()] if c in RESULT_COLUMNS})
    canonical = _validate(frame, found, duplicated, across_rows=across_rows)
    found.raise_for(source)
    return canonical


def concat_results(parts: Sequence[pd.DataFrame], source: str) -> pd.DataFrame:
    """Results frames as one canonical frame: what :func:`parse_results` of their concatenation gives,
    without a text column of millions of strings on the way (a re-run joined to the 10,000 nodes of its
    first run: about a gigabyte). Each part's values are checked, then the rows across parts; a problem
    raises :class:`ResultsError` naming ``source``. An empty part adds nothing (a re-run of every node has
    no peers left); all of them empty, or none given, is "no result rows"."""
    if not parts:
        raise ResultsError(source, [Problem("no result rows")])
    numbered = [(i, part) for i, part in enumerate(parts, start=1) if len(part)] or [(1, parts[0])]
    checked = [
        _parse(part, f"{source}, part {i}", np.arange(1, len(part) + 1, dtype=np.int64), across_rows=False)
        for i, part in numbered
    ]
    combined = _tidy_categories(concat_frames(checked))
    rows = _Rows(np.arange(1, len(combined) + 1, dtype=np.int64))
    _check_across_rows(combined, _Findings(rows, len(combined)), source)
    return combined


def parse_parquet(data: bytes, source: str) -> pd.DataFrame:
    """:func:`read_results` of a Parquet table held in memory (a store object); ``source`` names it in the
    error. Strings are read as dictionaries: millions of rows never hold a Python string per cell."""
    try:
        raw = _read_parquet(pa.BufferReader(data))
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise ResultsError(source, [Problem(f"cannot parse the Parquet file: {_one_line(exc)}")]) from None
    canonical, found = _validate_raw(raw, source, across_rows=True)
    found.raise_for(source)
    return _tidy_categories(canonical, raw.tidy)


def join_parquet(parts: Iterable[bytes]) -> bytes | None:
    """Results tables held as Parquet, one after another in one Parquet file of the canonical schema (None
    when ``parts`` is empty), typed but not validated. Streamed: joining the shards of 10,000 nodes holds
    one shard's table at a time, not the fleet's frame."""
    sink = pa.BufferOutputStream()
    writer: pq.ParquetWriter | None = None
    try:
        for data in parts:
            table = pq.read_table(pa.BufferReader(data), columns=list(RESULT_COLUMNS))
            if writer is None:
                writer = pq.ParquetWriter(sink, PARQUET_SCHEMA)
            writer.write_table(table.cast(PARQUET_SCHEMA))
    finally:
        if writer is not None:
            writer.close()
    return None if writer is None else sink.getvalue().to_pybytes()


def write_results(frame: pd.DataFrame, path: PathArg) -> None:
    """Write a results frame as CSV, Parquet or JSON lines (by suffix), validated first: a file
    :func:`read_results` would refuse is never written."""
    suffix = Path(path).suffix.lower()
    kind = _FORMATS.get(suffix)
    if kind is None:
        raise ResultsError(os.fspath(path), [Problem(_unknown_suffix(suffix))])
    write = {"CSV": _write_csv, "Parquet": _write_parquet}.get(kind, _write_jsonl)
    write(parse_results(frame, f"results to write to {os.fspath(path)}"), path)
