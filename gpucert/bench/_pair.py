"""Two-node all-reduce bus bandwidth: every GPU of both nodes of a pair in one collective.

A pair is a benchmark unit of two nodes (:class:`PairOptions`, run by :func:`gpucert.bench._run.run` as
a node is): one payload process runs on each node of the pair (``python -m gpucert.bench pair``, its
arguments in :mod:`gpucert.bench._cli`; in a cluster, the two pods of the pair's Indexed Job,
``templates/certify/pair-job.yaml.j2``). Standard library and torch only, like the rest of the payload.

What it prints, like the node unit: on stdout ``nccl_pair_busbw_gbps`` rows, level pair (``gpu`` empty,
``peer`` the other node), one per repeat, values the busbw at the largest message size; on stderr the
stack record, the sweep as a table (``gpucert-bench: pair: SIZE B …``) and messages. Anything that stops
the measurement — no torch, a rendezvous that did not complete within ``--rendezvous-timeout``, a peer of
another run, a failed rank — is a node-level ``error`` row with the reason on stderr, and the exit status
is still 0. Both nodes print their rows (each pod's log is read as its own node's), and the values are the
same on both sides: the times are the slowest rank's of the one collective they ran together.

Rendezvous (:class:`Rendezvous`)
--------------------------------
Node rank 0's payload serves a ``torch.distributed.TCPStore`` at ``--master HOST:PORT``; node rank 1's
connects to it. Through the store the two sides exchange, before any GPU is touched, their run id, node
name, device kind and number of local ranks: so each side's rows can name the other node (``peer``), and
a pod of another run, or two pods on one node, is refused instead of measured. Every wait is bounded by
the rendezvous timeout: reaching the master (retried while its DNS name is not published yet or nothing
listens there), then waiting for the other side's record. One that does not complete raises
:class:`PairError`, which the caller writes as an ``error`` row: never a hang.

Measurement (:func:`run_pair`)
------------------------------
Each side then spawns one process per local device: one per GPU on CUDA (backend NCCL, so the collective
uses NVLink inside a node and the network between the two, as a training job's does), one per
``--cpu-devices`` pretend GPU on the CPU (gloo). The two nodes' processes form one process group of
``n`` = all the ranks of both nodes (node rank 0's first, then node rank 1's), meeting in the same store.
Per repeat, every message size of the sweep (``-b``/``-e``/``-f`` as nccl-tests takes them) is timed
over ``iters`` in-place float32 all-reduces, after a warm-up at the largest and the smallest size (what
nccl-tests does); each size's time is the slowest rank's (one MAX all-reduce of the times per repeat),
so both nodes report the same figures. Bus bandwidth as nccl-tests defines it: algbw = bytes / time,
busbw = algbw · 2(n−1)/n. The value a row carries is the busbw at the largest size, the bandwidth a large
gradient all-reduce sees (the sweep's other sizes go to stderr, as a table). Repeats as the payload makes
them for every metric: the base count, then more while they disagree (:mod:`._stability`), decided by
global rank 0 and broadcast, so both nodes run and report the same repeats.

nccl-tests (:func:`run_pair_nccl_tests`)
----------------------------------------
``all_reduce_perf`` measures across nodes only as an MPI program: built with ``MPI=1`` and started by
``mpirun``, which launches the ranks on the other host itself (through ssh or PMIx; the ``-g`` of one
process covers only its own node's GPUs). A plain Indexed Job has no MPI launcher, so there the pair runs
on torch.distributed; the nccl-tests path is for a payload that is an MPI launcher (an MPI Operator
MPIJob's launcher pod): ``--nccl-tests PATH --mpi-hosts A:8,B:8`` with ``mpirun`` on the PATH runs
``mpirun -np 16 -H A:8,B:8 all_reduce_perf -g 1 …`` and reads its table.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ._allreduce import busbw_gbps
from ._devices import Discovery
from ._nccl_tests import AllReducePerf, NcclTestsError, check_extra_args, parse_all_reduce_perf
from ._nvml import describe
from ._rows import RowWriter, say
from ._run import Session, StepError, UnitOptions, nccl_tests_failure
from ._stability import RepeatRule

__all__ = [
    "METRIC",
    "Meeting",
    "PairConfig",
    "PairError",
    "PairMeasurement",
    "PairOptions",
    "Rendezvous",
    "Side",
    "mpi_slots",
    "run_pair",
    "run_pair_nccl_tests",
    "sweep_sizes",
]

METRIC = "nccl_pair_busbw_gbps"
#: Every key the pair writes in the store starts with this.
_KEY = "gpucert/pair/"
_FLOAT_BYTES = 4
#: The slowest bus bandwidth a working pair is planned at (GB/s), to bound how long its sweeps may take.
_FLOOR_GBPS = {"cuda": 1.0, "cpu": 0.02}


class PairError(StepError):
    """The pair could not be measured (a rendezvous that did not complete, a peer refused, a rank that
    failed or ran past its time); the message says why, in words for an ``error`` row."""


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int) -> tuple[int, ...]:
    """The message sizes of a sweep, as nccl-tests' ``-b MIN -e MAX -f FACTOR``: MIN, MIN·FACTOR, … and
    always MAX itself last (the size a row reports), each a whole number of float32 elements.

    Raises ``ValueError`` when MIN exceeds MAX or FACTOR is below 2.
    """
    if min_bytes > max_bytes:
        raise ValueError(f"the smallest message ({min_bytes:,} B) is larger than the largest ({max_bytes:,} B)")
    if factor < 2:
        raise ValueError(f"the step factor must be at least 2, not {factor}")
    sizes: list[int] = []
    size = min_bytes
    while size < max_bytes:
        sizes.append(size)
        size *= factor
    sizes.append(max_bytes)
    return tuple(dict.fromkeys(max(_FLOAT_BYTES, s // _FLOAT_BYTES * _FLOAT_BYTES) for s in sizes))


# --- the rendezvous -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """What one node of the pair tells the other at the rendezvous."""

    run_id: str
    node: str
    device: str  # "cuda" or "cpu"
    ranks: int  # its local ranks: its GPUs (or pretend GPUs)


@dataclass(frozen=True)
class Meeting:
    """Both sides of a completed rendezvous, from ``me``'s point of view."""

    node_rank: int
    me: Side
    peer: Side

    @property
    def world(self) -> int:
        """Ranks in the pair's process group: every local rank of both nodes."""
        return self.me.ranks + self.peer.ranks

    @property
    def offset(self) -> int:
        """The global rank of this node's first local rank (node rank 0's ranks come first)."""
        return 0 if self.node_rank == 0 else self.peer.ranks


