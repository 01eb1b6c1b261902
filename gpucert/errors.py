"""The errors gpucert raises, and what each one means to the caller.

Every error a user can cause or fix derives from :class:`GpucertError`, and every class of the tree is
defined here, whichever package raises it (that package re-exports it: ``gpucert.kube.KubeError`` is
``gpucert.errors.KubeError``). The command line turns :class:`InputError` into exit status 2 and a message
that names the file, row, field or node, and never shows a traceback for any of them. A class with two
bases is drawn under the first; "also" names the other::

    GpucertError                    the base of every error gpucert raises on purpose
    ├── InputError                  bad input: the user must fix a file, a flag or a policy (exit 2)
    │   ├── ResultsError            a results file breaks the data contract (carries every problem found)
    │   ├── PolicyError             a policy file has an unknown key, a wrong type or an impossible value
    │   ├── BaselineFormatError     a stored baseline does not have the contract's columns or types
    │   ├── MatrixError             a compatibility matrix file has an unknown key or an inconsistent fact
    │   ├── StackConflict           the GPU nodes and the requested stack cannot go together (every conflict)
    │   │   └── InstallerConflict   two installers would run the GPU stack (the GPU Operator and gpucert …)
    │   ├── RunIdError              a run id that is not a DNS label (also a ValueError)
    │   ├── FileProblem             a stored file of a run cannot serve its certificate (names the key)
    │   └── SetupMissing            a named Prefect block is not saved, or a deployed run names no cluster/store
    ├── RunAttemptsExhausted        a flow run crashed back more often than $GPUCERT_MAX_RUN_ATTEMPTS allows
    ├── ShardFailed                 a shard of a large certify failed, stayed crashed or was never picked up
    ├── StackNotReady               a stack component did not get Ready on every target node in time (names them)
    ├── StackRenderError            a stack template rendered into something that is not Kubernetes objects
    ├── JobRenderError              a benchmark template rendered into something that is not the expected object
    │   └── PayloadArgsError        an option the payload does not take (also an InputError and a ValueError)
    ├── KubeError                   a Kubernetes API call failed; the message names the verb and the object
    │   ├── KubeUnavailable         transient: retried with back-off inside each call
    │   │   ├── KubeUnreachable     no answer: refused, reset, timed out
    │   │   ├── KubeServerError     5xx
    │   │   └── KubeThrottled       429 TooManyRequests; ``retry_after`` from the header
    │   └── KubeRequestError        4xx: retrying the same request cannot help
    │       ├── KubeNotFound        404
    │       ├── KubeConflict        409 (an object that exists, a stale resourceVersion, an apply conflict)
    │       │   └── LeaseLost       a node's Lease we held was taken over by another run, or deleted
    │       ├── KubeForbidden       401 / 403: gpucert's role lacks a permission (RBAC in templates/stack)
    │       └── KubeInvalid         400 / 422: the server refused the object (its message says which field)
    ├── TicketError                 a ticket backend could not do what was asked (never shows a secret)
    │   ├── TicketNotFound          no ticket has the id asked for
    │   ├── TicketConfigError       a ticket backend cannot be opened as configured (also an InputError)
    │   └── TicketActionError       a repair (release --action) unfit for its ticket's cause (also an InputError)
    ├── TelemetryError              Prometheus or the exporters' Endpoints could not be read at all
    │   └── PrometheusAuthError     Prometheus (or the proxy in front of it) refused the credentials: 401 / 403
    └── StoreError                  the baseline store could not do what was asked
        ├── StoreConflict           another writer moved ``baselines/current`` first (retry the update)
        ├── VersionNotFound         no such baseline version (``current`` names a table that is gone)
        │   └── UnknownVersion      a version the user named is not listed (also an InputError: exit 2)
        ├── StoreURIError           a store URI that cannot be one (also an InputError)
        ├── StoreNotFound           a reader opened a root that does not exist: a typo (also an InputError)
        │   └── BucketNotFound      an S3 store's bucket does not exist: refused for writers too
        └── StoreUnavailable        the backend failed (I/O error, S3 5xx, a dropped connection)

The benchmark payload (:mod:`gpucert.bench`) keeps its own errors (``DcgmError``, ``PairError``, …) apart:
it runs alone in the benchmark pod and imports nothing else of gpucert.

Nothing here is retried automatically except :class:`StoreConflict`, which
:meth:`gpucert.store.BaselineStore.update` retries by re-reading and re-merging, and
:class:`KubeUnavailable`, which the Kubernetes layer retries inside each call. This module imports only
the standard library, so any part of gpucert (and ``import gpucert``) can import it for nothing.
"""

from __future__ import annotations

