"""The payload's run, for every benchmark unit: discover, record the stack, measure, summarise.

:func:`run` frames a node (:class:`Options`: each GPU in turn, then the node's all-reduce, storage and
DCGM, the RDMA ports read around them) and a pair (:class:`gpucert.bench._pair.PairOptions`) the same way.
Every benchmark goes through :class:`Session`'s repeat loop: ``--repeats`` times, then, while they disagree
(:mod:`._stability`), as many more as could settle them, up to ``--max-repeats`` in all, so that
instability is resolved here rather than judged "re-run" later; extra repeats start only while they, and
the base work still ahead, fit before ``--deadline-seconds``. A step that cannot run writes an ``error``
row and the run goes on. A step that hangs is caught by a watchdog: it writes the step's ``error`` row and
the telemetry gathered so far, then ends the process with status 0, since a hung CUDA call cannot be
interrupted.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Generic, TextIO, TypeVar

from ._allreduce import AllReduceConfig, run_allreduce
from ._dcgm import DIAG_TIMEOUT_S, DcgmError, run_dcgm_diag
from ._devices import Discovery, discover, stack_record
from ._nccl_tests import NcclTestsError, run_all_reduce_perf
from ._nic import SYSFS_ROOT, NicReading, nic_rows, read_nics
from ._nvml import Sampler, describe
from ._rows import RowWriter
from ._stability import RepeatRule
from ._storage import StorageBench, StorageError
from ._torch_steps import copy_gbps, gemm_tflops, transfer_gbps

__all__ = ["STEPS", "Options", "Session", "StepError", "UnitOptions", "run", "why_failed"]

#: Steps ``--skip`` accepts.
STEPS = ("gemm", "copy", "h2d", "d2h", "allreduce", "telemetry", "dcgm", "nic", "storage")

STACK_PREFIX = "gpucert-stack: "
DCGM_PREFIX = "gpucert-dcgm: "

#: Planned storage throughput for the deadline (a slow network volume; a local NVMe is ten times faster).
_STORAGE_PLAN_BPS = 0.5e9

#: Kept free before the deadline: the telemetry summary and the last rows (a pair's: the end of the
#: rendezvous) still have to be written.
DEADLINE_MARGIN_S = 30.0
# Base work not yet measured is planned at its nominal length times this (allocation, sync, start-up).
_OVERHEAD = 1.25


@dataclass(frozen=True)
class UnitOptions:
    """What every benchmark unit runs with: the run, the node, the device, the repeat rule, the deadline."""

    #: the word the unit's opening and closing messages start with ("" for a node, "pair " for a pair)
    label: ClassVar[str] = ""
    run_id: str
    node: str
    device: str = "cuda"
    #: pretend GPUs (one process each) on the CPU
    cpu_devices: int = 2
    #: ``--repeats``, ``--max-repeats`` and the policy's expected CVs and knobs
    rule: RepeatRule = field(default_factory=RepeatRule)
    #: seconds from the payload's start by which it must be done; 0: no deadline
    deadline_s: float = 0.0
    #: a node's: seconds before a step counts as hung, 0 derived from the step's length; a pair's: each
    #: collective's timeout
    step_timeout: float = 0.0
    nccl_tests: str | None = None
    #: more ``all_reduce_perf`` options, after the payload's (never the ones it sets: ``_nccl_tests.py``)
    nccl_tests_args: tuple[str, ...] = ()
    stack_json: str | None = None
    hostname: str | None = None

    @property
    def use_nvml(self) -> bool:
        """Whether discovery opens NVML (identity and telemetry of the GPUs)."""
        return self.device == "cuda"

    def session(self, found: Discovery, rows: RowWriter, started: float) -> Session[Any]:
        """The unit's :class:`Session`, whose :meth:`Session.measure` runs its benchmarks."""
        raise NotImplementedError


@dataclass(frozen=True)
class Options(UnitOptions):
    """The node unit: every benchmark of the node's GPUs."""

    gemm_shape: tuple[int, int, int] = (8192, 8192, 8192)
    gemm_seconds: float = 30.0
    gemm_warmup_seconds: float = 10.0
    copy_bytes: int = 2 << 30
    h2d_bytes: int = 1 << 30
    bw_seconds: float = 1.0
    allreduce_bytes: int = 8 << 30
    allreduce_iters: int = 20
    skip: frozenset[str] = field(default_factory=frozenset)
    dcgm: bool = False
    #: the ``dcgmi diag -r`` level (1-4)
    dcgm_level: int = 1
    expected_gpus: int | None = None
    sample_interval: float = 0.2
    #: the sysfs directory of the RDMA devices, and shell patterns of the devices to read (empty: all)
    ib_sysfs: str = SYSFS_ROOT
    ib_devices: tuple[str, ...] = ()
    #: a mounted volume whose sequential reads to measure (None: no storage step), and the file's size
    storage_path: str | None = None
    storage_bytes: int = 4_000_000_000

    @property
    def use_nvml(self) -> bool:
        return "telemetry" not in self.skip

    def session(self, found: Discovery, rows: RowWriter, started: float) -> _Run:
        return _Run(self, found, rows, started)


