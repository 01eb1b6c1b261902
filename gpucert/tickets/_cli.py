"""What ``gpucert tickets …`` needs: a local backend from a path or URI, and the ticket table as text."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ._local import LocalTickets
from ._model import State, Ticket, TicketBackend, TicketConfigError

__all__ = ["DEFAULT_TICKETS", "TICKETS_FILE", "format_tickets", "local_path", "open_backend", "tickets_list"]

#: The ticket file's name inside a store root.
TICKETS_FILE = "tickets.sqlite"
#: Where tickets live when nothing is said: next to the default store's files.
DEFAULT_TICKETS = f"gpucert-store/{TICKETS_FILE}"
_FILE_SUFFIXES = frozenset({".sqlite", ".sqlite3", ".db"})


def local_path(spec: str | os.PathLike[str]) -> Path:
    """The SQLite file a local ticket spec names: ``sqlite:///abs/path.sqlite``, ``file:///abs/path`` (as in a
    ``file://`` store URI) or a plain path; one ending in ``.sqlite``, ``.sqlite3`` or ``.db`` is the file,
    any other a store root holding ``tickets.sqlite``. Raises :class:`TicketConfigError` for an ``s3://``
    store (SQLite needs a local file), any other scheme or an empty spec."""
    return _resolve(spec)[0]


def _resolve(spec: str | os.PathLike[str]) -> tuple[Path, bool]:
    """The ticket file a spec names, and whether the spec named a store root (a folder) rather than it."""
    text = os.fspath(spec).strip()
    if not text:
        raise TicketConfigError(f"the ticket location is empty; give a path such as {DEFAULT_TICKETS}")
    parts = urlsplit(text)
    scheme = parts.scheme.lower() if "://" in text else ""
    if scheme in ("sqlite", "file"):
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise TicketConfigError(
                f"cannot open tickets at {text!r}: a {scheme}:// URI names an absolute path, "
                f"as in {scheme}:///srv/gpucert/{TICKETS_FILE} (three slashes)"
            )
        path = Path(unquote(parts.path))
    elif scheme == "s3":
        raise TicketConfigError(
            f"cannot keep tickets in {text!r}: the local ticket file is SQLite and needs a local path; "
            "give one (e.g. /srv/gpucert/tickets.sqlite) or use the Jira backend"
        )
    elif scheme:
        raise TicketConfigError(
            f"cannot open tickets at {text!r}: unknown scheme {scheme!r}; give a path, sqlite:///path or "
            "file:///store-root (Jira and webhooks are configured in the Ticketing block)"
        )
    else:
        path = Path(text).expanduser()
    if path.suffix.lower() in _FILE_SUFFIXES:
        return path, False
    return path / TICKETS_FILE, True


def open_backend(spec: str | os.PathLike[str] = DEFAULT_TICKETS) -> LocalTickets:
    """The local ticket backend at ``spec`` (see :func:`local_path`); raises :class:`TicketConfigError`."""
    return LocalTickets(local_path(spec))


def format_tickets(tickets: list[Ticket], *, state: State | None = None) -> str:
    """The tickets as an aligned text table, one line each (``no tickets`` when there are none)."""
    if not tickets:
        return f"no {state} tickets" if state else "no tickets"
    header = ("ID", "STATE", "KIND", "NODE", "GPU", "CAUSE", "ACTION", "SEEN", "FIXES", "UPDATED", "ESCALATION")
    rows = [
        (
            t.id,
            t.state,
            t.kind,
            t.node,
            ("-" if not t.gpu_uuid else str(t.gpu) if t.gpu is not None else t.gpu_uuid),
            t.cause,
            t.action or "-",
            str(t.occurrences),
            str(len(t.remediations)),
            f"{t.updated:%Y-%m-%d %H:%M}",
            t.escalation or "-",
        )
        for t in tickets
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header) - 1)]
    lines = [
        "  ".join([*(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)), r[-1]]).rstrip()
        for r in (header, *rows)
    ]
    return "\n".join(lines)


def _existing_backend(spec: str | os.PathLike[str]) -> LocalTickets | None:
    """The local backend of an existing ticket file; ``None`` for an existing store root without one yet.
    Listing never creates anything (opening a :class:`LocalTickets` would), and a location that does not
    exist raises :class:`TicketConfigError` naming it: a typo must not read as "no tickets"."""
    path, named_root = _resolve(spec)
    if path.is_file():
        return LocalTickets(path)
    if path.exists():
        raise TicketConfigError(f"cannot list tickets: {path} is not a ticket file")
    if path.name == TICKETS_FILE and path.parent.is_dir():
        return None
    if named_root:
        raise TicketConfigError(
            f"cannot list tickets: there is no store root {path.parent} (give an existing store or ticket file)"
        )
    raise TicketConfigError(f"cannot list tickets: there is no ticket file {path} (give an existing one)")


def tickets_list(
    backend_uri_or_path: str | os.PathLike[str] | TicketBackend = DEFAULT_TICKETS,
    state: str | None = None,
    *,
    nodes: list[str] | None = None,
) -> str:
    """``gpucert tickets list``: the tickets (``open`` or ``resolved`` only, when ``state`` says; on ``nodes``)
    as a text table. Never creates a ticket file or folder. Raises :class:`TicketConfigError` for a bad or
    missing location (a store root without tickets lists none) or a bad state, :class:`TicketError` when the
    backend fails."""
    if state not in (None, "open", "resolved"):
        raise TicketConfigError(f"unknown ticket state {state!r}: use open or resolved")
    wanted: State | None = "open" if state == "open" else "resolved" if state == "resolved" else None
    if isinstance(backend_uri_or_path, TicketBackend):
        backend: TicketBackend | None = backend_uri_or_path
    else:
        backend = _existing_backend(backend_uri_or_path)
    if backend is None:
        return format_tickets([], state=wanted)
    return format_tickets(backend.tickets(state=wanted, nodes=nodes), state=wanted)