import http
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "BaselineFormatError",
    "BucketNotFound",
    "FileProblem",
    "GpucertError",
    "InputError",
    "InstallerConflict",
    "JobRenderError",
    "KubeConflict",
    "KubeError",
    "KubeForbidden",
    "KubeInvalid",
    "KubeNotFound",
    "KubeRequestError",
    "KubeServerError",
    "KubeThrottled",
    "KubeUnavailable",
    "KubeUnreachable",
    "LeaseLost",
    "MatrixError",
    "PayloadArgsError",
    "PolicyError",
    "Problem",
    "PrometheusAuthError",
    "ResultsError",
    "RunAttemptsExhausted",
    "RunIdError",
    "SetupMissing",
    "ShardFailed",
    "StackConflict",
    "StackNotReady",
    "StackRenderError",
    "StoreConflict",
    "StoreError",
    "StoreNotFound",
    "StoreURIError",
    "StoreUnavailable",
    "TelemetryError",
    "TicketActionError",
    "TicketConfigError",
    "TicketError",
    "TicketNotFound",
    "UnknownVersion",
    "VersionNotFound",
]


class GpucertError(Exception):
    """Base of every error gpucert raises on purpose."""


# --- bad input: the user must fix it (exit 2) ---------------------------------------------------------


class InputError(GpucertError):
    """The user gave input gpucert cannot use; the message says what to fix."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input file: where it is and what is wrong.

    ``row`` is the 1-based line of a CSV or JSON-lines file (the header is line 1 of a CSV), or the
    1-based row of a Parquet file; ``None`` when the problem is about the whole file or a column.
    """

    message: str
    row: int | None = None
    column: str | None = None

    def __str__(self) -> str:
        where = []
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.column is not None:
            where.append(f"column {self.column!r}")
        return f"{', '.join(where)}: {self.message}" if where else self.message


class ResultsError(InputError):
    """A results file breaks the data contract; ``problems`` lists what was found, worst first."""

    #: How many problems the message spells out; the rest are counted.
    SHOWN = 12

    def __init__(self, source: str, problems: Sequence[Problem], *, total: int | None = None) -> None:
        self.source = source
        self.problems = list(problems)
        self.total = total if total is not None else len(self.problems)
        if self.total == 1 and self.problems:  # one problem, one line: what a command line prints
            super().__init__(f"{source}: {self.problems[0]}")
            return
        lines = [f"{source}: {self.total} problem{'s' if self.total != 1 else ''} in the results"]
        lines += [f"  {p}" for p in self.problems[: self.SHOWN]]
        if self.total > self.SHOWN:
            lines.append(f"  … and {self.total - self.SHOWN} more")
        super().__init__("\n".join(lines))


class PolicyError(InputError):
    """A policy file cannot be used as written."""


class BaselineFormatError(InputError):
    """A baseline table does not follow its contract (docs/design/data-contracts.md, "Baselines")."""


class MatrixError(InputError):
    """A compatibility matrix file cannot be used; the message names the file and the field path."""


class StackConflict(InputError):
    """The GPU nodes and the requested stack cannot go together; nothing has been written.

    ``conflicts`` holds every conflict found, one sentence each, naming the nodes concerned; the
    message is a header line followed by one line per conflict.
    """

    def __init__(self, conflicts: Sequence[str], *, header: str | None = None) -> None:
        self.conflicts = list(conflicts)
        count = len(self.conflicts)
        first = header or f"the GPU stack cannot be planned: {count} conflict{'s' if count != 1 else ''}"
        super().__init__("\n".join([first, *(f"  - {c}" for c in self.conflicts)]))


class InstallerConflict(StackConflict):
    """Two installers would run the GPU stack, or the one asked for is not the one that runs it; nothing has
    been written."""


class RunIdError(InputError, ValueError):
    """A run id breaks the rule (an input error; a ``ValueError`` for callers that check values)."""


