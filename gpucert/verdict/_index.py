"""One run's results turned into integer arrays the engine can group and scatter without strings.

Every row belongs to an *entity*: a GPU (node, gpu index), a node (node-level rows) or a pair (node,
peer). Entities get dense integer ids and metrics their registry position, so a GPU × metric result is an
int64 key and the telemetry of 100,000 GPUs is one 2-D array. Strings come back only for the (few) flagged
entities and for the output table.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple, cast

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..metrics import METRICS

__all__ = ["MCODE", "METRIC_NAMES", "RunIndex", "group_positions", "group_rows", "index_run", "nan_median"]

METRIC_NAMES: tuple[str, ...] = tuple(METRICS)
MCODE: dict[str, int] = {name: i for i, name in enumerate(METRIC_NAMES)}
N_METRICS = len(METRIC_NAMES)

SCOPE_GPU, SCOPE_NODE, SCOPE_PAIR = 0, 1, 2
SCOPE_NAMES = ("gpu", "node", "pair")
_SCOPE_CODE = {name: i for i, name in enumerate(SCOPE_NAMES)}


def entity_key(scope: np.ndarray, node_code: np.ndarray, sub: np.ndarray) -> np.ndarray:
    """An entity's identity packed in one int64: its scope, its node, and its GPU index or peer."""
    key: np.ndarray = (
        (scope.astype(np.int64) << 42) | (node_code.astype(np.int64) << 21) | np.maximum(sub, 0).astype(np.int64)
    )
    return key


_KIND = np.array([METRICS[n].kind for n in METRIC_NAMES])
IS_PERF = _KIND == "perf"
IS_TELEMETRY = _KIND == "telemetry"
#: +1 where higher is better, -1 where lower is better, 0 for telemetry.
DIRECTION = np.array([METRICS[n].direction for n in METRIC_NAMES], dtype=np.float64)


