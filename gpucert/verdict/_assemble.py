"""Findings reduced to the verdict table (docs/design/data-contracts.md, "Verdicts"): one row per GPU, node
and pair, plus fleet rows (the rules: docs/design/verdict-engine.md, "Causes and assembly").

The work happens in entity-id space: findings (few) are mapped to ids and scattered into arrays as long
as the fleet, and names come back as categoricals built from codes, so 100,000 passing GPUs cost a few
array operations rather than a string merge.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ._causes import LAYER_OF_CAUSE
from ._findings import CAUSE_SPECIFICITY, SEVERITY, TICKET_RANK, VERDICT_OF
from ._index import SCOPE_GPU, SCOPE_NODE, SCOPE_PAIR, RunIndex

__all__ = ["VERDICT_COLUMNS", "assemble", "escalate_nodes", "with_layer"]

VERDICT_COLUMNS = (
    "run_id",
    "node",
    "gpu",
    "gpu_uuid",
    "verdict",
    "metric",
    "value",
    "reference",
    "deviation_pct",
    "z",
    "reference_kind",
    "cause",
    "action",
    "ticket",
    "reasons",
    # gpucert's additions to the contract: the cohort, and the other node of a pair row
    "gpu_model",
    "peer",
)

_SCOPE_CODE = {"gpu": SCOPE_GPU, "node": SCOPE_NODE, "pair": SCOPE_PAIR}
#: Each ticket rank's name, at its rank (objects: a column of NumPy fixed-width strings costs pandas a
#: slow conversion).
_TICKET_NAMES = np.array(sorted(TICKET_RANK, key=TICKET_RANK.__getitem__), dtype=object)


def escalate_nodes(findings: pd.DataFrame) -> pd.DataFrame:
    """Node findings for nodes whose node benchmark could not run because one of their GPUs failed a hard gate:
    inconclusive is for reasons outside the GPU, so the node row fails with the GPU's cause instead
    (docs/reference/causes-and-actions.md, "Verdicts")."""
    node_blocked = findings[(findings["scope"] == "node") & (findings["severity"] == SEVERITY["inconclusive"])]
    gpu_fails = findings[
        (findings["scope"] == "gpu") & (findings["severity"] == SEVERITY["fail"]) & (findings["rank"] >= 3)
    ]
    if node_blocked.empty or gpu_fails.empty:
        return findings.iloc[:0]
    gpu_fails = gpu_fails.assign(spec=gpu_fails["cause"].map(CAUSE_SPECIFICITY))
    worst = gpu_fails.sort_values(["node", "spec"], ascending=[True, False]).drop_duplicates("node").set_index("node")
    nodes = pd.Index(node_blocked["node"].unique()).intersection(worst.index)
    if nodes.empty:
        return findings.iloc[:0]
    picked = worst.loc[nodes]
    out: pd.DataFrame = picked.reset_index()[list(findings.columns)].copy()
    out["scope"] = "node"
    out["gpu"] = -1
    out["metric"] = "error"
    out["value"] = np.nan
    out["reference"] = np.nan
    out["reason"] = [
        f"the node benchmark could not complete because GPU {g} failed: {r}"
        for g, r in zip(picked["gpu"], picked["reason"], strict=True)
    ]
    return out


def _entity_ids(run: RunIndex, findings: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
    """Each finding's entity id, and the entities the run has no rows for (GPUs that report nothing: scope,
    node_code, gpu), which get new ids after the run's own."""
    keys, eid = run.locate(findings)
    scope = findings["scope"].map(_SCOPE_CODE).to_numpy(dtype=np.int64)
    node_code = run.nodes.get_indexer(pd.Index(findings["node"].astype(str))).astype(np.int64)
    gpu = findings["gpu"].to_numpy(dtype=np.int64)
    new = eid < 0
    extra = pd.DataFrame({"key": keys[new], "scope": scope[new], "node_code": node_code[new], "gpu": gpu[new]})
    extra = extra.drop_duplicates("key").reset_index(drop=True)
    if len(extra):
        eid[new] = run.n_entities + pd.Index(extra["key"]).get_indexer(keys[new])
    return eid, extra


