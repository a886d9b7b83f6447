"""Dropping a local file into the bucket's incoming prefix: what `kindex put` and `kindex ingest`
both do first, so the two upload the same way (to the same key, with a content type).

A version taken from git history carries its commit and commit time as object metadata
(`x-amz-meta-kindex-commit`, `x-amz-meta-kindex-committed-at`): the snapshot of that version
records them, and the newest version of its key is then judged by commit time.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pipelines.settings import Settings
from pipelines.storage.base import ObjectInfo, ObjectStore

MAX_KEY_BYTES = 1024  # S3's limit on an object key, in UTF-8 bytes
COMMIT_METADATA = "kindex-commit"
COMMITTED_AT_METADATA = "kindex-committed-at"


class IncomingKeyError(ValueError):
    """A key kindex will not upload a dropped file to."""


@dataclass(frozen=True, slots=True)
class SourceCommit:
    """The git commit an uploaded version was taken from, and the commit's time."""

    commit: str
    committed_at: datetime  # timezone-aware

    def to_metadata(self) -> dict[str, str]:
        at = self.committed_at.astimezone(UTC).isoformat().replace("+00:00", "Z")
        return {COMMIT_METADATA: self.commit, COMMITTED_AT_METADATA: at}

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str]) -> SourceCommit | None:
        """The commit an object's metadata names, or None (a plain upload, or unreadable)."""
        commit, at = metadata.get(COMMIT_METADATA), metadata.get(COMMITTED_AT_METADATA)
        if not commit or not at:
            return None
        try:
            committed_at = datetime.fromisoformat(at)
        except ValueError:
            return None
        if committed_at.tzinfo is None:
            return None
        return cls(commit, committed_at.astimezone(UTC))


def incoming_key(settings: Settings, path: Path) -> str:
    """`<incoming prefix><file name>`; Settings prefixes always end in `/`."""
    return f"{settings.incoming_prefix}{path.name}"


def check_incoming_key(settings: Settings, key: str) -> str:
    """`key` if a dropped file may be uploaded there, else IncomingKeyError saying why: under
    the incoming prefix only (elsewhere live the snapshots and the index pointer), naming an
    object, and within S3's length limit."""
    prefix = settings.incoming_prefix
    if not key.startswith(prefix) or key == prefix:
        raise IncomingKeyError(f"the key must name an object under {prefix} (got {key!r})")
    # SeaweedFS maps keys to paths: `a//b` would land at `a/b`, `a/../b` is refused.
    if key.endswith("/") or any(part in ("", ".", "..") for part in key.split("/")):
        raise IncomingKeyError(f"the key must name an object by a plain path: {key!r}")
    try:
        size = len(key.encode())
    except UnicodeEncodeError:
        raise IncomingKeyError(f"the key is not valid UTF-8: {key!r}") from None
    if size > MAX_KEY_BYTES:
        raise IncomingKeyError(f"the key is {size} bytes; S3 takes at most {MAX_KEY_BYTES}")
    return key


@dataclass(frozen=True, slots=True)
class IncomingUpload:
    """What an upload of a local file sends, however its bytes go up."""

    key: str
    content_type: str | None
    metadata: dict[str, str] | None


def incoming_upload(
    settings: Settings, path: Path, key: str | None = None, commit: SourceCommit | None = None
) -> IncomingUpload:
    """`path` goes to `key`, or to its incoming key, typed by its name, with its commit."""
    return IncomingUpload(
        key or incoming_key(settings, path),
        content_type_of(path),
        commit.to_metadata() if commit else None,
    )


def upload_incoming(
    store: ObjectStore,
    settings: Settings,
    path: Path,
    key: str | None = None,
    commit: SourceCommit | None = None,
) -> ObjectInfo:
    """Upload `path` to `key`, or to its incoming key, streaming it from disk."""
    upload = incoming_upload(settings, path, key, commit)
    return store.upload_file(
        path, upload.key, content_type=upload.content_type, metadata=upload.metadata
    )


def put_incoming(
    store: ObjectStore,
    settings: Settings,
    path: Path,
    data: bytes,
    key: str | None = None,
    commit: SourceCommit | None = None,
) -> ObjectInfo:
    """Put `data`, the bytes of `path` already read, to `key` (default: its incoming key) in one
    request."""
    upload = incoming_upload(settings, path, key, commit)
    return store.put_bytes(
        upload.key, data, content_type=upload.content_type, metadata=upload.metadata
    )


def content_type_of(path: Path) -> str | None:
    return mimetypes.guess_type(path.name)[0]
