"""Snapshots against the real embedded SeaweedFS: byte-for-byte, content-addressed, recorded."""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pipelines.ingest import known_info, process_snapshot
from pipelines.intake.incoming import SourceCommit
from pipelines.intake.snapshots import (
    Snapshot,
    SnapshotCorrupt,
    SnapshotNotFound,
    VersionChanged,
    content_digest,
    decode_key,
    latest_read_per_key,
    list_reads,
    load_snapshot,
    put_by_snapshot,
    read_record_key,
    read_snapshot,
    reads_prefix,
    snapshot_key,
    take_snapshot,
)
from pipelines.settings import Settings
from pipelines.storage.base import KeptCopy
from pipelines.storage.s3 import S3Store


@pytest.fixture
def settings(s3_store: S3Store) -> Settings:
    return Settings.from_env()


def test_snapshot_is_a_byte_for_byte_copy(s3_store: S3Store, settings: Settings) -> None:
    data = os.urandom(100_000) + b"\r\n\x00 trailing bytes kept\r\n"
    info = s3_store.put_bytes("incoming/results.csv", data)
    snap = take_snapshot(s3_store, settings, "incoming/results.csv", etag=info.etag)

    assert snap.digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert (snap.key, snap.etag, snap.size, snap.bucket) == (
        "incoming/results.csv",
        info.etag,
        len(data),
        s3_store.bucket,
    )
    assert snap.last_modified == info.last_modified and snap.read_at >= snap.last_modified
    assert s3_store.get_bytes(f"snapshots/sha256/{snap.hex}") == data
    assert read_snapshot(s3_store, settings, snap) == data
    assert read_snapshot(s3_store, settings, snap.digest) == data


def test_parsing_reads_the_snapshot_not_the_key(s3_store: S3Store, settings: Settings) -> None:
    s3_store.put_bytes("incoming/a.csv", b"version one")
    snap = take_snapshot(s3_store, settings, "incoming/a.csv")
    s3_store.put_bytes("incoming/a.csv", b"version two")
    s3_store.delete("incoming/a.csv")
    assert read_snapshot(s3_store, settings, snap) == b"version one"
    assert load_snapshot(s3_store, settings, snap.digest, key="incoming/a.csv") == snap


def test_same_bytes_under_two_keys_are_one_snapshot_and_two_reads(
    s3_store: S3Store, settings: Settings
) -> None:
    data = b"kernel,provider\njsd,liger\n"
    s3_store.put_bytes("incoming/a.csv", data)
    s3_store.put_bytes("incoming/copy of a.csv", data)
    first = take_snapshot(s3_store, settings, "incoming/a.csv")
    second = take_snapshot(s3_store, settings, "incoming/copy of a.csv")
    again = take_snapshot(s3_store, settings, "incoming/a.csv")

    assert first.digest == second.digest
    assert again == first  # re-reading an unchanged version changes nothing
    raw = [o.key for o in s3_store.list("snapshots/sha256/")]
    assert raw == [snapshot_key(settings, first.digest)]
    reads = list_reads(s3_store, settings)
    assert sorted(r.key for r in reads) == ["incoming/a.csv", "incoming/copy of a.csv"]
    assert {decode_key(o.key.split("/")[2]) for o in s3_store.list(reads_prefix(settings))} == {
        "incoming/a.csv",
        "incoming/copy of a.csv",
    }
    assert load_snapshot(s3_store, settings, first.digest) == first  # first read of any key
    assert load_snapshot(s3_store, settings, first.digest, key="incoming/copy of a.csv") == second


def test_latest_read_per_key_follows_versions(s3_store: S3Store, settings: Settings) -> None:
    # A, B, then A again: within one second LastModified cannot order them, the reads do.
    for data in (b"A", b"B", b"A"):
        s3_store.put_bytes("incoming/x.csv", data)
        take_snapshot(s3_store, settings, "incoming/x.csv")
    s3_store.put_bytes("incoming/y.csv", b"Y")
    take_snapshot(s3_store, settings, "incoming/y.csv")
    s3_store.put_bytes("elsewhere/z.csv", b"Z")
    take_snapshot(s3_store, settings, "elsewhere/z.csv")

    assert len(list_reads(s3_store, settings, key="incoming/x.csv")) == 2  # two contents
    latest = latest_read_per_key(s3_store, settings, "incoming/")
    assert sorted(latest) == ["incoming/x.csv", "incoming/y.csv"]
    assert read_snapshot(s3_store, settings, latest["incoming/x.csv"]) == b"A"
    assert read_snapshot(s3_store, settings, latest["incoming/y.csv"]) == b"Y"
    assert len(list(s3_store.list("snapshots/sha256/"))) == 4


