"""The kindex Dagster code location: `dagster dev -m definitions`, `dg check defs`, `kindex up`."""

from dagster import Definitions, in_process_executor

from assets.files import FILE_ASSETS, ingest_batch, reprocess_files
from assets.index import index, publish_index
from assets.lost_runs import lost_runs_sensor
from assets.published import TABLE_SPECS
from assets.reconcile import reconcile_bucket, reconcile_sensor
from assets.resources import KindexResource
from assets.sensors import incoming_files_sensor, index_catchup_sensor, ledger_sensor

defs = Definitions(
    assets=[*FILE_ASSETS, index, *TABLE_SPECS],
    jobs=[ingest_batch, publish_index, reprocess_files, reconcile_bucket],
    sensors=[
        incoming_files_sensor,
        ledger_sensor,
        reconcile_sensor,
        index_catchup_sensor,
        lost_runs_sensor,
    ],
    resources={"kindex": KindexResource.from_env()},
    # One process per run, not per step: a run over many files is one Python process.
    executor=in_process_executor,
)
