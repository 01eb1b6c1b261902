"""The errors gpucert raises, and what each one means to the caller.

Every error a user can cause or fix derives from :class:`GpucertError`; the command line turns
:class:`InputError` into exit status 2 and a message that names the file, row, field or node, and
never shows a traceback for any of them::

    GpucertError
    ├── InputError              bad input: the user must fix a file, a flag or a policy (exit 2)
    │   ├── ResultsError        a results file breaks the data contract (carries every problem found)
    │   ├── PolicyError         a policy file has an unknown key, a wrong type or an impossible value
    │   ├── BaselineFormatError a stored baseline does not have the contract's columns or types
    │   ├── MatrixError         a compatibility matrix file has an unknown key or an inconsistent fact
    │   ├── StackConflict       the GPU nodes and the requested stack cannot go together (every conflict)
    │   │   └── InstallerConflict  two installers would run the GPU stack (the GPU Operator and gpucert …)
    │   ├── RunIdError          a run id that is not a DNS label (gpucert._names; also a ValueError)
    │   ├── PayloadArgsError    an option the benchmark payload does not take (gpucert.certify)
    │   ├── TicketActionError   a repair (release --action) that does not fit its ticket's cause (gpucert.tickets)
    │   └── SetupMissing        a named Prefect block is not saved, or a deployed run names no cluster/store
    ├── StackNotReady           a stack component did not get Ready on every target node in time (names them)
    └── StoreError              the baseline store could not do what was asked
        ├── StoreConflict       another writer moved ``baselines/current`` first (retry the update)
        ├── VersionNotFound     no such baseline version (``current`` names a table that is gone)
        │   └── UnknownVersion  a version the user named is not listed (also an InputError: exit 2)
        ├── StoreURIError       a store URI that cannot be one (also an InputError)
        ├── StoreNotFound       a reader opened a root that does not exist: a typo (also an InputError)
        │   └── BucketNotFound  an S3 store's bucket does not exist: refused for writers too
        └── StoreUnavailable    the backend failed (I/O error, S3 5xx, a dropped connection)

The ticket backends' :class:`~gpucert.tickets.TicketError` and the Kubernetes layer's
:class:`~gpucert.kube.KubeError` hang under GpucertError too, each in its own module.

Nothing here is retried automatically except :class:`StoreConflict`, which
:meth:`gpucert.store.BaselineStore.update` retries by re-reading and re-merging.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "BaselineFormatError",
    "GpucertError",
    "InputError",
    "InstallerConflict",
    "MatrixError",
    "PolicyError",
    "Problem",
    "ResultsError",
    "SetupMissing",
    "StackConflict",
    "StackNotReady",
    "StoreConflict",
    "StoreError",
    "StoreUnavailable",
    "VersionNotFound",
]


class GpucertError(Exception):
    """Base of every error gpucert raises on purpose."""


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
    """A baseline table does not follow the contract of DESIGN.md."""


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
    """Two installers would run the GPU stack (the GPU Operator and gpucert's own DaemonSets, or another
    installer's operands), or the installer asked for is not the one that runs it; nothing has been written."""


class SetupMissing(InputError):
    """A block a run or command names (``cluster_block``, ``--store-block``, …) is not saved on the Prefect
    server, or a deployed run has no cluster or store at all; the message names the parameter and says how
    to set the team up (``gpucert setup``)."""


class StackNotReady(GpucertError):
    """A configure step did not get ready on every target node in time; ``nodes`` maps each to why."""

    def __init__(self, what: str, timeout_s: float, nodes: Mapping[str, str], total: int, *, shown: int = 10) -> None:
        self.nodes = dict(nodes)
        named = sorted(self.nodes)
        listed = "; ".join(f"{n} ({self.nodes[n]})" for n in named[:shown])
        more = f"; and {len(named) - shown} more" if len(named) > shown else ""
        noun = "node" if total == 1 else "nodes"
        super().__init__(f"{what} not ready after {timeout_s:g} s on {len(named)} of {total} {noun}: {listed}{more}")


class StoreError(GpucertError):
    """The baseline store could not complete an operation."""


class StoreConflict(StoreError):
    """A conditional write lost: ``current`` is no longer the version the writer read."""


class VersionNotFound(StoreError):
    """The baseline version asked for does not exist in the store."""


class StoreUnavailable(StoreError):
    """The storage backend failed; nothing was changed."""