class StepError(RuntimeError):
    """A benchmark could not run or be measured; the message says why, in words for an ``error`` row."""


_O = TypeVar("_O", bound=UnitOptions)


class Session(Generic[_O]):
    """One unit's run once its devices are found: the options, the devices, the rows, the deadline, and
    what every benchmark of every unit shares (the repeat loop, the collective's ranks, nccl-tests)."""

    def __init__(self, opts: _O, found: Discovery, rows: RowWriter, started: float) -> None:
        self.opts = opts
        self.found = found
        self.rows = rows
        self.torch = found.torch
        self.rule = opts.rule
        self.deadline = started + opts.deadline_s if opts.deadline_s > 0 else None

    def measure(self) -> None:
        """Run the unit's benchmarks, writing their rows."""
        raise NotImplementedError

    # The deadline -----------------------------------------------------------------------------------

    def fits(self, seconds: float) -> bool:
        """Whether ``seconds`` more work ends before the deadline (less its margin)."""
        return self.deadline is None or time.monotonic() + seconds + DEADLINE_MARGIN_S <= self.deadline

    def left(self, wanted: float) -> float:
        """``wanted`` seconds, or fewer when the deadline (less its margin) comes first (at least 1)."""
        if self.deadline is None:
            return wanted
        return max(1.0, min(wanted, self.deadline - DEADLINE_MARGIN_S - time.monotonic()))

    # Repeats ----------------------------------------------------------------------------------------

    def repeat(
        self, metric: str, where: str, measure: Callable[[], float], emit: Callable[[float, int], bool], ahead: float
    ) -> float | None:
        """Measure ``metric`` its base repeats, then more while they disagree (see :meth:`more`), each row
        written by ``emit(value, repeat)`` (False: it was no measurement, and the loop stops); returns the
        ``time.monotonic()`` at which the base repeats were done (None if they were not)."""
        values: list[float] = []
        took: list[float] = []
        base_done: float | None = None
        target = self.rule.base(metric)
        while len(values) < target:
            t = time.monotonic()
            value = measure()
            took.append(time.monotonic() - t)
            if not emit(value, len(values)):
                break
            values.append(value)
            if len(values) == self.rule.base(metric):
                base_done = time.monotonic()
            if len(values) == target:
                target += self.more(metric, values, where, statistics.fmean(took), ahead)
        return base_done

    def more(
        self, metric: str, values: list[float], where: str, each: float, ahead: float, per_batch: float = 0.0
    ) -> int:
        """How many more repeats of ``metric`` to run now: 0 when they agree, at the maximum, or out of time
        (``each``: seconds a repeat takes, ``per_batch`` on top for a batch; ``ahead``: base work to come)."""

        def late(more: int) -> str | None:
            if self.fits(per_batch + more * each + ahead):
                return None
            left = "?" if self.deadline is None else f"{self.deadline - time.monotonic():.0f}"
            return f" ({left} s left, {ahead:.0f} s of work ahead)"

        more, message = self.rule.decide(metric, values, where, late)
        if message:
            self.rows.say(message)
        return more

    # What the collectives share ---------------------------------------------------------------------

    def torch_ranks(self, what: str, *, fewest: int = 0) -> tuple[str, int, tuple[int, ...]]:
        """(backend, local ranks, torch devices) of a collective over every device of the node: NCCL over
        all its GPUs, gloo over ``cpu_devices`` processes on the CPU. Raises :class:`StepError` when torch
        cannot, or can use fewer GPUs than the node has (or than ``fewest``): ``what`` would not be the
        node's."""
        found = self.found
        if self.torch is None:
            raise StepError(found.torch_reason or "torch is not available")
        if self.opts.device != "cuda":
            return "gloo", self.opts.cpu_devices, ()
        if found.torch_reason:
            raise StepError(found.torch_reason)
        usable = tuple(d.torch_index for _, d in sorted(found.devices.items()) if d.torch_index is not None)
        if len(usable) < max(fewest, len(found.devices)):
            raise StepError(
                f"torch can use {len(usable)} of the node's {len(found.devices)} GPUs: {what} over "
                "fewer would not be the node's"
            )
        return "nccl", len(usable), usable

    def nccl_tests_usable(self, instead: str) -> bool:
        """Whether ``--nccl-tests`` names an executable; says so, and that ``instead`` runs on
        torch.distributed, when it names something else."""
        path = self.opts.nccl_tests
        if not path:
            return False
        if os.access(path, os.X_OK):
            return True
        self.rows.say(f"{path} is not an executable: {instead} runs on torch.distributed")
        return False


