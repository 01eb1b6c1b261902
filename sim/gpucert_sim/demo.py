"""``gpucert demo``: the certify loop on a generated fleet, end to end through the real commands.

It writes results files the way benchmark Jobs would, builds baselines in a ``file://`` store from five
certification waves, then judges a night in which faults were injected (and one GPU was swapped, and a new
driver made the whole fleet 2 % slower), and prints what gpucert found next to what was injected.
"""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from gpucert import commands
from gpucert._text import counted
from gpucert.results import write_results

from .fleet import Fault, Fleet

__all__ = ["run_demo"]

_SEED_WAVES = 5


def _night_faults(fleet: Fleet) -> list[Fault]:
    n = fleet.node_names
    return [
        Fault("pcie_gen4", node=n[1], gpu=3),
        Fault("hw_thermal", node=n[2], gpu=5, params={"duty": 0.3}),
        Fault("power_brake", node=n[4], params={"duty": 0.2}),
        Fault("nvlink_one_down", node=n[6], gpu=0),
        Fault("remap_failure", node=n[8], gpu=6),
        Fault("slow_silicon", node=n[10], gpu=2, params={"gemm": 0.91}),
        Fault("host_contention", node=n[12], params={"h2d": 0.7}),
    ]


def run_demo(*, workdir: str, nodes: int = 16, seed: int = 7) -> int:
    console = Console()
    root = Path(workdir).resolve()
    if root.exists():
        shutil.rmtree(root)
    (root / "runs").mkdir(parents=True)
    store = (root / "store").as_uri()
    fleet = Fleet.generate(nodes=nodes, seed=seed)
    console.rule("[bold]gpucert demo")
    console.print(f"A fleet of {counted(nodes, 'node')} × 8 NVIDIA H200, store {store}")

    start = dt.datetime(2026, 11, 1, 2, tzinfo=dt.UTC)
    seed_files = []
    for i in range(_SEED_WAVES):
        wave = fleet.run(f"seed-{i + 1}", ts=start + dt.timedelta(days=i), seed=seed * 100 + i)
        path = root / "runs" / f"seed-{i + 1}.parquet"
        write_results(wave.results, path)
        seed_files.append(str(path))
    console.print(f"\n[bold]1. Baselines[/] from {_SEED_WAVES} certification waves")
    commands.baseline_build(seed_files, store=store, policy_file=None, stack_file=None)

    tonight = fleet.replace_gpus(1 / (nodes * 8), seed=seed)
    faults = _night_faults(tonight)
    night = tonight.run(
        "night-1", ts=start + dt.timedelta(days=30), seed=seed * 100 + 99, faults=faults, fleet_shift=-0.02
    )
    night_file = root / "runs" / "night-1.parquet"
    write_results(night.results, night_file)
    console.print(
        "\n[bold]2. Tonight[/]: a new driver costs every GPU 2 %, one GPU was swapped, and these faults were injected:"
    )
    for fault in faults:
        where = fault.node + (f" GPU {fault.gpu}" if fault.gpu is not None else " (whole node)")
        console.print(f"   • {fault.kind:<16} {where}")

    console.print("\n[bold]3. gpucert compare")
    out = root / "verdicts-night-1.csv"
    commands.compare([str(night_file)], baselines=store, policy_file=None, out=str(out))
    verdicts = pd.read_csv(out, dtype={"gpu": "Int64"})
    _print_findings(console, verdicts)
    _print_truth(console, night.truth, verdicts)
    console.print(f"\nFiles: {root}/  (results in runs/, baselines in store/, verdicts in {out.name})")
    console.print("Try: [cyan]gpucert compare " + f"{night_file} --baselines {store} --out v.csv --fail-on fail")
    return 0


def _print_findings(console: Console, verdicts: pd.DataFrame) -> None:
    flagged = verdicts[verdicts["verdict"] != "pass"].fillna({"node": "(fleet)", "cause": "", "reasons": ""})
    table = Table(title="What gpucert found (every row that is not a pass)", show_lines=False, expand=True)
    for column, style in (
        ("node", "bold"),
        ("gpu", ""),
        ("verdict", ""),
        ("cause", "magenta"),
        ("action", "cyan"),
        ("ticket", ""),
        ("why", ""),
    ):
        table.add_column(column, style=style, overflow="fold", ratio=4 if column == "why" else None)
    colours = {"fail": "red", "warn": "yellow", "inconclusive": "blue"}
    for row in flagged.to_dict("records"):  # the flagged rows only: a handful
        gpu = "" if pd.isna(row["gpu"]) else str(row["gpu"])
        why = str(row["reasons"]).split("; ")[0]
        table.add_row(
            str(row["node"]),
            gpu,
            f"[{colours.get(str(row['verdict']), '')}]{row['verdict']}",
            str(row["cause"]),
            str(row["action"]),
            str(row["ticket"]),
            why,
        )
    console.print(table)


def _print_truth(console: Console, truth: pd.DataFrame, verdicts: pd.DataFrame) -> None:
    table = Table(title="Injected faults against the verdicts")
    for column in ("fault", "where", "expected cause", "verdict", "cause", "right?"):
        table.add_column(column)
    for fault in truth.to_dict("records"):
        on_gpu = not pd.isna(fault["gpu"])
        same_node = verdicts["node"] == fault["node"]
        hit = (
            verdicts[same_node & (verdicts["gpu"] == fault["gpu"])]
            if on_gpu
            else verdicts[same_node & verdicts["gpu"].isna() & verdicts["peer"].isna()]
        )
        verdict = str(hit["verdict"].iloc[0]) if len(hit) else "(no row)"
        cause = str(hit["cause"].fillna("").iloc[0]) if len(hit) else ""
        found = verdict in ("warn", "fail")
        right = "✓" if found and (cause == fault["expected_cause"] or not fault["signature"]) else "✗"
        where = str(fault["node"]) + (f" GPU {fault['gpu']}" if on_gpu else "")
        table.add_row(str(fault["kind"]), where, str(fault["expected_cause"]), verdict, cause, right)
    console.print(table)
