"""``python -m gpucert.bench``: arguments, defaults per device, and a stdout that carries rows only."""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
import socket
import sys
from collections.abc import Sequence
from typing import NoReturn, TextIO

from ..metrics import METRICS
from ._dcgm import DIAG_LEVELS
from ._nccl_tests import check_extra_args
from ._nic import SYSFS_ROOT
from ._run import STEPS, Options, run
from ._stability import (
    DEFAULT_CV_REP,
    DEFAULT_MAX_REPEATS,
    DEFAULT_REPEATS_OF,
    DEFAULT_TRANSIENT_PCT,
    DEFAULT_UNSTABLE_FACTOR,
)

__all__ = ["ArgumentsError", "build_parser", "check_args", "main", "parse_args"]

_RUN_ID = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_GiB, _MiB = 1 << 30, 1 << 20

#: (cuda, cpu) defaults of the sizes and durations: full size on a GPU, tiny on the CPU.
_DEFAULTS: dict[str, tuple[float, float]] = {
    "gemm_n": (8192, 256),
    "gemm_seconds": (30.0, 0.05),
    "gemm_warmup_seconds": (10.0, 0.0),
    "copy_bytes": (2 * _GiB, 8 * _MiB),
    "h2d_bytes": (1 * _GiB, 8 * _MiB),
    "bw_seconds": (1.0, 0.02),
    "allreduce_bytes": (8 * _GiB, 1 * _MiB),
    "allreduce_iters": (20, 5),
    "storage_size_gb": (4.0, 0.064),
}


def _size(text: str) -> int:
    """Bytes: ``1073741824``, ``1G``, ``512M``, ``64K`` (binary units)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        value = int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size (bytes, or a number with K, M or G)"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be positive")
    return value


def _gigabytes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in GB") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: a size in GB must be a finite number above 0")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: seconds must be a finite number ≥ 0")
    return value


def _perf_pair(text: str, form: str) -> tuple[str, str]:
    """``METRIC=VALUE`` split, METRIC a performance metric; raises ``ArgumentTypeError`` naming ``form``."""
    name, eq, value = text.partition("=")
    name = name.strip()
    if not eq or name not in METRICS or METRICS[name].kind != "perf":
        perf = ", ".join(m for m, spec in METRICS.items() if spec.kind == "perf")
        raise argparse.ArgumentTypeError(f"{text!r} is not {form} with METRIC one of {perf}")
    return name, value


def _cv_rep(text: str) -> tuple[str, float]:
    """``METRIC=CV``: a performance metric's expected run-to-run CV, a fraction (``h2d_gbps=0.015``)."""
    name, number = _perf_pair(text, "METRIC=CV")
    try:
        cv = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {number!r} is not a number") from None
    if not 0 < cv < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a CV is a fraction between 0 and 1 (0.007 for 0.7 %)")
    return name, cv


#: The most repeats one metric may be given (the policy's bound on metrics.<name>.repeats).
MAX_METRIC_REPEATS = 25


def _repeats_of(text: str) -> tuple[str, int]:
    """``METRIC=N``: base repeats of a performance metric measured more often than ``--repeats``."""
    name, number = _perf_pair(text, "METRIC=N")
    if not number.strip().isdigit() or not 1 <= int(number) <= MAX_METRIC_REPEATS:
        raise argparse.ArgumentTypeError(f"{text!r}: N must be a whole number from 1 to {MAX_METRIC_REPEATS}")
    return name, int(number)


def _factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 1 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: the factor must be a finite number above 1")
    return value


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 100:
        raise argparse.ArgumentTypeError(f"{text!r}: a percentage between 0 and 100")
    return value


def _run_id(text: str) -> str:
    if not _RUN_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a DNS label (at most 63 characters of a-z, 0-9 and '-', starting and ending "
            "with a letter or digit)"
        )
    return text


def _shape(text: str) -> tuple[int, int, int]:
    parts = text.lower().replace(",", "x").split("x")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a GEMM shape MxNxK (e.g. 2048x2048x13312)")
    m, n, k = (int(p) for p in parts)
    return m, n, k


