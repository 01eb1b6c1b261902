"""The baseline store: versioned baseline tables and run files under one root URI (DESIGN.md, "The store").

Two layers, so that a new backend implements only the small one:

- :class:`ObjectStore`, whole-object get/put plus one conditional put keyed on etags; implemented by
  :class:`FileObjectStore` (``file:///path`` or a local path) and, in a later issue, by an S3 backend;
- :class:`BaselineStore`, the versions, the ``current`` pointer moved by compare-and-swap, rollback and
  run files, written once against that protocol.

Typical use::

    store = open_store("file:///srv/gpucert")
    table = store.read()                                     # the current baseline (empty if none)
    store.update(lambda t: merge(t, new_rows), message="baseline build run-42")
"""

from ._baselines import BaselineStore, VersionInfo, open_store
from ._format import BASELINE_COLUMNS, BASELINE_LEVELS, empty_baseline, validate_baseline
from ._objects import Blob, FileObjectStore, ObjectStore, open_object_store

__all__ = [
    "BASELINE_COLUMNS",
    "BASELINE_LEVELS",
    "BaselineStore",
    "Blob",
    "FileObjectStore",
    "ObjectStore",
    "VersionInfo",
    "empty_baseline",
    "open_object_store",
    "open_store",
    "validate_baseline",
]
