"""The diagnosis: why a training job is slow, from the frames of :mod:`gpucert.explain._frames`.

Within a job, GPUs are peers: in synchronous training every rank does the same work per step, so the straggler
is the GPU that departs from the others (docs/design/explain.md). Per signal the telemetry is pivoted to an
(instant × GPU) matrix and each GPU is compared, instant by instant, with its peers' median; the noise scale is
the median absolute deviation across GPUs, pooled over the window so one outlier cannot widen it. A departure
must pass its gate (:data:`CLOCK_GATE` with a slowdown reason set — an idle GPU's low clock carries none, so a GPU
that merely waits is never blamed —, :data:`BUSY_GATE`, :data:`LINK_GATE`) and exceed :data:`ROBUST_Z` robust
standard deviations; its onset is the first instant from which it persists (:func:`persistent_onset`). The step
time gets one robust change point (:func:`step_change`); a suspect whose onset comes at most :data:`TIE_S` before
it is tied to it. Nothing is blamed without evidence.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from ._frames import OPTIONAL_SIGNALS, SIGNALS, SPARSE_SIGNALS, Explanation, StepChange, Suspect, check_frame
from ._grid import (
    PERSIST_WINDOW,
    ROBUST_Z,
    BoolArray,
    FloatArray,
    Grid,
    column_codes,
    equal_runs,
    nic_grid,
    persistent_onset,
    telemetry_grid,
    to_ns,
    utc,
)
from ._straggler import COLLECTIVE_GATE, POD_STEP_GATE, JobFinding, collective_grid, pod_step_grid, rank_departures

__all__ = ["DISRUPTIVE_REASONS", "SLOWDOWN_BITS", "explain", "step_change"]

#: The clock-event reasons that slow a GPU down, with the words the evidence uses.
SLOWDOWN_BITS: Mapping[int, str] = {
    0x08: "HW slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake",
    0x20: "SW thermal slowdown",
    0x04: "SW power cap",
}
_SLOWDOWN_MASK = sum(SLOWDOWN_BITS)

#: An SM clock this far below the peers' median (with a slowdown reason) departs: FALCON's 10 % shift gate.
CLOCK_GATE = 0.10
#: Busier than the peers by this much departs: 0.10 of engine activity (0..1), 10 points of utilisation.
BUSY_GATE: Mapping[str, float] = {"engine_active": 0.10, "util_pct": 10.0}
#: NVLink or PCIe throughput this far below the peers' departs (throughputs vary more than clocks).
LINK_GATE = 0.25
#: A step-time change smaller than this is not reported.
STEP_SHIFT_GATE = 0.10
#: A suspect's onset at most this long before the step-time change (or an event this close to a stall) is tied.
TIE_S = 300.0
#: A departure followed by this long in line with the peers (to the window's end) recovered: a transient.
RECOVERED_S = 600.0
#: A NIC port this far below its rated rate (the 95th percentile of its device's ports) departs.
NIC_RATE_GATE = 0.10

_POD_DISRUPTIONS = ("Evicted", "OOMKilling", "OOMKilled", "BackOff", "Killing", "Preempted", "Preempting")
_NODE_DISRUPTIONS = ("NodeNotReady", "NodeHasDiskPressure", "NodeHasMemoryPressure", "NodeHasPIDPressure", "Rebooted")
#: Kubernetes event reasons that disrupt a job: one lining up with a step stall or change is the verdict "event".
DISRUPTIVE_REASONS = frozenset(
    {*_POD_DISRUPTIONS, *_NODE_DISRUPTIONS, "FailedScheduling", "TaintManagerEviction", "Tainted"}
)
_NOTABLE_NORMAL = frozenset({"Certified", "Tainted", "Uncordoned", "Cordoned", "NodeReady", "Started", "Scheduled"})
_MAX_EVENTS_OF_NOTE = 20

_MIN_SEGMENT = 4  # change point: buckets on either side
_MAX_STEP_BUCKETS = 2000  # change point: coarser buckets beyond this many, refined at full resolution
_TIE_BONUS = 1.0  # a suspect tied to the step-time change explains the slowdown: it ranks first
_HARD_SCORE = 0.3  # an XID or ECC double-bit error alone makes a suspect, ranked below a departure
_STALL_FACTOR = 10.0  # a gap in the steps this many median step times long is a stall
_STALL_GAPS = 4.0  # ... and this many median gaps between logged steps
_XID_APPLICATION = frozenset({13, 31, 43, 45, 94})  # the workload's XIDs (gpucert.xid): never a GPU's fault


# --- small helpers ---------------------------------------------------------------------------------------------


def _nanmedian(matrix: FloatArray, axis: int) -> FloatArray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN instant has no median: NaN is the answer
        return np.asarray(np.nanmedian(matrix, axis=axis), dtype=np.float64)


def _nanmean(values: FloatArray) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmean(values)) if values.size else math.nan


def _fmt_time(ts: pd.Timestamp, with_date: bool) -> str:
    return ts.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S")


def _fmt_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _pct(value: float) -> str:
    """A signed percentage with a real minus sign: ``−48 %``."""
    return f"{value:+.0f} %".replace("-", "−")


def _share(fraction: float) -> str:
    """A fraction as a whole percentage: ``97 %``."""
    return f"{100 * fraction:.0f} %"


def _secs(value: float) -> str:
    """Seconds with the digits a step time needs: ``1.00``, ``12.5``, ``340``."""
    return f"{value:.2f}" if value < 10 else (f"{value:.1f}" if value < 100 else f"{value:,.0f}")


def _num(value: float) -> str:
    if not math.isfinite(value):
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _text(value: object) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA or value is pd.NaT:
        return None
    text = str(value)
    return text if text and text.lower() not in ("nan", "none", "<na>") else None


# --- the GPUs ---------------------------------------------------------------------------------------------------


@dataclass
class _Criterion:
    """One way a GPU departs from its peers: at which instants, against which peer median, of which values."""

    name: str
    layer: str
    departed: BoolArray  # (T × G)
    peer: FloatArray  # (T,) the peers' median
    values: FloatArray  # (T × G)


def _peer_stats(matrix: FloatArray) -> tuple[FloatArray, float, npt.NDArray[np.int64]]:
    """The peers' median per instant, the pooled robust standard deviation, and how many GPUs report per instant."""
    median = _nanmedian(matrix, axis=1)
    mad = _nanmedian(np.abs(matrix - median[:, None]), axis=1)
    finite = mad[np.isfinite(mad)]
    sigma = 1.4826 * float(np.median(finite)) if finite.size else 0.0
    counts = np.sum(~np.isnan(matrix), axis=1).astype(np.int64)
    return median, sigma, counts


def _criteria(grid: Grid) -> list[_Criterion]:
    """Every departure criterion the grid's signals allow."""
    out: list[_Criterion] = []
    vals = grid.values
    use_sigma = grid.n_columns >= 4  # with fewer GPUs the spread is the outlier's own: the gates alone decide

    def below(signal: str, gate: float) -> tuple[BoolArray, FloatArray] | None:
        matrix = vals.get(signal)
        if matrix is None:
            return None
        peer, sigma, counts = _peer_stats(matrix)
        with np.errstate(invalid="ignore", divide="ignore"):
            gap = (peer[:, None] - matrix) / np.abs(peer)[:, None]
            shortfall = peer[:, None] - matrix
        floor = ROBUST_Z * sigma if use_sigma else 0.0
        departed = (gap > gate) & (shortfall > floor) & (counts >= 2)[:, None] & (peer > 0)[:, None]
        return np.nan_to_num(departed, nan=False).astype(bool), peer

    clock = below("sm_clock_mhz", CLOCK_GATE)
    if clock is not None:
        departed, peer = clock
        reasons = vals.get("clock_event_reasons")
        if reasons is not None:
            bits = np.nan_to_num(reasons, nan=-1).astype(np.int64)
            slowed = (bits & _SLOWDOWN_MASK) != 0
            departed &= slowed | (bits < 0)  # an unknown reason at one instant does not acquit the clock
        out.append(_Criterion("clock", "gpu", departed, peer, vals["sm_clock_mhz"]))
    for signal, gate in BUSY_GATE.items():
        matrix = vals.get(signal)
        if matrix is None:
            continue
        peer, sigma, counts = _peer_stats(matrix)
        floor = max(gate, ROBUST_Z * sigma) if use_sigma else gate
        departed = np.nan_to_num((matrix - peer[:, None] > floor) & (counts >= 2)[:, None], nan=False).astype(bool)
        out.append(_Criterion(signal, "gpu", departed, peer, matrix))
    for signal, layer in (("nvlink_gbps", "nvlink"), ("pcie_gbps", "gpu")):
        low = below(signal, LINK_GATE)
        if low is not None:
            out.append(_Criterion(signal, layer, *low, vals[signal]))
    return out


@dataclass
class _Finding:
    """A departing column (GPU or NIC port) or node, before it becomes a :class:`Suspect`."""

    node: str
    gpu: int | None
    gpu_uuid: str | None
    layer: str
    score: float
    onset: int | None  # instant index on the grid
    evidence: list[str]
    hard_bits: bool = False  # carries a slowdown reason (a fault of the GPU, not of what happened to its pod)
    pod: str | None = None
    until: int | None = None  # the last instant it departed, when it recovered after (a transient)
    silent: bool = False  # found from the job's own signals, with nothing in the GPU's telemetry


