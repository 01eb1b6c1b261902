"""How fast ``gpucert explain`` judges a big job and draws its timeline, beyond the Prometheus queries.

Synthetic frames as the gatherer hands them over (category columns, UTC timestamps on the scrape grid), for
``--nodes`` nodes × 8 GPUs over ``--hours`` of ``--step`` s telemetry: ten DCGM signals per GPU (≈ 7.4 M rows for
64 × 8 × 6 h at 15 s), one step line per pod per step (1 s steps: ≈ 1.4 M rows), NIC counters of eight RDMA ports
per node (≈ 3 M rows) and a few events. One GPU throttles thermally from ``--throttle-at`` of the window on (SM clock
halved, HW thermal and HW slowdown bits, hotter, less power) and the job's step time doubles with it. Printed: the
rows of each frame, the seconds to build them (not timed against the bar), ``explain`` and ``render_timeline`` each
(best of ``--repeats``), the page's size, the peak memory, and the judgement's answer, which must name the throttled
GPU with its onset (the script exits 1 when it does not).

    python benchmarks/explain_speed.py [--nodes 64] [--hours 6] [--step 15] [--seed 1] [--repeats 1]
                                       [--throttle-at 0.6] [--no-nic] [--out benchmarks/out/explain.html]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from gpucert.explain import empty_collectives, empty_record, explain, render_timeline

START = pd.Timestamp("2026-12-01T00:00:00Z")
SIGNALS = {  # healthy mean, noise sd
    "sm_clock_mhz": (1980.0, 8.0),
    "clock_event_reasons": (0.0, 0.0),
    "power_w": (650.0, 12.0),
    "temp_c": (66.0, 1.5),
    "util_pct": (95.0, 1.5),
    "engine_active": (0.9, 0.015),
    "nvlink_gbps": (310.0, 6.0),
    "pcie_gbps": (22.0, 1.0),
    "xid": (0.0, 0.0),
    "ecc_dbe": (0.0, 0.0),
}


def build(
    nodes: int, hours: float, step_s: float, seed: int, throttle_at: float, with_nic: bool
) -> tuple[dict[str, pd.DataFrame | None], tuple[str, int, pd.Timestamp]]:
    """The frames of a job with one GPU throttling, and (node, GPU, onset) of that GPU."""
    rng = np.random.default_rng(seed)
    n_t = int(hours * 3600 / step_s) + 1
    n_g = nodes * 8
    names = [f"gpu-node-{i:05d}" for i in range(nodes)]
    bad_col = int(rng.integers(n_g))
    onset_i = int(throttle_at * (n_t - 1))
    onset = START + pd.Timedelta(seconds=onset_i * step_s)
    ts = START + pd.to_timedelta(np.arange(n_t) * step_s, unit="s")

    values = np.empty(len(SIGNALS) * n_t * n_g)
    for k, (signal, (mean, sd)) in enumerate(SIGNALS.items()):
        m = mean + sd * rng.standard_normal((n_t, n_g)) if sd else np.full((n_t, n_g), mean)
        if signal == "clock_event_reasons":
            m = np.where(rng.random((n_t, n_g)) < 0.3, 4.0, 0.0)
            m[onset_i:, bad_col] = m[onset_i:, bad_col].astype(np.int64) | 0x48
        elif signal == "sm_clock_mhz":
            m[onset_i:, bad_col] *= 0.5
        elif signal == "temp_c":
            m[onset_i:, bad_col] += 22
        elif signal == "power_w":
            m[onset_i:, bad_col] *= 0.62
        values[k * n_t * n_g : (k + 1) * n_t * n_g] = m.ravel()
        del m
    per_signal = n_t * n_g
    g_idx = np.tile(np.arange(n_g, dtype=np.int32), n_t * len(SIGNALS))
    t_idx = np.tile(np.repeat(np.arange(n_t, dtype=np.int32), n_g), len(SIGNALS))
    telemetry = pd.DataFrame(
        {
            "ts": ts[t_idx],
            "node": pd.Categorical.from_codes(g_idx // 8, categories=pd.Index(names)),
            "gpu": pd.array(g_idx % 8, dtype="Int64"),
            "gpu_uuid": pd.Categorical.from_codes(g_idx, categories=pd.Index([f"GPU-{i:08x}" for i in range(n_g)])),
            "pod": pd.Categorical.from_codes(g_idx // 8, categories=pd.Index([f"train-{i}" for i in range(nodes)])),
            "signal": pd.Categorical.from_codes(
                np.repeat(np.arange(len(SIGNALS)), per_signal), categories=pd.Index(list(SIGNALS))
            ),
            "value": values,
        }
    )
    del g_idx, t_idx

    # One line per pod per step; a step takes 1 s, 2 s once the GPU throttles (synchronous training).
    total = hours * 3600
    dt = 1.0 + 0.02 * rng.standard_normal(int(total * 1.1) + 10)
    ends = np.cumsum(dt)
    slow = ends > onset_i * step_s
    dt = np.where(slow, dt * 2, dt)
    ends = np.cumsum(dt)
    keep = ends <= total
    ends, dt = ends[keep], dt[keep]
    n_s = len(ends)
    pods = np.tile(np.arange(nodes), n_s)
    steps = pd.DataFrame(
        {
            "ts": START + pd.to_timedelta(np.repeat(ends, nodes), unit="s"),
            "pod": pd.Categorical.from_codes(pods, categories=pd.Index([f"train-{i}" for i in range(nodes)])),
            "node": pd.Categorical.from_codes(pods, categories=pd.Index(names)),
            "step": pd.array(np.repeat(np.arange(1, n_s + 1), nodes), dtype="Int64"),
            "step_time_s": np.repeat(dt, nodes),
        }
    )

    nic = None
    if with_nic:
        nic_signals = ("rate_gbps", "symbol_errors", "link_downed", "rcv_errors")
        n_p = nodes * 8
        p_idx = np.tile(np.arange(n_p), n_t * len(nic_signals))
        s_idx = np.repeat(np.arange(len(nic_signals)), n_t * n_p)
        nic = pd.DataFrame(
            {
                "ts": ts[np.tile(np.repeat(np.arange(n_t), n_p), len(nic_signals))],
                "node": pd.Categorical.from_codes(p_idx // 8, categories=pd.Index(names)),
                "device": pd.Categorical.from_codes(p_idx % 8, categories=pd.Index([f"mlx5_{d}" for d in range(8)])),
                "port": pd.array(np.ones(len(p_idx), dtype=np.int64), dtype="Int64"),
                "signal": pd.Categorical.from_codes(s_idx, categories=pd.Index(list(nic_signals))),
                "value": np.where(s_idx == 0, 400.0, 0.0),
            }
        )
    events = pd.DataFrame(
        {
            "ts": pd.to_datetime([START + pd.Timedelta(minutes=5), START + pd.Timedelta(hours=2)], utc=True),
            "object_kind": ["Pod", "Node"],
            "object_name": ["train-3", names[1]],
            "namespace": ["ml", None],
            "node": [names[3], names[1]],
            "reason": ["Started", "Certified"],
            "type": ["Normal", "Normal"],
            "note": ["Started container train", "gpucert: certified"],
        }
    )
    frames: dict[str, pd.DataFrame | None] = {"telemetry": telemetry, "steps": steps, "events": events, "nic": nic}
    return frames, (names[bad_col // 8], bad_col % 8, onset)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--step", type=float, default=15.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--throttle-at", type=float, default=0.6)
    ap.add_argument("--no-nic", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/explain.html"))
    args = ap.parse_args(argv)

    t = time.perf_counter()
    frames, (node, gpu, onset) = build(args.nodes, args.hours, args.step, args.seed, args.throttle_at, not args.no_nic)
    built = time.perf_counter() - t
    for name, frame in frames.items():
        if frame is not None:
            print(f"{name:>10}: {len(frame):>10,} rows")
    print(f"built in {built:.1f} s (not part of the bar)")
    window = (START, START + pd.Timedelta(hours=args.hours))
    telemetry, steps, events = frames["telemetry"], frames["steps"], frames["events"]
    assert telemetry is not None
    assert steps is not None
    assert events is not None

    judge_s, render_s = [], []
    ex = None
    html = ""
    for _ in range(args.repeats):
        t = time.perf_counter()
        ex = explain(
            "ml/train",
            window,
            telemetry=telemetry,
            steps=steps,
            collectives=empty_collectives(),
            events=events,
            record=empty_record(),
            nic=frames["nic"],
            step_s=args.step,
        )
        judge_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        html = render_timeline(ex, telemetry=telemetry, steps=steps, events=events, step_s=args.step)
        render_s.append(time.perf_counter() - t)
    assert ex is not None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(html, encoding="utf-8")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"explain:          {min(judge_s):6.2f} s")
    print(f"render_timeline:  {min(render_s):6.2f} s   ({len(html) / 1e6:.1f} MB of HTML → {args.out})")
    print(f"together:         {min(judge_s) + min(render_s):6.2f} s   (bar: 30 s)   peak RSS {peak_mib:,.0f} MiB")
    print(f"injected:         {node} GPU {gpu} throttling from {onset:%H:%M:%S}")
    for line in ex.answer:
        print(f"answer:           {line}")
    top = ex.suspects[0] if ex.suspects else None
    ok = (
        top is not None
        and (top.node, top.gpu) == (node, gpu)
        and top.onset is not None
        and abs((top.onset - onset).total_seconds()) <= args.step
    )
    print("judgement:        " + ("names the throttled GPU, onset within one scrape interval" if ok else "WRONG"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
