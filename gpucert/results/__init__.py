"""Read, validate and write results tables: the "Results" data contract (docs/design/data-contracts.md).

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

A ``value`` must be a finite number, never negative, and inside its metric's physical range for any GPU
(``gpucert/data/physical_bounds.csv``, the ``*`` rows, each with its source: ``pcie_gen`` 1 to 6,
temperatures 0 to 150 °C, fractions and flags 0 to 1, performance metrics below a ceiling far above any
GPU's spec): a value outside it is a problem of its row and the column ``value``, since no instrument
produces it. Names are checked too, so that none read from a file can carry a line break, a control
character or a path into a report, a ticket or a terminal: ``node`` and ``peer`` are Kubernetes node names
(DNS subdomains), ``gpu_uuid`` at most 95 visible ASCII characters (NVML's), ``gpu_model`` at most 95
printable characters; what they may hold (``<``, quotes, ``{{ }}``) is escaped wherever it is written.
The tighter per-model spec ceilings are not applied here but when baselines are built
(:func:`gpucert.baseline.build_baseline`), where an impossible performance value is left out.

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
from ._common import _CSV, _JSONL, _PARQUET, Ints, PathArg, _Findings, _Rows
from ._read import _one_line, _read_file, _read_parquet, _unknown_suffix
from ._relations import _check_relations, _Codes, _tidy_categories, concat_frames
from ._write import PARQUET_SCHEMA, _write_csv, _write_jsonl, _write_parquet

__all__ = [
    "concat_frames",
    "concat_results",
    "join_parquet",
    "parse_parquet",
    "parse_results",
    "read_results",
    "results_checked_alongside",
    "write_results",
]

# ---------------------------------------------------------------------------------------------------------
# Public interface


def read_results(paths: PathArg | Sequence[PathArg]) -> pd.DataFrame:
    """Read and validate one or more results files; return one canonical frame.

    Raises :class:`ResultsError` for the first file that breaks the contract (with every problem of that
    file), or for problems that only show across files, such as a sample present in two of them.
    """
    frame, check_across_rows = _read_and_check_values(paths, defer=False)
    check_across_rows()
    return frame


@contextlib.contextmanager
def results_checked_alongside(paths: PathArg | Sequence[PathArg]) -> Iterator[pd.DataFrame]:
    """:func:`read_results`, its checks across rows (duplicated samples, conflicting identities) made on a
    thread while the body works on the frame: for ``gpucert compare``, whose judging is what they would
    otherwise delay.

    Every value of every row is checked before the body runs, so it never sees a value outside the
    contract; on leaving, a :class:`ResultsError` of those checks is raised, also in place of the body's
    own exception (which rows breaking the contract may have caused). Use what the body made of the frame
    only after the block ends without one.
    """
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
        found = _Findings(_Rows(raw.rows), len(raw.frame), raw.problems, raw.total)
        try:
            canonical = _validate(raw.frame, found, raw.duplicated_columns, across_rows=False)
        except (TypeError, ValueError, pa.ArrowException) as exc:
            # Values of a type no rule foresaw (a list in a Parquet column, say): still no traceback.
            problem = Problem(f"cannot read the values: {_one_line(exc)}")
            raise ResultsError(os.fspath(path), [*found.problems, problem], total=found.total + 1) from None
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
    """Validate an in-memory results frame; return it with the canonical columns and dtypes.

    ``source`` names the frame in the error; ``rows`` gives each row's number for messages (default: the
    1-based position). A frame that already is canonical comes back unchanged.
    """
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
    """Results frames as one canonical frame: each part's values checked (a canonical part, as the readers
    return it, comes through unchanged), then the joined rows checked across parts: a sample in two of
    them, or a GPU or node named differently, raises :class:`ResultsError` naming ``source``.

    What :func:`parse_results` of their concatenation gives, categories sorted as the readers sort them,
    without a text column of millions of strings on the way (a re-run joined to the 10,000 nodes of its
    first run: about a gigabyte). An empty part adds nothing (a re-run of every node has no peers left);
    all of them empty, or none given, is "no result rows"."""
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
    """Read and validate a results table held in memory as Parquet (a store object); return it canonical.

    The same checks as :func:`read_results` for a file; ``source`` names the object in the error. Strings
    are read as dictionaries, so a table of millions of rows never holds a Python string per cell."""
    try:
        raw = _read_parquet(pa.BufferReader(data))
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise ResultsError(source, [Problem(f"cannot parse the Parquet file: {_one_line(exc)}")]) from None
    found = _Findings(_Rows(raw.rows), len(raw.frame), raw.problems, raw.total)
    try:
        canonical = _validate(raw.frame, found, raw.duplicated_columns)
    except (TypeError, ValueError, pa.ArrowException) as exc:
        problem = Problem(f"cannot read the values: {_one_line(exc)}")
        raise ResultsError(source, [*found.problems, problem], total=found.total + 1) from None
    found.raise_for(source)
    return _tidy_categories(canonical, raw.tidy)


def join_parquet(parts: Iterable[bytes]) -> bytes | None:
    """Results tables held as Parquet, one after another in one Parquet file of the canonical schema (None
    when ``parts`` is empty); what each part holds is not validated, only typed.

    Streamed: one part is in memory at a time, next to the file being written, so joining the shards of
    10,000 nodes costs one shard's table, not the fleet's frame."""
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
