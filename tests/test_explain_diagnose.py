"""The diagnosis of ``gpucert explain`` (gpucert.explain._diagnose) on synthetic frames of a training job.

Each frame is built by a small function below, as the gatherer would hand it over: telemetry in long format
(category columns, UTC timestamps on the 15 s scrape grid), per-pod step lines, Kubernetes events, gpucert's
record and NIC counters. The faults are the ones the simulated cluster injects (a thermally throttling GPU, a
slow input pipeline, an evicted pod, a NIC at half rate), so these tests pin the judgement the end-to-end tests
rely on, without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pytest

from gpucert.errors import InputError
from gpucert.explain import (
    FRAME_COLUMNS,
    SIGNALS,
    Explanation,
    check_frame,
    empty_collectives,
    empty_events,
    empty_frame,
    empty_nic,
    empty_record,
    empty_steps,
    empty_telemetry,
    explain,
)
from gpucert.explain._diagnose import step_change
from gpucert.explain._grid import persistent_onset

START = pd.Timestamp("2026-12-01T08:00:00Z")
STEP_S = 15.0
HEALTHY = {
    "sm_clock_mhz": (1980.0, 8.0),
    "clock_event_reasons": (0.0, 0.0),
    "power_w": (650.0, 12.0),
    "temp_c": (66.0, 1.5),
    "util_pct": (95.0, 1.5),
    "engine_active": (0.9, 0.015),
    "nvlink_gbps": (310.0, 6.0),
    "pcie_gbps": (22.0, 1.0),
    "thermal_violation_frac": (0.0, 0.0),
    "power_violation_frac": (0.0, 0.0),
    "pcie_replays_per_min": (0.0, 0.0),
    "xid": (0.0, 0.0),
    "ecc_dbe": (0.0, 0.0),
}


def node_name(i: int) -> str:
    return f"gpu-node-{i:05d}"


@dataclass
class Job:
    """A synthetic job: its frames and what was injected."""

    telemetry: pd.DataFrame
    steps: pd.DataFrame
    events: pd.DataFrame = field(default_factory=empty_events)
    nic: pd.DataFrame | None = None
    record: pd.DataFrame = field(default_factory=empty_record)
    window: tuple[pd.Timestamp, pd.Timestamp] = (START, START)

    def explain(self, **kwargs: object) -> Explanation:
        frames = {
            "telemetry": self.telemetry,
            "steps": self.steps,
            "collectives": empty_collectives(),
            "events": self.events,
            "record": self.record,
            "nic": self.nic,
            **kwargs,
        }
        return explain("ml/train", self.window, step_s=STEP_S, **frames)  # type: ignore[arg-type]


def telemetry(
    nodes: int,
    minutes: int,
    *,
    seed: int,
    signals: tuple[str, ...] = tuple(HEALTHY),
    throttle: tuple[int, int, float] | None = None,
    clock_frac: float = 0.5,
    idle: float = 1.0,
    idle_from: float | None = None,
    stall: tuple[int, float, float] | None = None,
    names: list[str] | None = None,
) -> pd.DataFrame:
    """Telemetry of ``nodes`` × 8 GPUs over ``minutes``, one row per GPU × signal × 15 s instant.

    ``throttle`` = (node, gpu, from_minute): that GPU's SM clock drops to ``clock_frac`` with the HW thermal and HW
    slowdown bits (0x48), hotter and drawing less power. ``idle`` < 1 from ``idle_from``: every GPU waits on input
    (utilisation and engine activity scaled down alike). ``stall`` = (node, from_minute, to_minute): the pod on that
    node is gone (its GPUs held by nobody: no pod label) and every GPU of the job idles (low clocks with only the
    idle bit, no traffic) until its replacement resumes.
    """
    rng = np.random.default_rng(seed)
    names = names or [node_name(i) for i in range(nodes)]
    n_t = minutes * 4 + 1
    ts = START + pd.to_timedelta(np.arange(n_t) * STEP_S, unit="s")
    minute = np.arange(n_t) * STEP_S / 60
    n_g = nodes * 8
    frames = []
    for signal in signals:
        mean, sd = HEALTHY[signal]
        m = mean + sd * rng.standard_normal((n_t, n_g))
        if signal == "clock_event_reasons":
            m = np.where(rng.random((n_t, n_g)) < 0.3, 0x04, 0).astype(np.float64)  # power cap: normal at load
        if idle < 1.0 and idle_from is not None and signal in ("util_pct", "engine_active", "power_w"):
            m[minute >= idle_from] *= idle
        if throttle is not None:
            node, gpu, since = throttle
            col, rows = node * 8 + gpu, minute >= since
            if signal == "sm_clock_mhz":
                m[rows, col] *= clock_frac
            elif signal == "clock_event_reasons":
                m[rows, col] = m[rows, col].astype(np.int64) | 0x48  # the power-cap bit as often as its peers
            elif signal == "temp_c":
                m[rows, col] += 22
            elif signal == "power_w":
                m[rows, col] *= 0.62
            elif signal == "thermal_violation_frac":
                m[rows, col] = 0.9
        if stall is not None:
            node, since, until = stall
            rows = (minute >= since) & (minute < until)
            idle_values = {
                "sm_clock_mhz": 345.0,
                "clock_event_reasons": 0x01,
                "util_pct": 0.0,
                "engine_active": 0.0,
                "power_w": 75.0,
                "nvlink_gbps": 0.0,
                "pcie_gbps": 0.0,
            }
            if signal in idle_values:
                m[rows] = idle_values[signal]  # every GPU of the job idles while it waits
        frames.append(m)
    signal_codes = np.repeat(np.arange(len(signals)), n_t * n_g)
    values = np.concatenate([f.ravel() for f in frames])
    t_idx = np.tile(np.repeat(np.arange(n_t), n_g), len(signals))
    g_idx = np.tile(np.tile(np.arange(n_g), n_t), len(signals))
    node_idx = g_idx // 8
    pod_codes = node_idx.copy()
    if stall is not None:  # the evicted pod's GPUs are nobody's until its replacement resumes
        gone = (node_idx == stall[0]) & (minute[t_idx] >= stall[1]) & (minute[t_idx] < stall[2])
        pod_codes[gone] = -1
    return pd.DataFrame(
        {
            "ts": ts[t_idx],
            "node": pd.Categorical.from_codes(node_idx, categories=pd.Index(names)),
            "gpu": pd.array(g_idx % 8, dtype="Int64"),
            "gpu_uuid": pd.Categorical.from_codes(
                g_idx, categories=pd.Index([f"GPU-{i:04x}-uuid" for i in range(n_g)])
            ),
            "pod": pd.Categorical.from_codes(pod_codes, categories=pd.Index([f"train-{i}" for i in range(nodes)])),
            "signal": pd.Categorical.from_codes(signal_codes, categories=pd.Index(list(signals))),
            "value": values,
        }
    )


def steps(
    nodes: int,
    minutes: int,
    *,
    seed: int,
    slow_from: float | None = None,
    factor: float = 2.0,
    stall: tuple[float, float] | None = None,
    step_s: float = 1.0,
    names: list[str] | None = None,
) -> pd.DataFrame:
    """Per-pod step lines: each step takes ``step_s`` (× ``factor`` from ``slow_from`` minutes on), plus noise.

    ``stall`` = (from_minute, to_minute): nothing is logged meanwhile (the job waits for the evicted pod's
    replacement), then training resumes.
    """
    rng = np.random.default_rng(seed + 1000)
    names = names or [node_name(i) for i in range(nodes)]
    t, k, rows_t, rows_s = 0.0, 0, [], []
    end = minutes * 60.0
    while t < end:
        slow = slow_from is not None and t >= slow_from * 60
        dt = step_s * (factor if slow else 1.0) * (1 + 0.02 * rng.standard_normal())
        if stall is not None and stall[0] * 60 <= t < stall[1] * 60:
            t = stall[1] * 60
            continue
        t += dt
        k += 1
        rows_t.append(t)
        rows_s.append(dt)
    ts_s = np.repeat(np.asarray(rows_t), nodes) + 0.01 * rng.random(len(rows_t) * nodes)
    pods = np.tile(np.arange(nodes), len(rows_t))
    return pd.DataFrame(
        {
            "ts": START + pd.to_timedelta(ts_s, unit="s"),
            "pod": [f"train-{p}" for p in pods],
            "node": [names[p] for p in pods],
            "step": pd.array(np.repeat(np.arange(1, len(rows_t) + 1), nodes), dtype="Int64"),
            "step_time_s": np.repeat(np.asarray(rows_s), nodes),
        }
    )


def job(nodes: int = 16, minutes: int = 90, *, seed: int = 0, **kw: object) -> Job:
    tel_kw = {
        k: v for k, v in kw.items() if k in ("signals", "throttle", "clock_frac", "idle", "idle_from", "stall", "names")
    }
    step_kw = {k: v for k, v in kw.items() if k in ("slow_from", "factor", "names")}
    if "step_stall" in kw:
        step_kw["stall"] = kw["step_stall"]
    tel = telemetry(nodes, minutes, seed=seed, **tel_kw)  # type: ignore[arg-type]
    stp = steps(nodes, minutes, seed=seed, **step_kw)  # type: ignore[arg-type]
    return Job(tel, stp, window=(START, START + pd.Timedelta(minutes=minutes)))


def events(rows: list[dict[str, object]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(empty_events().columns))
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True)
    return frame


def nic(
    nodes: int, minutes: int, *, half: tuple[int, str, int] | None = None, errors: tuple[int, str, int] | None = None
) -> pd.DataFrame:
    """Every node's eight RDMA ports at 400 Gb/s; ``half`` = (node, device, from_minute) drops one to 200."""
    n_t = minutes * 4 + 1
    minute = np.arange(n_t) * STEP_S / 60
    rows = []
    for n in range(nodes):
        for d in range(8):
            device = f"mlx5_{d}"
            rate = np.full(n_t, 400.0)
            if half is not None and (n, device) == half[:2]:
                rate[minute >= half[2]] = 200.0
            errs = np.zeros(n_t)
            if errors is not None and (n, device) == errors[:2]:
                errs[minute >= errors[2]] = 17.0
            for signal, values in (("rate_gbps", rate), ("symbol_errors", errs), ("link_downed", np.zeros(n_t))):
                rows.append(
                    pd.DataFrame(
                        {
                            "ts": START + pd.to_timedelta(np.arange(n_t) * STEP_S, unit="s"),
                            "node": node_name(n),
                            "device": device,
                            "port": 1,
                            "signal": signal,
                            "value": values,
                        }
                    )
                )
    frame = pd.concat(rows, ignore_index=True)
    frame["port"] = frame["port"].astype("Int64")
    return frame


