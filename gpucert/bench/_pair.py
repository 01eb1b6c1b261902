"""Two-node all-reduce bus bandwidth: every GPU of both nodes of a pair in one collective.

A pair is a benchmark unit of two nodes (:class:`PairOptions`, run as a node is): one payload process on
each node (docs/design/certify-runbook.md, "Pair benchmarks"), each printing ``nccl_pair_busbw_gbps`` rows
for its own node (``peer`` the other), the same values on both sides: the slowest rank's times of the one
collective they ran together. Whatever stops the measurement is a node-level ``error`` row.

Rendezvous (:class:`Rendezvous`): node rank 0 serves a ``torch.distributed.TCPStore`` at ``--master``, node
rank 1 connects to it, and before any GPU is touched the two exchange their run id, node, device kind and
local ranks, so each side's rows can name the other node and a pod of another run, or two pods on one
node, is refused instead of measured. Every wait is bounded by the rendezvous timeout: never a hang.

Measurement (:func:`run_pair`): one process per local device (NCCL on GPUs, so the collective uses NVLink
inside a node and the network between the two, as a training job's does), all the ranks of both nodes in
one process group; per repeat every size of the sweep (``-b``/``-e``/``-f`` as nccl-tests takes them) is
timed, and a row carries the busbw at the largest (the sweep goes to stderr). Extra repeats are decided by
global rank 0 and broadcast, so both nodes report the same repeats. ``all_reduce_perf`` measures across
nodes only as an MPI program, so the nccl-tests path (:func:`run_pair_nccl_tests`) is for a payload that
is an MPI launcher.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
import shutil
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ._allreduce import busbw_gbps, rank_device, spawn_ranks, sweep_buffer, timed_sweep
from ._devices import Discovery
from ._nccl_tests import AllReducePerf, NcclTestsError, run_all_reduce_perf
from ._nvml import describe
from ._rows import RowWriter, say
from ._run import Session, StepError, UnitOptions, why_failed

__all__ = [
    "METRIC",
    "PairError",
    "PairMeasurement",
    "PairOptions",
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
    always MAX itself last (the size a row reports), each a whole number of float32 elements."""
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
    """Return once a TCP connection to ``host:port`` succeeds, retried until ``deadline`` (then
    :class:`PairError`): the other pod's DNS name is published only once it has an address, and its store
    listens only once its payload started (image pull, scheduling)."""
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
    """The meeting point of the two sides, a TCPStore that node rank 0 serves: ``timeout_s`` bounds
    :meth:`meet` as a whole; :meth:`finish` waits at most ``linger_s`` more."""

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

    def meet(self, me: Side) -> Side:
        """Exchange ``me`` for the other side's record, and return that. Raises
        :class:`PairError` when the store cannot be served or reached, the other side does not come within
        the timeout, or it is of another run, on another kind of device, or on this very node."""
        dist, timedelta = self._dist, dt.timedelta
        deadline = time.monotonic() + self.timeout_s
        master = self.node_rank == 0
        try:
            if not master:
                _reach(self.host, self.port, deadline, self.timeout_s)
            # The master listens on every address of the pod: the other pod connects through the Service's name.
            timeout = timedelta(seconds=self.timeout_s if master else max(1.0, deadline - time.monotonic()))
            self._store = dist.TCPStore(self.host, self.port, is_master=master, timeout=timeout, wait_for_workers=False)
        except PairError:
            raise
        except Exception as exc:  # torch's DistNetworkError (a RuntimeError): port taken, connection refused
            role = "serve" if master else "reach"
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
        return peer

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
    """What each of one side's spawned ranks needs (it crosses a process boundary: plain data); the
    options' ``step_timeout`` is each collective's timeout, and the process group's start."""

    opts: PairOptions
    host: str
    port: int
    backend: str  # "nccl" or "gloo"
    #: local ranks; on CUDA, rank ``i`` drives torch device ``devices[i]``
    ranks: int
    devices: tuple[int, ...]
    offset: int
    world: int
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
    values = PairMeasurement(cfg.world, cfg.opts.sizes, tuple(seconds)).busbw()

    def late(more: int) -> str | None:
        fits = time.monotonic() - started + more * statistics.fmean(took) <= cfg.deadline_s
        return None if cfg.deadline_s <= 0 or fits else ""

    more, message = cfg.opts.rule.decide(METRIC, values, "pair", late)
    if message:
        say(message)
    return more


def _measure(torch: Any, dist: Any, device: Any, cfg: PairConfig, rank: int) -> list[tuple[float, ...]]:
    """One rank's share of the sweeps; returns the slowest rank's seconds per all-reduce, per repeat."""
    started = time.monotonic()
    o = cfg.opts
    buf = sweep_buffer(torch, dist, device, o.sizes, o.warmup_iters)
    out: list[tuple[float, ...]] = []
    took: list[float] = []
    target = o.rule.base(METRIC)
    while len(out) < target:
        t_repeat = time.monotonic()
        out.append(timed_sweep(torch, dist, device, buf, o.sizes, o.iters))
        took.append(time.monotonic() - t_repeat)
        if len(out) == target:
            more = torch.zeros(1, dtype=torch.int64, device=device)
            if rank == 0:
                more[0] = _more(cfg, out, took, started)
            dist.broadcast(more, 0)
            target += int(more.item())
    return out


