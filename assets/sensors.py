"""Sensors: new object versions under `incoming/` become partitions and runs; automation keeps
the index current. Both are declared here running by default, so `kindex up` needs no click."""

import hashlib
from collections.abc import Sequence

from dagster import (
    AssetSelection,
    AutomationConditionSensorDefinition,
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
)

from assets.files import FILE_ASSETS
from assets.index import INDEX_KEY
from assets.partitions import INCOMING_FILES
from assets.resources import KindexResource
from pipelines.sensor_cursor import ListingCursor, advance, partition_key_for

# One tick never lists more new versions than this into runs; the rest wait for the next tick.
MAX_FILES_PER_TICK = 1000
# A run processes a contiguous range of new partitions (single-run backfill policy): 20 files in
# one run took 9 s where 20 runs took 104 s. The cap keeps a run's log and memory reasonable.
MAX_FILES_PER_RUN = 250
TICK_INTERVAL_SECONDS = 5
# The automation condition normally updates the index within a tick; this only catches what an
# update racing an index run could leave behind.
CATCHUP_INTERVAL_SECONDS = 30


def new_partition_keys(
    cursor_json: str | None, listing: Sequence, existing: set[str]
) -> tuple[list[str], str, int]:
    """Partition keys to add for this listing (oldest first, never one Dagster already has),
    the next cursor, and how many new versions were deferred to the next tick."""
    step = advance(ListingCursor.from_json(cursor_json), listing, limit=MAX_FILES_PER_TICK)
    keys: list[str] = []
    for obj in step.new_objects:
        key = partition_key_for(obj)
        if key not in existing and key not in keys:
            keys.append(key)
    return keys, step.cursor.to_json(), step.deferred


def run_requests_for(partition_keys: Sequence[str]) -> list[RunRequest]:
    """As few runs as possible: each covers a contiguous range of the partitions just added."""
    requests = []
    for start in range(0, len(partition_keys), MAX_FILES_PER_RUN):
        chunk = partition_keys[start : start + MAX_FILES_PER_RUN]
        run_key = hashlib.sha256("\n".join(chunk).encode()).hexdigest()[:24]
        requests.append(
            RunRequest(
                run_key=run_key,
                asset_selection=[a.key for a in FILE_ASSETS],
                tags={
                    ASSET_PARTITION_RANGE_START_TAG: chunk[0],
                    ASSET_PARTITION_RANGE_END_TAG: chunk[-1],
                    "kindex/files": str(len(chunk)),
                },
            )
        )
    return requests


@sensor(
    name="incoming_files_sensor",
    description="Lists incoming/ and gives every new object version a partition and a run.",
    minimum_interval_seconds=TICK_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
    asset_selection=AssetSelection.assets(*FILE_ASSETS),
)
def incoming_files_sensor(context: SensorEvaluationContext, kindex: KindexResource) -> SensorResult:
    settings = kindex.settings
    listing = list(kindex.store.list(settings.incoming_prefix))
    existing = set(context.instance.get_dynamic_partitions(INCOMING_FILES.name or ""))
    keys, cursor, deferred = new_partition_keys(context.cursor, listing, existing)
    if keys or deferred:
        context.log.info(f"{len(listing)} objects listed, {len(keys)} new, {deferred} deferred")
    return SensorResult(
        run_requests=run_requests_for(keys),
        dynamic_partitions_requests=[INCOMING_FILES.build_add_request(keys)] if keys else [],
        cursor=cursor,
    )


@sensor(
    name="index_catchup_sensor",
    description="Requests an index run when the bucket holds record sets the published index "
    "lacks: a safety net under the automation condition, judged from the bucket's state.",
    minimum_interval_seconds=CATCHUP_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
    asset_selection=AssetSelection.assets(INDEX_KEY),
)
def index_catchup_sensor(context: SensorEvaluationContext, kindex: KindexResource) -> SensorResult:
    from pipelines.index.publish import unpublished_record_sets

    pending = unpublished_record_sets(kindex.store, kindex.settings)
    if not pending:
        return SensorResult(run_requests=[])
    # The same pending state gives the same run key, so a slow index run is not requested twice.
    run_key = hashlib.sha256("\n".join(pending).encode()).hexdigest()[:16]
    context.log.info(f"{len(pending)} record sets not in the index yet")
    return SensorResult(run_requests=[RunRequest(run_key=run_key, asset_selection=[INDEX_KEY])])


# Declared in code so it runs by default (the built-in one starts stopped).
automation_sensor = AutomationConditionSensorDefinition(
    name="kindex_automation",
    target=AssetSelection.all(),
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=TICK_INTERVAL_SECONDS,
    description="Updates the index after files are processed, without waiting on failed ones.",
)
