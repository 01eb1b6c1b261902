"""Stage 0 (docs/design/verdict-engine.md, "Stage 0: gates"): rules on telemetry and events that need no statistics.

A gate names its cause from the signal itself (a PCIe link below its maximum is ``pcie``; a row-remap
failure is ``row_remap``; an RDMA port down, trained down or flapping is ``network``), and its action and
ticket from docs/reference/causes-and-actions.md, "Remediation playbook". This module also owns what is
*missing*: a GPU the node should have but that reports nothing fails (docs/design/data-contracts.md,
"Verdicts"), while a benchmark step that errored or a result that is absent, without a GPU signal, is
inconclusive.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from ..policy import Policy
from ..xid import xid_rules
from ._findings import SEVERITY, concat_findings, empty_findings, make_findings
from ._index import IS_PERF, MCODE, METRIC_NAMES, N_METRICS, SCOPE_GPU, SCOPE_NODE, RunIndex, group_positions

__all__ = ["gate_findings", "missing_findings", "node_wide_gate_findings"]

HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE, SW_POWER_CAP = 0x08, 0x20, 0x40, 0x80, 0x04


def _gpu_findings(
    run: RunIndex,
    eids: np.ndarray,
    *,
    severity: str,
    cause: object,
    action: object,
    ticket: object,
    metric: str,
    value: np.ndarray,
    reference: object = np.nan,
    reason: list[str],
) -> pd.DataFrame:
    return make_findings(
        "gpu",
        run.node_names(eids),
        gpu=run.gpu[eids],
        severity=severity,
        rank="gate",
        metric=metric,
        value=value,
        reference=reference,
        reference_kind="gate",
        cause=cause,
        action=action,
        ticket=ticket,
        reason=reason,
    )


def gate_findings(run: RunIndex, policy: Policy) -> pd.DataFrame:
    """Every telemetry gate, XID and benchmark error of the run."""
    gates = policy.gates
    gpus = np.flatnonzero(run.scope == SCOPE_GPU)
    parts: list[pd.DataFrame] = []

    def t(name: str) -> np.ndarray:
        column: np.ndarray = run.telemetry[gpus, MCODE[name]]
        return column

    def emit(
        mask: np.ndarray,
        *,
        metric: str,
        value: np.ndarray,
        reference: object = np.nan,
        severity: str = "fail",
        cause: object,
        action: object,
        ticket: object = "remediation",
        reason: Callable[[np.ndarray, np.ndarray], list[str]],
    ) -> None:
        """One gate: the GPUs where ``mask`` holds, with the masked value, reference and words."""

        def pick(x: object) -> object:
            return x[mask] if isinstance(x, np.ndarray) else x

        if not mask.any():
            return
        v = value[mask]
        r = np.broadcast_to(
            np.asarray(reference, dtype=float) if not isinstance(reference, np.ndarray) else reference, mask.shape
        )[mask]
        parts.append(
            _gpu_findings(
                run,
                gpus[mask],
                severity=severity,
                cause=pick(cause),
                action=pick(action),
                ticket=pick(ticket),
                metric=metric,
                value=v,
                reference=r,
                reason=reason(v, r),
            )
        )

    failure = t("remapped_rows_failure")
    emit(
        failure > 0,
        metric="remapped_rows_failure",
        value=failure,
        cause="row_remap",
        action="run_field_diag",
        ticket="replacement",
        reason=lambda v, r: (
            [
                "row-remap failure: a memory bank has no spare rows left; drain, reset the GPU "
                "and run the field diagnostic (NVIDIA's RMA criterion when it confirms)"
            ]
            * len(v)
        ),
    )

    dbe, pending = t("ecc_dbe_volatile"), t("remapped_rows_pending") > 0
    emit(
        dbe > 0,
        metric="ecc_dbe_volatile",
        value=dbe,
        reference=0.0,
        cause=np.where(pending, "row_remap", "ecc"),
        action="reset_gpu",
        reason=lambda v, r: [
            f"{int(n)} uncorrectable ECC error(s) since the last reset"
            + (
                "; a row remap is pending: reset the GPU to apply it, then re-certify"
                if p
                else ": reset the GPU and re-certify; recurring → RMA"
            )
            for n, p in zip(v, pending[dbe > 0], strict=True)
        ],
    )
    emit(
        pending & ~(dbe > 0),
        metric="remapped_rows_pending",
        value=t("remapped_rows_pending"),
        severity="warn",
        cause="row_remap",
        action="reset_gpu",
        reason=lambda v, r: ["row remap pending: reset the GPU at the next idle window to apply it"] * len(v),
    )

    gen, width = t("pcie_gen"), t("pcie_width")
    emit(
        gen < t("pcie_gen_max"),
        metric="pcie_gen",
        value=gen,
        reference=t("pcie_gen_max"),
        cause="pcie",
        action="reboot_node",
        reason=lambda v, r: [
            f"PCIe link trained down to Gen{g:.0f} of Gen{m:.0f} under load: reboot to "
            "retrain; if it persists reseat the GPU, riser or cable"
            for g, m in zip(v, r, strict=True)
        ],
    )
    emit(
        width < t("pcie_width_max"),
        metric="pcie_width",
        value=width,
        reference=t("pcie_width_max"),
        cause="pcie",
        action="reseat",
        reason=lambda v, r: [
            f"PCIe link at x{w:.0f} of x{m:.0f}: reseat the GPU or riser; if it persists "
            "replace the riser, retimer or GPU"
            for w, m in zip(v, r, strict=True)
        ],
    )
    replays = t("pcie_replays_per_min")
    emit(
        replays > gates.pcie_replays_per_min,
        metric="pcie_replays_per_min",
        value=replays,
        reference=gates.pcie_replays_per_min,
        cause="pcie",
        action="reseat",
        ticket=np.where(replays > gates.pcie_replays_replace_per_min, "replacement", "remediation"),
        reason=lambda v, r: [
            f"{n:.0f} PCIe replays/min (gate {gates.pcie_replays_per_min:g}): marginal "
            "signal integrity; reseat at the next window"
            for n in v
        ],
    )

    down, crc = t("nvlink_down"), t("nvlink_crc_errors")
    emit(
        down > 0,
        metric="nvlink_down",
        value=down,
        reference=0.0,
        cause="nvlink",
        action="reset_gpu",
        reason=lambda v, r: [
            (
                f"all {n:.0f} NVLinks down: the GPU left the NVLink fabric (traffic falls back to PCIe); reset "
                "the GPU and restart Fabric Manager"
            )
            if n >= 18
            else f"{n:.0f} NVLink(s) down: reset the GPU, then reboot; the same link again → reseat or baseboard"
            for n in v
        ],
    )
    emit(
        crc > gates.nvlink_crc_errors,
        metric="nvlink_crc_errors",
        value=crc,
        reference=gates.nvlink_crc_errors,
        cause="nvlink",
        action="reset_gpu",
        reason=lambda v, r: [
            f"{n:.0f} NVLink CRC errors during certification: reset the GPU; persistent on "
            "the same link → reseat or baseboard"
            for n in v
        ],
    )

    bits = np.nan_to_num(t("clocks_event_reasons"), nan=0).astype(np.int64)
    temp, slowdown, frac = t("temp_max_c"), t("temp_slowdown_c"), t("hw_slowdown_frac")
    hot = temp >= slowdown - gates.temp_margin_c
    slowed = frac > gates.hw_slowdown_frac
    braked = (bits & HW_POWER_BRAKE) > 0
    thermal = ((bits & HW_THERMAL) > 0) | hot
    cause = np.where(braked | ~thermal, "power", "thermal")
    emit(
        slowed,
        metric="hw_slowdown_frac",
        value=frac,
        reference=gates.hw_slowdown_frac,
        cause=cause,
        action=np.where(cause == "power", "check_power", "check_cooling"),
        reason=lambda v, r: [
            f"hardware slowdown active {f * 100:.0f} % of the benchmark"
            + (
                " (power brake): check the PSU, PDU and BMC power-capping events"
                if c == "power"
                else " (thermal): check fans, airflow and inlet temperature"
            )
            for f, c in zip(v, cause[slowed], strict=True)
        ],
    )
    emit(
        hot & ~slowed,
        metric="temp_max_c",
        value=temp,
        reference=slowdown,
        severity="warn",
        cause="thermal",
        action="check_cooling",
        reason=lambda v, r: [
            f"peaked at {tv:.0f} °C, within {gates.temp_margin_c:g} °C of its slowdown "
            f"threshold {sv:.0f} °C: check fans, airflow and inlet temperature"
            for tv, sv in zip(v, r, strict=True)
        ],
    )

    limit, default = t("power_limit_w"), t("power_limit_default_w")
    emit(
        limit < default * (1 - gates.power_limit_tolerance_pct / 100),
        metric="power_limit_w",
        value=limit,
        reference=default,
        cause="config",
        action="fix_config",
        reason=lambda v, r: [
            f"enforced power limit {lv:.0f} W is below the default {dv:.0f} W: restore it "
            "(nvidia-smi -pl) and fix the BMC or host power policy"
            for lv, dv in zip(v, r, strict=True)
        ],
    )

    sbe = t("ecc_sbe_volatile")
    emit(
        sbe >= gates.sbe_volatile_warn,
        metric="ecc_sbe_volatile",
        value=sbe,
        reference=gates.sbe_volatile_warn,
        severity="warn",
        cause="ecc",
        action="run_field_diag",
        reason=lambda v, r: [
            f"{n:.0f} corrected single-bit ECC errors since the last reset (SBE storm): "
            "schedule diagnostics; progression to uncorrectable errors → RMA"
            for n in v
        ],
    )

    parts.append(_xid_findings(run, policy))
    parts.append(_nic_findings(run, policy))
    parts.append(_error_findings(run))
    parts.append(_gpu_count_findings(run))
    return concat_findings(parts)


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
    return make_findings(
        "gpu",
        run.node_names(eids),
        gpu=run.gpu[eids],
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
    nodes = np.flatnonzero(run.scope == SCOPE_NODE)
    parts: list[pd.DataFrame] = []

    def t(name: str) -> np.ndarray:
        column: np.ndarray = run.telemetry[nodes, MCODE[name]]
        return column

    def emit(
        mask: np.ndarray,
        *,
        metric: str,
        value: np.ndarray,
        reference: np.ndarray | float,
        action: str,
        reason: Callable[[np.ndarray, np.ndarray], list[str]],
    ) -> None:
        if not mask.any():
            return
        v, r = value[mask], np.broadcast_to(np.asarray(reference, dtype=float), mask.shape)[mask]
        parts.append(
            make_findings(
                "node",
                run.node_names(nodes[mask]),
                severity="fail",
                rank="gate",
                metric=metric,
                value=v,
                reference=r,
                reference_kind="gate",
                cause="network",
                action=action,
                ticket="remediation",
                reason=reason(v, r),
            )
        )

    ports, active = t("ib_ports"), t("ib_ports_active")
    emit(
        active < ports,
        metric="ib_ports_active",
        value=active,
        reference=ports,
        action="reseat_nic",
        reason=lambda v, r: [
            f"{n - a:.0f} of {n:.0f} RDMA ports down: bring {'it' if n - a == 1 else 'them'} up, reseat the "
            "cable, transceiver and NIC; if it persists replace the cable, transceiver or NIC"
            for a, n in zip(v, r, strict=True)
        ],
    )
    slowest, fastest = t("ib_rate_min_gbps"), t("ib_rate_max_gbps")
    retrain = "trained down: reseat or replace its cable or transceiver, then check the switch port's speed"
    expected = gates.ib_rate_gbps
    below = slowest < expected * (1 - _RATE_TOLERANCE) if expected is not None else np.zeros(len(nodes), dtype=bool)
    emit(
        below,
        metric="ib_rate_min_gbps",
        value=slowest,
        reference=float(expected or 0),
        action="check_cable",
        reason=lambda v, r: [
            f"an RDMA port at {s:g} Gb/s, below the expected {e:g}: {retrain}" for s, e in zip(v, r, strict=True)
        ],
    )
    emit(
        (expected is None) & (slowest < fastest * (1 - _RATE_TOLERANCE)),
        metric="ib_rate_min_gbps",
        value=slowest,
        reference=fastest,
        action="check_cable",
        reason=lambda v, r: [
            f"an RDMA port at {s:g} Gb/s, the others at up to {f:g}: {retrain}" for s, f in zip(v, r, strict=True)
        ],
    )
    seen: dict[str, Callable[[float], str]] = {
        "ib_link_downed": lambda n: f"link downed {_times(n)} during the run: a flapping link",
        "ib_symbol_errors": lambda n: f"{n:.0f} symbol errors during the run: a marginal link",
        "ib_rcv_errors": lambda n: f"{n:.0f} packets received with errors during the run",
    }

    def counted(words: Callable[[float], str]) -> Callable[[np.ndarray, np.ndarray], list[str]]:
        return lambda v, r: [
            f"{words(n)} (gate {g:g}, summed over the node's RDMA ports): check the cable and transceiver, "
            "then the switch port"
            for n, g in zip(v, r, strict=True)
        ]

    for metric, words in seen.items():
        limit = float(getattr(gates, metric))
        emit(
            t(metric) > limit,
            metric=metric,
            value=t(metric),
            reference=limit,
            action="check_cable",
            reason=counted(words),
        )
    return concat_findings(parts)


def _times(count: float) -> str:
    return "once" if count == 1 else f"{count:.0f} times"


def _error_findings(run: RunIndex) -> pd.DataFrame:
    rows = run.rows_of("error")
    if len(rows) == 0:
        return empty_findings()
    counts = pd.Series(1, index=run.eid[rows]).groupby(level=0).size()
    eids = counts.index.to_numpy(dtype=np.int64)
    scope = np.array(["gpu", "node", "pair"], dtype=object)[run.scope[eids]]
    reason = [
        f"{n} benchmark step(s) failed on this {s}: see the run's log"
        for n, s in zip(counts.to_numpy(), scope, strict=True)
    ]
    return make_findings(
        scope,
        run.node_names(eids),
        gpu=run.gpu[eids],
        peer=run.peer_names(eids),
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
    return make_findings(
        np.array(["gpu", "node", "pair"], dtype=object)[run.scope[eids]],
        run.node_names(eids),
        gpu=run.gpu[eids],
        peer=run.peer_names(eids),
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
