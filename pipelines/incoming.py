"""Dropping a local file into the bucket's incoming prefix: what `kindex put` and `kindex ingest`
both do first, so the two upload the same way (to the same key, with a content type)."""

from __future__ import annotations

import mimetypes
from pathlib import Path
from typing import Any

from pipelines.storage.base import ObjectInfo, ObjectStore


def incoming_key(settings: Any, path: Path) -> str:
    """`<incoming prefix><file name>`; Settings prefixes always end in `/`."""
    return f"{settings.incoming_prefix}{path.name}"


def upload_incoming(
    store: ObjectStore, settings: Any, path: Path, key: str | None = None
) -> ObjectInfo:
    """Upload `path` to `key`, or to its incoming key, streaming it from disk."""
    return store.upload_file(
        path, key or incoming_key(settings, path), content_type=content_type_of(path)
    )


def put_incoming(store: ObjectStore, settings: Any, path: Path, data: bytes) -> ObjectInfo:
    """Put `data`, the bytes of `path` already read, to its incoming key in one request."""
    return store.put_bytes(incoming_key(settings, path), data, content_type=content_type_of(path))


def content_type_of(path: Path) -> str | None:
    return mimetypes.guess_type(path.name)[0]
