"""Sensors: new object versions become pending rows of the file ledger and batch runs.

- `incoming_files_sensor` reads the store's change notifications (the embedded SeaweedFS's filer
  subscription, or S3 events in SQS: pipelines/intake/notifications/); where none are
  configured, it lists `incoming/` with a cursor that cannot miss a file. When the feed reports
  a gap (the embedded server restarted and lost the events it held), it lists what changed
  since, at once (pipelines/intake/notifications/gaps.py).
- `ledger_sensor` requests again what the ledger says is due: failed files whose backoff has
  passed, and pending files whose run never reported.
- `index_catchup_sensor` publishes record sets the index lacks, once the ledger moved and no run
  is in flight (a batch run publishes its own; this covers one that died in between).

All run by default, so `kindex up` needs no click. Whatever finds a file writes its pending row
before it requests the file's run: a run that is lost is found again from the ledger.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TypedDict, Unpack

from dagster import (
    AssetCheckEvaluation,
    AssetMaterialization,
    AssetObservation,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.files import batches_waiting, ingest_batch
from assets.index import publish_index
from assets.partitions import windows_request
from assets.resources import KindexResource
from pipelines.index.publish import unpublished_record_sets
from pipelines.ingest import bounded_batches
from pipelines.intake.ledger import (
    FileEntry,
    FileState,
    Ledger,
    OpenAt,
    due_among,
    new_versions,
    version_of,
)
from pipelines.intake.notifications import ChangeFeed, NotificationError, ObjectChange
from pipelines.intake.notifications.gaps import changed_since
from pipelines.intake.sensor_cursor import ListingCursor, advance
from pipelines.storage.base import ObjectInfo, ObjectStore

# One tick never takes more new versions than this; the rest wait for the next tick.
MAX_FILES_PER_TICK = 1000
# Under the daemon's loop of 5 s, so that every loop ticks: at 5, a tick that came a moment late
# makes the next loop skip it, and files wait 10 s.
TICK_INTERVAL_SECONDS = 4
LEDGER_INTERVAL_SECONDS = 30
CATCHUP_INTERVAL_SECONDS = 30
# A listing costs what the bucket holds, so it is the rare safety net under the notifications,
# not the way files are found: a file whose notification was lost waits at most this long.
RECONCILE_EVERY = timedelta(minutes=15)
# While batch runs wait for a run slot, the files found meanwhile wait for a later tick too: they
# then join one batch, instead of a run each behind the queue (a run pays its start, a publish and
# a report whatever its size). At most this long, so that a queue that never drains never stops
# discovery.
HOLD_WHILE_QUEUED = timedelta(seconds=60)
# A pending file whose batch has not reported for this long, with no run in flight, is
# requested again (its run was lost before it started, or killed).
STALE_PENDING = timedelta(minutes=5)
clock = time.time  # the sensors' notion of now (tests move it)
UNFINISHED = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


def now_utc() -> datetime:
    return datetime.fromtimestamp(clock(), UTC)


def runs_in_flight(instance: DagsterInstance) -> bool:
    """Whether any run is queued or running."""
    return bool(instance.get_runs(filters=RunsFilter(statuses=UNFINISHED), limit=1))


def batch_requests(
    ledger: Ledger, entries: Sequence[FileEntry], why: str, *, found: bool = False
) -> list[RunRequest]:
    """Runs for these files: a batch per arrival window, bounded in files and bytes
    (`bounded_batches`), written to the ledger as pending (one commit) before any run is
    requested. `found`: versions a tick found new; those another tick wrote to the ledger since
    this one read it are left to that tick's runs (`Ledger.append_unseen`)."""
    by_window: dict[str, list[FileEntry]] = {}
    for entry in entries:
        by_window.setdefault(entry.arrival_window, []).append(entry)
    pending: list[FileEntry] = []
    for _, files in sorted(by_window.items()):
        for indexes in bounded_batches([e.size for e in files]):
            chunk = [files[i] for i in indexes]
            batch = batch_id(chunk)
            pending += [
                replace(e, state=FileState.PENDING, batch=batch, updated_at=None) for e in chunk
            ]
    if found:
        pending = ledger.append_unseen(pending)
    else:
        ledger.append(pending)
    batches: dict[str, list[FileEntry]] = {}
    for entry in pending:
        batches.setdefault(str(entry.batch), []).append(entry)
    return [
        RunRequest(
            run_key=batch,
            partition_key=files[0].arrival_window,
            run_config=batch_run_config(batch),
            tags={"kindex/files": str(len(files)), "kindex/why": why},
        )
        for batch, files in batches.items()
    ]


class ResultEvents(TypedDict, total=False):
    """What a sensor's result may report besides its runs."""

    asset_events: Sequence[AssetMaterialization | AssetObservation | AssetCheckEvaluation]


def batch_result(
    requests: Sequence[RunRequest],
    cursor: str,
    windows: Iterable[str] = (),
    **more: Unpack[ResultEvents],
) -> SensorResult:
    """The sensor's result: the runs, and the windows they need as partitions (added first),
    with `windows` besides."""
    return SensorResult(
        run_requests=list(requests),
        dynamic_partitions_requests=windows_request(
            [*windows, *(r.partition_key for r in requests if r.partition_key)]
        ),
        cursor=cursor,
        **more,
    )


