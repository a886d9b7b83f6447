"""Change-notification feeds: what is new in `incoming/`, from the store's own notifications
instead of a listing of the whole prefix (which costs what the bucket holds, not what is new).

- `filer`: the embedded SeaweedFS's filer metadata log (`filer.py`), over its mTLS gRPC port.
- `sqs`: S3 event notifications in an SQS queue (`sqs.py`), as deploy/ wires them on AWS.

Both are at least once and may be late; a periodic reconciliation listing stays the safety
net. Plain Python: the sensor in `assets/` polls a feed, records the changes, acknowledges the
page and only then stores its cursor. See docs/notifications.md.
"""

from __future__ import annotations

from pipelines.intake.notifications.changes import (
    ChangeFeed,
    ChangePage,
    NotificationError,
    ObjectChange,
    under_prefix,
)
from pipelines.intake.notifications.filer import FilerFeed
from pipelines.intake.notifications.sqs import SqsFeed
from pipelines.settings import Settings

__all__ = [
    "ChangeFeed",
    "ChangePage",
    "FilerFeed",
    "NotificationError",
    "ObjectChange",
    "SqsFeed",
    "change_feed",
    "under_prefix",
]


def change_feed(settings: Settings) -> ChangeFeed | None:
    """The feed `KINDEX_NOTIFICATIONS` selects (see `Settings.notification_kind`); None when
    there is none and the listing alone finds new objects."""
    kind = settings.notification_kind
    if kind == "filer":
        return FilerFeed.from_settings(settings)
    if kind == "sqs":
        return SqsFeed.from_settings(settings)
    return None
