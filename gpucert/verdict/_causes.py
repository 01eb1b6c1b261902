"""Causes for statistical findings, read from the telemetry joined on the same GPU or node
(docs/reference/causes-and-actions.md, "Causes").

A drop is named by what the telemetry says happened while it was measured (throttle bits, a power limit below
default, a PCIe link below its maximum, NVLinks down); without a signature, by where it sits: shared by a node's
GPUs, an intra-node NCCL deficit, a node's storage reads, a pair, or a lone GPU slow against its peers. Every
cause belongs to a *layer* (:func:`layer_of`), the first words of the verdict's ``reasons``. A host-side metric
the node carries as a host finding is not its GPUs' fault: on a GPU whose own link is at spec it is at most a
warn, cause ``config``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..policy import Policy
from ._compare import HOST_METRICS, link_signature
from ._findings import RANK, SEVERITY
from ._gates import HW_POWER_BRAKE, HW_THERMAL, SW_POWER_CAP, SW_THERMAL
from ._index import MCODE, SCOPE_GPU, RunIndex

__all__ = ["ACTION_FOR_CAUSE", "LAYERS", "LAYER_OF_CAUSE", "attribute_causes", "layer_of"]

_COMPUTE = {"gemm_bf16_tflops", "gemm_fp8_tflops", "hbm_copy_gbps"}

#: What a technician does first about a confirmed statistical fail of each cause
#: (docs/reference/causes-and-actions.md, "Remediation playbook"). A node's network deficit (low with every
#: partner: its NIC, cable or switch port) starts at the cable; the NIC telemetry's own gates name
#: ``reseat_nic`` for a port down.
ACTION_FOR_CAUSE = {
    "thermal": "check_cooling",
    "power": "check_power",
    "config": "fix_config",
    "pcie": "reseat",
    "nvlink": "reset_gpu",
    "network": "check_cable",
    "storage": "check_storage_mount",
    "slow_silicon": "retest",
    "unknown": "retest",
}

#: The layers, from the GPU outwards.
LAYERS = ("gpu", "nvlink", "network", "storage", "stack", "unknown")
#: Each cause of the verdict contract's vocabulary and the layer it belongs to.
LAYER_OF_CAUSE = {
    "thermal": "gpu",
    "power": "gpu",
    "ecc": "gpu",
    "row_remap": "gpu",
    "xid": "gpu",
    "slow_silicon": "gpu",
    "pcie": "gpu",
    "nvlink": "nvlink",
    "network": "network",
    "storage": "storage",
    "config": "stack",
    "unknown": "unknown",
}


def layer_of(cause: str) -> str:
    """The layer of ``cause`` (:data:`LAYER_OF_CAUSE`): ``gpu``, ``nvlink``, ``network``, ``storage``,
    ``stack`` or ``unknown`` (also for no cause and for a cause gpucert does not know)."""
    return LAYER_OF_CAUSE.get(cause, "unknown")


def attribute_causes(run: RunIndex, findings: pd.DataFrame, node_causes: pd.Series, policy: Policy) -> pd.DataFrame:
    """Fill cause, action and ticket of the findings that have no cause yet.

    ``node_causes`` maps a node name to a node-wide cause already established (a shared gate, or a
    node-wide drop); it names the cause of its GPUs' drops that carry no signature of their own.
    """
    findings = _host_findings_on_host_nodes(run, findings, policy)
    todo = (findings["cause"] == "") & findings["rank"].isin([1, 2]) & (findings["severity"] >= 2)
    if not todo.any():
        return findings
    part = findings[todo]
    tele = _telemetry_of(run, part)

    def t(name: str) -> np.ndarray:
        return tele[:, MCODE[name]]

    bits = np.nan_to_num(t("clocks_event_reasons"), nan=0).astype(np.int64)
    hot = t("temp_max_c") >= t("temp_slowdown_c") - policy.gates.temp_margin_c
    capped = ((bits & SW_POWER_CAP) > 0) & (
        t("power_limit_w") < t("power_limit_default_w") * (1 - policy.gates.power_limit_tolerance_pct / 100)
    )
    link_low = link_signature(tele, policy)
    metric = part["metric"].to_numpy(dtype=object)
    compute = np.isin(metric, list(_COMPUTE))
    host = np.isin(metric, list(HOST_METRICS))
    storage = metric == "storage_read_gbps"
    scope = part["scope"].to_numpy(dtype=object)
    node_cause = node_causes.reindex(part["node"]).to_numpy(dtype=object)
    has_node_cause = pd.notna(node_cause)
    nvlink_node = _nodes_with_nvlink_trouble(run, policy).reindex(part["node"]).fillna(False).to_numpy(bool)
    alone = part["reference_kind"].isin(["peer", "model", "node", "spec"]).to_numpy()

    # The first that applies names the cause: a signature of the telemetry before where the drop sits.
    rules: list[tuple[np.ndarray, Any]] = [
        (scope == "pair", "network"),
        ((scope == "node") & storage, "storage"),
        ((scope == "node") & nvlink_node, "nvlink"),
        ((scope == "node") & has_node_cause, node_cause),
        ((scope == "node") & host, "config"),
        (scope == "node", "nvlink"),
        (compute & ((bits & HW_POWER_BRAKE) > 0), "power"),
        (compute & (((bits & (HW_THERMAL | SW_THERMAL)) > 0) | hot), "thermal"),
        (compute & capped, "config"),
        (host & link_low, "pcie"),
        (has_node_cause, node_cause),
        (host, "unknown"),
        (compute & alone, "slow_silicon"),
    ]
    cause = np.select([when for when, _ in rules], [what for _, what in rules], default="unknown")
    severity = part["severity"].to_numpy()
    action = np.where(severity >= 3, pd.Series(cause).map(ACTION_FOR_CAUSE).fillna("retest").to_numpy(), "retest")
    ticket = np.where(severity >= 3, "remediation", "none")
    findings = findings.copy()
    findings.loc[todo, "cause"] = cause
    findings.loc[todo, "action"] = action
    findings.loc[todo, "ticket"] = ticket
    return findings


def _telemetry_of(run: RunIndex, findings: pd.DataFrame) -> np.ndarray:
    """The telemetry row of each finding's entity (NaN for entities the run has no row for)."""
    _, eid = run.locate(findings)
    known = eid >= 0
    tele = np.full((len(findings), run.telemetry.shape[1]), np.nan)
    tele[known] = run.telemetry[eid[known]]
    return tele


