"""Across rows: duplicated samples and conflicting identities, checked on integer codes, and
the concatenation of several files into one canonical table."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np
import pandas as pd

from .._frames import CATEGORY_COLUMNS
from ..metrics import EVENT_METRICS, RESULT_COLUMNS
from ._common import (
    _LISTED,
    _STR,
    Bools,
    Codes,
    Ints,
    _cat_codes,
    _extremes,
    _Findings,
    _narrowest,
    _per_category,
    _recode,
    _Rows,
    _text_at,
)

UNKNOWN_MODEL = "unknown"


@dataclass(frozen=True)
class _Codes:
    """A canonical frame as integer arrays (category codes as they are, -1 where missing): what the
    checks across rows compare. ``pos`` maps a subset's rows back to the frame's positions."""

    frame: pd.DataFrame
    run: Codes
    node: Codes
    gpu: Codes
    uuid: Codes
    model: Codes
    #: The code of ``gpu_model`` ``unknown`` (what the payload writes where NVML cannot tell: no driver
    #: loaded), -2 when no row has it: such a row says nothing about the node's model.
    unknown_model: int
    metric: Codes
    repeat: Ints
    peer: Codes
    event: Bools
    pos: Ints | None = None

    @classmethod
    def of(cls, frame: pd.DataFrame) -> _Codes:
        def codes(name: str) -> Codes:
            return _cat_codes(frame[name])

        metric = frame["metric"]
        is_event = np.array([str(c) in EVENT_METRICS for c in metric.cat.categories], dtype=bool)
        return cls(
            frame=frame,
            run=codes("run_id"),
            node=codes("node"),
            gpu=_gpu_indices(frame["gpu"]),
            uuid=codes("gpu_uuid"),
            model=codes("gpu_model"),
            unknown_model=_code_of(frame["gpu_model"], UNKNOWN_MODEL),
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
        per_row = {name: getattr(self, name)[idx] for name in _PER_ROW}
        return replace(self, **per_row, pos=idx if self.pos is None else self.pos[idx])

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


#: The fields of :class:`_Codes` with one entry per row.
_PER_ROW: Final = ("run", "node", "gpu", "uuid", "model", "metric", "repeat", "peer", "event")


def _gpu_indices(column: pd.Series) -> Codes:
    """The GPU indices, -1 where empty, in the narrowest integer type that holds them (a fleet's rows are
    millions: a quarter of the memory of int64 to touch)."""
    _, top = _extremes(column)
    return column.to_numpy(dtype=_narrowest(-1 if top is None else int(top)), na_value=-1)


def _check_relations(codes: _Codes, found: _Findings) -> None:
    """Duplicated samples and conflicting identities, among the rows without a problem of their own."""
    rows = codes.take(~found.bad)
    _check_duplicates(codes, rows, found)
    _check_identities(codes, rows, found)


def _check_duplicates(codes: _Codes, rows: _Codes, found: _Findings) -> None:
    """A sample is (run_id, node, gpu, metric, repeat, peer); events (XIDs, errors) may repeat. A key holds
    one metric, so its rows are all events or none: dropping event rows afterwards is exact."""
    key, span = _group_ids(
        [(rows.run, 0), (rows.node, 0), (rows.gpu, 1), (rows.metric, 0), (rows.repeat, 0), (rows.peer, 1)]
    )
    repeated = _repeated(key, span, rows.event)
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
    """Within a run, one GPU (node, index) has one UUID, one UUID is one GPU, one node one GPU model. Rows
    without a GPU index or without a UUID (node-level rows) say nothing about the first two."""
    stretches = _stretches(rows)
    if stretches is not None and all(c is None for c in _identity_conflicts(stretches)):
        return  # the usual case, known from a fraction of the rows
    gpu_key, uuid_key, node_key = _identity_keys(rows)
    uuid_conflicts, gpu_conflicts, model_conflicts = _identity_conflicts(rows, (gpu_key, uuid_key, node_key))

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

    _report(found, rows, uuid_conflicts, keys=gpu_key[0], column="gpu_uuid", describe=several_uuids, values=rows.uuid)
    _report(found, rows, gpu_conflicts, keys=uuid_key[0], column="gpu_uuid", describe=several_gpus, values=gpu_key[0])
    _report(
        found, rows, model_conflicts, keys=node_key[0], column="gpu_model", describe=several_models, values=rows.model
    )


_Keyed = tuple[Codes, int]


def _identity_keys(rows: _Codes) -> tuple[_Keyed, _Keyed, _Keyed]:
    """Group ids (and spans) of a GPU (run, node, index), a UUID (run, uuid) and a node (run, node)."""
    return (
        _group_ids([(rows.run, 0), (rows.node, 0), (rows.gpu, 1)]),
        _group_ids([(rows.run, 0), (rows.uuid, 1)]),
        _group_ids([(rows.run, 0), (rows.node, 0)]),
    )


def _code_of(column: pd.Series, value: str) -> int:
    """The category code of ``value`` in a categorical column, -2 when it is no category (no code is -2)."""
    found = np.flatnonzero(column.cat.categories == value)
    return int(found[0]) if found.size else -2


def _identity_conflicts(
    rows: _Codes, keys: tuple[_Keyed, _Keyed, _Keyed] | None = None
) -> tuple[Bools | None, Bools | None, Bools | None]:
    """The rows of GPUs with several UUIDs, of UUIDs on several GPUs, of nodes with several models."""
    (gpu_key, gpu_span), (uuid_key, uuid_span), (node_key, node_span) = keys or _identity_keys(rows)
    has_gpu = (rows.gpu >= 0) & (rows.uuid >= 0)
    # A node's rows from before its driver loaded (model "unknown") and after it did are one node, not two
    # models: a driver pod restarting between a node's benchmark and its pair benchmark is no bad input.
    known_model = rows.model != rows.unknown_model if rows.unknown_model >= 0 else None
    return (
        _conflicting(gpu_key, rows.uuid, gpu_span, has_gpu),
        _conflicting(uuid_key, gpu_key, uuid_span, has_gpu),
        _conflicting(node_key, rows.model, node_span, known_model),
    )


def _stretches(rows: _Codes) -> _Codes | None:
    """One row per stretch of consecutive rows alike in every column the identity checks read, or
    ``None`` when that would not spare much. A file lists a GPU's samples together, so a fleet's millions
    of rows are a few hundred thousand stretches; the checks find a conflict among these exactly when
    there is one among all rows (the rows of a stretch agree in everything they compare)."""
    n = rows.run.size
    if n < 1024:
        return None
    change = np.empty(n, dtype=bool)
    change[0] = True
    np.not_equal(rows.run[1:], rows.run[:-1], out=change[1:])
    for part in (rows.node, rows.gpu, rows.uuid, rows.model):
        change[1:] |= part[1:] != part[:-1]
    if np.count_nonzero(change) > n // 4:
        return None
    return rows.take(change)


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

    Mixed radix, in int32 when the ids fit (less memory to touch). Ids stay below the returned span, which
    is kept small enough for the checks to index a table by id: the digits are taken smallest first, and
    before one would take the span past that size the combinations in use so far are renumbered densely
    (a table lookup), so a sparse key (nodes × GPUs × metrics × repeats) needs no hash. A digit still too
    wide is appended by hashing only the rows where it is not 0 (a peer, which most rows lack).
    """
    n = parts[0][0].size
    digits = [(part, offset, int(part.max(initial=-offset)) + offset + 1) for part, offset in parts]
    # A part with one value only (a single run, no peers) tells no rows apart.
    digits = sorted((d for d in digits if d[2] > 1), key=lambda d: d[2])
    # A table indexed by id costs 4 to 8 bytes an entry: a few entries per row, or 4M, is cheap; a wider key
    # goes through a hash factorization instead.
    limit = 4 * n + (1 << 22)
    small = limit + len(digits) * n < 2**31  # every span met below stays under limit + n per digit
    key: Codes = np.zeros(n, dtype=np.int32 if small else np.int64)
    span = 1
    for part, offset, radix in digits:
        if span * radix > limit and span > 1:
            key, span = _renumber(key, span)
        if span * radix > limit:
            key, span = _sparse_digit(key, span, part, offset, radix)
            continue
        key *= radix
        np.add(key, part, out=key, casting="unsafe")  # bounded by the radix, so never truncated
        if offset:
            key += offset
        span *= radix
    return key, span


