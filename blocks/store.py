"""The ``BaselineStore`` block: where baselines and run files live, and the AWS credentials to reach S3."""

from __future__ import annotations

import os
from pathlib import Path

from prefect.blocks.core import Block
from prefect_aws import AwsCredentials
from pydantic import Field

from gpucert.store import BaselineStore as Store
from gpucert.store import S3ObjectStore, open_store

__all__ = ["BaselineStore"]


class BaselineStore(Block):
    """gpucert's store: versioned baselines and each run's results, verdicts, report and stack.

    ``uri`` is ``file:///path`` (the embedded default) or ``s3://bucket/prefix``; for S3 the credentials
    come from prefect-aws' ``AwsCredentials`` block when set (else boto3's own chain) and
    ``endpoint_url`` names an S3-compatible server.

    Example:
        ```python
        from blocks.store import BaselineStore
        store = BaselineStore.load("BLOCK_NAME").open()
        print(store.current_version())
        ```
    """

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

    @classmethod
    def default(cls) -> BaselineStore:
        """The store flows use when none is given: ``$GPUCERT_STORE``, else ``./gpucert-store`` (made absolute)."""
        return cls(uri=os.environ.get("GPUCERT_STORE") or Path("gpucert-store").resolve().as_uri())

    def open(self) -> Store:
        """The store; raises ``gpucert.errors.InputError`` for a URI it cannot open."""
        if self.uri.startswith("s3://"):
            session = self.credentials.get_boto3_session() if self.credentials is not None else None
            return Store(S3ObjectStore.from_uri(self.uri, session=session, endpoint_url=self.endpoint_url))
        return open_store(self.uri)