def assemble(run: RunIndex, findings: pd.DataFrame) -> pd.DataFrame:
    fleet = findings[findings["scope"] == "fleet"]
    entity = findings[findings["scope"] != "fleet"].reset_index(drop=True)
    eid, extra = _entity_ids(run, entity)
    total = run.n_entities + len(extra)

    severity = entity["severity"].to_numpy(dtype=np.int64)
    rank = entity["rank"].to_numpy(dtype=np.int64)
    # Ties (two metrics failing a gate of one rank) break on the text, not on the order rows arrived in.
    text_order = pd.factorize(entity["metric"].astype(str) + "\x00" + entity["reason"].astype(str), sort=True)[0]
    specificity = entity["cause"].map(CAUSE_SPECIFICITY).fillna(0).to_numpy(dtype=np.int64)
    ticket_rank = entity["ticket"].map(TICKET_RANK).fillna(0).to_numpy(dtype=np.int64)

    top = np.zeros(total, dtype=np.int64)
    np.maximum.at(top, eid, severity)
    at_top = severity == top[eid]
    # The deciding finding: highest rank at the top severity; the cause: most specific at it.
    deciding = _first_per_entity(eid, at_top, (-rank, text_order))
    causing = _first_per_entity(eid, at_top, (-specificity, -rank, text_order))
    ticket = np.zeros(total, dtype=np.int64)
    np.maximum.at(ticket, eid[at_top], ticket_rank[at_top])

    out, order = _identity_frame(run, extra)
    verdict_sev = np.maximum(top, 0)
    out["verdict"] = np.array([VERDICT_OF[i] for i in range(4)], dtype=object)[verdict_sev]
    judged = verdict_sev >= SEVERITY["warn"]
    flagged_eids = np.flatnonzero(verdict_sev > 0)
    for column in ("metric", "value", "reference", "deviation_pct", "z", "reference_kind"):
        fill = "" if column in ("metric", "reference_kind") else np.nan
        out[column] = _scatter(total, flagged_eids, entity[column].to_numpy()[deciding[flagged_eids]], fill)
    cause = _scatter(total, flagged_eids, entity["cause"].to_numpy()[causing[flagged_eids]], "")
    action = _scatter(total, flagged_eids, entity["action"].to_numpy()[causing[flagged_eids]], "none")
    cause[~judged] = ""
    action[(verdict_sev == SEVERITY["inconclusive"])] = "retest"
    out["cause"] = cause
    out["action"] = action
    out["ticket"] = _TICKET_NAMES[np.where(judged, ticket, TICKET_RANK["none"])]

    worst_first = np.lexsort((text_order, -rank, -severity, eid))
    reason_eids, reasons = _join_per_entity(eid[worst_first], entity["reason"].to_numpy(dtype=object)[worst_first])
    out["reasons"] = with_layer(cause, _scatter(total, reason_eids, reasons, ""))

    out = out.iloc[order].reset_index(drop=True)
    if len(fleet):
        out = pd.concat([out, _fleet_frame(fleet)], ignore_index=True)
    out["run_id"] = run.run_id
    return out[list(VERDICT_COLUMNS)]


def with_layer(cause: np.ndarray, reasons: np.ndarray) -> np.ndarray:
    """``"<layer>: <reasons>"`` where a row has a cause (:data:`LAYER_OF_CAUSE`); the others as they are."""
    named = pd.notna(cause) & (cause != "")
    if not named.any():
        return reasons
    layer = pd.Series(cause[named]).map(LAYER_OF_CAUSE).fillna("unknown").to_numpy(dtype=object)
    out = reasons.copy()
    out[named] = layer + ": " + reasons[named]
    return out


