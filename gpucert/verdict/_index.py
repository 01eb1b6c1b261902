"""One run's results turned into integer arrays the engine can group and scatter without strings.

Every row belongs to an *entity*: a GPU (node, gpu index), a node (node-level rows) or a pair (node,
peer). Entities get dense integer ids and metrics their registry position, so a GPU × metric result is an
int64 key and the telemetry of 100,000 GPUs is one 2-D array. Strings come back only for the (few) flagged
entities and for the output table.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from ..metrics import METRICS

__all__ = ["MCODE", "METRIC_NAMES", "RunIndex", "entity_key", "index_run"]

METRIC_NAMES: tuple[str, ...] = tuple(METRICS)
MCODE: dict[str, int] = {name: i for i, name in enumerate(METRIC_NAMES)}
N_METRICS = len(METRIC_NAMES)

SCOPE_GPU, SCOPE_NODE, SCOPE_PAIR = 0, 1, 2
SCOPE_NAMES = ("gpu", "node", "pair")
_SCOPE_CODE = {name: i for i, name in enumerate(SCOPE_NAMES)}


def entity_key(scope: np.ndarray, node_code: np.ndarray, sub: np.ndarray) -> np.ndarray:
    """An entity's identity packed in one int64: its scope, its node, and its GPU index or peer."""
    key: np.ndarray = (
        (scope.astype(np.int64) << 42)
        | (node_code.astype(np.int64) << 21)
        | np.maximum(sub, 0).astype(np.int64)
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
        peer_code = (
            self.peers.get_indexer(pd.Index(findings["peer"].astype(str))).astype(np.int64)
            if len(self.peers)
            else np.full(len(findings), -1, dtype=np.int64)
        )
        sub = np.where(scope == SCOPE_GPU, gpu, np.where(scope == SCOPE_PAIR, peer_code, 0))
        keys = entity_key(scope, node_code, sub)
        eid = np.where(node_code >= 0, self._key_index.get_indexer(pd.Index(keys)), -1).astype(np.int64)
        return keys, eid

    def rows_of(self, metric: str) -> np.ndarray:
        """Row positions holding ``metric``."""
        return np.flatnonzero(self.mcode == MCODE[metric])


def _codes(column: pd.Series) -> tuple[np.ndarray, pd.Index]:
    cat = column.astype("category") if not isinstance(column.dtype, pd.CategoricalDtype) else column
    return np.asarray(cat.cat.codes, dtype=np.int64), pd.Index(cat.cat.categories)


def index_run(results: pd.DataFrame) -> RunIndex:
    """Index the rows of exactly one run (canonical dtypes, as the reader returns them)."""
    run_ids = results["run_id"].unique()
    assert len(run_ids) == 1, "index_run takes one run"
    node_code, nodes = _codes(results["node"])
    peer_code, peers = _codes(results["peer"])
    uuid_code, uuids = _codes(results["gpu_uuid"])
    model_code, models = _codes(results["gpu_model"])
    metric_code, metric_cats = _codes(results["metric"])
    to_registry = np.array([MCODE[str(c)] for c in metric_cats], dtype=np.int64)
    mcode = to_registry[metric_code] if len(metric_cats) else metric_code
    gpu = results["gpu"].to_numpy(dtype=np.int64, na_value=-1)

    scope = np.where(gpu >= 0, SCOPE_GPU, np.where(peer_code >= 0, SCOPE_PAIR, SCOPE_NODE))
    sub = np.where(scope == SCOPE_GPU, gpu, np.where(scope == SCOPE_PAIR, peer_code, 0))
    eid, uniques = pd.factorize(entity_key(scope, node_code, sub))
    eid = eid.astype(np.int64)
    uniques = np.asarray(uniques, dtype=np.int64)
    n_ent = len(uniques)

    ent_scope = uniques >> 42
    ent_node = (uniques >> 21) & ((1 << 21) - 1)
    ent_sub = uniques & ((1 << 21) - 1)
    # The reader guarantees one UUID per GPU and one model per node, so any row of an entity will do.
    ent_uuid = np.full(n_ent, -1, dtype=np.int64)
    has_uuid = uuid_code >= 0
    ent_uuid[eid[has_uuid]] = uuid_code[has_uuid]
    ent_model = np.zeros(n_ent, dtype=np.int64)
    ent_model[eid] = model_code

    value = results["value"].to_numpy(dtype=np.float64)
    tele_rows = IS_TELEMETRY[mcode]
    telemetry = np.full((n_ent, N_METRICS), np.nan)
    telemetry[eid[tele_rows], mcode[tele_rows]] = value[tele_rows]

    return RunIndex(
        run_id=str(run_ids[0]),
        keys=uniques,
        eid=eid,
        mcode=mcode,
        value=value,
        repeat=results["repeat"].to_numpy(dtype=np.int64),
        scope=ent_scope,
        node_code=ent_node,
        gpu=np.where(ent_scope == SCOPE_GPU, ent_sub, -1),
        peer_code=np.where(ent_scope == SCOPE_PAIR, ent_sub, -1),
        uuid_code=ent_uuid,
        model_code=ent_model,
        nodes=nodes,
        peers=peers,
        uuids=uuids,
        models=models,
        telemetry=telemetry,
    )
