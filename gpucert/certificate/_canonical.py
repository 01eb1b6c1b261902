"""The exact bytes a certificate is hashed and signed over, and the plain values it is made of.

Canonical JSON: keys sorted, no whitespace (``","`` and ``":"``), UTF-8 (no ``\\u`` escapes of non-ASCII),
no NaN or infinity. Numbers are Python's: an ``int`` is written as digits, a ``float`` as its ``repr`` —
the shortest text that reads back to the same double — so parsing a certificate and writing it again
gives the same bytes, and the signature holds over a file that was pretty-printed in between.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["canonical_bytes", "plain", "sha256_hex"]


def sha256_hex(data: bytes) -> str:
    """The SHA-256 of ``data``, as 64 lowercase hex digits."""
    return hashlib.sha256(data).hexdigest()


def canonical_bytes(value: Any) -> bytes:
    """``value`` (plain JSON data) as canonical JSON bytes (see the module docstring); raises ``ValueError``
    for NaN or infinity and ``TypeError`` for anything that is not plain JSON data."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def plain(value: Any) -> Any:
    """``value`` as plain JSON data: numpy and pandas scalars to ``int``/``float``/``bool``/``str``, a
    missing value (None, NaN, ``pd.NA``, ``NaT``) to None, a timestamp to RFC 3339 UTC text, mappings and
    sequences element by element."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, str):
        return value
    if isinstance(value, pd.Timestamp | dt.datetime):
        stamp = pd.Timestamp(value)
        stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
        return stamp.isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    raise TypeError(f"{type(value).__name__} is not plain certificate data")