def _side(raw: bytes | str, where: str) -> Side:
    """The other side's record; raises :class:`PairError` for one this payload did not write."""
    try:
        data = json.loads(raw)
        side = Side(str(data["run_id"]), str(data["node"]), str(data["device"]), int(data["ranks"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise PairError(f"the rendezvous at {where} holds no pair record of gpucert's ({describe(exc)})") from None
    if side.ranks < 1:
        raise PairError(f"the other node at {where} says it has {side.ranks} ranks")
    return side


def _reach(host: str, port: int, deadline: float, timeout_s: float) -> None:
    """Return once a TCP connection to ``host:port`` succeeds; raise :class:`PairError` at ``deadline``.

    Retried, because the other pod may not be there yet: its DNS name is published only once it has an
    address, and its store listens only once its payload started (image pull, scheduling).
    """
    last = "not tried"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PairError(
                f"the rendezvous master {host}:{port} could not be reached within {timeout_s:.0f} s "
                f"(last: {last}): the other pod of the pair did not start, or the address is wrong"
            )
        try:
            with socket.create_connection((host, port), timeout=min(5.0, left)):
                return
        except OSError as exc:
            last = describe(exc)
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


class Rendezvous:
    """The meeting point of the two sides: a TCPStore that node rank 0 serves (see the module docstring).

    ``timeout_s`` bounds :meth:`meet` as a whole; :meth:`finish` waits at most ``linger_s`` more.
    """

    def __init__(
        self, torch: Any, host: str, port: int, node_rank: int, *, timeout_s: float, linger_s: float = 60.0
    ) -> None:
        if node_rank not in (0, 1):
            raise ValueError(f"a pair has node ranks 0 and 1, not {node_rank}")
        self._dist = torch.distributed
        self.host, self.port, self.node_rank = host, port, node_rank
        self.timeout_s, self.linger_s = timeout_s, linger_s
        self.where = f"{host}:{port}"
        self._store: Any = None
        self._exchanged = False  # both sides' records were read: the other side may still be reading ours

    def _key(self, what: str, node_rank: int) -> str:
        return f"{_KEY}{what}/{node_rank}"

    def meet(self, me: Side) -> Meeting:
        """Exchange ``me`` for the other side's record; returns the :class:`Meeting`. Raises
        :class:`PairError` when the store cannot be served or reached, the other side does not come within
        the timeout, or it is of another run, on another kind of device, or on this very node."""
        dist, timedelta = self._dist, dt.timedelta
        deadline = time.monotonic() + self.timeout_s
        try:
            if self.node_rank == 0:
                # Listens on every address of the pod: the other pod connects through the Service's name.
                self._store = dist.TCPStore(
                    self.host,
                    self.port,
                    world_size=None,
                    is_master=True,
                    timeout=timedelta(seconds=self.timeout_s),
                    wait_for_workers=False,
                )
            else:
                _reach(self.host, self.port, deadline, self.timeout_s)
                left = max(1.0, deadline - time.monotonic())
                self._store = dist.TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=left))
        except PairError:
            raise
        except Exception as exc:  # torch's DistNetworkError (a RuntimeError): port taken, connection refused
            role = "serve" if self.node_rank == 0 else "reach"
            raise PairError(f"cannot {role} the rendezvous store at {self.where}: {describe(exc)}") from None
        other = 1 - self.node_rank
        try:
            self._store.set(self._key("side", self.node_rank), json.dumps(asdict(me)))
            left = max(0.001, deadline - time.monotonic())
            self._store.wait([self._key("side", other)], timedelta(seconds=left))
            raw = self._store.get(self._key("side", other))
            self._exchanged = True
        except Exception as exc:  # DistStoreError: the wait timed out; or the master went away
            raise PairError(
                f"the other node of the pair (node rank {other}) did not join the rendezvous at {self.where} "
                f"within {self.timeout_s:.0f} s ({describe(exc)})"
            ) from None
        peer = _side(raw, self.where)
        if peer.run_id != me.run_id:
            raise PairError(
                f"the other node at {self.where} ({peer.node}) is of run {peer.run_id!r}, not {me.run_id!r}"
            )
        if peer.device != me.device:
            raise PairError(f"the other node ({peer.node}) runs on {peer.device}, this one on {me.device}")
        if peer.node == me.node:
            raise PairError(f"both sides of the pair run on node {me.node}: a pair is two nodes")
        return Meeting(self.node_rank, me, peer)

    def peer_failed(self) -> str | None:
        """Why the other side gave up, once it has said so (None while it has not, or when it succeeded)."""
        if self._store is None:
            return None
        key = self._key("done", 1 - self.node_rank)
        try:
            if not self._store.check([key]):
                return None
            said = self._store.get(key).decode("utf-8", "replace")
        except Exception as exc:  # the master is gone: the other side ended without saying so
            return f"its rendezvous store is gone ({describe(exc)})"
        return said or None

    def finish(self, failure: str | None = None) -> None:
        """Tell the other side this one is done (``failure``: why it gave up). Node rank 0, which serves
        the store, then waits (at most ``linger_s``) for the other side to be done too, so that the store
        outlives every use of it. Never raises."""
        if self._store is None:
            return
        try:
            self._store.set(self._key("done", self.node_rank), failure or "")
            # Also when the meeting was refused (a peer of another run): the other side reads our record
            # to say so too, and a store closed under it would turn that into "did not join".
            if self.node_rank == 0 and self._exchanged:
                self._store.wait([self._key("done", 1)], dt.timedelta(seconds=self.linger_s))
        except Exception as exc:
            say(f"pair: the rendezvous ended without the other side's word ({describe(exc)})")
        finally:
            self._store = None


# --- the measurement ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairConfig:
    """What each of one side's spawned ranks needs (it crosses a process boundary: plain data)."""

    host: str
    port: int
    backend: str  # "nccl" or "gloo"
    device: str  # "cuda" or "cpu"
    #: local ranks; on CUDA, rank ``i`` drives torch device ``devices[i]``
    ranks: int
    devices: tuple[int, ...]
    offset: int
    world: int
    sizes: tuple[int, ...]
    iters: int
    warmup: int
    rule: RepeatRule
    #: each collective's timeout, and the process group's start (the other side's ranks must come)
    timeout_s: float
    #: seconds, from the ranks' start, by which extra repeats must be done; 0: no deadline
    deadline_s: float = 0.0


@dataclass(frozen=True)
class PairMeasurement:
    """A pair's sweeps: ``seconds[r][i]`` is the slowest rank's time of one all-reduce of ``sizes[i]``
    bytes in repeat ``r``; ``world`` the ranks of both nodes."""

    world: int
    sizes: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]

    def busbw(self) -> list[float]:
        """The bus bandwidth at the largest size, per repeat (GB/s): the values of the rows."""
        return [busbw_gbps(self.sizes[-1], per_size[-1], self.world) for per_size in self.seconds]

    def table(self) -> list[tuple[int, float, float, float]]:
        """Per size: (bytes, median time in µs, algbw GB/s, busbw GB/s) over the repeats."""
        out = []
        for i, size in enumerate(self.sizes):
            t = statistics.median(per_size[i] for per_size in self.seconds)
            out.append((size, t * 1e6, size / t / 1e9, busbw_gbps(size, t, self.world)))
        return out


