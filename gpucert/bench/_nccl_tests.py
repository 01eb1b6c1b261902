"""nccl-tests ``all_reduce_perf``: parse its stdout (a pure function) and run it when the image has it.

Its table has, per message size, an out-of-place and an in-place measurement: ``size count type redop root
| time algbw busbw #wrong | time algbw busbw #wrong`` (older versions or other collectives may lack
``redop``/``root``, so the line is read from both ends). The payload reports the bus bandwidth at the
largest size, the better of the two (docs/reference/reference-values.md: busbw at 8 GB). More options
(``--nccl-tests-args``) go after the payload's own; those that decide *what* is measured (sizes,
iterations, GPUs per process, threads, the data check ``#wrong`` needs) stay the payload's.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "OWN_OPTIONS",
    "AllReducePerf",
    "NcclTestsError",
    "NcclTestsPoint",
    "check_extra_args",
    "parse_all_reduce_perf",
    "run_all_reduce_perf",
]

#: ``all_reduce_perf`` options (short → long) the payload sets itself; see the module docstring.
OWN_OPTIONS = {
    "t": "nthreads",
    "g": "ngpus",
    "b": "minbytes",
    "e": "maxbytes",
    "i": "stepbytes",
    "f": "stepfactor",
    "n": "iters",
    "c": "check",
}


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
    for line_no, raw in enumerate(text.splitlines(), start=1):
        words = raw.split()
        if not words or not words[0].isdigit():
            continue  # headers, the footer, other tools' chatter (NCCL INFO lines, warnings): not the table
        if len(words) < 10:
            raise NcclTestsError(f"line {line_no}: a table row with {len(words)} fields (truncated?): {raw.strip()!r}")
        size, count = int(words[0]), _number(words[1], line_no, "count")
        dtype = words[2]
        for in_place, part in ((False, words[-8:-4]), (True, words[-4:])):
            time_us = _number(part[0], line_no, "time")
            algbw = _number(part[1], line_no, "algbw")
            busbw = _number(part[2], line_no, "busbw")
            wrong = None if part[3].upper() == "N/A" else int(_number(part[3], line_no, "#wrong"))
            points.append(NcclTestsPoint(size, int(count), dtype, in_place, time_us, algbw, busbw, wrong))
    if not points:
        raise NcclTestsError("no all_reduce_perf table rows found (the run failed or the output is truncated)")
    return AllReducePerf(tuple(points))


def check_extra_args(args: Sequence[str]) -> tuple[str, ...]:
    """``args`` as a tuple when none of them sets an option of :data:`OWN_OPTIONS`; ``ValueError`` naming the
    first that does (``-g1``, ``--ngpus=1`` and getopt's abbreviations such as ``--ngp`` alike)."""
    for arg in args:
        if arg.startswith("--") and len(arg) > 2:
            name = arg[2:].split("=", 1)[0]
            own = next((o for o in OWN_OPTIONS.values() if o.startswith(name)), None)
        elif arg.startswith("-") and len(arg) > 1:
            own = OWN_OPTIONS.get(arg[1])
        else:
            continue
        if own is not None:
            raise ValueError(f"{arg!r} sets all_reduce_perf's --{own}, which the payload sets itself")
    return tuple(args)


def run_all_reduce_perf(
    path: str,
    *,
    sizes: tuple[int, int, int],
    gpus: int,
    iters: int = 20,
    warmup: int = 5,
    timeout_s: float = 600.0,
    extra_args: Sequence[str] = (),
    mpirun: Sequence[str] = (),
    check: Callable[[str], None] = lambda _stdout: None,
) -> tuple[AllReducePerf, str]:
    """Run ``all_reduce_perf`` sweeping ``sizes`` = (min, max, factor) over ``gpus`` GPUs per process,
    ``extra_args`` after the payload's options, under the ``mpirun`` command line when one is given (the
    pair's); return the parse and stdout. Raises ``ValueError`` for an ``extra_args`` entry that sets an
    option the payload sets (:func:`check_extra_args`) and :class:`NcclTestsError` for a failed run,
    wrong results, or output that ``check`` refuses."""
    low, high, factor = sizes
    own = f"-b {low} -e {high} -f {factor} -g {gpus} -n {iters} -w {warmup} -c 1".split()
    cmd = [*mpirun, path, *own, *check_extra_args(extra_args)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).split()[-40:])
        raise NcclTestsError(f"{'mpirun ' if mpirun else ''}{path} exited with status {done.returncode}: {tail}")
    check(done.stdout)
    parsed = parse_all_reduce_perf(done.stdout)
    if parsed.wrong:
        raise NcclTestsError(f"{path}: {parsed.wrong} wrong result(s): the all-reduce corrupted data")
    return parsed, done.stdout
