"""The file formats: CSV, Parquet and JSON lines (a Pod log with other lines mixed in) into raw frames."""

from __future__ import annotations

import codecs
import csv
import io
import json
import os
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

from .._background import on_two_threads
from .._frames import CATEGORY_COLUMNS
from .._prefetch import reading_pool, take
from ..errors import Problem, ResultsError
from ..metrics import RESULT_COLUMNS
from ._common import _CAP, _FORMATS, _STR, Bools, Ints, PathArg, _is_text, _narrowest, _per_category


@dataclass
class _Raw:
    """A file as read, before validation: the frame, each row's number, and problems of the reading."""

    frame: pd.DataFrame
    rows: Ints
    problems: list[Problem] = field(default_factory=list)
    total: int = 0
    duplicated_columns: list[str] = field(default_factory=list)
    #: Category columns already canonical (categories sorted, each in use), by the dtype they were made
    #: with: a column that still has that very dtype after validation needs no tidying pass over its codes.
    tidy: dict[str, Any] = field(default_factory=dict)


def _read_file(path: PathArg) -> _Raw:
    source = os.fspath(path)
    suffix = Path(path).suffix.lower()
    kind = _FORMATS.get(suffix)
    if kind is None:
        raise ResultsError(source, [Problem(_unknown_suffix(suffix))])
    try:
        if not Path(path).is_file():
            os.stat(path)  # raises the precise OSError (no such file, permission denied)
            raise IsADirectoryError(21, "not a regular file")
        with reading_pool():
            return {"CSV": _read_csv, "Parquet": _read_parquet}.get(kind, _read_jsonl)(path)
    except OSError as exc:
        raise ResultsError(source, [Problem(f"cannot read the file: {exc.strerror or exc}")]) from None
    except (pa.ArrowException, ValueError, UnicodeDecodeError, csv.Error) as exc:
        raise ResultsError(source, [Problem(f"cannot parse the {kind} file: {_one_line(exc)}")]) from None


def _unknown_suffix(suffix: str) -> str:
    return (
        f"unknown file type {suffix or '(no suffix)'!r}: results are .csv, .parquet (.pq) or JSON lines "
        "(.jsonl, .ndjson, .json, .log)"
    )


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "…"


_INT64_MAX: Final = int(np.iinfo(np.int64).max)
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
    total = 0
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
    frame, rows = _drop_blank_lines(_arrow_to_frame(table)[0], rows)
    return _Raw(frame, rows, problems, total, duplicated)


def _csv_table(path: PathArg, wanted: list[str], *, threads: bool) -> tuple[pa.Table, list[tuple[int, int, int]]]:
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
            include_columns=wanted, column_types=types, strings_can_be_null=False, quoted_strings_can_be_null=False
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


def _read_parquet(path: PathArg | pa.NativeFile) -> _Raw:
    """A Parquet file (a path, or an Arrow buffer holding one: a store object) as a raw frame."""
    schema = pq.read_schema(path)
    names: list[str] = list(schema.names)
    wanted = [c for c in RESULT_COLUMNS if c in names]
    text = [c for c in wanted if c in CATEGORY_COLUMNS and _is_text(schema.field(c).type)]
    in_memory = isinstance(path, pa.NativeFile)
    ahead = take(path) if not in_memory and not text and len(set(names)) == len(names) else None
    # The table read ahead (gpucert._prefetch) holds every column the file has; the reader's own read
    # takes the contract's.
    table = ahead.select(wanted) if ahead is not None else pq.read_table(path, columns=wanted, read_dictionary=text)
    frame, tidy = _arrow_to_frame(table)
    return _Raw(
        frame,
        np.arange(1, len(frame) + 1, dtype=np.int64),
        duplicated_columns=[c for c in wanted if names.count(c) > 1],
        tidy=tidy,
    )


