"""NVML telemetry sampled in a background thread while the benchmarks run, and XID events.

The NVML module is passed in (``pynvml`` in a Pod, a fake in the tests), so every rule here is tested
without a GPU. What a run yields, per GPU (docs/reference/metrics.md, "Telemetry, GPU level"):

* ``clocks_event_reasons`` — the OR of the clock-event bitmask over every sample of the run;
* ``hw_slowdown_frac`` — the share of the GPU's *benchmark* samples (those taken while a step drove it)
  with a hardware slowdown bit (0x08, 0x40, 0x80) set; all samples when none was taken under load;
* ``pcie_gen`` / ``pcie_width`` — the link as measured *under PCIe load*: a link trains down when idle,
  so the maximum over samples taken while the GPU moved data over PCIe (its H2D/D2H steps), else over its
  benchmark samples, else over all; ``pcie_gen_max`` / ``pcie_width_max`` — what the link can do
  (``nvmlDeviceGetMaxPcieLinkGeneration`` / ``…Width``: the best the GPU and its slot support);
* ``pcie_replays_per_min`` — the replay counter's increase over the run, per minute;
* ``temp_max_c`` — the hottest sample; ``temp_slowdown_c`` — the slowdown threshold;
* ``power_limit_w`` (the lowest enforced limit read at start and end), ``power_limit_default_w``;
* ``ecc_dbe_volatile`` / ``ecc_sbe_volatile``, ``remapped_rows_pending`` / ``remapped_rows_failure`` —
  read at the end of the run;
* ``nvlink_down`` — links 0..N−1 (those the GPU has) that report DISABLED, the worse of start and end;
  ``nvlink_crc_errors`` — the increase of the CRC (flit + data) counters of those links over the run;
* ``xid`` — one per ``nvmlEventTypeXidCriticalError`` event received during the run.

A quantity the GPU does not support (``NVML_ERROR_NOT_SUPPORTED``, a function the driver lacks, NVLink
on a PCIe card) leaves no row and a note; any other NVML failure (a lost GPU, say) is a problem the
caller writes as an ``error`` row. Nothing is ever filled in.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HW_SLOWDOWN_BITS", "GpuTelemetry", "NvmlUnavailable", "Sampler", "open_nvml", "text"]

#: HwSlowdown | HwThermalSlowdown | HwPowerBrakeSlowdown (docs/reference/telemetry.md, "Clock-event reasons").
HW_SLOWDOWN_BITS = 0x08 | 0x40 | 0x80

# NVML return codes (nvml.h), by number so that a fake module needs only ``NVMLError`` with ``.value``.
_INVALID_ARGUMENT = 2
_NOT_SUPPORTED = 3
_TIMEOUT = 10
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_ABSENT = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND})

# Constants used, with the values of nvml.h in case a (fake) module lacks one.
_DEFAULTS = {
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN": 1,
    "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
    "NVML_VOLATILE_ECC": 0,
    "NVML_FEATURE_DISABLED": 0,
    "NVML_NVLINK_MAX_LINKS": 18,
    "NVML_NVLINK_ERROR_DL_CRC_FLIT": 2,
    "NVML_NVLINK_ERROR_DL_CRC_DATA": 3,
    "nvmlEventTypeXidCriticalError": 8,
}


class NvmlUnavailable(Exception):
    """NVML cannot be used at all (no pynvml, no library, no driver): the reason, in one line."""


def open_nvml(module: Any | None = None) -> Any:
    """Import ``pynvml`` (unless a module is given) and initialise it; raise :class:`NvmlUnavailable`."""
    if module is None:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable(f"pynvml (nvidia-ml-py) is not installed: {exc}") from None
        module = pynvml
    try:
        module.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, …: all mean "no NVML here"
        raise NvmlUnavailable(f"NVML cannot start: {describe(exc)}") from None
    return module


def text(value: object) -> str:
    """NVML strings are ``bytes`` in old bindings, ``str`` in new ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}".rstrip(": ")


def _code(nvml: Any, exc: BaseException) -> int | None:
    base = getattr(nvml, "NVMLError", None)
    if isinstance(base, type) and isinstance(exc, base):
        value = getattr(exc, "value", None)
        return value if isinstance(value, int) else None
    return None


@dataclass
class GpuTelemetry:
    """What the sampler has to say about one GPU at the end of the run."""

    values: dict[str, float] = field(default_factory=dict)
    xids: list[int] = field(default_factory=list)
    #: NVML failures other than "not supported": the caller writes an ``error`` row.
    problems: list[str] = field(default_factory=list)
    #: quantities this GPU does not support: said on stderr, no row.
    notes: list[str] = field(default_factory=list)