def _worker(local: int, cfg: PairConfig, results: Any) -> None:
    torch, device = rank_device(cfg.opts.device, cfg.devices, local)
    import torch.distributed as torch_distributed

    dist: Any = torch_distributed  # TCPStore and PrefixStore are not in its typed exports
    timeout = dt.timedelta(seconds=cfg.opts.step_timeout)
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
    """Spawn this side's ranks and return the pair's :class:`PairMeasurement`. Raises :class:`PairError`
    when a rank fails, the other side says it gave up (``peer_failed``, polled each second), or the ranks
    are not done within ``limit_s``; every rank still alive is killed first."""

    def poll() -> None:
        why = peer_failed()
        if why is not None:
            raise PairError(f"the other node of the pair gave up: {why}")

    try:
        got = spawn_ranks(torch, _worker, (cfg,), cfg.ranks, limit_s=limit_s, what="pair's", poll=poll)
    except PairError:
        raise
    except TimeoutError as exc:
        raise PairError(str(exc)) from None
    except Exception as exc:  # ProcessRaisedException / ProcessExitedException: a rank failed
        raise PairError(f"a rank of the pair failed: {_last_line(exc)}") from None
    if got is None:
        raise PairError("the pair's ranks finished without a result")
    sizes = cfg.opts.sizes
    if not isinstance(got, list) or not got or any(len(s) != len(sizes) for s in got):
        raise PairError(f"the pair's ranks returned {got!r}")
    return PairMeasurement(cfg.world, sizes, tuple(tuple(float(v) for v in s) for s in got))


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
    """:func:`._nccl_tests.run_all_reduce_perf` over both hosts of ``hosts`` under ``mpirun``, one rank per
    GPU (``-g 1``); ``ValueError`` for malformed ``hosts``, and ``NcclTestsError`` also for a run that was
    not one job of every rank (an ``all_reduce_perf`` built without ``MPI=1`` runs each process alone)."""
    ranks = mpi_slots(hosts)

    def one_job_across_both(stdout: str) -> None:
        listed = _RANK_LINE.findall(stdout)
        seen = {int(rank) for rank, _host in listed}
        if listed and (seen != set(range(ranks)) or len(listed) != ranks):
            raise NcclTestsError(
                f"all_reduce_perf listed ranks {sorted(seen)} in {len(listed)} lines, not the {ranks} ranks mpirun "
                "started as one job: is it built with MPI=1?"
            )
        if listed and len({host for _rank, host in listed}) < 2:
            raise NcclTestsError(f"all_reduce_perf ran every rank on {listed[0][1]}: not across the two nodes")

    launcher = [mpirun, *mpirun_args, "-np", str(ranks), "-H", hosts]
    return run_all_reduce_perf(
        path,
        sizes=sizes,
        gpus=1,
        iters=iters,
        warmup=warmup,
        timeout_s=timeout_s,
        extra_args=extra_args,
        mpirun=launcher,
        check=one_job_across_both,
    )


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
        timeout, linger = self.left(o.rendezvous_timeout), min(120.0, o.step_timeout)
        rendezvous = Rendezvous(self.torch, host, port, o.rank, timeout_s=timeout, linger_s=linger)
        self.rows.say(
            f"pair: node rank {o.rank}, {ranks} local rank(s) ({backend}); rendezvous at {host}:{port} "
            f"within {rendezvous.timeout_s:.0f} s"
        )
        gave_up: str | None = None
        try:
            their = rendezvous.meet(Side(o.run_id, o.node, o.device, ranks))
            peer = their.node
            self.check_peer(peer)
            world = ranks + their.ranks  # one process group of every local rank of both nodes
            offset = 0 if o.rank == 0 else their.ranks  # node rank 0's ranks come first
            self.rows.say(f"pair: met {peer} ({their.ranks} ranks): {world} ranks in all")
            sizes = o.sizes
            # How long the sweeps may take at the slowest bandwidth a working pair has, every repeat run.
            planned = self.rule.ceiling(METRIC) * (o.iters + 1) * sum(sizes) / (_FLOOR_GBPS[o.device] * 1e9)
            limit = self.left(o.step_timeout + 2 * planned + 60.0)
            # Node rank 0's ranks reach the store in their own pod: no DNS name needed (NCCL and gloo pick
            # their own addresses for the collective; the store only introduces the ranks).
            store_host = "127.0.0.1" if o.rank == 0 else host
            deadline = max(0.0, limit - 60.0) if self.deadline is not None else 0.0
            cfg = PairConfig(o, store_host, port, backend, ranks, devices, offset, world, deadline_s=deadline)
            measured = run_pair(self.torch, cfg, limit_s=limit, peer_failed=rendezvous.peer_failed)
        except PairError as exc:
            gave_up = str(exc)
            raise
        finally:
            rendezvous.finish(gave_up)
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
            why = why_failed(exc, NcclTestsError, OSError, ValueError)
            raise PairError(f"all_reduce_perf under mpirun: {why}") from None

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
