"""The ``StoreLocation`` block: where baselines and run files live, and the AWS credentials to reach S3.

Named apart from the store it opens (:class:`gpucert.store.BaselineStore`); its Prefect type keeps the slug
``gpucert-baseline-store``, so blocks saved before the rename still load.
"""

from __future__ import annotations

import os
from pathlib import Path

from prefect.blocks.core import Block
from prefect_aws import AwsCredentials
from pydantic import ConfigDict, Field, field_validator

from gpucert.blocks._schema import block_schema_extra
from gpucert.store import BaselineStore as Store
from gpucert.store import S3ObjectStore, StoreURIError, check_public_url, open_store

__all__ = ["StoreLocation"]


class StoreLocation(Block):
    """gpucert's store: versioned baselines and each run's results, verdicts, report and stack.

    ``uri`` is ``file:///path`` (the embedded default) or ``s3://bucket/prefix``; for S3 the credentials
    come from prefect-aws' ``AwsCredentials`` block when set (else boto3's own chain) and
    ``endpoint_url`` names an S3-compatible server. ``public_url``, when set, is where the store root is
    served over HTTP: report links point there instead of at file URIs or presigned S3 URLs.

    Example:
        ```python
        from gpucert.blocks.store import StoreLocation
        store = StoreLocation.load("BLOCK_NAME").open(create=False)   # a reader: the store must exist
        print(store.current_version())
        print(store.link("runs/date=2026-12-01/run=nightly-1/report.html"))
        ```
    """

    model_config = ConfigDict(json_schema_extra=block_schema_extra)

    _block_type_name = "gpucert Baseline Store"
    _block_type_slug = "gpucert-baseline-store"
    _documentation_url = "https://github.com/gpucert/gpucert#readme"  # type: ignore[assignment]
    _description = "Where gpucert keeps versioned baselines and every run's files (file:// or s3://)."

    uri: str = Field(description="The store root: file:///path or s3://bucket/prefix.")
    credentials: AwsCredentials | None = Field(
        default=None, description="prefect-aws credentials for an s3:// store (default: boto3's own chain)."
    )
    endpoint_url: str | None = Field(
        default=None, description="An S3-compatible endpoint (SeaweedFS, MinIO, Ceph); empty for AWS."
    )
    public_url: str | None = Field(
        default=None,
        description="a URL the store root is served at, e.g. an internal web server or bucket website; "
        "report links use it.",
    )

    @field_validator("public_url")
    @classmethod
    def _check_public_url(cls, value: str | None) -> str | None:
        # ValueError is what pydantic turns into a ValidationError naming the field.
        if not value:
            return None
        try:
            return check_public_url(value)
        except StoreURIError as exc:
            raise ValueError(str(exc)) from None

    @classmethod
    def default(cls) -> StoreLocation:
        """The store flows use when none is given: ``$GPUCERT_STORE``, else ``./gpucert-store`` (made absolute);
        its public URL ``$GPUCERT_STORE_PUBLIC_URL`` when set."""
        return cls(
            uri=os.environ.get("GPUCERT_STORE") or Path("gpucert-store").resolve().as_uri(),
            public_url=os.environ.get("GPUCERT_STORE_PUBLIC_URL") or None,
        )

    def open(self, *, create: bool = True) -> Store:
        """The store. ``create=False`` for a reader: the root must already exist.

        Raises ``gpucert.store.StoreURIError`` for a URI it cannot open and ``gpucert.store.StoreNotFound``
        for a missing root with ``create=False`` (both ``gpucert.errors.InputError``).
        """
        if self.uri.strip().lower().startswith("s3://"):
            session = self.credentials.get_boto3_session() if self.credentials is not None else None
            objects = S3ObjectStore.from_uri(self.uri.strip(), session=session, endpoint_url=self.endpoint_url)
            return Store(objects, create=create, public_url=self.public_url)
        return open_store(self.uri, create=create, public_url=self.public_url)
