"""AWS's change feed: S3 event notifications delivered to an SQS queue (deploy/ wires them).

The queue is the cursor: a received message stays in the queue, invisible for the queue's
visibility timeout, until `acknowledge` deletes it; one received and never acknowledged (the
sensor crashed) comes again. Delivery is at least once and sometimes late, so the
reconciliation listing stays. Receives are short polls (`WaitTimeSeconds=0`), so a sensor tick
never waits on an empty queue; a short poll samples some of SQS's servers, and a message it
misses comes with the next one.

A message is an S3 event (`Records[]`), S3's `s3:TestEvent` (sent when the notification is
configured), or either inside an SNS envelope (`Message`) for a bucket that notifies a topic
the queue subscribes to. Anything else is counted as ignored and acknowledged with the page, so
it does not come back forever.

The queue keeps a message for its retention period (14 days as deploy/ creates it, 4 by
default) and then drops it unread. So the cursor holds the time of the last poll: a poll that
comes longer than the retention after it reports a gap since then (`ChangePage.gap_since`),
for the caller to list. A restart of the consumer, or of S3, is no gap: the messages wait.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol, TypedDict
from urllib.parse import unquote_plus

from botocore.config import Config
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipelines.intake.notifications.changes import ChangePage, ObjectChange, under_prefix
from pipelines.settings import Settings
from pipelines.storage.s3 import boto_session, client_lock

log = logging.getLogger(__name__)

RECEIVE_BATCH = 10  # SQS's most messages per ReceiveMessage and per DeleteMessageBatch
CREATED_PREFIX = "ObjectCreated:"
REMOVED_PREFIX = "ObjectRemoved:"
TEST_EVENT = "s3:TestEvent"
# SQS keeps a message at least this long (its smallest MessageRetentionPeriod): a poll sooner
# after the last one cannot have lost any, and does not ask the queue its retention.
MIN_RETENTION = timedelta(seconds=60)
RETENTION_ATTRIBUTE = "MessageRetentionPeriod"


class SqsMessage(TypedDict, total=False):
    MessageId: str
    ReceiptHandle: str
    Body: str


class ReceiveResponse(TypedDict, total=False):
    Messages: list[SqsMessage]


class DeleteFailure(TypedDict, total=False):
    Id: str
    Code: str


class DeleteResponse(TypedDict, total=False):
    Failed: list[DeleteFailure]


class QueueAttributes(TypedDict, total=False):
    Attributes: dict[str, str]


class SqsClient(Protocol):
    """The calls the feed makes, as boto3's SQS client takes and answers them."""

    def receive_message(
        self,
        *,
        QueueUrl: str,  # boto3's parameter names
        MaxNumberOfMessages: int,
        WaitTimeSeconds: int,
        VisibilityTimeout: int = ...,
    ) -> ReceiveResponse: ...

    def delete_message_batch(
        self,
        *,
        QueueUrl: str,
        Entries: list[dict[str, str]],
    ) -> DeleteResponse: ...

    def get_queue_attributes(
        self, *, QueueUrl: str, AttributeNames: list[str]
    ) -> QueueAttributes: ...


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True)


class _S3Bucket(_Model):
    name: str


class _S3Object(_Model):
    key: str  # URL-encoded, spaces as '+'
    size: int | None = None  # absent from ObjectRemoved events
    e_tag: str | None = Field(default=None, alias="eTag")


class _S3Entity(_Model):
    bucket: _S3Bucket
    object: _S3Object


class _S3Record(_Model):
    event_name: str = Field(alias="eventName")
    event_time: datetime | None = Field(default=None, alias="eventTime")
    s3: _S3Entity


class _S3Message(_Model):
    records: list[_S3Record] = Field(alias="Records")


class _TestEvent(_Model):
    event: Literal["s3:TestEvent"] = Field(alias="Event")


class _SnsEnvelope(_Model):
    message: str = Field(alias="Message")


class _CursorModel(_Model):
    polled_at: datetime = Field(alias="polledAt")


@dataclass(frozen=True, slots=True)
class SqsCursor:
    """When the feed last polled the queue (the queue itself holds what was not read)."""

    polled_at: datetime  # timezone-aware

    def to_text(self) -> str:
        return json.dumps({"polledAt": self.polled_at.isoformat()}, separators=(",", ":"))

    @classmethod
    def from_text(cls, text: str | None) -> SqsCursor | None:
        """The cursor `text` holds; None for none ("", the cursor before the time was kept), an
        unreadable one, or another feed's."""
        if not text:
            return None
        try:
            model = _CursorModel.model_validate_json(text)
        except ValidationError:
            return None
        if model.polled_at.tzinfo is None:
            return None
        return cls(model.polled_at)


