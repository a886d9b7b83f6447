"""What a gap in a change feed may have hidden: the objects under the prefix modified since.

A feed reports a gap (`ChangePage.gap_since`) when changes after some moment may have no event:
the embedded server restarted and its filer lost the log it held in memory, or an SQS queue went
unread longer than it keeps a message. The files written since are in the bucket, so a listing
finds them at once instead of the reconciliation's next tick.

S3 LIST has no time filter: the listing reads every key under the prefix, once per gap (a rare
event, never a tick's routine), and keeps only the objects modified since the gap began, less
the time an upload may show the LastModified of its start. Only those are compared with the
file ledger, so the ledger's side costs what changed.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pipelines.intake.sensor_cursor import DEFAULT_OVERLAP as LATE_VISIBILITY
from pipelines.storage.base import ObjectInfo, ObjectStore

__all__ = ["LATE_VISIBILITY", "changed_since"]


def changed_since(
    store: ObjectStore, prefix: str, moment: datetime, late: timedelta = LATE_VISIBILITY
) -> list[ObjectInfo]:
    """The objects under `prefix` whose LastModified is at or after `moment` less `late` (an
    upload that became visible late), in the listing's order; folders are no objects."""
    floor = moment - late
    return [o for o in store.list(prefix) if not o.key.endswith("/") and o.last_modified >= floor]