def _bit_words(bits: npt.NDArray[np.int64], peer_bits: npt.NDArray[np.int64]) -> list[str]:
    """The slowdown reasons a GPU has and its peers rarely do, as "HW thermal slowdown (0x40) set 97 %"."""
    known, peers_known = bits[bits >= 0], peer_bits[peer_bits >= 0]
    if not known.size:
        return []
    words = []
    for bit, name in SLOWDOWN_BITS.items():
        own = float(np.mean((known & bit) != 0))
        peers = float(np.mean((peers_known & bit) != 0)) if peers_known.size else 0.0
        if own >= 0.2 and own - peers >= 0.2:
            words.append(f"{name} (0x{bit:02x}) set {_share(own)}")
    return words


def _gpu_findings(grid: Grid, with_date: bool) -> list[_Finding]:
    """The GPUs that depart from their peers, each with its onset and evidence."""
    if grid.empty:
        return []
    criteria = _criteria(grid)
    onsets = {c.name: persistent_onset(c.departed) for c in criteria}
    findings: list[_Finding] = []
    vals = grid.values
    cols = sorted({int(g) for c in criteria for g in np.flatnonzero(onsets[c.name] >= 0)})
    for g in cols:
        hits = [(c, int(onsets[c.name][g])) for c in criteria if onsets[c.name][g] >= 0]
        onset = min(t for _, t in hits)
        since = slice(onset, grid.n_times)
        scored: list[tuple[float, _Criterion, str]] = []
        hard_bits = False
        for crit, t in hits:
            dep = crit.departed[t:, g]
            persistence = float(dep.mean())
            at = np.flatnonzero(crit.departed[:, g])
            at = at[at >= t]
            own = float(np.median(crit.values[at, g]))
            peer = float(np.median(crit.peer[at]))
            frac_text = f"departed {_share(persistence)} of the {len(dep)} instants since"
            when = _fmt_time(grid.at(t), with_date)
            rel = own / peer - 1 if peer else math.nan
            severity = -rel
            if crit.name == "clock":
                sentence = f"SM clock {own:,.0f} MHz vs peers' {peer:,.0f} ({_pct(100 * rel)}) from {when}"
                reasons = vals.get("clock_event_reasons")
                if reasons is not None:
                    bits = np.nan_to_num(reasons[at, g], nan=-1).astype(np.int64)
                    peer_bits = np.nan_to_num(np.delete(reasons[at], g, axis=1), nan=-1).astype(np.int64).ravel()
                    words = _bit_words(bits, peer_bits)
                    hard_bits = hard_bits or bool(((bits[bits >= 0] & _SLOWDOWN_MASK) != 0).any())
                    if words:
                        sentence += " with " + ", ".join(words) + " of the time"
                else:
                    sentence += " (no clock-event reasons were scraped)"
                sentence += f"; {frac_text}"
            elif crit.name in BUSY_GATE:
                engine = crit.name == "engine_active"
                label, unit, full = ("engine activity", "", 1.0) if engine else ("utilisation", " %", 100.0)
                sentence = (
                    f"{label} {own:.2f}{unit} vs peers' {peer:.2f}{unit} from {when}: busy while its peers "
                    f"wait; {frac_text}"
                )
                severity = (own - peer) / full
            else:
                label = "NVLink" if crit.name == "nvlink_gbps" else "PCIe"
                sentence = (
                    f"{label} throughput {_num(own)} GB/s vs peers' {_num(peer)} ({_pct(100 * rel)}) "
                    f"from {when}; {frac_text}"
                )
            scored.append((max(0.0, severity) * persistence, crit, sentence))
        scored.sort(key=lambda s: -s[0])
        best_score, best, _ = scored[0]
        score = best_score + 0.25 * sum(s for s, _, _ in scored[1:]) + (0.25 if hard_bits else 0.0)
        evidence = [s for _, _, s in scored] + _corroboration(grid, g, since)
        last = max(int(np.flatnonzero(c.departed[:, g])[-1]) for c, _ in hits)
        until = last if _recovered(grid, g, last) else None
        gpu = grid.index[g] if grid.index[g] >= 0 else None
        node, pod = grid.nodes[g], grid.pods[g]
        findings.append(_Finding(node, gpu, grid.ids[g], best.layer, score, onset, evidence, hard_bits, pod, until))
    return findings


def _recovered(grid: Grid, g: int, last: int) -> bool:
    """Whether column ``g`` stopped departing at instant ``last`` and was seen in line with its peers for at
    least :data:`RECOVERED_S` (and :data:`PERSIST_WINDOW` instants) after it: a transient, not a standing fault."""
    step_s = grid.step_ns / 1e9
    needed = max(PERSIST_WINDOW, math.ceil(RECOVERED_S / step_s))
    after = slice(last + 1, grid.n_times)
    seen = max((int(np.isfinite(m[after, g]).sum()) for m in grid.values.values()), default=0)
    return seen >= needed


def _corroboration(grid: Grid, g: int, since: slice) -> list[str]:
    """Temperature, power and violation time of GPU ``g`` against its peers since its onset, where they differ."""
    lines = []
    peers = np.ones(grid.n_columns, dtype=bool)
    peers[g] = False
    for signal, label, unit, threshold, relative in (
        ("temp_c", "temperature", " °C", 5.0, False),
        ("power_w", "power", " W", 0.10, True),
    ):
        m = grid.values.get(signal)
        if m is None or not peers.any():
            continue
        own = _nanmean(m[since, g])
        peer = float(np.nanmedian(m[since][:, peers])) if np.isfinite(m[since][:, peers]).any() else math.nan
        if not (math.isfinite(own) and math.isfinite(peer)):
            continue
        diff = own - peer
        if relative and peer and abs(diff / peer) >= threshold:
            lines.append(f"{label} {own:,.0f}{unit} vs peers' {peer:,.0f}{unit} ({_pct(100 * diff / peer)})")
        elif not relative and abs(diff) >= threshold:
            lines.append(f"{label} {own:.0f}{unit} vs peers' {peer:.0f}{unit} ({diff:+.0f}{unit})".replace("-", "−"))
    for signal, label in (("thermal_violation_frac", "thermal"), ("power_violation_frac", "power")):
        m = grid.values.get(signal)
        if m is None:
            continue
        own = _nanmean(m[since, g])
        peer = float(np.nanmedian(m[since][:, peers])) if peers.any() and np.isfinite(m[since][:, peers]).any() else 0.0
        if math.isfinite(own) and own >= 0.05 and own - peer >= 0.05:
            lines.append(f"{label} violation {_share(own)} of the time vs peers' {_share(peer)}")
    return lines


#: PCIe generation → GT/s per lane: a link's speed is this × its width.
_PCIE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
#: PCIe replays per minute below this are noise, whatever the peers do.
REPLAY_FLOOR_PER_MIN = 10.0
#: Single-bit ECC errors in the window below this are noise; above it, and this many times the peers' worst
#: ordinary count (their 90th percentile), they are a signal.
SBE_FLOOR = 100.0
SBE_PEER_FACTOR = 10.0


def _link_text(link: Mapping[str, float]) -> str:
    """A PCIe link (its ``gen`` and ``width``) as ``Gen5 x16``, leaving out what was not read."""
    gen, width = link.get("gen", math.nan), link.get("width", math.nan)
    return " ".join(text for v, text in ((gen, f"Gen{gen:.0f}"), (width, f"x{width:.0f}")) if math.isfinite(v)) or "n/a"


def _link_speed(link: Mapping[str, float]) -> float:
    """A PCIe link's GT/s: its generation's per lane (:data:`_PCIE_GTS`) × its width, a figure not read as 1."""
    gen, width = link.get("gen", math.nan), link.get("width", math.nan)
    return (_PCIE_GTS.get(round(gen), 1.0) if math.isfinite(gen) else 1.0) * (width if math.isfinite(width) else 1.0)


