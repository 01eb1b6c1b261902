"""The in-pod benchmark payload: ``python -m gpucert.bench [pair] --run-id RUN [--device cuda|cpu] …``.

It imports the standard library and, each only when present, torch and pynvml — never Prefect, the
Kubernetes client, pandas or numpy — so a stock PyTorch image runs it from a ConfigMap holding the
files :func:`payload_files` lists. It imports nothing else of gpucert: the metric registry and the results
columns are its own (:mod:`._metrics`), which :mod:`gpucert.metrics` re-exports.

stdout carries results rows only (docs/design/data-contracts.md), so that ``gpucert.results.read_results``
reads the Pod log as it is: the per-GPU benchmarks, the node's all-reduce (torch.distributed, or
``all_reduce_perf`` with ``--nccl-tests``) and storage, a pair's two-node all-reduce (:mod:`._pair`), more
repeats while they disagree (:mod:`._stability`), NVML telemetry and ``xid`` events (:mod:`._nvml`), the
RDMA NICs (:mod:`._nic`), and an ``error`` row wherever a step could not run, with the reason on stderr.
No number is ever made up; the exit status is 0 whenever rows were printed, 2 for bad arguments.
stderr carries human messages (prefixed ``gpucert-bench:``), the stack record ``gpucert-stack: {…}``
(:mod:`._devices`) and, with ``--dcgm``, the ``dcgmi diag`` summary ``gpucert-dcgm: {…}``.

On the CPU (``--device cpu``) the GPUs are pretend devices with model ``cpu``: the whole pipeline runs
with small sizes and is tested.
"""

from __future__ import annotations

from pathlib import Path

from ._cli import ArgumentsError, check_args, check_pair_args
from ._dcgm import parse_dcgm_diag
from ._metrics import EVENT_METRICS, METRICS, NIC_METRICS, PERF_METRICS, RESULT_COLUMNS, Kind, Level, Metric
from ._nccl_tests import parse_all_reduce_perf
from ._stability import (
    ABOVE_FACTOR,
    DEFAULT_CV_REP,
    DEFAULT_MAX_REPEATS,
    DEFAULT_REPEATS_OF,
    DEFAULT_TRANSIENT_PCT,
    DEFAULT_UNSTABLE_FACTOR,
    MAD_TO_SIGMA,
    MIN_JUDGED,
    TRANSIENT_SIGMAS,
    RepeatRule,
)

__all__ = [
    "ABOVE_FACTOR",
    "DEFAULT_CV_REP",
    "DEFAULT_MAX_REPEATS",
    "DEFAULT_REPEATS_OF",
    "DEFAULT_TRANSIENT_PCT",
    "DEFAULT_UNSTABLE_FACTOR",
    "EVENT_METRICS",
    "MAD_TO_SIGMA",
    "METRICS",
    "MIN_JUDGED",
    "NIC_METRICS",
    "PERF_METRICS",
    "RESULT_COLUMNS",
    "TRANSIENT_SIGMAS",
    "ArgumentsError",
    "Kind",
    "Level",
    "Metric",
    "RepeatRule",
    "check_args",
    "check_pair_args",
    "parse_all_reduce_perf",
    "parse_dcgm_diag",
    "payload_files",
]


def payload_files() -> dict[str, str]:
    """Every file the payload needs, as path (relative to the directory on ``PYTHONPATH``) → text: a
    benchmark Job ships them in a ConfigMap (keys cannot hold ``/``: map them with ``items``)."""
    here = Path(__file__).resolve().parent
    files = {"gpucert/__init__.py": (here.parent / "__init__.py").read_text(encoding="utf-8")}
    for path in sorted(here.glob("*.py")):
        files[f"gpucert/bench/{path.name}"] = path.read_text(encoding="utf-8")
    return files
