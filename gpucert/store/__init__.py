"""The baseline store: versioned baseline tables and run files under one root URI (docs/reference/store-layout.md).

Two layers, so that a new backend implements only the small one:

- :class:`ObjectStore`, whole-object get/put/delete plus one conditional put keyed on etags, a check that
  the root exists and a link a browser can open; implemented by
  :class:`FileObjectStore` (``file:///path`` or a local path) and :class:`S3ObjectStore`
  (``s3://bucket/prefix``, boto3, any S3-compatible endpoint);
- :class:`BaselineStore`, the versions, the ``current`` pointer moved by compare-and-swap, rollback,
  run files and links to them, written once against that protocol.

The errors a user fixes are :class:`~gpucert.errors.InputError` as well as
:class:`~gpucert.errors.StoreError` (the command line exits 2): :class:`StoreURIError` (a URI that cannot
be opened), :class:`StoreNotFound` (a reader's root does not exist), :class:`UnknownVersion` (a version
the store does not list).

Typical use::

    store = open_store("file:///srv/gpucert")
    table = store.read()                                     # the current baseline (empty if none)
    store.update(lambda t: merge(t, new_rows), message="baseline build run-42")
    open_store("file:///srv/gpucert", create=False)          # a reader: StoreNotFound if it is not there
    url = store.link(store.write_run_file("run-42", day, "report.html", html))

    # S3 with a client built elsewhere (e.g. prefect-aws AwsCredentials.get_s3_client()):
    store = BaselineStore(S3ObjectStore.from_uri("s3://bucket/gpucert", client=client))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._baselines import LINK_EXPIRES_S, BaselineChange, BaselineStore, VersionInfo, check_public_url, open_store
from ._errors import BucketNotFound, StoreNotFound, StoreURIError, UnknownVersion
from ._format import BASELINE_COLUMNS, BASELINE_LEVELS, empty_baseline, validate_baseline
from ._objects import Blob, FileObjectStore, ObjectStore, open_object_store, require_root

if TYPE_CHECKING:
    from ._s3 import S3ObjectStore

__all__ = [
    "BASELINE_COLUMNS",
    "BASELINE_LEVELS",
    "LINK_EXPIRES_S",
    "BaselineChange",
    "BaselineStore",
    "Blob",
    "BucketNotFound",
    "FileObjectStore",
    "ObjectStore",
    "S3ObjectStore",
    "StoreNotFound",
    "StoreURIError",
    "UnknownVersion",
    "VersionInfo",
    "check_public_url",
    "empty_baseline",
    "open_object_store",
    "open_store",
    "require_root",
    "validate_baseline",
]


def __getattr__(name: str) -> Any:
    # boto3 takes a noticeable fraction of a second to import; only S3 users pay for it.
    if name == "S3ObjectStore":
        from ._s3 import S3ObjectStore

        return S3ObjectStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