def _error_signs(grid: Grid, with_date: bool) -> dict[int, tuple[int, list[str], float]]:
    """Per GPU column with an error or a PCIe or memory sign: (first instant, evidence lines, score).

    * an XID (not the workload's) or an ECC double-bit error (with the GPU's PCIe replays since): a suspect on
      its own, :data:`_HARD_SCORE` however many;
    * a link trained below its maximum (generation or width) while its peers run at theirs: links train down
      when idle, so only a link below both its own maximum and its peers' current state counts;
    * PCIe replays per minute above the peers' (their median plus :data:`ROBUST_Z` robust deviations, three
      times their 90th percentile, and :data:`REPLAY_FLOOR_PER_MIN`) for most of the instants from its onset
      on: noisy peers raise the bar, bursts do not count;
    * single-bit ECC errors over the window above :data:`SBE_FLOOR` and :data:`SBE_PEER_FACTOR` × the peers';
    * row remapping failed or pending, uncorrectable remapped rows rising.
    """
    out: dict[int, tuple[int, list[str], float]] = {}
    if grid.empty:
        return out
    vals = grid.values

    def add(col: int, first: int, line: str, score: float) -> None:
        f0, lines, s0 = out.get(col, (first, [], 0.0))
        out[col] = (min(f0, first), [*lines, line], s0 + score)

    xid = vals.get("xid")
    if xid is not None:
        hit = np.nan_to_num(xid, nan=0.0) > 0
        hit &= ~np.isin(np.nan_to_num(xid, nan=0.0).astype(np.int64), list(_XID_APPLICATION))
        for g in np.flatnonzero(hit.any(axis=0)):
            at = np.flatnonzero(hit[:, g])
            codes = sorted({int(v) for v in xid[at, g]})
            line = (
                f"XID {', '.join(map(str, codes))} from {_fmt_time(grid.at(at[0]), with_date)} "
                f"({len(at)} instant{'s' if len(at) != 1 else ''})"
            )
            add(int(g), int(at[0]), line, _HARD_SCORE)
    dbe = vals.get("ecc_dbe")
    if dbe is not None:
        hit = np.nan_to_num(dbe, nan=0.0) > 0
        for g in np.flatnonzero(hit.any(axis=0)):
            at = np.flatnonzero(hit[:, g])
            total = float(np.nansum(dbe[at, g]))
            plural = "s" if total != 1 else ""
            line = f"{total:,.0f} ECC double-bit error{plural} from {_fmt_time(grid.at(at[0]), with_date)}"
            add(int(g), int(at[0]), line, 0.0 if int(g) in out else _HARD_SCORE)
    replays = vals.get("pcie_replays_per_min")
    if replays is not None:
        for col, (first, lines, _) in out.items():
            rate = _nanmean(replays[first:, col])
            if math.isfinite(rate) and rate >= 1:
                lines.append(f"{rate:,.0f} PCIe replays per minute")

    links = {name: m for name in ("gen", "width") if (m := vals.get(f"pcie_link_{name}")) is not None}
    if links:
        down = np.zeros((grid.n_times, grid.n_columns), dtype=bool)
        refs: dict[str, FloatArray] = {}
        for name, cur in links.items():
            top, peer = vals.get(f"pcie_link_{name}_max"), _nanmedian(cur, axis=1)[:, None]
            ref = np.where(np.isfinite(top), top, peer) if top is not None else np.broadcast_to(peer, cur.shape)
            refs[name] = np.asarray(ref, dtype=np.float64)
            down |= np.nan_to_num((cur < ref) & (cur < peer), nan=False).astype(bool)
        onsets = persistent_onset(down)
        for g in np.flatnonzero(onsets >= 0):
            t = int(onsets[g])
            at = np.flatnonzero(down[t:, g]) + t
            # The link's generation and width as it ran, at their maximum, and as its peers ran.
            link = {name: float(np.median(cur[at, g])) for name, cur in links.items()}
            top_link = {name: float(np.median(refs[name][at, g])) for name in links}
            alone = grid.n_columns < 2
            peer_link = {n: float(np.nanmedian(np.delete(m[at], g, axis=1))) for n, m in links.items() if not alone}
            full = _link_speed(top_link)
            lost = max(0.0, 1.0 - _link_speed(link) / full) if full > 0 else 0.0
            persistence = float(down[t:, g].mean())
            line = (
                f"PCIe link trained down to {_link_text(link)} vs its maximum {_link_text(top_link)} (peers run "
                f"{_link_text(peer_link)}) from {_fmt_time(grid.at(t), with_date)}: {_share(lost)} of its host "
                f"bandwidth lost; {_share(persistence)} of the instants since"
            )
            add(int(g), t, line, max(_HARD_SCORE, lost * persistence))

    if replays is not None and grid.n_columns >= 2:
        peer, sigma, counts = _peer_stats(replays)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            upper = np.nanpercentile(replays, 90, axis=1)
        bar = np.fmax(np.fmax(peer + ROBUST_Z * sigma, 2.0 * upper), REPLAY_FLOOR_PER_MIN)
        high = np.nan_to_num((replays > bar[:, None]) & (counts >= 2)[:, None], nan=False).astype(bool)
        onsets = persistent_onset(high)
        for g in np.flatnonzero(onsets >= 0):
            t = int(onsets[g])
            if float(high[t:, g].mean()) < 0.5:
                continue  # bursts a noisy GPU has now and then: not a link that went bad
            at = np.flatnonzero(high[t:, g]) + t
            own = float(np.median(replays[at, g]))
            before = replays[:t, g]
            history = (
                f", {_num(float(np.nanmedian(before)))} before" if np.isfinite(before).sum() >= PERSIST_WINDOW else ""
            )
            since_share = _share(float(high[t:, g].mean()))
            line = (
                f"PCIe replays {_num(own)} per minute vs peers' {_num(float(np.nanmedian(peer[at])))}{history} "
                f"from {_fmt_time(grid.at(t), with_date)}; {since_share} of the instants since"
            )
            add(int(g), t, line, _HARD_SCORE)

    sbe = vals.get("ecc_sbe")
    if sbe is not None and grid.n_columns >= 2:
        totals = np.nansum(np.clip(np.nan_to_num(sbe, nan=0.0), 0, None), axis=0)
        for g in np.flatnonzero(totals >= SBE_FLOOR):
            peers = np.delete(totals, g)
            usual = float(np.percentile(peers, 90)) if peers.size else 0.0
            if totals[g] < SBE_PEER_FACTOR * max(usual, 1.0):
                continue
            cum = np.cumsum(np.clip(np.nan_to_num(sbe[:, g], nan=0.0), 0, None))
            first = int(np.searchsorted(cum, 0.1 * totals[g]))
            line = (
                f"{totals[g]:,.0f} single-bit ECC errors in the window vs at most {usual:,.0f} on its peers, "
                f"from {_fmt_time(grid.at(first), with_date)}: its memory is wearing (ECC)"
            )
            add(int(g), first, line, _HARD_SCORE)

    for signal, words in (
        ("row_remap_failure", "row remapping failed (ECC): the GPU needs replacing"),
        ("row_remap_pending", "a row remap is pending (ECC): the GPU needs a reset"),
    ):
        m = vals.get(signal)
        if m is None:
            continue
        hit = np.nan_to_num(m, nan=0.0) > 0
        for g in np.flatnonzero(hit.any(axis=0)):
            first = int(np.flatnonzero(hit[:, g])[0])
            add(int(g), first, f"{words}, from {_fmt_time(grid.at(first), with_date)}", _HARD_SCORE)
    for signal, kind, weight in (
        ("remapped_rows_uncorrectable", "uncorrectable", _HARD_SCORE),
        ("remapped_rows_correctable", "correctable", 0.5 * _HARD_SCORE),
    ):
        rows = vals.get(signal)
        if rows is None:
            continue
        rows = np.nan_to_num(rows, nan=0.0)  # read only where non-zero: an absence is zero
        rose = np.diff(rows, axis=0) > 0
        for g in np.flatnonzero(rose.any(axis=0)):
            first = int(np.flatnonzero(rose[:, g])[0]) + 1
            grown = float(rows[:, g].max() - rows[:, g].min())
            line = f"{grown:,.0f} more {kind} remapped rows (ECC) from {_fmt_time(grid.at(first), with_date)}"
            add(int(g), first, line, weight)
    return out


def _merge_nodes(findings: list[_Finding], grid: Grid, with_date: bool) -> list[_Finding]:
    """Most GPUs of one node departing together is the node's finding (cooling, power), not one GPU's each."""
    per_node: dict[str, list[_Finding]] = {}
    for f in findings:
        if f.gpu is not None and f.layer == "gpu":
            per_node.setdefault(f.node, []).append(f)
    gpus_on = pd.Series(grid.nodes).value_counts().to_dict() if grid.n_columns else {}
    merged: list[_Finding] = []
    absorbed: set[int] = set()
    for node, group in per_node.items():
        total = int(gpus_on.get(node, 0))
        if len(group) < 2 or len(group) < 0.75 * total or total < 2 or len(group) >= 0.5 * grid.n_columns:
            continue
        onset = min(f.onset for f in group if f.onset is not None)
        best = max(group, key=lambda f: f.score)
        lead = [
            f"{len(group)} of its {total} GPUs depart from their peers together from "
            f"{_fmt_time(grid.at(onset), with_date)}",
            f"GPU {best.gpu}: {best.evidence[0]}",
        ]
        hard_bits = any(f.hard_bits for f in group)
        merged.append(
            _Finding(node, None, None, "node", best.score + 0.1, onset, lead + best.evidence[1:], hard_bits, best.pod)
        )
        absorbed.update(id(f) for f in group)
    return merged + [f for f in findings if id(f) not in absorbed]


# --- the network ------------------------------------------------------------------------------------------------