@dataclass(frozen=True)
class RunIndex:
    """The arrays of one run. Row arrays have one entry per result row, entity arrays one per entity."""

    run_id: str
    # per row
    eid: np.ndarray
    mcode: np.ndarray
    value: np.ndarray
    repeat: np.ndarray
    # per entity
    keys: np.ndarray  # entity_key() of each entity
    scope: np.ndarray
    node_code: np.ndarray
    gpu: np.ndarray  # -1 unless a GPU
    peer_code: np.ndarray  # -1 unless a pair
    uuid_code: np.ndarray  # -1 when unknown
    model_code: np.ndarray
    # names behind the codes
    nodes: pd.Index
    peers: pd.Index
    uuids: pd.Index
    models: pd.Index
    #: telemetry[e, m]: the value of telemetry metric m for entity e (NaN when not reported)
    telemetry: np.ndarray

    @property
    def n_entities(self) -> int:
        return len(self.scope)

    def node_names(self, eids: np.ndarray) -> np.ndarray:
        names: np.ndarray = np.asarray(self.nodes, dtype=object)[self.node_code[eids]]
        return names

    def peer_names(self, eids: np.ndarray) -> np.ndarray:
        codes = self.peer_code[eids]
        names = np.asarray(self.peers, dtype=object)
        out: np.ndarray = np.where(codes >= 0, names[np.maximum(codes, 0)] if len(names) else "", "")
        return out

    def uuid_names(self, eids: np.ndarray) -> np.ndarray:
        codes = self.uuid_code[eids]
        out = np.full(len(codes), None, dtype=object)
        known = codes >= 0
        out[known] = np.asarray(self.uuids, dtype=object)[codes[known]]
        return out

    def model_names(self, eids: np.ndarray) -> np.ndarray:
        names: np.ndarray = np.asarray(self.models, dtype=object)[self.model_code[eids]]
        return names

    @cached_property
    def _key_index(self) -> pd.Index:
        """A hash index of the entity keys, built once per run however often findings are located."""
        index: pd.Index = pd.Index(self.keys)
        return index

    def locate(self, findings: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(entity key, entity id or -1) of the entities that findings name by scope, node, gpu and peer."""
        scope = findings["scope"].map(_SCOPE_CODE).to_numpy(dtype=np.int64)
        node_code = self.nodes.get_indexer(pd.Index(findings["node"].astype(str))).astype(np.int64)
        gpu = findings["gpu"].to_numpy(dtype=np.int64)
        peer_code = self.peers.get_indexer(pd.Index(findings["peer"].astype(str))).astype(np.int64)
        sub = np.where(scope == SCOPE_GPU, gpu, np.where(scope == SCOPE_PAIR, peer_code, 0))
        keys = entity_key(scope, node_code, sub)
        eid = np.where(node_code >= 0, self._key_index.get_indexer(pd.Index(keys)), -1).astype(np.int64)
        return keys, eid

    def rows_of(self, metric: str) -> np.ndarray:
        """Row positions holding ``metric``."""
        return np.flatnonzero(self.mcode == MCODE[metric])


def _codes(column: pd.Series) -> tuple[np.ndarray, pd.Index]:
    """The category codes as they are (no widening copy: a fleet's rows are millions) and the names."""
    cat = column.astype("category") if not isinstance(column.dtype, pd.CategoricalDtype) else column
    categorical = cast(pd.Categorical, cat.array)
    return categorical.codes, pd.Index(categorical.categories)


def _small_ints(column: pd.Series, missing: int) -> tuple[np.ndarray, int]:
    """A column of small integers ≥ 0 (``gpu``) in the narrowest dtype, ``missing`` where empty; and its
    maximum (-1 when none)."""
    # The largest through Arrow: pandas' minimum or maximum of a nullable column copies its values.
    top = pc.max(pa.array(column.array)).as_py() if isinstance(column.dtype, pd.Int64Dtype) else column.max()
    high = -1 if top is None or pd.isna(top) else int(top)
    narrow: tuple[type[np.signedinteger[Any]], ...] = (np.int8, np.int16, np.int32)
    dtype = next((t for t in narrow if high < np.iinfo(t).max), np.int64)
    return column.to_numpy(dtype=dtype, na_value=missing), high


class Grouping(NamedTuple):
    """Rows grouped by a key (:func:`group_rows`)."""

    ids: np.ndarray  #: each row's group, in order of first appearance
    first: np.ndarray  #: each group's first row
    contiguous: bool  #: each group's rows are one stretch from its first (reduceat works)

    @property
    def counts(self) -> np.ndarray:
        """Rows per group (counted at each call)."""
        if self.contiguous:
            return np.diff(np.append(self.first, len(self.ids)))
        return np.bincount(self.ids, minlength=len(self.first))

    def by_width(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """For each number of rows a group has: those groups, and a (groups × that many) array of their
        rows, each group's in row order. A statistic of each group is then one over the rows of a matrix
        without padding (the three repeats of a GEMM never wait on the twelve of a copy)."""
        counts = self.counts
        if self.contiguous:
            starts, order = self.first, None
        else:
            order = np.argsort(self.ids, kind="stable")
            starts = np.cumsum(counts) - counts
        for width in np.unique(counts):
            groups = np.flatnonzero(counts == width)
            cells = starts[groups][:, None] + np.arange(width)
            yield groups, (cells if order is None else order[cells])


def group_rows(dense: npt.NDArray[np.integer[Any]], span: int) -> Grouping:
    """Group rows by ``dense`` (integers ≥ 0 below ``span``, e.g. entity × metric): each row's group and the
    row where each group first appears, groups in order of first appearance. What ``pd.factorize`` gives,
    without hashing."""
    grouped = _grouped_rows(dense, span)
    if grouped is not None:
        return grouped
    n = len(dense)
    row_type = np.int32 if n < 2**31 else np.int64
    first: npt.NDArray[np.integer[Any]] = np.full(span, n, dtype=row_type)
    np.minimum.at(first, dense, np.arange(n, dtype=row_type))
    present = np.flatnonzero(first < n)
    order = np.argsort(first[present], kind="stable")
    ids = np.full(span, -1, dtype=np.int32 if len(present) < 2**31 else np.int64)
    ids[present[order]] = np.arange(len(present), dtype=ids.dtype)
    return Grouping(ids[dense], first[present[order]].astype(np.int64), contiguous=False)


def _grouped_rows(dense: npt.NDArray[np.integer[Any]], span: int) -> Grouping | None:
    """:func:`group_rows` when each id's rows are contiguous (how the payload prints a GPU's results and
    a run's files follow one another), from where the id changes: a few passes over the rows instead of a
    scatter into a table as wide as ``span``. ``None`` when some id comes back after another."""
    n = len(dense)
    if n == 0 or n >= 2**31:
        return None
    starts = np.flatnonzero(dense[1:] != dense[:-1])
    starts += 1
    starts = np.concatenate(([0], starts))
    seen = np.zeros(span, dtype=bool)
    seen[dense[starts]] = True
    if np.count_nonzero(seen) != len(starts):
        return None  # an id in two stretches: not grouped
    ids = np.zeros(n, dtype=np.int32)
    ids[starts[1:]] = 1
    np.cumsum(ids, out=ids)
    return Grouping(ids, starts.astype(np.int64), contiguous=True)


def group_positions(codes: np.ndarray) -> list[np.ndarray]:
    """The positions of each distinct value of ``codes`` (small integers ≥ 0: cohorts), the groups in order of
    first appearance, positions ascending: for a few large groups (a cohort of 100,000 GPUs), a counting sort of
    the codes and one numpy call per group are several times faster than a pandas groupby."""
    if len(codes) == 0:
        return []
    narrow = codes.astype(np.int16) if int(codes.max()) < 2**15 else codes  # 16 bits: a radix sort
    order = np.argsort(narrow, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(narrow[order])) + 1)
    groups.sort(key=lambda members: int(members[0]))
    return groups


def nan_median(values: np.ndarray) -> float:
    """The median of the values that are not NaN (NaN when none is): a pandas median."""
    present = values[~np.isnan(values)]
    return float(np.median(present)) if len(present) else np.nan


def index_run(results: pd.DataFrame) -> RunIndex:
    """Index the rows of exactly one run (canonical dtypes, as the reader returns them)."""
    run_code, run_ids = _codes(results["run_id"])
    assert len(run_code), "index_run takes one run"
    assert run_code.min() == run_code.max() >= 0, "index_run takes one run"
    node_code, nodes = _codes(results["node"])
    peer_code, peers = _codes(results["peer"])
    uuid_code, uuids = _codes(results["gpu_uuid"])
    model_code, models = _codes(results["gpu_model"])
    metric_code, metric_cats = _codes(results["metric"])
    to_registry = np.array([MCODE[str(c)] for c in metric_cats], dtype=np.int8)
    mcode = to_registry[metric_code] if len(metric_cats) else metric_code.astype(np.int8)

    # An entity is a GPU (a row with a gpu index), a pair (no gpu, a peer) or a node (neither). GPUs and
    # nodes get a dense id, node × (gpu index, or one past the last for the node itself), and pairs ids
    # after them from a hash of their (few) rows; ids are then renumbered in order of first appearance.
    # Narrow integers throughout: these arrays are as long as the fleet's results.
    gpu, top = _small_ints(results["gpu"], -1)
    width = top + 2
    base = (int(node_code.max(initial=-1)) + 1) * width
    dense: npt.NDArray[np.integer[Any]] = node_code.astype(np.int32 if base + len(results) < 2**31 else np.int64)
    dense *= width
    dense += np.where(gpu < 0, np.asarray(top + 1, dtype=gpu.dtype), gpu)
    pair_rows = np.flatnonzero((gpu < 0) & (peer_code >= 0))
    pair_peer = np.zeros(0, dtype=np.int64)
    span = base
    if len(pair_rows):
        pair_key = node_code[pair_rows].astype(np.int64) * (len(peers) + 1) + peer_code[pair_rows]
        pair_ids, pair_keys = pd.factorize(pair_key)
        dense[pair_rows] = base + pair_ids
        span += len(pair_keys)
        pair_peer = np.asarray(pair_keys, dtype=np.int64) % (len(peers) + 1)
    eid, first, contiguous = group_rows(dense, span)
    n_ent = len(first)

    ent_dense = dense[first].astype(np.int64)
    is_pair = ent_dense >= base
    ent_node = np.where(is_pair, node_code[first], ent_dense // width).astype(np.int64)
    ent_sub = ent_dense % width
    ent_scope = np.where(is_pair, SCOPE_PAIR, np.where(ent_sub <= top, SCOPE_GPU, SCOPE_NODE))
    ent_scope = ent_scope.astype(np.int64)
    ent_gpu = np.where(ent_scope == SCOPE_GPU, ent_sub, -1)
    ent_peer = np.full(n_ent, -1, dtype=np.int64)
    if len(pair_rows):
        ent_peer[is_pair] = pair_peer[ent_dense[is_pair] - base]
    keys = entity_key(ent_scope, ent_node, np.where(ent_scope == SCOPE_GPU, ent_gpu, np.maximum(ent_peer, 0)))
    # The reader guarantees one UUID per GPU and one model per node, so any row of an entity that has a
    # UUID names it, and any row its model.
    if contiguous:
        ent_uuid = np.maximum.reduceat(uuid_code, first).astype(np.int64)
    else:
        ent_uuid = np.full(n_ent, -1, dtype=uuid_code.dtype)  # the codes' own dtype: a mixed ufunc.at is slow
        np.maximum.at(ent_uuid, eid, uuid_code)
        ent_uuid = ent_uuid.astype(np.int64)
    ent_model = model_code[first].astype(np.int64)

    value = results["value"].to_numpy(dtype=np.float64)
    tele_rows = np.flatnonzero(IS_TELEMETRY[mcode])
    telemetry = np.full((n_ent, N_METRICS), np.nan)
    # One flat index: a 2-D fancy assignment of millions of cells costs twice as much.
    cell = eid[tele_rows].astype(np.int64)
    cell *= N_METRICS
    cell += mcode[tele_rows]
    telemetry.ravel()[cell] = value[tele_rows]

    return RunIndex(
        run_id=str(run_ids[run_code[0]]),
        keys=keys,
        eid=eid,
        mcode=mcode,
        value=value,
        repeat=results["repeat"].to_numpy(dtype=np.int64),
        scope=ent_scope,
        node_code=ent_node,
        gpu=ent_gpu,
        peer_code=ent_peer,
        uuid_code=ent_uuid,
        model_code=ent_model,
        nodes=nodes,
        peers=peers,
        uuids=uuids,
        models=models,
        telemetry=telemetry,
    )
