"""The hash chain of the audit trail: how an entry is hashed, and how a stored trail is checked.

An entry's ``hash`` is the SHA-256 of its canonical JSON without the ``hash`` field, its ``prev`` the hash of the
entry before it (:data:`GENESIS` for the first), ``seq`` its number from 1. The canonical JSON is RFC 8785 for an
entry that says ``"canon": "rfc8785"`` (every entry written now); one without is hashed as it was written, over
Python's JSON. :func:`check_chain` walks the chain back from the head, then checks that the segments, read in
order line by line, hold exactly that chain, naming an entry changed, removed, swapped or moved; segments holding
no entry of the chain are *orphans* (a writer that lost the race for the head, or died before moving it),
reported without failing. A trail rewritten wholesale, hashes recomputed, is caught only against the head's hash
anchored outside the store (each run's Prefect artifact records it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import rfc8785

from .._text import counted

__all__ = ["GENESIS", "ChainCheck", "Segment", "canonical_json", "check_chain", "entry_hash", "seal"]

#: The ``prev`` of the first entry.
GENESIS = "0" * 64
#: The ``canon`` of an entry hashed over RFC 8785 canonical JSON.
RFC8785 = "rfc8785"


def canonical_json(value: Any) -> bytes:
    """``value`` as Python's canonical JSON bytes (sorted keys, no spaces, UTF-8, a float as its ``repr``; NaN
    and infinities refused): what entries and certificates were hashed over before RFC 8785."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def entry_hash(entry: Mapping[str, Any]) -> str:
    """The SHA-256 (hex) of ``entry``'s canonical JSON without its ``hash`` field: RFC 8785 when the entry
    says so (``canon``), else the legacy bytes. Raises ``ValueError`` for what RFC 8785 cannot write (an
    integer beyond 2**53 - 1, NaN)."""
    body = {k: v for k, v in entry.items() if k != "hash"}
    data = rfc8785.dumps(body) if entry.get("canon") == RFC8785 else canonical_json(body)
    return hashlib.sha256(data).hexdigest()


def seal(bodies: Sequence[Mapping[str, Any]], *, prev: str, first_seq: int) -> list[dict[str, Any]]:
    """``bodies`` as chained entries: numbered from ``first_seq``, each with ``prev`` and ``hash``."""
    out: list[dict[str, Any]] = []
    for i, body in enumerate(bodies):
        entry = {**body, "seq": first_seq + i, "prev": prev, "canon": RFC8785}
        entry["hash"] = prev = entry_hash(entry)
        out.append(entry)
    return out


@dataclass(frozen=True)
class Segment:
    """One stored segment: its key and its text (JSON lines)."""

    key: str
    text: str


@dataclass(frozen=True)
class ChainCheck:
    """What :func:`check_chain` found: the chain's entries oldest first, and the first problem."""

    entries: tuple[dict[str, Any], ...]
    #: None when the trail is intact; else one sentence naming the entry and what happened to it.
    problem: str | None = None
    #: Segment keys that hold no entry of the chain (interrupted or losing writes).
    orphans: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.problem is None


def _segment_order(segment: Segment) -> tuple[int, str]:
    """Segments sort by the number of their first entry (``…/000000000042-<token>.jsonl``), not by key:
    a writer whose clock is behind may file a later segment under an earlier date."""
    name = segment.key.rsplit("/", 1)[-1]
    digits = name.split("-", 1)[0]
    return (int(digits) if digits.isdigit() else -1, segment.key)


def _hash_or_none(entry: Mapping[str, Any]) -> str | None:
    try:
        return entry_hash(entry)
    except ValueError:  # content RFC 8785 cannot write was never hashed by us: it was changed
        return None


def _where(key: str, line: int) -> str:
    return f"{key} line {line}"


def check_chain(segments: Sequence[Segment], head: Mapping[str, Any] | None) -> ChainCheck:
    """Check stored ``segments`` (any order) against ``head`` (``{"seq", "hash", "segment"}``; None when
    there is none). Returns the chain and the first problem, named by entry number and place."""
    if head is None:
        if segments:
            return ChainCheck((), f"the head is missing, yet {len(segments)} segment(s) are stored")
        return ChainCheck(())
    ordered = sorted(segments, key=_segment_order)
    by_hash: dict[str, tuple[dict[str, Any], str, int]] = {}
    parsed: list[tuple[Segment, list[dict[str, Any]]]] = []
    for segment in ordered:
        rows: list[dict[str, Any]] = []
        for line, text in enumerate(segment.text.splitlines(), start=1):
            if not text.strip():
                continue
            try:
                entry = json.loads(text)
            except ValueError:
                return ChainCheck((), f"{_where(segment.key, line)} is not a JSON entry: it was changed")
            if not isinstance(entry, dict) or not isinstance(entry.get("hash"), str):
                return ChainCheck((), f"{_where(segment.key, line)} is not an audit entry: it was changed")
            if _hash_or_none(entry) != entry["hash"]:
                seq = entry.get("seq", "?")
                return ChainCheck(
                    (), f"entry #{seq} ({_where(segment.key, line)}) was changed: its content no longer has its hash"
                )
            by_hash.setdefault(entry["hash"], (entry, segment.key, line))
            rows.append(entry)
        parsed.append((segment, rows))

    # Back from the head to the first entry.
    chain: list[dict[str, Any]] = []
    want, want_seq = str(head.get("hash")), head.get("seq")
    while want != GENESIS:
        found = by_hash.get(want)
        if found is None:
            after = f" (the one before #{chain[-1]['seq']})" if chain else " (the last one, named by the head)"
            return ChainCheck((), f"entry #{want_seq}{after} is missing: it was removed")
        entry = found[0]
        if entry.get("seq") != want_seq:
            return ChainCheck(
                (),
                f"entry #{entry.get('seq')} ({_where(found[1], found[2])}) stands where "
                f"#{want_seq} belongs: entries were reordered",
            )
        chain.append(entry)
        want = str(entry.get("prev"))
        want_seq = int(entry["seq"]) - 1
    chain.reverse()
    if chain and chain[0].get("seq") != 1:
        return ChainCheck((), f"entry #{chain[0]['seq']} claims to be the first: entries before it were removed")

    # The stored order must be the chain's: segments in key order, lines in order.
    on_chain = {e["hash"] for e in chain}
    stored: list[tuple[dict[str, Any], str, int]] = []
    orphans: list[str] = []
    for segment, rows in parsed:
        mine = [r for r in rows if r["hash"] in on_chain]
        if not mine:
            orphans.append(segment.key)
            continue
        if len(mine) != len(rows):
            stray = next(r for r in rows if r["hash"] not in on_chain)
            return ChainCheck(
                (), f"entry #{stray.get('seq')} in {segment.key} is not part of the trail: it was inserted"
            )
        stored += [(r, segment.key, i) for i, r in enumerate(rows, start=1)]
    for position, (expected, (got, key, line)) in enumerate(zip(chain, stored, strict=False)):
        if got["hash"] != expected["hash"]:
            return ChainCheck(
                (),
                f"entry #{got.get('seq')} ({_where(key, line)}) is out of order: entry "
                f"#{position + 1} belongs there; entries were swapped or moved",
            )
    if len(stored) != len(chain):
        extra = abs(len(stored) - len(chain))
        return ChainCheck(
            (), f"{counted(extra, 'entry', 'entries')} {'is' if extra == 1 else 'are'} stored twice or out of place"
        )
    return ChainCheck(tuple(chain), None, tuple(orphans))
