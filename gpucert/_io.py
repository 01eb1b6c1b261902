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

__all__ = ["TABLE_SUFFIXES", "check_out_folder", "make_out_folder", "write_table"]

TABLE_SUFFIXES = (".csv", ".parquet", ".pq")


def check_out_folder(folder: Path, what: str) -> None:
    """Return if ``folder`` is a folder that can be written, or can be made where it is named (an ``--out``
    folder is made when missing, as ``mkdir -p`` would); raise :class:`InputError` starting with ``what``
    otherwise: a path through a file, a folder that cannot be written. Writing is tried (a temporary file is
    made and removed) and nothing is created."""
    existing = folder
    while not existing.exists() and not existing.is_symlink() and existing != existing.parent:
        existing = existing.parent  # the folder mkdir would make the rest in
    if not existing.is_dir():
        made = f", so {folder} cannot be made" if existing != folder else ""
        raise InputError(f"{what}: {existing} is not a folder{made}")
    try:
        # The one sure test of a folder's permissions (root passes os.access; a read-only mount does not).
        fd, probe = tempfile.mkstemp(prefix=".gpucert-probe.", dir=existing)
    except OSError as exc:
        raise InputError(f"{what}: cannot write in the folder {existing} ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)


def make_out_folder(folder: Path, what: str, *, mode: int = 0o777) -> Path:
    """``folder``, made with its missing parents when it does not exist (``mode`` for those made, less the
    umask); raises :class:`InputError` starting with ``what`` when it cannot be."""
    try:
        folder.mkdir(mode=mode, parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{what}: cannot make the folder {folder} ({exc.strerror or exc})") from None
    return folder


def write_table(frame: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write ``frame`` as CSV or Parquet (by suffix) through a temporary file and an atomic rename."""
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise InputError(f"{target}: write .csv or .parquet (got {suffix or 'no suffix'!r})")
    make_out_folder(target.parent, str(target))  # checked by the caller first: an --out folder is made
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
            stats = [
                f.name
                for f in table.schema
                if pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_temporal(f.type)
            ]
            pq.write_table(table, tmp, write_statistics=stats)
        os.replace(tmp, target)
    except OSError as exc:
        raise InputError(f"{target}: cannot write ({exc.strerror or exc})") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