class FileProblem(InputError):
    """A stored file cannot be used as the certificate needs it; ``key`` names it."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"{key}: {message}")


class SetupMissing(InputError):
    """A block a run or command names is not saved on the Prefect server, or a deployed run has no cluster or
    store at all; the message names the parameter and says how to set the team up (``gpucert setup``)."""


# --- the GPU stack and the benchmark Jobs -------------------------------------------------------------


class RunAttemptsExhausted(GpucertError):
    """A flow run started more often than ``$GPUCERT_MAX_RUN_ATTEMPTS`` allows: it fails (not crashes), so the
    crashed-runs automation does not schedule it again."""


class ShardFailed(GpucertError):
    """A shard's flow run ended FAILED or CANCELLED, stayed CRASHED, or was never picked up; the message
    names the shard, its first node and its flow run."""


class StackNotReady(GpucertError):
    """A configure step did not get ready on every target node in time; ``nodes`` maps each to why."""

    def __init__(self, what: str, timeout_s: float, nodes: Mapping[str, str], total: int, *, shown: int = 10) -> None:
        self.nodes = dict(nodes)
        named = sorted(self.nodes)
        listed = "; ".join(f"{n} ({self.nodes[n]})" for n in named[:shown])
        more = f"; and {len(named) - shown} more" if len(named) > shown else ""
        noun = "node" if total == 1 else "nodes"
        super().__init__(f"{what} not ready after {timeout_s:g} s on {len(named)} of {total} {noun}: {listed}{more}")


class StackRenderError(GpucertError):
    """A stack template rendered into something that is not Kubernetes objects; the message names it."""


class JobRenderError(GpucertError):
    """A benchmark template rendered into something that is not the expected object; the message names it."""


class PayloadArgsError(JobRenderError, InputError, ValueError):
    """Payload arguments the payload would refuse, or that set a flag the Job sets; names the argument."""


# --- the Kubernetes API (mapped from the official client's exceptions by gpucert.kube) -----------------


class KubeError(GpucertError):
    """A Kubernetes API call failed. ``status`` is the HTTP status, None when nothing answered."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class KubeUnavailable(KubeError):
    """The API server did not do it this time; the same call may succeed later."""


class KubeUnreachable(KubeUnavailable):
    """No answer: the connection was refused, reset or timed out."""


class KubeServerError(KubeUnavailable):
    """The server answered 5xx."""


class KubeThrottled(KubeUnavailable):
    """The server answered 429; ``retry_after`` is how long it asked to wait (seconds), if it said."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message, status=429)
        self.retry_after = retry_after


class KubeRequestError(KubeError):
    """The server refused the request (4xx); repeating it unchanged cannot help."""


class KubeNotFound(KubeRequestError):
    """404: no such object (or no such resource on this server)."""


class KubeConflict(KubeRequestError):
    """409: the object exists, changed under us, or another field manager owns the field."""


class LeaseLost(KubeConflict):
    """The Lease of a node we held was taken over by another run (ours had expired) or deleted."""


class KubeForbidden(KubeRequestError):
    """401/403: the credentials in use may not do this."""


class KubeInvalid(KubeRequestError):
    """400/422: the server refused the object as written."""


# --- tickets ------------------------------------------------------------------------------------------


class TicketError(GpucertError):
    """A ticket backend could not do what was asked; the message says what, and never holds a secret."""


class TicketNotFound(TicketError):
    """No ticket has the id asked for."""


class TicketConfigError(TicketError, InputError):
    """A ticket backend cannot be opened as configured (a bad path, URI or block field)."""


class TicketActionError(TicketError, InputError):
    """A repair does not fit its ticket's cause (a GPU reset on a network ticket)."""


# --- telemetry ----------------------------------------------------------------------------------------


class TelemetryError(GpucertError):
    """Telemetry could not be read at all; the message names the query or the call. A single exporter that
    does not answer is no error: it is a per-node problem in :attr:`gpucert.telemetry.Telemetry.problems`."""


class PrometheusAuthError(TelemetryError):
    """Prometheus (or the proxy in front of it) answered 401 or 403: the credentials sent were refused or
    missing. ``url`` is the server, ``status`` the HTTP status, ``sent`` what kind of credentials went
    (``basic auth as user 'x'``, ``an Authorization header (Bearer)``, ``none``): never a secret."""

    def __init__(self, url: str, status: int, sent: str) -> None:
        self.url, self.status, self.sent = url, status, sent
        try:
            status_text = f"HTTP {status} {http.HTTPStatus(status).phrase}"
        except ValueError:
            status_text = f"HTTP {status}"
        super().__init__(
            f"Prometheus {url} refused the credentials ({sent}): {status_text}; "
            "check the username and password, token or headers it is read with"
        )


# --- the baseline store -------------------------------------------------------------------------------


class StoreError(GpucertError):
    """The baseline store could not complete an operation."""


class StoreConflict(StoreError):
    """A conditional write lost: ``current`` is no longer the version the writer read."""


class VersionNotFound(StoreError):
    """The baseline version asked for does not exist in the store."""


class UnknownVersion(VersionNotFound, InputError):
    """The baseline version a caller named is not one of the store's versions."""


class StoreURIError(StoreError, InputError):
    """A store URI (or a public URL for links) cannot be used as written; the message names it."""


class StoreNotFound(StoreError, InputError):
    """A store opened for reading (``create=False``) has no root: a mistyped ``--store``/``--baselines``
    must not read as an empty store. The message names the root."""


class BucketNotFound(StoreNotFound):
    """The S3 bucket of a store does not exist. Unlike a missing root, a writer cannot start it either (the
    store never creates buckets), so every command that opens the store refuses it before anything starts.
    The message names the bucket and the endpoint."""


class StoreUnavailable(StoreError):
    """The storage backend failed; nothing was changed."""