def batch_run_config(batch: str) -> dict[str, object]:
    """The run config of a run of `records` over the batch the ledger names `batch`."""
    return {"ops": {"records": {"config": {"batch": batch}}}}


def batch_of(request: RunRequest) -> str:
    """The batch a run request of `batch_requests` names."""
    return str((request.run_config or {})["ops"]["records"]["config"]["batch"])


def batch_id(files: Sequence[FileEntry]) -> str:
    """Unique per request: the same files asked for again are another batch."""
    text = "\n".join(f"{e.key}\0{e.etag}\0{e.last_modified.isoformat()}" for e in files)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{digest}-{secrets.token_hex(3)}"


def versions_of_changes(store: ObjectStore, changes: Iterable[ObjectChange]) -> list[ObjectInfo]:
    """The object versions the notifications name, once each: a notification without an ETag
    or a time is completed by a HEAD (one that names a version gone since is dropped: the
    notification of what replaced it follows)."""
    found: dict[tuple[str, str, datetime], ObjectInfo] = {}
    for change in changes:
        if change.deleted or change.key.endswith("/"):
            continue
        info: ObjectInfo | None
        if change.etag and change.last_modified is not None:
            info = ObjectInfo(change.key, change.etag, change.size or 0, change.last_modified)
        else:
            info = store.head(change.key)
        if info is not None:
            found.setdefault(version_of(info), info)
    return list(found.values())


