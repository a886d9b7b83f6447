"""Dropping a local file into the bucket's incoming prefix: what `kindex put` and `kindex ingest`
both do first, so the two upload the same way (streamed, with a content type)."""

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
    content_type = mimetypes.guess_type(path.name)[0]
    return store.upload_file(path, key or incoming_key(settings, path), content_type=content_type)
