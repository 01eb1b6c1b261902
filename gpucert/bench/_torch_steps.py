"""The per-GPU benchmarks, on torch: BF16 GEMM, HBM copy, pinned host↔device copies.

Each function measures once. On a CUDA device the time is taken with CUDA events around a sustained loop
(synchronising between batches of about 0.1 s, so the host knows when to stop); on the CPU with
``time.perf_counter``. A failure (no CUDA, out of memory, a lost GPU) propagates: an ``error`` row.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

__all__ = ["StepUnavailable", "copy_gbps", "gemm_tflops", "load_torch", "synchronize", "transfer_gbps"]

#: The host-side time one batch of work should take between synchronisations.
_BATCH_SECONDS = 0.1


class StepUnavailable(Exception):
    """A step cannot run here (no torch, no CUDA, a GPU torch cannot use): the reason, in one line."""


def load_torch() -> Any:
    """Import torch lazily; :class:`StepUnavailable` when it is not installed or does not import."""
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install raising anything on import
        raise StepUnavailable(f"torch is not installed or does not import ({type(exc).__name__}: {exc})") from None
    return torch


def synchronize(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sustain(torch: Any, device: Any, op: Callable[[], object], seconds: float, *, warmup: int = 2) -> tuple[int, float]:
    """Run ``op`` back to back for at least ``seconds`` (after ``warmup`` calls); return (count, seconds)."""
    for _ in range(max(1, warmup)):
        op()
    synchronize(torch, device)
    t0 = time.perf_counter()
    op()
    synchronize(torch, device)
    one = max(time.perf_counter() - t0, 1e-7)
    batch = max(1, min(10_000, int(_BATCH_SECONDS / one)))
    cuda = device.type == "cuda"
    if cuda:
        # Events on the stream the work goes to: that of ``device`` (not of whatever device is current).
        stream = torch.cuda.current_stream(device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(stream)
    t0 = time.perf_counter()
    iterations = 0
    while True:
        for _ in range(batch):
            op()
        iterations += batch
        synchronize(torch, device)
        if time.perf_counter() - t0 >= seconds:
            break
    if cuda:
        end.record(stream)
        end.synchronize()
        elapsed = float(start.elapsed_time(end)) / 1000.0
    else:
        elapsed = time.perf_counter() - t0
    if not math.isfinite(elapsed) or elapsed <= 0:
        raise RuntimeError(f"the timer measured {elapsed!r} s for {iterations} iterations")
    return iterations, elapsed


def gemm_tflops(torch: Any, device: Any, shape: tuple[int, int, int], seconds: float) -> float:
    """BF16 ``C[m×n] = A[m×k] · B[k×n]`` sustained for ``seconds``: 2·m·n·k·iterations / s / 1e12."""
    m, n, k = shape
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(k, n, device=device, dtype=torch.bfloat16, generator=gen)
    c = torch.empty(m, n, device=device, dtype=torch.bfloat16)
    iterations, elapsed = sustain(torch, device, lambda: torch.mm(a, b, out=c), seconds, warmup=3)
    return 2.0 * m * n * k * iterations / elapsed / 1e12


def copy_gbps(torch: Any, device: Any, nbytes: int, seconds: float) -> float:
    """Device-to-device copy of ``nbytes``: (bytes read + bytes written) / s / 1e9 (STREAM convention)."""
    count = max(1, nbytes // 4)
    src = torch.ones(count, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    iterations, elapsed = sustain(torch, device, lambda: dst.copy_(src), seconds)
    return 2.0 * count * 4 * iterations / elapsed / 1e9


def transfer_gbps(torch: Any, device: Any, nbytes: int, seconds: float, *, to_device: bool) -> float:
    """Pinned host memory to the device (``to_device``) or back: bytes moved / s / 1e9. On the CPU (the
    pipeline test) both buffers are host memory and nothing is pinned."""
    count = max(1, nbytes // 4)
    pin = device.type == "cuda"
    host = torch.ones(count, dtype=torch.float32, pin_memory=pin)
    dev = torch.ones(count, dtype=torch.float32, device=device)
    if to_device:
        iterations, elapsed = sustain(torch, device, lambda: dev.copy_(host, non_blocking=pin), seconds)
    else:
        iterations, elapsed = sustain(torch, device, lambda: host.copy_(dev, non_blocking=pin), seconds)
    return count * 4 * iterations / elapsed / 1e9
