"""Immutable, content-addressed copies of every object version kindex reads.

Reading a dropped object copies its bytes, unchanged, to `<snapshot prefix>sha256/<hex>` (the
same bytes under any key are one snapshot) and records the read: the key, ETag, version id,
size, LastModified and the time of the read. Parsing reads the snapshot, never the mutable key
(or, for a version kindex itself just wrote, the bytes it wrote, which hash to the snapshot's
digest). A file `kindex ingest` uploads goes the other way (`put_by_snapshot`): its bytes to the
snapshot, then the key's version as a server-side copy of that.

Where a read is recorded:
- a first read (its bytes were kept just now, so no read of them exists) that a batch processes
  is recorded by the batch's sets file (`records/batches/<batch>/sets.json`), with the batch's
  records, and costs no request of its own; a crash before that file leaves the version unread,
  and it is read again;
- any other read has a read record, `<snapshot prefix>reads/<base64url key>/<hex>.json` (a long
  key: its hash), one per (key, content): when a key returns to bytes it held before, the
  record of that content is updated to the newer read, so the newest read of a key is always
  the key's newest version that kindex saw ("newest" as pipelines/index/reads.py orders reads:
  by commit time where a version carries one, else by LastModified).

`list_reads` gives the reads of both places.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
from collections.abc import Collection, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import chain
from pathlib import Path
from typing import Any

import duckdb
import orjson

from pipelines.index.bucket_format import ObjectRead, SetsFileContent
from pipelines.index.catalog import IndexCatalog, Version
from pipelines.index.committed import committed_after, ledger_head
from pipelines.index.layout import IndexLayout
from pipelines.index.local import fetch_all, published
from pipelines.index.reads import newest_order
from pipelines.index.tables import SNAPSHOT_SCHEMA, parquet_select
from pipelines.intake.incoming import SourceCommit, incoming_upload
from pipelines.records.record_objects import SETS_FILE, RecordSetSummary
from pipelines.settings import Settings
from pipelines.storage.base import KeptCopy, NoSuchKey, ObjectInfo, ObjectStore

DIGEST_PREFIX = "sha256:"
READ_FETCH_THREADS = 8
SNAPSHOT_CONTENT_TYPE = "application/octet-stream"


class SnapshotError(RuntimeError):
    """A snapshot cannot be taken or read as asked."""


class VersionChanged(SnapshotError):
    """The object at the key is no longer the version the caller meant (its ETag changed)."""


class SnapshotNotFound(SnapshotError, KeyError):
    """No snapshot (or no recorded read) with that digest."""


class SnapshotCorrupt(SnapshotError):
    """The stored bytes do not hash to the snapshot's digest."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One object version that was read, and the digest of its bytes."""

    digest: str  # "sha256:<hex>" of the raw bytes
    bucket: str
    key: str
    etag: str
    version_id: str | None
    size: int
    last_modified: datetime  # the object version's LastModified (server clock, UTC)
    read_at: datetime  # when kindex read it (UTC)
    commit: str | None = None  # the git commit the version came from (object metadata)
    committed_at: datetime | None = None  # that commit's time
    # Recorded from a listing by an older kindex (the bytes were kept before), not by reading
    # them: read records it wrote still carry it.
    from_listing: bool = False

    @property
    def hex(self) -> str:
        return self.digest.removeprefix(DIGEST_PREFIX)

    @property
    def taken_at(self) -> datetime:
        return self.read_at

    @property
    def order(self) -> tuple[datetime, datetime, datetime, str]:
        """Larger is a newer version of the key (pipelines/index/reads.py's rule)."""
        return newest_order(self.committed_at, self.last_modified, self.read_at)

    def to_json(self) -> bytes:
        fields = {name: getattr(self, name) for name in self.__slots__}  # flat: no asdict
        return orjson.dumps(fields, option=orjson.OPT_SORT_KEYS | orjson.OPT_UTC_Z)

    def registered(self, parser_version: str, source: str) -> ObjectRead:
        """This read as a record set registers it, in its batch's sets file (`of_read` back)."""
        return ObjectRead(
            snapshot_digest=self.digest,
            bucket=self.bucket,
            source_key=self.key,
            etag=self.etag,
            version_id=self.version_id,
            size=self.size,
            last_modified=self.last_modified,
            taken_at=self.read_at,
            parser_version=parser_version,
            source=source,
            processed_at=datetime.now(UTC),
            commit=self.commit,
            committed_at=self.committed_at,
        )

    @classmethod
    def of_read(cls, read: ObjectRead) -> Snapshot:
        """A read a batch's sets file registered, as a read record holds it."""
        return cls(
            digest=read.snapshot_digest,
            bucket=read.bucket,
            key=read.source_key,
            etag=read.etag,
            version_id=read.version_id,
            size=read.size,
            last_modified=read.last_modified,
            read_at=read.taken_at,
            commit=read.commit,
            committed_at=read.committed_at,
        )

    @property
    def identity(self) -> tuple[str, str, str, str | None, datetime, datetime]:
        """The same read, whether its read record or a sets file holds it."""
        return (self.digest, self.key, self.etag, self.version_id, self.last_modified, self.read_at)

    @classmethod
    def from_json(cls, data: bytes) -> Snapshot:
        fields: dict[str, Any] = orjson.loads(data)
        for name in ("last_modified", "read_at", "committed_at"):
            if fields.get(name) is not None:
                fields[name] = datetime.fromisoformat(fields[name])
        return cls(**fields)