# --- the bars of issue 15 ---------------------------------------------------------------------------------------


def test_a_thermally_throttling_gpu_is_named_first_with_its_onset_and_the_step_change() -> None:
    j = job(16, 90, seed=3, throttle=(7, 3, 40), slow_from=40, factor=2.0)
    ex = j.explain()
    assert ex.verdict == "gpu"
    top = ex.suspects[0]
    assert (top.node, top.gpu, top.layer) == (node_name(7), 3, "gpu")
    assert top.gpu_uuid == f"GPU-{7 * 8 + 3:04x}-uuid"
    truth = START + pd.Timedelta(minutes=40)
    assert top.onset is not None
    assert abs((top.onset - truth).total_seconds()) <= STEP_S
    assert len(ex.suspects) == 1, ex.suspects  # no peer is blamed alongside it
    change = ex.step_change
    assert change is not None
    assert abs((change.at - truth).total_seconds()) <= STEP_S
    assert change.before_s == pytest.approx(1.0, rel=0.03)
    assert change.after_s == pytest.approx(2.0, rel=0.03)
    assert change.change_pct == pytest.approx(100, abs=6)
    # The evidence has the numbers: the clock against its peers', the bits, the temperature, the tie.
    text = " | ".join(top.evidence)
    assert "SM clock 990 MHz vs peers' 1,980 (−50 %) from 08:40:00" in text
    assert "HW thermal slowdown (0x40) set 100 %" in text
    assert "HW slowdown (0x08)" in text
    assert "SW power cap" not in text  # its peers have it as often: no evidence
    assert "temperature 88 °C vs peers' 66 °C (+22 °C)" in text
    assert (
        "the job's step time rose 1.00 s → 2.00 s (+100 %) at 08:40:00, within a scrape interval of its onset" in text
    )
    # The answer: what (suspect first), since when (onset, step change with numbers), what to do.
    what, when, todo = ex.answer
    assert what.startswith(f"gpu: {node_name(7)} GPU 3 (GPU-003b-uuid) is the straggler — SM clock 990 MHz")
    assert when.startswith("since 08:40:00 UTC; step time 1")
    assert "(+100 %)" in when
    assert todo == f"cordon {node_name(7)} and re-certify it (GPU 3); open a ticket with the evidence"
    assert ex.recommendations[0] == f"cordon {node_name(7)} and re-certify it (GPU 3)"
    assert ex.recommendations[1].startswith(
        f"open a ticket for {node_name(7)} GPU 3 (GPU-003b-uuid) with the "
        "evidence: SM clock 990 MHz vs peers' 1,980 (−50 %) from 08:40:00"
    )