def why_failed(exc: Exception, *ours: type[Exception]) -> str:
    """Why a step failed, in words: the message of an error it raises itself (``ours``: a tool's failure,
    a bad path), else the exception's type and message (a timeout, a bug)."""
    return str(exc) if isinstance(exc, ours) else describe(exc)


class Watchdog:
    """Calls ``on_expiry(step, gpu, seconds)`` from a timer's thread when a guarded block runs too long."""

    def __init__(self, on_expiry: Callable[[str, int | None, float], None]) -> None:
        self._on_expiry = on_expiry

    @contextlib.contextmanager
    def guard(self, step: str, gpu: int | None, seconds: float) -> Iterator[None]:
        timer = threading.Timer(seconds, self._on_expiry, (step, gpu, seconds))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()


class _Run(Session[Options]):
    """The node unit's session: telemetry and NICs around the per-GPU steps, the all-reduce, storage, DCGM."""

    def __init__(self, opts: Options, found: Discovery, rows: RowWriter, started: float) -> None:
        super().__init__(opts, found, rows, started)
        #: the longest a GPU's base repeats have taken so far (its steps' ``repeats``, warm-up included)
        self._gpu_seconds = 0.0
        self.sampler: Sampler | None = None
        self._nic_before: NicReading | None = None
        #: the summaries written (telemetry, nic): once, whoever comes first (the run's end or the watchdog)
        self._summarised: set[str] = set()
        self._summary_lock = threading.Lock()
        self.exit: Callable[[int], None] = os._exit
        self.watchdog = Watchdog(self._hung)

    def measure(self) -> None:
        if self.opts.expected_gpus is not None:
            self.rows.node_row("gpu_count_expected", self.opts.expected_gpus)
        self.start_telemetry()
        self.start_nic()
        try:
            self.per_gpu_steps()
            self.allreduce()
            self.storage()
            self.dcgm()
        finally:
            self.finish_telemetry()
            self.finish_nic()

    # Steps ----------------------------------------------------------------------------------------------

    def per_gpu_steps(self) -> None:
        o = self.opts
        t, gs, bw, h2d = self.torch, o.gemm_seconds, o.bw_seconds, o.h2d_bytes
        # (step, metric, load, seconds per repeat, one measurement on a device)
        steps: list[tuple[str, str, str, float, Callable[[Any], float]]] = [
            ("gemm", "gemm_bf16_tflops", "compute", gs, lambda d: gemm_tflops(t, d, o.gemm_shape, gs)),
            ("copy", "hbm_copy_gbps", "compute", bw, lambda d: copy_gbps(t, d, o.copy_bytes, bw)),
            ("h2d", "h2d_gbps", "pcie", bw, lambda d: transfer_gbps(t, d, h2d, bw, to_device=True)),
            ("d2h", "d2h_gbps", "pcie", bw, lambda d: transfer_gbps(t, d, h2d, bw, to_device=False)),
        ]
        chosen = [s for s in steps if s[0] not in o.skip]
        if not chosen:
            return
        if not self.found.devices:
            for _step, metric, _load, _secs, _fn in chosen:
                self.rows.error(metric, self.found.torch_reason or "no GPU found (NVML and torch see none)")
            return
        nominal = [self._nominal(step, metric, seconds) for step, metric, _l, seconds, _f in chosen]
        devices = sorted(self.found.devices.items())
        for position, (index, dev) in enumerate(devices):
            gpu_seconds = 0.0
            for q, (step, metric, load, seconds, fn) in enumerate(chosen):
                # Base work after this step: the rest of this GPU's, the other GPUs', then the node's.
                per_gpu = self._gpu_seconds or sum(nominal)
                ahead = sum(nominal[q + 1 :]) + (len(devices) - position - 1) * per_gpu + self._node_work()
                if self.torch is None or (self.found.torch_reason and self.found.kind == "cuda"):
                    self.rows.error(metric, self.found.torch_reason or "torch is not available", index)
                    continue
                if dev.torch_index is None:
                    self.rows.error(metric, f"torch cannot use this GPU (UUID {dev.uuid}): CUDA does not see it", index)
                    continue
                device = self._torch_device(dev.torch_index)
                self.rows.say(f"GPU {index}: {step} × {self.rule.base(metric)}")
                t0 = time.monotonic()
                try:
                    with self._current(device), self._loaded([index], load):
                        if step == "gemm" and o.gemm_warmup_seconds > 0:
                            with self.watchdog.guard(metric, index, self._timeout(o.gemm_warmup_seconds)):
                                # Untimed: the GPU reaches its working temperature before it is measured.
                                gemm_tflops(self.torch, device, o.gemm_shape, o.gemm_warmup_seconds)
                        measure = functools.partial(self._guarded, metric, index, seconds, fn, device)
                        emit = functools.partial(self.rows.gpu, metric, index)
                        base_done = self.repeat(metric, f"GPU {index}", measure, emit, ahead)
                        if base_done is not None:
                            gpu_seconds += base_done - t0
                except Exception as exc:
                    self.rows.error(metric, describe(exc), index)
                finally:
                    if o.device == "cuda":
                        with contextlib.suppress(Exception):
                            self.torch.cuda.empty_cache()
            self._gpu_seconds = max(self._gpu_seconds, gpu_seconds)

    def _guarded(self, metric: str, index: int, seconds: float, fn: Callable[[Any], float], device: Any) -> float:
        """One repeat of a per-GPU step, under the watchdog."""
        with self.watchdog.guard(metric, index, self._timeout(seconds)):
            return fn(device)

    def allreduce(self) -> None:
        o, found = self.opts, self.found
        metric = "nccl_allreduce_busbw_gbps"
        if "allreduce" in o.skip:
            return
        if o.device == "cuda" and self.nccl_tests_usable("the all-reduce"):
            self._nccl_tests()
            return
        try:
            backend, ranks, devices = self.torch_ranks("an all-reduce")
        except StepError as exc:
            self.rows.error(metric, str(exc))
            return
        if ranks < 2:
            self.rows.say(f"{ranks} device(s): no intra-node all-reduce to measure")
            return
        base = self.rule.base(metric)
        cfg = AllReduceConfig(ranks, backend, o.device, o.allreduce_bytes, base, o.allreduce_iters, devices=devices)
        self.rows.say(f"all-reduce: {ranks} ranks ({backend}), {o.allreduce_bytes:,} bytes × {base}")
        values: list[float] = []
        batch = base
        first = 0.0
        while batch:
            cfg = replace(cfg, repeats=batch, timeout_s=self._timeout(max(30.0, batch * o.allreduce_iters * 0.5)))
            t = time.monotonic()
            try:
                with self._loaded(sorted(found.devices), "compute"):
                    measured = run_allreduce(self.torch, cfg)
            except Exception as exc:
                self.rows.error(metric, describe(exc))
                return
            first = first or time.monotonic() - t
            for value in measured:
                if self.rows.node_row(metric, value, len(values)):
                    values.append(value)
            # Each batch starts its ranks afresh: its start-up and warm-up cost about the whole first batch.
            batch = self.more(metric, values, "node", first / base, self._after_allreduce(), per_batch=first)

    def _nccl_tests(self) -> None:
        o, metric = self.opts, "nccl_allreduce_busbw_gbps"

        def measure() -> float:
            with self._loaded(sorted(self.found.devices), "compute"):
                parsed, _out = run_all_reduce_perf(
                    o.nccl_tests or "",
                    sizes=(o.allreduce_bytes, o.allreduce_bytes, 2),
                    gpus=len(self.found.devices),
                    iters=o.allreduce_iters,
                    timeout_s=self._timeout(120.0),
                    extra_args=o.nccl_tests_args,
                )
            self.rows.say(f"all_reduce_perf: busbw {parsed.peak_busbw_gbps:.1f} GB/s at {parsed.largest_size:,} B")
            return parsed.peak_busbw_gbps

        emit = functools.partial(self.rows.node_row, metric)
        try:
            self.repeat(metric, "node", measure, emit, self._after_allreduce())
        except Exception as exc:
            self.rows.error(metric, f"all_reduce_perf: {why_failed(exc, NcclTestsError, OSError, ValueError)}")

    def storage(self) -> None:
        """``storage_read_gbps`` of ``--storage-path``: the file written once, then read per repeat."""
        o, metric = self.opts, "storage_read_gbps"
        if o.storage_path is None or "storage" in o.skip:
            return
        bench = StorageBench(o.storage_path, o.storage_bytes)
        self.rows.say(
            f"storage: {bench.size_bytes:,} bytes under {o.storage_path}" + (f" with {bench.fio}" if bench.fio else "")
        )
        timeout = self._timeout(bench.size_bytes / _STORAGE_PLAN_BPS)
        named = [""]  # the method the log last named

        def measure() -> float:
            with self.watchdog.guard(metric, None, timeout):
                value = bench.measure()
            if bench.method != named[0]:
                named[0] = bench.method
                self.rows.say(f"storage: {metric} by {bench.method}")
            return value

        try:
            with self.watchdog.guard(metric, None, timeout):
                bench.prepare()
            self.repeat(metric, "node", measure, functools.partial(self.rows.node_row, metric), self._dcgm_work())
        except Exception as exc:
            self.rows.error(metric, why_failed(exc, StorageError))
        finally:
            bench.close()

    def dcgm(self) -> None:
        if not self.opts.dcgm or "dcgm" in self.opts.skip:
            return
        try:
            diag = run_dcgm_diag(self.opts.dcgm_level)
        except Exception as exc:
            self.rows.error("dcgm_diag", why_failed(exc, DcgmError, OSError, ValueError))
            return
        if diag is None:
            self.rows.say("dcgmi is not on the PATH: DCGM diagnostics skipped")
            return
        _line(DCGM_PREFIX + json.dumps(diag.summary(), sort_keys=True), self.rows.err)
        for test in diag.tests:
            for gpu in sorted(set(test.failed_gpus), key=lambda g: -1 if g is None else g):
                target = gpu if gpu in self.found.devices else None
                self.rows.error("dcgm_diag", f"dcgmi diag test {test.name!r} failed", target)

    # Telemetry ------------------------------------------------------------------------------------------

    def start_telemetry(self) -> None:
        o, found = self.opts, self.found
        if "telemetry" in o.skip:
            return
        if found.nvml is None:
            self.rows.error("telemetry", found.nvml_reason or "NVML is not available")
            return
        if found.kind == "cpu":
            return
        if found.nvml_count is not None:
            self.rows.node_row("gpu_count", found.nvml_count)
        for index, problem in sorted(found.gpu_problems.items()):
            self.rows.error("telemetry", problem, index)
        if found.handles:
            self.sampler = Sampler(found.nvml, found.handles, interval=o.sample_interval, say=self.rows.say)
            self.sampler.start()

    def finish_telemetry(self) -> None:
        with self._summary_lock:
            if "telemetry" in self._summarised or self.sampler is None:
                return
            self._summarised.add("telemetry")
            summary = self.sampler.stop()
            if self.sampler.event_problem:
                self.rows.say(f"XID events: {self.sampler.event_problem}")
            for index, tele in sorted(summary.items()):
                for note in tele.notes:
                    self.rows.say(f"GPU {index}: {note}")
                for metric, value in tele.values.items():
                    self.rows.gpu(metric, index, value)
                for code in tele.xids:
                    self.rows.gpu("xid", index, code)
                if tele.problems:
                    self.rows.error("telemetry", "; ".join(tele.problems), index)

    def start_nic(self) -> None:
        """The first reading of the node's RDMA ports (none, and no error, on a node without RDMA)."""
        o = self.opts
        if "nic" in o.skip:
            return
        self._nic_before = read_nics(o.ib_sysfs, o.ib_devices)
        if self._nic_before is None:
            self.rows.say(f"no {o.ib_sysfs}: no RDMA NIC to read")

    def finish_nic(self) -> None:
        """The second reading, and the node's NIC rows from the two (once, whoever calls first)."""
        with self._summary_lock:
            if "nic" in self._summarised or self._nic_before is None:
                return
            self._summarised.add("nic")
            after = read_nics(self.opts.ib_sysfs, self.opts.ib_devices)
            if after is None:
                after = NicReading({}, (f"{self.opts.ib_sysfs} disappeared during the run",))
            values, problems, notes = nic_rows(self._nic_before, after)
            for note in notes:
                self.rows.say(f"nic: {note}")
            for metric, value in values.items():
                self.rows.node_row(metric, value)
            if problems:
                self.rows.error("nic", "; ".join(problems))

    # Planning ---------------------------------------------------------------------------------------------

    def _nominal(self, step: str, metric: str, seconds: float) -> float:
        """Planned seconds of one GPU's base repeats of ``step`` (measuring ``metric``), warm-up included."""
        o = self.opts
        warmup = o.gemm_warmup_seconds if step == "gemm" else 0.0
        return _OVERHEAD * (warmup + self.rule.base(metric) * seconds) + 1.0

    def _node_work(self) -> float:
        """Planned seconds of the node's base work after the GPUs: the all-reduce, storage, then DCGM."""
        o = self.opts
        allreduce = 0.0
        if "allreduce" not in o.skip:
            # Start-up (spawn, imports, NCCL init) and each repeat's iterations at a modest 50 GB/s.
            repeats = self.rule.base("nccl_allreduce_busbw_gbps")
            allreduce = 60.0 + _OVERHEAD * repeats * o.allreduce_iters * o.allreduce_bytes / 50e9
        return allreduce + self._after_allreduce()

    def _after_allreduce(self) -> float:
        """Planned seconds of the storage step (the file written once, then read per base repeat) and DCGM."""
        o = self.opts
        storage = 0.0
        if o.storage_path is not None and "storage" not in o.skip:
            storage = _OVERHEAD * (1 + self.rule.base("storage_read_gbps")) * o.storage_bytes / _STORAGE_PLAN_BPS
        return storage + self._dcgm_work()

    def _dcgm_work(self) -> float:
        o = self.opts
        # A quarter of the level's timeout, which allows a few times DCGM's own estimate of its length.
        return DIAG_TIMEOUT_S[o.dcgm_level] / 4 if o.dcgm and "dcgm" not in o.skip else 0.0

    # Helpers --------------------------------------------------------------------------------------------

    def _torch_device(self, torch_index: int) -> Any:
        return self.torch.device("cuda", torch_index) if self.opts.device == "cuda" else self.torch.device("cpu")

    def _current(self, device: Any) -> contextlib.AbstractContextManager[Any]:
        """Make ``device`` CUDA's current device, so every stream and event of the step is on it."""
        return self.torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()

    def _loaded(self, gpus: list[int], kind: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if self.sampler is None else self.sampler.loading(gpus, kind)

    def _timeout(self, seconds: float) -> float:
        return self.opts.step_timeout if self.opts.step_timeout > 0 else max(120.0, 4.0 * seconds + 60.0)

    def _hung(self, step: str, gpu: int | None, seconds: float) -> None:
        self.rows.error(step, f"timed out after {seconds:.0f} s: the device stopped answering; run aborted", gpu)
        with contextlib.suppress(Exception):
            self.finish_telemetry()
        with contextlib.suppress(Exception):
            self.finish_nic()
        self.rows.close()
        self.rows.say("aborted after a hung step: the rows above are all this run has")
        self.exit(0)


def _line(text: str, err: TextIO | None) -> None:
    """A machine-read line on stderr, at the start of the line (no ``gpucert-bench:`` prefix)."""
    print(text, file=err if err is not None else sys.stderr, flush=True)


def run(opts: UnitOptions, *, out: TextIO, err: TextIO | None = None, nvml_module: Any = None) -> int:
    """Run the unit ``opts`` describes, printing rows on ``out`` and messages on ``err``; returns the exit
    status (0: rows were printed, ``error`` rows among them for whatever could not be measured)."""
    t0 = time.monotonic()
    found = discover(
        opts.device,
        cpu_devices=opts.cpu_devices,
        hostname=opts.hostname,
        nvml_module=nvml_module,
        use_nvml=opts.use_nvml,
    )
    rows = RowWriter(opts.run_id, opts.node, found.model, found.devices, out=out, err=err)
    for note in found.notes:
        rows.say(note)
    stack = stack_record(found, opts.node, opts.hostname)
    _line(STACK_PREFIX + json.dumps(stack, sort_keys=True), err)
    if opts.stack_json:
        try:
            Path(opts.stack_json).write_text(json.dumps(stack, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        except OSError as exc:
            rows.say(f"cannot write --stack-json {opts.stack_json}: {exc}")
    devices = ", ".join(f"{i}={d.uuid}" for i, d in sorted(found.devices.items())) or "none"
    rows.say(f"{opts.label}run {opts.run_id} on {opts.node}: {opts.device}, model {found.model!r}, devices {devices}")
    opts.session(found, rows, t0).measure()
    rows.say(f"{opts.label}done in {time.monotonic() - t0:.1f} s: {rows.count} rows, {rows.errors} error row(s)")
    return 0