def _arrow_to_frame(table: pa.Table) -> tuple[pd.DataFrame, dict[str, Any]]:
    """An Arrow table as pandas, strings of the category columns as categoricals, ``gpu`` as ``Int64``; and
    the category columns it made canonical (:attr:`_Raw.tidy`). A dictionary column of strings (what
    Parquet, the CSV reader and the JSON-lines path give) becomes a categorical straight from its codes,
    its categories sorted and all in use (so no later pass recodes it); anything else goes through Arrow."""
    for name in table.column_names:
        if pa.types.is_null(table.schema.field(name).type) and name in _ARROW_TYPES:
            # An all-empty column written without a type (no pair metric, no peer): typing it here spares a
            # column of Python ``None`` objects.
            i = table.schema.get_field_index(name)
            table = table.set_column(i, name, table.column(name).cast(_ARROW_TYPES[name]))
    names = list(table.column_names)
    encoded: list[str] = []
    for name in CATEGORY_COLUMNS:
        if name in names:
            column = table.column(name)
            if _is_text(column.type):
                column = pa.chunked_array([column.combine_chunks().dictionary_encode()])
                table = table.set_column(table.schema.get_field_index(name), name, column)
            if pa.types.is_dictionary(column.type):
                encoded.append(name)

    columns: dict[str, object] = {}

    def convert(name: str) -> None:
        if name == "gpu":
            columns[name] = _nullable_integers(table.column(name))
        elif (categorical := _dictionary_categorical(table.column(name))) is not None:
            columns[name] = categorical

    # Every other column on a second thread: its passes over millions of codes leave the interpreter free.
    integers = ["gpu"] if "gpu" in names and pa.types.is_integer(table.schema.field("gpu").type) else []
    on_two_threads(convert, [*encoded, *integers])
    rest = table.drop_columns(list(columns))
    # The pandas metadata is ignored on purpose: this module sets every dtype itself, faster.
    converted = rest.to_pandas(ignore_metadata=True, split_blocks=True, self_destruct=True)
    index = pd.RangeIndex(table.num_rows)
    # copy=False throughout: pandas would otherwise copy every array it is given (copy on write).
    series = {
        name: converted[name] if name not in columns else pd.Series(columns[name], index=index, name=name, copy=False)
        for name in names
    }
    tidy = {name: series[name].dtype for name in CATEGORY_COLUMNS if name in columns}
    return pd.DataFrame(series, index=index, copy=False), tidy


def _nullable_integers(column: pa.ChunkedArray) -> pd.arrays.IntegerArray:
    """An integer column as ``Int64`` (Arrow would make a column with nulls float64), chunk by chunk into
    the final arrays. An unsigned value beyond int64 would wrap to a negative one: such a column stays
    ``UInt64`` for the validation to call the value too large, as written."""
    top = pc.max(column).as_py() if pa.types.is_uint64(column.type) else None
    values = np.empty(len(column), dtype=np.uint64 if top is not None and top > _INT64_MAX else np.int64)
    missing = np.zeros(len(column), dtype=bool)
    start = 0
    for chunk in column.chunks:
        stop = start + len(chunk)
        filled = chunk
        if chunk.null_count:
            missing[start:stop] = chunk.is_null().to_numpy(zero_copy_only=False)
            filled = pc.fill_null(chunk, 0)
        values[start:stop] = filled.to_numpy()
        start = stop
    return pd.arrays.IntegerArray(values, missing)