def _host_findings_on_host_nodes(run: RunIndex, findings: pd.DataFrame, policy: Policy) -> pd.DataFrame:
    """Cap at warn, cause ``config``, the GPU findings on a host-side metric that their node carries as a
    host finding (a node row on that metric with cause ``config``), unless the GPU's own PCIe link is below
    spec: the host starves every GPU of the node alike, so the node is what to fix, not a GPU to replace."""
    is_host = findings["metric"].isin(list(HOST_METRICS)).to_numpy()
    severity = findings["severity"].to_numpy()
    scope = findings["scope"].to_numpy(dtype=object)
    cause = findings["cause"].to_numpy(dtype=object)
    warned = is_host & (severity >= SEVERITY["warn"])
    host_nodes = np.flatnonzero(warned & (scope == "node") & (cause == "config"))
    if len(host_nodes) == 0:
        return findings
    candidate = np.flatnonzero(
        warned
        & (scope == "gpu")
        & findings["rank"].isin([RANK["stat"], RANK["spec"]]).to_numpy()
        & np.isin(cause, ["", "config"])
    )

    def keys(rows: np.ndarray) -> pd.Index:
        part = findings.iloc[rows]
        return pd.Index(part["node"].astype(str) + "\x00" + part["metric"].astype(str))

    hit = candidate[keys(candidate).isin(keys(host_nodes))]
    if len(hit):
        hit = hit[~link_signature(_telemetry_of(run, findings.iloc[hit]), policy)]
    if len(hit) == 0:
        return findings
    findings = findings.copy()
    at = findings.index[hit]
    findings.loc[at, "severity"] = np.minimum(severity[hit], SEVERITY["warn"])
    findings.loc[at, "cause"] = "config"
    findings.loc[at, "action"] = "fix_config"
    findings.loc[at, "ticket"] = "none"
    return findings


def _nodes_with_nvlink_trouble(run: RunIndex, policy: Policy) -> pd.Series:
    gpus = np.flatnonzero(run.scope == SCOPE_GPU)
    bad = (run.telemetry[gpus, MCODE["nvlink_down"]] > 0) | (
        run.telemetry[gpus, MCODE["nvlink_crc_errors"]] > policy.gates.nvlink_crc_errors
    )
    names = np.asarray(run.nodes)[run.node_code[gpus[bad]]]
    return pd.Series(True, index=pd.Index(np.unique(names)), dtype=bool)
