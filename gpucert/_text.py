"""Words for numbers in what gpucert prints: one place, so every report, log and summary agrees."""

from __future__ import annotations

__all__ = ["counted"]


def counted(n: int, word: str) -> str:
    """``1 node``, ``2 nodes``, ``1,200 GPUs``: a count (thousands separated) and its noun, singular or
    plural."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"
