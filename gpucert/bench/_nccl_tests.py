"""nccl-tests ``all_reduce_perf``: parse its stdout (a pure function) and run it when the image has it.

The table ``all_reduce_perf`` prints has, per message size, an out-of-place and an in-place measurement:
``size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong`` (older versions or
other collectives may lack ``redop``/``root``, so the line is read from both ends). The figure the payload
reports is the bus bandwidth at the largest size, the better of out-of-place and in-place, as the
bandwidth of a large all-reduce is what the node is judged on (REFERENCE.md: busbw at 8 GB).
"""

from __future__ import annotations

import math
import subprocess
from dataclasses import dataclass

__all__ = [
    "AllReducePerf",
    "NcclTestsError",
    "NcclTestsPoint",
    "parse_all_reduce_perf",
    "run_all_reduce_perf",
]


class NcclTestsError(ValueError):
    """The output is not an ``all_reduce_perf`` table the parser can read, or the run failed."""


@dataclass(frozen=True)
class NcclTestsPoint:
    size: int  # bytes
    count: int  # elements
    dtype: str
    in_place: bool
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None  # None when validation was off ("N/A")


@dataclass(frozen=True)
class AllReducePerf:
    points: tuple[NcclTestsPoint, ...]
    #: the footer's "Avg bus bandwidth", when printed
    avg_busbw_gbps: float | None
    out_of_bounds: int | None

    @property
    def largest_size(self) -> int:
        return max(p.size for p in self.points)

    @property
    def peak_busbw_gbps(self) -> float:
        """Bus bandwidth at the largest message size (the better of out-of-place and in-place)."""
        size = self.largest_size
        return max(p.busbw_gbps for p in self.points if p.size == size)

    @property
    def wrong(self) -> int:
        return sum(p.wrong or 0 for p in self.points)


def _number(word: str, line_no: int, what: str) -> float:
    try:
        value = float(word)
    except ValueError:
        raise NcclTestsError(f"line {line_no}: {what} {word!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise NcclTestsError(f"line {line_no}: {what} {word!r} is not a finite, non-negative number")
    return value


def parse_all_reduce_perf(text: str) -> AllReducePerf:
    """Parse ``all_reduce_perf`` stdout; raise :class:`NcclTestsError` when no table can be read."""
    points: list[NcclTestsPoint] = []
    avg: float | None = None
    oob: int | None = None
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            body = line.lstrip("#").strip()
            if body.lower().startswith("avg bus bandwidth") and ":" in body:
                avg = _number(body.split(":", 1)[1].strip().split()[0], line_no, "average bus bandwidth")
            elif body.lower().startswith("out of bounds values") and ":" in body:
                words = body.split(":", 1)[1].split()
                if words and words[0].isdigit():
                    oob = int(words[0])
            continue
        words = line.split()
        if not words[0].isdigit():
            continue  # other tools' chatter (NCCL INFO lines, warnings): not part of the table
        if len(words) < 10:
            raise NcclTestsError(
                f"line {line_no}: a table row with {len(words)} fields (truncated?): {line!r}"
            )
        size, count = int(words[0]), _number(words[1], line_no, "count")
        dtype = words[2]
        for in_place, part in ((False, words[-8:-4]), (True, words[-4:])):
            time_us = _number(part[0], line_no, "time")
            algbw = _number(part[1], line_no, "algbw")
            busbw = _number(part[2], line_no, "busbw")
            wrong = None if part[3].upper() == "N/A" else int(_number(part[3], line_no, "#wrong"))
            points.append(NcclTestsPoint(size, int(count), dtype, in_place, time_us, algbw, busbw, wrong))
    if not points:
        raise NcclTestsError(
            "no all_reduce_perf table rows found (the run failed or the output is truncated)"
        )
    return AllReducePerf(tuple(points), avg, oob)


def run_all_reduce_perf(
    path: str, *, gpus: int, nbytes: int, iters: int = 20, warmup: int = 5, timeout_s: float = 600.0
) -> tuple[AllReducePerf, str]:
    """Run ``all_reduce_perf`` at one size over ``gpus`` GPUs of one process; return the parse and stdout."""
    cmd = [path, "-b", str(nbytes), "-e", str(nbytes), "-f", "2", "-g", str(gpus), "-n", str(iters),
           "-w", str(warmup), "-c", "1"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).split()[-40:])
        raise NcclTestsError(f"{path} exited with status {done.returncode}: {tail}")
    parsed = parse_all_reduce_perf(done.stdout)
    if parsed.wrong:
        raise NcclTestsError(f"{path}: {parsed.wrong} wrong result(s): the all-reduce corrupted data")
    return parsed, done.stdout
