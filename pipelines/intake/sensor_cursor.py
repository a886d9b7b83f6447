"""A bucket-listing cursor that cannot miss a dropped file: how new files are found where the
store sends no change notifications (`KINDEX_NOTIFICATIONS=none`).

S3 lists keys in lexical order and cannot filter by time, so every tick lists the whole prefix.
The cursor remembers the newest LastModified seen (the watermark, in the server's clock, so the
sensor host's clock never matters) and every object version (key, ETag, LastModified) whose
LastModified falls inside an overlap window below it. An object is new when it is inside the
window and its version is not remembered. That covers what a plain "LastModified > watermark"
cursor gets wrong:

- uploads in the same second as the watermark (S3 times have one-second resolution);
- keys that sort before the previous key (no StartAfter: order never matters);
- an overwrite with new bytes (a new ETag, hence new work);
- an overwrite with bytes the key held before (A, B, A again: the old ETag with a new
  LastModified): new work too, since the key holds A again now (a version of its own in the
  file ledger, whose run reads it again);
- deleted keys (nothing refers to a key, so a deletion cannot wedge the cursor);
- objects that become visible late (a slow or multipart upload keeps the LastModified of its
  start): caught while they are inside the overlap window.

Plain Python, no Dagster: the sensor in `assets/` calls `advance` and stores its cursor.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pipelines.storage.base import ObjectInfo

# 2: a version is (key, ETag, LastModified). A version 1 cursor (pairs, no time) is read as no
# cursor: the next tick looks at every object again, and re-uploads it missed are read again.
CURSOR_VERSION = 2
DEFAULT_OVERLAP = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class ListingCursor:
    """Where the last listing stopped: a watermark and the object versions (key, ETag,
    LastModified as ISO text) seen just below it."""

    watermark: datetime | None = None
    seen: frozenset[tuple[str, str, str]] = field(default_factory=frozenset)

    def to_json(self) -> str:
        seen_by_key: dict[str, list[list[str]]] = {}
        for key, etag, modified in sorted(self.seen):
            seen_by_key.setdefault(key, []).append([etag, modified])
        return json.dumps(
            {
                "v": CURSOR_VERSION,
                "watermark": self.watermark.isoformat() if self.watermark else None,
                "seen": seen_by_key,
            },
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | None) -> ListingCursor:
        """Read a stored cursor; an empty one (first tick) starts from nothing."""
        if not text:
            return cls()
        data = json.loads(text)
        if data.get("v") == 1:
            return cls()
        if data.get("v") != CURSOR_VERSION:
            raise ValueError(f"unsupported sensor cursor version {data.get('v')!r}")
        watermark = datetime.fromisoformat(data["watermark"]) if data["watermark"] else None
        seen = frozenset(
            (key, etag, modified)
            for key, versions in data["seen"].items()
            for etag, modified in versions
        )
        return cls(watermark=watermark, seen=seen)


def version_of(obj: ObjectInfo) -> tuple[str, str, str]:
    """What the cursor remembers of one upload: its key, ETag and LastModified."""
    return (obj.key, obj.etag, obj.last_modified.isoformat())


@dataclass(frozen=True, slots=True)
class CursorAdvance:
    """The outcome of one listing: the object versions to process, and the cursor after them."""

    new_objects: list[ObjectInfo]
    cursor: ListingCursor
    deferred: int = 0  # new objects left for the next tick because of `limit`


def advance(
    cursor: ListingCursor,
    listing: Iterable[ObjectInfo],
    *,
    overlap: timedelta = DEFAULT_OVERLAP,
    limit: int | None = None,
) -> CursorAdvance:
    """Compare a full listing with the cursor; return the new object versions, oldest first.

    With `limit`, at most that many are returned and the rest stay new for the next call.
    """
    floor = cursor.watermark - overlap if cursor.watermark else None
    in_window = [o for o in listing if floor is None or o.last_modified >= floor]
    new = sorted(
        (o for o in in_window if version_of(o) not in cursor.seen),
        key=lambda o: (o.last_modified, o.key, o.etag),
    )
    emitted, deferred = (new, []) if limit is None else (new[:limit], new[limit:])

    # Past deferred objects the watermark must not move, or they could fall out of the window.
    horizon = emitted if deferred else in_window
    watermark = max(
        [t for t in [cursor.watermark, *(o.last_modified for o in horizon)] if t is not None],
        default=None,
    )
    new_floor = watermark - overlap if watermark else None
    skipped = {version_of(o) for o in deferred}
    seen = frozenset(
        version_of(o)
        for o in in_window
        if (new_floor is None or o.last_modified >= new_floor) and version_of(o) not in skipped
    )
    return CursorAdvance(
        new_objects=emitted,
        cursor=ListingCursor(watermark=watermark, seen=seen),
        deferred=len(deferred),
    )
