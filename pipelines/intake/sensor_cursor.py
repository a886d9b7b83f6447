"""A bucket-listing cursor that cannot miss a dropped file, and the partition keys it names.

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
  LastModified): new work too, since the key holds A again now. Its partition (named by key and
  ETag) exists already, so `plan_tick` has that upload read again instead of adding one;
- deleted keys (nothing refers to a key, so a deletion cannot wedge the cursor);
- objects that become visible late (a slow or multipart upload keeps the LastModified of its
  start): caught while they are inside the overlap window.

Plain Python, no Dagster: the sensor in `assets/` calls `plan_tick` and stores its cursor.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from urllib.parse import unquote

from pipelines.intake.snapshots import Reread
from pipelines.storage.base import ObjectInfo

# 2: a version is (key, ETag, LastModified). A version 1 cursor (pairs, no time) is read as no
# cursor: the next tick looks at every object again, and re-uploads it missed are read again.
CURSOR_VERSION = 2
DEFAULT_OVERLAP = timedelta(hours=1)
REREAD_THREADS = 8
ETAG_CHARS_IN_PARTITION_KEY = 8
PARTITION_KEY_SEPARATOR = "@"

# Dagster rejects partition keys containing these (dagster/_core/definitions/partitions/utils).
_CONTROL_CHARS = ("\a", "\b", "\f", "\n", "\r", "\t", "\v", "\0")


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


@dataclass(frozen=True, slots=True)
class TickPlan:
    """What one sensor tick does with a listing."""

    new_partitions: list[str]  # object versions not seen before: partitions to add, oldest first
    # Partitions whose version was uploaded again (A, B, A): a new read of their snapshot is
    # recorded, so their records step must register it (the index then re-judges the key).
    reread_partitions: list[str]
    # Partitions that exist but whose version was never read: their snapshot is taken again.
    unread_partitions: list[str]
    cursor: str
    deferred: int  # new versions left for the next tick


def plan_tick(
    cursor_json: str | None,
    listing: Iterable[ObjectInfo],
    existing: Collection[str],
    reread: Callable[[ObjectInfo], Reread],
    *,
    limit: int | None = None,
) -> TickPlan:
    """Compare a listing with the cursor. A new version gets a partition, unless one with its
    name exists (the key held these bytes before): then `reread` records that upload as a new
    read of the bytes kept then (pipelines.intake.snapshots.record_reread) and says what is left."""
    step = advance(ListingCursor.from_json(cursor_json), listing, limit=limit)
    new: list[str] = []
    again: dict[str, ObjectInfo] = {}
    for obj in step.new_objects:
        key = partition_key_for(obj)
        if key in again or key in new:
            continue  # a later upload of the same bytes in this listing: the one is enough
        if key in existing:
            again[key] = obj
        else:
            new.append(key)
    # A few small S3 requests each, which wait on the network: overlapped (a tick after a
    # cursor reset asks about every object).
    with ThreadPoolExecutor(REREAD_THREADS, thread_name_prefix="kindex-reread") as pool:
        outcomes = dict(zip(again, pool.map(reread, again.values()), strict=True))
    return TickPlan(
        new_partitions=new,
        reread_partitions=[k for k, o in outcomes.items() if o is Reread.RECORDED],
        unread_partitions=[k for k, o in outcomes.items() if o is Reread.UNREAD],
        cursor=step.cursor.to_json(),
        deferred=step.deferred,
    )


def _escape(key: str) -> str:
    # Reversible: '%' first, so unquote() restores keys that contain '%' themselves.
    escaped = key.replace("%", "%25")
    for char in _CONTROL_CHARS:
        escaped = escaped.replace(char, f"%{ord(char):02X}")
    return escaped.replace("...", "..%2E")


def partition_key_for(obj: ObjectInfo) -> str:
    """The Dagster partition key of one object version: its key and the start of its ETag,
    e.g. `incoming/liger.csv@3f2a9c1b`. Readable, unique per version, and reversible."""
    return f"{_escape(obj.key)}{PARTITION_KEY_SEPARATOR}{obj.etag[:ETAG_CHARS_IN_PARTITION_KEY]}"


@dataclass(frozen=True, slots=True)
class ObjectVersionRef:
    """What a partition key names: an object key and the prefix of the ETag it had."""

    key: str
    etag_prefix: str

    def matches(self, etag: str) -> bool:
        return etag.startswith(self.etag_prefix)


def parse_partition_key(partition_key: str) -> ObjectVersionRef:
    escaped, separator, etag_prefix = partition_key.rpartition(PARTITION_KEY_SEPARATOR)
    if not separator or not escaped or not etag_prefix:
        raise ValueError(f"not a kindex partition key (want KEY@ETAG): {partition_key!r}")
    return ObjectVersionRef(key=unquote(escaped), etag_prefix=etag_prefix)