# -- layout ------------------------------------------------------------------------------------


def content_digest(data: bytes) -> str:
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()


def snapshot_key(settings: Settings, digest: str) -> str:
    return f"{settings.snapshot_prefix}sha256/{_hex(digest)}"


def reads_prefix(settings: Settings, key: str | None = None) -> str:
    """Where read records live: all of them, or those of one object key."""
    base = f"{settings.snapshot_prefix}reads/"
    return base if key is None else f"{base}{_encode_key(key)}/"


def read_record_key(settings: Settings, key: str, digest: str) -> str:
    return f"{reads_prefix(settings, key)}{_hex(digest)}.json"


# -- taking and reading ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TakenSnapshot:
    """A snapshot as `read_and_keep` took it, with the bytes it read."""

    snapshot: Snapshot
    data: bytes
    # No snapshot held these bytes before: nothing was ever recorded or derived from them (a
    # read record or a record set is written only once its snapshot is kept).
    kept_now: bool


def take_snapshot(
    store: ObjectStore, settings: Settings, key: str, etag: str | None = None
) -> Snapshot:
    """Read the object at `key` once, keep its bytes under their digest (written only if
    absent) and record the read. With `etag`, refuse a version other than that one."""
    return read_and_keep(store, settings, key, etag, in_batch=False).snapshot


def read_and_keep(
    store: ObjectStore,
    settings: Settings,
    key: str,
    etag: str | None = None,
    *,
    in_batch: bool = True,
) -> TakenSnapshot:
    """take_snapshot for a batch, keeping the bytes read for it to parse; a first read is
    recorded by the batch's sets file. `in_batch=False`: by a read record, as any other."""
    data, info = store.get_object(key)
    if etag is not None:
        _check_version(store, key, info, etag)
    return _keep(store, settings, info, data, content_digest(data), in_batch)


def _check_version(store: ObjectStore, key: str, found: ObjectInfo | None, etag: str) -> None:
    """Refuse a key that no longer holds the version `etag` (`found`: what it holds now)."""
    if found is None or found.etag != etag.strip('"'):
        now = "is gone" if found is None else f"has ETag {found.etag}"
        raise VersionChanged(
            f"s3://{store.bucket}/{key} {now}, not {etag.strip(chr(34))}: "
            "it was overwritten since it was listed"
        )


def put_by_snapshot(
    store: ObjectStore,
    settings: Settings,
    path: Path,
    data: bytes,
    digest: str,
    key: str | None = None,
    commit: SourceCommit | None = None,
) -> TakenSnapshot:
    """put_incoming by way of the snapshot: the bytes of `path` (hashing to `digest`, the
    caller's content_digest of `data`) go up once, to their snapshot unless it was kept
    already, and the key's new version is a server-side copy of it, whose answer names its
    ETag and LastModified. Nothing is read back, and the read is the version the copy made,
    whatever another writer does to the key. The batch that processes the file records a first
    read."""
    upload = incoming_upload(settings, path, key, commit)
    raw_key = snapshot_key(settings, digest)
    kept_now = store.put_new(raw_key, data, content_type=SNAPSHOT_CONTENT_TYPE)
    info = store.copy_to(
        raw_key,
        upload.key,
        size=len(data),
        content_type=upload.content_type,
        metadata=upload.metadata,
    )
    snapshot = _record_read(store, settings, info, digest, first_read=kept_now, in_batch=True)
    return TakenSnapshot(snapshot, data, kept_now)