def _more(cfg: PairConfig, seconds: list[tuple[float, ...]], took: list[float], started: float) -> int:
    """Global rank 0's decision: how many more repeats all ranks run now (0: they agree, or no time)."""
    values = [busbw_gbps(cfg.sizes[-1], per_size[-1], cfg.world) for per_size in seconds]

    def late(more: int) -> str | None:
        fits = time.monotonic() - started + more * statistics.fmean(took) <= cfg.deadline_s
        return None if cfg.deadline_s <= 0 or fits else ""

    more, message = cfg.rule.decide(METRIC, values, "pair", late)
    if message:
        say(message)
    return more


def _measure(torch: Any, dist: Any, device: Any, cfg: PairConfig, rank: int) -> list[tuple[float, ...]]:
    """One rank's share of the sweeps; returns the slowest rank's seconds per all-reduce, per repeat."""
    started = time.monotonic()
    largest = cfg.sizes[-1]
    # Zeros: a sum of ones, repeated, would overflow float32 into inf (harmless, but no data to look at).
    buf = torch.zeros(largest // _FLOAT_BYTES, dtype=torch.float32, device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # nccl-tests warms up at the largest size and at the smallest: connections made, buffers registered.
    for size in dict.fromkeys((largest, cfg.sizes[0])):
        view = buf[: size // _FLOAT_BYTES]
        for _ in range(cfg.warmup):
            dist.all_reduce(view)
    sync()
    out: list[tuple[float, ...]] = []
    took: list[float] = []
    target = cfg.rule.base(METRIC)
    while len(out) < target:
        t_repeat = time.monotonic()
        elapsed = []
        for size in cfg.sizes:
            view = buf[: size // _FLOAT_BYTES]
            dist.barrier()  # every rank starts the size together: its time is the collective's, not skew
            sync()
            t0 = time.perf_counter()
            for _ in range(cfg.iters):
                dist.all_reduce(view)
            sync()
            elapsed.append(time.perf_counter() - t0)
        slowest = torch.tensor(elapsed, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        out.append(tuple(float(v) / cfg.iters for v in slowest.tolist()))
        took.append(time.monotonic() - t_repeat)
        if len(out) == target:
            more = torch.zeros(1, dtype=torch.int64, device=device)
            if rank == 0:
                more[0] = _more(cfg, out, took, started)
            dist.broadcast(more, 0)
            target += int(more.item())
    return out


def _worker(local: int, cfg: PairConfig, results: Any) -> None:
    # Nothing a rank (or NCCL, which logs to stdout) prints may reach the payload's stdout: rows only.
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch
    import torch.distributed

    dist: Any = torch.distributed  # TCPStore and PrefixStore are not in its typed exports
    if cfg.device == "cuda":
        device = torch.device("cuda", cfg.devices[local])
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    timeout = dt.timedelta(seconds=cfg.timeout_s)
    store = dist.TCPStore(cfg.host, cfg.port, is_master=False, timeout=timeout)
    rank = cfg.offset + local
    dist.init_process_group(
        cfg.backend, store=dist.PrefixStore(_KEY + "pg/", store), rank=rank, world_size=cfg.world, timeout=timeout
    )
    try:
        seconds = _measure(torch, dist, device, cfg, rank)
        if local == 0:
            results.put(seconds)
    finally:
        dist.destroy_process_group()


def _last_line(exc: BaseException) -> str:
    """A failed rank's exception in one line: torch puts the rank's whole traceback in the message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def run_pair(
    torch: Any, cfg: PairConfig, *, limit_s: float, peer_failed: Callable[[], str | None] = lambda: None
) -> PairMeasurement:
    """Spawn this side's ranks and return the pair's :class:`PairMeasurement`.

    Raises :class:`PairError` when a rank fails, when the other side says it gave up (``peer_failed``,
    polled each second), or when the ranks are not done within ``limit_s``; every rank still alive is
    killed first, so nothing is left behind.
    """
    tmp = torch.multiprocessing
    results = tmp.get_context("spawn").SimpleQueue()
    procs = tmp.start_processes(_worker, args=(cfg, results), nprocs=cfg.ranks, join=False, start_method="spawn")
    deadline = time.monotonic() + limit_s
    next_check = 0.0
    try:
        while not procs.join(timeout=0.2):
            now = time.monotonic()
            if now > deadline:
                raise PairError(f"the pair's ranks did not finish within {limit_s:.0f} s")
            if now >= next_check:
                why = peer_failed()
                if why is not None:
                    raise PairError(f"the other node of the pair gave up: {why}")
                next_check = now + 1.0
    except PairError:
        raise
    except Exception as exc:  # ProcessRaisedException / ProcessExitedException: a rank failed
        raise PairError(f"a rank of the pair failed: {_last_line(exc)}") from None
    finally:
        for p in procs.processes:
            if p.is_alive():
                p.kill()
    # SimpleQueue has no timeout: it is read only once every rank has exited.
    if results.empty():
        raise PairError("the pair's ranks finished without a result")
    got = results.get()
    if not isinstance(got, list) or not got or any(len(s) != len(cfg.sizes) for s in got):
        raise PairError(f"the pair's ranks returned {got!r}")
    return PairMeasurement(cfg.world, cfg.sizes, tuple(tuple(float(v) for v in s) for s in got))


# --- nccl-tests under MPI -------------------------------------------------------------------------------

_HOST_SLOTS = re.compile(r"([^\s,:]+):([1-9][0-9]*)")
_RANK_LINE = re.compile(r"^#\s*Rank\s+(\d+)\b.*?\son\s+(\S+)\s+device\b", re.MULTILINE)


def mpi_slots(hosts: str) -> int:
    """The ranks of ``mpirun -H HOST:SLOTS,HOST:SLOTS`` (two hosts, one rank per GPU); ``ValueError`` for
    any other form."""
    parts = hosts.split(",")
    matched = [_HOST_SLOTS.fullmatch(p.strip()) for p in parts]
    if len(parts) != 2 or not all(matched) or len({m.group(1) for m in matched if m}) != 2:
        raise ValueError(f"{hosts!r} is not two hosts with their GPU counts, HOST:GPUS,HOST:GPUS")
    return sum(int(m.group(2)) for m in matched if m)


def run_pair_nccl_tests(
    path: str,
    *,
    mpirun: str,
    hosts: str,
    sizes: tuple[int, int, int],
    iters: int,
    warmup: int,
    timeout_s: float,
    extra_args: Sequence[str] = (),
    mpirun_args: Sequence[str] = (),
) -> tuple[AllReducePerf, str]:
    """Run ``all_reduce_perf`` over both hosts of ``hosts`` under ``mpirun`` (one rank per GPU, ``-g 1``),
    sweeping ``sizes`` = (min, max, factor); return the parse and stdout.

    Raises ``ValueError`` for malformed ``hosts`` or an ``extra_args`` option the payload sets, and
    :class:`~gpucert.bench.NcclTestsError` for a failed run, wrong results, or a run that was not one
    job of every rank (an ``all_reduce_perf`` built without ``MPI=1`` runs each process on its own).
    """
    ranks = mpi_slots(hosts)
    low, high, factor = sizes
    cmd = [
        mpirun,
        *mpirun_args,
        "-np",
        str(ranks),
        "-H",
        hosts,
        path,
        "-b",
        str(low),
        "-e",
        str(high),
        "-f",
        str(factor),
        "-g",
        "1",
        "-n",
        str(iters),
        "-w",
        str(warmup),
        "-c",
        "1",
        *check_extra_args(extra_args),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).split()[-40:])
        raise NcclTestsError(f"mpirun {path} exited with status {done.returncode}: {tail}")
    listed = _RANK_LINE.findall(done.stdout)
    seen = {int(rank) for rank, _host in listed}
    if listed and (seen != set(range(ranks)) or len(listed) != ranks):
        raise NcclTestsError(
            f"all_reduce_perf listed ranks {sorted(seen)} in {len(listed)} lines, not the {ranks} ranks mpirun "
            "started as one job: is it built with MPI=1?"
        )
    if listed and len({host for _rank, host in listed}) < 2:
        raise NcclTestsError(f"all_reduce_perf ran every rank on {listed[0][1]}: not across the two nodes")
    parsed = parse_all_reduce_perf(done.stdout)
    if parsed.wrong:
        raise NcclTestsError(f"{path}: {parsed.wrong} wrong result(s): the all-reduce corrupted data")
    return parsed, done.stdout


# --- the pair unit --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairOptions(UnitOptions):
    """The pair unit: one side of a two-node all-reduce (the arguments: :func:`gpucert.bench._cli.parse_pair_args`)."""

    label = "pair "
    cpu_devices: int = 1
    #: each collective's timeout (and the process group's start)
    step_timeout: float = 300.0
    master: tuple[str, int] | None = None
    rank: int | None = None
    nodes: tuple[str, str] | None = None
    peer: str | None = None
    min_bytes: int = 1 << 20
    max_bytes: int = 8 << 30
    step_factor: int = 2
    iters: int = 20
    warmup_iters: int = 5
    rendezvous_timeout: float = 900.0
    mpi_hosts: str | None = None
    mpirun_args: tuple[str, ...] = ()

    @property
    def sizes(self) -> tuple[int, ...]:
        return sweep_sizes(self.min_bytes, self.max_bytes, self.step_factor)

    def session(self, found: Discovery, rows: RowWriter, started: float) -> _PairRun:
        return _PairRun(self, found, rows, started)


class _PairRun(Session[PairOptions]):
    """The pair unit's session: all_reduce_perf under mpirun when that path applies, else torch.distributed
    over both nodes after the rendezvous; whatever stops it is the node's ``error`` row."""

    def measure(self) -> None:
        try:
            mpirun = self.mpirun()
            if mpirun is not None:
                self.nccl_tests_pair(mpirun)
            else:
                self.torch_pair()
        except StepError as exc:
            self.rows.error(METRIC, str(exc))

    def other_node(self) -> str | None:
        """The other node of ``--nodes``, when this node is one of them."""
        o = self.opts
        if o.nodes is None or o.node not in o.nodes:
            return None
        return o.nodes[1] if o.nodes[0] == o.node else o.nodes[0]

    def check_peer(self, peer: str) -> None:
        """The peer the rendezvous found must be the one the arguments expect; :class:`PairError` if not."""
        o = self.opts
        if o.nodes is not None:
            other = self.other_node()
            if other is None:
                raise PairError(f"this node {o.node} is not one of the pair's nodes {list(o.nodes)}")
            if peer != other:
                raise PairError(f"the other side of the pair runs on {peer}, not on {other}")
        if o.peer is not None and peer != o.peer:
            raise PairError(f"the other side of the pair runs on {peer}, not on --peer {o.peer}")

    def torch_pair(self) -> None:
        o = self.opts
        backend, ranks, devices = self.torch_ranks("a pair all-reduce", fewest=1)
        if not self.torch.distributed.is_available():
            raise PairError(f"torch {self.torch.__version__} is built without torch.distributed")
        if o.master is None or o.rank is None:  # the parser refuses this; options made by hand may not
            raise PairError("the torch path needs --master HOST:PORT and --rank")
        host, port = o.master
        rendezvous = Rendezvous(
            self.torch,
            host,
            port,
            o.rank,
            timeout_s=self.left(o.rendezvous_timeout),
            linger_s=min(120.0, o.step_timeout),
        )
        self.rows.say(
            f"pair: node rank {o.rank}, {ranks} local rank(s) ({backend}); rendezvous at {host}:{port} "
            f"within {rendezvous.timeout_s:.0f} s"
        )
        failure: str | None = None
        try:
            meeting = rendezvous.meet(Side(o.run_id, o.node, o.device, ranks))
            peer = meeting.peer.node
            self.check_peer(peer)
            self.rows.say(f"pair: met {peer} ({meeting.peer.ranks} ranks): {meeting.world} ranks in all")
            sizes = o.sizes
            # How long the sweeps may take at the slowest bandwidth a working pair has, every repeat run.
            planned = self.rule.ceiling(METRIC) * (o.iters + 1) * sum(sizes) / (_FLOOR_GBPS[o.device] * 1e9)
            limit = self.left(o.step_timeout + 2 * planned + 60.0)
            # Node rank 0's ranks reach the store in their own pod: no DNS name needed (NCCL and gloo pick
            # their own addresses for the collective; the store only introduces the ranks).
            store_host = "127.0.0.1" if o.rank == 0 else host
            cfg = PairConfig(
                store_host,
                port,
                backend,
                o.device,
                ranks,
                devices,
                meeting.offset,
                meeting.world,
                sizes,
                o.iters,
                o.warmup_iters,
                self.rule,
                o.step_timeout,
                deadline_s=max(0.0, limit - 60.0) if self.deadline is not None else 0.0,
            )
            measured = run_pair(self.torch, cfg, limit_s=limit, peer_failed=rendezvous.peer_failed)
        except PairError as exc:
            failure = str(exc)
            raise
        finally:
            rendezvous.finish(failure)
        for size, time_us, algbw, busbw in measured.table():
            self.rows.say(f"pair: {size:>14,} B {time_us:12.1f} us  algbw {algbw:10.4g} GB/s  busbw {busbw:10.4g} GB/s")
        for repeat, value in enumerate(measured.busbw()):
            self.rows.pair_row(METRIC, peer, value, repeat)

    def nccl_tests_pair(self, mpirun: str) -> None:
        o = self.opts
        peer = o.peer or self.other_node()
        if peer is None:
            raise PairError("the nccl-tests path needs --peer (or --nodes): its launcher is on neither node")
        if o.mpi_hosts is None or o.nccl_tests is None:
            raise PairError("the nccl-tests path needs --nccl-tests PATH and --mpi-hosts")
        hosts, path = o.mpi_hosts, o.nccl_tests

        def measure() -> float:
            parsed, _out = run_pair_nccl_tests(
                path,
                mpirun=mpirun,
                hosts=hosts,
                sizes=(o.min_bytes, o.max_bytes, o.step_factor),
                iters=o.iters,
                warmup=o.warmup_iters,
                timeout_s=self.left(o.step_timeout + 600.0),
                extra_args=o.nccl_tests_args,
                mpirun_args=o.mpirun_args,
            )
            busbw, size = parsed.peak_busbw_gbps, parsed.largest_size
            self.rows.say(f"pair: all_reduce_perf: busbw {busbw:.1f} GB/s at {size:,} B")
            return busbw

        emit = functools.partial(self.rows.pair_row, METRIC, peer)
        try:
            self.repeat(METRIC, "pair", measure, emit, 0.0)
        except Exception as exc:
            raise PairError(f"all_reduce_perf under mpirun: {nccl_tests_failure(exc)}") from None

    def mpirun(self) -> str | None:
        """The ``mpirun`` to run ``all_reduce_perf`` under, when the nccl-tests path applies; else None."""
        if not self.nccl_tests_usable("the pair"):
            return None
        found = shutil.which("mpirun")
        if found is None or self.opts.mpi_hosts is None:
            why = "mpirun is not on the PATH" if found is None else "no --mpi-hosts were given"
            self.rows.say(
                f"all_reduce_perf measures across nodes only as an MPI job, and {why}: the pair runs "
                "on torch.distributed"
            )
            return None
        return found
