"""The audit trail in the store (docs/reference/store-layout.md): append-only segments of JSON lines
(``audit/date=<day>/<first seq>-<token>.jsonl``) and a head (``audit/HEAD``) moved by compare-and-swap.

An append writes its entries as a new segment (create-only, its name holding a random token, so two writers
never write the same object), then moves the head with the store's conditional write. Of two writers that read
the same head only one moves it; the other deletes its segment and appends again on the new head, so the trail
never forks. A writer that dies between the two writes leaves an orphan segment, reported and ignored.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..errors import StoreConflict, StoreError
from ..store import ObjectStore
from ._chain import GENESIS, ChainCheck, Segment, canonical_json, check_chain, seal

__all__ = ["AUDIT_PREFIX", "HEAD_KEY", "AuditAction", "AuditLog", "node_of"]

AUDIT_PREFIX = "audit/"
HEAD_KEY = "audit/HEAD"
_SEGMENTS = "audit/date="
_ATTEMPTS = 30


@dataclass(frozen=True)
class AuditAction:
    """One change, as the code that made it describes it (the log adds who, when and the chain)."""

    #: What was done: ``taint.add``, ``taint.lift``, ``label``, ``annotate``, ``condition``, ``cordon``,
    #: ``job.create``, ``job.delete``, ``apply``, ``ticket.open``, ``ticket.update``, ``ticket.escalate``,
    #: ``ticket.resolve``, ``baseline.write``, ``baseline.move``, ``baseline.rollback``, …
    action: str
    kind: str
    name: str
    namespace: str | None = None
    api_version: str = "v1"
    before: Any = None
    after: Any = None
    #: Why: the decision or the command behind it.
    why: str = ""
    #: The run it belongs to, when not the recorder's own (a re-run's Job, say).
    run_id: str | None = None
    #: When the change happened (None: when it is appended, for a caller that does not know better).
    at: datetime | None = None
    #: The step of the run that made it (``certify r1: benchmark``); empty when not told.
    step: str = ""

    def body(self, *, run_id: str | None, trigger: str, actor: str, ts: datetime) -> dict[str, Any]:
        """The entry before it is chained; ``ts`` stamps it unless the action knows when it happened."""
        when = self.at or ts
        entry = {
            "ts": _stamp(when),
            "action": self.action,
            "object": {
                "apiVersion": self.api_version,
                "kind": self.kind,
                "name": self.name,
                "namespace": self.namespace,
            },
            "before": self.before,
            "after": self.after,
            "why": self.why,
            "run_id": self.run_id or run_id,
            "trigger": trigger,
            "actor": actor,
        }
        if self.step:  # absent rather than empty: entries written before steps were recorded hash as they did
            entry["step"] = self.step
        return entry


class AuditLog:
    """The trail of one store (``store.objects`` of a :class:`~gpucert.store.BaselineStore`)."""

    def __init__(self, objects: ObjectStore) -> None:
        self.objects = objects

    # --- writing ----------------------------------------------------------------------------------

    def append(
        self,
        actions: Sequence[AuditAction],
        *,
        run_id: str | None,
        trigger: str,
        actor: str,
        now: datetime | None = None,
    ) -> list[dict[str, Any]]:
        """Append ``actions`` as one segment; returns the entries as stored (empty for no actions). Raises
        :class:`~gpucert.errors.StoreError` when the store fails, or the head kept moving under us for many attempts."""
        if not actions:
            return []
        ts = now or datetime.now(UTC)
        bodies = [a.body(run_id=run_id, trigger=trigger, actor=actor, ts=ts) for a in actions]
        for _ in range(_ATTEMPTS):
            head_blob = self.objects.get(HEAD_KEY)
            try:
                head = _parse_head(head_blob.data) if head_blob is not None else None
            except ValueError as exc:
                raise StoreError(f"{HEAD_KEY} is not the audit trail's head ({exc}): appending stopped") from None
            last_seq, last_hash = (int(head["seq"]), str(head["hash"])) if head else (0, GENESIS)
            entries = seal(bodies, prev=last_hash, first_seq=last_seq + 1)
            key = f"{_SEGMENTS}{ts:%Y-%m-%d}/{last_seq + 1:012d}-{secrets.token_hex(4)}.jsonl"
            data = b"".join(canonical_json(e) + b"\n" for e in entries)
            self.objects.put_if(key, data, if_match=None)
            new_head = {"seq": entries[-1]["seq"], "hash": entries[-1]["hash"], "segment": key}
            try:
                self.objects.put_if(
                    HEAD_KEY, canonical_json(new_head), if_match=head_blob.etag if head_blob is not None else None
                )
            except StoreConflict:
                self._discard(key)
                continue
            return entries
        raise StoreError(f"the audit trail's head kept moving: {_ATTEMPTS} appends lost the race")

    def _discard(self, key: str) -> None:
        with contextlib.suppress(StoreError):  # else an orphan, which the check reports and ignores
            self.objects.delete(key)

    # --- reading ----------------------------------------------------------------------------------

    def head(self) -> dict[str, Any] | None:
        """The head (``seq``, ``hash``, ``segment``), or None before the first append."""
        blob = self.objects.get(HEAD_KEY)
        return _parse_head(blob.data) if blob is not None else None

    def segments(self, *, workers: int = 8) -> list[Segment]:
        """Every stored segment (read in parallel: S3 answers one object per request)."""
        keys = [k for k in self.objects.list(_SEGMENTS) if k.endswith(".jsonl")]

        def read(key: str) -> Segment | None:
            blob = self.objects.get(key)
            return None if blob is None else Segment(key, blob.data.decode("utf-8", "replace"))

        with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="gpucert-audit") as pool:
            return [s for s in pool.map(read, keys) if s is not None]

    def check(self) -> ChainCheck:
        """Walk the chain (see :func:`~._chain.check_chain`)."""
        try:
            head = self.head()
        except ValueError as exc:
            return ChainCheck((), f"{HEAD_KEY} was changed: {exc}")
        return check_chain(self.segments(), head)

    def history(self, *, node: str | None = None, since: datetime | None = None) -> list[dict[str, Any]]:
        """The chain's entries, oldest first, about ``node`` (any object of that name, and tickets and
        Jobs recorded for it) and at or after ``since``. Raises :class:`~gpucert.errors.StoreError` when
        the trail does not check out (a broken trail is not shown as if it were whole)."""
        checked = self.check()
        if not checked.ok:
            raise StoreError(f"the audit trail does not check out: {checked.problem}")
        floor = _stamp(since) if since else ""  # the entries' own stamps, which sort as their times do
        about = [e for e in checked.entries if node is None or node_of(e) == node]
        return [dict(e) for e in about if str(e.get("ts", "")) >= floor]


def node_of(entry: Mapping[str, Any]) -> str | None:
    """The node an entry is about: its object when that is a Node, else the ``node`` its after or before
    side names (a Job's, a ticket's); None for a baseline or a cluster-wide object."""
    obj = entry.get("object") or {}
    if obj.get("kind") == "Node":
        return str(obj.get("name"))
    for side in (entry.get("after"), entry.get("before")):
        if isinstance(side, Mapping) and isinstance(side.get("node"), str):
            return str(side["node"])
    return None


def _stamp(when: datetime) -> str:
    """An entry's time: RFC 3339 UTC to the microsecond (``2026-12-03T14:00:00.000000Z``)."""
    return when.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _parse_head(data: bytes) -> dict[str, Any]:
    try:
        head = json.loads(data)
    except ValueError as exc:
        raise ValueError("it is not JSON") from exc
    if not isinstance(head, dict) or not isinstance(head.get("seq"), int) or not isinstance(head.get("hash"), str):
        raise ValueError("it does not name a last entry (seq, hash)")
    return head