def test_nccl_inspector_shows_the_straggler_waiting_least() -> None:
    """The straggler arrives last at each collective: its own collectives are the shortest."""
    j = job(4, 40, seed=25, throttle=(1, 6, 20), slow_from=20)
    rows = []
    for minute in range(0, 40, 2):
        for n in range(4):
            for g in range(8):
                slow = minute >= 20
                exec_us = 9000.0 if not slow else (4000.0 if (n, g) == (1, 6) else 18000.0)
                rows.append(
                    {
                        "ts": START + pd.Timedelta(minutes=minute),
                        "node": node_name(n),
                        "gpu": g,
                        "comm": "c0",
                        "collective": "AllReduce",
                        "busbw_gbps": 180.0,
                        "exec_time_us": exec_us,
                    }
                )
    collectives = pd.DataFrame(rows).astype({"gpu": "Int64"})
    collectives["ts"] = pd.to_datetime(collectives["ts"], utc=True)
    ex = j.explain(collectives=collectives)
    assert (ex.suspects[0].node, ex.suspects[0].gpu) == (node_name(1), 6)
    line = "NCCL collectives 4,000 µs vs peers' 18,000 (−78 %): it arrives last and waits least"
    assert line in ex.suspects[0].evidence


def test_the_record_adds_the_suspect_node_s_history_to_its_evidence() -> None:
    j = job(16, 60, seed=4, throttle=(2, 5, 20), slow_from=20)
    record = pd.DataFrame(
        {
            "node": [node_name(2), node_name(3)],
            "last_run_id": ["night-1130", "night-1130"],
            "last_decision": ["degraded", "certified"],
            "last_certified_at": pd.to_datetime(["2026-11-30T03:00:00Z", "2026-11-30T03:00:00Z"], utc=True),
            "open_tickets": ["OPS-12", ""],
            "drift_alarms": pd.array([2, 0], dtype="Int64"),
            "deviations": ["hbm_copy_gbps −7 %", ""],
        }
    )
    ex = j.explain(record=record)
    top = ex.suspects[0]
    assert top.node == node_name(2)
    assert "last certified 2026-11-30: degraded (hbm_copy_gbps −7 %)" in top.evidence
    assert "open tickets: OPS-12" in top.evidence
    assert "2 drift alarms open" in top.evidence


