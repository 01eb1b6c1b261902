"""Intra-node all-reduce bus bandwidth with torch.distributed: one spawned process per GPU.

NCCL over the node's GPUs on CUDA; gloo over a few local processes on the CPU, so the whole pipeline is
tested without a GPU. The rendezvous is a TCP store on 127.0.0.1. Each repeat times ``iters`` in-place
all-reduces of ``nbytes`` (float32) after ``warmup`` untimed ones; the time of a repeat is the slowest
rank's. Bus bandwidth as nccl-tests defines it: algbw = bytes / time, busbw = algbw · 2(n−1)/n.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["AllReduceConfig", "busbw_gbps", "run_allreduce"]


def busbw_gbps(nbytes: int, seconds_per_iter: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce, in GB/s (1e9 bytes)."""
    algbw = nbytes / seconds_per_iter / 1e9
    return algbw * 2.0 * (ranks - 1) / ranks


@dataclass(frozen=True)
class AllReduceConfig:
    ranks: int
    backend: str  # "nccl" or "gloo"
    device: str  # "cuda" or "cpu"
    nbytes: int
    repeats: int
    iters: int = 20
    warmup: int = 5
    timeout_s: float = 300.0
    #: torch device indices of the GPUs, rank r drives devices[r] (CUDA only)
    devices: tuple[int, ...] = ()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, cfg: AllReduceConfig, port: int, results: Any) -> None:
    # Nothing a rank (or NCCL, which logs to stdout) prints may reach the payload's stdout: rows only.
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch
    import torch.distributed as torch_dist

    if cfg.device == "cuda":
        device = torch.device("cuda", cfg.devices[rank] if cfg.devices else rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    torch_dist.init_process_group(
        cfg.backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=cfg.ranks,
        timeout=dt.timedelta(seconds=cfg.timeout_s),
    )
    try:
        count = max(1, cfg.nbytes // 4)
        buf = torch.ones(count, dtype=torch.float32, device=device)

        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        for _ in range(cfg.warmup):
            torch_dist.all_reduce(buf)
        sync()
        times = []
        for _ in range(cfg.repeats):
            torch_dist.barrier()
            sync()
            t0 = time.perf_counter()
            for _ in range(cfg.iters):
                torch_dist.all_reduce(buf)
            sync()
            elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
            torch_dist.all_reduce(elapsed, op=torch_dist.ReduceOp.MAX)
            times.append(float(elapsed.item()) / cfg.iters)
        if rank == 0:
            results.put([busbw_gbps(count * 4, t, cfg.ranks) for t in times])
    finally:
        torch_dist.destroy_process_group()


def run_allreduce(torch: Any, cfg: AllReduceConfig) -> list[float]:
    """Spawn the ranks, wait (at most ``timeout_s`` in all), return busbw per repeat; raise on failure."""
    if cfg.ranks < 2:
        raise ValueError("an all-reduce needs at least two ranks")
    tmp = torch.multiprocessing
    ctx = tmp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = _free_port()
    procs = tmp.start_processes(_worker, args=(cfg, port, results), nprocs=cfg.ranks, join=False, start_method="spawn")
    deadline = time.monotonic() + cfg.timeout_s + 60.0  # start-up (imports, NCCL init) comes on top
    try:
        while not procs.join(timeout=0.1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the all-reduce ranks did not finish within {cfg.timeout_s + 60:.0f} s")
    finally:
        for p in procs.processes:
            if p.is_alive():
                p.kill()
    # SimpleQueue has no timeout: it is read only once every rank has exited.
    if results.empty():
        raise RuntimeError("the all-reduce ranks finished without a result")
    got = results.get()
    if not isinstance(got, list) or len(got) != cfg.repeats:
        raise RuntimeError(f"the all-reduce ranks returned {got!r}")
    return [float(v) for v in got]