def _nic_findings(
    nic: pd.DataFrame | None,
    step_s: float,
    window: tuple[pd.Timestamp, pd.Timestamp],
    t0_ns: int | None,
    with_date: bool,
) -> tuple[list[_Finding], Grid | None]:
    """The nodes whose RDMA ports run below their rated rate or count errors, one finding per node."""
    if nic is None or not len(nic):
        return [], None
    grid = nic_grid(nic, step_s=step_s, window=window, t0_ns=t0_ns)
    if grid.empty:
        return [], grid
    per_port: dict[int, tuple[float, int, list[str]]] = {}
    rate = grid.values.get("rate_gbps")
    if rate is not None:
        devices = np.asarray([d or "" for d in grid.ids], dtype=object)
        rated = np.full(grid.n_columns, np.nan)
        for device in set(devices.tolist()):
            cols = devices == device
            samples = rate[:, cols]
            samples = samples[np.isfinite(samples)]
            if samples.size:
                rated[cols] = float(np.percentile(samples, 95))
        with np.errstate(invalid="ignore", divide="ignore"):
            short = (rated[None, :] - rate) / rated[None, :]
        departed = np.nan_to_num(short > NIC_RATE_GATE, nan=False).astype(bool)
        onsets = persistent_onset(departed)
        for p in np.flatnonzero(onsets >= 0):
            t = int(onsets[p])
            at = np.flatnonzero(departed[t:, p]) + t
            own = float(np.median(rate[at, p]))
            persistence = float(departed[t:, p].mean())
            line = (
                f"{grid.ids[p]} port {grid.index[p]} at {_num(own)} Gb/s vs rated {_num(float(rated[p]))} "
                f"({_pct(100 * (own / rated[p] - 1))}) from {_fmt_time(grid.at(t), with_date)}; "
                f"{_share(persistence)} of the instants since"
            )
            per_port[int(p)] = (float(short[at, p].mean()) * persistence, t, [line])
    for signal, label, needed, weight in (
        ("link_downed", "link down", 1, 0.5),
        ("symbol_errors", "symbol errors", 3, 0.3),
        ("rcv_errors", "receive errors", 3, 0.3),
    ):
        counts = grid.values.get(signal)
        if counts is None:
            continue
        rising = np.nan_to_num(counts, nan=0.0) > 0
        for p in np.flatnonzero(rising.sum(axis=0) >= needed):
            at = np.flatnonzero(rising[:, p])
            total = float(np.nansum(counts[at, p]))
            line = (
                f"{grid.ids[p]} port {grid.index[p]}: {total:,.0f} {label} from "
                f"{_fmt_time(grid.at(at[0]), with_date)}, rising in {len(at)} instants"
            )
            score, first, lines = per_port.get(int(p), (0.0, int(at[0]), []))
            per_port[int(p)] = (score + weight, min(first, int(at[0])), [*lines, line])
    per_node: dict[str, _Finding] = {}
    for port, (score, first, lines) in sorted(per_port.items(), key=lambda kv: -kv[1][0]):
        node = grid.nodes[port]
        if node in per_node:
            f = per_node[node]
            f.evidence.extend(lines)
            f.onset = min(f.onset or first, first)
            f.score += 0.1 * score
        else:
            per_node[node] = _Finding(node, None, None, "network", score, first, list(lines))
    return list(per_node.values()), grid


# --- the job's steps --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Steps:
    """The job's step time on the scrape grid (median per instant, NaN where nothing finished) and its stalls."""

    times: npt.NDArray[np.int64]  # the instants, in ns
    values: FloatArray
    stalls: tuple[tuple[pd.Timestamp, pd.Timestamp], ...]


def _job_steps(
    steps: pd.DataFrame, step_s: float, window: tuple[pd.Timestamp, pd.Timestamp], t0_ns: int | None
) -> _Steps | None:
    """The job's step times bucketed on the grid: a step finishing in [t, t + step) counts at instant t, so the
    first slow interval is labelled with the scrape instant that opens it, as a GPU's onset is."""
    if not len(steps):
        return None
    ts = to_ns(steps["ts"])
    seconds = steps["step_time_s"].to_numpy(dtype=np.float64, na_value=np.nan)
    lo, hi = (int(pd.Timestamp(w).as_unit("ns").value) for w in window)
    ok = (ts != np.iinfo(np.int64).min) & np.isfinite(seconds) & (seconds > 0) & (ts >= lo) & (ts <= hi)
    ts, seconds = ts[ok], seconds[ok]
    if not len(ts):
        return None
    order = np.argsort(ts, kind="stable")
    ts, seconds = ts[order], seconds[order]
    step_ns = max(1, round(step_s * 1e9))
    start = t0_ns if t0_ns is not None else int(ts[0]) - (int(ts[0]) - lo) % step_ns
    idx = (ts - start) // step_ns
    keep = idx >= 0
    idx, ts_k, sec_k = idx[keep], ts[keep], seconds[keep]
    if not len(idx):
        return None
    n = int(idx.max()) + 1
    med = pd.Series(sec_k).groupby(idx, sort=True).median()
    values = np.full(n, np.nan)
    values[med.index.to_numpy(dtype=np.int64)] = med.to_numpy(dtype=np.float64)
    median_s = float(np.median(seconds))

    # Stalls: a gap between logged steps far longer than a step and than the usual gap, or one step that long.
    stalls: list[tuple[pd.Timestamp, pd.Timestamp]] = []
    uniq = np.unique(ts_k)
    if len(uniq) >= 3:
        gaps = np.diff(uniq)
        limit = max(_STALL_FACTOR * median_s * 1e9, _STALL_GAPS * float(np.median(gaps)), 2.0 * step_ns)
        for i in np.flatnonzero(gaps > limit):
            stalls.append(
                (pd.Timestamp(int(uniq[i]), unit="ns", tz="UTC"), pd.Timestamp(int(uniq[i + 1]), unit="ns", tz="UTC"))
            )
    long_steps = np.flatnonzero(sec_k > max(_STALL_FACTOR * median_s, 2.0 * step_s))
    for i in long_steps[:50]:
        end = pd.Timestamp(int(ts_k[i]), unit="ns", tz="UTC")
        begin = end - pd.Timedelta(seconds=float(sec_k[i]))
        if not any(
            b - pd.Timedelta(seconds=step_s) <= begin and end <= e + pd.Timedelta(seconds=step_s) for b, e in stalls
        ):
            stalls.append((begin, end))
    stalls.sort()
    return _Steps(start + step_ns * np.arange(n, dtype=np.int64), values, tuple(stalls))


def _idle_stalls(grid: Grid) -> list[tuple[pd.Timestamp, pd.Timestamp]]:
    """Where every GPU of the job idled at once between busy spells: a stall seen in the telemetry alone.

    A step-time gauge keeps its last value through a stall, so the steps cannot always show one; the GPUs do.
    Idle: utilisation below 5 % (engine activity below 0.05 without it) on 90 % of the reporting GPUs, for two
    instants or more, with busy instants (half the GPUs or more) before and after it.
    """
    if grid.empty or grid.n_columns < 2:
        return []
    choice = next(
        ((grid.values[sig], lim) for sig, lim in (("util_pct", 5.0), ("engine_active", 0.05)) if sig in grid.values),
        None,
    )
    if choice is None:
        return []
    m, limit = choice
    reporting = np.isfinite(m).sum(axis=1)
    idle = (m < limit).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(reporting >= 2, idle / np.maximum(reporting, 1), np.nan)
    stalled = share >= 0.9
    busy = share <= 0.5
    return [
        (grid.at(t), grid.at(end + 1))
        for t, end in equal_runs(stalled)
        if stalled[t] and end > t and busy[:t].any() and busy[end + 1 :].any()
    ]


def _merge_spans(
    spans: Iterable[tuple[pd.Timestamp, pd.Timestamp]], slack: pd.Timedelta
) -> tuple[tuple[pd.Timestamp, pd.Timestamp], ...]:
    """Overlapping (or nearly touching) spans as one."""
    merged: list[tuple[pd.Timestamp, pd.Timestamp]] = []
    for begin, end in sorted(spans):
        if merged and begin <= merged[-1][1] + slack:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((begin, end))
    return tuple(merged)


def _l1_cost(x: FloatArray, k: int) -> tuple[float, float, float]:
    a, b = x[:k], x[k:]
    ma, mb = float(np.median(a)), float(np.median(b))
    return float(np.abs(a - ma).sum() + np.abs(b - mb).sum()), ma, mb


_Split = tuple[float, int, float, float]  # a change point: (cost, split, median before, median after)


def step_change(times_ns: npt.NDArray[np.int64], values: FloatArray) -> StepChange | None:
    """The step-time slowdown in ``values`` (at ``times_ns``), or ``None`` when there is none worth naming.

    One change point: the split minimising the absolute deviations around the two segments' medians (robust to a
    stalled step), among splits where the step time rose. Kept when the medians differ by at least
    :data:`STEP_SHIFT_GATE` and by four standard errors of the medians (from the residuals' MAD).
    """
    ok = np.isfinite(values)
    x, t = values[ok], times_ns[ok]
    n = len(x)
    if n < 2 * _MIN_SEGMENT:
        return None
    # Long series are searched on coarser buckets first, then refined at full resolution around the best split.
    stride = max(1, math.ceil(n / _MAX_STEP_BUCKETS))

    def cheapest(splits: Iterable[int], best: _Split | None) -> _Split | None:
        for k in splits:
            cost, ma, mb = _l1_cost(x, k)
            if mb > ma and (best is None or cost < best[0]):
                best = (cost, k, ma, mb)
        return best

    best = cheapest(range(_MIN_SEGMENT, n - _MIN_SEGMENT + 1, stride), None)
    if best is not None and stride > 1:
        best = cheapest(range(max(_MIN_SEGMENT, best[1] - stride), min(n - _MIN_SEGMENT, best[1] + stride) + 1), best)
    if best is None:
        return None
    _, k, before, after = best
    if before <= 0 or (after - before) / before < STEP_SHIFT_GATE:
        return None
    resid = np.concatenate([x[:k] - before, x[k:] - after])
    sigma = 1.4826 * float(np.median(np.abs(resid)))
    stderr = 1.2533 * sigma * math.sqrt(1 / k + 1 / (n - k))
    if after - before <= 4 * stderr:
        return None
    at = pd.Timestamp(int(t[k]), unit="ns", tz="UTC")
    return StepChange(before_s=before, after_s=after, at=at, change_pct=100 * (after / before - 1))