def test_a_slow_input_pipeline_with_healthy_gpus_blames_no_gpu() -> None:
    j = job(16, 90, seed=5, idle=0.6, idle_from=30, slow_from=30, factor=1.6)
    ex = j.explain()
    assert ex.verdict == "elsewhere"
    assert ex.suspects == ()
    assert ex.step_change is not None
    assert ex.step_change.change_pct == pytest.approx(60, abs=5)
    assert abs((ex.step_change.at - (START + pd.Timedelta(minutes=30))).total_seconds()) <= STEP_S
    assert ex.answer[0] == "elsewhere: GPUs and nodes show nothing: input pipeline, storage or the code"
    assert "(+60 %)" in ex.answer[1] or "(+59 %)" in ex.answer[1] or "(+61 %)" in ex.answer[1]
    assert ex.recommendations[0].startswith("look at the job's input pipeline, storage reads and code from 08:30")
    assert not any(r.startswith("cordon") for r in ex.recommendations)


def test_an_evicted_pod_with_a_step_stall_is_the_event() -> None:
    j = job(16, 90, seed=6, stall=(5, 50, 54), step_stall=(50, 54))
    at = START + pd.Timedelta(minutes=50)
    j.events = events(
        [
            {
                "ts": at,
                "object_kind": "Pod",
                "object_name": "train-5",
                "namespace": "ml",
                "node": node_name(5),
                "reason": "Evicted",
                "type": "Warning",
                "note": "The node was low on resource: memory.",
            },
            {
                "ts": at + pd.Timedelta(minutes=3),
                "object_kind": "Pod",
                "object_name": "train-5-r1",
                "namespace": "ml",
                "node": node_name(9),
                "reason": "Scheduled",
                "type": "Normal",
                "note": "assigned",
            },
            {
                "ts": at - pd.Timedelta(minutes=30),
                "object_kind": "Pod",
                "object_name": "train-1",
                "namespace": "ml",
                "node": node_name(1),
                "reason": "Pulled",
                "type": "Normal",
                "note": "image pulled",
            },
        ]
    )
    ex = j.explain()
    assert ex.verdict == "event"
    top = ex.suspects[0]
    assert (top.layer, top.node, top.gpu) == ("event", node_name(5), None)
    assert top.onset == at
    assert "Pod ml/train-5 Evicted on gpu-node-00005: The node was low on resource: memory." in top.evidence[0]
    assert any(e.startswith("steps stalled 08:50:") for e in top.evidence)
    assert all(s.layer == "event" for s in ex.suspects)  # the evicted node's idle GPUs are the event's doing
    assert any("Evicted" in e for e in ex.events_of_note)
    assert not any("Pulled" in e for e in ex.events_of_note)  # routine events are not of note
    assert ex.answer[0].startswith("event: 08:50:00 Pod ml/train-5 Evicted")
    assert "steps stalled 08:50" in ex.answer[1]


