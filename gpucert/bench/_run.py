"""The payload's run: discover, record the stack, benchmark each GPU in turn, all-reduce, summarise.

Each benchmark runs ``--repeats`` times; when those disagree (:mod:`._stability`, the verdict engine's
rule) it runs more, as many as could settle them, again while they still disagree, up to
``--max-repeats`` in all, so that instability is resolved here rather than judged "re-run" later. Extra
repeats start only while they, and the base work still ahead (the other GPUs, the all-reduce, DCGM),
fit before ``--deadline-seconds``. The rows simply number the repeats ``0..n-1``.

Around the benchmarks the node's RDMA ports are read from sysfs (:mod:`._nic`: ports down, trained down,
error counters rising during the run), and with ``--storage-path`` a mounted volume's sequential read
throughput is measured after the all-reduce (:mod:`._storage`).

Every step that cannot run writes an ``error`` row (gpu level for a per-GPU step, node level otherwise)
and a reason on stderr, and the run goes on with the next step. A step that hangs (a GPU that stopped
answering) is caught by a watchdog: it writes the step's ``error`` row and the telemetry gathered so far,
then ends the process with status 0, since a hung CUDA call cannot be interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from ._allreduce import AllReduceConfig, run_allreduce
from ._dcgm import DIAG_TIMEOUT_S, DcgmError, run_dcgm_diag
from ._devices import Discovery, discover, stack_record
from ._nccl_tests import NcclTestsError, run_all_reduce_perf
from ._nic import SYSFS_ROOT, NicReading, nic_rows, read_nics
from ._nvml import Sampler, describe
from ._rows import RowWriter
from ._stability import (
    DEFAULT_CV_REP,
    DEFAULT_MAX_REPEATS,
    DEFAULT_REPEATS_OF,
    DEFAULT_TRANSIENT_PCT,
    DEFAULT_UNSTABLE_FACTOR,
    RepeatRule,
)
from ._storage import StorageBench, StorageError
from ._torch_steps import copy_gbps, gemm_tflops, heat, transfer_gbps

__all__ = ["STEPS", "Options", "run"]

#: Steps ``--skip`` accepts.
STEPS = ("gemm", "copy", "h2d", "d2h", "allreduce", "telemetry", "dcgm", "nic", "storage")

STACK_PREFIX = "gpucert-stack: "
DCGM_PREFIX = "gpucert-dcgm: "

#: Planned storage throughput for the deadline (a slow network volume; a local NVMe is ten times faster).
_STORAGE_PLAN_BPS = 0.5e9

#: Kept free before the deadline: the telemetry summary and the last rows still have to be written.
DEADLINE_MARGIN_S = 30.0
# Base work not yet measured is planned at its nominal length times this (allocation, sync, start-up).
_OVERHEAD = 1.25


@dataclass(frozen=True)
class Options:
    run_id: str
    node: str
    device: str = "cuda"
    repeats: int = 3
    #: more repeats while they disagree, up to this many in all (never fewer than ``repeats``)
    max_repeats: int = DEFAULT_MAX_REPEATS
    #: (metric, expected run-to-run CV): the policy's ``metrics.<name>.cv_rep``
    cv_rep: tuple[tuple[str, float], ...] = tuple(DEFAULT_CV_REP.items())
    unstable_factor: float = DEFAULT_UNSTABLE_FACTOR
    transient_pct: float = DEFAULT_TRANSIENT_PCT
    #: (metric, base repeats) for metrics measured more often than ``repeats``: the policy's
    #: ``metrics.<name>.repeats``
    repeats_of: tuple[tuple[str, int], ...] = tuple(DEFAULT_REPEATS_OF.items())
    #: seconds from the payload's start by which it must be done; 0: no deadline
    deadline_s: float = 0.0
    gemm_shape: tuple[int, int, int] = (8192, 8192, 8192)
    gemm_seconds: float = 30.0
    gemm_warmup_seconds: float = 10.0
    copy_bytes: int = 2 << 30
    h2d_bytes: int = 1 << 30
    bw_seconds: float = 1.0
    allreduce_bytes: int = 8 << 30
    allreduce_iters: int = 20
    cpu_devices: int = 2
    skip: frozenset[str] = field(default_factory=frozenset)
    nccl_tests: str | None = None
    #: more ``all_reduce_perf`` options, after the payload's (never the ones it sets: ``_nccl_tests.py``)
    nccl_tests_args: tuple[str, ...] = ()
    dcgm: bool = False
    #: the ``dcgmi diag -r`` level (1-4)
    dcgm_level: int = 1
    stack_json: str | None = None
    expected_gpus: int | None = None
    sample_interval: float = 0.2
    step_timeout: float = 0.0  # 0: derived from the step's length
    hostname: str | None = None
    #: the sysfs directory of the RDMA devices, and shell patterns of the devices to read (empty: all)
    ib_sysfs: str = SYSFS_ROOT
    ib_devices: tuple[str, ...] = ()
    #: a mounted volume whose sequential reads to measure (None: no storage step), and the file's size
    storage_path: str | None = None
    storage_bytes: int = 4_000_000_000

    @property
    def rule(self) -> RepeatRule:
        return RepeatRule(self.repeats, self.max_repeats, self.cv_rep, self.unstable_factor, self.transient_pct,
                          self.repeats_of)


class Watchdog:
    """Calls ``on_expiry(step, gpu, seconds)`` from its own thread when a guarded block runs too long."""

    def __init__(self, on_expiry: Callable[[str, int | None, float], None]) -> None:
        self._on_expiry = on_expiry
        self._cond = threading.Condition()
        self._armed: tuple[str, int | None, float, float] | None = None
        self._thread = threading.Thread(target=self._loop, name="gpucert-watchdog", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def guard(self, step: str, gpu: int | None, seconds: float) -> Iterator[None]:
        with self._cond:
            self._armed = (step, gpu, seconds, time.monotonic() + seconds)
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._armed = None
                self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._armed is None:
                    self._cond.wait()
                step, gpu, seconds, deadline = self._armed
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._armed = None
            self._on_expiry(step, gpu, seconds)


class _Run:
    def __init__(self, opts: Options, found: Discovery, rows: RowWriter, started: float | None = None) -> None:
        self.opts = opts
        self.found = found
        self.rows = rows
        self.torch = found.torch
        self.rule = opts.rule
        started = time.monotonic() if started is None else started
        self.deadline = started + opts.deadline_s if opts.deadline_s > 0 else None
        #: the longest a GPU's base repeats have taken so far (its steps' ``repeats``, warm-up included)
        self._gpu_seconds = 0.0
        self.sampler: Sampler | None = None
        self._telemetry_written = False
        self._telemetry_lock = threading.Lock()
        self._nic_before: NicReading | None = None
        self._nic_written = False
        self._nic_lock = threading.Lock()
        self.exit: Callable[[int], None] = os._exit
        self.watchdog = Watchdog(self._hung)

    # Steps ----------------------------------------------------------------------------------------------

    def per_gpu_steps(self) -> None:
        o = self.opts
        steps: list[tuple[str, str, str, float, Callable[[Any], float]]] = [
            ("gemm", "gemm_bf16_tflops", "compute", o.gemm_seconds,
             lambda d: gemm_tflops(self.torch, d, o.gemm_shape, o.gemm_seconds)),
            ("copy", "hbm_copy_gbps", "compute", o.bw_seconds,
             lambda d: copy_gbps(self.torch, d, o.copy_bytes, o.bw_seconds)),
            ("h2d", "h2d_gbps", "pcie", o.bw_seconds,
             lambda d: transfer_gbps(self.torch, d, o.h2d_bytes, o.bw_seconds, to_device=True)),
            ("d2h", "d2h_gbps", "pcie", o.bw_seconds,
             lambda d: transfer_gbps(self.torch, d, o.h2d_bytes, o.bw_seconds, to_device=False)),
        ]  # fmt: skip
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
                    self.rows.error(metric, f"torch cannot use this GPU (UUID {dev.uuid}): CUDA does not see it",
                                    index)  # fmt: skip
                    continue
                device = self._torch_device(dev.torch_index)
                base = self.rule.base(metric)
                self.rows.say(f"GPU {index}: {step} × {base}")
                t0 = time.monotonic()
                try:
                    with self._current(device), self._loaded([index], load):
                        if step == "gemm" and o.gemm_warmup_seconds > 0:
                            with self.watchdog.guard(metric, index, self._timeout(o.gemm_warmup_seconds)):
                                heat(self.torch, device, o.gemm_shape, o.gemm_warmup_seconds)
                        values: list[float] = []
                        took: list[float] = []
                        target = base
                        while len(values) < target:
                            t = time.monotonic()
                            with self.watchdog.guard(metric, index, self._timeout(seconds)):
                                value = fn(device)
                            took.append(time.monotonic() - t)
                            if not self.rows.gpu(metric, index, value, len(values)):
                                break
                            values.append(value)
                            if len(values) == base:
                                gpu_seconds += time.monotonic() - t0
                            if len(values) == target:
                                each = statistics.fmean(took)
                                target += self._more(metric, values, f"GPU {index}", each, ahead)
                except Exception as exc:
                    self.rows.error(metric, describe(exc), index)
                finally:
                    self._free_memory()
            self._gpu_seconds = max(self._gpu_seconds, gpu_seconds)

    def allreduce(self) -> None:
        o, found = self.opts, self.found
        metric = "nccl_allreduce_busbw_gbps"
        if "allreduce" in o.skip:
            return
        if o.device == "cuda" and o.nccl_tests:
            if os.access(o.nccl_tests, os.X_OK):
                self._nccl_tests()
                return
            self.rows.say(f"{o.nccl_tests} is not an executable: the all-reduce runs on torch.distributed")
        if self.torch is None:
            self.rows.error(metric, found.torch_reason or "torch is not available")
            return
        if o.device == "cuda":
            if found.torch_reason:
                self.rows.error(metric, found.torch_reason)
                return
            usable = [d.torch_index for _, d in sorted(found.devices.items()) if d.torch_index is not None]
            if len(usable) < len(found.devices):
                self.rows.error(metric, f"torch can use {len(usable)} of the node's {len(found.devices)} GPUs: "
                                "an all-reduce over fewer would not be the node's")  # fmt: skip
                return
            backend, ranks, devices = "nccl", len(usable), tuple(i for i in usable if i is not None)
        else:
            backend, ranks, devices = "gloo", o.cpu_devices, ()
        if ranks < 2:
            self.rows.say(f"{ranks} device(s): no intra-node all-reduce to measure")
            return
        base = self.rule.base(metric)
        timeout = self._timeout(max(30.0, base * o.allreduce_iters * 0.5))
        cfg = AllReduceConfig(ranks, backend, o.device, o.allreduce_bytes, base,
                              iters=o.allreduce_iters, timeout_s=timeout, devices=devices)  # fmt: skip
        self.rows.say(f"all-reduce: {ranks} ranks ({backend}), {o.allreduce_bytes:,} bytes × {base}")
        values: list[float] = []
        batch = base
        first = 0.0
        while batch:
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
            batch = self._more(metric, values, "node", first / base, self._after_allreduce(), per_batch=first)
            timeout = self._timeout(max(30.0, batch * o.allreduce_iters * 0.5))
            cfg = replace(cfg, repeats=batch, timeout_s=timeout)

    def _nccl_tests(self) -> None:
        o, metric = self.opts, "nccl_allreduce_busbw_gbps"
        gpus = len(self.found.devices)
        values: list[float] = []
        took: list[float] = []
        target = self.rule.base(metric)
        while len(values) < target:
            t = time.monotonic()
            try:
                with self._loaded(sorted(self.found.devices), "compute"):
                    parsed, _out = run_all_reduce_perf(
                        o.nccl_tests or "", gpus=gpus, nbytes=o.allreduce_bytes, iters=o.allreduce_iters,
                        timeout_s=self._timeout(120.0), extra_args=o.nccl_tests_args,
                    )  # fmt: skip
            except (NcclTestsError, OSError, ValueError) as exc:
                self.rows.error(metric, f"all_reduce_perf: {exc}")
                return
            except Exception as exc:  # a timeout, say
                self.rows.error(metric, f"all_reduce_perf: {describe(exc)}")
                return
            self.rows.say(
                f"all_reduce_perf: busbw {parsed.peak_busbw_gbps:.1f} GB/s at {parsed.largest_size:,} B"
            )
            took.append(time.monotonic() - t)
            if not self.rows.node_row(metric, parsed.peak_busbw_gbps, len(values)):
                return
            values.append(parsed.peak_busbw_gbps)
            if len(values) == target:
                target += self._more(metric, values, "node", statistics.fmean(took), self._after_allreduce())

    def storage(self) -> None:
        """``storage_read_gbps`` of ``--storage-path``: the file written once, then read per repeat."""
        o, metric = self.opts, "storage_read_gbps"
        if o.storage_path is None or "storage" in o.skip:
            return
        bench = StorageBench(o.storage_path, o.storage_bytes)
        self.rows.say(f"storage: {bench.size_bytes:,} bytes under {o.storage_path}"
                      + (f" with {bench.fio}" if bench.fio else ""))  # fmt: skip
        try:
            with self.watchdog.guard(metric, None, self._timeout(bench.size_bytes / _STORAGE_PLAN_BPS)):
                bench.prepare()
            values: list[float] = []
            took: list[float] = []
            target = self.rule.base(metric)
            method = ""
            while len(values) < target:
                t = time.monotonic()
                with self.watchdog.guard(metric, None, self._timeout(bench.size_bytes / _STORAGE_PLAN_BPS)):
                    value = bench.measure()
                took.append(time.monotonic() - t)
                if bench.method != method:
                    method = bench.method
                    self.rows.say(f"storage: {metric} by {method}")
                if not self.rows.node_row(metric, value, len(values)):
                    return
                values.append(value)
                if len(values) == target:
                    target += self._more(metric, values, "node", statistics.fmean(took), self._dcgm_work())
        except StorageError as exc:
            self.rows.error(metric, str(exc))
        except Exception as exc:
            self.rows.error(metric, describe(exc))
        finally:
            bench.close()

    def dcgm(self) -> None:
        if not self.opts.dcgm or "dcgm" in self.opts.skip:
            return
        try:
            diag = run_dcgm_diag(self.opts.dcgm_level)
        except (DcgmError, OSError, ValueError) as exc:
            self.rows.error("dcgm_diag", str(exc))
            return
        except Exception as exc:
            self.rows.error("dcgm_diag", describe(exc))
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
        with self._telemetry_lock:
            if self._telemetry_written or self.sampler is None:
                return
            self._telemetry_written = True
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
        with self._nic_lock:
            if self._nic_written or self._nic_before is None:
                return
            self._nic_written = True
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

    # Repeats --------------------------------------------------------------------------------------------

    def _more(
        self, metric: str, values: list[float], where: str, each: float, ahead: float, per_batch: float = 0.0
    ) -> int:
        """How many more repeats of ``metric`` to run now: 0 when they agree, at the maximum, or out of time.

        ``each``: seconds a repeat takes, ``per_batch`` on top for a batch of them; ``ahead``: seconds of
        base work still to come after this step.
        """
        more, verdict = self.rule.more(metric, values)
        if not verdict.unstable:
            return 0
        n = len(values)
        if more == 0:
            self.rows.say(f"{where}: {metric}: repeats still disagree after {n} ({verdict.why}): at the "
                          f"maximum of {self.rule.ceiling(metric)}")  # fmt: skip
            return 0
        if not self._fits(per_batch + more * each + ahead):
            left = "?" if self.deadline is None else f"{self.deadline - time.monotonic():.0f}"
            self.rows.say(f"{where}: {metric}: repeats disagree after {n} ({verdict.why}), but {more} more "
                          f"would not fit before the deadline ({left} s left, {ahead:.0f} s of work ahead)")
            return 0
        self.rows.say(f"{where}: {metric}: repeats disagree ({verdict.why}): {more} more, "
                      f"{n + more} of at most {self.rule.ceiling(metric)}")  # fmt: skip
        return more

    def _fits(self, seconds: float) -> bool:
        if self.deadline is None:
            return True
        return time.monotonic() + seconds + DEADLINE_MARGIN_S <= self.deadline

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
        return self._storage_work() + self._dcgm_work()

    def _storage_work(self) -> float:
        """Planned seconds of the storage step: the file written once, then read per base repeat."""
        o = self.opts
        if o.storage_path is None or "storage" in o.skip:
            return 0.0
        passes = 1 + self.rule.base("storage_read_gbps")
        return _OVERHEAD * passes * o.storage_bytes / _STORAGE_PLAN_BPS

    def _dcgm_work(self) -> float:
        o = self.opts
        # A quarter of the level's timeout, which allows a few times DCGM's own estimate of its length.
        return DIAG_TIMEOUT_S[o.dcgm_level] / 4 if o.dcgm and "dcgm" not in o.skip else 0.0

    # Helpers --------------------------------------------------------------------------------------------

    def _torch_device(self, torch_index: int) -> Any:
        if self.opts.device == "cuda":
            return self.torch.device("cuda", torch_index)
        return self.torch.device("cpu")

    def _current(self, device: Any) -> contextlib.AbstractContextManager[Any]:
        """Make ``device`` CUDA's current device, so every stream and event of the step is on it."""
        if device.type == "cuda":
            cm: contextlib.AbstractContextManager[Any] = self.torch.cuda.device(device)
            return cm
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _loaded(self, gpus: list[int], kind: str) -> Iterator[None]:
        if self.sampler is None:
            yield
            return
        with self.sampler.loading(gpus, kind):
            yield

    def _free_memory(self) -> None:
        if self.torch is not None and self.opts.device == "cuda":
            with contextlib.suppress(Exception):
                self.torch.cuda.empty_cache()

    def _timeout(self, seconds: float) -> float:
        if self.opts.step_timeout > 0:
            return self.opts.step_timeout
        return max(120.0, 4.0 * seconds + 60.0)

    def _hung(self, step: str, gpu: int | None, seconds: float) -> None:
        self.rows.error(
            step, f"timed out after {seconds:.0f} s: the device stopped answering; run aborted", gpu
        )
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