# --- events and the record --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Event:
    """One Kubernetes event of the job (``count``: how many times its object had it in the window)."""

    ts: pd.Timestamp
    kind: str
    name: str
    namespace: str | None
    node: str | None
    reason: str
    type: str
    note: str
    count: int = 1

    @classmethod
    def of(cls, row: Mapping[Hashable, Any], at: pd.Timestamp) -> _Event:
        """The event of one row of the events frame, at ``at``."""
        kind, name, reason = str(row["object_kind"]), str(row["object_name"]), str(row["reason"])
        namespace, node, type_, note = (_text(row[c]) for c in ("namespace", "node", "type", "note"))
        return cls(at, kind, name, namespace, node, reason, type_ or "", note or "")

    def object(self) -> str:
        name = f"{self.namespace}/{self.name}" if self.namespace and self.kind == "Pod" else self.name
        return f"{self.kind} {name}"

    def line(self, with_date: bool) -> str:
        times = f" ×{self.count}" if self.count > 1 else ""
        where = f" on {self.node}" if self.node and self.kind != "Node" else ""
        note = self.note if len(self.note) <= 200 else self.note[:199] + "…"
        head = f"{_fmt_time(self.ts, with_date)} {self.object()} {self.reason}{times}{where}"
        return f"{head}: {note}" if note else head


def _events(events: pd.DataFrame, window: tuple[pd.Timestamp, pd.Timestamp]) -> list[_Event]:
    """The events of note in the window, repeats of one (object, reason) folded into the first with a count."""
    if not len(events):
        return []
    ts = pd.DatetimeIndex(events["ts"])
    lo, hi = window
    reason = events["reason"].astype(object).fillna("").astype(str)
    etype = events["type"].astype(object).fillna("").astype(str)
    keep = (ts >= lo) & (ts <= hi) & (reason.isin(DISRUPTIVE_REASONS | _NOTABLE_NORMAL) | (etype == "Warning"))
    part = events.loc[np.asarray(keep)].assign(at_=ts[np.asarray(keep)])
    if not len(part):
        return []
    part = part.sort_values("at_", kind="stable")
    out: dict[tuple[str, str, str], _Event] = {}
    for r in part.to_dict("records"):
        e = _Event.of(r, pd.Timestamp(r["at_"]))
        key = (e.kind, e.name, e.reason)
        out[key] = replace(out[key], count=out[key].count + 1) if key in out else e
    return sorted(out.values(), key=lambda e: e.ts)


def _record_lines(record: pd.DataFrame) -> dict[str, list[str]]:
    """Per node, what gpucert's record says about it: "last certified 2026-11-30: degraded (…)", tickets, alarms."""
    out: dict[str, list[str]] = {}
    if not len(record):
        return out
    for row in record.to_dict("records"):
        node = _text(row.get("node"))
        if node is None:
            continue
        lines: list[str] = []
        decision = _text(row.get("last_decision"))
        when = row.get("last_certified_at")
        deviations = _text(row.get("deviations"))
        if decision is None:
            lines.append("gpucert has no certification of this node on record")
        else:
            stamp = pd.Timestamp(when).strftime("%Y-%m-%d") if when is not None and not pd.isna(when) else None
            run = _text(row.get("last_run_id"))
            head = f"last certified {stamp}" if stamp else (f"last certification run {run}" if run else "last decision")
            lines.append(f"{head}: {decision}" + (f" ({deviations})" if deviations else ""))
        tickets = _text(row.get("open_tickets"))
        if tickets:
            lines.append(f"open tickets: {tickets}")
        alarms = row.get("drift_alarms")
        if alarms is not None and not pd.isna(alarms) and int(alarms) > 0:
            lines.append(f"{int(alarms)} drift alarm{'s' if int(alarms) != 1 else ''} open")
        out[node] = lines
    return out


def _collective_line(collectives: pd.DataFrame, node: str, gpu: int | None, since: pd.Timestamp | None) -> str | None:
    """What NCCL Inspector says of a suspect since its onset, where it differs from its peers by 10 % or more.

    Figures are compared within each (communicator, collective) only — a small Broadcast's bandwidth is no peer
    of a large AllReduce's — as the suspect's median share of its peers' median there. A straggler GPU arrives
    last at each collective and waits least, so its collectives are *shorter* than its peers'; a node with a slow
    network has lower bus bandwidth than the other nodes.
    """
    if not len(collectives):
        return None
    ts = pd.DatetimeIndex(collectives["ts"])
    rows = collectives.loc[np.asarray(ts >= since)] if since is not None else collectives
    if not len(rows):
        return None
    nodes = rows["node"].astype(object).astype(str).to_numpy()
    groups = rows["comm"].astype(str).to_numpy() + "\x00" + rows["collective"].astype(str).to_numpy()

    def ratio(column: str, mine: npt.NDArray[np.bool_]) -> tuple[float, float, float] | None:
        values = rows[column].to_numpy(dtype=np.float64, na_value=np.nan)
        ok = np.isfinite(values)
        if not (mine & ok).any() or not (~mine & ok).any():
            return None
        medians = pd.Series(values[ok]).groupby([groups[ok], mine[ok]]).median().unstack()
        if True not in medians or False not in medians:
            return None
        both = medians.dropna()
        if both.empty:
            return None
        own, peers = both[True].to_numpy(), both[False].to_numpy()
        shares = own / np.where(peers > 0, peers, np.nan)
        if not np.isfinite(shares).any():
            return None
        # The collective where it departs most stands for it: small, latency-bound ones hide a slow link.
        k = int(np.nanargmax(np.abs(shares - 1)))
        return float(shares[k]), float(own[k]), float(peers[k])

    if gpu is not None and rows["gpu"].notna().any():
        gpus = rows["gpu"].to_numpy(dtype=np.float64, na_value=np.nan)
        found = ratio("exec_time_us", (nodes == node) & (gpus == gpu))
        if found is not None and math.isfinite(found[0]) and found[0] - 1 <= -0.10:
            share, o, p = found
            return (
                f"NCCL collectives {_num(o)} µs vs peers' {_num(p)} ({_pct(100 * (share - 1))}): it arrives "
                "last and waits least"
            )
        return None
    found = ratio("busbw_gbps", nodes == node)
    if found is not None and math.isfinite(found[0]) and abs(found[0] - 1) >= 0.10:
        share, o, p = found
        return f"NCCL bus bandwidth {_num(o)} GB/s vs other nodes' {_num(p)} ({_pct(100 * (share - 1))})"
    return None


# --- the job's own signals: the rank the others wait for, transients, hangs, routine stalls ---------------------

_HANG_SCORE = 3.0  # a job that stopped stepping outranks any slowdown
#: The step gauge frozen this long (and this many of its usual steps) while the GPUs stay busy is a hang.
HANG_MIN_S = 300.0
_HANG_STEPS = 20.0
#: GPUs count as busy at this utilisation (or engine activity × 100) and more.
_BUSY_PCT = 50.0


def _job_signal_findings(
    grid: Grid,
    collectives: pd.DataFrame,
    steps: pd.DataFrame,
    step_s: float,
    window: tuple[pd.Timestamp, pd.Timestamp],
    t0: int | None,
    with_date: bool,
) -> tuple[list[_Finding], Grid | None]:
    """Findings from the job's own timings (see :mod:`._straggler`): the rank its peers wait for in every
    collective, and a pod whose own step time lags its peers'. Onsets are on the returned grid (aligned on the
    telemetry's first instant when there is one)."""
    out: list[_Finding] = []
    coll = collective_grid(collectives, step_s=step_s, window=window, t0_ns=t0)
    used: Grid | None = coll
    uuid_of = {(n, i): u for n, i, u in zip(grid.nodes, grid.index, grid.ids, strict=True)}
    seen_cols = set(zip(grid.nodes, grid.index, strict=True))
    if coll is not None and not coll.empty:
        for jf in rank_departures(coll, below=True, gate=COLLECTIVE_GATE):
            out.append(_silent_finding(jf, coll, with_date, uuid_of, seen_cols, "collective"))
    pods = pod_step_grid(steps, step_s=step_s, window=window, t0_ns=t0)
    if pods is not None and not pods.empty:
        for jf in rank_departures(pods, below=False, gate=POD_STEP_GATE, gpus=False):
            if any(f.node == jf.node for f in out):
                continue  # the collectives named its GPU already
            used = used if used is not None and not used.empty else pods
            if used is not pods and used.t0_ns != pods.t0_ns:
                continue  # on another time axis: the collectives' finding stands alone
            out.append(_silent_finding(jf, pods, with_date, uuid_of, seen_cols, "steps"))
    return out, used


def _silent_finding(
    jf: JobFinding,
    on: Grid,
    with_date: bool,
    uuid_of: Mapping[tuple[str, int], str | None],
    seen_cols: set[tuple[str, int]],
    how: str,
) -> _Finding:
    when = _fmt_time(on.at(jf.onset), with_date)
    since = f"{_share(jf.persistence)} of the instants since"
    who = f"rank {jf.rank}" if jf.rank else (f"pod {jf.pod}" if jf.pod else f"{jf.node}")
    where = f" (pod {jf.pod})" if jf.pod and jf.rank else ""
    if how == "collective":
        line = (
            f"NCCL: {who}{where} spends {_pct(100 * (jf.own / jf.peer - 1))} the time of its peers in each "
            f"collective from {when}: it arrives last, every other rank waits for it; {since}"
        )
    else:
        line = (
            f"pod {jf.pod}'s step time runs {_pct(100 * (jf.own / jf.peer - 1))} against its peers' from {when}; "
            f"{since}"
        )
    if jf.gpu is not None and (jf.node, jf.gpu) in seen_cols:
        # No word of a cause here ("power", "PCIe" …): --act's ticket takes its cause from the evidence's words.
        cause = "its telemetry shows no cause: every DCGM signal of it is in line with its peers'"
    elif any(n == jf.node for n, _ in seen_cols):
        cause = "its node's telemetry shows no cause: every DCGM signal of its GPUs is in line with their peers'"
    else:
        cause = "no DCGM telemetry of it was read: the job's own timings name it"
    layer = "gpu" if jf.gpu is not None else "node"
    uuid = uuid_of.get((jf.node, jf.gpu)) if jf.gpu is not None else None
    until = jf.last if _recovered(on, jf.column, jf.last) else None
    score = max(0.05, jf.gap) * jf.persistence
    return _Finding(jf.node, jf.gpu, uuid, layer, score, jf.onset, [line, cause], pod=jf.pod, until=until, silent=True)