def _dictionary_categorical(column: pa.ChunkedArray) -> pd.Categorical[Any] | None:
    """A dictionary column of strings as a categorical of the values in use, sorted, from its codes;
    ``None`` (Arrow's own conversion) for other values or a dictionary that repeats one."""
    value_type = column.type.value_type
    if not _is_text(value_type) or column.num_chunks == 0:
        return None
    first = column.chunk(0).dictionary
    if not all(c.dictionary is first or c.dictionary.equals(first) for c in column.chunks[1:]):
        column = column.unify_dictionaries()
        first = column.chunk(0).dictionary
    parts: list[npt.NDArray[np.integer[Any]] | None] = []
    size = len(first)
    used = np.zeros(size, dtype=bool)
    for chunk in column.chunks:
        indices = chunk.indices
        if indices.null_count == len(indices):
            parts.append(None)  # all missing (a column of no peers): nothing to look up
            continue
        if pa.types.is_unsigned_integer(indices.type):
            return None
        missing = int(indices.null_count > 0)
        if missing:
            indices = pc.fill_null(indices, pa.scalar(-1, indices.type))
        codes = indices.to_numpy()  # a view of Arrow's buffer when there were no nulls
        # One counting pass checks that every index is in the dictionary and marks the values in use; where
        # some are missing (-1) the codes count one up, and the first count, theirs, is set aside.
        try:
            counts = np.bincount(np.add(codes, 1, dtype=np.intp) if missing else codes, minlength=size + missing)
        except ValueError:  # an index below the dictionary's
            return None
        if len(counts) > size + missing:
            return None  # an index beyond its dictionary: Arrow's conversion says what is wrong
        used |= counts[missing:] > 0
        parts.append(codes)
    used &= np.asarray(first.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    kept = np.flatnonzero(used)
    values = first.take(pa.array(kept, type=pa.int64()))
    if len(values) < 2 or pc.all(pc.less(values[:-1], values[1:])).as_py():
        order = np.arange(len(values), dtype=np.int64)  # sorted, no value twice: one pass, no sort
    else:
        order = np.asarray(pc.array_sort_indices(values).to_numpy(), dtype=np.int64)
        values = values.take(pa.array(order, type=pa.int64()))
        if pc.any(pc.equal(values[1:], values[:-1])).as_py():
            return None
    categories = pd.Index(values.to_pandas(), dtype=_STR)
    mapping: npt.NDArray[np.integer[Any]] = np.full(size + 1, -1, dtype=_narrowest(len(categories)))
    mapping[kept[order]] = np.arange(len(kept))
    # One gather per chunk straight into the final codes: no concatenated copy of Arrow's indices.
    out = np.empty(len(column), dtype=mapping.dtype)
    start = 0
    # A dictionary already sorted and all in use (what gpucert writes) needs no lookup, only a narrowing.
    identity = bool(np.array_equal(mapping[:size], np.arange(size)))
    for chunk, codes in zip(column.chunks, parts, strict=True):
        stop = start + len(chunk)
        if codes is None:
            out[start:stop] = -1
        elif identity:
            out[start:stop] = codes
        else:
            np.take(mapping, codes, out=out[start:stop])
        start = stop
    return pd.Categorical.from_codes(out, dtype=pd.CategoricalDtype(categories, ordered=False), validate=False)


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
            raw.problems.append(Problem("no result rows: a JSON array; results are JSON lines, one object a line"))
            raw.total = 1
        return raw
    # A Pod log loses its other lines first (blank lines Arrow skips by itself).
    payload = data if all_objects else b"\n".join(data[starts[i] : ends[i]] for i in objects)
    fast = _jsonl_fast(payload, objects + 1)
    return fast if fast is not None else _jsonl_slow(data, starts, ends, objects)


def _count_object_lines(data: bytes) -> int | None:
    """The number of lines if every line starts with ``{`` (no blank or other line), else ``None``: two
    byte counts in C instead of classifying every line (a raw newline cannot occur inside JSON)."""
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    objects = data.count(b"\n{") + data.startswith(b"{")
    return lines if data and objects == lines else None


def _object_lines(data: bytes) -> tuple[Ints, Ints, Ints, bool]:
    """Line bounds, the lines holding a JSON object, and whether every non-blank line does. Vectorised
    over the bytes; only lines that start with a blank are looked at one by one."""
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


#: The JSON-lines schema: the Parquet types, with plain strings (and timestamps read as text).
_JSON_TYPES: Final = {c: pa.string() if c in CATEGORY_COLUMNS or c == "ts" else _ARROW_TYPES[c] for c in RESULT_COLUMNS}


def _jsonl_fast(payload: bytes, rows: Ints) -> _Raw | None:
    """Parse ``payload`` (object lines, maybe blank ones; ``rows``: each object's line number) with Arrow
    when every object line is clean; ``None`` sends the file to the exact parser."""
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
    return _Raw(_arrow_to_frame(table)[0], rows)


def _jsonl_slow(data: bytes, starts: Ints, ends: Ints, objects: Ints) -> _Raw:
    """Parse line by line with :mod:`json`, naming each bad line; values are kept as written."""
    records: list[dict[str, object]] = []
    rows: list[int] = []
    problems: list[Problem] = []
    total = 0
    for i in objects:
        line_no = int(i) + 1
        try:
            record = result_record(json.loads(data[starts[i] : ends[i]]))
            if record is None:
                continue
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            total += 1
            if len(problems) < _CAP:
                problems.append(Problem(f"not valid JSON: {_json_error(exc)}", row=line_no))
            continue
        records.append(record)
        rows.append(line_no)
    present = [c for c in RESULT_COLUMNS if any(c in r for r in records)]
    columns = {c: pd.Series([r.get(c) for r in records], dtype=object) for c in present}
    frame = pd.DataFrame(columns, index=pd.RangeIndex(len(rows)))
    return _Raw(frame, np.asarray(rows, dtype=np.int64), problems, total)


def result_record(obj: object) -> dict[str, object] | None:
    """The result columns of one parsed JSON line (a JSON-lines file's, or a benchmark pod log's), or None
    for a line that is no result row. Numbers and strings stay as they are; anything else becomes its JSON
    text, so that no check mistakes its type."""
    if not isinstance(obj, dict) or not any(c in obj for c in RESULT_COLUMNS):
        return None
    return {c: _json_value(obj[c]) for c in RESULT_COLUMNS if c in obj}


def _json_value(value: object) -> object:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        return json.dumps(value)
    return value


def _json_error(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} (column {exc.colno})"
    if isinstance(exc, RecursionError):
        # Too deep for json.loads, or for json.dumps keeping a nested value as its text.
        return "nested too deeply"
    return _one_line(exc)
