"""What a change feed reports: object changes under the incoming prefix, a page at a time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


class NotificationError(RuntimeError):
    """The feed could not be read this time (server down, certificate refused, queue missing).
    Nothing was consumed: poll again later."""


@dataclass(frozen=True, slots=True)
class ObjectChange:
    key: str  # the S3 object key, e.g. "incoming/a.csv" (decoded, not URL-encoded)
    etag: str | None  # without quotes; None when the notification does not carry it
    size: int | None
    last_modified: datetime | None  # timezone-aware UTC
    deleted: bool  # a removal (the sensor ignores these, but they are reported)


@dataclass(frozen=True, slots=True)
class ChangePage:
    changes: list[ObjectChange]  # in the order the store reported them; may repeat
    cursor: str  # opaque; pass to the next poll; store it only after acknowledge()
    receipts: tuple[str, ...] = ()  # what acknowledge() needs (SQS receipt handles)
    # Messages that held no readable S3 event: acknowledged with the rest, so they stop coming.
    ignored: int = 0
    # The feed may have lost changes made after this moment (its server restarted and its log
    # lost what it had not written down; a queue dropped messages older than its retention):
    # the caller finds what changed since by a listing before it stores the cursor.
    gap_since: datetime | None = None


class ChangeFeed(Protocol):
    name: str  # "filer" | "sqs"

    def poll(self, cursor: str | None, limit: int) -> ChangePage: ...

    def since(self, moment: datetime) -> str:
        """A cursor from which a poll reports the changes after `moment` (a feed that starts
        late replays what it may have missed; the ledger drops what it knows)."""
        ...

    def acknowledge(self, page: ChangePage) -> None:
        """After the caller durably recorded the page's changes."""
        ...


def under_prefix(key: str, prefix: str) -> bool:
    """Whether `key` names an object under `prefix` (the prefix's own folder entry does not)."""
    return key.startswith(prefix) and key != prefix and not key.endswith("/")