def _make_transient(f: _Finding, on: Grid, with_date: bool) -> None:
    """``f`` recovered: it becomes a transient with its window, weighed far below a standing fault."""
    assert f.onset is not None
    assert f.until is not None
    begin, end = on.at(f.onset), on.at(f.until + 1)
    f.evidence.insert(
        0,
        f"transient: departed {_fmt_time(begin, with_date)}–{_fmt_time(end, with_date)} "
        f"({_fmt_duration((end - begin).total_seconds())}), then ran in line with its peers to the "
        "window's end",
    )
    f.layer = "transient"
    f.until = f.until + 1
    f.score *= 0.2


@dataclass(frozen=True)
class _Hang:
    start: pd.Timestamp
    end: pd.Timestamp
    node: str
    evidence: tuple[str, ...]


def _frozen_spans(steps: pd.DataFrame, min_s: float) -> list[tuple[pd.Timestamp, pd.Timestamp, int]]:
    """Where at least half the pods' step gauges held one value for ``min_s`` or longer (no step finished):
    (start, end, pods). A gauge that never varies says nothing: it is left out."""
    if not len(steps) or steps["pod"].isna().all():
        return []
    frame = pd.DataFrame(
        {
            "pod": steps["pod"].astype(str).to_numpy(),
            "ns": to_ns(steps["ts"]),
            "v": steps["step_time_s"].to_numpy(dtype=np.float64, na_value=np.nan),
        }
    )
    frame = frame[np.isfinite(frame["v"].to_numpy())].sort_values(["pod", "ns"], kind="stable")
    if frame.empty:
        return []
    varied = frame.groupby("pod")["v"].nunique()
    frame = frame[frame["pod"].map(varied).to_numpy() >= 5]
    if frame.empty:
        return []
    pod = frame["pod"].to_numpy()
    value = frame["v"].to_numpy()
    new_run = np.ones(len(frame), dtype=bool)
    new_run[1:] = (pod[1:] != pod[:-1]) | (value[1:] != value[:-1])
    run = np.cumsum(new_run)
    runs = frame.assign(run=run).groupby("run").agg(pod=("pod", "first"), lo=("ns", "min"), hi=("ns", "max"))
    runs = runs[(runs["hi"] - runs["lo"]) >= min_s * 1e9]
    n_pods = frame["pod"].nunique()
    if runs.empty:
        return []
    # The job hangs where most pods froze together: the overlap of their frozen runs.
    lo = int(np.median(runs["lo"].to_numpy()))
    hi = int(np.median(runs["hi"].to_numpy()))
    frozen = runs[(runs["lo"] <= hi) & (runs["hi"] >= lo)]
    if frozen["pod"].nunique() * 2 < n_pods or hi <= lo:
        return []
    start, end = (pd.Timestamp(int(ns), unit="ns", tz="UTC") for ns in (frozen["lo"].min(), frozen["hi"].max()))
    return [(start, end, int(frozen["pod"].nunique()))]


