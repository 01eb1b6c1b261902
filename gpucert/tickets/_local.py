"""``LocalTickets``: tickets in one SQLite file, the embedded default (``tickets.sqlite`` in the store).

Safe for concurrent processes on one machine: every change is one ``BEGIN IMMEDIATE`` transaction (the
fingerprint's row is read, changed and written while no other writer can start), and the fingerprint is
a UNIQUE column, so two writers can never give one fault two tickets. The file is in WAL mode, so readers
(``gpucert tickets list``) never wait for a writer. SQLite's locking needs a local file system: not NFS.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

from ._model import Change, Fingerprint, State, Ticket, TicketError, TicketEvent, TicketNotFound

__all__ = ["LocalTickets"]

#: The schema this code writes; a newer file is refused rather than misread.
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tickets (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    fingerprint TEXT NOT NULL UNIQUE,
    node TEXT NOT NULL,
    gpu_uuid TEXT NOT NULL,
    cause TEXT NOT NULL,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    created TEXT NOT NULL,
    updated TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tickets_node ON tickets (node);
CREATE INDEX IF NOT EXISTS tickets_state ON tickets (state);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ticket_id INTEGER NOT NULL REFERENCES tickets (id),
    at TEXT NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL
);
"""


class LocalTickets:
    """Tickets in a SQLite file at ``path`` (created, with its folder, on first use).

    ``on_event`` is called with each stored event inside its transaction, before the commit: if it raises,
    the change is rolled back (the webhook backend announces this way, so a ticket is never stored as
    announced when the announcement failed). ``timeout_s`` bounds the wait for another writer's lock.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        on_event: Callable[[TicketEvent], None] | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.path = Path(path).expanduser()
        self._on_event = on_event
        self._timeout_s = timeout_s
        self._ready = False
        self._init_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LocalTickets({str(self.path)!r})"

    # --- the TicketBackend protocol ---------------------------------------------------------------------

    def change(self, fingerprint: Fingerprint, change: Change) -> TicketEvent | None:
        """See :meth:`TicketBackend.change`; the read, the change and the write are one transaction."""
        with self._write() as db:
            row = db.execute("SELECT id, record FROM tickets WHERE fingerprint = ?", (fingerprint.key,)).fetchone()
            current = _ticket(row[0], row[1]) if row is not None else None
            others = [
                _ticket(i, r)
                for i, r in db.execute(
                    "SELECT id, record FROM tickets WHERE node = ? AND fingerprint != ? ORDER BY id",
                    (fingerprint.node, fingerprint.key),
                )
            ]
            event = change(current, others)
            if event is None:
                return None
            ticket = event.ticket
            if ticket.fingerprint != fingerprint:
                raise TicketError(f"a change to {fingerprint} returned a ticket for {ticket.fingerprint}")
            if row is None:
                cursor = db.execute(
                    "INSERT INTO tickets (fingerprint, node, gpu_uuid, cause, kind, state, created, updated,"
                    " record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, '{}')",
                    (
                        fingerprint.key,
                        ticket.node,
                        ticket.gpu_uuid,
                        ticket.cause,
                        ticket.kind,
                        ticket.state,
                        ticket.created.isoformat(),
                        ticket.updated.isoformat(),
                    ),
                )
                row_id = int(cursor.lastrowid or 0)
            else:
                row_id = int(row[0])
            ticket = ticket.model_copy(update={"id": str(row_id)})
            db.execute(
                "UPDATE tickets SET kind = ?, state = ?, updated = ?, record = ? WHERE id = ?",
                (ticket.kind, ticket.state, ticket.updated.isoformat(), _record(ticket), row_id),
            )
            db.execute(
                "INSERT INTO events (ticket_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                (row_id, event.at.isoformat(), event.kind, event.detail),
            )
            event = replace(event, ticket=ticket)
            if self._on_event is not None:
                self._on_event(event)
            return event

    def get(self, ticket_id: str) -> Ticket:
        """See :meth:`TicketBackend.get`."""
        if not str(ticket_id).isdigit():
            raise TicketNotFound(f"no ticket {ticket_id!r} in {self.path} (local ticket ids are numbers)")
        with self._read() as db:
            row = db.execute("SELECT id, record FROM tickets WHERE id = ?", (int(ticket_id),)).fetchone()
        if row is None:
            raise TicketNotFound(f"no ticket {ticket_id!r} in {self.path}")
        return _ticket(row[0], row[1])

    def tickets(self, *, state: State | None = None, nodes: Iterable[str] | None = None) -> list[Ticket]:
        """See :meth:`TicketBackend.tickets`."""
        where: list[str] = []
        args: list[str] = []
        if state is not None:
            where.append("state = ?")
            args.append(state)
        if nodes is not None:
            # One parameter however many nodes: SQLite caps the number of bound variables.
            where.append("node IN (SELECT value FROM json_each(?))")
            args.append(json.dumps(sorted(set(nodes))))
        sql = "SELECT id, record FROM tickets" + (f" WHERE {' AND '.join(where)}" if where else "")
        with self._read() as db:
            return [_ticket(i, r) for i, r in db.execute(sql + " ORDER BY id", args)]

    def events(self, ticket_id: str) -> list[tuple[str, str, str]]:
        """The ticket's history, oldest first: (time, event kind, detail)."""
        with self._read() as db:
            return [
                (str(a), str(k), str(d))
                for a, k, d in db.execute(
                    "SELECT at, kind, detail FROM events WHERE ticket_id = ? ORDER BY id", (int(ticket_id),)
                )
            ]

    # --- the file ---------------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit mode: transactions are begun explicitly, IMMEDIATE for writers.
            db = sqlite3.connect(self.path, timeout=self._timeout_s, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise TicketError(f"cannot open the ticket file {self.path}: {exc}") from exc
        try:
            db.execute(f"PRAGMA busy_timeout = {int(self._timeout_s * 1000)}")
            if not self._ready:
                self._initialise(db)
        except sqlite3.Error as exc:
            db.close()
            raise TicketError(f"cannot open the ticket file {self.path}: {exc}") from exc
        except BaseException:
            db.close()
            raise
        return db

    def _initialise(self, db: sqlite3.Connection) -> None:
        with self._init_lock:
            if self._ready:
                return
            mode = self._switch_to_wal(db)
            if mode is None or str(mode[0]).lower() != "wal":
                raise TicketError(f"the ticket file {self.path} cannot use WAL mode (is it on NFS?)")
            # Statement by statement inside one IMMEDIATE transaction (executescript would commit first), so
            # two processes creating the file at once cannot interleave.
            db.execute("BEGIN IMMEDIATE")
            try:
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    db.execute(statement)
                db.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
                found = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            if int(found[0]) > SCHEMA_VERSION:
                raise TicketError(
                    f"the ticket file {self.path} has schema {found[0]}, newer than this gpucert's "
                    f"{SCHEMA_VERSION}: upgrade gpucert"
                )
            self._ready = True

    def _switch_to_wal(self, db: sqlite3.Connection) -> Any:
        """``PRAGMA journal_mode = WAL``, waited for like any lock. While another process creates the file,
        SQLite answers "database is locked" at once (the busy timeout does not cover a journal-mode change),
        so processes opening a new file together would fail: retried up to the file's timeout."""
        for attempt in Retrying(
            retry=retry_if_exception(_locked),
            stop=stop_after_delay(self._timeout_s),
            wait=wait_random_exponential(multiplier=0.01, max=0.2),
            reraise=True,
        ):
            with attempt:
                return db.execute("PRAGMA journal_mode = WAL").fetchone()
        raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        db = self._connect()
        try:
            yield db
        except sqlite3.Error as exc:
            raise TicketError(f"the ticket file {self.path}: {exc}") from exc
        finally:
            db.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise TicketError(f"the ticket file {self.path}: {exc}") from exc
        finally:
            db.close()


def _record(ticket: Ticket) -> str:
    # The id is the row's; keeping it out of the record means a copied record never claims another row.
    return ticket.model_dump_json(exclude={"id"})


def _ticket(row_id: object, record: object) -> Ticket:
    ticket = Ticket.model_validate_json(str(record))
    return ticket.model_copy(update={"id": str(row_id)})


def _locked(error: BaseException) -> bool:
    return isinstance(error, sqlite3.OperationalError) and "locked" in str(error)
