"""Shared types and constants of the results package, and the collection of problems a file has."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import Problem, ResultsError

PathArg = str | os.PathLike[str]
Bools = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.int64]
Codes = npt.NDArray[np.integer[Any]]

#: Problems built per rule; further hits are only counted, so a file wrong on every row stays fast.
_CAP: Final = 50
#: Rows listed in one message about a group of rows (a duplicated sample, a conflicting identity).
_LISTED: Final = 5
_STR: Final = pd.Index([], dtype="str").dtype
#: The results file formats, by suffix.
_FORMATS: Final = {".csv": "CSV", ".parquet": "Parquet", ".pq": "Parquet"} | dict.fromkeys(
    (".jsonl", ".ndjson", ".json", ".log"), "JSON-lines"
)


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
        """One problem per group of flagged rows, ``positions`` (ascending) grouped by ``keys``, in the order
        of their first row. ``describe`` gets a group's positions and, when given, their ``values``. The
        problem points at the first row whose value differs from the group's first, or without values at
        the second row (the first repeat)."""
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


def _extremes(column: pd.Series) -> tuple[Any, Any]:
    """(smallest, largest) value of a numeric column, missing values aside; (None, None) when there are
    none. A nullable integer column goes through Arrow: pandas' masked minimum copies the values."""
    if isinstance(column.dtype, pd.api.extensions.ExtensionDtype):
        both = pc.min_max(pa.array(column.array))
        return both["min"].as_py(), both["max"].as_py()
    values = column.to_numpy()
    if values.size == 0:
        return None, None
    return values.min(), values.max()


def _is_text(arrow_type: pa.DataType) -> bool:
    return bool(pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type))


def _narrowest(top: int) -> type[np.signedinteger[Any]]:
    """The narrowest integer type holding ``top`` (below its maximum): also the code dtype pandas gives a
    categorical of ``top`` categories (so it keeps codes made in it as they are)."""
    for dtype in (np.int8, np.int16, np.int32):
        if top < np.iinfo(dtype).max:
            return dtype
    return np.int64


def _cat_codes(column: pd.Series) -> Codes:
    """A categorical column's codes as they are stored (``.cat.codes`` would copy them)."""
    codes: Codes = cast(pd.Categorical, column.array).codes
    return codes


def _per_category(column: pd.Series, flags: Bools, *, missing: bool = False) -> Bools:
    """Spread a per-category flag to rows; ``missing`` is the flag of rows without a value."""
    return np.append(flags, missing)[_cat_codes(column)]


def _recode(column: pd.Series, mapping: Ints, categories: pd.Index) -> pd.Series:
    """Map each old category code through ``mapping`` (-1: missing) onto ``categories``."""
    codes = _cat_codes(column)
    # Appending -1 makes the missing code (-1) map to itself in the same gather; the codes keep their
    # (small) integer type, as there are never more new categories than old ones.
    new_codes = np.append(mapping, -1).astype(codes.dtype)[codes]
    categorical = pd.Categorical.from_codes(new_codes, dtype=pd.CategoricalDtype(categories))
    return pd.Series(categorical, index=column.index, name=column.name, copy=False)