def test_a_changed_version_is_refused(s3_store: S3Store, settings: Settings) -> None:
    old = s3_store.put_bytes("incoming/a.csv", b"old")
    s3_store.put_bytes("incoming/a.csv", b"new")
    with pytest.raises(VersionChanged, match=old.etag):
        take_snapshot(s3_store, settings, "incoming/a.csv", etag=old.etag)
    assert list(s3_store.list("snapshots/")) == []


def test_missing_and_corrupt_snapshots(s3_store: S3Store, settings: Settings) -> None:
    digest = "sha256:" + hashlib.sha256(b"never stored").hexdigest()
    with pytest.raises(SnapshotNotFound):
        read_snapshot(s3_store, settings, digest)
    with pytest.raises(SnapshotNotFound):
        load_snapshot(s3_store, settings, digest)
    s3_store.put_bytes(snapshot_key(settings, digest), b"tampered")
    with pytest.raises(SnapshotCorrupt):
        read_snapshot(s3_store, settings, digest)


def test_read_record_round_trips(s3_store: S3Store, settings: Settings) -> None:
    s3_store.put_bytes("incoming/ünïcode key.csv", b"data")
    snap = take_snapshot(s3_store, settings, "incoming/ünïcode key.csv")
    assert Snapshot.from_json(snap.to_json()) == snap
    assert load_snapshot(s3_store, settings, snap.digest) == snap


