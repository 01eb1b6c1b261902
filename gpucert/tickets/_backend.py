"""The protocol every ticket backend implements: one atomic read-change-write per fingerprint, and reads."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, runtime_checkable

from ._model import Fingerprint, State, Ticket, TicketEvent

__all__ = ["Change", "TicketBackend"]

#: A change to one fingerprint's ticket: given its ticket (None if it never had one) and the other tickets
#: of its node (any state), the event to store, or None to change nothing. A change may raise to abort.
Change = Callable[[Ticket | None, Sequence[Ticket]], TicketEvent | None]


@runtime_checkable
class TicketBackend(Protocol):
    """Where tickets live. The lifecycle (:func:`gpucert.tickets.reconcile`) is written against this alone.

    ``change`` is the only write: the backend reads the fingerprint's ticket and its node's other tickets,
    calls the change, stores the event's ticket and announces it (a Jira comment, a webhook POST), as one
    step where the backend allows it (a SQLite transaction; Jira has none, see :class:`JiraTickets`).
    """

    def change(self, fingerprint: Fingerprint, change: Change) -> TicketEvent | None:
        """Apply ``change`` to the fingerprint's ticket; returns the stored event (its ticket carries the
        backend's id) or None when the change made none. Raises :class:`TicketError` when the backend fails
        (nothing is stored then) and whatever ``change`` raises."""
        ...

    def get(self, ticket_id: str) -> Ticket:
        """The ticket with this id; raises :class:`TicketNotFound` when there is none."""
        ...

    def tickets(self, *, state: State | None = None, nodes: Iterable[str] | None = None) -> list[Ticket]:
        """Every ticket (in ``state``, on ``nodes``, when given), oldest first."""
        ...
