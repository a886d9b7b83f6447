"""Discovery that does not list the world: on a real embedded SeaweedFS with a few hundred
objects at rest in incoming/, the sensors run in-process find a new file from the filer's change
notifications without listing incoming/, leave it alone when idle, and the reconcile sensor's
listing finds a file whose notification was lost (benchmarks/discovery.py measures the same at
100,000 objects)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from conftest import drop_buckets
from dagster import (
    DagsterInstance,
    RunRequest,
    SensorDefinition,
    SensorResult,
    SkipReason,
    build_sensor_context,
)

from assets.reconcile import reconcile_sensor
from assets.resources import KindexResource
from assets.sensors import (
    DiscoveryCursor,
    batch_of,
    incoming_files_sensor,
    index_catchup_sensor,
    ledger_sensor,
)
from pipelines.intake.ledger import FileEntry, FileState, Ledger
from pipelines.intake.notifications import FilerFeed
from pipelines.settings import Settings
from pipelines.storage.base import ObjectInfo
from pipelines.storage.embedded import EmbeddedS3
from pipelines.storage.s3 import S3Store

# Each test uploads this many objects and runs Dagster sensors on a real server: ~30 s.
pytestmark = pytest.mark.slow
OBJECTS = 300
UPLOAD_THREADS = 16
INCOMING = "incoming/"
# Any of these would take the sensors off the embedded server's filer feed.
FOREIGN_SETTINGS = (
    "KINDEX_S3_ENDPOINT",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "KINDEX_SQS_QUEUE_URL",
    "KINDEX_CATALOG_URI",
)


@dataclass
class Discovery:
    """A bucket of the session's server with OBJECTS in incoming/ whose ledger rows say
    indexed (at rest), and the sensors' cursors carried from tick to tick as the daemon does."""

    store: S3Store
    settings: Settings
    instance: DagsterInstance
    cursors: dict[str, str | None] = field(default_factory=dict)
    listed: list[str] = field(default_factory=list)  # prefixes listed outside reconcile
    reconciling: bool = False

    @property
    def ledger(self) -> Ledger:
        return Ledger.of(self.store, self.settings)

    def tick(self, sensor: SensorDefinition) -> list[RunRequest]:
        # A fresh resource per tick (settings from the environment), as the daemon builds one.
        context = build_sensor_context(
            instance=self.instance,
            cursor=self.cursors.get(sensor.name),
            resources={"kindex": KindexResource()},
        )
        self.reconciling = sensor.name == reconcile_sensor.name
        try:
            result = sensor(context)
        finally:
            self.reconciling = False
        if isinstance(result, SkipReason):  # the daemon keeps the cursor
            return []
        assert isinstance(result, SensorResult), result
        if result.cursor is not None:
            self.cursors[sensor.name] = result.cursor
        return list(result.run_requests or [])

    def batch_keys(self, request: RunRequest) -> list[str]:
        """The keys of the ledger rows of the batch a run request names."""
        batch = batch_of(request)
        return [entry.key for entry in self.ledger.of_batch(batch)]


def upload(store: S3Store, count: int) -> list[ObjectInfo]:
    with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        return list(
            pool.map(
                lambda n: store.put_bytes(f"{INCOMING}{n:05d}.csv", f"a,b\n{n},2\n".encode()),
                range(count),
            )
        )


