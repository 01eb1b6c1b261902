"""Stage 0 (docs/design/verdict-engine.md, "Stage 0: gates"): rules on telemetry and events that need no statistics.

A gate names its cause from the signal itself (a PCIe link below its maximum is ``pcie``), and its action and
ticket from docs/reference/causes-and-actions.md, "Remediation playbook". What is *missing* is judged here too:
a GPU the node should have but that reports nothing fails; a step that errored, or an absent result, is inconclusive.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from ..policy import Policy
from ..xid import xid_rules
from ._findings import SEVERITY, concat_findings, empty_findings, entity_findings, make_findings
from ._index import (
    IS_PERF,
    MCODE,
    METRIC_NAMES,
    N_METRICS,
    SCOPE_GPU,
    SCOPE_NAMES,
    SCOPE_NODE,
    RunIndex,
    group_positions,
)

__all__ = ["gate_findings", "missing_findings", "node_wide_gate_findings"]

HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE, SW_POWER_CAP = 0x08, 0x20, 0x40, 0x80, 0x04


class _Gates:
    """The gates of one scope (the run's GPUs, or its nodes): each :meth:`emit` adds the findings of one."""

    def __init__(self, run: RunIndex, scope: int) -> None:
        self.run = run
        self.eids = np.flatnonzero(run.scope == scope)
        self.scope = SCOPE_NAMES[scope]
        self.parts: list[pd.DataFrame] = []

    def t(self, name: str) -> np.ndarray:
        """The telemetry metric ``name`` of each entity of the scope."""
        column: np.ndarray = self.run.telemetry[self.eids, MCODE[name]]
        return column

    def emit(
        self,
        mask: np.ndarray,
        *,
        metric: str,
        reference: object = np.nan,
        severity: str = "fail",
        cause: object,
        action: object,
        ticket: object = "remediation",
        reason: str | Callable[..., str],
        also: np.ndarray | None = None,
    ) -> None:
        """One gate: the entities where ``mask`` holds, with their value of ``metric``, the reference and
        the words: ``reason`` itself, or made of each one's value, reference and (when given) ``also``."""

        def pick(x: object) -> object:
            return x[mask] if isinstance(x, np.ndarray) else x

        if not mask.any():
            return
        v, r = self.t(metric)[mask], np.broadcast_to(np.asarray(reference, dtype=float), mask.shape)[mask]
        rows = zip(v, r, also[mask], strict=True) if also is not None else zip(v, r, strict=True)
        words = [reason] * len(v) if isinstance(reason, str) else [reason(*row) for row in rows]
        eids = self.eids[mask]
        self.parts.append(
            make_findings(
                self.scope,
                self.run.node_names(eids),
                gpu=self.run.gpu[eids],
                severity=severity,
                rank="gate",
                metric=metric,
                value=v,
                reference=r,
                reference_kind="gate",
                cause=pick(cause),
                action=pick(action),
                ticket=pick(ticket),
                reason=words,
            )
        )


def gate_findings(run: RunIndex, policy: Policy) -> pd.DataFrame:
    """Every telemetry gate, XID and benchmark error of the run."""
    gates = policy.gates
    on_gpus = _Gates(run, SCOPE_GPU)
    t, emit = on_gpus.t, on_gpus.emit

    emit(
        t("remapped_rows_failure") > 0,
        metric="remapped_rows_failure",
        cause="row_remap",
        action="run_field_diag",
        ticket="replacement",
        reason="row-remap failure: a memory bank has no spare rows left; drain, reset the GPU "
        "and run the field diagnostic (NVIDIA's RMA criterion when it confirms)",
    )

    dbe, pending = t("ecc_dbe_volatile"), t("remapped_rows_pending") > 0
    emit(
        dbe > 0,
        metric="ecc_dbe_volatile",
        reference=0.0,
        cause=np.where(pending, "row_remap", "ecc"),
        action="reset_gpu",
        also=pending,
        reason=lambda n, _, p: (
            f"{int(n)} uncorrectable ECC error(s) since the last reset"
            + (
                "; a row remap is pending: reset the GPU to apply it, then re-certify"
                if p
                else ": reset the GPU and re-certify; recurring → RMA"
            )
        ),
    )
    emit(
        pending & ~(dbe > 0),
        metric="remapped_rows_pending",
        severity="warn",
        cause="row_remap",
        action="reset_gpu",
        reason="row remap pending: reset the GPU at the next idle window to apply it",
    )

    emit(
        t("pcie_gen") < t("pcie_gen_max"),
        metric="pcie_gen",
        reference=t("pcie_gen_max"),
        cause="pcie",
        action="reboot_node",
        reason=lambda g, m: (
            f"PCIe link trained down to Gen{g:.0f} of Gen{m:.0f} under load: reboot to "
            "retrain; if it persists reseat the GPU, riser or cable"
        ),
    )
    emit(
        t("pcie_width") < t("pcie_width_max"),
        metric="pcie_width",
        reference=t("pcie_width_max"),
        cause="pcie",
        action="reseat",
        reason=lambda w, m: (
            f"PCIe link at x{w:.0f} of x{m:.0f}: reseat the GPU or riser; if it persists "
            "replace the riser, retimer or GPU"
        ),
    )
    replays = t("pcie_replays_per_min")
    emit(
        replays > gates.pcie_replays_per_min,
        metric="pcie_replays_per_min",
        reference=gates.pcie_replays_per_min,
        cause="pcie",
        action="reseat",
        ticket=np.where(replays > gates.pcie_replays_replace_per_min, "replacement", "remediation"),
        reason=lambda n, g: (
            f"{n:.0f} PCIe replays/min (gate {g:g}): marginal signal integrity; reseat at the next window"
        ),
    )

    emit(
        t("nvlink_down") > 0,
        metric="nvlink_down",
        reference=0.0,
        cause="nvlink",
        action="reset_gpu",
        reason=lambda n, _: (
            f"all {n:.0f} NVLinks down: the GPU left the NVLink fabric (traffic falls back to PCIe); "
            "reset the GPU and restart Fabric Manager"
            if n >= 18
            else f"{n:.0f} NVLink(s) down: reset the GPU, then reboot; the same link again → reseat or baseboard"
        ),
    )
    emit(
        t("nvlink_crc_errors") > gates.nvlink_crc_errors,
        metric="nvlink_crc_errors",
        reference=gates.nvlink_crc_errors,
        cause="nvlink",
        action="reset_gpu",
        reason=lambda n, _: (
            f"{n:.0f} NVLink CRC errors during certification: reset the GPU; persistent on "
            "the same link → reseat or baseboard"
        ),
    )

    bits = np.nan_to_num(t("clocks_event_reasons"), nan=0).astype(np.int64)
    slowdown = t("temp_slowdown_c")
    hot = t("temp_max_c") >= slowdown - gates.temp_margin_c
    slowed = t("hw_slowdown_frac") > gates.hw_slowdown_frac
    braked = (bits & HW_POWER_BRAKE) > 0
    thermal = ((bits & HW_THERMAL) > 0) | hot
    cause = np.where(braked | ~thermal, "power", "thermal")
    emit(
        slowed,
        metric="hw_slowdown_frac",
        reference=gates.hw_slowdown_frac,
        cause=cause,
        action=np.where(cause == "power", "check_power", "check_cooling"),
        also=cause,
        reason=lambda f, _, c: (
            f"hardware slowdown active {f * 100:.0f} % of the benchmark"
            + (
                " (power brake): check the PSU, PDU and BMC power-capping events"
                if c == "power"
                else " (thermal): check fans, airflow and inlet temperature"
            )
        ),
    )
    emit(
        hot & ~slowed,
        metric="temp_max_c",
        reference=slowdown,
        severity="warn",
        cause="thermal",
        action="check_cooling",
        reason=lambda tv, sv: (
            f"peaked at {tv:.0f} °C, within {gates.temp_margin_c:g} °C of its slowdown "
            f"threshold {sv:.0f} °C: check fans, airflow and inlet temperature"
        ),
    )

    default = t("power_limit_default_w")
    emit(
        t("power_limit_w") < default * (1 - gates.power_limit_tolerance_pct / 100),
        metric="power_limit_w",
        reference=default,
        cause="config",
        action="fix_config",
        reason=lambda lv, dv: (
            f"enforced power limit {lv:.0f} W is below the default {dv:.0f} W: restore it "
            "(nvidia-smi -pl) and fix the BMC or host power policy"
        ),
    )
    emit(
        t("ecc_sbe_volatile") >= gates.sbe_volatile_warn,
        metric="ecc_sbe_volatile",
        reference=gates.sbe_volatile_warn,
        severity="warn",
        cause="ecc",
        action="run_field_diag",
        reason=lambda n, _: (
            f"{n:.0f} corrected single-bit ECC errors since the last reset (SBE storm): "
            "schedule diagnostics; progression to uncorrectable errors → RMA"
        ),
    )

    parts = [_xid_findings(run, policy), _nic_findings(run, policy), _error_findings(run), _gpu_count_findings(run)]
    return concat_findings([*on_gpus.parts, *parts])


def _xid_findings(run: RunIndex, policy: Policy) -> pd.DataFrame:
    rows = run.rows_of("xid")
    if len(rows) == 0:
        return empty_findings()
    events = pd.DataFrame({"eid": run.eid[rows], "xid": run.value[rows].astype(np.int64)})
    counts = events.groupby(["eid", "xid"], sort=True).size().rename("count").reset_index()
    rules = xid_rules().reindex(counts["xid"])
    unknown = rules["klass"].isna().to_numpy()
    rules = rules.fillna(
        {
            "klass": "unknown",
            "severity": "warn",
            "repeat_only": False,
            "cause": "xid",
            "action": "retest",
            "ticket": "remediation",
            "mnemonic": "not in the Xid catalog",
        }
    )
    severity = rules["severity"].to_numpy(dtype=object).copy()
    repeat_only = rules["repeat_only"].to_numpy(dtype=bool)
    count = counts["count"].to_numpy()
    severity[repeat_only & (count < policy.gates.xid_repeat_warn)] = "note"
    eids = counts["eid"].to_numpy()
    advice = {
        "application": "an application fault, not the GPU's",
        "informational": "informational",
        "reset": "reset the GPU, then re-certify; recurring → hardware",
        "reboot": "drain and reboot the node; recurring → reseat, riser or RMA",
        "workflow": "drain and reset the GPU, then re-certify",
        "monitor": "recurring: schedule diagnostics; a sustained storm → RMA",
        "rma": "an RMA candidate: run the field diagnostic",
        "physical": "check the node's mechanicals and firmware",
        "unknown": "an XID gpucert does not classify: re-test and read the kernel log",
    }
    reason = [
        f"XID {x} ({m.split(' / ')[0]}) ×{c}: {advice.get(k, k)}" + (" (XID not in NVIDIA's catalog)" if u else "")
        for x, m, c, k, u in zip(counts["xid"], rules["mnemonic"], count, rules["klass"], unknown, strict=True)
    ]
    is_note = severity == "note"
    return entity_findings(
        run,
        eids,
        severity=np.array([SEVERITY[s] for s in severity], dtype=np.int64),
        rank="gate",
        metric="xid",
        value=counts["xid"].to_numpy(dtype=float),
        reference_kind=np.where(is_note, "", "gate"),
        cause=np.where(is_note, "", rules["cause"].to_numpy(dtype=object)),
        action=np.where(is_note, "none", rules["action"].to_numpy(dtype=object)),
        ticket=np.where(is_note, "none", rules["ticket"].to_numpy(dtype=object)),
        reason=reason,
    )


#: A port this much below the rate it is compared with is trained down (rates are discrete: 100, 200, 400…).
_RATE_TOLERANCE = 0.01


def _nic_findings(run: RunIndex, policy: Policy) -> pd.DataFrame:
    """The node's RDMA ports (docs/reference/causes-and-actions.md, "Inter-node network"), one finding each:
    a port not ACTIVE; an active port slower than ``gates.ib_rate_gbps`` or, without it, than the node's
    fastest (a node whose NICs differ by design, 400 Gb/s compute and 200 Gb/s storage ports, sets the
    rate, or leaves the others out in the payload's ``--ib-devices``); an error counter that rose more than
    its gate during the run. All fail, cause ``network``."""
    gates = policy.gates
    on_nodes = _Gates(run, SCOPE_NODE)
    t = on_nodes.t

    def emit(mask: np.ndarray, **gate: Any) -> None:
        on_nodes.emit(mask, cause="network", **gate)

    ports, active = t("ib_ports"), t("ib_ports_active")
    emit(
        active < ports,
        metric="ib_ports_active",
        reference=ports,
        action="reseat_nic",
        reason=lambda a, n: (
            f"{n - a:.0f} of {n:.0f} RDMA ports down: bring {'it' if n - a == 1 else 'them'} up, "
            "reseat the cable, transceiver and NIC; if it persists replace the cable, transceiver or NIC"
        ),
    )
    slowest, fastest = t("ib_rate_min_gbps"), t("ib_rate_max_gbps")
    retrain = "trained down: reseat or replace its cable or transceiver, then check the switch port's speed"
    expected = gates.ib_rate_gbps
    below = slowest < expected * (1 - _RATE_TOLERANCE) if expected is not None else np.zeros(len(slowest), dtype=bool)
    emit(
        below,
        metric="ib_rate_min_gbps",
        reference=float(expected or 0),
        action="check_cable",
        reason=lambda s, e: f"an RDMA port at {s:g} Gb/s, below the expected {e:g}: {retrain}",
    )
    emit(
        (expected is None) & (slowest < fastest * (1 - _RATE_TOLERANCE)),
        metric="ib_rate_min_gbps",
        reference=fastest,
        action="check_cable",
        reason=lambda s, f: f"an RDMA port at {s:g} Gb/s, the others at up to {f:g}: {retrain}",
    )
    seen: dict[str, Callable[[float], str]] = {
        "ib_link_downed": lambda n: (
            f"link downed {'once' if n == 1 else f'{n:.0f} times'} during the run: a flapping link"
        ),
        "ib_symbol_errors": lambda n: f"{n:.0f} symbol errors during the run: a marginal link",
        "ib_rcv_errors": lambda n: f"{n:.0f} packets received with errors during the run",
    }

    def counted(words: Callable[[float], str]) -> Callable[[float, float], str]:
        return lambda n, g: (
            f"{words(n)} (gate {g:g}, summed over the node's RDMA ports): check the cable and transceiver, "
            "then the switch port"
        )

    for metric, words in seen.items():
        limit = float(getattr(gates, metric))
        emit(t(metric) > limit, metric=metric, reference=limit, action="check_cable", reason=counted(words))
    return concat_findings(on_nodes.parts)


def _error_findings(run: RunIndex) -> pd.DataFrame:
    rows = run.rows_of("error")
    if len(rows) == 0:
        return empty_findings()
    counts = pd.Series(1, index=run.eid[rows]).groupby(level=0).size()
    eids = counts.index.to_numpy(dtype=np.int64)
    reason = [
        f"{n} benchmark step(s) failed on this {SCOPE_NAMES[s]}: see the run's log"
        for n, s in zip(counts.to_numpy(), run.scope[eids], strict=True)
    ]
    return entity_findings(
        run,
        eids,
        severity="inconclusive",
        rank="missing",
        metric="error",
        value=counts.to_numpy(dtype=float),
        action="retest",
        reason=reason,
    )


def _gpu_count_findings(run: RunIndex) -> pd.DataFrame:
    """A node that sees fewer GPUs than it should: the node fails, and so does each GPU that is missing."""
    nodes = np.flatnonzero(run.scope == SCOPE_NODE)
    seen = run.telemetry[nodes, MCODE["gpu_count"]]
    expected = run.telemetry[nodes, MCODE["gpu_count_expected"]]
    short = seen < expected
    if not short.any():
        return empty_findings()
    node_eids = nodes[short]
    node_finding = make_findings(
        "node",
        run.node_names(node_eids),
        severity="fail",
        rank="gate",
        metric="gpu_count",
        value=seen[short],
        reference=expected[short],
        reference_kind="gate",
        cause="xid",
        action="reboot_node",
        ticket="remediation",
        reason=[
            f"the node sees {s:.0f} of its {x:.0f} GPUs: a GPU fell off the bus or is hidden from NVML; "
            "drain and reboot; recurring → reseat, riser or RMA"
            for s, x in zip(seen[short], expected[short], strict=True)
        ],
    )

    # Every GPU index the short nodes should have, as (node, index) keys; those that report nothing fail.
    short_codes = run.node_code[node_eids]
    want = expected[short].astype(np.int64)
    grid_node = np.repeat(short_codes, want)
    grid_gpu = np.arange(want.sum()) - np.repeat(np.cumsum(want) - want, want)
    grid = grid_node * 4096 + grid_gpu
    gpus = np.flatnonzero((run.scope == SCOPE_GPU) & np.isin(run.node_code, short_codes))
    reporting = gpus[np.isfinite(run.telemetry[gpus]).any(axis=1) | _has_perf(run)[gpus]]
    missing = ~np.isin(grid, run.node_code[reporting] * 4096 + run.gpu[reporting])
    xid_rows = run.rows_of("xid")
    lost = run.eid[xid_rows[run.value[xid_rows] == 79]]
    with79 = np.isin(grid[missing], run.node_code[lost] * 4096 + run.gpu[lost])
    gpu_finding = make_findings(
        "gpu",
        np.asarray(run.nodes, dtype=object)[grid_node[missing]],
        gpu=grid_gpu[missing],
        severity="fail",
        rank="missing",
        metric="gpu_count",
        reference_kind="gate",
        cause=np.where(with79, "xid", "unknown"),
        action="reboot_node",
        ticket="remediation",
        reason=[
            f"GPU {g} should be on this node but reports nothing" + (" (XID 79: fallen off the bus)" if w else "")
            for g, w in zip(grid_gpu[missing], with79, strict=True)
        ],
    )
    return concat_findings([node_finding, gpu_finding])


def _has_perf(run: RunIndex) -> np.ndarray:
    has = np.zeros(run.n_entities, dtype=bool)
    # By the registry's kind, not the name: a NIC's port rate ends in "_gbps" too and is telemetry.
    has[run.eid[IS_PERF[run.mcode]]] = True
    return has


def missing_findings(run: RunIndex, measured: pd.DataFrame) -> pd.DataFrame:
    """Inconclusive findings for results most of an entity's cohort has but it lacks."""
    present = np.zeros((run.n_entities, N_METRICS), dtype=bool)
    present[measured["eid"].to_numpy(), measured["mcode"].to_numpy()] = True
    has_data = present.any(axis=1) | np.isfinite(run.telemetry).any(axis=1)
    cohort = run.scope * (len(run.models) + 1) + run.model_code
    # What most of each cohort (scope × model) measured, among the entities with any data.
    expected = np.zeros_like(present)
    with_data = np.flatnonzero(has_data)
    for members in group_positions(cohort[with_data]):
        rows = with_data[members]
        expected[rows] = present[rows].mean(axis=0) >= 0.5
    lacking = expected & ~present & has_data[:, None]
    eids, mcodes = np.nonzero(lacking)
    if len(eids) == 0:
        return empty_findings()
    names = np.array(METRIC_NAMES, dtype=object)[mcodes]
    return entity_findings(
        run,
        eids,
        severity="inconclusive",
        rank="missing",
        metric=names,
        action="retest",
        reason=[f"no {m} result although its peers have one" for m in names],
    )


def node_wide_gate_findings(run: RunIndex, findings: pd.DataFrame, policy: Policy) -> pd.DataFrame:
    """Node findings where most GPUs of a node carry a gate with the same cause (power brake, FM)."""
    gpu_gates = findings[
        (findings["scope"] == "gpu")
        & (findings["rank"] >= 3)
        & (findings["severity"] >= SEVERITY["warn"])
        & findings["cause"].isin(["power", "thermal", "config", "nvlink", "pcie"])
    ]
    if gpu_gates.empty:
        return empty_findings()
    per = (
        gpu_gates.groupby(["node", "cause"])
        .agg(gpus=("gpu", "nunique"), severity=("severity", "max"), action=("action", "first"))
        .reset_index()
    )
    gpus = np.flatnonzero(run.scope == SCOPE_GPU)
    per_node = pd.Series(run.node_code[gpus]).value_counts()
    per_node.index = np.asarray(run.nodes)[per_node.index.to_numpy()]
    total = per_node.reindex(per["node"]).to_numpy()
    wide = per[per["gpus"].to_numpy() >= np.maximum(2, policy.node_wide.cause_share * total)]
    if wide.empty:
        return empty_findings()
    # FM degraded mode (links down on every GPU) is baseboard / NVSwitch work
    # (docs/reference/causes-and-actions.md, "Remediation playbook").
    ticket = np.where(wide["cause"] == "nvlink", "replacement", "remediation")
    words = {
        "power": "power delivery: check the PSU, PDU and BMC power capping",
        "thermal": "cooling: check the rack's airflow and CRAH",
        "config": "configuration: fix the node's power or host policy",
        "nvlink": "the NVLink fabric: Fabric Manager degraded mode or an NVSwitch; reset, restart FM, then baseboard",
        "pcie": "the PCIe complex: check the host's BIOS and risers",
    }
    return make_findings(
        "node",
        wide["node"],
        severity=wide["severity"],
        rank="gate",
        reference_kind="gate",
        cause=wide["cause"],
        action=wide["action"],
        ticket=ticket,
        reason=[
            f"{g} GPUs of this node share one fault — a node-wide cause, {words[c]}"
            for g, c in zip(wide["gpus"], wide["cause"], strict=True)
        ],
    )
