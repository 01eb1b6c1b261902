"""The judgement of issue 31 on synthetic frames: the straggler only the job sees, transients, hangs, routine
stalls, PCIe and memory errors, two faults at once (the frames and helpers of ``tests/test_explain_diagnose.py``).

The real-Prometheus side of the same scenarios (labels as real exporters write them) is
``tests/test_explain_labels.py``.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from gpucert.explain import empty_collectives

from .test_explain_diagnose import START, STEP_S, events, gauge_steps, job, nic, node_name, telemetry


def collectives(
    nodes: int, minutes: int, *, seed: int, slow: tuple[int, int, float, float] | None = None, extra_small: bool = False
) -> pd.DataFrame:
    """NCCL Inspector's per-rank AllReduce times (one rank per GPU, rank = node × 8 + gpu) at each 15 s instant.

    ``slow`` = (node, gpu, from_minute, to_minute): that GPU computes 20 % slower, so it arrives last at every
    collective: its own time stays at the healthy 300 µs while every other rank's grows to 440 µs (they wait).
    ``extra_small``: a small Broadcast on another communicator too (bandwidth of another order).
    """
    rng = np.random.default_rng(seed + 77)
    n_t = minutes * 4 + 1
    minute = np.arange(n_t) * STEP_S / 60
    n_g = nodes * 8
    exec_us = 300.0 * (1 + 0.015 * rng.standard_normal((n_t, n_g)))
    if slow is not None:
        node, gpu, since, until = slow
        rows = (minute >= since) & (minute < until)
        col = node * 8 + gpu
        waiting = np.ones(n_g, dtype=bool)
        waiting[col] = False
        exec_us[np.ix_(rows, waiting)] *= 440.0 / 300.0
    busbw = 360.0 * 300.0 / exec_us
    ts = START + pd.to_timedelta(np.arange(n_t) * STEP_S, unit="s")
    t_idx = np.repeat(np.arange(n_t), n_g)
    g_idx = np.tile(np.arange(n_g), n_t)
    frame = pd.DataFrame(
        {
            "ts": ts[t_idx],
            "node": [node_name(i) for i in g_idx // 8],
            "gpu": pd.array(g_idx % 8, dtype="Int64"),
            "comm": "0x7f3a",
            "collective": "AllReduce",
            "busbw_gbps": busbw.ravel(),
            "exec_time_us": exec_us.ravel(),
            "rank": pd.array(g_idx, dtype="Int64"),
            "pod": [f"train-{i}" for i in g_idx // 8],
        }
    )
    if extra_small:
        small = frame.copy()
        small["comm"], small["collective"] = "0x11aa", "Broadcast"
        small["busbw_gbps"] = 4.0 * (1 + 0.01 * rng.standard_normal(len(small)))
        small["exec_time_us"] = 25.0 * (1 + 0.01 * rng.standard_normal(len(small)))
        frame = pd.concat([frame, small], ignore_index=True)
    return frame


def test_a_gpu_slower_with_no_dcgm_sign_is_named_from_the_collectives() -> None:
    """Issue 31's scene: telemetry silent, the job 20 % slower, the peers wait for one rank every collective."""
    j = job(16, 90, seed=5, slow_from=40, factor=1.2)
    ex = j.explain(collectives=collectives(16, 90, seed=5, slow=(6, 2, 40, 999)))
    assert ex.verdict == "gpu"
    top = ex.suspects[0]
    assert (top.node, top.gpu, top.silent) == (node_name(6), 2, True)
    assert "rank 50" in top.evidence[0]
    assert "pod train-6" in top.evidence[0]
    assert any(e.startswith("its telemetry shows no cause") for e in top.evidence)
    assert top.onset == START + pd.Timedelta(minutes=40)
    assert ex.answer[0].startswith(f"gpu: {node_name(6)} GPU 2 (GPU-0032-uuid) is the straggler — NCCL: rank 50")
    assert ex.recommendations[0].startswith(f"re-certify {node_name(6)} (GPU 2): certify runs when it is idle")
    assert not any(r.startswith("cordon") for r in ex.recommendations)


