"""The store's errors that are the user's to fix: each is a :class:`~gpucert.errors.StoreError` (so code that
handles store failures still catches it) and an :class:`~gpucert.errors.InputError` (so the command line
exits 2 with the message, which names the URI, path or version to fix). They are defined, and drawn in the
tree, in :mod:`gpucert.errors`; the store's modules import them from here.
"""

from __future__ import annotations

from ..errors import BucketNotFound, StoreNotFound, StoreURIError, UnknownVersion

__all__ = ["BucketNotFound", "StoreNotFound", "StoreURIError", "UnknownVersion"]
