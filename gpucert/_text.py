"""Words for numbers in what gpucert prints: one place, so every report, log and summary agrees."""

from __future__ import annotations

__all__ = ["counted"]


def counted(n: int, word: str, plural: str | None = None) -> str:
    """``1 node``, ``2 nodes``, ``1,200 GPUs``: a count (thousands separated) and its noun, singular or
    plural; ``plural`` for a noun that does not take an ``s`` (``counted(3, "entry", "entries")``)."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {plural or word + 's'}"