def _keep(
    store: ObjectStore,
    settings: Settings,
    info: ObjectInfo,
    data: bytes,
    digest: str,
    in_batch: bool,
) -> TakenSnapshot:
    """Keep `data` (the version `info` of its key, hashing to `digest`) and record the read."""
    key = info.key
    raw_key = snapshot_key(settings, digest)
    # Copied on the server while the key still holds the bytes just read (its ETag), which
    # spares sending them back; uploaded from here when the key changed since.
    kept = store.keep_copy(
        key, raw_key, etag=info.etag, size=len(data), content_type=SNAPSHOT_CONTENT_TYPE
    )
    if kept is KeptCopy.NOT_COPIED:
        store.put(raw_key, data, content_type=SNAPSHOT_CONTENT_TYPE)
    kept_now = kept is not KeptCopy.EXISTED
    snapshot = _record_read(store, settings, info, digest, first_read=kept_now, in_batch=in_batch)
    return TakenSnapshot(snapshot, data, kept_now)


def _record_read(
    store: ObjectStore,
    settings: Settings,
    info: ObjectInfo,
    digest: str,
    *,
    first_read: bool,
    in_batch: bool,
) -> Snapshot:
    """The read of `info` (a version of its key, with metadata as a HEAD or GET gives it),
    which holds the snapshot `digest`: recorded unless a recorded read says so already.
    `first_read`: the snapshot was kept just now, so no read of it exists; `in_batch`: then the
    batch's sets file records it, and no read record is written."""
    commit = SourceCommit.from_metadata(info.metadata)
    snapshot = Snapshot(
        digest=digest,
        bucket=store.bucket,
        key=info.key,
        etag=info.etag,
        version_id=info.version_id,
        size=info.size,
        last_modified=info.last_modified,
        read_at=datetime.now(UTC),
        commit=commit.commit if commit else None,
        committed_at=commit.committed_at if commit else None,
    )
    if first_read and in_batch:
        return snapshot
    if not first_read:
        # A new read only when it can change what the key's newest version is: not when its
        # newest read is these bytes already (the same file uploaded again), nor for an upload
        # older than the one recorded (a late upload of an old commit). A, B, A within one
        # second is a new read: the same order, but B was read since.
        reads = list_reads(store, settings, info.key)
        same = [read for read in reads if read.digest == digest]
        if same:
            previous = same[-1]
            others = [read for read in reads if read.digest != digest]
            if previous.order[:2] > snapshot.order[:2] or all(
                read.order <= previous.order for read in others
            ):
                return previous
    store.put(
        read_record_key(settings, info.key, digest),
        snapshot.to_json(),
        content_type="application/json",
    )
    return snapshot


def read_snapshot(store: ObjectStore, settings: Settings, snapshot: Snapshot | str) -> bytes:
    """The snapshot's bytes, checked against its digest."""
    digest = snapshot.digest if isinstance(snapshot, Snapshot) else snapshot
    try:
        data = store.get_bytes(snapshot_key(settings, digest))
    except NoSuchKey as missing:
        raise SnapshotNotFound(f"no snapshot {digest} in bucket {store.bucket}") from missing
    if content_digest(data) != DIGEST_PREFIX + _hex(digest):
        raise SnapshotCorrupt(
            f"snapshot {digest} in bucket {store.bucket} does not match its digest"
        )
    return data


def load_snapshot(
    store: ObjectStore,
    settings: Settings,
    digest: str,
    key: str | None = None,
    registered: Sequence[RegisteredReads] | None = None,
) -> Snapshot:
    """The read of `digest`: its newest as read from `key`, or (no key) its first of any key.
    `registered`: as list_reads."""
    reads = list_reads(store, settings, key, registered)
    reads = [read for read in reads if read.hex == _hex(digest)]
    if not reads:
        where = f"s3://{store.bucket}/{key}" if key is not None else f"bucket {store.bucket}"
        raise SnapshotNotFound(f"no read of {where} with snapshot {digest}")
    if key is not None:
        return reads[-1]
    return min(reads, key=lambda r: (r.read_at, r.key))


def list_reads(
    store: ObjectStore,
    settings: Settings,
    key: str | None = None,
    registered: Sequence[RegisteredReads] | None = None,
) -> list[Snapshot]:
    """Every recorded read (of one key, or of all keys), oldest version first: the read
    records, and the reads the batches' sets files registered (`registered`: those, as
    sets_file_reads listed them for a caller that looks up many keys; else listed now)."""
    keys = [o.key for o in store.list(reads_prefix(settings, key)) if o.key.endswith(".json")]
    reads = {read.identity: read for read in load_reads(store, keys)}
    if registered is None:
        registered = sets_file_reads(store, settings)
    for by_key in registered:
        batch_reads = by_key.get(key, ()) if key is not None else chain(*by_key.values())
        for read in batch_reads:
            reads.setdefault(read.identity, read)
    return sorted(reads.values(), key=lambda r: (r.order, r.key, r.digest))


