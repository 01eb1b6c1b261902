"""The node's RDMA NICs, read from sysfs before and after the benchmark: ports down, trained down, flapping.

A port that is down, runs below its peers' rate (NDR trained down to HDR) or whose link drops and comes
back slows every multi-node job the node is in, while every GPU benchmark passes. The kernel shows each
RDMA port (InfiniBand or RoCE) under ``/sys/class/infiniband/<device>/ports/<n>/``: ``state``,
``phys_state`` (for the log only), ``rate`` (read for ACTIVE ports only: some drivers show none for a port
that is down) and the ``counters/`` since last cleared.

Reading twice gives the node's rows (docs/reference/metrics.md, "Telemetry, node level"): a port counts
as active only when ACTIVE in both readings, the rates span both readings, and each counter's increase is
summed over the ports. No ``/sys/class/infiniband``: no RDMA NIC, no rows and no error. A file that cannot
be read or parsed is never a number: its metric is left out and the file named in the problems (one
node-level ``error`` row). So is a counter stuck at the most its width holds (InfiniBand's port counters
stop, they do not wrap): its increase cannot be measured until someone clears it (``perfquery -x -R``).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["COUNTER_METRICS", "SYSFS_ROOT", "NicReading", "Port", "nic_rows", "parse_rate", "parse_state", "read_nics"]

#: Where the kernel lists RDMA devices.
SYSFS_ROOT = "/sys/class/infiniband"
#: The ``state`` number of an ACTIVE port (``IB_PORT_ACTIVE``).
ACTIVE = 4
#: counter file under ``ports/<n>/counters/`` → the row it sums into.
COUNTER_METRICS: Mapping[str, str] = {
    "symbol_error": "ib_symbol_errors",
    "link_downed": "ib_link_downed",
    "port_rcv_errors": "ib_rcv_errors",
}
#: The value at which each counter stops (IBA PortCounters: 16, 8 and 16 bits).
_SATURATED = {"symbol_error": 0xFFFF, "link_downed": 0xFF, "port_rcv_errors": 0xFFFF}

_STATE = re.compile(r"\s*(\d+)\s*:\s*(\S+)\s*")
_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec\b")


@dataclass(frozen=True)
class Port:
    """One RDMA port as read once. ``rate_gbps`` is None unless the port is ACTIVE and its rate was read;
    ``counters`` holds the counters that were read (a missing one is in the reading's problems)."""

    device: str
    port: int
    state: int
    state_name: str
    phys_state: str = ""
    rate_gbps: float | None = None
    counters: Mapping[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def active(self) -> bool:
        return self.state == ACTIVE


@dataclass(frozen=True)
class NicReading:
    """Every port found under the root at one moment, and what could not be read (each naming its file)."""

    ports: Mapping[tuple[str, int], Port]
    problems: tuple[str, ...] = ()


def parse_state(text: str) -> tuple[int, str]:
    """``"4: ACTIVE"`` → ``(4, "ACTIVE")``; raises ``ValueError`` for anything else."""
    match = _STATE.fullmatch(text)
    if match is None:
        raise ValueError(f"{text.strip()!r} is not a port state like '4: ACTIVE'")
    return int(match.group(1)), match.group(2)


def parse_rate(text: str) -> float:
    """``"400 Gb/sec (4X NDR)"`` → ``400.0`` (Gb/s); raises ``ValueError`` for anything else."""
    match = _RATE.match(text)
    if match is None:
        raise ValueError(f"{text.strip()!r} is not a port rate like '400 Gb/sec (4X NDR)'")
    return float(match.group(1))


def _read(path: Path, problems: list[str]) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        problems.append(f"cannot read {path}: {exc.strerror or exc}")
        return None


def _read_port(device: str, number: int, where: Path, problems: list[str]) -> Port | None:
    text = _read(where / "state", problems)
    if text is None:
        return None
    try:
        state, state_name = parse_state(text)
    except ValueError as exc:
        problems.append(f"{where / 'state'}: {exc}")
        return None
    phys = _read(where / "phys_state", []) or ""  # words for the log only: never a problem
    rate: float | None = None
    if state == ACTIVE:
        raw = _read(where / "rate", problems)
        if raw is not None:
            try:
                rate = parse_rate(raw)
            except ValueError as exc:
                problems.append(f"{where / 'rate'}: {exc}")
    counters: dict[str, int] = {}
    for name in COUNTER_METRICS:
        path = where / "counters" / name
        raw = _read(path, problems)
        if raw is None:
            continue
        if not raw.strip().isdigit():
            problems.append(f"{path}: {raw.strip()!r} is not a counter value")
            continue
        counters[name] = int(raw.strip())
    return Port(device, number, state, state_name, phys.strip(), rate, counters)


def read_nics(root: str | os.PathLike[str] = SYSFS_ROOT, devices: Sequence[str] = ()) -> NicReading | None:
    """The ports under ``root`` (each ``<device>/ports/<n>``), of the devices matching one of the shell
    patterns ``devices`` (all when empty: ``mlx5_[0-7]`` keeps storage and management NICs out); None when
    ``root`` does not exist (the node has no RDMA NIC)."""
    base = Path(root)
    if not base.exists():
        return None
    problems: list[str] = []
    try:
        names = sorted(entry.name for entry in base.iterdir())
    except OSError as exc:
        return NicReading({}, (f"cannot list {base}: {exc.strerror or exc}",))
    ports: dict[tuple[str, int], Port] = {}
    for device in names:
        if devices and not any(fnmatch.fnmatchcase(device, pattern) for pattern in devices):
            continue
        port_dir = base / device / "ports"
        try:
            numbers = sorted(int(p.name) for p in port_dir.iterdir() if p.name.isdigit())
        except OSError as exc:
            problems.append(f"cannot list {port_dir}: {exc.strerror or exc}")
            continue
        for number in numbers:
            port = _read_port(device, number, port_dir / str(number), problems)
            if port is not None:
                ports[device, number] = port
    return NicReading(ports, tuple(problems))


def nic_rows(before: NicReading, after: NicReading) -> tuple[dict[str, float], list[str], list[str]]:
    """The node's rows from a reading at the start and one at the end: (metric → value, problems, notes:
    log lines naming the ports down or slow). A metric whose inputs could not all be read is absent."""
    problems = list(dict.fromkeys([*before.problems, *after.problems]))
    notes: list[str] = []
    keys = sorted(set(before.ports) | set(after.ports))
    rows: dict[str, float] = {}
    if not keys:
        if not problems:
            notes.append("no RDMA port found")
        return rows, problems, notes
    rows["ib_ports"] = float(len(keys))
    active = 0
    rates: list[float] = []
    rate_unknown = False
    for key in keys:
        first, last = before.ports.get(key), after.ports.get(key)
        seen = [p for p in (first, last) if p is not None]
        if first is None or last is None:
            gone = "appeared" if first is None else "disappeared"
            notes.append(f"RDMA port {seen[0].name} {gone} during the run")
        if first is not None and last is not None and first.active and last.active:
            active += 1
        else:
            down = next((p for p in seen if not p.active), None)
            if down is not None:
                phys = f", physical state {down.phys_state}" if down.phys_state else ""
                notes.append(f"RDMA port {down.name} is {down.state_name}{phys}")
        rates += [p.rate_gbps for p in seen if p.active and p.rate_gbps is not None]
        rate_unknown |= any(p.active and p.rate_gbps is None for p in seen)
    rows["ib_ports_active"] = float(active)
    if rates and not rate_unknown:
        rows["ib_rate_min_gbps"] = min(rates)
        rows["ib_rate_max_gbps"] = max(rates)
        if min(rates) < max(rates):
            readings = [p for k in keys for p in (before.ports.get(k), after.ports.get(k)) if p is not None]
            slow = sorted({p.name for p in readings if p.rate_gbps == min(rates)})
            notes.append(f"RDMA port(s) {', '.join(slow)} at {min(rates):g} Gb/s, the fastest at {max(rates):g}")
    for counter, metric in COUNTER_METRICS.items():
        total, known = _increase(counter, keys, before, after, problems)
        if known:
            rows[metric] = float(total)
    return rows, problems, notes


def _increase(
    counter: str, keys: Sequence[tuple[str, int]], before: NicReading, after: NicReading, problems: list[str]
) -> tuple[int, bool]:
    """The counter's increase summed over the ports that were there at both readings; (0, False) when one
    of them could not be measured (its reason added to ``problems``)."""
    total, known = 0, True
    for key in keys:
        first, last = before.ports.get(key), after.ports.get(key)
        if first is None or last is None:
            continue  # a port that came or went has no increase; the port count says it changed
        if counter not in first.counters or counter not in last.counters:
            known = False  # why is a problem already
            continue
        start, end = first.counters[counter], last.counters[counter]
        if start >= _SATURATED[counter] and end == start:
            problems.append(
                f"counters/{counter} of RDMA port {first.name} is stuck at {start}, the most it counts: its "
                "increase cannot be measured (clear the port's counters: perfquery -x -R)"
            )
            known = False
            continue
        # A counter cleared during the run counts from 0 again: what it holds now is the least it rose.
        total += end - start if end >= start else end
    return total, known
