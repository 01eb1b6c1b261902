"""Across rows: duplicated samples and conflicting identities, checked on integer codes, and
the concatenation of several files into one canonical table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .._frames import CATEGORY_COLUMNS
from ..metrics import EVENT_METRICS, RESULT_COLUMNS
from ._common import _LISTED, _STR, Bools, Codes, Ints, _Findings, _per_category, _recode, _Rows, _text_at

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