class SqsFeed:
    """Changes under `prefix` of `bucket` from the S3 event notifications in `queue_url`."""

    name = "sqs"

    def __init__(
        self,
        queue_url: str,
        *,
        bucket: str,
        prefix: str,
        client: SqsClient,
        visibility_timeout: int | None = None,
    ) -> None:
        self.queue_url = queue_url
        self.bucket = bucket
        self.prefix = prefix
        self.client = client
        # None: the queue's own (deploy/ sets it); the time a page has to be acknowledged.
        self.visibility_timeout = visibility_timeout
        self._retention: timedelta | None = None  # the queue's, asked once when needed

    @classmethod
    def from_settings(cls, settings: Settings) -> SqsFeed:
        if settings.sqs_queue_url is None:
            raise ValueError("KINDEX_SQS_QUEUE_URL is not set")
        return cls(
            settings.sqs_queue_url,
            bucket=settings.bucket,
            prefix=settings.incoming_prefix,
            client=make_sqs_client(settings),
        )

    def poll(self, cursor: str | None, limit: int) -> ChangePage:
        """Up to `limit` changes (a message of several records may add a few more)."""
        if limit < 1:
            raise ValueError(f"limit must be 1 or more, got {limit}")
        changes: list[ObjectChange] = []
        receipts: list[str] = []
        ignored = 0
        # Before the receives: a message sent during them is after the next poll's start.
        polled_at = datetime.fromtimestamp(time.time(), UTC)
        # Each receive hides what it returns, so the loop ends; the bound keeps a tick short
        # when most messages are someone else's.
        for _ in range(limit // RECEIVE_BATCH + 2):
            if len(changes) >= limit:
                break
            count = min(RECEIVE_BATCH, limit - len(changes))
            response = (
                self.client.receive_message(
                    QueueUrl=self.queue_url, MaxNumberOfMessages=count, WaitTimeSeconds=0
                )
                if self.visibility_timeout is None
                else self.client.receive_message(
                    QueueUrl=self.queue_url,
                    MaxNumberOfMessages=count,
                    WaitTimeSeconds=0,
                    VisibilityTimeout=self.visibility_timeout,
                )
            )
            messages = response.get("Messages", [])
            if not messages:
                break
            for message in messages:
                receipt = message.get("ReceiptHandle")
                if receipt is not None:
                    receipts.append(receipt)
                found = self.changes_of(message.get("Body", ""))
                if found is None:
                    ignored += 1
                    log.warning("ignored SQS message %s: not an S3 event", message.get("MessageId"))
                else:
                    changes.extend(found)
        return ChangePage(
            changes,
            SqsCursor(polled_at).to_text(),
            tuple(receipts),
            ignored,
            gap_since=self._gap_since(SqsCursor.from_text(cursor), polled_at),
        )

    def _gap_since(self, last: SqsCursor | None, now: datetime) -> datetime | None:
        """The last poll's time, where it is older than what the queue keeps: messages sent
        after it may have expired unread."""
        if last is None or now - last.polled_at < MIN_RETENTION:
            return None
        if now - last.polled_at < self.retention():
            return None
        log.warning(
            "the SQS queue was last polled at %s, longer ago than it keeps a message",
            last.polled_at.isoformat(),
        )
        return last.polled_at

    def retention(self) -> timedelta:
        """How long the queue keeps a message (its MessageRetentionPeriod)."""
        if self._retention is None:
            response = self.client.get_queue_attributes(
                QueueUrl=self.queue_url, AttributeNames=[RETENTION_ATTRIBUTE]
            )
            seconds = int(response.get("Attributes", {}).get(RETENTION_ATTRIBUTE, "0"))
            self._retention = timedelta(seconds=seconds) if seconds > 0 else MIN_RETENTION
        return self._retention

    def since(self, moment: datetime) -> str:
        """The queue keeps what was not acknowledged: there is nothing to go back to."""
        return ""

    def acknowledge(self, page: ChangePage) -> None:
        """Delete the page's messages. One SQS failed to delete (its receipt expired: it was
        delivered again) comes once more: at least once."""
        for start in range(0, len(page.receipts), RECEIVE_BATCH):
            batch = page.receipts[start : start + RECEIVE_BATCH]
            entries = [{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(batch)]
            response = self.client.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)
            failed = response.get("Failed", [])
            if failed:
                codes = sorted({f.get("Code", "?") for f in failed})
                log.warning("%d SQS messages not deleted (%s)", len(failed), ", ".join(codes))

    def backlog(self) -> int:
        """Messages in the queue, delivered or not (SQS's approximate counts): 0 at rest."""
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        response = self.client.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=names)
        attributes = response.get("Attributes", {})
        return sum(int(attributes.get(name, "0")) for name in names)

    def changes_of(self, body: str) -> list[ObjectChange] | None:
        """The changes a message body reports under the prefix; None for a body that is no S3
        event notification (an S3 test event is one, with no changes)."""
        try:
            value = json.loads(body)
        except ValueError:
            return None
        if isinstance(value, dict) and "Message" in value and "Records" not in value:
            try:
                value = json.loads(_SnsEnvelope.model_validate(value).message)
            except (ValidationError, ValueError):
                return None
        try:
            message = _S3Message.model_validate(value)
        except ValidationError:
            try:
                _TestEvent.model_validate(value)
            except ValidationError:
                return None
            return []
        return [
            change
            for record in message.records
            if record.s3.bucket.name == self.bucket
            and (change := _change(record)) is not None
            and under_prefix(change.key, self.prefix)
        ]


def _change(record: _S3Record) -> ObjectChange | None:
    """An object created or removed; None for S3's other events (restores, tagging, ...)."""
    created = record.event_name.startswith(CREATED_PREFIX)
    if not created and not record.event_name.startswith(REMOVED_PREFIX):
        return None
    etag = record.s3.object.e_tag
    return ObjectChange(
        key=unquote_plus(record.s3.object.key),
        etag=etag.strip('"') if etag else None,
        size=record.s3.object.size,
        last_modified=record.event_time,
        deleted=not created,
    )


def make_sqs_client(settings: Settings) -> SqsClient:
    """An SQS client in the bucket's region (S3 notifies only a queue in its own region).
    Credentials from boto3's chain, as for any configured endpoint (IRSA on EKS); the
    endpoint from boto3's own `AWS_ENDPOINT_URL_SQS` where set."""
    config = Config(
        region_name=settings.s3_region,
        retries={"mode": "standard", "max_attempts": 3},
        connect_timeout=5,
        read_timeout=10,
    )
    with client_lock():
        client: SqsClient = boto_session().client("sqs", config=config)
    return client
