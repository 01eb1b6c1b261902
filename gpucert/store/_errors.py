"""The store's errors that are the user's to fix: each is a :class:`~gpucert.errors.StoreError` (so code that
handles store failures still catches it) and an :class:`~gpucert.errors.InputError` (so the command line
exits 2 with the message, which names the URI, path or version to fix).
"""

from __future__ import annotations

from ..errors import InputError, StoreError, VersionNotFound

__all__ = ["BucketNotFound", "StoreNotFound", "StoreURIError", "UnknownVersion"]


class StoreURIError(StoreError, InputError):
    """A store URI (or a public URL for links) cannot be used as written: an unknown scheme, an ``s3://``
    URI without a bucket, a malformed URI. The message names it."""


class StoreNotFound(StoreError, InputError):
    """A store opened for reading (``create=False``) has no root: a mistyped ``--store``/``--baselines``
    must not read as an empty store. The message names the root."""


class BucketNotFound(StoreNotFound):
    """The S3 bucket of a store does not exist. Unlike a missing root, a writer cannot start it either (the
    store never creates buckets), so every command that opens the store refuses it before anything starts.
    The message names the bucket and the endpoint."""


class UnknownVersion(VersionNotFound, InputError):
    """The baseline version a caller named is not one of the store's versions (never current, or no such
    version at all)."""
