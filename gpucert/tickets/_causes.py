"""What each cause is measured by, and what may be done about it: the rules that keep tickets and taints honest
(docs/reference/causes-and-actions.md, "What clears a ticket and a taint" and "Remediation playbook").

* **Clearing rule.** A fault is cleared only by a run that measured what it was found on, on that hardware:
  :func:`measured` is the one vectorised check, for any number of faults at once.
* **Fitting actions.** A repair recorded on a ticket must fit its cause (:func:`check_action`): two GPU resets
  on a network ticket are no repair of it, and would escalate it to a replacement by the reset rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import numpy as np
import pandas as pd

from gpucert.errors import TicketActionError
from gpucert.metrics import EVENT_METRICS, METRICS, NIC_METRICS
from gpucert.verdict import ACTION_FOR_CAUSE, layer_of

from ._model import Ticket

__all__ = [
    "CAUSE_ACTIONS",
    "CAUSE_METRICS",
    "TicketActionError",
    "allowed_actions",
    "check_action",
    "fault_metrics",
    "measured",
    "not_measured",
]

_COMPUTE = ("gemm_bf16_tflops", "gemm_fp8_tflops", "hbm_copy_gbps")
_PCIE = ("pcie_gen", "pcie_width", "pcie_replays_per_min", "h2d_gbps", "d2h_gbps")

#: The metrics that measure each cause (a cause's layer: the GPU's silicon, memory, power, cooling and PCIe
#: link; the NVLink fabric; the network; the storage; the stack). A fault of the cause is measured by a run
#: that has a row of any of them on its GPU or node. ``unknown`` is measured by any row at all.
CAUSE_METRICS: Final[Mapping[str, tuple[str, ...]]] = {
    "thermal": ("temp_max_c", "clocks_event_reasons", "hw_slowdown_frac", *_COMPUTE),
    "power": ("power_limit_w", "clocks_event_reasons", "hw_slowdown_frac", *_COMPUTE),
    "ecc": ("ecc_dbe_volatile", "ecc_sbe_volatile"),
    "row_remap": ("remapped_rows_failure", "remapped_rows_pending"),
    # XIDs are events: a GPU that ran its benchmarks was watched for them.
    "xid": _COMPUTE,
    "slow_silicon": _COMPUTE,
    "pcie": _PCIE,
    "nvlink": ("nvlink_down", "nvlink_crc_errors", "nccl_allreduce_busbw_gbps"),
    "network": ("nccl_pair_busbw_gbps", *NIC_METRICS),
    "storage": ("storage_read_gbps",),
    "config": ("power_limit_w", "h2d_gbps", "d2h_gbps", *_COMPUTE),
    "unknown": tuple(METRICS),
}

_RESETS = ("reset_gpu", "reboot_node", "power_cycle")
_GPU_WORK = (*_RESETS, "reseat", "run_field_diag", "replace_gpu", "retest")
_NIC_WORK = (
    "check_cable",
    "reseat_nic",
    "reseat_cable",
    "check_switch_port",
    "reboot_node",
    "replace_cable",
    "replace_transceiver",
    "replace_nic",
    "retest",
)
#: What may be recorded as done about a fault of each layer (docs/reference/causes-and-actions.md,
#: "Remediation playbook"). The cause's own first action (:data:`gpucert.verdict.ACTION_FOR_CAUSE`) and the
#: ticket's own always fit too.
_LAYER_ACTIONS: Final[Mapping[str, tuple[str, ...]]] = {
    "gpu": (*_GPU_WORK, "check_cooling", "check_power", "replace_psu", "fix_config"),
    "nvlink": (*_GPU_WORK, "restart_fabric_manager", "replace_baseboard"),
    "network": _NIC_WORK,
    "storage": ("check_storage_mount", "fix_config", "reboot_node", "replace_disk", "retest"),
    "stack": ("fix_config", "update_driver", "reboot_node", "retest"),
}
#: Each cause → the actions a release may record on its ticket (``unknown``: any of them).
CAUSE_ACTIONS: Final[Mapping[str, tuple[str, ...]]] = {
    cause: tuple(dict.fromkeys((ACTION_FOR_CAUSE.get(cause, "retest"), *_LAYER_ACTIONS[layer_of(cause)])))
    for cause in CAUSE_METRICS
    if layer_of(cause) in _LAYER_ACTIONS
}


def allowed_actions(ticket: Ticket) -> tuple[str, ...]:
    """The actions that fit ``ticket``'s cause (and the one it asked for); empty when any fits (cause
    ``unknown``, or one gpucert does not know)."""
    fits = CAUSE_ACTIONS.get(ticket.cause)
    if fits is None:
        return ()
    return tuple(dict.fromkeys((*fits, *([ticket.action] if ticket.action else []))))


def check_action(tickets: Iterable[Ticket], action: str) -> None:
    """Raise :class:`TicketActionError` naming the first ticket whose cause ``action`` does not fit, with the
    actions that do."""
    for ticket in tickets:
        fits = allowed_actions(ticket)
        if fits and action not in fits:
            raise TicketActionError(
                f"--action {action} does not fit ticket {ticket.id or ticket.title} ({ticket.where}, cause "
                f"{ticket.cause}): use one of {', '.join(fits)}"
            )


def fault_metrics(ticket: Ticket) -> tuple[str, ...]:
    """What ``ticket``'s fault was found on: the measured metrics of its latest evidence rows (events —
    XIDs, step errors — say nothing of what measures them), else its cause's."""
    found: list[str] = []
    if ticket.evidence:
        found = [str(r.get("metric") or "") for r in ticket.evidence[-1].verdicts]
    own = [m for m in dict.fromkeys(found) if m in METRICS and m not in EVENT_METRICS]
    return tuple(own) or CAUSE_METRICS.get(ticket.cause, CAUSE_METRICS["unknown"])