@dataclass(frozen=True, slots=True)
class DiscoveryCursor:
    feed: str | None = None  # the notification feed's position
    listing: str | None = None  # the listing cursor, where no feed is configured
    held_since: float | None = None  # since when new files wait for queued batches to start

    def to_json(self) -> str:
        held = {"held_since": self.held_since} if self.held_since is not None else {}
        return json.dumps({"feed": self.feed, "listing": self.listing, **held}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> DiscoveryCursor:
        if not text:
            return cls()
        try:
            data = json.loads(text)
        except ValueError:
            return cls()
        if not isinstance(data, dict) or "listing" not in data:
            return cls()  # a cursor of the listing-only sensor: start over (the ledger dedups)
        held = data.get("held_since")
        return cls(data.get("feed"), data.get("listing"), float(held) if held else None)


@sensor(
    name="incoming_files_sensor",
    description="Finds new object versions under incoming/ from the store's notifications (or a "
    "listing where none are configured), writes them to the file ledger and requests a run "
    "per batch.",
    minimum_interval_seconds=TICK_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
    job=ingest_batch,
)
def incoming_files_sensor(
    context: SensorEvaluationContext, kindex: KindexResource
) -> SensorResult | SkipReason:
    cursor = DiscoveryCursor.from_json(context.cursor)
    if batches_waiting(context.instance):
        now, held = clock(), cursor.held_since
        if held is None or now - held < HOLD_WHILE_QUEUED.total_seconds():
            # Nothing read: the feed (or the listing) gives these files to the next tick.
            return SensorResult(
                skip_reason="batch runs wait for a run slot: new files join a later batch",
                cursor=replace(cursor, held_since=now if held is None else held).to_json(),
            )
    cursor = replace(cursor, held_since=None)
    feed = kindex.feed
    if feed is None:
        return listed_files(context, kindex, cursor)
    return notified_files(context, kindex, feed, cursor)


def notified_files(
    context: SensorEvaluationContext,
    kindex: KindexResource,
    feed: ChangeFeed,
    cursor: DiscoveryCursor,
) -> SensorResult | SkipReason:
    # The first poll replays what the feed may have missed before it started: as far back as
    # the reconcile listing, which may have listed the bucket just before those files came.
    start = cursor.feed if cursor.feed is not None else feed.since(now_utc() - RECONCILE_EVERY)
    try:
        page = feed.poll(start, MAX_FILES_PER_TICK)
    except NotificationError as error:  # nothing consumed: the next tick asks again
        return SkipReason(f"the {feed.name} notifications cannot be read now: {error}")
    # An idle tick's page is empty: no S3 client, no ledger, nothing but the poll.
    versions = versions_of_changes(kindex.store, page.changes) if page.changes else []
    why = "new"
    if page.gap_since is not None:
        # Changes since then may have no event: what the bucket shows since is looked at now,
        # not at the reconciliation's next tick. Listed before the ledger is written, so a
        # failure here leaves nothing half done: no cursor is stored, and the next tick's poll
        # reports the same gap.
        listed = changed_since(kindex.store, kindex.settings.incoming_prefix, page.gap_since)
        notified = {version_of(v) for v in versions}
        unnotified = [v for v in listed if version_of(v) not in notified]
        versions, why = [*versions, *unnotified], "gap"
        context.log.warning(
            f"the {feed.name} feed has a gap since {page.gap_since.isoformat()}: "
            f"{len(listed)} object versions modified since, {len(unnotified)} not notified"
        )
    requests = new_file_requests(kindex, versions, why)
    feed.acknowledge(page)  # recorded in the ledger: the store need not tell again
    if requests:
        context.log.info(
            f"{len(page.changes)} notifications, {len(versions)} versions, {len(requests)} batches"
        )
    return batch_result(requests, replace(cursor, feed=page.cursor).to_json())


def listed_files(
    context: SensorEvaluationContext, kindex: KindexResource, cursor: DiscoveryCursor
) -> SensorResult:
    store, settings = kindex.store, kindex.settings
    listing = [o for o in store.list(settings.incoming_prefix) if not o.key.endswith("/")]
    step = advance(ListingCursor.from_json(cursor.listing), listing, limit=MAX_FILES_PER_TICK)
    requests = new_file_requests(kindex, step.new_objects)
    if requests or step.deferred:
        context.log.info(
            f"{len(listing)} objects listed, {len(step.new_objects)} new, {step.deferred} deferred"
        )
    return batch_result(requests, replace(cursor, listing=step.cursor.to_json()).to_json())


def new_file_requests(
    kindex: KindexResource, versions: Sequence[ObjectInfo], why: str = "new"
) -> list[RunRequest]:
    """Runs for the versions the ledger has no row of (asking it about those versions only:
    the partitions of their arrival windows)."""
    if not versions:
        return []
    known = kindex.ledger.seen(versions)
    bucket = kindex.store.bucket
    new = [FileEntry.pending(bucket, info) for info in new_versions(versions, known)]
    return batch_requests(kindex.ledger, new, why, found=True)


@dataclass(frozen=True, slots=True)
class LedgerCursor:
    head: int | None = None  # the ledger commit the last look saw
    waiting: bool = False  # failed or pending files were left then: look again anyway
    # The open versions the last look knew, at the commit it read: the next reads only the
    # rows appended since (absent: it reads the ledger's open windows).
    open: OpenAt | None = None

    def to_json(self) -> str:
        kept = self.open.to_json() if self.open is not None else None
        return json.dumps({"head": self.head, "waiting": self.waiting, "open": kept})

    @classmethod
    def from_json(cls, text: str | None) -> LedgerCursor:
        if not text:
            return cls()
        data = json.loads(text)
        return cls(data.get("head"), bool(data.get("waiting")), OpenAt.from_json(data.get("open")))


@sensor(
    name="ledger_sensor",
    description="Requests again the files the ledger says are due: failed ones whose backoff "
    "has passed, pending ones whose run never reported, and pending ones a batch marked due "
    "again (their rows awaited a file it brought).",
    minimum_interval_seconds=LEDGER_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
    job=ingest_batch,
)
def ledger_sensor(
    context: SensorEvaluationContext, kindex: KindexResource
) -> SensorResult | SkipReason:
    cursor = LedgerCursor.from_json(context.cursor)
    ledger = kindex.ledger
    head = ledger.head()
    if head == cursor.head and not cursor.waiting:
        return SkipReason("the ledger has not changed and nothing waits")
    now = now_utc()
    # At the head just read (its metadata read once by a tick that requests nothing), from the
    # open versions the last tick knew and the rows appended since.
    known = ledger.open_at_head(cursor.open)
    open_now = known.entries if known is not None else ()
    due = due_among(open_now, now, stale_before=now - STALE_PENDING)
    if runs_in_flight(context.instance):  # a pending file may be in one of them
        due = [e for e in due if e.state is FileState.FAILED]
    requests = batch_requests(ledger, due, "retry") if due else []
    if due:
        context.log.info(f"requesting {len(due)} files again in {len(requests)} batches")
        head = ledger.head()  # the commit of their pending rows: they wait (the next tick reads it)
    waiting = bool(due) or bool(open_now)
    return batch_result(requests, LedgerCursor(head, waiting, known).to_json())


@sensor(
    name="index_catchup_sensor",
    description="Requests an index run when the bucket holds record sets the published index "
    "lacks and no run is in flight: a batch run that died between its record sets and its "
    "publish. Looks only after the ledger moved.",
    minimum_interval_seconds=CATCHUP_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
    job=publish_index,
)
def index_catchup_sensor(
    context: SensorEvaluationContext, kindex: KindexResource
) -> SensorResult | SkipReason:
    cursor = LedgerCursor.from_json(context.cursor)
    head = kindex.ledger.head()
    if head == cursor.head and not cursor.waiting:
        return SkipReason("the ledger has not changed")
    if runs_in_flight(context.instance):  # they publish; judged once they are done
        return SkipReason("runs in flight")
    pending = unpublished_record_sets(kindex.store, kindex.settings)
    requests = []
    if pending:
        # The same pending state gives the same run key: a slow index run is not asked twice.
        run_key = hashlib.sha256("\n".join(pending).encode()).hexdigest()[:16]
        context.log.info(f"{len(pending)} record sets not in the index yet")
        requests = [RunRequest(run_key=run_key)]
    return SensorResult(run_requests=requests, cursor=LedgerCursor(head, bool(pending)).to_json())