def test_without_the_collectives_the_silent_straggler_is_not_invented() -> None:
    ex = job(16, 90, seed=5, slow_from=40, factor=1.2).explain()
    assert ex.verdict == "elsewhere"
    assert not ex.suspects


def test_nccl_figures_compare_like_with_like() -> None:
    """A suspect's NCCL line compares each communicator's collective with its own kind: a small Broadcast beside
    the AllReduce made the per-node figure read "+9188 %"."""
    j = job(16, 60, seed=7, slow_from=25, factor=1.3)
    j.nic = nic(16, 60, half=(9, "mlx5_3", 25))
    coll = collectives(16, 60, seed=7, extra_small=True)
    on_node = (coll["node"] == node_name(9)).to_numpy() & (coll["collective"] == "AllReduce").to_numpy()
    coll.loc[on_node & (coll["ts"] >= START + pd.Timedelta(minutes=25)).to_numpy(), "busbw_gbps"] *= 0.5
    ex = j.explain(collectives=coll)
    assert ex.verdict == "network"
    line = next(e for e in ex.suspects[0].evidence if e.startswith("NCCL bus bandwidth"))
    assert "(−50 %)" in line, line
    figures = [int(m) for m in re.findall(r"\(([+−-]?\d+) %\)", " ".join(ex.suspects[0].evidence).replace("−", "-"))]
    assert all(abs(f) <= 100 for f in figures)


def test_a_blip_that_recovered_is_transient_with_its_window_and_no_cordon() -> None:
    j = job(16, 90, seed=9, throttle=(3, 1, 30))
    # The throttle lasts two minutes: from minute 32 on, the GPU runs like its peers again.
    tel = j.telemetry
    healthy = telemetry(16, 90, seed=9)
    after = (tel["ts"] >= START + pd.Timedelta(minutes=32)).to_numpy()
    tel.loc[after, "value"] = healthy.loc[after, "value"].to_numpy()
    ex = j.explain()
    assert ex.verdict == "transient"
    top = ex.suspects[0]
    assert (top.node, top.gpu, top.layer) == (node_name(3), 1, "transient")
    assert top.evidence[0].startswith("transient: departed 08:30:00–08:32:00 (2.0 min)")
    assert "from 08:30:00 to 08:32:00 UTC (2.0 min), then recovered" in ex.answer[1]
    assert not any("cordon" in r and "no cordon" not in r for r in ex.recommendations)
    assert ex.recommendations[0].startswith("nothing to do now")


def test_a_standing_throttle_is_no_transient() -> None:
    ex = job(16, 90, seed=9, throttle=(3, 1, 30), slow_from=30, factor=1.5).explain()
    assert ex.verdict == "gpu"
    assert ex.suspects[0].layer == "gpu"
    assert ex.suspects[0].until is None


def _with_pcie(
    j_tel: pd.DataFrame,
    *,
    seed: int,
    downtrain: tuple[int, int, int] | None = None,
    replay_noise: float = 30.0,
    replay_fault: float = 0.0,
) -> pd.DataFrame:
    """Add link generation and width (current and max) and noisy PCIe replays to a telemetry frame: peers replay
    0..``replay_noise`` per minute at random; a downtrained GPU (node, gpu, from_minute) runs Gen4 x4 of Gen5 x16
    and replays ``replay_fault`` per minute."""
    rng = np.random.default_rng(seed + 5)
    base = j_tel[j_tel["signal"] == "temp_c"]
    n = len(base)
    minute = ((base["ts"] - START).dt.total_seconds() / 60).to_numpy()
    col = base["node"].cat.codes.to_numpy() * 8 + base["gpu"].to_numpy(dtype=np.int64)
    gen, width = np.full(n, 5.0), np.full(n, 16.0)
    replays = rng.random(n) * replay_noise * (rng.random(n) < 0.3)
    if downtrain is not None:
        node, gpu, since = downtrain
        hit = (col == node * 8 + gpu) & (minute >= since)
        gen[hit], width[hit], replays[hit] = 4.0, 4.0, replay_fault
    parts = [j_tel[j_tel["signal"] != "pcie_replays_per_min"]]
    for signal, values in (
        ("pcie_link_gen", gen),
        ("pcie_link_gen_max", np.full(n, 5.0)),
        ("pcie_link_width", width),
        ("pcie_link_width_max", np.full(n, 16.0)),
        ("pcie_replays_per_min", replays),
    ):
        part = base.copy()
        part["signal"] = signal
        part["value"] = values
        parts.append(part)
    out = pd.concat([p.astype({"signal": str}) for p in parts], ignore_index=True)
    out["signal"] = out["signal"].astype("category")
    return out