def _renumber(key: Codes, span: int) -> tuple[Codes, int]:
    """The ids in use (all below ``span``) renumbered 0, 1, … in their order: a lookup, no hash."""
    used = np.zeros(span, dtype=bool)
    used[key] = True
    ids = np.cumsum(used, dtype=key.dtype)
    ids -= 1
    return ids[key], int(ids[-1]) + 1


def _sparse_digit(key: Codes, span: int, part: Codes, offset: int, radix: int) -> tuple[Codes, int]:
    """``key`` with one more digit too wide for a table: a row whose digit is 0 keeps its id, the others
    get new ids from ``span`` on, from a hash of those rows alone."""
    digit = part.astype(np.int64) + offset
    rows = np.flatnonzero(digit)
    codes, uniques = pd.factorize(key[rows].astype(np.int64) * radix + digit[rows])
    out = key.copy()
    out[rows] = codes + span
    return out, span + len(uniques)


def _repeated(key: Codes, span: int, events: Bools | None = None) -> Bools | None:
    """Rows whose key occurs more than once; ``None`` when none does, or when only keys of ``events``
    (whose rows may repeat; a key holds only events or none) do.

    No sort, no hash: every row writes its position to its key's slot and one write per key survives, so
    a key is repeated exactly when some row finds another row's position in its slot.
    """
    n = key.size
    seen = np.zeros(span, dtype=bool)
    seen[key] = True
    distinct = np.count_nonzero(seen)
    del seen
    # The usual case, in one pass: as many keys in use as rows, events aside.
    event_rows = np.flatnonzero(events) if events is not None else np.zeros(0, dtype=np.intp)
    if distinct - len(np.unique(key[event_rows])) == n - len(event_rows):
        return None
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