def gauge_steps(nodes: int, minutes: int, *, seed: int) -> pd.DataFrame:
    """The step time as a Prometheus gauge scraped every 15 s: the last step's seconds, stale through a stall."""
    rng = np.random.default_rng(seed)
    n_t = minutes * 4 + 1
    ts = START + pd.to_timedelta(np.arange(n_t) * STEP_S, unit="s")
    return pd.DataFrame(
        {
            "ts": np.repeat(ts, nodes),
            "pod": [f"train-{p}" for _ in range(n_t) for p in range(nodes)],
            "node": [node_name(p) for _ in range(n_t) for p in range(nodes)],
            "step": pd.array([pd.NA] * (n_t * nodes), dtype="Int64"),
            "step_time_s": np.repeat(1.0 + 0.02 * rng.standard_normal(n_t), nodes),
        }
    )


def test_an_eviction_behind_a_stale_step_gauge_is_seen_in_the_idle_gpus() -> None:
    """A gauge keeps its last value through the stall: every GPU idling at once is the stall."""
    j = job(16, 60, seed=18, stall=(4, 30, 35))
    j.steps = gauge_steps(16, 60, seed=18)
    at = START + pd.Timedelta(minutes=30, seconds=5)
    j.events = events(
        [
            {
                "ts": at,
                "object_kind": "Pod",
                "object_name": "train-4",
                "namespace": "ml",
                "node": None,
                "reason": "Evicted",
                "type": "Warning",
                "note": "Pod ephemeral local storage usage exceeds",
            }
        ]
    )
    ex = j.explain()
    assert ex.verdict == "event"
    assert ex.suspects[0].node == node_name(4)  # the pod's node, from the telemetry's pod labels
    assert "steps stalled 08:30:00–08:35:00 (5.0 min)" in ex.suspects[0].evidence
    assert [s.layer for s in ex.suspects] == ["event"]


