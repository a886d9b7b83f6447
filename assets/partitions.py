"""Dagster's partitions of the file assets: the hours in which files arrived (an object
version's LastModified). A window is added by whatever first requests a run of one of its files
(the sensors, `windows_request`), so the partitions are the hours that hold files: a new home has
none, an hour with no file is no partition (never "missing"), and a backfill of "all" or
"missing" windows launches only hours that hold files. Which files a window holds is the file
ledger's to say (pipelines/intake/ledger.py, which states the window and its format)."""

from collections.abc import Iterable

from dagster import AddDynamicPartitionsRequest, DynamicPartitionsDefinition

ARRIVAL_WINDOWS = DynamicPartitionsDefinition(name="arrival_windows")


def windows_request(windows: Iterable[str]) -> list[AddDynamicPartitionsRequest]:
    """The request that adds these windows (the daemon skips those that exist already)."""
    names = sorted(set(windows))
    if not names:
        return []
    return [
        AddDynamicPartitionsRequest(
            partitions_def_name=str(ARRIVAL_WINDOWS.name), partition_keys=names
        )
    ]
