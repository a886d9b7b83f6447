"""The reconcile sensor: the safety net under the notifications.

Notifications are at least once and may be late, or lost. Every RECONCILE_INTERVAL_SECONDS this
sensor compares what changed in the bucket since its last tick with the file ledger
(pipelines/intake/reconcile.py `changed_versions`: the newest S3 Inventory report on AWS, the
embedded server's filer log, or a window of keys): a version the ledger has no row of is
missing, and gets a pending row and a batch run like a new file. It never lists the whole
bucket by itself: the `reconcile_bucket` job does, when a user asks (`full`), and its missing
versions become pending rows that the ledger sensor requests. Its first tick (when the daemon
starts) also moves a home without a ledger onto one: the ledger is rebuilt from the bucket
(pipelines/intake/ledger.py `rebuild`), with nothing re-processed that was processed. The
missing count is in the tick's log and, when it changes, an observation of `records`.
"""

from dagster import (
    AssetObservation,
    Config,
    DefaultSensorStatus,
    MetadataValue,
    OpExecutionContext,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    job,
    op,
    sensor,
)

from assets.conventions import RECORDS_KEY
from assets.files import ingest_batch, log_event
from assets.partitions import ARRIVAL_WINDOWS
from assets.published import check, full_check
from assets.resources import KindexResource
from assets.sensors import RECONCILE_EVERY, batch_requests, batch_result, runs_in_flight
from pipelines.intake.ledger import FileEntry, FileState, Ledger, new_versions, rebuild, undone
from pipelines.intake.reconcile import ReconcileCursor, ReconcileStep, changed_versions
from pipelines.sources import current_parser_versions
from pipelines.storage.base import ObjectStore

RECONCILE_INTERVAL_SECONDS = int(RECONCILE_EVERY.total_seconds())


def missing_entries(store: ObjectStore, ledger: Ledger, step: ReconcileStep) -> list[FileEntry]:
    """The versions of a step the ledger has no row of (read from their windows' partitions)."""
    known = ledger.seen(step.versions)
    return [FileEntry.pending(store.bucket, o) for o in new_versions(step.versions, known)]


def reconcile_tick(
    kindex: KindexResource, cursor: ReconcileCursor, *, full: bool = False
) -> tuple[ReconcileStep, list[FileEntry]]:
    """One reconcile tick without Dagster's requests: what changed, and which of it the ledger
    lacks (a benchmark times this)."""
    step = changed_versions(kindex.store, kindex.settings, cursor, feed=kindex.feed, full=full)
    return step, missing_entries(kindex.store, kindex.ledger, step)


@sensor(
    name="reconcile_sensor",
    description="Compares what changed in incoming/ (the newest S3 Inventory report, the filer "
    "log, or a window of keys) with the file ledger and requests the versions it lacks (a lost "
    "notification); rebuilds a missing ledger from the bucket.",
    minimum_interval_seconds=RECONCILE_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
    job=ingest_batch,
)
def reconcile_sensor(
    context: SensorEvaluationContext, kindex: KindexResource
) -> SensorResult | SkipReason:
    if runs_in_flight(context.instance):
        # Their files are pending in the ledger already; judged once they are done.
        return SkipReason("runs in flight: the bucket is judged once they finish")
    store, settings, ledger = kindex.store, kindex.settings, kindex.ledger
    cursor = ReconcileCursor.from_json(context.cursor)
    windows: set[str] = set()
    if not ledger.exists():
        # A home without a ledger: the bucket is listed once, to rebuild it.
        listing = [o for o in store.list(settings.incoming_prefix) if not o.key.endswith("/")]
        entries = rebuild(store, settings, listing, current_parser_versions())
        ledger.create()  # made, even empty: the next tick finds it
        ledger.append([e for e in entries if e.state is not FileState.PENDING])
        missing = [e for e in entries if e.state is FileState.PENDING]
        context.log.info(
            f"the ledger was rebuilt from the bucket: {len(entries) - len(missing)} versions "
            f"processed, {len(missing)} to process"
        )
        windows = {e.arrival_window for e in entries}
        step = ReconcileStep(listing, "full", cursor, len(listing))
    else:
        step, missing = reconcile_tick(kindex, cursor)
        windows = {e.arrival_window for e in missing}
    # Windows the ledger holds that are no partition yet: a home of a kindex before them.
    windows -= set(context.instance.get_dynamic_partitions(str(ARRIVAL_WINDOWS.name)))
    requests = batch_requests(ledger, missing, "reconcile", found=True) if missing else []
    context.log.info(
        f"{len(missing)} of {len(step.versions)} object versions ({step.source}) missing from "
        "the ledger"
    )
    events = []
    if cursor.missing != len(missing):
        events.append(
            AssetObservation(
                RECORDS_KEY,
                metadata={
                    "missing_versions": MetadataValue.int(len(missing)),
                    "object_versions": MetadataValue.int(len(step.versions)),
                    "source": MetadataValue.text(step.source),
                },
            )
        )
    after = ReconcileCursor(
        len(missing),
        step.cursor.feed,
        step.cursor.inventory,
        step.cursor.inventory_at,
        step.cursor.after,
    )
    return batch_result(requests, after.to_json(), windows, asset_events=events)


class ReconcileConfig(Config):
    """`full`: list every object under incoming/ (what the sensor never does by itself)."""

    full: bool = True


@op(name="reconcile_incoming")
def reconcile_bucket_op(
    context: OpExecutionContext, config: ReconcileConfig, kindex: KindexResource
) -> None:
    store, ledger = kindex.store, kindex.ledger
    step = changed_versions(
        store, kindex.settings, ReconcileCursor(), feed=kindex.feed, full=config.full
    )
    # A full listing is compared with the whole ledger in one read (not key by key).
    known = ledger.known_versions() if config.full else ledger.seen(step.versions)
    missing = [FileEntry.pending(store.bucket, o) for o in new_versions(step.versions, known)]
    # Pending rows with no run: the ledger sensor requests them once they are stale.
    ledger.append(missing)
    context.log.info(
        f"{len(missing)} of {len(step.versions)} object versions ({step.source}) missing from "
        "the ledger: pending, requested by the ledger sensor"
    )
    if config.full:
        # The index's every_version_processed check, over the listing (a publish's reads
        # only what the sensors found).
        not_done = undone(step.versions, known)
        log_event(
            context,
            check("every_version_processed", lambda _: full_check(step.versions, not_done), kindex),
        )


@job(
    name="reconcile_bucket",
    description="Compares incoming/ with the file ledger on request (`kindex reconcile`); "
    "`full: true` (the default) lists every object and reports the index's "
    "every_version_processed check over the listing. The versions the ledger lacks become "
    "pending rows, which the ledger sensor requests.",
)
def reconcile_bucket() -> None:
    reconcile_bucket_op()
