"""The reconcile sensor: the safety net under the notifications.

Notifications are at least once and may be late, or lost. Every RECONCILE_INTERVAL_SECONDS this
sensor lists `incoming/` and compares it with the file ledger: a listed version the ledger has no
row of is missing, and gets a pending row and a batch run like a new file. Its first tick (when
the daemon starts) also moves a home without a ledger onto one: the ledger is rebuilt from the
bucket (pipelines/intake/ledger.py `rebuild`), with nothing re-processed that was processed.
The missing count is in the tick's log and, when it changes, an observation of `records`.
"""

from __future__ import annotations

import json

from dagster import (
    AssetObservation,
    DefaultSensorStatus,
    MetadataValue,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.conventions import RECORDS_KEY
from assets.files import ingest_batch
from assets.partitions import ARRIVAL_WINDOWS
from assets.resources import KindexResource
from assets.sensors import RECONCILE_EVERY, batch_requests, batch_result, runs_in_flight
from pipelines.intake.ledger import FileEntry, FileState, new_versions, rebuild
from pipelines.sources import current_parser_versions

RECONCILE_INTERVAL_SECONDS = int(RECONCILE_EVERY.total_seconds())


@sensor(
    name="reconcile_sensor",
    description="Lists incoming/ now and then and requests the object versions the file ledger "
    "lacks (a lost notification); rebuilds a missing ledger from the bucket.",
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
    listing = [o for o in store.list(settings.incoming_prefix) if not o.key.endswith("/")]
    if not ledger.exists():
        entries = rebuild(store, settings, listing, current_parser_versions())
        ledger.create()  # made, even empty: the next tick finds it
        ledger.append([e for e in entries if e.state is not FileState.PENDING])
        missing = [e for e in entries if e.state is FileState.PENDING]
        context.log.info(
            f"the ledger was rebuilt from the bucket: {len(entries) - len(missing)} versions "
            f"processed, {len(missing)} to process"
        )
        windows = {e.arrival_window for e in entries}
    else:
        known = ledger.known_versions()
        missing = [FileEntry.pending(store.bucket, o) for o in new_versions(listing, known)]
        windows = {e.arrival_window for e in known.values()}
    # Windows the ledger holds that are no partition yet: a home of a kindex before them.
    windows -= set(context.instance.get_dynamic_partitions(str(ARRIVAL_WINDOWS.name)))
    requests = batch_requests(ledger, missing, "reconcile") if missing else []
    context.log.info(f"{len(missing)} of {len(listing)} object versions missing from the ledger")
    last = json.loads(context.cursor) if context.cursor else None
    events = []
    if last != len(missing):
        events.append(
            AssetObservation(
                RECORDS_KEY,
                metadata={
                    "missing_versions": MetadataValue.int(len(missing)),
                    "object_versions": MetadataValue.int(len(listing)),
                },
            )
        )
    return batch_result(requests, json.dumps(len(missing)), windows, asset_events=events)