@pytest.mark.parametrize("change", ["overwritten", "deleted"])
def test_a_key_changed_while_it_is_read_still_gives_the_bytes_read(
    s3_store: S3Store, settings: Settings, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """The snapshot is copied on the server only while the key holds the bytes read (their
    ETag); overwritten or deleted in between, the snapshot is uploaded from the bytes read."""
    s3_store.put_bytes("incoming/race.csv", b"the version read")
    get_object = s3_store.get_object

    def read_then_change(key: str) -> Any:
        read = get_object(key)
        if change == "overwritten":
            s3_store.put_bytes(key, b"a newer version")
        else:
            s3_store.delete(key)
        return read

    monkeypatch.setattr(s3_store, "get_object", read_then_change)
    copies: list[KeptCopy] = []
    keep_copy = s3_store.keep_copy

    def recorded(*args: Any, **kwargs: Any) -> KeptCopy:
        copies.append(keep_copy(*args, **kwargs))
        return copies[-1]

    monkeypatch.setattr(s3_store, "keep_copy", recorded)
    snap = take_snapshot(s3_store, settings, "incoming/race.csv")
    assert copies == [KeptCopy.NOT_COPIED]  # the server refused: the ETag changed, or it went
    assert snap.digest == "sha256:" + hashlib.sha256(b"the version read").hexdigest()
    assert read_snapshot(s3_store, settings, snap) == b"the version read"


def test_an_unchanged_key_is_copied_on_the_server(
    s3_store: S3Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(10_000)
    s3_store.put_bytes("incoming/same.csv", data)
    uploads: list[str] = []
    for method in ("put_bytes", "put"):
        put = getattr(s3_store, method)
        monkeypatch.setattr(
            s3_store,
            method,
            lambda key, *a, _put=put, **k: uploads.append(key) or _put(key, *a, **k),
        )
    snap = take_snapshot(s3_store, settings, "incoming/same.csv")
    assert read_snapshot(s3_store, settings, snap) == data
    assert uploads == [read_record_key(settings, "incoming/same.csv", snap.digest)]  # only it


def test_a_file_put_by_way_of_its_snapshot_is_sent_once_and_not_read_back(
    s3_store: S3Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kindex ingest` holds the bytes it uploads: they go up to the snapshot, the incoming
    version is its copy on the server, and the copy's answer describes that version as a HEAD
    would (LastModified to the second), with nothing read back."""
    data = os.urandom(50_000)
    get_object, head = s3_store.get_object, s3_store.head  # get_bytes reads through get_object

    def no_read_back(key: str) -> Any:
        assert key.startswith("snapshots/reads/"), f"{key} was read back"
        return get_object(key)  # read records are read, to keep the newest one

    def no_head(key: str) -> Any:
        raise AssertionError(f"{key} was asked for")

    monkeypatch.setattr(s3_store, "get_object", no_read_back)
    monkeypatch.setattr(s3_store, "head", no_head)
    taken = put_by_snapshot(s3_store, settings, Path("mine.csv"), data, content_digest(data))
    again = put_by_snapshot(s3_store, settings, Path("same bytes.csv"), data, content_digest(data))
    monkeypatch.undo()
    snap = taken.snapshot
    assert (taken.kept_now, again.kept_now) == (True, False)  # the second found it kept
    assert snap.digest == "sha256:" + hashlib.sha256(data).hexdigest()
    # key, ETag, size, LastModified and version id as the server states them
    assert s3_store.head("incoming/mine.csv") == known_info(snap)
    assert s3_store.get_bytes("incoming/mine.csv") == data
    head = s3_store.client.head_object(Bucket=s3_store.bucket, Key="incoming/mine.csv")
    assert head["ContentType"] == "text/csv"
    assert read_snapshot(s3_store, settings, snap) == data
    # A first read is recorded by the batch that processes it; the second read has a record.
    with pytest.raises(SnapshotNotFound):
        load_snapshot(s3_store, settings, snap.digest, key="incoming/mine.csv")
    assert load_snapshot(s3_store, settings, snap.digest, key="incoming/same bytes.csv") == (
        again.snapshot
    )


def test_a_first_read_a_batch_processed_is_found_in_its_sets_file(
    s3_store: S3Store, settings: Settings
) -> None:
    """A first read costs no request of its own: the batch's sets file holds it, and every
    lookup of reads finds it there. The same bytes uploaded again to the key are that read."""
    data = b"kernel,provider\n"  # any bytes: a file of no known format is quarantined whole
    taken = put_by_snapshot(s3_store, settings, Path("first.csv"), data, content_digest(data))
    assert taken.kept_now and not list(s3_store.list(reads_prefix(settings)))
    process_snapshot(s3_store, settings, taken.snapshot, taken)
    assert not list(s3_store.list(reads_prefix(settings)))  # no read record was written
    key = "incoming/first.csv"
    assert load_snapshot(s3_store, settings, taken.snapshot.digest, key=key) == taken.snapshot
    assert list_reads(s3_store, settings) == [taken.snapshot]
    assert latest_read_per_key(s3_store, settings) == {key: taken.snapshot}
    again = put_by_snapshot(s3_store, settings, Path("first.csv"), data, content_digest(data))
    assert again.snapshot == taken.snapshot  # its newest read is these bytes: nothing new


def test_a_version_with_a_commit_is_newest_by_its_commit_time(
    s3_store: S3Store, settings: Settings
) -> None:
    """The commit an upload names (object metadata) is kept with its read, and orders the key's
    versions: an old commit uploaded last is not the newest version."""
    old, new = (
        SourceCommit(c * 40, datetime(2024, m, 1, tzinfo=UTC)) for c, m in (("a", 1), ("b", 6))
    )
    key = "incoming/history.csv"
    s3_store.put_bytes(key, b"new", metadata=new.to_metadata())
    taken = take_snapshot(s3_store, settings, key)
    assert (taken.commit, taken.committed_at) == (new.commit, new.committed_at)
    s3_store.put_bytes(key, b"old", metadata=old.to_metadata())
    late = take_snapshot(s3_store, settings, key)
    assert late.committed_at == old.committed_at and late.last_modified >= taken.last_modified
    assert read_snapshot(s3_store, settings, latest_read_per_key(s3_store, settings)[key]) == b"new"
