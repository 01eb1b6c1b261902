"""All-reduce bus bandwidth with torch.distributed: the node's, and what the pair's ranks share with it.

One spawned process per GPU (NCCL) or, on the CPU, per pretend GPU (gloo, so the whole pipeline is tested
without a GPU). Each repeat times ``iters`` in-place float32 all-reduces after nccl-tests' warm-up; the time
is the slowest rank's. Bus bandwidth as nccl-tests defines it: algbw = bytes / time, busbw = algbw · 2(n−1)/n.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._torch_steps import synchronize

__all__ = [
    "AllReduceConfig",
    "busbw_gbps",
    "rank_device",
    "run_allreduce",
    "spawn_ranks",
    "sweep_buffer",
    "timed_sweep",
]


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


def rank_device(kind: str, devices: tuple[int, ...], local: int) -> tuple[Any, Any]:
    """In a spawned rank: (torch, the rank's device), its stdout sent to stderr first, since nothing a rank
    (or NCCL, which logs to stdout) prints may reach the payload's stdout: rows only."""
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch

    if kind != "cuda":
        return torch, torch.device("cpu")
    device = torch.device("cuda", devices[local] if devices else local)
    torch.cuda.set_device(device)
    return torch, device


def spawn_ranks(
    torch: Any,
    worker: Callable[..., None],
    args: tuple[Any, ...],
    ranks: int,
    *,
    limit_s: float,
    what: str,
    poll: Callable[[], None] = lambda: None,
) -> Any:
    """Start ``worker(local_rank, *args, results)`` in ``ranks`` spawned processes; return what one of them
    put in ``results`` (None when none did). Every rank still alive is killed before it returns or raises:
    ``TimeoutError`` when the ranks are not done within ``limit_s``, a failed rank's exception, or what
    ``poll`` (called each second) raises."""
    tmp = torch.multiprocessing
    results = tmp.get_context("spawn").SimpleQueue()
    procs = tmp.start_processes(worker, args=(*args, results), nprocs=ranks, join=False, start_method="spawn")
    deadline = time.monotonic() + limit_s
    next_poll = 0.0
    try:
        while not procs.join(timeout=0.1):
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"the {what} ranks did not finish within {limit_s:.0f} s")
            if now >= next_poll:
                poll()
                next_poll = now + 1.0
    finally:
        for p in procs.processes:
            if p.is_alive():
                p.kill()
    # SimpleQueue has no timeout: it is read only once every rank has exited.
    return None if results.empty() else results.get()


def sweep_buffer(torch: Any, dist: Any, device: Any, sizes: tuple[int, ...], warmup: int) -> Any:
    """A rank's buffer for all-reduces of ``sizes`` bytes, warmed up as nccl-tests does: ``warmup`` of them
    at the largest size and at the smallest (connections made, buffers registered). Zeros: a sum of ones,
    repeated, would overflow float32 into inf (harmless, but no data to look at)."""
    buf = torch.zeros(sizes[-1] // 4, dtype=torch.float32, device=device)
    for size in dict.fromkeys((sizes[-1], sizes[0])):
        for _ in range(warmup):
            dist.all_reduce(buf[: size // 4])
    synchronize(torch, device)
    return buf


def timed_sweep(torch: Any, dist: Any, device: Any, buf: Any, sizes: tuple[int, ...], iters: int) -> tuple[float, ...]:
    """Seconds per all-reduce of each of ``sizes`` bytes, timed over ``iters`` in a row: the slowest rank's,
    so that every rank has the same figures."""
    elapsed = []
    for size in sizes:
        view = buf[: size // 4]
        dist.barrier()  # every rank starts the size together: its time is the collective's, not skew
        synchronize(torch, device)
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(view)
        synchronize(torch, device)
        elapsed.append(time.perf_counter() - t0)
    slowest = torch.tensor(elapsed, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return tuple(float(v) / iters for v in slowest.tolist())


def _worker(rank: int, cfg: AllReduceConfig, port: int, results: Any) -> None:
    torch, device = rank_device(cfg.device, cfg.devices, rank)
    import torch.distributed as dist

    timeout = dt.timedelta(seconds=cfg.timeout_s)
    dist.init_process_group(
        cfg.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=cfg.ranks, timeout=timeout
    )
    try:
        sizes = (max(4, cfg.nbytes // 4 * 4),)
        buf = sweep_buffer(torch, dist, device, sizes, cfg.warmup)
        times = [timed_sweep(torch, dist, device, buf, sizes, cfg.iters)[0] for _ in range(cfg.repeats)]
        if rank == 0:
            results.put([busbw_gbps(sizes[0], t, cfg.ranks) for t in times])
    finally:
        dist.destroy_process_group()


def run_allreduce(torch: Any, cfg: AllReduceConfig) -> list[float]:
    """Spawn the ranks, wait (at most ``timeout_s`` in all), return busbw per repeat; raise on failure."""
    if cfg.ranks < 2:
        raise ValueError("an all-reduce needs at least two ranks")
    # Start-up (imports, NCCL init) comes on top of the collective's timeout.
    got = spawn_ranks(torch, _worker, (cfg, _free_port()), cfg.ranks, limit_s=cfg.timeout_s + 60.0, what="all-reduce")
    if got is None:
        raise RuntimeError("the all-reduce ranks finished without a result")
    if not isinstance(got, list) or len(got) != cfg.repeats:
        raise RuntimeError(f"the all-reduce ranks returned {got!r}")
    return [float(v) for v in got]
