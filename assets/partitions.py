"""Dagster's partitions of the file assets: hourly windows of arrival (an object version's
LastModified), so their number grows with time (24 a day), never with files. Which files a
window holds is the file ledger's to say (pipelines/intake/ledger.py, which states the window)."""

from dagster import TimeWindowPartitionsDefinition

from pipelines.intake.ledger import WINDOW_FORMAT

ARRIVAL_WINDOWS = TimeWindowPartitionsDefinition(
    cron_schedule="0 * * * *",
    start="2026-01-01-00:00",
    fmt=WINDOW_FORMAT,
    timezone="UTC",
    # The current hour is a window too: a file is processed in the hour it arrives.
    end_offset=1,
)