def test_gpus_departing_when_their_pod_was_evicted_are_the_event_even_without_a_stall() -> None:
    """The replacement lands on the same node and idles there while the steps show no stall (a gauge
    scraped through it): the node's GPUs departing at the eviction are the event's doing, not a GPU fault."""
    j = job(16, 60, seed=21)
    j.steps = gauge_steps(16, 60, seed=21)
    tel = j.telemetry
    at = START + pd.Timedelta(minutes=30)
    rows = ((tel["node"] == node_name(7)) & (tel["ts"] >= at) & (tel["ts"] < at + pd.Timedelta(minutes=5))).to_numpy()
    for signal, value in (
        ("sm_clock_mhz", 345.0),
        ("clock_event_reasons", 1.0),
        ("util_pct", 0.0),
        ("engine_active", 0.0),
        ("nvlink_gbps", 0.0),
        ("pcie_gbps", 0.0),
        ("power_w", 75.0),
    ):
        tel.loc[rows & (tel["signal"] == signal).to_numpy(), "value"] = value
    # Without the event, the idle node would be the suspect: a transient one (it recovered after 5 minutes).
    assert j.explain().verdict == "transient"
    j.events = events(
        [
            {
                "ts": at,
                "object_kind": "Pod",
                "object_name": "train-7",
                "namespace": "ml",
                "node": node_name(7),
                "reason": "Evicted",
                "type": "Warning",
                "note": "low on memory",
            }
        ]
    )
    ex = j.explain()
    assert ex.verdict == "event", ex.answer
    assert [(s.layer, s.node) for s in ex.suspects] == [("event", node_name(7))]
    assert ex.suspects[0].evidence[1].endswith("departed from the job's other GPUs from 08:30:00, when it happened")


def test_gpus_no_pod_of_the_job_holds_are_no_peers() -> None:
    """After its pod left, a node's GPUs idle with no traffic while the job trains on: nobody's GPUs, not stragglers."""
    j = job(8, 40, seed=20)
    tel = j.telemetry
    rows = ((tel["node"] == node_name(2)) & (tel["ts"] >= START + pd.Timedelta(minutes=20))).to_numpy()
    for signal, value in (
        ("sm_clock_mhz", 345.0),
        ("clock_event_reasons", 1.0),
        ("util_pct", 0.0),
        ("nvlink_gbps", 0.0),
        ("pcie_gbps", 0.0),
        ("power_w", 75.0),
    ):
        tel.loc[rows & (tel["signal"] == signal).to_numpy(), "value"] = value
    tel.loc[rows, "pod"] = None
    assert j.explain().suspects == ()
    blamed = j.explain(telemetry=tel.assign(pod=None)).suspects  # without any pod label it would be
    assert blamed
    assert {s.node for s in blamed} == {node_name(2)}


def test_a_whole_node_departing_is_the_node_s_finding() -> None:
    j = job(8, 40, seed=19)
    tel = j.telemetry
    rows = (tel["node"] == node_name(5)) & (tel["ts"] >= START + pd.Timedelta(minutes=20))
    tel.loc[rows & (tel["signal"] == "sm_clock_mhz"), "value"] *= 0.7
    tel.loc[rows & (tel["signal"] == "clock_event_reasons"), "value"] = float(0x80 | 0x08)  # a power brake
    ex = j.explain()
    assert [(s.node, s.gpu, s.layer) for s in ex.suspects] == [(node_name(5), None, "node")]
    assert ex.suspects[0].evidence[0] == "8 of its 8 GPUs depart from their peers together from 08:20:00"
    assert "HW power brake (0x80) set 100 %" in ex.suspects[0].evidence[1]
    assert ex.answer[0].startswith(f"gpu: {node_name(5)} as a whole — 8 of its 8 GPUs depart")
    assert ex.recommendations[0] == f"cordon {node_name(5)} and re-certify it (all its GPUs)"


