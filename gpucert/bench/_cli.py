"""``python -m gpucert.bench [pair] …``: one command line for both benchmark units.

A unit is what one payload process measures: a node (every benchmark of the node's GPUs) or a pair
(``pair …``: one side of a two-node all-reduce). Both take the same shared arguments from one parser
builder, resolve them the same way (environment fallbacks, per-device defaults) and run through
:func:`gpucert.bench._run.run`. A pair's rank, node and rendezvous (``--rank``, ``--node``, ``--nodes``,
``--master``, ``--peer``): docs/design/certify-runbook.md, "Pair benchmarks".
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
import shlex
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TextIO, TypeVar

from ._dcgm import DIAG_LEVELS
from ._metrics import PERF_METRICS
from ._nccl_tests import check_extra_args
from ._nic import SYSFS_ROOT
from ._pair import PairOptions, mpi_slots
from ._run import STEPS, Options, run
from ._stability import (
    DEFAULT_CV_REP,
    DEFAULT_MAX_REPEATS,
    DEFAULT_REPEATS_OF,
    DEFAULT_TRANSIENT_PCT,
    DEFAULT_UNSTABLE_FACTOR,
    RepeatRule,
)

__all__ = ["ArgumentsError", "check_args", "check_pair_args", "main", "parse_args", "parse_pair_args"]

_RUN_ID = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_GiB, _MiB, _KiB = 1 << 30, 1 << 20, 1 << 10

#: (cuda, cpu) defaults of the sizes and durations: full size on a GPU, tiny on the CPU. The pair's sweep
#: is nccl-tests' range above the latency-bound sizes, to the 8 GB the policy judges at; its rendezvous
#: waits long enough on GPUs for the other pod's image pull (an NGC image is ~10 GB).
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
    # the pair's
    "min_bytes": (1 * _MiB, 64 * _KiB),
    "max_bytes": (8 * _GiB, 1 * _MiB),
    "iters": (20, 5),
    "warmup_iters": (5, 1),
    "rendezvous_timeout": (900.0, 60.0),
    "step_timeout": (300.0, 60.0),
}
#: Where a node's rank in the pair comes from without ``--rank``, first found: an Indexed Job's pod index,
#: then the rank an MPI launcher gives each process (Open MPI, then MPICH / Intel MPI / PMI).
_RANK_ENV = ("JOB_COMPLETION_INDEX", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
#: The most repeats one metric may be given (the policy's bound on metrics.<name>.repeats).
MAX_METRIC_REPEATS = 25

# --- argument types -------------------------------------------------------------------------------------

_N = TypeVar("_N", int, float)


def _number(convert: Callable[[str], _N], accept: Callable[[_N], bool], noun: str, rule: str) -> Callable[[str], _N]:
    """An argument type: ``convert`` the text (else "is not ``noun``"), then ``accept`` it (else ``rule``)."""

    def parse(text: str) -> _N:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"{text!r}: {rule}")
        return value

    return parse


_positive_int = _number(int, lambda v: v >= 1, "an integer", "must be at least 1")
_seconds = _number(float, lambda v: 0 <= v < math.inf, "a number of seconds", "seconds must be a finite number ≥ 0")
_gigabytes = _number(float, lambda v: 0 < v < math.inf, "a size in GB", "a size in GB must be a finite number above 0")
_factor = _number(float, lambda v: 1 < v < math.inf, "a number", "the factor must be a finite number above 1")
_percent = _number(float, lambda v: 0 < v < 100, "a number", "a percentage between 0 and 100")
_step_factor = _number(int, lambda v: v >= 2, "a whole number", "the step factor is a whole number of at least 2")


def _size(text: str) -> int:
    """Bytes: ``1073741824``, ``1G``, ``512M``, ``64K`` (binary units)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        value = int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or a number with K, M or G)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be positive")
    return value


def _perf_pair(text: str, form: str) -> tuple[str, str]:
    """``METRIC=VALUE`` split, METRIC a performance metric; raises ``ArgumentTypeError`` naming ``form``."""
    name, eq, value = text.partition("=")
    name = name.strip()
    if not eq or name not in PERF_METRICS:
        raise argparse.ArgumentTypeError(f"{text!r} is not {form} with METRIC one of {', '.join(PERF_METRICS)}")
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


def _repeats_of(text: str) -> tuple[str, int]:
    """``METRIC=N``: base repeats of a performance metric measured more often than ``--repeats``."""
    name, number = _perf_pair(text, "METRIC=N")
    if not number.strip().isdigit() or not 1 <= int(number) <= MAX_METRIC_REPEATS:
        raise argparse.ArgumentTypeError(f"{text!r}: N must be a whole number from 1 to {MAX_METRIC_REPEATS}")
    return name, int(number)