def latest_read_per_key(
    store: ObjectStore, settings: Settings, key_prefix: str = ""
) -> dict[str, Snapshot]:
    """For each object key (under `key_prefix`), the read of its newest version."""
    latest: dict[str, Snapshot] = {}
    for read in list_reads(store, settings):  # ascending, so later entries win
        if read.key.startswith(key_prefix):
            latest[read.key] = read
    return latest


class RegisteredReads:
    """The reads the batches' sets files registered, by object key: those the published index
    holds (its `snapshots` table, read with DuckDB from its local files, a key at a time), and
    those of the sets files named by the ledger rows committed since (few, held here with their
    record sets' summaries). A lookup costs what the index and the new batches hold, not a
    parse of every batch ever written. An index whose version names no ledger point (published
    before versions named one) is read from the batches' listing instead, until its next
    publish records one."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection | None,
        new: dict[str, list[Snapshot]],
        summaries: dict[str, RecordSetSummary] | None = None,
        read_ids: dict[str, set[str]] | None = None,
    ) -> None:
        self._con = con  # over the published snapshots table; None: no point, read the listing
        self._new = new
        # Of the sets files committed since: each record set's summary (the newest batch's) and
        # the ids of the reads registered with it, by prefix.
        self.summaries = summaries or {}
        self.read_ids = read_ids or {}

    @property
    def listed(self) -> bool:
        """Whether these are the batches' listing's (an index whose version names no point)."""
        return self._con is None

    @classmethod
    def of(cls, store: ObjectStore, settings: Settings) -> RegisteredReads:
        """The reads as the bucket has them now. The newest is kept for the next caller while
        the index's version and the ledger's head stay as they were (one, whatever the
        history): a batch of files read again asks for each of them."""
        with _looking_up:  # a batch's files ask on several threads: one of them looks
            return cls._of(store, settings)

    @classmethod
    def _of(cls, store: ObjectStore, settings: Settings) -> RegisteredReads:
        layout = IndexLayout.of(settings)
        catalog = IndexCatalog.beside(store, settings)
        version = Version.empty() if catalog.outdated() else catalog.current()
        state = (store.bucket, version.version, ledger_head(catalog))
        latest = _latest.get(store.bucket)
        if latest is not None and latest[0] == state:
            return latest[1]
        committed = committed_after(catalog, version)
        if committed is None:
            keys = sorted(
                o.key for o in store.list(layout.batches_prefix) if o.key.endswith("/" + SETS_FILE)
            )
            return cls(None, _reads_of(store, layout, keys)[0])
        index = published(catalog, version, store.bucket)
        paths = [str(p) for p in fetch_all(store, layout, index.files["snapshots"])]
        con = duckdb.connect()
        con.execute(f"CREATE VIEW snapshots AS {parquet_select(paths, SNAPSHOT_SCHEMA)}")
        reads = cls(con, *_reads_of(store, layout, committed.sets_files))
        _latest[store.bucket] = (state, reads)
        return reads

    def get(self, key: str, default: Iterable[Snapshot] = ()) -> list[Snapshot]:
        """The reads of one object key (`default` when there are none)."""
        found = [r for _, _, r in self._published("WHERE source_key = ?", [key])]
        found += self._new.get(key, [])
        return found or list(default)

    def values(self) -> Iterator[list[Snapshot]]:
        """The reads of every key (a reader of all of them: the reconcile)."""
        by_key: dict[str, list[Snapshot]] = {}
        for _, _, read in self._published():
            by_key.setdefault(read.key, []).append(read)
        for key, reads in self._new.items():
            by_key.setdefault(key, []).extend(reads)
        yield from by_key.values()

    def of_contents(self, digests: Collection[str]) -> list[tuple[str, str, Snapshot]]:
        """The published reads of these snapshots, as (parser version, read id, read): the
        record sets the index holds of them, and the reads registered with each."""
        return self._published("WHERE list_contains(?, snapshot_digest)", [sorted(digests)])

    def _published(
        self, where: str = "", parameters: Sequence[object] = ()
    ) -> list[tuple[str, str, Snapshot]]:
        if self._con is None:
            return []
        cursor = self._con.cursor()  # one per lookup: batches look up keys on several threads
        try:
            rows = cursor.execute(
                f"""SELECT DISTINCT parser_version, read_id, snapshot_digest, bucket, source_key,
                           etag, version_id, size, last_modified, taken_at, commit, committed_at
                    FROM snapshots {where}""",
                list(parameters),
            ).fetchall()
        finally:
            cursor.close()
        return [
            (
                parser_version,
                read_id,
                Snapshot(
                    digest=digest,
                    bucket=bucket,
                    key=key,
                    etag=etag,
                    version_id=version_id,
                    size=size,
                    last_modified=last_modified.astimezone(UTC),
                    read_at=taken_at.astimezone(UTC),
                    commit=commit,
                    committed_at=committed_at.astimezone(UTC) if committed_at else None,
                ),
            )
            for (
                parser_version,
                read_id,
                digest,
                bucket,
                key,
                etag,
                version_id,
                size,
                last_modified,
                taken_at,
                commit,
                committed_at,
            ) in rows
        ]


# The newest RegisteredReads per bucket, with the (bucket, version, ledger head) it is of.
_latest: dict[str, tuple[tuple[str, str | None, int | None], RegisteredReads]] = {}
_looking_up = threading.Lock()


def _reads_of(
    store: ObjectStore, layout: IndexLayout, keys: Sequence[str]
) -> tuple[dict[str, list[Snapshot]], dict[str, RecordSetSummary], dict[str, set[str]]]:
    """The reads these sets files registered, by object key; the summaries they hold (a prefix
    several name: the newest's, as `keys` are oldest first); the read ids of each prefix."""
    by_key: dict[str, list[Snapshot]] = {}
    summaries: dict[str, RecordSetSummary] = {}
    read_ids: dict[str, set[str]] = {}
    for key, path in zip(keys, fetch_all(store, layout, keys), strict=True):
        content = SetsFileContent.loads(path.read_bytes(), key)
        summaries.update(content.summaries)
        for registered in content.reads:
            read = Snapshot.of_read(registered.read)
            by_key.setdefault(read.key, []).append(read)
            read_ids.setdefault(registered.prefix, set()).add(registered.read.read_id)
    return by_key, summaries, read_ids


def sets_file_reads(store: ObjectStore, settings: Settings) -> list[RegisteredReads]:
    """The reads the batches registered (RegisteredReads), for a caller that looks up many
    keys: one lookup of the index and the ledger for all of them."""
    return [RegisteredReads.of(store, settings)]


# -- helpers -----------------------------------------------------------------------------------


def _load_read(store: ObjectStore, record_key: str) -> Snapshot | None:
    try:
        return Snapshot.from_json(store.get_bytes(record_key))
    except NoSuchKey:
        return None


def load_reads(store: ObjectStore, record_keys: Iterable[str]) -> list[Snapshot]:
    """The read records at `record_keys` (those gone since they were listed left out)."""
    record_keys = list(record_keys)
    if len(record_keys) <= 1:
        found = [_load_read(store, k) for k in record_keys]
    else:  # one small GET each: overlap them
        with ThreadPoolExecutor(READ_FETCH_THREADS) as pool:
            found = list(pool.map(lambda k: _load_read(store, k), record_keys))
    return [read for read in found if read is not None]


def _hex(digest: str) -> str:
    value = digest.removeprefix(DIGEST_PREFIX)
    if len(value) != 64:
        raise ValueError(f"not a sha256 digest: {digest!r}")
    try:
        binascii.unhexlify(value)
    except binascii.Error as error:
        raise ValueError(f"not a sha256 digest: {digest!r}") from error
    return value.lower()


# S3 keys hold at most 1,024 bytes, and SeaweedFS (like most file systems) refuses a path
# segment longer than 255. The encoded object key is one segment of a read record's key; an
# object key whose encoding is longer is named by its hash instead (the full key is inside the
# record), so any valid source key has a valid read record.
MAX_ENCODED_KEY = 255
HASHED_KEY_MARK = "~sha256-"  # "~" is not in the base64url alphabet: no encoded key starts so


def _encode_key(key: str) -> str:
    """Object keys may hold any character; SeaweedFS maps keys to paths, so keep them opaque."""
    encoded = base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")
    if len(encoded) <= MAX_ENCODED_KEY:
        return encoded
    return HASHED_KEY_MARK + hashlib.sha256(key.encode()).hexdigest()


def decode_key(encoded: str) -> str:
    """The object key of an encoded name; a hashed (long) key is only in its records."""
    if encoded.startswith(HASHED_KEY_MARK):
        raise ValueError(f"{encoded!r} names a long key by its hash: read its record for the key")
    return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
