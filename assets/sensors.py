"""Sensors: new object versions under `incoming/` become partitions and runs; automation keeps
the index current. Both are declared here running by default, so `kindex up` needs no click."""

import hashlib
from collections.abc import Sequence

from dagster import (
    AssetKey,
    AssetSelection,
    AutomationConditionSensorDefinition,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from assets.files import FILE_ASSETS, RECORDS_KEY
from assets.index import INDEX_KEY
from assets.partitions import INCOMING_FILES
from assets.resources import KindexResource
from pipelines.intake.sensor_cursor import TickPlan, plan_tick
from pipelines.intake.snapshots import record_reread

# One tick never lists more new versions than this into runs; the rest wait for the next tick.
MAX_FILES_PER_TICK = 1000
# A run processes a contiguous range of new partitions (single-run backfill policy): 20 files in
# one run took 9 s where 20 runs took 104 s. The cap keeps a run's log and memory reasonable.
MAX_FILES_PER_RUN = 250
TICK_INTERVAL_SECONDS = 5
# The automation condition normally updates the index within a tick; this only catches what an
# update racing an index run could leave behind.
CATCHUP_INTERVAL_SECONDS = 30
# Dagster's run tags for a run over a range of partitions (a single-run backfill): the public way
# to ask for one from a sensor in Dagster 1.13, whose RunRequest reads them back as its
# `partition_key_range`.
PARTITION_RANGE_START_TAG = "dagster/asset_partition_range_start"
PARTITION_RANGE_END_TAG = "dagster/asset_partition_range_end"


# The sensors' runs are of the records step alone; it takes each file's snapshot too
# (assets/files.py). Each asset of a run costs Dagster a planned event per file.
SENSOR_RUN_ASSETS = [RECORDS_KEY]
UNFINISHED = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


def runs_in_flight(instance: DagsterInstance) -> bool:
    """Whether any run is queued or running. The sensors that judge the whole bucket wait for
    them: a burst is judged once it has landed, not on every tick while it lands (each look
    lists the bucket, and an index published mid-burst is soon stale)."""
    return bool(instance.get_runs(filters=RunsFilter(statuses=UNFINISHED), limit=1))


def range_request(
    first: str, last: str, files: int, run_key: str, assets: Sequence[AssetKey]
) -> RunRequest:
    """One run of `assets` over the partitions from `first` to `last` (in Dagster's order)."""
    return RunRequest(
        run_key=run_key,
        asset_selection=list(assets),
        tags={
            PARTITION_RANGE_START_TAG: first,
            PARTITION_RANGE_END_TAG: last,
            "kindex/files": str(files),
        },
    )


def run_requests_for(partition_keys: Sequence[str]) -> list[RunRequest]:
    """As few runs as possible: each covers a contiguous range of the partitions just added."""
    requests = []
    for start in range(0, len(partition_keys), MAX_FILES_PER_RUN):
        chunk = partition_keys[start : start + MAX_FILES_PER_RUN]
        run_key = hashlib.sha256("\n".join(chunk).encode()).hexdigest()[:24]
        requests.append(range_request(chunk[0], chunk[-1], len(chunk), run_key, SENSOR_RUN_ASSETS))
    return requests


def tick_run_requests(plan: TickPlan) -> list[RunRequest]:
    """The runs of a tick: the new partitions in ranges; each existing partition whose version
    came back (uploaded again) in a run of its own, since they are not contiguous. A re-read one
    redoes its records (its snapshot's new read is recorded); an unread one gets its snapshot
    in the same step."""
    requests = run_requests_for(plan.new_partitions)
    for key in [*plan.reread_partitions, *plan.unread_partitions]:
        # Unique per upload (the cursor moved past it), so Dagster never drops it as a repeat.
        run_key = hashlib.sha256(f"again\n{key}\n{plan.cursor}".encode()).hexdigest()[:24]
        requests.append(range_request(key, key, 1, run_key, SENSOR_RUN_ASSETS))
    return requests


@sensor(
    name="incoming_files_sensor",
    description="Lists incoming/ and gives every new object version a partition and a run.",
    minimum_interval_seconds=TICK_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
    asset_selection=AssetSelection.assets(*FILE_ASSETS),
)
def incoming_files_sensor(context: SensorEvaluationContext, kindex: KindexResource) -> SensorResult:
    store, settings = kindex.store, kindex.settings
    listing = list(store.list(settings.incoming_prefix))
    existing = set(context.instance.get_dynamic_partitions(INCOMING_FILES.name or ""))
    plan = plan_tick(
        context.cursor,
        listing,
        existing,
        lambda obj: record_reread(store, settings, obj),
        limit=MAX_FILES_PER_TICK,
    )
    keys = plan.new_partitions
    again = len(plan.reread_partitions) + len(plan.unread_partitions)
    if keys or again or plan.deferred:
        context.log.info(
            f"{len(listing)} objects listed, {len(keys)} new, {again} uploaded again, "
            f"{plan.deferred} deferred"
        )
    return SensorResult(
        run_requests=tick_run_requests(plan),
        dynamic_partitions_requests=[INCOMING_FILES.build_add_request(keys)] if keys else [],
        cursor=plan.cursor,
    )


@sensor(
    name="index_catchup_sensor",
    description="Requests an index run when the bucket holds record sets the published index "
    "lacks and no run is in flight: a safety net under the automation condition, judged from "
    "the bucket's state.",
    minimum_interval_seconds=CATCHUP_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
    asset_selection=AssetSelection.assets(INDEX_KEY),
)
def index_catchup_sensor(context: SensorEvaluationContext, kindex: KindexResource) -> SensorResult:
    from pipelines.index.publish import unpublished_record_sets

    if runs_in_flight(context.instance):  # the automation condition follows them
        return SensorResult(run_requests=[])
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