@pytest.mark.parametrize("seed", [11, 12, 13, 14])
def test_noise_alone_blames_nothing(seed: int) -> None:
    j = job(16, 60, seed=seed)
    ex = j.explain()
    assert ex.suspects == ()
    assert ex.step_change is None
    assert ex.verdict == "healthy"  # nothing wrong is called healthy, not "elsewhere"
    assert ex.answer[0].startswith("healthy: ")
    assert "did not change by 10 % or more" in ex.answer[1]


def test_a_nic_at_half_rate_names_the_network_of_that_node() -> None:
    j = job(16, 60, seed=7, slow_from=25, factor=1.3)
    j.nic = nic(16, 60, half=(9, "mlx5_3", 25))
    ex = j.explain()
    assert ex.verdict == "network"
    top = ex.suspects[0]
    assert (top.node, top.gpu, top.layer) == (node_name(9), None, "network")
    assert top.onset == START + pd.Timedelta(minutes=25)
    assert top.evidence[0].startswith("mlx5_3 port 1 at 200 Gb/s vs rated 400 (−50 %) from 08:25:00")
    assert ex.answer[0].startswith(f"network: {node_name(9)}'s NIC — mlx5_3 port 1 at 200 Gb/s")
    assert ex.recommendations[0] == f"cordon {node_name(9)} and re-certify it (its network)"


def test_rising_nic_error_counters_are_evidence_too() -> None:
    j = job(4, 30, seed=8)
    j.nic = nic(4, 30, errors=(1, "mlx5_0", 10))
    ex = j.explain()
    assert ex.suspects[0].layer == "network"
    assert ex.suspects[0].node == node_name(1)
    assert "mlx5_0 port 1: " in ex.suspects[0].evidence[0]
    assert "symbol errors from 08:10:00" in ex.suspects[0].evidence[0]


# --- what may be missing ----------------------------------------------------------------------------------------


def test_without_step_timings_the_answer_rests_on_telemetry() -> None:
    j = job(8, 45, seed=9, throttle=(1, 0, 20))
    ex = j.explain(steps=empty_steps())
    assert ex.verdict == "gpu"
    assert ex.suspects[0].node == node_name(1)
    assert ex.step_change is None
    assert "no step timings: the answer rests on telemetry" in ex.notes
    assert "no step timings: the answer rests on telemetry" in ex.answer[1]


def test_missing_signals_are_noted_and_the_rest_judged() -> None:
    """Only the SM clock was scraped: no reasons to require, so the clock alone departs."""
    j = job(8, 45, seed=10, signals=("sm_clock_mhz",), throttle=(6, 7, 15), slow_from=15)
    ex = j.explain()
    assert (ex.suspects[0].node, ex.suspects[0].gpu) == (node_name(6), 7)
    assert "(no clock-event reasons were scraped)" in ex.suspects[0].evidence[0]
    assert any(n.startswith("signals not scraped: clock_event_reasons, power_w") for n in ex.notes)


def test_a_slow_clock_without_a_slowdown_reason_is_not_blamed() -> None:
    """A GPU whose clock is low with no slowdown bit (an idle GPU) is waiting, not throttled."""
    j = job(8, 45, seed=15, signals=("sm_clock_mhz", "clock_event_reasons"), throttle=(3, 1, 15))
    reasons = j.telemetry["signal"] == "clock_event_reasons"
    j.telemetry.loc[reasons, "value"] = 0.0  # the throttled GPU's bits wiped
    assert j.explain().suspects == ()


def test_nothing_at_all_is_no_data() -> None:
    ex = explain(
        "ml/train",
        (START, START + pd.Timedelta(hours=1)),
        telemetry=empty_telemetry(),
        steps=empty_steps(),
        collectives=empty_collectives(),
        events=empty_events(),
        record=empty_record(),
        nic=empty_nic(),
    )
    assert ex.verdict == "no-data"
    assert ex.suspects == ()
    assert ex.step_change is None
    assert ex.answer[0].startswith("no-data: no GPU telemetry")
    assert ex.recommendations
    assert "dcgm-exporter" in ex.recommendations[0]


