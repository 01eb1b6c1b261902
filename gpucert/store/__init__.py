"""The baseline store: versioned baseline tables and run files under one root URI (docs/reference/store-layout.md).

Two layers: :class:`BaselineStore` (versions, the ``current`` pointer, rollback, run files, links) is written
once against the small :class:`ObjectStore` protocol, which :class:`FileObjectStore` (``file:///path`` or a
path) and :class:`S3ObjectStore` (``s3://bucket/prefix``) implement. :class:`StoreURIError`,
:class:`StoreNotFound` and :class:`UnknownVersion` are also :class:`~gpucert.errors.InputError` (exit 2).

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

from ..errors import BucketNotFound, StoreNotFound, StoreURIError, UnknownVersion
from ._baselines import LINK_EXPIRES_S, BaselineChange, BaselineStore, VersionInfo, check_public_url, open_store
from ._format import BASELINE_COLUMNS, empty_baseline, validate_baseline
from ._objects import Blob, FileObjectStore, ObjectStore, open_object_store

if TYPE_CHECKING:
    from ._s3 import S3ObjectStore

__all__ = [
    "BASELINE_COLUMNS",
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
    "validate_baseline",
]


def __getattr__(name: str) -> Any:
    # boto3 takes a noticeable fraction of a second to import; only S3 users pay for it.
    if name == "S3ObjectStore":
        from ._s3 import S3ObjectStore

        return S3ObjectStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