def run(opts: Options, *, out: TextIO, err: TextIO | None = None, nvml_module: Any = None) -> int:
    """Run the payload, printing rows on ``out`` and messages on ``err``; returns the exit status (0)."""
    t0 = time.monotonic()
    found = discover(
        opts.device,
        cpu_devices=opts.cpu_devices,
        hostname=opts.hostname,
        nvml_module=nvml_module,
        use_nvml="telemetry" not in opts.skip,
    )
    rows = RowWriter(opts.run_id, opts.node, found.model, found.devices, out=out, err=err)
    for note in found.notes:
        rows.say(note)
    stack = stack_record(found, opts.node, opts.hostname)
    _line(STACK_PREFIX + json.dumps(stack, sort_keys=True), err)
    if opts.stack_json:
        try:
            Path(opts.stack_json).write_text(
                json.dumps(stack, indent=2, sort_keys=True) + "\n", encoding="utf-8"
            )
        except OSError as exc:
            rows.say(f"cannot write --stack-json {opts.stack_json}: {exc}")
    devices = ", ".join(f"{i}={d.uuid}" for i, d in sorted(found.devices.items())) or "none"
    rows.say(f"run {opts.run_id} on {opts.node}: {opts.device}, model {found.model!r}, devices {devices}")

    job = _Run(opts, found, rows, started=t0)
    if opts.expected_gpus is not None:
        rows.node_row("gpu_count_expected", opts.expected_gpus)
    job.start_telemetry()
    job.start_nic()
    try:
        job.per_gpu_steps()
        job.allreduce()
        job.storage()
        job.dcgm()
    finally:
        job.finish_telemetry()
        job.finish_nic()
    rows.say(f"done in {time.monotonic() - t0:.1f} s: {rows.count} rows, {rows.errors} error row(s)")
    return 0
