"""The object-store surface the rest of kindex relies on."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Protocol


class NoSuchKey(KeyError):
    """The key does not exist in the bucket."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    etag: str  # without surrounding quotes
    size: int
    last_modified: datetime  # timezone-aware UTC
    version_id: str | None = None
    # User metadata (x-amz-meta-*) as a HEAD or GET returns it; a listing carries none.
    metadata: Mapping[str, str] = field(default_factory=dict, compare=False)


class KeptCopy(Enum):
    """What `keep_copy` did."""

    COPIED = "copied"  # the key holds the source's bytes, copied just now
    EXISTED = "existed"  # the key held an object already: nothing was copied
    NOT_COPIED = "not copied"  # the source changed or went since, or is too large to copy


class ObjectStore(Protocol):
    bucket: str

    def put_bytes(
        self,
        key: str,
        data: bytes,
        *,
        content_type: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> ObjectInfo: ...

    def put(self, key: str, data: bytes, *, content_type: str | None = None) -> None:
        """One PUT, nothing read back: put_bytes also asks for the object it wrote (a HEAD,
        for its LastModified), which callers that only write need not wait for."""
        ...

    def upload_file(
        self,
        path: Path | str,
        key: str,
        *,
        content_type: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> ObjectInfo: ...

    def put_new(self, key: str, data: bytes, *, content_type: str | None = None) -> bool: ...

    def copy_to(
        self,
        source_key: str,
        key: str,
        *,
        size: int,
        content_type: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> ObjectInfo: ...

    def keep_copy(
        self, source_key: str, key: str, *, etag: str, size: int, content_type: str | None = None
    ) -> KeptCopy: ...

    def get_bytes(self, key: str) -> bytes: ...

    def get_object(self, key: str) -> tuple[bytes, ObjectInfo]: ...

    def head(self, key: str) -> ObjectInfo | None: ...

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]: ...

    def delete(self, key: str) -> None: ...