def _busy_share(grid: Grid, begin: pd.Timestamp, end: pd.Timestamp) -> float | None:
    """The share of the job's GPUs busy over [begin, end] (median utilisation ≥ :data:`_BUSY_PCT`); None unseen."""
    if grid.empty:
        return None
    m, scale = (
        (grid.values.get("util_pct"), 1.0) if "util_pct" in grid.values else (grid.values.get("engine_active"), 100.0)
    )
    if m is None:
        return None
    i0 = max(0, int((begin.value - grid.t0_ns) // grid.step_ns))
    i1 = min(grid.n_times, int((end.value - grid.t0_ns) // grid.step_ns) + 1)
    if i1 <= i0:
        return None
    level = _nanmedian(m[i0:i1] * scale, axis=0)
    seen = np.isfinite(level)
    return float((level[seen] >= _BUSY_PCT).mean()) if seen.any() else None


def _hangs(
    steps: pd.DataFrame,
    grid: Grid,
    collectives: pd.DataFrame,
    step_s: float,
    window: tuple[pd.Timestamp, pd.Timestamp],
    with_date: bool,
    gaps: Sequence[tuple[pd.Timestamp, pd.Timestamp]] = (),
) -> list[_Hang]:
    """The job stopped stepping (its step gauge frozen on most pods, or no step logged: ``gaps``) for
    :data:`HANG_MIN_S` while its GPUs stayed busy — spinning in a collective that never completes."""
    if not len(steps):
        return []
    typical = float(np.nanmedian(steps["step_time_s"].to_numpy(dtype=np.float64, na_value=np.nan)))
    min_s = max(HANG_MIN_S, _HANG_STEPS * typical if math.isfinite(typical) else 0.0, 4 * step_s)
    spans = _frozen_spans(steps, min_s)
    last_step = pd.DatetimeIndex(steps["ts"]).max()
    if window[1] - last_step >= pd.Timedelta(seconds=min_s):
        gaps = [*gaps, (last_step, window[1])]  # no step logged to the window's end
    for begin, end in gaps:
        if (end - begin).total_seconds() >= min_s and not any(b <= begin <= e for b, e, _ in spans):
            spans.append((begin, end, int(steps["pod"].nunique())))
    out = []
    for begin, end, pods in spans:
        busy = _busy_share(grid, begin, end)
        if busy is None or busy < 0.5:
            continue  # idle GPUs are a stall (a checkpoint, an eviction), not a hang
        lasting = end >= window[1] - pd.Timedelta(seconds=2 * step_s)
        until = "to the end of the window" if lasting else "until " + _fmt_time(end, with_date)
        head = (
            f"the job stopped stepping at {_fmt_time(begin, with_date)} UTC and its GPUs stayed busy "
            f"({_share(busy)} of them) {until} ({_fmt_duration((end - begin).total_seconds())}): "
            f"no step finished on {pods} pod(s)"
        )
        lines = [head, *_in_flight(collectives, begin, step_s)]
        nodes = [ln.split("never entered it: ", 1)[1] for ln in lines if "never entered it: " in ln]
        node = nodes[0].split(" ", 1)[0].rstrip(",") if nodes else "(the job)"
        out.append(_Hang(begin, end, node, tuple(lines)))
    return out


def _in_flight(collectives: pd.DataFrame, begin: pd.Timestamp, step_s: float) -> list[str]:
    """The collective in flight when the job hung (the last one completed before, by communicator) and the ranks
    that never entered it: those whose last completed collective came well before the others'."""
    if not len(collectives):
        return ["no NCCL timings: the collective in flight is unknown"]
    ts = pd.DatetimeIndex(collectives["ts"])
    before = collectives.loc[np.asarray(ts <= begin + pd.Timedelta(seconds=step_s))]
    if not len(before):
        return ["no NCCL timings before the hang: the collective in flight is unknown"]
    last = before.assign(at_=pd.DatetimeIndex(before["ts"])).sort_values("at_").iloc[-1]
    lines = [
        f"collective in flight: {last['collective'] or 'a collective'} on communicator {last['comm'] or '?'} "
        f"(the last completed before {_fmt_time(begin, False)})"
    ]
    key = before["node"].astype(str) + " GPU " + before["gpu"].astype("string").fillna("?")
    if "rank" in before:
        key = key + " (rank " + before["rank"].astype("string").fillna("?") + ")"
    lasts = pd.DatetimeIndex(before["ts"]).to_series(index=before.index).groupby(key.to_numpy()).max()
    newest = lasts.max()
    behind = lasts[lasts < newest - pd.Timedelta(seconds=3 * step_s)]
    if 0 < len(behind) < 0.5 * len(lasts):
        lines.append(f"{len(behind)} rank(s) never entered it: {', '.join(sorted(behind.index)[:5])}")
    return lines


def _split_periodic(
    stalls: Sequence[tuple[pd.Timestamp, pd.Timestamp]],
) -> tuple[str | None, tuple[tuple[pd.Timestamp, pd.Timestamp], ...]]:
    """Stalls that recur at a steady period with a steady length (three or more; their spacing and length
    within 20 % and 50 % of their medians) are routine — checkpoints —: split off from the others, and said in
    one line."""
    if len(stalls) < 3:
        return None, tuple(stalls)
    starts = np.array([b.value for b, _ in stalls], dtype=np.float64) / 1e9
    lengths = np.array([(e - b).total_seconds() for b, e in stalls])
    gaps = np.diff(starts)
    every, lasting = float(np.median(gaps)), float(np.median(lengths))
    regular_gap = np.abs(gaps - every) <= 0.2 * every
    regular_len = np.abs(lengths - lasting) <= 0.5 * max(lasting, 1.0)
    member = regular_len.copy()
    member[1:] &= regular_gap | np.r_[regular_gap[1:], False]
    member[0] &= bool(regular_gap[0])
    if member.sum() < 3 or lasting >= 0.5 * every:
        return None, tuple(stalls)
    rest = tuple(st for st, m in zip(stalls, member, strict=True) if not m)
    line = (
        f"{int(member.sum())} periodic stalls of ~{_fmt_duration(lasting)} every {_fmt_duration(every)} "
        "(checkpoints, most likely): routine, not a fault"
    )
    return line, rest


def _who(s: Suspect) -> str:
    if s.layer == "network":
        return f"{s.node}'s network"
    if s.gpu is None:
        return s.node
    return f"{s.node} GPU {s.gpu}" + (f" ({s.gpu_uuid})" if s.gpu_uuid else "")


def explain(
    job: str,
    window: tuple[pd.Timestamp, pd.Timestamp],
    *,
    telemetry: pd.DataFrame,
    steps: pd.DataFrame,
    collectives: pd.DataFrame,
    events: pd.DataFrame,
    record: pd.DataFrame,
    nic: pd.DataFrame | None = None,
    step_s: float = 15.0,
) -> Explanation:
    """Why ``job`` was slow over ``window``, diagnosed from the contract's frames (see the module docstring).

    Returns the :class:`~gpucert.explain.Explanation`: the verdict, the ranked suspects with their evidence, the
    step-time change, the events of note, the answer in three lines, recommendations (text only) and notes on what
    could not be read. Raises :class:`~gpucert.errors.InputError` when a frame breaks the contract or ``step_s`` is
    not a positive number.
    """
    for name, frame in (("telemetry", telemetry), ("steps", steps), ("collectives", collectives), ("events", events)):
        check_frame(name, frame)
    check_frame("record", record)
    if nic is not None:
        check_frame("nic", nic)
    lo, hi = window = (utc(pd.Timestamp(window[0])), utc(pd.Timestamp(window[1])))
    with_date = lo.normalize() != hi.normalize()
    notes: list[str] = []

    grid = telemetry_grid(telemetry, step_s=step_s, window=window, signals=SIGNALS)
    if grid.held is not None:  # a GPU is the job's peer only while one of its pods holds it
        for matrix in grid.values.values():
            matrix[~grid.held] = np.nan
    t0 = grid.t0_ns if not grid.empty else None
    if grid.empty:
        notes.append("no GPU telemetry for the job in the window: the GPUs were not judged")
    else:
        missing = [s for s in SIGNALS if s not in grid.values and s not in OPTIONAL_SIGNALS | SPARSE_SIGNALS]
        if missing:
            notes.append(f"signals not scraped: {', '.join(missing)} (judged with the rest)")
        if grid.n_columns < 3:
            few = f"{grid.n_columns} GPU{'s' if grid.n_columns != 1 else ''}"
            notes.append(f"only {few} in the job: too few peers to outvote an outlier")
        unknown = sorted(set(column_codes(telemetry["signal"])[1]) - set(SIGNALS))
        if unknown:
            notes.append(f"unknown signals ignored: {', '.join(unknown[:5])}")

    findings = _merge_nodes(_gpu_findings(grid, with_date), grid, with_date)
    for col, (first, hard_lines, hard_score) in _error_signs(grid, with_date).items():
        node, gpu = grid.nodes[col], grid.index[col]
        target = next((f for f in findings if f.node == node and f.gpu == gpu), None)
        if target is not None:
            target.evidence.extend(hard_lines)
            target.score += hard_score
            target.until = None  # an error counted is no transient
        else:
            findings.append(
                _Finding(node, gpu, grid.ids[col], "gpu", hard_score, first, hard_lines, True, grid.pods[col])
            )

    nic_findings, nic_g = _nic_findings(nic, step_s, window, t0, with_date)
    if nic is None or not len(nic):
        notes.append("no NIC counters: the network was judged only through the GPUs")

    job_steps = _job_steps(steps, step_s, window, t0)
    change = step_change(job_steps.times, job_steps.values) if job_steps is not None else None
    if job_steps is None:
        notes.append("no step timings: the answer rests on telemetry")
    gaps = job_steps.stalls if job_steps is not None else ()
    stalls = _merge_spans([*gaps, *_idle_stalls(grid)], pd.Timedelta(seconds=2 * step_s))
    hangs = _hangs(steps, grid, collectives, step_s, window, with_date, gaps=gaps)
    # A stall inside a hang is the hang: said once, as the hang.
    stalls = tuple(
        st for st in stalls if not any(h.start - pd.Timedelta(seconds=2 * step_s) <= st[0] <= h.end for h in hangs)
    )
    periodic, stalls = _split_periodic(stalls)

    # The job's own signals: the rank its peers wait for, the pod slower than the others.
    job_findings, job_grid = _job_signal_findings(grid, collectives, steps, step_s, window, t0, with_date)
    job_only: list[_Finding] = []
    for jf in job_findings:
        on_node = [f for f in findings if f.node == jf.node and f.layer != "network"]
        same = next((f for f in on_node if jf.gpu is None or f.gpu in (None, jf.gpu)), None)
        if same is not None:
            same.evidence.append(jf.evidence[0])  # the GPU's own telemetry names a cause: the job confirms it
            same.score += 0.25 * jf.score
            continue
        job_only.append(jf)

    evs = _events(events, window)
    pod_node: dict[str, str] = {}
    for p, n in zip(grid.pods, grid.nodes, strict=True):
        if p:
            pod_node.setdefault(p, n)
    if len(steps) and steps["pod"].notna().any():
        sp = steps[["pod", "node"]].dropna().drop_duplicates("pod")
        for p, n in zip(sp["pod"].astype(str), sp["node"].astype(str), strict=True):
            pod_node.setdefault(p, n)

    def node_of(e: _Event) -> str | None:
        return e.node or (e.name if e.kind == "Node" else pod_node.get(e.name))

    tie = pd.Timedelta(seconds=TIE_S)
    slack = pd.Timedelta(seconds=2 * step_s)

    # A disruptive event explains a stall that begins around it, or a change that follows it.
    event_findings: list[tuple[_Event, float, list[str]]] = []
    disruptions = [e for e in evs if e.reason in DISRUPTIVE_REASONS or e.type == "Warning"]
    for e in disruptions:
        lines: list[str] = []
        score = 0.0
        for begin, end in stalls:
            if begin - tie <= e.ts <= end + slack:
                lines.append(
                    f"steps stalled {_fmt_time(begin, with_date)}–{_fmt_time(end, with_date)} "
                    f"({_fmt_duration((end - begin).total_seconds())})"
                )
                score = max(score, 1.0)
        if change is not None and change.at - tie <= e.ts <= change.at + slack:
            lines.append(f"the step time rose {_pct(change.change_pct)} at {_fmt_time(change.at, with_date)}")
            score = max(score, 0.5)
        if score == 0.0 and job_steps is None and e.reason in DISRUPTIVE_REASONS and e.reason != "Tainted":
            score = 0.5  # no timings to line it up with: a disruption of the job's own pods is still the best lead
        if score > 0:
            event_findings.append((e, score, lines))

    # A GPU departing only when its pod was disrupted (its NVLink idle while evicted) is the event's doing,
    # whether or not the steps show a stall there (a replacement on the same node idles while it waits).
    disrupted = [(node_of(e), e) for e in disruptions]
    explained: dict[int, tuple[_Event, pd.Timestamp, list[_Finding]]] = {}
    kept: list[_Finding] = []
    for f in findings:
        blamed = None
        if f.onset is not None and not f.hard_bits and f.layer in ("gpu", "nvlink", "node"):
            onset_ts = grid.at(f.onset)
            blamed = next((e for n, e in disrupted if n == f.node and e.ts - slack <= onset_ts <= e.ts + tie), None)
            if blamed is not None:
                _, since, fs = explained.get(id(blamed), (blamed, onset_ts, []))
                explained[id(blamed)] = (blamed, min(since, onset_ts), [*fs, f])
        if blamed is None:
            kept.append(f)
    named = {id(e) for e, _, _ in event_findings}
    for key, (e, since, fs) in explained.items():
        if key not in named:  # no stall or change to line it up with: the GPUs it idled are its evidence
            gpus = sorted(f.gpu for f in fs if f.gpu is not None)
            who = (
                "its GPUs"
                if any(f.gpu is None for f in fs)
                else f"its GPU{'s' if len(gpus) > 1 else ''} {', '.join(map(str, gpus))}"
            )
            line = f"{who} departed from the job's other GPUs from {_fmt_time(since, with_date)}, when it happened"
            event_findings.append((e, 0.5, [line]))
    findings = kept

    # Tie suspects to the step-time change that follows their onset.
    all_findings: list[tuple[_Finding, Grid | None]] = [(f, grid) for f in findings]
    all_findings += [(f, job_grid) for f in job_only]
    all_findings += [(f, nic_g) for f in nic_findings]
    for f, on in all_findings:
        if f.until is not None and on is not None and f.onset is not None:
            _make_transient(f, on, with_date)
    for f, on in all_findings:
        if change is None or f.onset is None or on is None or f.layer == "transient":
            continue
        onset_ts = on.at(f.onset)
        lead = (change.at - onset_ts).total_seconds()
        if -2 * step_s <= lead <= TIE_S:
            f.score += _TIE_BONUS
            when = "within a scrape interval of its onset"
            if abs(lead) >= step_s:
                when = f"{_fmt_duration(abs(lead))} {'after' if lead > 0 else 'before'} its onset"
            f.evidence.insert(
                1,
                f"the job's step time rose {_secs(change.before_s)} s → {_secs(change.after_s)} s "
                f"({_pct(change.change_pct)}) at {_fmt_time(change.at, with_date)}, {when}",
            )

    record_lines = _record_lines(record)
    suspects: list[Suspect] = []
    for f, on in all_findings:
        onset = on.at(f.onset) if (on is not None and f.onset is not None) else None
        nccl = None if f.silent else _collective_line(collectives, f.node, f.gpu, onset)
        extra = ([nccl] if nccl else []) + record_lines.get(f.node, [])
        until = on.at(f.until) if (on is not None and f.until is not None and f.layer == "transient") else None
        suspects.append(
            Suspect(
                node=f.node,
                gpu=f.gpu,
                gpu_uuid=f.gpu_uuid,
                layer=f.layer,
                score=round(float(f.score), 4),
                onset=onset,
                evidence=(*f.evidence, *extra),
                until=until,
                silent=f.silent,
            )
        )
    for e, score, lines in event_findings:
        node = node_of(e) or "(unknown node)"
        evidence = (e.line(with_date), *lines, *record_lines.get(node, []))
        suspects.append(
            Suspect(
                node=node, gpu=None, gpu_uuid=None, layer="event", score=round(score, 4), onset=e.ts, evidence=evidence
            )
        )
    suspects += [Suspect(h.node, None, None, "hang", _HANG_SCORE, h.start, h.evidence) for h in hangs]
    suspects.sort(key=lambda s: (-s.score, s.node, -1 if s.gpu is None else s.gpu))

    nothing = grid.empty and job_steps is None and not evs and not nic_findings and not len(collectives)
    verdict = _verdict(suspects, nothing, grid.empty and not job_findings, change is None and not stalls)
    events_of_note = [e.line(with_date) for e in evs[:_MAX_EVENTS_OF_NOTE]]
    if len(evs) > _MAX_EVENTS_OF_NOTE:
        events_of_note.append(f"… and {len(evs) - _MAX_EVENTS_OF_NOTE} more")
    recommendations = _recommendations(verdict, suspects, change, stalls, with_date)
    answer = _answer(
        verdict, suspects, change, stalls, job_steps is not None, recommendations, with_date, notes, periodic
    )
    return Explanation(
        job=job,
        window=window,
        verdict=verdict,
        suspects=tuple(suspects),
        step_change=change,
        events_of_note=tuple(events_of_note),
        answer=answer,
        recommendations=tuple(recommendations),
        notes=tuple(notes),
    )


def _verdict(suspects: Sequence[Suspect], nothing: bool, no_telemetry: bool, steady: bool) -> str:
    if suspects:  # the first suspect's layer names the verdict; a GPU's NVLink or a whole node is the GPU's
        return "gpu" if suspects[0].layer in ("nvlink", "node") else suspects[0].layer
    if nothing or no_telemetry:
        return "no-data"  # GPUs that were not seen cannot be said to show nothing
    return "healthy" if steady else "elsewhere"


def _recommendations(
    verdict: str,
    suspects: Sequence[Suspect],
    change: StepChange | None,
    stalls: Sequence[tuple[pd.Timestamp, pd.Timestamp]],
    with_date: bool,
) -> list[str]:
    out: list[str] = []
    for s in suspects[:3]:
        what = {"network": "its network", "nvlink": "its NVLink", "node": "all its GPUs"}.get(s.layer, f"GPU {s.gpu}")
        if s.layer == "event":
            out.append(
                f"look into the {s.evidence[0].split(' ', 1)[1]}; if it recurs on {s.node}, cordon it and re-certify it"
            )
        elif s.layer == "hang":
            out.append(
                "the job is hung: dump its ranks' stacks (py-spy dump, NCCL's flight recorder) and restart it"
                + (f"; look first at {s.node}" if not s.node.startswith("(") else "")
            )
        elif s.layer == "transient":
            window = (
                f"{_fmt_time(s.onset, with_date)}–{_fmt_time(s.until, with_date)}"
                if s.onset is not None and s.until is not None
                else "once"
            )
            out.append(
                f"nothing to do now: {_who(s)} departed {window} and recovered (transient, no cordon); "
                f"if it recurs, re-certify {s.node}"
            )
        elif s.silent:
            out.append(
                f"re-certify {s.node} ({what}): certify runs when it is idle, and its verdict settles the "
                "cause its telemetry does not show"
            )
        else:
            out.append(f"cordon {s.node} and re-certify it ({what})")
            out.append(f"open a ticket for {_who(s)} with the evidence: {'; '.join(s.evidence[:2])}")
    if verdict == "elsewhere":
        since = f" from {_fmt_time(change.at, with_date)}" if change is not None else ""
        if change is not None or stalls:
            out.append(f"look at the job's input pipeline, storage reads and code{since}: the cluster shows nothing")
        else:
            out.append("nothing to do on the cluster: the GPUs, nodes and events show nothing")
    if verdict == "healthy":
        out.append("nothing to do: the job runs at a steady pace and its GPUs, nodes and collectives are in line")
    if verdict == "no-data":
        out.append("make sure Prometheus scrapes dcgm-exporter on the job's nodes, and that the job logs its step time")
    return out


def _headline(evidence: Sequence[str]) -> str:
    """The first sentence of the evidence up to its first "; " (the figures, not how persistent they were)."""
    return evidence[0].split("; ", 1)[0] if evidence else ""


def _describe(s: Suspect) -> str:
    """One suspect in the answer's words: its kind, who, and its first figures."""
    if s.layer == "event":
        return f"event: {s.evidence[0]}"
    if s.layer == "hang":
        return f"hang: {_headline(s.evidence)}"
    if s.layer == "network":
        return f"network: {s.node}'s NIC — {_headline(s.evidence)}"
    if s.layer == "node":
        head = "the straggler" if s.silent else "as a whole"
        return f"gpu: {s.node} {head} — {_headline(s.evidence)}"
    if s.layer == "transient":
        return f"transient: {_who(s)} — {_headline(s.evidence)}"
    return f"gpu: {_who(s)} is the straggler — {_headline(s.evidence)}"


#: Suspects scoring at least this share of the first one's are faults of their own in the headline.
_HEADLINE_SHARE = 0.25
_HEADLINE_MAX = 3


def _answer(
    verdict: str,
    suspects: Sequence[Suspect],
    change: StepChange | None,
    stalls: Sequence[tuple[pd.Timestamp, pd.Timestamp]],
    have_steps: bool,
    recommendations: Sequence[str],
    with_date: bool,
    notes: Sequence[str],
    periodic: str | None = None,
) -> tuple[str, str, str]:
    if suspects:
        top = suspects[0]
        # Every standing fault that carries a real share of the slowdown is named, the largest first.
        bar = _HEADLINE_SHARE * top.score
        standing = [s for s in suspects if s.layer != "transient" and s.score >= bar and s.score > 0]
        faults = ([top] if top.layer == "transient" else standing or [top])[:_HEADLINE_MAX]
        what = "; and ".join(_describe(s) for s in faults)
        others = len(suspects) - len(faults)
        if others:
            what += f" (and {others} more suspect{'s' if others != 1 else ''})"
    elif verdict == "elsewhere":
        what = "elsewhere: GPUs and nodes show nothing: input pipeline, storage or the code"
    elif verdict == "healthy":
        what = "healthy: the step time is steady and the GPUs, nodes and collectives show nothing wrong"
    else:
        what = "no-data: " + (notes[0] if notes else "nothing to judge in the window")

    parts: list[str] = []
    if suspects and suspects[0].onset is not None and suspects[0].layer not in ("event", "transient"):
        parts.append(f"since {_fmt_time(suspects[0].onset, with_date)} UTC")
    first = suspects[0] if suspects else None
    if first is not None and first.layer == "transient" and first.onset is not None and first.until is not None:
        onset, until = first.onset, first.until
        parts.append(
            f"from {_fmt_time(onset, with_date)} to {_fmt_time(until, with_date)} UTC "
            f"({_fmt_duration((until - onset).total_seconds())}), then recovered"
        )
    if change is not None:
        parts.append(
            f"step time {_secs(change.before_s)} s → {_secs(change.after_s)} s ({_pct(change.change_pct)}) "
            f"from {_fmt_time(change.at, with_date)} UTC"
        )
    for begin, end in stalls[:2]:
        parts.append(
            f"steps stalled {_fmt_time(begin, with_date)}–{_fmt_time(end, with_date)} UTC "
            f"({_fmt_duration((end - begin).total_seconds())})"
        )
    if periodic is not None:
        parts.append(periodic)
    if not have_steps:
        parts.append("no step timings: the answer rests on telemetry")
    elif change is None and not stalls:
        parts.append(f"the step time did not change by {_share(STEP_SHIFT_GATE)} or more")
    when = "; ".join(parts) if parts else "no onset: nothing departs"
    if suspects and suspects[0].layer not in ("event", "hang", "transient") and not suspects[0].silent:
        # The full recommendations carry the evidence; the answer's line says what to do, in short.
        todo = f"{recommendations[0]}; open a ticket with the evidence"
    else:
        todo = recommendations[0] if recommendations else "nothing to do"
    return what, when, todo