@dataclass
class _State:
    handle: Any
    lost: bool = False
    samples: int = 0
    reasons_or: int = 0
    reasons_seen: bool = False
    busy_samples: int = 0
    busy_hw: int = 0
    all_hw: int = 0
    temp_max: float | None = None
    # (gen, width) maxima by load kind: "pcie", "busy", "any"
    link: dict[str, list[float | None]] = field(default_factory=dict)
    replays_start: float | None = None
    crc_start: float | None = None
    links: list[int] | None = None
    nvlink_down_start: int | None = None
    power_start: float | None = None
    t_start: float = 0.0
    out: GpuTelemetry = field(default_factory=GpuTelemetry)
    reported: set[str] = field(default_factory=set)


class Sampler:
    """Sample every GPU (``gpu`` index → NVML handle) every ``interval`` seconds in a thread; collect XID
    events; summarise on stop. Steps say what load a GPU is under (:meth:`loading`), so link width and
    slowdown share are judged under load."""

    def __init__(
        self,
        nvml: Any,
        gpus: Mapping[int, Any],
        *,
        interval: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.nvml = nvml
        self.interval = interval
        self.clock = clock
        self._say = say or (lambda _m: None)
        self._gpus = {index: _State(handle) for index, handle in gpus.items()}
        self._lock = threading.Lock()
        self._load: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._events: Any = None
        self._by_uuid: dict[str, int] = {}
        self.event_problem: str | None = None

    # Lifecycle ------------------------------------------------------------------------------------------

    def begin(self) -> None:
        """Read what is read once at the start (limits, counters, link states); set up the event set."""
        now = self.clock()
        for index, st in self._gpus.items():
            st.t_start = now
            uuid = self._call(st, "uuid", "nvmlDeviceGetUUID")
            if uuid is not None:
                self._by_uuid[text(uuid)] = index
            self._static(st)
        self._open_events()

    def start(self) -> None:
        """:meth:`begin`, then sample in a daemon thread until :meth:`stop`."""
        self.begin()
        self._thread = threading.Thread(target=self._loop, name="gpucert-nvml-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> dict[int, GpuTelemetry]:
        """Stop the thread, read the end-of-run counters, and return each GPU's telemetry."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._say("the NVML sampler did not stop in time; summarising what it has")
        with self._lock:
            self.sample_locked()  # one last sample, so even a short run has one
            now = self.clock()
            for st in self._gpus.values():
                self._finish(st, now)
            self._close_events()
            return {index: st.out for index, st in self._gpus.items()}

    @contextlib.contextmanager
    def loading(self, gpus: Iterable[int], kind: str = "compute") -> Iterator[None]:
        """Mark ``gpus`` as under load (``"pcie"`` for host transfers) for the duration of the block."""
        chosen = list(gpus)
        with self._lock:
            self._load.update(dict.fromkeys(chosen, kind))
        try:
            yield
        finally:
            with self._lock:
                for g in chosen:
                    self._load.pop(g, None)

    # What the thread does ------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            if self._events is not None:
                self.wait_events(self.interval)
            else:
                self._stop.wait(self.interval)

    def sample(self) -> None:
        with self._lock:
            self.sample_locked()

    def sample_locked(self) -> None:
        for index, st in self._gpus.items():
            if st.lost:
                continue
            load = self._load.get(index)
            st.samples += 1
            reasons = self._reasons(st)
            if reasons is not None:
                st.reasons_seen = True
                st.reasons_or |= reasons
                hw = bool(reasons & HW_SLOWDOWN_BITS)
                st.all_hw += hw
                if load is not None:
                    st.busy_samples += 1
                    st.busy_hw += hw
            temp = self._number(st, "temp_max_c", "nvmlDeviceGetTemperature", self._const("NVML_TEMPERATURE_GPU"))
            if temp is not None:
                st.temp_max = temp if st.temp_max is None else max(st.temp_max, temp)
            gen = self._number(st, "pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration")
            width = self._number(st, "pcie_width", "nvmlDeviceGetCurrPcieLinkWidth")
            kinds = ["any"] + ([] if load is None else ["busy"]) + (["pcie"] if load == "pcie" else [])
            for kind in kinds:
                best = st.link.setdefault(kind, [None, None])
                for k, v in enumerate((gen, width)):
                    if v is not None:
                        old = best[k]
                        best[k] = v if old is None else max(old, v)

    def wait_events(self, seconds: float) -> None:
        """Wait up to ``seconds`` for NVML events, recording XIDs; returns early on stop."""
        deadline = self.clock() + seconds
        while not self._stop.is_set():
            left_ms = int((deadline - self.clock()) * 1000)
            if left_ms <= 0:
                return
            try:
                event = self.nvml.nvmlEventSetWait(self._events, left_ms)
            except Exception as exc:
                if _code(self.nvml, exc) == _TIMEOUT:
                    return
                self.event_problem = f"waiting for NVML events failed: {describe(exc)}"
                self._close_events()
                self._stop.wait(max(0.0, deadline - self.clock()))
                return
            self._record_event(event)

    # Reading --------------------------------------------------------------------------------------------

    def _const(self, name: str) -> Any:
        return getattr(self.nvml, name, _DEFAULTS.get(name))

    def _call(self, st: _State, what: str, fn: str, *args: Any, quiet_codes: frozenset[int] = _ABSENT) -> Any:
        """NVML's ``fn`` of the GPU (its handle, then ``args``); ``None`` on failure, noted (unsupported) or
        recorded (a problem) once per what."""
        func = getattr(self.nvml, fn, None)
        if func is None:
            self._note(st, what, f"{what}: this NVML has no {fn}")
            return None
        try:
            return func(st.handle, *args)
        except Exception as exc:
            code = _code(self.nvml, exc)
            if code in quiet_codes:
                self._note(st, what, f"{what}: not supported ({describe(exc)})")
            elif code == _GPU_IS_LOST:
                if not st.lost:
                    st.lost = True
                    st.out.problems.append(f"NVML reports the GPU lost ({describe(exc)})")
            elif what not in st.reported:
                st.reported.add(what)
                st.out.problems.append(f"{what}: {fn} failed ({describe(exc)})")
            return None

    def _number(self, st: _State, what: str, fn: str, *args: Any, per: float = 1.0) -> float | None:
        """:meth:`_call` as a number, in NVML's units ``per`` one of ours (1000 for milliwatts)."""
        value = self._call(st, what, fn, *args)
        return None if value is None else float(value) / per

    def _store(self, st: _State, metric: str, fn: str, *args: Any, per: float = 1.0) -> None:
        """:meth:`_number` as ``metric``'s value of the GPU, unless it failed."""
        value = self._number(st, metric, fn, *args, per=per)
        if value is not None:
            st.out.values[metric] = value

    def _note(self, st: _State, what: str, message: str) -> None:
        if what not in st.reported:
            st.reported.add(what)
            st.out.notes.append(message)

    def _reasons(self, st: _State) -> int | None:
        if getattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) is not None:
            fn = "nvmlDeviceGetCurrentClocksEventReasons"
        else:  # drivers and bindings before 535 name it "throttle reasons"
            fn = "nvmlDeviceGetCurrentClocksThrottleReasons"
        value = self._call(st, "clocks_event_reasons", fn)
        return None if value is None else int(value)

    def _static(self, st: _State) -> None:
        self._store(st, "pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration")
        self._store(st, "pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth")
        slowdown = self._const("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN")
        self._store(st, "temp_slowdown_c", "nvmlDeviceGetTemperatureThreshold", slowdown)
        self._store(st, "power_limit_default_w", "nvmlDeviceGetPowerManagementDefaultLimit", per=1000.0)
        st.power_start = self._number(st, "power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", per=1000.0)
        st.replays_start = self._number(st, "pcie_replays_per_min", "nvmlDeviceGetPcieReplayCounter")
        st.links = self._present_links(st)
        if st.links:
            st.nvlink_down_start = self._links_down(st)
            st.crc_start = self._crc_total(st)

    def _present_links(self, st: _State) -> list[int]:
        """The NVLink links this GPU has: those whose state NVML answers (a PCIe card has none)."""
        present: list[int] = []
        fn = getattr(self.nvml, "nvmlDeviceGetNvLinkState", None)
        if fn is None:
            return present
        for link in range(int(self._const("NVML_NVLINK_MAX_LINKS"))):
            try:
                fn(st.handle, link)
            except Exception as exc:
                code = _code(self.nvml, exc)
                if code in _ABSENT | {_INVALID_ARGUMENT}:
                    continue
                if code == _GPU_IS_LOST:
                    self._call(st, "nvlink_down", "nvmlDeviceGetNvLinkState", link)
                    return []
                if "nvlink_down" not in st.reported:
                    st.reported.add("nvlink_down")
                    st.out.problems.append(f"nvlink_down: link {link}: {describe(exc)}")
                continue
            present.append(link)
        if not present:
            st.out.notes.append("NVLink: no link reported (no NVLink on this GPU)")
        return present

    def _links_down(self, st: _State) -> int | None:
        disabled = self._const("NVML_FEATURE_DISABLED")
        down = 0
        for link in st.links or ():
            state = self._call(st, "nvlink_down", "nvmlDeviceGetNvLinkState", link)
            if state is None:
                return None
            down += int(state == disabled)
        return down

    def _crc_total(self, st: _State) -> float:
        total = 0.0
        counters = (self._const("NVML_NVLINK_ERROR_DL_CRC_FLIT"), self._const("NVML_NVLINK_ERROR_DL_CRC_DATA"))
        quiet = _ABSENT | {_INVALID_ARGUMENT}
        for link in st.links or ():
            for counter in counters:
                what = f"nvlink_crc_errors[{counter}]"
                v = self._call(st, what, "nvmlDeviceGetNvLinkErrorCounter", link, counter, quiet_codes=quiet)
                if v is not None:
                    total += float(v)
        return total

    def _finish(self, st: _State, now: float) -> None:
        values = st.out.values
        if st.reasons_seen:
            values["clocks_event_reasons"] = float(st.reasons_or)
            if st.busy_samples:
                values["hw_slowdown_frac"] = st.busy_hw / st.busy_samples
            elif st.samples:
                values["hw_slowdown_frac"] = st.all_hw / st.samples
        if st.temp_max is not None:
            values["temp_max_c"] = st.temp_max
        for k, metric in enumerate(("pcie_gen", "pcie_width")):
            for kind in ("pcie", "busy", "any"):
                best = st.link.get(kind, [None, None])[k]
                if best is not None:
                    values[metric] = best
                    break
        if st.lost:
            # A lost GPU answers nothing more; what was read before it fell off stays.
            return
        power = self._number(st, "power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", per=1000.0)
        limits = [v for v in (st.power_start, power) if v is not None]
        if limits:
            values["power_limit_w"] = min(limits)
        replays = self._number(st, "pcie_replays_per_min", "nvmlDeviceGetPcieReplayCounter")
        if replays is not None and st.replays_start is not None:
            minutes = max(now - st.t_start, 1e-9) / 60.0
            values["pcie_replays_per_min"] = max(0.0, replays - st.replays_start) / minutes
        volatile = self._const("NVML_VOLATILE_ECC")
        for metric, kind in (("ecc_dbe_volatile", "UNCORRECTED"), ("ecc_sbe_volatile", "CORRECTED")):
            errors = self._const(f"NVML_MEMORY_ERROR_TYPE_{kind}")
            self._store(st, metric, "nvmlDeviceGetTotalEccErrors", errors, volatile)
        remap = self._call(st, "remapped_rows", "nvmlDeviceGetRemappedRows")
        if remap is not None:
            _corr, _unc, pending, failure = remap
            values["remapped_rows_pending"] = float(bool(pending))
            values["remapped_rows_failure"] = float(bool(failure))
        if st.links:
            down_end = self._links_down(st)
            downs = [d for d in (st.nvlink_down_start, down_end) if d is not None]
            if downs:
                values["nvlink_down"] = float(max(downs))
            if st.crc_start is not None:
                values["nvlink_crc_errors"] = max(0.0, self._crc_total(st) - st.crc_start)

    # XID events -----------------------------------------------------------------------------------------

    def _open_events(self) -> None:
        xid = int(self._const("nvmlEventTypeXidCriticalError"))
        try:
            events = self.nvml.nvmlEventSetCreate()
        except Exception as exc:
            self.event_problem = f"cannot create an NVML event set: {describe(exc)}"
            return
        registered = 0
        for st in self._gpus.values():
            try:
                supported = int(self.nvml.nvmlDeviceGetSupportedEventTypes(st.handle))
                if supported & xid:
                    self.nvml.nvmlDeviceRegisterEvents(st.handle, xid, events)
                    registered += 1
                else:
                    st.out.notes.append("xid: this GPU does not support XID events")
            except Exception as exc:
                st.out.notes.append(f"xid: cannot register for XID events ({describe(exc)})")
        if registered:
            self._events = events
        else:
            with contextlib.suppress(Exception):
                self.nvml.nvmlEventSetFree(events)

    def _record_event(self, event: Any) -> None:
        if int(getattr(event, "eventType", 0)) & int(self._const("nvmlEventTypeXidCriticalError")) == 0:
            return
        index = None
        with contextlib.suppress(Exception):
            index = self._by_uuid.get(text(self.nvml.nvmlDeviceGetUUID(event.device)))
        if index is None:
            index = next((i for i, st in self._gpus.items() if st.handle is event.device), None)
        if index is None:
            self._say(f"XID {getattr(event, 'eventData', '?')} from a GPU outside this run: not recorded")
            return
        self._gpus[index].out.xids.append(int(event.eventData))

    def _close_events(self) -> None:
        if self._events is not None:
            events, self._events = self._events, None
            with contextlib.suppress(Exception):
                self.nvml.nvmlEventSetFree(events)