def _text(column: pd.Series) -> pd.Series:
    # Verdict and results tables carry names as categoricals or strings, with NaN or None where empty.
    return column.astype("string").fillna("")


def measured(faults: pd.DataFrame, results: pd.DataFrame | None) -> np.ndarray:
    """For each fault (a row of ``node``, ``gpu_uuid`` — ``""`` for a node-level fault —, ``gpu`` — its
    index or NA — and ``metrics`` — a tuple of metric names), whether ``results`` (a run's results table,
    long format) measured any of its metrics on its hardware: a GPU-level metric on its GPU (by UUID, or by
    index: a GPU replaced since reports a new UUID) or anywhere on the node for a node-level fault; a node
    metric on the node; a pair metric on either node of the pair."""
    if faults.empty:
        return np.zeros(0, dtype=bool)
    if results is None or results.empty:
        return np.zeros(len(faults), dtype=bool)
    node, metric = _text(results["node"]), _text(results["metric"])
    uuid = _text(results["gpu_uuid"]) if "gpu_uuid" in results else pd.Series("", index=results.index)
    index = pd.to_numeric(results["gpu"], errors="coerce").astype("Int64").astype("string").fillna("")
    peer = _text(results["peer"]) if "peer" in results else pd.Series("", index=results.index)
    on_node = set(node + "\x00" + metric) | set((peer + "\x00" + metric)[peer.ne("")])
    on_gpu = set(node + "\x00" + uuid + "\x00" + metric) | set(node + "\x00#" + index + "\x00" + metric)

    wanted = faults.reset_index(drop=True).assign(_fault=lambda f: range(len(f))).explode("metrics")
    wanted = wanted[wanted["metrics"].notna()]
    w_node, w_metric = _text(wanted["node"]), _text(wanted["metrics"])
    w_uuid = _text(wanted["gpu_uuid"])
    w_index = pd.to_numeric(wanted["gpu"], errors="coerce").astype("Int64").astype("string").fillna("")
    gpu_level = w_metric.map({n: m.level == "gpu" for n, m in METRICS.items()}).fillna(False).astype(bool)
    per_gpu = gpu_level & w_uuid.ne("")
    by_node = (w_node + "\x00" + w_metric).isin(on_node)
    by_uuid = (w_node + "\x00" + w_uuid + "\x00" + w_metric).isin(on_gpu)
    by_index = w_index.ne("") & (w_node + "\x00#" + w_index + "\x00" + w_metric).isin(on_gpu)
    hit = (~per_gpu & by_node) | (per_gpu & (by_uuid | by_index))
    found = hit.groupby(wanted["_fault"].to_numpy()).any()
    return found.reindex(range(len(faults)), fill_value=False).to_numpy(dtype=bool)


def not_measured(cause: str, where: str, metrics: Sequence[str]) -> str:
    """Why a fault stays: ``this run did not measure storage (storage_read_gbps) on node-3``."""
    shown = ", ".join(metrics[:4]) + (", …" if len(metrics) > 4 else "")
    return f"this run did not measure {cause} ({shown}) on {where}"