def _run_id(text: str) -> str:
    if not _RUN_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a DNS label (at most 63 characters of a-z, 0-9 and '-', starting and ending "
            "with a letter or digit)"
        )
    return text


def _node(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a node name is empty")
    return text.strip()


def _shape(text: str) -> tuple[int, int, int]:
    parts = text.lower().replace(",", "x").split("x")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a GEMM shape MxNxK (e.g. 2048x2048x13312)")
    m, n, k = (int(p) for p in parts)
    return m, n, k


def _words(text: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:  # an unclosed quote
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def _nccl_tests_args(text: str) -> tuple[str, ...]:
    try:
        return check_extra_args(_words(text))
    except ValueError as exc:  # an option the payload sets
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def _master(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for an IPv6 address) → (host, port)."""
    host, colon, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in host):
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. pair-0.pair.gpucert-system.svc:29500)")
    return host, int(port)


def _rank(text: str) -> int:
    if text.strip() not in ("0", "1"):
        raise argparse.ArgumentTypeError(f"{text!r}: a node's rank in a pair is 0 or 1")
    return int(text)


def _hosts(text: str) -> str:
    try:
        mpi_slots(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


# --- the parsers ----------------------------------------------------------------------------------------


class ArgumentsError(ValueError):
    """Arguments the payload's command line refuses; the message is the parser's and names the argument."""


class _Checking(argparse.ArgumentParser):
    """The payload's parser for checking arguments before they reach a pod: it raises instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise ArgumentsError(message)


def _shared_arguments(p: argparse.ArgumentParser, *, cpu_devices: int) -> None:
    """The arguments every unit takes: the run, the node, the device, the repeat rule, the deadline."""
    p.add_argument("--run-id", required=True, type=_run_id, help="the certification run (a DNS label)")
    p.add_argument("--node", type=_node, help="this node (default: $NODE_NAME, else the hostname)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument(
        "--cpu-devices",
        type=_positive_int,
        default=cpu_devices,
        help=f"pretend GPUs (one process each) on --device cpu ({cpu_devices})",
    )
    p.add_argument("--repeats", type=_positive_int, default=3, help="measurements per benchmark (default 3)")
    p.add_argument(
        "--max-repeats",
        type=_positive_int,
        default=DEFAULT_MAX_REPEATS,
        help="when a benchmark's repeats disagree (robust CV or transients beyond the noise model), "
        f"measure more, up to this many in all (default {DEFAULT_MAX_REPEATS}; never fewer than "
        "--repeats: equal to it turns extra repeats off)",
    )
    p.add_argument(
        "--cv-rep",
        type=_cv_rep,
        action="append",
        default=[],
        metavar="METRIC=CV",
        help="expected run-to-run CV of a metric, the policy's metrics.<name>.cv_rep (repeatable; "
        "defaults as in gpucert/data/policy.yaml)",
    )
    p.add_argument(
        "--repeats-of",
        type=_repeats_of,
        action="append",
        default=[],
        metavar="METRIC=N",
        help="measure METRIC N times (never fewer than --repeats): the policy's "
        "metrics.<name>.repeats (repeatable; defaults as in gpucert/data/policy.yaml: "
        + ", ".join(f"{m}={n}" for m, n in DEFAULT_REPEATS_OF.items())
        + ")",
    )
    p.add_argument(
        "--unstable-factor",
        type=_factor,
        default=DEFAULT_UNSTABLE_FACTOR,
        help="repeats disagree above this many times the expected CV: the policy's "
        f"repeats.unstable_factor (default {DEFAULT_UNSTABLE_FACTOR:g})",
    )
    p.add_argument(
        "--transient-pct",
        type=_percent,
        default=DEFAULT_TRANSIENT_PCT,
        help="a repeat this far below its median (at least) is a transient: the policy's "
        f"repeats.transient_pct (default {DEFAULT_TRANSIENT_PCT:g})",
    )
    p.add_argument(
        "--deadline-seconds",
        type=_seconds,
        help="seconds from the payload's start by which it must be done (the Job's deadline less "
        "image pull and scheduling): extra repeats, and a pair's rendezvous, start only while "
        "they and the work ahead fit (default: $GPUCERT_DEADLINE_S; none: no deadline)",
    )
    p.add_argument(
        "--nccl-tests",
        metavar="PATH",
        help="all_reduce_perf: when executable it measures the all-reduce instead of torch (a "
        "pair's: built with MPI=1, run under mpirun when --mpi-hosts is given)",
    )
    p.add_argument(
        "--nccl-tests-args",
        type=_nccl_tests_args,
        default=(),
        metavar="ARGS",
        help="more all_reduce_perf options, one shell-quoted string (e.g. '-d bfloat16 -G 1'); "
        "not those the payload sets: -t -g -b -e -i -f -n -c",
    )
    p.add_argument("--stack-json", metavar="PATH", help="also write the stack record to this file")


def _node_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gemm-n", type=_positive_int, help="square BF16 GEMM size (cuda 8192, cpu 256)")
    p.add_argument("--gemm-shape", type=_shape, help="GEMM shape MxNxK instead of --gemm-n")
    p.add_argument("--gemm-seconds", type=_seconds, help="sustained time per GEMM repeat (cuda 30, cpu 0.05)")
    p.add_argument(
        "--gemm-warmup-seconds",
        type=_seconds,
        help="untimed GEMM first, so the GPU is hot when measured (cuda 10, cpu 0)",
    )
    p.add_argument("--copy-bytes", type=_size, help="HBM copy buffer (cuda 2G, cpu 8M)")
    p.add_argument("--h2d-bytes", type=_size, help="pinned host↔device buffer (cuda 1G, cpu 8M)")
    p.add_argument("--bw-seconds", type=_seconds, help="time per copy/H2D/D2H repeat (cuda 1, cpu 0.02)")
    p.add_argument("--allreduce-bytes", type=_size, help="all-reduce message (cuda 8G, cpu 1M)")
    p.add_argument("--allreduce-iters", type=_positive_int, help="all-reduces timed per repeat (cuda 20, cpu 5)")
    p.add_argument("--skip", action="append", choices=STEPS, default=[], help="leave a step out (repeatable)")
    p.add_argument("--dcgm", action="store_true", help="also run 'dcgmi diag -r LEVEL -j' when dcgmi is present")
    p.add_argument(
        "--dcgm-level",
        type=int,
        choices=DIAG_LEVELS,
        help="the dcgmi diag level (1 quick, the default; 2 medium; 3 and 4 long: allow for them in "
        "the Job's deadline); implies --dcgm",
    )
    p.add_argument(
        "--expected-gpus",
        type=_positive_int,
        help="GPUs the node advertises (default: $GPUCERT_EXPECTED_GPUS; none: no row)",
    )
    p.add_argument("--sample-interval", type=_seconds, default=0.2, help="NVML sampling period (0.2 s)")
    p.add_argument(
        "--step-timeout",
        type=_seconds,
        default=0.0,
        help="seconds before a step counts as hung (default: from the step's length)",
    )
    p.add_argument(
        "--ib-sysfs",
        metavar="PATH",
        default=SYSFS_ROOT,
        help=f"where the RDMA devices' ports are read (default {SYSFS_ROOT}; none there: no NIC rows)",
    )
    p.add_argument(
        "--ib-devices",
        action="append",
        default=[],
        metavar="PATTERN",
        help="read only the RDMA devices matching this shell pattern, e.g. 'mlx5_[0-7]' to leave "
        "storage and management NICs out of the rate comparison (repeatable; default: all)",
    )
    p.add_argument(
        "--storage-path",
        metavar="PATH",
        help="a mounted volume (PVC or host path) whose sequential read throughput to measure: "
        "storage_read_gbps, with fio when on the PATH (default: no storage step)",
    )
    p.add_argument(
        "--storage-size-gb",
        type=_gigabytes,
        help="the size of the file written once and read per repeat, in GB (cuda 4, cpu 0.064)",
    )


def _pair_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nodes",
        nargs=2,
        type=_node,
        metavar="NODE",
        help="the pair's two nodes: this node must be one, the peer the other",
    )
    p.add_argument("--peer", type=_node, help="the other node, when known in advance (checked)")
    p.add_argument(
        "--rank",
        type=_rank,
        help="this node's rank in the pair (default: $JOB_COMPLETION_INDEX, "
        "else an MPI launcher's $OMPI_COMM_WORLD_RANK or $PMI_RANK)",
    )
    p.add_argument(
        "--master",
        type=_master,
        metavar="HOST:PORT",
        help="the rendezvous: node rank 0 serves it, node rank 1 connects to it",
    )
    p.add_argument("-b", "--min-bytes", type=_size, help="smallest message (cuda 1M, cpu 64K)")
    p.add_argument("-e", "--max-bytes", type=_size, help="largest message, the one reported (cuda 8G, cpu 1M)")
    p.add_argument("-f", "--step-factor", type=_step_factor, default=2, help="size multiplier (2)")
    p.add_argument("-n", "--iters", type=_positive_int, help="all-reduces timed per size (cuda 20, cpu 5)")
    p.add_argument("-w", "--warmup-iters", type=_positive_int, help="untimed all-reduces first (cuda 5, cpu 1)")
    p.add_argument("--rendezvous-timeout", type=_seconds, help="seconds to wait for the other node (cuda 900, cpu 60)")
    p.add_argument(
        "--step-timeout",
        type=_seconds,
        help="each collective's timeout, and the process group's start (cuda 300, cpu 60)",
    )
    p.add_argument(
        "--mpi-hosts",
        type=_hosts,
        metavar="HOST:GPUS,HOST:GPUS",
        help="the two hosts for mpirun -H (the nccl-tests path)",
    )
    p.add_argument(
        "--mpirun-args",
        type=_words,
        default=(),
        metavar="ARGS",
        help="more mpirun options, one shell-quoted string (e.g. '--allow-run-as-root -x NCCL_DEBUG')",
    )


#: unit → (prog, description, default --cpu-devices, its own arguments)
_UNITS: dict[str, tuple[str, str, int, Callable[[argparse.ArgumentParser], None]]] = {
    "node": (
        "python -m gpucert.bench",
        "Benchmark this node's GPUs and print results rows (JSON lines) on stdout. Messages, and the stack "
        "record (one line 'gpucert-stack: {...}'), go to stderr. Sizes and durations default to full size "
        "on cuda and to tiny values on cpu.",
        2,
        _node_arguments,
    ),
    "pair": (
        "python -m gpucert.bench pair",
        "One side of a two-node all-reduce (every GPU of both nodes): results rows (nccl_pair_busbw_gbps, "
        "peer = the other node) on stdout, the sweep and messages on stderr.",
        1,
        _pair_arguments,
    ),
}


@functools.cache
def _parser(unit: str, strict: bool) -> argparse.ArgumentParser:
    """A unit's argument parser, built once (the flow and the simulator check thousands of command lines a
    run). ``strict`` (for checking arguments ahead of a run): no abbreviations, no ``--help``, and
    :class:`ArgumentsError` instead of a usage message and exit 2."""
    prog, description, cpu_devices, add_own = _UNITS[unit]
    p = (_Checking if strict else argparse.ArgumentParser)(
        prog=prog,
        description=description,
        # A checked argument must be the very option the pod will see, not a prefix argparse completes.
        allow_abbrev=not strict,
        add_help=not strict,
    )
    _shared_arguments(p, cpu_devices=cpu_devices)
    add_own(p)
    return p


class _Parsed:
    """One command line parsed: the namespace, with the shared resolution of defaults and environment."""

    def __init__(self, unit: str, argv: Sequence[str] | None, strict: bool) -> None:
        self.parser = _parser(unit, strict)
        self.a = self.parser.parse_args(argv)
        self.col = 0 if self.a.device == "cuda" else 1

    def pick(self, name: str) -> float:
        """The argument ``name`` as given, else its default on this device."""
        given = getattr(self.a, name)
        return float(given) if given is not None else _DEFAULTS[name][self.col]

    def env(self, name: str, parse: Callable[[str], Any]) -> Any:
        """``$name`` through ``parse`` (None when unset or blank); a bad value is a usage error naming it."""
        raw = os.environ.get(name, "").strip()
        if not raw:
            return None
        try:
            return parse(raw)
        except argparse.ArgumentTypeError as exc:
            self.parser.error(f"{name}: {exc}")

    def shared(self) -> dict[str, Any]:
        """The options every unit takes (see :class:`gpucert.bench._run.UnitOptions`)."""
        a = self.a
        deadline = a.deadline_seconds if a.deadline_seconds is not None else self.env("GPUCERT_DEADLINE_S", _seconds)
        expected = tuple({**DEFAULT_CV_REP, **dict(a.cv_rep)}.items())
        base = tuple({**DEFAULT_REPEATS_OF, **dict(a.repeats_of)}.items())
        rule = RepeatRule(a.repeats, max(a.repeats, a.max_repeats), expected, a.unstable_factor, a.transient_pct, base)
        return {
            "run_id": a.run_id,
            "node": a.node or os.environ.get("NODE_NAME", "").strip() or socket.gethostname(),
            "device": a.device,
            "cpu_devices": a.cpu_devices,
            "rule": rule,
            "deadline_s": deadline or 0.0,
            "nccl_tests": a.nccl_tests,
            "nccl_tests_args": a.nccl_tests_args,
            "stack_json": a.stack_json,
        }


def _gpu_count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a GPU count")
    return int(text)


def parse_args(argv: Sequence[str] | None = None, *, strict: bool = False) -> Options:
    """The node unit's :class:`Options` of a command line (``sys.argv`` when None). Bad arguments print
    usage and exit 2, or with ``strict`` (see :func:`_parser`) raise :class:`ArgumentsError`."""
    p = _Parsed("node", argv, strict)
    a = p.a
    n = int(p.pick("gemm_n"))
    expected = a.expected_gpus if a.expected_gpus is not None else p.env("GPUCERT_EXPECTED_GPUS", _gpu_count)
    return Options(
        **p.shared(),
        gemm_shape=a.gemm_shape or (n, n, n),
        gemm_seconds=p.pick("gemm_seconds"),
        gemm_warmup_seconds=p.pick("gemm_warmup_seconds"),
        copy_bytes=int(p.pick("copy_bytes")),
        h2d_bytes=int(p.pick("h2d_bytes")),
        bw_seconds=p.pick("bw_seconds"),
        allreduce_bytes=int(p.pick("allreduce_bytes")),
        allreduce_iters=int(p.pick("allreduce_iters")),
        skip=frozenset(a.skip),
        dcgm=a.dcgm or a.dcgm_level is not None,
        dcgm_level=a.dcgm_level or 1,
        expected_gpus=expected,
        sample_interval=a.sample_interval or 0.2,
        step_timeout=a.step_timeout,
        ib_sysfs=a.ib_sysfs,
        ib_devices=tuple(a.ib_devices),
        storage_path=a.storage_path,
        storage_bytes=round(p.pick("storage_size_gb") * 1e9),
    )


def parse_pair_args(argv: Sequence[str] | None = None, *, strict: bool = False) -> PairOptions:
    """The pair unit's :class:`~gpucert.bench._pair.PairOptions` of a command line (without the leading
    ``pair``); bad arguments as in :func:`parse_args`."""
    p = _Parsed("pair", argv, strict)
    a = p.a
    rank = a.rank
    for name in () if rank is not None else _RANK_ENV:
        rank = p.env(name, _rank)
        if rank is not None:
            break
    if not (a.nccl_tests is not None and a.mpi_hosts is not None) and (rank is None or a.master is None):
        p.parser.error("the torch path needs --master HOST:PORT and --rank (or $JOB_COMPLETION_INDEX)")
    if a.nodes is not None and a.nodes[0] == a.nodes[1]:
        p.parser.error(f"--nodes names {a.nodes[0]} twice: a pair is two nodes")
    opts = PairOptions(
        **p.shared(),
        master=a.master,
        rank=rank,
        nodes=None if a.nodes is None else (a.nodes[0], a.nodes[1]),
        peer=a.peer,
        min_bytes=int(p.pick("min_bytes")),
        max_bytes=int(p.pick("max_bytes")),
        step_factor=a.step_factor,
        iters=int(p.pick("iters")),
        warmup_iters=int(p.pick("warmup_iters")),
        rendezvous_timeout=p.pick("rendezvous_timeout") or _DEFAULTS["rendezvous_timeout"][p.col],
        step_timeout=p.pick("step_timeout") or _DEFAULTS["step_timeout"][p.col],
        mpi_hosts=a.mpi_hosts,
        mpirun_args=a.mpirun_args,
    )
    try:
        opts.sizes  # noqa: B018  - checked now: a bad sweep is a bad argument, not a failed step
    except ValueError as exc:
        p.parser.error(str(exc))
    return opts


def check_args(argv: Sequence[str]) -> Options:
    """The :class:`Options` ``argv`` would run with, parsed strictly; raises :class:`ArgumentsError` naming
    what the payload would refuse."""
    return parse_args(list(argv), strict=True)


def check_pair_args(argv: Sequence[str]) -> PairOptions:
    """The :class:`~gpucert.bench._pair.PairOptions` ``argv`` (without ``pair``) would run with, parsed
    strictly; raises :class:`ArgumentsError` naming what the payload would refuse."""
    return parse_pair_args(list(argv), strict=True)


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
    """Exit status 0 once rows were printed, errors included; 2 for bad arguments (argparse). A leading
    ``pair`` runs the pair unit instead of the node's."""
    args = list(sys.argv[1:] if argv is None else argv)
    opts = parse_pair_args(args[1:]) if args[:1] == ["pair"] else parse_args(args)
    out = _rows_stream()
    try:
        return run(opts, out=out)
    finally:
        out.flush()
