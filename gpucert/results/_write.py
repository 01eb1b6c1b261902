"""Writing a canonical table so that reading it back gives it identically."""

from __future__ import annotations

import json
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from .._frames import CATEGORY_COLUMNS
from ..metrics import RESULT_COLUMNS
from ._common import PathArg
from ._read import _ARROW_TYPES

#: The Parquet schema of a results file: strings as dictionaries, every column typed even when all empty.
PARQUET_SCHEMA: Final = pa.schema([(name, _ARROW_TYPES[name]) for name in RESULT_COLUMNS])


def _write_parquet(frame: pd.DataFrame, path: PathArg) -> None:
    # Categoricals become dictionary columns, which the reader takes back as categoricals directly; the
    # explicit schema also types a column that is all empty (Arrow would write its "null" type, which
    # outside tools read badly).
    pq.write_table(pa.Table.from_pandas(frame, schema=PARQUET_SCHEMA, preserve_index=False), path)


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
