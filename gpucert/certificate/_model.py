"""The certificate as data: :class:`Certificate` (the signed body, plain JSON) and its :class:`Signature`.

The file is one JSON object: the body's keys and, when signed, a ``signature`` key beside them, over the
canonical bytes of everything else (:mod:`._canonical`; the schema says how they are made), so a reader
checks it after parsing, whatever whitespace the file was written with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Final

from ..errors import InputError
from ._canonical import LEGACY_SCHEMA, canonical_for, sha256_hex

__all__ = ["SCHEMA", "SCHEMAS", "Certificate", "Signature", "read_certificate"]

#: The schema id a new certificate's body carries: its canonical bytes are RFC 8785.
SCHEMA: Final = "gpucert.certificate/2"
#: The schemas a reader accepts (the legacy one only to verify what was issued under it); it refuses any other.
SCHEMAS: Final = (SCHEMA, LEGACY_SCHEMA)
ALGORITHM: Final = "Ed25519"


@dataclass(frozen=True)
class Signature:
    """An Ed25519 signature over the body's canonical bytes, with the public key that made it."""

    #: Always ``Ed25519``.
    algorithm: str
    #: The raw 32-byte public key, base64.
    public_key: str
    #: SHA-256 of the raw public key, hex: the key's fingerprint.
    key_sha256: str
    #: The 64-byte signature, base64.
    value: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Certificate:
    """An acceptance certificate: ``body`` (schema, cluster, runs, nodes, decisions, figures, file hashes —
    plain JSON data; see the package docstring) and, when signed, its ``signature``."""

    body: Mapping[str, Any]
    signature: Signature | None = None

    @property
    def schema(self) -> str:
        return str(self.body.get("schema"))

    def canonical(self) -> bytes:
        """The bytes the signature covers: the body as canonical JSON (RFC 8785; see the module docstring)."""
        return canonical_for(self.schema)(dict(self.body))

    @property
    def sha256(self) -> str:
        """SHA-256 of the body's canonical bytes: the certificate's identity, signed or not."""
        return sha256_hex(self.canonical())

    @property
    def runs(self) -> list[Mapping[str, Any]]:
        runs: list[Mapping[str, Any]] = list(self.body.get("runs") or [])
        return runs

    @property
    def run_ids(self) -> list[str]:
        return [str(r["run_id"]) for r in self.runs]

    def to_dict(self) -> dict[str, Any]:
        """The file's object: the body, plus ``signature`` when signed."""
        out = dict(self.body)
        if self.signature is not None:
            out["signature"] = self.signature.to_dict()
        return out

    def to_json(self) -> str:
        """The certificate file's text (indented for people; the signature is over canonical bytes)."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, data: Any, source: str) -> Certificate:
        """A certificate from a parsed file; raises :class:`InputError` naming ``source`` for anything that
        is not a certificate of this schema (a malformed signature included)."""
        if not isinstance(data, dict):
            raise InputError(f"{source}: not a gpucert certificate (the JSON is not an object)")
        body = {k: v for k, v in data.items() if k != "signature"}
        if body.get("schema") not in SCHEMAS:
            raise InputError(
                f"{source}: not a gpucert certificate of schema {' or '.join(SCHEMAS)} (schema {body.get('schema')!r})"
            )
        if not isinstance(body.get("runs"), list) or not all(
            isinstance(r, dict)
            and isinstance(r.get("run_id"), str)
            and isinstance(r.get("date"), str)
            and isinstance(r.get("files"), list)
            for r in body["runs"]
        ):
            raise InputError(f"{source}: 'runs' must be a list of runs, each with run_id, date and files")
        raw = data.get("signature")
        if raw is None:
            return cls(body)
        names = [f.name for f in fields(Signature)]
        if not isinstance(raw, dict) or not all(isinstance(raw.get(f), str) for f in names):
            raise InputError(f"{source}: 'signature' must be an object with {', '.join(names)} (strings)")
        if raw["algorithm"] != ALGORITHM:
            raise InputError(f"{source}: signature algorithm {raw['algorithm']!r}: only {ALGORITHM} is known")
        return cls(body, Signature(**{f: raw[f] for f in names}))


def read_certificate(path: str | Path) -> Certificate:
    """The certificate in the JSON file ``path``; raises :class:`InputError` naming the file when it cannot
    be read, is not UTF-8 JSON, or is not a certificate."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read the certificate ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a certificate (not UTF-8 text)") from None
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:  # json.JSONDecodeError is one
        raise InputError(f"{path}: not a certificate (not JSON: {exc})") from None
    return Certificate.from_dict(data, str(path))


def _no_constant(name: str) -> Any:
    # NaN and Infinity are not JSON, and a certificate's canonical bytes cannot hold them.
    raise ValueError(f"{name} is not a JSON value")
