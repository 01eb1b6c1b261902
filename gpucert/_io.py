"""Writing tables to files without ever leaving half of one behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from .errors import InputError

__all__ = ["TABLE_SUFFIXES", "write_table"]

TABLE_SUFFIXES = (".csv", ".parquet", ".pq")


def write_table(frame: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write ``frame`` as CSV or Parquet (by suffix) through a temporary file and an atomic rename."""
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise InputError(f"{target}: write .csv or .parquet (got {suffix or 'no suffix'!r})")
    if not target.parent.exists():
        raise InputError(f"{target}: the folder {target.parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        table = pa.Table.from_pandas(frame, preserve_index=False)
        if suffix == ".csv":
            # pyarrow's writer: several times faster than DataFrame.to_csv on a fleet's verdicts.
            pa_csv.write_csv(table, tmp)
        else:
            # Statistics (each column chunk's min and max) for numbers and times only: a reader filters on
            # those, and the min and max of 100,000 texts (the reasons) cost more than the rest of the write.
            stats = [f.name for f in table.schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
                     or pa.types.is_temporal(f.type)]  # fmt: skip
            pq.write_table(table, tmp, write_statistics=stats)
        os.replace(tmp, target)
    except OSError as exc:
        raise InputError(f"{target}: cannot write ({exc.strerror or exc})") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