def test_a_downtrained_pcie_link_among_noisy_peers_is_named_with_its_link() -> None:
    j = job(16, 90, seed=4, slow_from=40, factor=1.2)
    j.telemetry = _with_pcie(j.telemetry, seed=4, downtrain=(11, 6, 40), replay_fault=400.0)
    ex = j.explain()
    assert ex.verdict == "gpu"
    top = ex.suspects[0]
    assert (top.node, top.gpu) == (node_name(11), 6)
    text = " | ".join(top.evidence)
    assert "PCIe link trained down to Gen4 x4 vs its maximum Gen5 x16 (peers run Gen5 x16) from 08:40:00" in text
    assert "PCIe replays 400 per minute" in text
    assert "the job's step time rose" in text  # tied to the slowdown
    assert [s for s in ex.suspects if s.node != node_name(11)] == []  # noisy peers are not blamed


def test_noisy_replays_alone_blame_nobody() -> None:
    j = job(16, 60, seed=12)
    j.telemetry = _with_pcie(j.telemetry, seed=12, replay_noise=40.0)
    ex = j.explain()
    assert ex.suspects == ()
    assert ex.verdict == "healthy"


def test_single_bit_ecc_and_a_pending_row_remap_are_signals() -> None:
    j = job(16, 60, seed=13)
    tel = j.telemetry
    base = tel[tel["signal"] == "temp_c"]
    col = base["node"].cat.codes.to_numpy() * 8 + base["gpu"].to_numpy(dtype=np.int64)
    minute = ((base["ts"] - START).dt.total_seconds() / 60).to_numpy()
    sbe = np.where(np.random.default_rng(1).random(len(base)) < 0.01, 1.0, 0.0)  # peers: the odd one
    sbe[(col == 20) & (minute >= 20)] = 8.0
    pending = np.where((col == 20) & (minute >= 35), 1.0, 0.0)
    remapped = np.where((col == 20) & (minute >= 40), 2.0, np.where(col == 20, 1.0, np.nan))  # absent: zero
    parts = [tel.astype({"signal": str})]
    for signal, values in (("ecc_sbe", sbe), ("row_remap_pending", pending), ("remapped_rows_correctable", remapped)):
        part = base.astype({"signal": str})
        part["signal"], part["value"] = signal, values
        parts.append(part)
    j.telemetry = pd.concat(parts, ignore_index=True).astype({"signal": "category"})
    ex = j.explain()
    top = ex.suspects[0]
    assert (top.node, top.gpu) == (node_name(2), 4)
    text = " | ".join(top.evidence)
    assert "single-bit ECC errors in the window" in text
    assert "from 08:2" in text
    assert "a row remap is pending (ECC): the GPU needs a reset, from 08:35:00" in text
    assert "1 more correctable remapped rows (ECC) from 08:40:00" in text
    assert len(ex.suspects) == 1