@pytest.fixture
def discovery(
    embedded_s3: EmbeddedS3, s3_client: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Discovery]:
    # The settings reach the embedded server itself (its home and port, no endpoint), so the
    # filer feed is the one `KINDEX_NOTIFICATIONS=filer` selects.
    for name in FOREIGN_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KINDEX_HOME", str(embedded_s3.home))
    monkeypatch.setenv("KINDEX_S3_PORT", str(embedded_s3.port))
    monkeypatch.setenv("KINDEX_BUCKET", f"discovery-{uuid.uuid4().hex[:12]}")
    monkeypatch.setenv("KINDEX_NOTIFICATIONS", "filer")
    settings = Settings.from_env()
    store = S3Store.from_settings(settings)
    store.ensure_bucket()
    at_rest = [
        replace(FileEntry.pending(store.bucket, info), state=FileState.INDEXED, attempts=1)
        for info in upload(store, OBJECTS)
    ]
    Ledger.of(store, settings).append(at_rest)

    with DagsterInstance.ephemeral() as instance:
        found = Discovery(store, settings, instance)
        original = S3Store.list

        def guarded(self: S3Store, prefix: str) -> Iterator[ObjectInfo]:
            # A listing of incoming/ is recorded and refused, but the reconcile sensor's: it
            # is the one sensor allowed to list.
            if prefix.startswith(INCOMING) and not found.reconciling:
                found.listed.append(prefix)
                raise AssertionError(f"listed {prefix}")
            return original(self, prefix)

        monkeypatch.setattr(S3Store, "list", guarded)
        yield found
    drop_buckets(s3_client)


def test_a_dropped_file_is_found_from_the_notifications_without_a_listing(
    discovery: Discovery,
) -> None:
    assert discovery.tick(incoming_files_sensor) == [], "at rest: the ledger holds the replay"
    key = f"{INCOMING}dropped later.csv"
    discovery.store.put_bytes(key, b"a,b\n1,2\n")

    requests = discovery.tick(incoming_files_sensor)

    assert [discovery.batch_keys(r) for r in requests] == [[key]]
    assert discovery.listed == []
    assert discovery.tick(incoming_files_sensor) == [], "found once"


def test_a_file_dropped_before_the_first_tick_is_found_by_it(discovery: Discovery) -> None:
    """The sensor's first poll replays what came since the reconcile listing could have run,
    so a file dropped while the daemon starts is not left to the next listing."""
    key = f"{INCOMING}dropped at start.csv"
    discovery.store.put_bytes(key, b"a,b\n5,6\n")

    requests = discovery.tick(incoming_files_sensor)

    assert [discovery.batch_keys(r) for r in requests] == [[key]], "the rest are in the ledger"
    assert discovery.listed == []


def test_a_file_whose_notification_was_lost_is_found_by_the_reconcile_listing(
    discovery: Discovery,
) -> None:
    discovery.tick(incoming_files_sensor)
    key = f"{INCOMING}lost notification.csv"
    discovery.store.put_bytes(key, b"a,b\n3,4\n")
    # The notification is lost: its page is read and dropped, and the cursor moves past it.
    cursor = DiscoveryCursor.from_json(discovery.cursors[incoming_files_sensor.name])
    page = FilerFeed.from_settings(discovery.settings).poll(cursor.feed, 1000)
    assert [c.key for c in page.changes] == [key]
    discovery.cursors[incoming_files_sensor.name] = replace(cursor, feed=page.cursor).to_json()
    assert discovery.tick(incoming_files_sensor) == []

    requests = discovery.tick(reconcile_sensor)

    assert [discovery.batch_keys(r) for r in requests] == [[key]], "only the lost file"
    assert discovery.listed == []
    assert discovery.tick(reconcile_sensor) == [], "requested once"


def test_idle_ticks_request_nothing_and_list_nothing(
    discovery: Discovery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Half a minute of the daemon's ticks (5 s and 30 s apart), back to back: from the first,
    # which reads the ledger and the record sets, to the steady ones that only ask the feed.
    assert discovery.tick(reconcile_sensor) == [], "at rest, the ledger holds every object"
    for n in range(7):
        assert discovery.tick(incoming_files_sensor) == []
        if n % 6 == 0:
            assert discovery.tick(ledger_sensor) == []
            assert discovery.tick(index_catchup_sensor) == []
    assert discovery.listed == []

    # The guard bites: without notifications the sensor falls back to listing incoming/.
    monkeypatch.setenv("KINDEX_NOTIFICATIONS", "none")
    with pytest.raises(AssertionError, match="listed incoming/"):
        discovery.tick(incoming_files_sensor)
    assert discovery.listed == [INCOMING]
