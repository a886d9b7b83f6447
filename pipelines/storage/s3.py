"""`ObjectStore` over S3 through boto3: one client per store, created once and reused.

Works against AWS S3, SeaweedFS, MinIO or R2 (endpoint URL and path-style addressing are
configurable). botocore retries throttling, 5xx and connection errors per request; tenacity adds
retries where botocore cannot, when a response body breaks off while it is being read. Failures
surface as `StorageUnreachable` or `StorageAccessDenied` with a message that names the endpoint.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import boto3
import botocore.exceptions as boto_errors
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from tenacity import (
    retry,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from pipelines.settings import Settings
from pipelines.storage.base import KeptCopy, NoSuchKey, ObjectInfo
from pipelines.storage.credentials import S3Credentials, configured_credentials
from pipelines.storage.embedded import ServerLease
from pipelines.storage.errors import (
    EmbeddedS3Error,
    KeyRefused,
    StorageAccessDenied,
    StorageError,
    StorageUnreachable,
)

T = TypeVar("T")
__all__ = [
    "EmbeddedS3Error",
    "KeyRefused",
    "S3Store",
    "StorageAccessDenied",
    "StorageError",
    "StorageUnreachable",
    "make_client",
    "store_session",
]

DEFAULT_MAX_ATTEMPTS = 4
# The embedded server is down only while it is being started again (by `kindex up`, within
# seconds): a request that finds nothing listening, or a gateway whose volumes have not come back
# yet (it answers 5xx), tries again for this long.
EMBEDDED_RECONNECT_SECONDS = 60.0
BODY_READ_ATTEMPTS = 3
MULTIPART_THRESHOLD = 64 * 1024 * 1024
COPY_OBJECT_LIMIT = 5 * 1024**3  # S3's largest single CopyObject
ACCESS_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "AllAccessDisabled",
        "403",
    }
)
MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
# What S3 servers answer to a key they refuse (SeaweedFS: KeyTooLongError over 1,024 bytes,
# InvalidRequest for a NUL or a `..` segment, a bare 400 to a HEAD, which has no body).
REFUSED_KEY_CODES = frozenset(
    {"KeyTooLongError", "InvalidRequest", "InvalidObjectName", "InvalidKey", "InvalidURI", "400"}
)
SHOWN_KEY_CHARACTERS = 80
# Raised while a response body streams in; botocore's retries end when the headers arrive.
BODY_READ_ERRORS: tuple[type[Exception], ...] = (
    boto_errors.ResponseStreamingError,
    boto_errors.IncompleteReadError,
    boto_errors.ReadTimeoutError,
    boto_errors.ConnectionClosedError,
)
UNREACHABLE_ERRORS: tuple[type[Exception], ...] = (
    boto_errors.EndpointConnectionError,
    boto_errors.ConnectTimeoutError,
    boto_errors.ConnectionClosedError,
    boto_errors.ReadTimeoutError,
    boto_errors.ResponseStreamingError,
    boto_errors.HTTPClientError,
)


class S3Store:
    """One bucket at one S3 endpoint. Thread-safe: boto3 clients may be shared across threads."""

    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        path_style: bool = True,
        credentials: S3Credentials | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        page_size: int = 1000,
        reconnect_seconds: float = 0.0,
        client: Any = None,
    ) -> None:
        self.bucket = bucket
        self.endpoint_url = endpoint_url
        self.page_size = page_size
        self.reconnect_seconds = reconnect_seconds
        self._credentials = credentials
        self._region, self._path_style, self._max_attempts = region, path_style, max_attempts
        self.client = client or make_client(
            endpoint_url=endpoint_url,
            region=region,
            path_style=path_style,
            credentials=credentials,
            max_attempts=max_attempts,
        )

    @classmethod
    def from_settings(cls, settings: Settings, **options: Any) -> S3Store:
        """A store for the configured endpoint, or for the embedded server of `settings.home`
        (which must be running: see `store_session`). Credentials: boto3's chain for an
        endpoint, the generated identity for the embedded server."""
        if settings.embedded:
            options.setdefault("reconnect_seconds", EMBEDDED_RECONNECT_SECONDS)
        return cls(
            settings.bucket,
            endpoint_url=settings.endpoint_url,
            region=settings.s3_region,
            path_style=settings.s3_path_style,
            credentials=configured_credentials(settings),
            **options,
        )

    @property
    def credentials(self) -> S3Credentials | None:
        """The identity given to this store (None: boto3's chain provides one)."""
        return self._credentials

    def with_bucket(self, bucket: str) -> S3Store:
        """The same endpoint and client, another bucket."""
        return S3Store(bucket, **self._options(), client=self.client)

    def _options(self) -> dict[str, Any]:
        return {
            "endpoint_url": self.endpoint_url,
            "region": self._region,
            "path_style": self._path_style,
            "credentials": self._credentials,
            "max_attempts": self._max_attempts,
            "page_size": self.page_size,
            "reconnect_seconds": self.reconnect_seconds,
        }

    def __reduce__(self) -> tuple[Any, ...]:
        """A store sent to another process (a worker's) is made again there, with a client of
        its own: a boto3 client is neither picklable nor safe to share across a fork."""
        return (functools.partial(S3Store, **self._options()), (self.bucket,))

    # -- the ObjectStore protocol --------------------------------------------------------------

    def put_bytes(
        self,
        key: str,
        data: bytes,
        *,
        content_type: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> ObjectInfo:
        response = self._put_object(key, data, _put_args(content_type, metadata))
        return self._written(key, response, len(data))

    def put(self, key: str, data: bytes, *, content_type: str | None = None) -> None:
        self._put_object(key, data, _put_args(content_type, None))

    def _put_object(self, key: str, data: bytes, extra: Mapping[str, Any]) -> Any:
        return self._call(
            "put",
            key,
            lambda: self.client.put_object(Bucket=self.bucket, Key=key, Body=data, **extra),
        )

    def put_new(self, key: str, data: bytes, *, content_type: str | None = None) -> bool:
        """Write `key` only if it holds nothing yet (If-None-Match: *, one request): True if
        this wrote it, False if an object was there."""
        extra = _put_args(content_type, None)
        try:
            self._put_object(key, data, {**extra, "IfNoneMatch": "*"})
        except boto_errors.ClientError as error:
            code = _code(error)
            if code == "PreconditionFailed":
                return False
            # 409: another write of the key was in flight; the HEAD tells whether it landed.
            if code != "ConditionalRequestConflict":
                raise
            if self.head(key) is not None:
                return False
            self._put_object(key, data, extra)
        return True

    def copy_to(
        self,
        source_key: str,
        key: str,
        *,
        size: int,
        content_type: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> ObjectInfo:
        """Copy `source_key` (of `size` bytes) to `key` on the server: the new version as the
        copy's answer describes it (ETag, LastModified, version id), with no HEAD."""
        response = self._copy_object(source_key, key, _put_args(content_type, metadata))
        result = response["CopyObjectResult"]
        return ObjectInfo(
            key=key,
            etag=_etag(result["ETag"]),
            size=size,
            # A HEAD, a GET and a listing state LastModified to the second; a copy's answer
            # may carry milliseconds.
            last_modified=_utc(result["LastModified"]).replace(microsecond=0),
            version_id=response.get("VersionId"),
            metadata=dict(metadata or {}),
        )

    def keep_copy(
        self, source_key: str, key: str, *, etag: str, size: int, content_type: str | None = None
    ) -> KeptCopy:
        """Copy `source_key` (of `size` bytes) to a new `key` on the server, only while the
        source's ETag is still `etag`, so the copy holds the bytes read with that ETag, and only
        if `key` holds nothing yet (a conditional write: one request where the key is new)."""
        if size <= COPY_OBJECT_LIMIT:
            conditions = {"CopySourceIfMatch": f'"{etag}"', "IfNoneMatch": "*"}
            try:
                self._copy_object(source_key, key, {**_put_args(content_type, None), **conditions})
                return KeptCopy.COPIED
            except NoSuchKey:
                pass
            except boto_errors.ClientError as error:
                # 409: another write of the key was in flight (AWS asks for a retry; the HEAD
                # below tells whether it landed).
                if _code(error) not in {"PreconditionFailed", "ConditionalRequestConflict"}:
                    raise
        # Refused (by either condition, which S3 does not tell apart) or too large.
        return KeptCopy.EXISTED if self.head(key) is not None else KeptCopy.NOT_COPIED

    def _copy_object(self, source_key: str, key: str, extra: Mapping[str, Any]) -> Any:
        """One CopyObject within this bucket; the copy gets the headers in `extra`, not the
        source's."""
        source = {"Bucket": self.bucket, "Key": source_key}
        return self._call(
            "copy",
            key,
            lambda: self.client.copy_object(
                Bucket=self.bucket,
                Key=key,
                CopySource=source,
                MetadataDirective="REPLACE",
                **extra,
            ),
        )

    def get_bytes(self, key: str) -> bytes:
        return self.get_object(key)[0]

    def get_object(self, key: str) -> tuple[bytes, ObjectInfo]:
        @retry(
            retry=retry_if_exception_type(BODY_READ_ERRORS),
            stop=stop_after_attempt(BODY_READ_ATTEMPTS),
            wait=wait_exponential(multiplier=0.2, max=2),
            reraise=True,
        )
        def fetch() -> tuple[bytes, ObjectInfo]:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
            body = response["Body"]
            with contextlib.closing(body):
                data = body.read()
            return data, _info(key, response, len(data))

        return self._call("get", key, fetch)

    def head(self, key: str) -> ObjectInfo | None:
        try:
            response = self._call(
                "head", key, lambda: self.client.head_object(Bucket=self.bucket, Key=key)
            )
        except NoSuchKey:
            return None
        return _info(key, response, int(response["ContentLength"]))

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Every object under `prefix` (after the key `start_after`, when given), in key order,
        one page at a time (each page its own request, so a failed one is sent again from where
        the listing was)."""
        token: str | None = None
        while True:
            more: dict[str, str] = {"ContinuationToken": token} if token else {}
            if start_after and not token:
                more["StartAfter"] = start_after
            page = self._call(
                "list",
                prefix,
                functools.partial(
                    self.client.list_objects_v2,
                    Bucket=self.bucket,
                    Prefix=prefix,
                    MaxKeys=self.page_size,
                    **more,
                ),
            )
            for item in page.get("Contents", []):
                yield ObjectInfo(
                    key=item["Key"],
                    etag=_etag(item["ETag"]),
                    size=int(item["Size"]),
                    last_modified=_utc(item["LastModified"]),
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def delete(self, key: str) -> None:
        self._call("delete", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=key))

    # -- beyond the protocol -------------------------------------------------------------------

    def upload_file(
        self,
        path: Path | str,
        key: str,
        *,
        content_type: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> ObjectInfo:
        """Stream a local file to `key` (multipart above 64 MiB); never reads it whole."""
        path = Path(path)
        size = path.stat().st_size
        extra = _put_args(content_type, metadata)
        if size <= MULTIPART_THRESHOLD:

            def put() -> Any:
                with path.open("rb") as body:
                    return self.client.put_object(Bucket=self.bucket, Key=key, Body=body, **extra)

            return self._written(key, self._call("upload", key, put), size)
        config = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD)
        self._call(
            "upload",
            key,
            lambda: self.client.upload_file(
                str(path), self.bucket, key, ExtraArgs=extra, Config=config
            ),
        )
        info = self.head(key)
        if info is None:
            raise StorageError(f"s3://{self.bucket}/{key} is missing right after its upload")
        return info

    def ensure_bucket(self) -> None:
        """Create the bucket unless it exists (and is ours)."""
        try:
            self._call("head bucket", "", lambda: self.client.head_bucket(Bucket=self.bucket))
            return
        except NoSuchKey:
            pass
        region = self.client.meta.region_name
        where: dict[str, Any] = {}
        if region and region != "us-east-1":  # AWS wants the region named, except this one
            where = {"CreateBucketConfiguration": {"LocationConstraint": region}}
        try:
            self._call(
                "create bucket", "", lambda: self.client.create_bucket(Bucket=self.bucket, **where)
            )
        except boto_errors.ClientError as error:
            if _code(error) not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                raise

    # -- errors --------------------------------------------------------------------------------

    def _call(self, action: str, key: str, operation: Callable[[], T]) -> T:
        """Run one S3 operation, turning botocore's exceptions into kindex's. Where the server
        is not back yet (nothing listened, or it answered 5xx past botocore's retries), the
        request is sent again for `reconnect_seconds`."""
        where = f"s3://{self.bucket}/{key}"
        if self.reconnect_seconds > 0:
            operation = retry(
                retry=retry_if_exception(_server_not_back),
                stop=stop_after_delay(self.reconnect_seconds),
                wait=wait_exponential(multiplier=0.2, max=2),
                reraise=True,
            )(operation)
        try:
            return operation()
        except UNREACHABLE_ERRORS as error:
            raise StorageUnreachable(
                f"cannot reach the S3 endpoint {self._endpoint_name()} ({action} {where}): {error}"
            ) from error
        except boto_errors.ParamValidationError as error:
            if not key:
                raise
            raise KeyRefused(f"{action} {_shown(where)}: {_one_line(str(error))}") from error
        except boto_errors.NoCredentialsError as error:
            raise StorageAccessDenied(
                f"no S3 credentials for {self._endpoint_name()}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
            ) from error
        except boto_errors.ClientError as error:
            code = _code(error)
            if code in MISSING_CODES:
                raise NoSuchKey(key) from error
            if code == "NoSuchBucket":
                raise NoSuchKey(f"{key} (bucket {self.bucket} does not exist)") from error
            if code in REFUSED_KEY_CODES and key:
                message = error.response.get("Error", {}).get("Message") or "refused"
                raise KeyRefused(
                    f"the S3 endpoint {self._endpoint_name()} refused the key of {action} "
                    f"{_shown(where)} ({len(key.encode())} bytes): {code}: {message}"
                ) from error
            if code in ACCESS_DENIED_CODES:
                raise StorageAccessDenied(
                    f"the S3 endpoint {self._endpoint_name()} refused the credentials "
                    f"{self._identity()}: {code} on {action} {where}"
                ) from error
            raise

    def _endpoint_name(self) -> str:
        return self.endpoint_url or f"AWS S3 ({self.client.meta.region_name})"

    def _identity(self) -> str:
        if self._credentials is not None:
            return f"(access key {self._credentials.masked_access_key()})"
        resolved = boto3.session.Session().get_credentials()  # what boto3's chain finds
        if resolved is None:
            return "(none)"
        return f"(access key {resolved.access_key[:4]}…)"

    def _written(self, key: str, response: Mapping[str, Any], size: int) -> ObjectInfo:
        """The ObjectInfo of what was just written; LastModified only comes from a HEAD."""
        etag = _etag(response["ETag"])
        version_id = response.get("VersionId")
        head = self.head(key)
        if head is not None and head.etag == etag:
            return head
        # Overwritten since (another writer): describe our version as far as we know it.
        return ObjectInfo(key, etag, size, datetime.now(UTC), version_id)

    def __repr__(self) -> str:
        return f"S3Store(bucket={self.bucket!r}, endpoint={self._endpoint_name()!r})"


def make_client(
    *,
    endpoint_url: str | None,
    region: str,
    path_style: bool,
    credentials: S3Credentials | None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> Any:
    """One boto3 S3 client, made from the process's one boto3 session (see `_session`)."""
    config = Config(
        region_name=region,
        retries={"mode": "standard", "max_attempts": max_attempts},
        s3={
            "addressing_style": "path" if path_style else "auto",
            # Over plain HTTP boto3 signs every body's sha256, to protect it on its way; a body
            # sent over loopback never leaves this machine, and the hash costs this process a
            # pass over every byte it sends (a large ingest sends hundreds of MB). Elsewhere
            # boto3 decides.
            **({"payload_signing_enabled": False} if _loopback(endpoint_url) else {}),
        },
        connect_timeout=5,
        read_timeout=60,
        max_pool_connections=32,
        # SeaweedFS/MinIO/R2 handle these; without it, boto3 >= 1.36 adds CRC checksums that
        # some S3-compatible servers reject.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    keys: dict[str, str] = {}
    if credentials is not None:
        keys = {
            "aws_access_key_id": credentials.access_key,
            "aws_secret_access_key": credentials.secret_key,
        }
    with _SESSION_LOCK:
        return boto_session().client("s3", endpoint_url=endpoint_url, config=config, **keys)


# A boto3 session loads service models, endpoint rules and the credential chain's files the first
# time it needs them and keeps them: a fresh session per client would load them again for every
# store. A session is not safe to share between threads while it makes a client, hence the lock.
_SESSION_LOCK = threading.Lock()


def _fresh_lock_in_child() -> None:
    # A child forked while another thread held the lock would otherwise wait on it forever.
    global _SESSION_LOCK
    _SESSION_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_in_child)


def boto_session() -> boto3.session.Session:
    """The process's boto3 session (make clients under `client_lock()`): one for as long as
    the AWS_* environment it read its configuration and credentials from stays the same."""
    return _session_for(
        tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    )


@functools.lru_cache(maxsize=4)
def _session_for(environment: tuple[tuple[str, str], ...]) -> boto3.session.Session:
    return boto3.session.Session()


def client_lock() -> threading.Lock:
    return _SESSION_LOCK


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def _loopback(endpoint_url: str | None) -> bool:
    """Whether requests to `endpoint_url` stay on this machine (the embedded server's do)."""
    return endpoint_url is not None and urlsplit(endpoint_url).hostname in LOOPBACK_HOSTS


@contextlib.contextmanager
def store_session(settings: Settings, **options: Any) -> Iterator[S3Store]:
    """A store with its bucket created. With no endpoint configured, uses the embedded server
    of `settings.home`, shared with every other command using it (`kindex up` included): the
    first starts it, the last to leave stops it."""
    if not settings.embedded:
        yield _store_with_bucket(settings, options)
        return
    with ServerLease(
        settings.home, port=settings.s3_port, log_path=settings.logs_dir / "s3.log"
    ) as server:
        yield _store_with_bucket(settings.replace(s3_port=server.port), options)


def _store_with_bucket(settings: Settings, options: Mapping[str, Any]) -> S3Store:
    store = S3Store.from_settings(settings, **options)
    store.ensure_bucket()
    return store


def _put_args(content_type: str | None, metadata: Mapping[str, str] | None) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if content_type:
        extra["ContentType"] = content_type
    if metadata:
        extra["Metadata"] = dict(metadata)
    return extra


def _info(key: str, response: Mapping[str, Any], size: int) -> ObjectInfo:
    return ObjectInfo(
        key=key,
        etag=_etag(response["ETag"]),
        size=size,
        last_modified=_utc(response["LastModified"]),
        version_id=response.get("VersionId"),
        metadata=dict(response.get("Metadata") or {}),
    )


def _etag(value: str) -> str:
    return value.strip('"')


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


def _shown(text: str) -> str:
    """`text` for a one-line message: control characters escaped, a long key shortened."""
    shown = text.encode("unicode_escape").decode("ascii")
    if len(shown) > SHOWN_KEY_CHARACTERS:
        shown = shown[: SHOWN_KEY_CHARACTERS - 1] + "…"
    return shown


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _server_not_back(error: BaseException) -> bool:
    """Whether a restarting server would explain the error: nothing listened, or it answered
    with a server error (SeaweedFS's gateway answers before its volumes have registered)."""
    if isinstance(error, boto_errors.EndpointConnectionError):
        return True
    if not isinstance(error, boto_errors.ClientError):
        return False
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return isinstance(status, int) and status >= 500


def _code(error: boto_errors.ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))
