"""Work on a thread of its own, its result (or exception) handed back to whoever waits for it: the commands
that read a fleet's tables overlap what does not depend on each other, and Parquet decoding, numpy and
pandas leave the interpreter to the other thread most of the time."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["in_background", "on_two_threads"]

_T = TypeVar("_T")


def in_background(work: Callable[[], _T], name: str = "gpucert-background") -> Callable[[], _T]:
    """Start ``work`` on a thread; the function returned waits for it and returns its result or raises its
    exception. A daemon thread: a command that fails meanwhile exits without waiting for it."""
    outcome: list[_T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:  # handed to the caller, who raises it
            failure.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()

    def wait() -> _T:
        thread.join()
        if failure:
            raise failure[0]
        return outcome[0]

    return wait


def on_two_threads(work: Callable[[_T], None], items: Sequence[_T]) -> None:
    """Call ``work`` on every item, every other one on a second thread: for numpy work on independent
    blocks of arrays, each call writing its own part of the output."""

    def every_other() -> None:
        for item in items[1::2]:
            work(item)

    other = in_background(every_other, name="gpucert-blocks")
    for item in items[::2]:
        work(item)
    other()