def test_steps_without_telemetry_cannot_clear_the_gpus() -> None:
    j = job(4, 40, seed=16, slow_from=20)
    ex = j.explain(telemetry=empty_telemetry())
    assert ex.verdict == "no-data"
    assert ex.step_change is not None


def test_an_xid_alone_is_evidence() -> None:
    j = job(4, 30, seed=17)
    xid = (j.telemetry["signal"] == "xid") & (j.telemetry["node"] == node_name(2)) & (j.telemetry["gpu"] == 4)
    late = j.telemetry["ts"] >= START + pd.Timedelta(minutes=12)
    j.telemetry.loc[xid & late, "value"] = 79.0
    ex = j.explain()
    assert (ex.suspects[0].node, ex.suspects[0].gpu) == (node_name(2), 4)
    assert ex.suspects[0].evidence[0].startswith("XID 79 from 08:12:00")


def test_frames_that_break_the_contract_are_named() -> None:
    j = job(2, 10, seed=1)
    naive = j.telemetry.assign(ts=j.telemetry["ts"].dt.tz_localize(None))
    with pytest.raises(InputError, match=r"^telemetry frame: column 'ts' must be tz-aware UTC"):
        j.explain(telemetry=naive)
    with pytest.raises(InputError, match=r"^steps frame: missing column 'step_time_s'"):
        j.explain(steps=j.steps.drop(columns="step_time_s"))
    with pytest.raises(InputError, match=r"^events frame: column 'reason' must be text"):
        check_frame(
            "events",
            empty_events()
            .assign(reason=pd.Series([], dtype="float64"))
            .iloc[:0]
            .pipe(lambda f: pd.concat([f, pd.DataFrame({"reason": [1.5]})])),
        )
    with pytest.raises(InputError, match=r"step_s must be a positive"):
        explain(
            "ml/train",
            j.window,
            telemetry=j.telemetry,
            steps=j.steps,
            collectives=empty_collectives(),
            events=empty_events(),
            record=empty_record(),
            step_s=0,
        )


def test_the_empty_frames_keep_the_contract() -> None:
    for name, columns in FRAME_COLUMNS.items():
        frame = empty_frame(name)
        assert tuple(frame.columns) == columns
        assert check_frame(name, frame) is frame
    assert str(empty_telemetry()["ts"].dtype) == "datetime64[ns, UTC]"
    assert str(empty_steps()["step"].dtype) == "Int64"
    assert len(set(SIGNALS)) == len(SIGNALS) == 22
    with pytest.raises(InputError, match=r"'timings' is not a frame"):
        check_frame("timings", empty_steps())


# --- the pieces -------------------------------------------------------------------------------------------------


def test_persistence_ignores_spikes_and_finds_a_duty_cycled_slowdown() -> None:
    d = np.zeros((60, 4), dtype=bool)
    d[[5, 6, 20, 33], 0] = True  # spikes: never three in a row
    d[30:, 1] = True  # a real departure
    d[10:, 2] = (np.arange(50) % 4) < 2  # on half of every minute, from 10 on
    d[58:, 3] = True  # two at the very end: not enough to call
    assert persistent_onset(d).tolist() == [-1, 30, 10, -1]


def test_step_change_is_robust_to_a_stalled_step_and_gated_at_ten_percent() -> None:
    rng = np.random.default_rng(2)
    t = np.arange(400, dtype=np.int64) * 15_000_000_000
    x = 1.0 + 0.02 * rng.standard_normal(400)
    x[250:] *= 1.3
    x[100] = 40.0  # one stalled step
    change = step_change(t, x)
    assert change is not None
    assert change.at == pd.Timestamp(int(t[250]), unit="ns", tz="UTC")
    assert change.change_pct == pytest.approx(30, abs=2)
    y = 1.0 + 0.02 * rng.standard_normal(400)
    y[250:] *= 1.05  # below the gate
    assert step_change(t, y) is None
