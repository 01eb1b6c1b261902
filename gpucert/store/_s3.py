"""The S3 backend of the object layer: boto3 against AWS or any S3-compatible endpoint.

One S3 request per operation (docs/reference/store-layout.md says how each is made safe); etags are kept
quoted, as S3 sends them (:func:`normalise_etag`), so any etag read is what the next ``put_if`` sends back.
Each request, botocore's tries and back-offs included, ends within the call deadline (:class:`_Deadline`).

One case needs care: a conditional PUT whose answer was lost (the server wrote it, then the connection
dropped) is retried and fails its own condition with 412. After a retry, a 412 reads the object back: when
it holds exactly our bytes the first try landed, so :meth:`~gpucert.store.BaselineStore.update` does not
re-apply a change it already made.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import boto3
import botocore.exceptions
from botocore.config import Config
from botocore.retries import standard

from .._deadline import call_deadline_s
from ..errors import BucketNotFound, StoreConflict, StoreUnavailable, StoreURIError
from ._objects import Blob, _check_prefix, check_key

__all__ = ["DEFAULT_MAX_ATTEMPTS", "DeadlineExceeded", "S3ObjectStore", "normalise_etag"]

#: Tries per request in all (the first one included), botocore standard retry mode.
DEFAULT_MAX_ATTEMPTS = 5
#: The environment variable gpucert reads for an S3-compatible endpoint, before boto3's own
#: ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``.
ENDPOINT_ENV = "GPUCERT_S3_ENDPOINT"
_BOTO_ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
#: The error codes of a conditional write whose condition did not hold.
_CONFLICT_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412", "409"})
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
#: Loose on purpose (S3-compatible servers allow more than AWS's lowercase rule); it only keeps out what
#: can never be a bucket in a URL: whitespace, slashes, "@", ":" and the like.
_BUCKET_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")

#: A boto3 S3 client (``boto3.client("s3")``, or prefect-aws ``AwsCredentials.get_s3_client()``).
S3Client = Any
#: Where the start of a request is noted in botocore's request context.
_STARTED = "gpucert_started"


class DeadlineExceeded(botocore.exceptions.BotoCoreError):  # type: ignore[misc]
    """A request to S3 did not succeed before its deadline; a BotoCoreError so every handler of the store
    turns it into :class:`~gpucert.errors.StoreUnavailable` like any other failure of the endpoint."""

    fmt = (
        "no answer from {endpoint} within the deadline of {seconds:g} s (gave up after {attempts} "
        "attempt(s) in {elapsed:.1f} s; the last: {last}); set the deadline with gpucert --timeout or "
        "$GPUCERT_TIMEOUT"
    )


class _Deadline:
    """botocore hooks that end a request's retries when the next one could not finish before its deadline:
    a retry is allowed only when the longest wait botocore may choose plus a whole try (``attempt_s``, its
    timeouts fixed when the client was built) fit in what is left, whatever the endpoint does."""

    def __init__(self, endpoint: str, seconds: float, attempt_s: float, max_attempts: int) -> None:
        self.endpoint, self.seconds, self.attempt_s = endpoint, seconds, attempt_s
        self._adapter = standard.RetryEventAdapter()
        self._retryable = standard.StandardRetryConditions(max_attempts=max_attempts)
        # With a "random" draw of 1, botocore's own back-off computes its longest wait for that try.
        self._longest = standard.ExponentialBackoff(
            random=lambda: 1.0, service_name="s3", throttling_detector=standard.ThrottlingErrorDetector(self._adapter)
        )

    def install(self, client: S3Client) -> None:
        client.meta.events.register("before-call.s3", self.started)
        client.meta.events.register_first("needs-retry.s3", self.check)

    def started(self, context: dict[str, Any], **kwargs: Any) -> None:
        context[_STARTED] = time.monotonic()

    def check(self, **kwargs: Any) -> None:
        """None (botocore's retry handler decides); raises :class:`DeadlineExceeded` when a retry it may
        make could not end before the deadline."""
        context = self._adapter.create_retry_context(**kwargs)
        if not self._retryable.is_retryable(context):
            return
        started = context.request_context.get(_STARTED)
        elapsed = time.monotonic() - started if started is not None else 0.0
        if elapsed + self._longest.delay_amount(context) + self.attempt_s <= self.seconds:
            return
        if context.caught_exception is not None:
            last = f"{type(context.caught_exception).__name__}: {context.caught_exception}"
        else:
            status = getattr(context.http_response, "status_code", None)
            last = f"{context.get_error_code() or 'error'} (HTTP {status})"
        raise DeadlineExceeded(
            endpoint=self.endpoint, seconds=self.seconds, attempts=context.attempt_number, elapsed=elapsed, last=last
        )


def _check_endpoint(url: str, source: str, root: str) -> None:
    """Raise :class:`StoreURIError` naming ``source`` unless ``url`` can be an S3 endpoint (botocore says
    only "not a valid URI", and not for a port that is not a number)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing the port is what raises
    except ValueError as exc:
        raise StoreURIError(f"cannot open {root}: the S3 endpoint {url!r} ({source}): {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StoreURIError(f"cannot open {root}: the S3 endpoint {url!r} ({source}) is not an http:// or https:// URL")


def normalise_etag(etag: str) -> str:
    """The etag in the quoted form S3 sends (``"abc"``), whether or not it came with quotes."""
    etag = etag.strip()
    if etag.startswith("W/"):
        return etag  # a weak etag keeps its own quoting; S3 does not send them
    if len(etag) >= 2 and etag.startswith('"') and etag.endswith('"'):
        return etag
    return f'"{etag.strip(chr(34))}"'


def _error_code(exc: Exception) -> tuple[str, int | None]:
    if isinstance(exc, botocore.exceptions.ClientError):
        response: dict[str, Any] = exc.response or {}
        code = str(response.get("Error", {}).get("Code") or "")
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return code or (str(status) if status else "UnknownError"), status
    return type(exc).__name__, None


def _retried(exc: botocore.exceptions.ClientError) -> int:
    return int((exc.response or {}).get("ResponseMetadata", {}).get("RetryAttempts") or 0)


class S3ObjectStore:
    """Objects under ``s3://bucket/prefix/``; the store of a fleet whose hosts share no file system.

    ``client`` is any object with the boto3 S3 client interface: pass one built elsewhere (for example
    from prefect-aws ``AwsCredentials.get_s3_client()``) and its own credentials, endpoint and retry
    settings are used as they are. Without one, a client is built from the standard boto3 credential
    chain (environment, shared profile, instance role), or from ``session`` when given, with
    ``endpoint_url`` (default: ``$GPUCERT_S3_ENDPOINT``, then boto3's ``$AWS_ENDPOINT_URL_S3`` /
    ``$AWS_ENDPOINT_URL``), ``region``, standard-mode retries and path-style addressing whenever an
    endpoint is configured (local and most S3-compatible servers need it). Each request of such a client
    ends within ``deadline_s`` (default: :func:`~gpucert._deadline.call_deadline_s`), its tries waiting
    at most ``connect_timeout`` and ``read_timeout``, cut to a quarter and a half of it.

    The bucket must exist: the store never creates one, and a missing bucket is
    :class:`~gpucert.errors.StoreUnavailable` (``NoSuchBucket``) on every operation, reads included.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: S3Client | None = None,
        session: Any | None = None,
        endpoint_url: str | None = None,
        region: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        deadline_s: float | None = None,
    ) -> None:
        if not isinstance(bucket, str) or not _BUCKET_RE.fullmatch(bucket):
            raise StoreURIError(f"{bucket!r} is not an S3 bucket name")
        prefix = prefix.strip("/")
        if prefix:
            try:
                check_key(prefix)
            except ValueError as exc:
                raise StoreURIError(f"s3://{bucket}/{prefix} cannot be a store root: {exc}") from exc
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be ≥ 1, not {max_attempts}")
        self.bucket, self.prefix = bucket, prefix
        if client is None:
            root = f"s3://{bucket}/{prefix}"
            given = "endpoint_url" if endpoint_url else ENDPOINT_ENV
            endpoint_url = endpoint_url or os.environ.get(ENDPOINT_ENV) or None
            # The endpoint botocore will use: ours, else the first of its own variables that is set.
            endpoint = None
            for source, url in [(given, endpoint_url), *((n, os.environ.get(n)) for n in _BOTO_ENDPOINT_ENVS)]:
                if url:
                    _check_endpoint(url, source, root)
                    endpoint = url
                    break
            seconds = call_deadline_s() if deadline_s is None else deadline_s
            connect_s, read_s = min(connect_timeout, seconds / 4), min(read_timeout, seconds / 2)
            config = Config(
                # total_max_attempts counts the first try; botocore's "max_attempts" counts retries only.
                retries={"mode": "standard", "total_max_attempts": max_attempts},
                connect_timeout=connect_s,
                read_timeout=read_s,
                s3={"addressing_style": "path" if endpoint else "auto"},
                # Said explicitly, because only then does botocore presign with SigV4 too: left unset, it
                # presigns links with the legacy SigV2, which newer AWS regions refuse.
                signature_version="s3v4",
                user_agent_extra="gpucert",
            )
            try:
                # A session of its own: boto3's default session is not safe to share between threads
                # that each open a store.
                maker = session if session is not None else boto3.session.Session()
                client = maker.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)
            except (botocore.exceptions.BotoCoreError, ValueError) as exc:
                # In practice a malformed endpoint URL or region: configuration the user fixes.
                raise StoreURIError(f"cannot open s3://{bucket}/{prefix}: {exc}") from exc
            shown = str(getattr(client.meta, "endpoint_url", None) or endpoint or "S3")
            _Deadline(shown, seconds, connect_s + read_s, max_attempts).install(client)
        self._client: S3Client = client

    @classmethod
    def from_uri(cls, uri: str, **options: Any) -> S3ObjectStore:
        """Open ``s3://bucket/prefix``; ``options`` are those of the constructor (``client=`` …). Raises
        :class:`~gpucert.store.StoreURIError` naming a URI that is not one."""
        try:
            parts = urlsplit(uri)
            port = parts.port
        except ValueError as exc:
            raise StoreURIError(f"cannot open store {uri!r}: not a valid URI ({exc})") from None
        if parts.scheme.lower() != "s3":
            raise StoreURIError(f"cannot open store {uri!r}: not an s3:// URI")
        if "://" not in uri or not parts.netloc or port is not None or "@" in parts.netloc:
            raise StoreURIError(
                f"cannot open store {uri!r}: an S3 URI names a bucket and a prefix, as in "
                "s3://my-bucket/gpucert (the endpoint goes in $GPUCERT_S3_ENDPOINT)"
            )
        if parts.query or parts.fragment:
            raise StoreURIError(f"cannot open store {uri!r}: an S3 store URI takes no ?query or #fragment")
        try:
            return cls(parts.netloc, parts.path, **options)
        except StoreURIError as exc:
            raise StoreURIError(f"cannot open store {uri!r}: {exc}") from None

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @property
    def client(self) -> S3Client:
        """The boto3 client underneath."""
        return self._client

    def __repr__(self) -> str:
        endpoint = getattr(getattr(self._client, "meta", None), "endpoint_url", None)
        return f"S3ObjectStore({self.uri!r}, endpoint={endpoint!r})"

    # --- keys and errors ------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _where(self, s3_key: str) -> str:
        return f"s3://{self.bucket}/{s3_key}"

    def _unavailable(self, action: str, s3_key: str, exc: Exception) -> StoreUnavailable:
        code, status = _error_code(exc)
        where = f"{action} {self._where(s3_key)} (bucket {self.bucket!r}, key {s3_key!r})"
        if isinstance(exc, botocore.exceptions.ClientError):
            attempts = _retried(exc) + 1
            message = str((exc.response or {}).get("Error", {}).get("Message") or "").strip()
            tried = f", {attempts} attempts" if attempts > 1 else ""
            detail = f"{code} (HTTP {status}{tried})" + (f": {message}" if message else "")
            if code == "NoSuchBucket":
                detail += f"; create the bucket {self.bucket!r} or fix the store URI"
        else:
            detail = f"{code}: {exc}"
        return StoreUnavailable(f"S3 cannot {where}: {detail}")

    @contextlib.contextmanager
    def _calling(self, action: str, s3_key: str) -> Iterator[None]:
        """Any failure of the requests in the block as :class:`StoreUnavailable` naming ``action`` and the key."""
        try:
            yield
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError, OSError) as exc:
            raise self._unavailable(action, s3_key, exc) from exc

    # --- the ObjectStore protocol ---------------------------------------------------------------

    def get(self, key: str) -> Blob | None:
        return self._read(self._key(key))

    def _read(self, s3_key: str) -> Blob | None:
        """The object at ``s3_key`` (None when missing); any other failure is StoreUnavailable."""
        with self._calling("read", s3_key):
            try:
                response = self._client.get_object(Bucket=self.bucket, Key=s3_key)
            except botocore.exceptions.ClientError as exc:
                if _error_code(exc)[0] in _MISSING_CODES:
                    return None
                raise
            data: bytes = response["Body"].read()
        return Blob(data, normalise_etag(str(response["ETag"])))

    def exists(self, key: str) -> bool:
        s3_key = self._key(key)
        with self._calling("look up", s3_key):
            try:
                self._client.head_object(Bucket=self.bucket, Key=s3_key)
            except botocore.exceptions.ClientError as exc:
                if _error_code(exc)[0] in _MISSING_CODES:
                    return False
                raise
        return True

    def put(self, key: str, data: bytes) -> str:
        s3_key = self._key(key)
        with self._calling("write", s3_key):
            response = self._client.put_object(Bucket=self.bucket, Key=s3_key, Body=data)
        return self._etag_of(response, s3_key)

    def put_if(self, key: str, data: bytes, *, if_match: str | None) -> str:
        s3_key = self._key(key)
        condition: dict[str, str] = {"IfNoneMatch": "*"} if if_match is None else {"IfMatch": normalise_etag(if_match)}
        with self._calling("write", s3_key):
            try:
                response = self._client.put_object(Bucket=self.bucket, Key=s3_key, Body=data, **condition)
            except botocore.exceptions.ClientError as exc:
                code, status = _error_code(exc)
                gone = if_match is not None and code in _MISSING_CODES
                if not (code in _CONFLICT_CODES or status in (409, 412) or gone):
                    raise
                # After a retry, our own first try may be what the condition fails on (the module says why).
                current = self._read(s3_key) if _retried(exc) else None
                if current is not None and current.data == data:
                    return current.etag
                raise self._conflict(s3_key, if_match, code, gone=gone) from exc
        return self._etag_of(response, s3_key)

    def delete(self, key: str) -> None:
        s3_key = self._key(key)
        with self._calling("delete", s3_key):
            # S3 answers 204 whether or not the object existed.
            self._client.delete_object(Bucket=self.bucket, Key=s3_key)

    def root_exists(self) -> bool:
        """Whether the bucket holds at least one object under the prefix (S3 has no folders: an empty prefix
        and a mistyped one are both "no store here"). A missing bucket raises
        :class:`~gpucert.store.BucketNotFound`: no write could ever start the store (gpucert never creates
        buckets), so a command that checks its store first stops before it has started anything."""
        root = f"{self.prefix}/" if self.prefix else ""
        with self._calling("list", root + "*"):
            try:
                page = self._client.list_objects_v2(Bucket=self.bucket, Prefix=root, MaxKeys=1)
            except botocore.exceptions.ClientError as exc:
                if _error_code(exc)[0] == "NoSuchBucket":
                    raise self._no_bucket() from None
                raise
        return bool(page.get("Contents"))

    def link(self, key: str, *, expires_s: int) -> str:
        """A presigned GetObject URL for the client's endpoint, valid ``expires_s`` seconds; a client passed
        in should set ``signature_version="s3v4"`` too, or botocore signs links with the legacy SigV2."""
        s3_key = self._key(key)
        # Signing is local: what fails here is the credentials (none found, or unusable).
        with self._calling("sign a link to", s3_key):
            params = {"Bucket": self.bucket, "Key": s3_key}
            return str(self._client.generate_presigned_url("get_object", Params=params, ExpiresIn=expires_s))

    def list(self, prefix: str) -> list[str]:
        _check_prefix(prefix)
        root = f"{self.prefix}/" if self.prefix else ""
        keys: list[str] = []
        with self._calling("list", root + prefix + "*"):
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=root + prefix)
            for page in pages:
                for item in page.get("Contents", ()):
                    key = str(item["Key"])[len(root) :]
                    try:
                        check_key(key)
                    except ValueError:
                        continue  # a "folder" marker or a hidden name some other tool left: not an object
                    keys.append(key)
        return sorted(keys)

    # --- helpers --------------------------------------------------------------------------------

    def _etag_of(self, response: dict[str, Any], s3_key: str) -> str:
        etag = response.get("ETag")
        if etag:
            return normalise_etag(str(etag))
        # Some S3-compatible servers omit the etag from a PUT answer; ask for it.
        with self._calling("look up", s3_key):
            head = self._client.head_object(Bucket=self.bucket, Key=s3_key)
        return normalise_etag(str(head["ETag"]))

    def _no_bucket(self) -> BucketNotFound:
        endpoint = getattr(self._client.meta, "endpoint_url", None) or "S3"
        return BucketNotFound(
            f"store {self.uri}: the S3 bucket {self.bucket!r} does not exist at {endpoint}; create it "
            "(gpucert never creates buckets) or fix the bucket in the store URI"
        )

    def _conflict(self, s3_key: str, if_match: str | None, code: str, *, gone: bool) -> StoreConflict:
        where = self._where(s3_key)
        if if_match is None:
            return StoreConflict(f"{where} already exists ({code})")
        found = "it is gone" if gone else "it has changed"
        return StoreConflict(f"{where} changed: expected etag {normalise_etag(if_match)}, but {found} ({code})")
