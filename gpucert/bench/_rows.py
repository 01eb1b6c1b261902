"""Every line the payload prints on stdout is one results row (docs/design/data-contracts.md, "Results").

A value that is not a finite, non-negative number is refused: such a measurement becomes an ``error`` row,
never a number in the results.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TextIO

from ._metrics import METRICS, RESULT_COLUMNS

__all__ = ["Device", "RowWriter", "say"]

PREFIX = "gpucert-bench"


def say(message: str, *, err: TextIO | None = None) -> None:
    """One human line on stderr (never stdout: stdout carries rows only)."""
    stream = err if err is not None else sys.stderr
    print(f"{PREFIX}: {message}", file=stream, flush=True)


@dataclass(frozen=True)
class Device:
    """One device the payload reports on. ``index`` is the ``gpu`` column: the NVML index when NVML sees
    the GPU, else torch's; ``torch_index`` is ``None`` when torch cannot drive it (its steps become
    ``error`` rows)."""

    index: int
    uuid: str | None
    model: str
    torch_index: int | None = None


class RowWriter:
    """Print results rows, one JSON object a line, in the contract's column order; thread-safe."""

    def __init__(
        self,
        run_id: str,
        node: str,
        model: str,
        devices: Mapping[int, Device],
        *,
        out: TextIO,
        err: TextIO | None = None,
    ) -> None:
        self.run_id = run_id
        self.node = node
        self.model = model
        self.devices = dict(devices)
        self._out = out
        self.err = err
        self._lock = threading.Lock()
        self._closed = False
        self.count = 0
        self.errors = 0

    def say(self, message: str) -> None:
        say(message, err=self.err)

    def gpu(self, metric: str, gpu: int, value: float, repeat: int = 0) -> bool:
        """A gpu-level row; returns False (and writes an ``error`` row) for a value that is no measurement."""
        return self._measured(metric, gpu, value, repeat)

    def node_row(self, metric: str, value: float, repeat: int = 0) -> bool:
        """A node-level row (``gpu`` empty)."""
        return self._measured(metric, None, value, repeat)

    def pair_row(self, metric: str, peer: str, value: float, repeat: int = 0) -> bool:
        """A pair-level row: ``gpu`` empty, ``peer`` the other node of the pair."""
        if not peer:
            raise ValueError(f"{metric} is a pair-level metric: the peer node is needed")
        return self._measured(metric, None, value, repeat, peer)

    def error(self, step: str, reason: str, gpu: int | None = None) -> None:
        """An ``error`` row (value 1) at the GPU's level, or the node's when ``gpu`` is None; reason on stderr."""
        where = "node" if gpu is None else f"GPU {gpu}"
        self.say(f"error: {step} on {where}: {_one_line(reason)}")
        self.errors += 1
        self._emit("error", gpu, 1.0, 0)

    def close(self) -> None:
        """No row is written after this (a watchdog that aborts the run closes the writer first)."""
        with self._lock:
            self._closed = True
            self._out.flush()

    def _measured(self, metric: str, gpu: int | None, value: float, repeat: int, peer: str | None = None) -> bool:
        spec = METRICS[metric]  # an unknown metric is a bug of the payload: let it raise
        if spec.level == "gpu" and gpu is None:
            raise ValueError(f"{metric} is a gpu-level metric: a GPU index is needed")
        if spec.level != "gpu" and gpu is not None:
            raise ValueError(f"{metric} is a {spec.level}-level metric: no GPU index")
        if (spec.level == "pair") != (peer is not None):
            raise ValueError(f"{metric} is a {spec.level}-level metric: a peer is for pair metrics only")
        number = float(value)
        if not math.isfinite(number) or number < 0:
            # The error row is the node's (an error row names no peer); the message names the pair.
            self.error(metric, f"measured {value!r}, which is no valid {metric}", gpu)
            return False
        self._emit(metric, gpu, number, repeat, peer)
        return True

    def _emit(self, metric: str, gpu: int | None, value: float, repeat: int, peer: str | None = None) -> None:
        uuid = None if gpu is None else self.devices[gpu].uuid
        ts = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # ISO 8601 in UTC, to the microsecond
        values = (self.run_id, self.node, gpu, uuid, self.model, metric, value, repeat, peer, ts)
        line = json.dumps(dict(zip(RESULT_COLUMNS, values, strict=True)))
        with self._lock:
            if self._closed:
                return
            self._out.write(line + "\n")
            self._out.flush()
            self.count += 1


def _one_line(text: str) -> str:
    return " ".join(str(text).split()) or "(no message)"
