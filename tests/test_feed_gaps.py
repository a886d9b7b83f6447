"""A gap in a change feed, without restarting a server: the filer feed tells a restart by the
server record it reads, the incoming sensor lists what changed since a gap at once (and only
then), and the listing keeps what was modified since the gap began. tests/test_notifications.py
kills a real server; tests/test_restart_gap_e2e.py does it under `kindex up`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import pytest
from dagster import DagsterInstance, RunRequest, SensorResult, build_sensor_context

from assets.resources import KindexResource
from assets.sensors import DiscoveryCursor, batch_of, incoming_files_sensor
from pipelines.intake.ledger import FileEntry, FileState, Ledger
from pipelines.intake.notifications import ChangePage, FilerFeed, ObjectChange
from pipelines.intake.notifications.filer import DEFAULT_OVERLAP, FilerCursor, FilerEvent
from pipelines.intake.notifications.gaps import LATE_VISIBILITY, changed_since
from pipelines.settings import Settings
from pipelines.storage.base import ObjectInfo, ObjectStore
from pipelines.storage.errors import StorageUnreachable
from pipelines.storage.s3 import S3Store

SECOND = 10**9
DEFAULT_OVERLAP_NS = DEFAULT_OVERLAP // timedelta(microseconds=1) * 1000

# --- the filer feed tells a restart by the server record ---------------------------------------


class RecordedTail(FilerFeed):
    """A filer feed whose log is a list (no weed, no server): what a restart changes is the
    server record beside it."""

    def __init__(self, record: Path) -> None:
        super().__init__(
            filer="127.0.0.1:1.2",
            bucket="kindex",
            prefix="incoming/",
            tls_dir=record.parent / "tls",
            config_dir=record.parent,
            server_record=record,
        )
        self.events: list[FilerEvent] = []

    def tail(self, *, since_ns: int, until_ns: int, now_ns: int) -> list[FilerEvent]:
        return [e for e in self.events if since_ns < e.ts_ns <= until_ns]


def start_server(record: Path, pid: int) -> None:
    """What EmbeddedS3.start writes for the process it started."""
    record.write_text(json.dumps({"pid": pid, "port": 8333}))


def created(key: str, ts_ns: int) -> FilerEvent:
    """A filer event as weed prints one: an object created under the bucket."""
    folder, name = f"/buckets/kindex/{key}".rsplit("/", 1)
    entry = {"name": name, "attributes": {"fileSize": "3", "mtime": str(ts_ns // SECOND)}}
    return FilerEvent.model_validate(
        {
            "directory": folder,
            "eventNotification": {"newEntry": entry, "newParentPath": folder},
            "tsNs": str(ts_ns),
        }
    )


@pytest.fixture
def feed(tmp_path: Path) -> RecordedTail:
    record = tmp_path / "server.json"
    start_server(record, 1000)
    return RecordedTail(record)


def test_the_same_server_is_no_gap(feed: RecordedTail) -> None:
    first = feed.poll(None, 10)
    read_until = FilerCursor.from_text(first.cursor)
    assert read_until is not None
    feed.events.append(created("incoming/a.csv", read_until.ts_ns + 1))
    page = feed.poll(first.cursor, 10)
    assert [c.key for c in page.changes] == ["incoming/a.csv"]
    assert page.gap_since is None
    assert feed.poll(page.cursor, 10).gap_since is None


def test_another_server_is_a_gap_since_the_cursor_less_its_overlap(feed: RecordedTail) -> None:
    before = feed.poll(None, 10)
    read_until = FilerCursor.from_text(before.cursor)
    assert read_until is not None and read_until.server is not None

    assert feed.server_record is not None
    start_server(feed.server_record, 2000)  # the server was killed and started again
    feed.events.append(created("incoming/after.csv", read_until.ts_ns + 1))
    page = feed.poll(before.cursor, 10)

    expected = datetime.fromtimestamp((read_until.ts_ns - DEFAULT_OVERLAP_NS) / 1e9, UTC)
    assert page.gap_since == expected
    assert [c.key for c in page.changes] == ["incoming/after.csv"], "the new log is read too"
    now = FilerCursor.from_text(page.cursor)
    assert now is not None and now.server == feed.server_identity() != read_until.server
    assert feed.poll(page.cursor, 10).gap_since is None, "reported once"
    assert feed.poll(before.cursor, 10).gap_since == expected, "until a cursor past it is kept"


def test_a_cursor_that_names_no_server_is_judged_against_none(feed: RecordedTail) -> None:
    """A cursor from `since` (the sensor's first tick: the reconcile at start covers it) or one
    written before cursors named their server is no gap."""
    old = json.dumps({"v": 1, "tsNs": 1_700_000_000 * SECOND, "seen": []})
    assert FilerCursor.from_text(old) == FilerCursor(1_700_000_000 * SECOND, (), None)
    assert feed.poll(old, 10).gap_since is None
    since = feed.since(datetime.now(UTC) - timedelta(minutes=15))
    page = feed.poll(since, 10)
    assert page.gap_since is None
    named = FilerCursor.from_text(page.cursor)
    assert named is not None and named.server == feed.server_identity()


def test_the_server_identity_is_its_pid_and_when_its_record_was_written(
    feed: RecordedTail,
) -> None:
    identity = feed.server_identity()
    assert identity is not None and identity.startswith("1000@")
    assert feed.server_record is not None
    feed.server_record.unlink()
    assert feed.server_identity() is None, "no server running"
    feed.server_record.write_text("{not json")
    assert feed.server_identity() is None
    unwatched = FilerFeed(
        filer="127.0.0.1:1.2",
        bucket="kindex",
        prefix="incoming/",
        tls_dir=feed.tls_dir,
        config_dir=feed.config_dir,
    )
    assert unwatched.server_identity() is None


def test_the_feed_of_a_home_watches_its_server_record(tmp_path: Path) -> None:
    feed = FilerFeed.from_settings(Settings(home=tmp_path / "home"))
    assert feed.server_record == (tmp_path / "home" / "s3" / "server.json").resolve()


# --- what a gap's listing keeps ------------------------------------------------------------------


@dataclass
class Listed:
    """A store that only lists, and counts its listings."""

    objects: list[ObjectInfo]
    bucket: str = "kindex"
    listings: list[str] = field(default_factory=list)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self.listings.append(prefix)
        return iter([o for o in self.objects if o.key.startswith(prefix)])


def info(key: str, modified: datetime) -> ObjectInfo:
    return ObjectInfo(key, f"etag-{key}", 3, modified)


def test_the_listing_keeps_what_was_modified_since_the_gap_less_a_late_upload() -> None:
    gap = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    objects = [
        info("incoming/long before.csv", gap - LATE_VISIBILITY - timedelta(seconds=1)),
        info("incoming/slow upload.csv", gap - LATE_VISIBILITY),
        info("incoming/at the gap.csv", gap),
        info("incoming/folder/", gap),
        info("incoming/after.csv", gap + timedelta(minutes=3)),
        info("snapshots/x", gap),
    ]
    store = Listed(objects)

    found = changed_since(cast(ObjectStore, store), "incoming/", gap)

    assert [o.key for o in found] == [
        "incoming/slow upload.csv",
        "incoming/at the gap.csv",
        "incoming/after.csv",
    ]
    assert store.listings == ["incoming/"]


# --- the sensor lists at once after a gap, and only then ---------------------------------------


@dataclass
class ScriptedFeed:
    """A feed that answers the pages it is given, one a poll."""

    pages: list[ChangePage]
    name: str = "scripted"
    polled: list[str | None] = field(default_factory=list)

    def poll(self, cursor: str | None, limit: int) -> ChangePage:
        self.polled.append(cursor)
        return self.pages.pop(0)

    def since(self, moment: datetime) -> str:
        return "start"

    def acknowledge(self, page: ChangePage) -> None:
        pass


def change(obj: ObjectInfo) -> ObjectChange:
    return ObjectChange(obj.key, obj.etag, obj.size, obj.last_modified, deleted=False)


def test_after_a_gap_the_sensor_requests_what_no_event_named(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    known = s3_store.put_bytes("incoming/known.csv", b"a,b\n1,2\n")
    notified = s3_store.put_bytes("incoming/notified.csv", b"a,b\n3,4\n")
    lost = s3_store.put_bytes("incoming/lost.csv", b"a,b\n5,6\n")
    settings = Settings.from_env()
    ledger = Ledger.of(s3_store, settings)
    ledger.append([FileEntry.pending(s3_store.bucket, known)])
    gap = datetime.now(UTC) - timedelta(minutes=1)
    feed = ScriptedFeed(
        [
            ChangePage([change(notified)], "after the gap", gap_since=gap),
            ChangePage([], "idle"),
        ]
    )
    monkeypatch.setattr(KindexResource, "feed", property(lambda self: feed))
    listings: list[str] = []
    original = S3Store.list

    def counted(self: S3Store, prefix: str) -> Iterator[ObjectInfo]:
        listings.append(prefix)
        return original(self, prefix)

    monkeypatch.setattr(S3Store, "list", counted)

    with DagsterInstance.ephemeral() as instance:

        def tick(cursor: str | None) -> SensorResult:
            context = build_sensor_context(
                instance=instance, cursor=cursor, resources={"kindex": KindexResource()}
            )
            result = incoming_files_sensor(context)
            assert isinstance(result, SensorResult), result
            return result

        first = tick(None)
        requests: list[RunRequest] = list(first.run_requests or [])
        why = {
            frozenset(e.key for e in ledger.of_batch(batch_of(r))): r.tags["kindex/why"]
            for r in requests
        }
        assert why == {frozenset({notified.key, lost.key}): "gap"}, "one ledger commit"
        assert listings == [settings.incoming_prefix], "one listing, for the gap"
        assert DiscoveryCursor.from_json(first.cursor).feed == "after the gap"
        pending = {e.key for e in ledger.current() if e.state is FileState.PENDING}
        assert pending == {known.key, notified.key, lost.key}

        idle = tick(first.cursor)
        assert list(idle.run_requests or []) == []
        assert listings == [settings.incoming_prefix], "no gap, no listing"
    assert feed.polled == ["start", "after the gap"]


def test_a_gap_whose_listing_fails_writes_nothing_and_comes_again(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    notified = s3_store.put_bytes("incoming/notified.csv", b"a,b\n3,4\n")
    gap = datetime.now(UTC) - timedelta(minutes=1)
    page = ChangePage([change(notified)], "after the gap", gap_since=gap)
    feed = ScriptedFeed([page, page])
    monkeypatch.setattr(KindexResource, "feed", property(lambda self: feed))

    def unreachable(self: S3Store, prefix: str) -> Iterator[ObjectInfo]:
        raise StorageUnreachable("S3 went away again")

    listing = S3Store.list
    monkeypatch.setattr(S3Store, "list", unreachable)
    ledger = Ledger.of(s3_store, Settings.from_env())
    with DagsterInstance.ephemeral() as instance:
        context = build_sensor_context(
            instance=instance, cursor=None, resources={"kindex": KindexResource()}
        )
        with pytest.raises(StorageUnreachable):
            incoming_files_sensor(context)  # the daemon stores no cursor
        assert not ledger.exists() or ledger.current() == [], "not pending without its run"

        monkeypatch.setattr(S3Store, "list", listing)  # S3 is back
        context = build_sensor_context(
            instance=instance, cursor=None, resources={"kindex": KindexResource()}
        )
        result = incoming_files_sensor(context)
        assert isinstance(result, SensorResult)
        assert [e.key for r in result.run_requests or [] for e in ledger.of_batch(batch_of(r))] == [
            notified.key
        ]