def _nccl_tests_args(text: str) -> tuple[str, ...]:
    try:
        return check_extra_args(shlex.split(text))
    except ValueError as exc:  # shlex: an unclosed quote; check_extra_args: an option the payload sets
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


class ArgumentsError(ValueError):
    """Arguments the payload's command line refuses; the message is the parser's and names the argument."""


class _Checking(argparse.ArgumentParser):
    """The payload's parser for checking arguments before they reach a pod: it raises instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise ArgumentsError(message)


def build_parser(*, strict: bool = False) -> argparse.ArgumentParser:
    """The payload's argument parser. ``strict`` (for checking arguments ahead of a run): no
    abbreviations, no ``--help``, and :class:`ArgumentsError` instead of a usage message and exit 2."""
    p = (_Checking if strict else argparse.ArgumentParser)(
        prog="python -m gpucert.bench",
        description="Benchmark this node's GPUs and print results rows (JSON lines) on stdout. Messages, "
        "and the stack record (one line 'gpucert-stack: {...}'), go to stderr. Sizes and durations "
        "default to full size on cuda and to tiny values on cpu.",
        # A checked argument must be the very option the pod will see, not a prefix argparse completes.
        allow_abbrev=not strict,
        add_help=not strict,
    )
    p.add_argument("--run-id", required=True, type=_run_id, help="the certification run (a DNS label)")
    p.add_argument("--node", default=None, help="node name (default: $NODE_NAME, else the hostname)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--repeats", type=_positive_int, default=3, help="measurements per benchmark (default 3)")
    p.add_argument("--max-repeats", type=_positive_int, default=DEFAULT_MAX_REPEATS,
                   help="when a benchmark's repeats disagree (robust CV or transients beyond the noise model), "
                   f"measure more, up to this many in all (default {DEFAULT_MAX_REPEATS}; never fewer than "
                   "--repeats: equal to it turns extra repeats off)")  # fmt: skip
    p.add_argument("--cv-rep", type=_cv_rep, action="append", default=[], metavar="METRIC=CV",
                   help="expected run-to-run CV of a metric, the policy's metrics.<name>.cv_rep (repeatable; "
                   "defaults as in gpucert/data/policy.yaml)")  # fmt: skip
    p.add_argument("--repeats-of", type=_repeats_of, action="append", default=[], metavar="METRIC=N",
                   help="measure METRIC N times (never fewer than --repeats): the policy's "
                   "metrics.<name>.repeats (repeatable; defaults as in gpucert/data/policy.yaml: "
                   + ", ".join(f"{m}={n}" for m, n in DEFAULT_REPEATS_OF.items()) + ")")  # fmt: skip
    p.add_argument("--unstable-factor", type=_factor, default=DEFAULT_UNSTABLE_FACTOR,
                   help="repeats disagree above this many times the expected CV: the policy's "
                   f"repeats.unstable_factor (default {DEFAULT_UNSTABLE_FACTOR:g})")  # fmt: skip
    p.add_argument("--transient-pct", type=_percent, default=DEFAULT_TRANSIENT_PCT,
                   help="a repeat this far below its median (at least) is a transient: the policy's "
                   f"repeats.transient_pct (default {DEFAULT_TRANSIENT_PCT:g})")  # fmt: skip
    p.add_argument("--deadline-seconds", type=_seconds,
                   help="seconds from the payload's start by which it must be done (the Job's deadline less "
                   "image pull and scheduling): extra repeats start only while they and the work ahead fit "
                   "(default: $GPUCERT_DEADLINE_S; none: no deadline)")  # fmt: skip
    p.add_argument("--gemm-n", type=_positive_int, help="square BF16 GEMM size (cuda 8192, cpu 256)")
    p.add_argument("--gemm-shape", type=_shape, help="GEMM shape MxNxK instead of --gemm-n")
    p.add_argument("--gemm-seconds", type=_seconds, help="sustained time per GEMM repeat (cuda 30, cpu 0.05)")
    p.add_argument("--gemm-warmup-seconds", type=_seconds,
                   help="untimed GEMM first, so the GPU is hot when measured (cuda 10, cpu 0)")  # fmt: skip
    p.add_argument("--copy-bytes", type=_size, help="HBM copy buffer (cuda 2G, cpu 8M)")
    p.add_argument("--h2d-bytes", type=_size, help="pinned host↔device buffer (cuda 1G, cpu 8M)")
    p.add_argument("--bw-seconds", type=_seconds, help="time per copy/H2D/D2H repeat (cuda 1, cpu 0.02)")
    p.add_argument("--allreduce-bytes", type=_size, help="all-reduce message (cuda 8G, cpu 1M)")
    p.add_argument(
        "--allreduce-iters", type=_positive_int, help="all-reduces timed per repeat (cuda 20, cpu 5)"
    )
    p.add_argument("--cpu-devices", type=_positive_int, default=2, help="pretend GPUs on --device cpu (2)")
    p.add_argument("--skip", action="append", choices=STEPS, default=[], help="leave a step out (repeatable)")
    p.add_argument("--nccl-tests", metavar="PATH",
                   help="all_reduce_perf: when executable it measures the all-reduce instead of torch")  # fmt: skip
    p.add_argument("--nccl-tests-args", type=_nccl_tests_args, default=(), metavar="ARGS",
                   help="more all_reduce_perf options, one shell-quoted string (e.g. '-d bfloat16 -G 1'); "
                   "not those the payload sets: -t -g -b -e -i -f -n -c")  # fmt: skip
    p.add_argument(
        "--dcgm", action="store_true", help="also run 'dcgmi diag -r LEVEL -j' when dcgmi is present"
    )
    p.add_argument("--dcgm-level", type=int, choices=DIAG_LEVELS,
                   help="the dcgmi diag level (1 quick, the default; 2 medium; 3 and 4 long: allow for them in "
                   "the Job's deadline); implies --dcgm")  # fmt: skip
    p.add_argument("--stack-json", metavar="PATH", help="also write the stack record to this file")
    p.add_argument("--expected-gpus", type=_positive_int,
                   help="GPUs the node advertises (default: $GPUCERT_EXPECTED_GPUS; none: no row)")  # fmt: skip
    p.add_argument("--sample-interval", type=_seconds, default=0.2, help="NVML sampling period (0.2 s)")
    p.add_argument("--step-timeout", type=_seconds, default=0.0,
                   help="seconds before a step counts as hung (default: from the step's length)")  # fmt: skip
    p.add_argument("--ib-sysfs", metavar="PATH", default=SYSFS_ROOT,
                   help=f"where the RDMA devices' ports are read (default {SYSFS_ROOT}; none there: no NIC "
                   "rows)")  # fmt: skip
    p.add_argument("--ib-devices", action="append", default=[], metavar="PATTERN",
                   help="read only the RDMA devices matching this shell pattern, e.g. 'mlx5_[0-7]' to leave "
                   "storage and management NICs out of the rate comparison (repeatable; default: all)")  # fmt: skip
    p.add_argument("--storage-path", metavar="PATH",
                   help="a mounted volume (PVC or host path) whose sequential read throughput to measure: "
                   "storage_read_gbps, with fio when on the PATH (default: no storage step)")  # fmt: skip
    p.add_argument("--storage-size-gb", type=_gigabytes,
                   help="the size of the file written once and read per repeat, in GB (cuda 4, cpu 0.064)")  # fmt: skip
    return p


@functools.cache
def _parser(strict: bool) -> argparse.ArgumentParser:
    """:func:`build_parser`'s parser, built once: parsing leaves it as it was, and the flow (each Job it
    renders) and the simulator (each benchmark pod) check thousands of command lines a run."""
    return build_parser(strict=strict)


def parse_args(argv: Sequence[str] | None = None, *, strict: bool = False) -> Options:
    """The :class:`Options` of a command line (``sys.argv`` when None). Bad arguments print usage and exit 2,
    or with ``strict`` (see :func:`build_parser`) raise :class:`ArgumentsError`."""
    parser = _parser(strict)
    a = parser.parse_args(argv)
    col = 0 if a.device == "cuda" else 1

    def pick(name: str) -> float:
        given = getattr(a, name)
        return float(given) if given is not None else _DEFAULTS[name][col]

    expected = a.expected_gpus
    if expected is None and os.environ.get("GPUCERT_EXPECTED_GPUS", "").strip():
        raw = os.environ["GPUCERT_EXPECTED_GPUS"].strip()
        if not raw.isdigit():
            parser.error(f"GPUCERT_EXPECTED_GPUS={raw!r} is not a GPU count")
        expected = int(raw)
    deadline = a.deadline_seconds
    if deadline is None and os.environ.get("GPUCERT_DEADLINE_S", "").strip():
        try:
            deadline = _seconds(os.environ["GPUCERT_DEADLINE_S"].strip())
        except argparse.ArgumentTypeError as exc:
            parser.error(f"GPUCERT_DEADLINE_S: {exc}")
    n = int(pick("gemm_n"))
    node = a.node or os.environ.get("NODE_NAME", "").strip() or socket.gethostname()
    return Options(
        run_id=a.run_id,
        node=node,
        device=a.device,
        repeats=a.repeats,
        max_repeats=max(a.repeats, a.max_repeats),
        cv_rep=tuple({**DEFAULT_CV_REP, **dict(a.cv_rep)}.items()),
        repeats_of=tuple({**DEFAULT_REPEATS_OF, **dict(a.repeats_of)}.items()),
        unstable_factor=a.unstable_factor,
        transient_pct=a.transient_pct,
        deadline_s=deadline or 0.0,
        gemm_shape=a.gemm_shape or (n, n, n),
        gemm_seconds=pick("gemm_seconds"),
        gemm_warmup_seconds=pick("gemm_warmup_seconds"),
        copy_bytes=int(pick("copy_bytes")),
        h2d_bytes=int(pick("h2d_bytes")),
        bw_seconds=pick("bw_seconds"),
        allreduce_bytes=int(pick("allreduce_bytes")),
        allreduce_iters=int(pick("allreduce_iters")),
        cpu_devices=a.cpu_devices,
        skip=frozenset(a.skip),
        nccl_tests=a.nccl_tests,
        nccl_tests_args=a.nccl_tests_args,
        dcgm=a.dcgm or a.dcgm_level is not None,
        dcgm_level=a.dcgm_level or 1,
        stack_json=a.stack_json,
        expected_gpus=expected,
        sample_interval=a.sample_interval or 0.2,
        step_timeout=a.step_timeout,
        ib_sysfs=a.ib_sysfs,
        ib_devices=tuple(a.ib_devices),
        storage_path=a.storage_path,
        storage_bytes=round(pick("storage_size_gb") * 1e9),
    )


def check_args(argv: Sequence[str]) -> Options:
    """The :class:`Options` ``argv`` would run with, parsed strictly (see :func:`build_parser`); raises
    :class:`ArgumentsError` naming what the payload would refuse."""
    return parse_args(list(argv), strict=True)


def _rows_stream() -> TextIO:
    """A private stream for the rows; fd 1 then points at stderr, so that anything else printing to
    stdout (a C library, NCCL's logging) cannot slip lines between the rows."""
    try:
        sys.stdout.flush()
        rows_fd = os.dup(sys.stdout.fileno())
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        return sys.stdout  # no real file descriptors (an embedding host): print as usual
    return os.fdopen(rows_fd, "w", buffering=1, encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status 0 once rows were printed, errors included; 2 for bad arguments (argparse).

    ``pair …`` runs one side of a two-node all-reduce instead (:mod:`gpucert.bench._paircli`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["pair"]:
        from ._paircli import main as pair_main

        return pair_main(args[1:])
    opts = parse_args(args)
    out = _rows_stream()
    try:
        return run(opts, out=out)
    finally:
        out.flush()