def _tidy_categories(frame: pd.DataFrame, tidy: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Sorted categories, each one used: the same table reads the same from any format. A column of
    ``tidy`` (:attr:`._read._Raw.tidy`) that still has that very dtype object is canonical already."""
    changed = {}
    for name in CATEGORY_COLUMNS:
        column = frame[name]
        if tidy and column.dtype is tidy.get(name):
            continue
        categories = column.cat.categories
        seen = np.zeros(len(categories) + 1, dtype=bool)
        seen[_cat_codes(column)] = True  # a missing value (-1) marks the extra last slot
        used = seen[:-1]
        if used.all() and categories.is_monotonic_increasing:
            continue
        kept = categories[used]
        order = kept.argsort()
        mapping = np.full(len(categories), -1, dtype=np.int64)
        mapping[np.flatnonzero(used)[order]] = np.arange(order.size)
        changed[name] = _recode(column, mapping, pd.Index(kept[order], dtype=_STR))
    return frame.assign(**changed) if changed else frame


def concat_frames(parts: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Canonical results frames as one, categories unioned and sorted; no check across the parts."""
    columns: dict[str, Any] = {}
    for name in RESULT_COLUMNS:
        if name in CATEGORY_COLUMNS:
            union = pd.api.types.union_categoricals([p[name] for p in parts], sort_categories=True)
            columns[name] = pd.Series(union, name=name)
        else:
            columns[name] = pd.concat([p[name] for p in parts], ignore_index=True)
    return pd.DataFrame(columns, copy=False)
