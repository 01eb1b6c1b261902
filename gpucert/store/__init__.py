"""The baseline store: versioned baseline tables and run files under one root URI (DESIGN.md, "The store").

Two layers, so that a new backend implements only the small one:

- :class:`ObjectStore`, whole-object get/put plus one conditional put keyed on etags; implemented by
  :class:`FileObjectStore` (``file:///path`` or a local path) and :class:`S3ObjectStore`
  (``s3://bucket/prefix``, boto3, any S3-compatible endpoint);
- :class:`BaselineStore`, the versions, the ``current`` pointer moved by compare-and-swap, rollback and
  run files, written once against that protocol.

Typical use::

    store = open_store("file:///srv/gpucert")
    table = store.read()                                     # the current baseline (empty if none)
    store.update(lambda t: merge(t, new_rows), message="baseline build run-42")

    # S3 with a client built elsewhere (e.g. prefect-aws AwsCredentials.get_s3_client()):
    store = BaselineStore(S3ObjectStore.from_uri("s3://bucket/gpucert", client=client))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._baselines import BaselineStore, VersionInfo, open_store
from ._format import BASELINE_COLUMNS, BASELINE_LEVELS, empty_baseline, validate_baseline
from ._objects import Blob, FileObjectStore, ObjectStore, open_object_store

if TYPE_CHECKING:
    from ._s3 import S3ObjectStore

__all__ = [
    "BASELINE_COLUMNS",
    "BASELINE_LEVELS",
    "BaselineStore",
    "Blob",
    "FileObjectStore",
    "ObjectStore",
    "S3ObjectStore",
    "VersionInfo",
    "empty_baseline",
    "open_object_store",
    "open_store",
    "validate_baseline",
]


def __getattr__(name: str) -> Any:
    # boto3 takes a noticeable fraction of a second to import; only S3 users pay for it.
    if name == "S3ObjectStore":
        from ._s3 import S3ObjectStore

        return S3ObjectStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
