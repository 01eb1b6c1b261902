"""The exact bytes a certificate is hashed and signed over, and the plain values it is made of.

Canonical JSON is RFC 8785 (the ``rfc8785`` package): any language's JCS library reproduces these bytes from the
certificate file, so a verifier needs neither Python nor gpucert, and a file pretty-printed in between still
verifies. Certificates of schema ``gpucert.certificate/1`` were signed over Python's own canonical JSON (a float
as its ``repr``, as the audit trail's first entries were hashed): :func:`canonical_for` still gives those bytes
for them, so they keep verifying.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import numpy as np
import pandas as pd
import rfc8785

from ..audit import canonical_json

__all__ = ["LEGACY_SCHEMA", "canonical_bytes", "canonical_for", "plain", "sha256_hex"]

#: The certificate schema whose bytes were Python's canonical JSON, not RFC 8785.
LEGACY_SCHEMA: Final = "gpucert.certificate/1"


def sha256_hex(data: bytes) -> str:
    """The SHA-256 of ``data``, as 64 lowercase hex digits."""
    return hashlib.sha256(data).hexdigest()


def canonical_bytes(value: Any) -> bytes:
    """``value`` (plain JSON data) as RFC 8785 canonical JSON bytes; raises ``ValueError`` for NaN,
    infinity, an integer beyond 2**53 - 1 or anything that is not plain JSON data."""
    return rfc8785.dumps(value)


def canonical_for(schema: object) -> Callable[[Any], bytes]:
    """How a certificate of ``schema`` makes its canonical bytes: RFC 8785, except for the legacy schema."""
    return canonical_json if schema == LEGACY_SCHEMA else canonical_bytes


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