def test_a_hang_is_its_own_finding_with_its_start_and_the_collective_in_flight() -> None:
    """The step gauge freezes at 08:40 while every GPU stays busy (spinning in NCCL) to the window's end."""
    j = job(16, 60, seed=21)
    gauge = gauge_steps(16, 60, seed=21)
    frozen = (gauge["ts"] >= START + pd.Timedelta(minutes=40)).to_numpy()
    last = gauge.loc[(gauge["ts"] == START + pd.Timedelta(minutes=40)).to_numpy(), "step_time_s"].iloc[0]
    gauge.loc[frozen, "step_time_s"] = last
    j.steps = gauge
    coll = collectives(16, 60, seed=21)
    coll = coll[(coll["ts"] < START + pd.Timedelta(minutes=40)).to_numpy() | (coll["node"] == "none").to_numpy()]
    # Rank 13 (node 1 GPU 5) stopped completing collectives a minute before the others: it never entered the last.
    late = (coll["rank"] == 13).to_numpy() & (coll["ts"] >= START + pd.Timedelta(minutes=39)).to_numpy()
    ex = j.explain(collectives=coll[~late])
    assert ex.verdict == "hang"
    top = ex.suspects[0]
    assert top.layer == "hang"
    assert top.onset == START + pd.Timedelta(minutes=40)
    assert top.evidence[0].startswith("the job stopped stepping at 08:40:00 UTC and its GPUs stayed busy")
    assert "to the end of the window (20.0 min)" in top.evidence[0]
    assert top.evidence[1].startswith("collective in flight: AllReduce on communicator 0x7f3a")
    assert top.evidence[2] == f"1 rank(s) never entered it: {node_name(1)} GPU 5 (rank 13)"
    assert top.node == node_name(1)
    assert ex.answer[0].startswith("hang: the job stopped stepping at 08:40:00")


def test_an_idle_stall_behind_a_frozen_gauge_is_no_hang() -> None:
    j = job(16, 60, seed=18, stall=(4, 30, 35))
    j.steps = gauge_steps(16, 60, seed=18)
    assert j.explain().verdict != "hang"


def test_checkpoint_stalls_are_periodic_and_the_job_is_healthy() -> None:
    """Every 15 minutes the job writes a checkpoint for a minute: nothing is logged, the GPUs idle."""
    j = job(16, 90, seed=31)
    stp = j.steps
    minute = ((stp["ts"] - START).dt.total_seconds() / 60).to_numpy()
    writing = np.zeros(len(stp), dtype=bool)
    for at in (15, 30, 45, 60, 75):
        writing |= (minute >= at) & (minute < at + 1)
    j.steps = stp[~writing].reset_index(drop=True)
    ex = j.explain()
    assert ex.verdict == "healthy", ex.answer
    assert "5 periodic stalls of ~" in ex.answer[1]
    assert "every 15.0 min (checkpoints, most likely)" in ex.answer[1]


def test_two_faults_are_both_in_the_headline_largest_first() -> None:
    j = job(16, 90, seed=3, throttle=(7, 3, 40), slow_from=40, factor=2.0)
    j.nic = nic(16, 90, half=(12, "mlx5_1", 40))
    ex = j.explain()
    assert ex.verdict == "gpu"
    layers = [(s.node, s.layer) for s in ex.suspects[:2]]
    assert layers == [(node_name(7), "gpu"), (node_name(12), "network")]
    assert ex.answer[0].startswith(f"gpu: {node_name(7)} GPU 3")
    assert f"; and network: {node_name(12)}'s NIC — mlx5_1 port 1 at 200 Gb/s" in ex.answer[0]


def test_events_and_empty_collectives_keep_the_old_answers() -> None:
    j = job(16, 60, seed=18, stall=(4, 30, 35), step_stall=(30, 35))
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
                "note": "The node was low on resource: memory.",
            }
        ]
    )
    ex = j.explain(collectives=empty_collectives())
    assert ex.verdict == "event"


def test_steps_that_stop_in_the_logs_while_the_gpus_spin_are_a_hang() -> None:
    j = job(16, 60, seed=22)
    j.steps = j.steps[(j.steps["ts"] < START + pd.Timedelta(minutes=40)).to_numpy()].reset_index(drop=True)
    ex = j.explain()
    assert ex.verdict == "hang"
    top = ex.suspects[0]
    assert top.onset is not None
    assert abs((top.onset - (START + pd.Timedelta(minutes=40))).total_seconds()) <= 2
    assert "to the end of the window" in top.evidence[0]
    assert top.evidence[1] == "no NCCL timings: the collective in flight is unknown"


def test_the_silent_stragglers_ticket_names_no_cause_its_telemetry_does_not_show() -> None:
    from gpucert.explain import cause_of

    j = job(16, 90, seed=5, slow_from=40, factor=1.2)
    ex = j.explain(collectives=collectives(16, 90, seed=5, slow=(6, 2, 40, 999)))
    assert cause_of(ex.suspects[0]) == "unknown"  # certify's verdict settles it
