"""The in-pod benchmark payload: ``python -m gpucert.bench --run-id RUN [--device cuda|cpu] …``.

It imports the standard library and, each only when present, torch and pynvml — never Prefect, the
Kubernetes client, pandas or numpy — so a stock PyTorch image runs it from a ConfigMap holding the
files :func:`payload_files` lists (``gpucert/__init__.py`` and this package). It imports nothing else of
gpucert: the metric registry and the results columns are its own (:mod:`gpucert.bench._metrics`), which
:mod:`gpucert.metrics` re-exports.

What it prints
--------------
stdout carries results rows only, one JSON object a line with the ten contract columns of docs/design/data-contracts.md
(run_id, node, gpu, gpu_uuid, gpu_model, metric, value, repeat, peer, ts), so that
``gpucert.results.read_results`` reads the Pod log as it is:

* per GPU, ``--repeats`` times each: ``gemm_bf16_tflops`` (BF16 matmul sustained for
  ``--gemm-seconds`` after ``--gemm-warmup-seconds`` of untimed heating; 2·m·n·k·iterations/s/1e12),
  ``hbm_copy_gbps`` (device-to-device copy, bytes read + written per second), ``h2d_gbps`` and
  ``d2h_gbps`` (pinned host memory); one process drives each GPU in turn;
* per node, ``--repeats`` times: ``nccl_allreduce_busbw_gbps`` — torch.distributed all-reduce over all
  the node's GPUs (NCCL, one spawned process per GPU; gloo over ``--cpu-devices`` processes on the CPU),
  busbw = algbw · 2(n−1)/n; or ``all_reduce_perf`` when ``--nccl-tests PATH`` is executable (more of its
  options in ``--nccl-tests-args``, except those that decide what is measured);
* more repeats of a benchmark whose repeats disagree (:mod:`gpucert.bench._stability`: the verdict
  engine's rule, with the policy's expected CVs as ``--cv-rep``, ``--unstable-factor`` and
  ``--transient-pct``), up to ``--max-repeats`` (7) in all, while they fit before ``--deadline-seconds``:
  a result's ``repeat`` column runs ``0..n-1`` for however many it took;
* NVML telemetry sampled during the run (see :mod:`gpucert.bench._nvml` for each rule), ``xid`` events,
  ``gpu_count`` and, when given, ``gpu_count_expected``;
* per node, the RDMA NICs read from ``--ib-sysfs`` (``/sys/class/infiniband``) at the start and the end
  (:mod:`gpucert.bench._nic`): ``ib_ports``, ``ib_ports_active``, ``ib_rate_min_gbps``,
  ``ib_rate_max_gbps`` and the increases of ``ib_symbol_errors``, ``ib_link_downed`` and
  ``ib_rcv_errors``; none at all on a node without RDMA devices;
* with ``--storage-path``, per node and ``--repeats`` times: ``storage_read_gbps``, sequential reads of a
  file of ``--storage-size-gb`` written once under that path, with fio when it is on the PATH, else
  O_DIRECT (:mod:`gpucert.bench._storage`; the log names the method);
* ``error`` rows (value 1; gpu level for a per-GPU step, node level otherwise) wherever a step could
  not run — no torch, no CUDA, no NVML, a GPU torch cannot use, out of memory, a hang, a failed
  ``dcgmi diag`` test — with the reason on stderr. No number is ever made up; the exit status is 0
  whenever rows were printed, 2 for bad arguments.

stderr carries human messages (prefixed ``gpucert-bench:``), the stack record as one line
``gpucert-stack: {…}`` (also written to ``--stack-json``; see :mod:`gpucert.bench._devices`) and, with
``--dcgm`` (``dcgmi diag`` at ``--dcgm-level``, 1 by default), the diagnostic summary as
``gpucert-dcgm: {…}``.

``python -m gpucert.bench pair …`` runs the other benchmark unit instead, a pair: one side of a two-node
all-reduce (every GPU of both nodes, ``nccl_pair_busbw_gbps`` rows with ``peer`` set). Both units share
one command line (:mod:`gpucert.bench._cli`) and one run (:mod:`gpucert.bench._run`: framing, repeats,
deadline); the pair's rendezvous and measurement are :mod:`gpucert.bench._pair`.

On the CPU (``--device cpu``) the GPUs are pretend devices ``0..n−1`` with UUID ``CPU-<hostname>-<i>``
and model ``cpu``: the whole pipeline runs here with small sizes and is tested.
"""

from __future__ import annotations

from pathlib import Path

from ._cli import ArgumentsError, check_args, check_pair_args
from ._dcgm import DcgmDiag, DcgmError, parse_dcgm_diag
from ._metrics import EVENT_METRICS, METRICS, NIC_METRICS, PERF_METRICS, RESULT_COLUMNS, Kind, Level, Metric
from ._nccl_tests import AllReducePerf, NcclTestsError, parse_all_reduce_perf
from ._nvml import GpuTelemetry, Sampler
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
    "AllReducePerf",
    "ArgumentsError",
    "DcgmDiag",
    "DcgmError",
    "GpuTelemetry",
    "Kind",
    "Level",
    "Metric",
    "NcclTestsError",
    "RepeatRule",
    "Sampler",
    "check_args",
    "check_pair_args",
    "main",
    "parse_all_reduce_perf",
    "parse_dcgm_diag",
    "payload_files",
]


def main(argv: list[str] | None = None) -> int:
    """The command line (``python -m gpucert.bench``)."""
    from ._cli import main as cli_main

    return cli_main(argv)


def payload_files() -> dict[str, str]:
    """Every file the payload needs, as path (relative to the directory on ``PYTHONPATH``) → text.

    A benchmark Job ships these in a ConfigMap (keys cannot hold ``/``: map them with ``items``).
    """
    here = Path(__file__).resolve().parent
    root = here.parent
    files = {"gpucert/__init__.py": (root / "__init__.py").read_text(encoding="utf-8")}
    for path in sorted(here.glob("*.py")):
        files[f"gpucert/bench/{path.name}"] = path.read_text(encoding="utf-8")
    return files