def _first_per_entity(eid: np.ndarray, mask: np.ndarray, keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """For each entity id, the position of its first masked finding when sorted by ``keys`` (-1: none)."""
    positions = np.flatnonzero(mask)
    order = np.lexsort((*(k[positions] for k in reversed(keys)), eid[positions]))
    ordered = positions[order]
    ids = eid[ordered]
    first = np.r_[True, ids[1:] != ids[:-1]] if len(ids) else np.zeros(0, dtype=bool)
    out = np.full(int(eid.max()) + 1 if len(eid) else 0, -1, dtype=np.int64)
    out[ids[first]] = ordered[first]
    return out


def _join_per_entity(eids: np.ndarray, texts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ "; ".join of the texts of each run of equal ids (ids sorted), without a Python loop per group."""
    if len(eids) == 0:
        return eids, texts
    starts = np.flatnonzero(np.r_[True, eids[1:] != eids[:-1]])
    last = np.r_[starts[1:] - 1, len(eids) - 1]
    pieces = texts.astype(object) + "; "
    pieces[last] = texts[last]
    return eids[starts], np.add.reduceat(pieces, starts)


def _scatter(total: int, eids: np.ndarray, values: np.ndarray, fill: object) -> np.ndarray:
    dtype = np.float64 if isinstance(fill, float) else object
    out = np.full(total, fill, dtype=dtype)
    out[eids] = values
    return out


def _identity_frame(run: RunIndex, extra: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """node, gpu, gpu_uuid, gpu_model, peer for every entity, in entity-id order; and the order in which
    the table is written (GPUs, then nodes, then pairs; each by node name)."""
    scope = np.r_[run.scope, extra["scope"].to_numpy(dtype=np.int64)]
    node_code = np.r_[run.node_code, extra["node_code"].to_numpy(dtype=np.int64)]
    gpu = np.r_[run.gpu, extra["gpu"].to_numpy(dtype=np.int64)]
    peer_code = np.r_[run.peer_code, np.full(len(extra), -1, dtype=np.int64)]
    uuid_code = np.r_[run.uuid_code, np.full(len(extra), -1, dtype=np.int64)]
    # A GPU that reports nothing belongs to its node's model.
    node_model = np.zeros(len(run.nodes), dtype=np.int64)
    node_model[run.node_code] = run.model_code
    model_code = np.r_[run.model_code, node_model[extra["node_code"].to_numpy(dtype=np.int64)]]

    frame = pd.DataFrame(
        {
            "node": pd.Categorical.from_codes(node_code, categories=run.nodes),
            "gpu": pd.array(gpu, dtype="Int64"),
            "gpu_uuid": _names(uuid_code, run.uuids),
            "gpu_model": _names(model_code, run.models),
            "peer": _names(peer_code, run.peers),
        }
    )
    frame.loc[scope != SCOPE_GPU, "gpu"] = pd.NA
    node_rank = np.argsort(np.argsort(np.asarray(run.nodes, dtype=str)))[node_code]
    order = np.lexsort((peer_code, gpu, node_rank, scope))
    return frame, order


def _names(codes: np.ndarray, categories: pd.Index) -> pd.Categorical:
    if len(categories) == 0:
        return pd.Categorical.from_codes(np.full(len(codes), -1), categories=pd.Index([], dtype=object))
    return pd.Categorical.from_codes(codes, categories=categories)


def _fleet_frame(fleet: pd.DataFrame) -> pd.DataFrame:
    copied = ("metric", "value", "reference", "deviation_pct", "cause", "action")
    return pd.DataFrame(
        {
            "gpu": pd.array([pd.NA] * len(fleet), dtype="Int64"),
            "verdict": fleet["severity"].map(VERDICT_OF).to_numpy(),
            **{c: fleet[c].to_numpy() for c in copied},
            "z": np.nan,
            "reference_kind": "fleet",
            "ticket": "none",
            "reasons": with_layer(fleet["cause"].to_numpy(dtype=object), fleet["reason"].to_numpy(dtype=object)),
            **dict.fromkeys(("node", "gpu_uuid", "gpu_model", "peer")),
        }
    )
