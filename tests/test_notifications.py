"""Change feeds: the embedded filer's metadata log (a real server) and S3 events in SQS (moto)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from pipelines.intake.notifications import (
    ChangePage,
    FilerFeed,
    NotificationError,
    ObjectChange,
    SqsFeed,
    change_feed,
)
from pipelines.intake.notifications.filer import FilerCursor, parse_events
from pipelines.intake.notifications.gaps import changed_since
from pipelines.intake.notifications.sqs import SqsCursor
from pipelines.settings import Settings, SettingsError, unknown_names
from pipelines.storage.embedded import EmbeddedS3, start_on_free_ports, weed_binary
from pipelines.storage.s3 import S3Store
from pipelines.storage.tls import write_grpc_certificates

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
MULTIPART_PART = 5 * 1024 * 1024  # S3's smallest part but the last


# --- the filer feed, against the session's real SeaweedFS -------------------------------------


def filer_feed(server: EmbeddedS3, bucket: str) -> FilerFeed:
    return FilerFeed.from_settings(Settings(home=server.home, s3_port=server.port, bucket=bucket))


def keys(page: ChangePage) -> list[str]:
    return [change.key for change in page.changes]


def test_a_put_under_incoming_shows_up_with_what_head_says(
    embedded_s3: EmbeddedS3, s3_store: S3Store
) -> None:
    feed = filer_feed(embedded_s3, s3_store.bucket)
    start = feed.poll(None, 100)
    assert start.changes == [], "the first poll starts from now"
    s3_store.put_bytes("incoming/early bird.csv", b"before the feed")  # after it: reported

    s3_store.put_bytes("incoming/a b+c.csv", b"a,b\n1,2\n")
    s3_store.put_bytes("other/x.csv", b"not dropped")
    s3_store.put_bytes("incoming2/y.csv", b"a sibling prefix")
    page = feed.poll(start.cursor, 100)

    assert keys(page) == ["incoming/early bird.csv", "incoming/a b+c.csv"]
    head = s3_store.head("incoming/a b+c.csv")
    assert head is not None
    assert page.changes[1] == ObjectChange(
        key="incoming/a b+c.csv",
        etag=head.etag,
        size=head.size,
        last_modified=head.last_modified,
        deleted=False,
    )
    assert page.receipts == ()
    feed.acknowledge(page)
    again = feed.poll(page.cursor, 100)
    assert again.changes == [], "the cursor moved past what was reported"
    # A cursor polled again replays the same page (at least once: a crash before storing it).
    assert keys(feed.poll(start.cursor, 100)) == keys(page)


def test_from_a_stored_cursor_the_later_uploads_come_in_order_and_by_limit(
    embedded_s3: EmbeddedS3, s3_store: S3Store
) -> None:
    feed = filer_feed(embedded_s3, s3_store.bucket)
    stored = feed.poll(None, 100).cursor
    s3_store.put_bytes("incoming/1.csv", b"one")
    first = feed.poll(stored, 100)
    assert keys(first) == ["incoming/1.csv"]

    for name in ("2.csv", "3.csv", "4.csv"):
        s3_store.put_bytes(f"incoming/{name}", name.encode())
    s3_store.put_bytes("incoming/1.csv", b"one, again")  # an overwrite: a new version
    s3_store.delete("incoming/2.csv")
    two = feed.poll(first.cursor, 2)
    assert keys(two) == ["incoming/2.csv", "incoming/3.csv"]
    rest = feed.poll(two.cursor, 100)
    assert [(c.key, c.deleted) for c in rest.changes] == [
        ("incoming/4.csv", False),
        ("incoming/1.csv", False),
        ("incoming/2.csv", True),
    ]
    overwritten = s3_store.head("incoming/1.csv")
    assert overwritten is not None and rest.changes[1].etag == overwritten.etag
    assert rest.changes[1].etag != first.changes[0].etag
    assert feed.poll(rest.cursor, 100).changes == []


def test_a_multipart_upload_carries_the_etag_s3_reports(
    embedded_s3: EmbeddedS3, s3_store: S3Store
) -> None:
    feed = filer_feed(embedded_s3, s3_store.bucket)
    cursor = feed.poll(None, 10).cursor
    client = s3_store.client
    bucket, key = s3_store.bucket, "incoming/big.bin"
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    parts = []
    for number, body in ((1, b"x" * MULTIPART_PART), (2, b"tail")):
        part = client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=body
        )
        parts.append({"ETag": part["ETag"], "PartNumber": number})
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
    )
    page = feed.poll(cursor, 10)
    head = s3_store.head(key)
    assert head is not None and head.etag.endswith("-2")
    assert [(c.key, c.etag, c.size) for c in page.changes] == [(key, head.etag, head.size)]


def test_a_feed_left_behind_catches_up_an_hour_a_poll(
    embedded_s3: EmbeddedS3, s3_store: S3Store
) -> None:
    feed = filer_feed(embedded_s3, s3_store.bucket)
    hour = 3600 * 10**9
    three_hours_ago = time.time_ns() - 3 * hour
    page = feed.poll(FilerCursor(three_hours_ago).to_text(), 10)
    cursor = FilerCursor.from_text(page.cursor)
    assert page.changes == [] and cursor is not None
    assert cursor.ts_ns == three_hours_ago + hour


def test_the_client_config_is_private_and_under_the_home(
    embedded_s3: EmbeddedS3, s3_store: S3Store
) -> None:
    feed = filer_feed(embedded_s3, s3_store.bucket)
    feed.poll(None, 1)
    config = feed.config_dir / "security.toml"
    assert config.is_relative_to(embedded_s3.home / "s3")
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    text = config.read_text(encoding="utf-8")
    assert "[grpc.client]" in text and "jwt" not in text, "the certificate, no signing keys"


def test_the_filer_refuses_a_client_without_the_certificate(
    embedded_s3: EmbeddedS3, s3_store: S3Store, tmp_path: Path
) -> None:
    s3_store.put_bytes("incoming/secret.csv", b"for kindex only")
    feed = filer_feed(embedded_s3, s3_store.bucket)
    command = [
        str(weed_binary()),
        "filer.meta.tail",
        f"-filer={feed.filer}",
        f"-pathPrefix={feed.path_prefix}",
        "-timeAgo=1h",
        "-untilTimeAgo=1ms",
    ]
    empty = tmp_path / "anonymous"
    empty.mkdir()
    done = subprocess.run(
        command, cwd=empty, capture_output=True, timeout=30, env={"PATH": "/usr/bin:/bin"}
    )
    assert b"tsNs" not in done.stdout and b"secret.csv" not in done.stdout
    with pytest.raises(NotificationError):
        list(parse_events(done.stdout.decode()))

    # Nor one with a certificate of its own, signed by another authority.
    stranger = FilerFeed(
        filer=feed.filer,
        bucket=feed.bucket,
        prefix=feed.prefix,
        tls_dir=write_grpc_certificates(tmp_path / "stranger").ca.parent,
        config_dir=tmp_path / "stranger-config",
    )
    (tmp_path / "stranger-config").mkdir()
    cursor = FilerCursor(time.time_ns() - 3600 * 10**9).to_text()
    with pytest.raises(NotificationError):
        stranger.poll(cursor, 10)


def test_no_certificate_yet_is_a_clear_error(tmp_path: Path) -> None:
    feed = FilerFeed.from_settings(Settings(home=tmp_path / "home"))
    with pytest.raises(NotificationError, match="not started"):
        feed.poll(None, 10)


@pytest.mark.slow  # two server starts
def test_a_server_killed_and_started_again_is_a_gap_since_the_cursor(tmp_path: Path) -> None:
    """The filer keeps its newest events in memory: a server killed loses them, and the log of
    the one started after it never shows those uploads. The feed reports a gap since its cursor,
    and a listing of what changed since then finds them."""
    server = start_on_free_ports(tmp_path / "s3-home")
    restarted: EmbeddedS3 | None = None
    try:
        settings = server.settings
        store = S3Store.from_settings(settings)
        store.ensure_bucket()
        feed = FilerFeed.from_settings(settings)
        store.put_bytes("incoming/read.csv", b"a,b\n1,2\n")
        page = feed.poll(feed.since(datetime.now(UTC) - timedelta(minutes=1)), 10)
        assert keys(page) == ["incoming/read.csv"] and page.gap_since is None
        cursor = page.cursor
        unread = [f"incoming/unread {n}.csv" for n in range(3)]
        for key in unread:
            store.put_bytes(key, key.encode())

        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        server.stop()  # reaps it
        restarted = EmbeddedS3(server.home, port=server.port).start()
        store.put_bytes("incoming/after.csv", b"a,b\n3,4\n")
        page = feed.poll(cursor, 10)

        assert "incoming/after.csv" in keys(page), "the new server's log is read"
        assert page.gap_since is not None
        read_until = FilerCursor.from_text(cursor)
        assert read_until is not None
        assert page.gap_since.timestamp() <= read_until.ts_ns / 1e9
        found = {o.key for o in changed_since(store, settings.incoming_prefix, page.gap_since)}
        assert set(unread) <= found, "what the lost events named is in the bucket"
        assert feed.poll(page.cursor, 10).gap_since is None, "reported once"
    finally:
        if restarted is not None:
            restarted.stop()
        server.stop()


# --- the SQS feed, on moto ---------------------------------------------------------------------

BUCKET = "kindex"


def s3_record(name: str, key: str, *, size: int | None = None, etag: str | None = None) -> object:
    """One record as AWS documents S3's event message (version 2.1)."""
    obj: dict[str, object] = {"key": key, "sequencer": "0055AED6DCD90281E5"}
    if size is not None:
        obj |= {"size": size, "eTag": etag, "versionId": "096fKKXTRTtl3on89fVO.nfljtsv6qko"}
    return {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "awsRegion": "us-east-1",
        "eventTime": "2026-01-02T03:04:05.678Z",
        "eventName": name,
        "userIdentity": {"principalId": "AWS:AIDAJDPLRKLG7UEXAMPLE"},
        "requestParameters": {"sourceIPAddress": "127.0.0.1"},
        "responseElements": {
            "x-amz-request-id": "C3D13FE58DE4C810",
            "x-amz-id-2": "FMyUVURIY8/IgAtTv8xRjskZQpcIZ9KG4V5Wp6S7S/JRWeUWerMUE5JgHvANOjpD",
        },
        "s3": {
            "s3SchemaVersion": "1.0",
            "configurationId": "kindex-incoming",
            "bucket": {
                "name": BUCKET,
                "ownerIdentity": {"principalId": "A3NL1KOZZKExample"},
                "arn": f"arn:aws:s3:::{BUCKET}",
            },
            "object": obj,
        },
    }


def s3_message(*records: object) -> str:
    return json.dumps({"Records": list(records)})


TEST_EVENT = json.dumps(
    {
        "Service": "Amazon S3",
        "Event": "s3:TestEvent",
        "Time": "2026-01-02T03:04:05.000Z",
        "Bucket": BUCKET,
        "RequestId": "5582815E1AEA5ADF",
        "HostId": "8cLeGAmw098X5cv4Zkwcmo8vvZa3eH3eKxsPzbB9wrR+YstdA6Knx4Ip8EXAMPLE",
    }
)


def sns_envelope(message: str) -> str:
    return json.dumps(
        {
            "Type": "Notification",
            "MessageId": str(uuid.uuid4()),
            "TopicArn": "arn:aws:sns:us-east-1:123456789012:kindex-incoming",
            "Subject": "Amazon S3 Notification",
            "Message": message,
            "Timestamp": "2026-01-02T03:04:06.000Z",
        }
    )


@pytest.fixture
def sqs() -> Iterator[tuple[Any, str]]:
    with mock_aws():
        client = boto3.client(
            "sqs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
        )
        url = client.create_queue(QueueName="kindex-incoming")["QueueUrl"]
        yield client, url


def test_sqs_feed_reads_s3_events_test_events_sns_and_malformed_messages(
    sqs: tuple[Any, str],
) -> None:
    client, url = sqs
    created = s3_record(
        "ObjectCreated:Put", "incoming/my+run%28v2%29.csv", size=1024, etag="d41d8cd98f00b204e9"
    )
    bodies = [
        TEST_EVENT,
        s3_message(created),
        s3_message(s3_record("ObjectRemoved:Delete", "incoming/old.csv")),
        sns_envelope(
            s3_message(
                s3_record(
                    "ObjectCreated:CompleteMultipartUpload",
                    "incoming/big.bin",
                    size=9,
                    etag="abc-2",
                )
            )
        ),
        s3_message(s3_record("ObjectCreated:Put", "snapshots/x", size=1, etag="e")),
        "not json at all",
        json.dumps({"Records": [{"eventName": "ObjectCreated:Put"}]}),
    ]
    for body in bodies:
        client.send_message(QueueUrl=url, MessageBody=body)
    feed = SqsFeed(url, bucket=BUCKET, prefix="incoming/", client=client)

    page = feed.poll(None, 100)

    assert SqsCursor.from_text(page.cursor) is not None, "the poll's time"
    assert page.gap_since is None
    assert page.changes == [
        ObjectChange(
            key="incoming/my run(v2).csv",
            etag="d41d8cd98f00b204e9",
            size=1024,
            last_modified=datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
            deleted=False,
        ),
        ObjectChange(
            key="incoming/old.csv",
            etag=None,
            size=None,
            last_modified=datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
            deleted=True,
        ),
        ObjectChange(
            key="incoming/big.bin",
            etag="abc-2",
            size=9,
            last_modified=datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
            deleted=False,
        ),
    ]
    assert page.ignored == 2, "the two malformed bodies"
    assert len(page.receipts) == len(bodies), "every message is acknowledged, malformed too"
    assert feed.backlog() == len(bodies), "received, not yet acknowledged"
    feed.acknowledge(page)
    assert feed.backlog() == 0


def test_sqs_delivers_again_until_acknowledged(sqs: tuple[Any, str]) -> None:
    client, url = sqs
    for n in range(23):  # more than one receive (10 at most each) and more than the limit
        body = s3_message(s3_record("ObjectCreated:Put", f"incoming/{n}.csv", size=n, etag="e"))
        client.send_message(QueueUrl=url, MessageBody=body)
    feed = SqsFeed(url, bucket=BUCKET, prefix="incoming/", client=client, visibility_timeout=1)

    first = feed.poll(None, 15)
    assert len(first.changes) == 15 and len(set(keys(first))) == 15
    rest = feed.poll(None, 100)
    assert len(rest.changes) == 8
    assert set(keys(first)) | set(keys(rest)) == {f"incoming/{n}.csv" for n in range(23)}
    assert feed.poll(None, 100).changes == [], "hidden while the pages are being recorded"
    time.sleep(1.2)  # past the visibility timeout, with nothing acknowledged
    again = feed.poll(None, 100)
    assert sorted(keys(again)) == sorted(keys(first) + keys(rest)), "delivered again"
    feed.acknowledge(again)
    time.sleep(1.2)
    assert feed.poll(None, 100).changes == []
    assert feed.backlog() == 0


def test_an_empty_queue_answers_at_once(sqs: tuple[Any, str]) -> None:
    client, url = sqs
    feed = SqsFeed(url, bucket=BUCKET, prefix="incoming/", client=client)
    started = time.monotonic()
    page = feed.poll(None, 100)
    assert (page.changes, page.receipts, page.ignored, page.gap_since) == ([], (), 0, None)
    assert time.monotonic() - started < 2, "no long poll"
    feed.acknowledge(page)


def test_a_queue_unread_past_its_retention_reports_a_gap_since_the_last_poll(
    sqs: tuple[Any, str],
) -> None:
    client, url = sqs
    client.set_queue_attributes(QueueUrl=url, Attributes={"MessageRetentionPeriod": "120"})
    feed = SqsFeed(url, bucket=BUCKET, prefix="incoming/", client=client)
    now = datetime.now(UTC)

    def gap_after(away: timedelta) -> datetime | None:
        return feed.poll(SqsCursor(now - away).to_text(), 10).gap_since

    assert gap_after(timedelta(seconds=90)) is None, "within the retention: every message waits"
    assert gap_after(timedelta(minutes=5)) == now - timedelta(minutes=5)
    page = feed.poll(SqsCursor(now - timedelta(minutes=5)).to_text(), 10)
    assert feed.poll(page.cursor, 10).gap_since is None, "reported once: the cursor moved on"
    assert feed.poll("", 10).gap_since is None, "a cursor from before the poll time was kept"


def test_frequent_polls_never_ask_the_queue_its_retention(sqs: tuple[Any, str]) -> None:
    client, url = sqs
    asked: list[object] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            if name == "get_queue_attributes":
                asked.append(name)
            return getattr(client, name)

    feed = SqsFeed(url, bucket=BUCKET, prefix="incoming/", client=Counting())  # type: ignore[arg-type]
    cursor = None
    for _ in range(5):
        cursor = feed.poll(cursor, 10).cursor
    assert asked == []
    feed.poll(SqsCursor(datetime.now(UTC) - timedelta(days=1)).to_text(), 10)
    feed.poll(SqsCursor(datetime.now(UTC) - timedelta(days=1)).to_text(), 10)
    assert asked == ["get_queue_attributes"], "asked once, when a poll came late"


# --- settings ----------------------------------------------------------------------------------


def test_the_feed_follows_the_settings(tmp_path: Path) -> None:
    home = {"KINDEX_HOME": str(tmp_path)}
    endpoint = {**home, "KINDEX_S3_ENDPOINT": "https://s3.example.com"}
    queue = "https://sqs.us-east-1.amazonaws.com/123456789012/kindex-incoming"
    assert isinstance(change_feed(Settings.from_env(home)), FilerFeed)
    assert change_feed(Settings.from_env(endpoint)) is None
    assert change_feed(Settings.from_env({**home, "KINDEX_NOTIFICATIONS": "none"})) is None
    with_queue = Settings.from_env({**endpoint, "KINDEX_SQS_QUEUE_URL": queue})
    assert with_queue.notification_kind == "sqs"
    feed = change_feed(with_queue)
    assert isinstance(feed, SqsFeed) and feed.queue_url == queue
    explicit = {**endpoint, "KINDEX_NOTIFICATIONS": "SQS", "KINDEX_SQS_QUEUE_URL": queue}
    assert Settings.from_env(explicit).notification_kind == "sqs"
    for wrong in (
        {**home, "KINDEX_NOTIFICATIONS": "kafka"},
        {**home, "KINDEX_NOTIFICATIONS": "sqs"},
        {**endpoint, "KINDEX_NOTIFICATIONS": "filer"},
    ):
        with pytest.raises(SettingsError):
            Settings.from_env(wrong)
    assert not list(unknown_names({"KINDEX_NOTIFICATIONS": "sqs", "KINDEX_SQS_QUEUE_URL": queue}))


# --- deploy/: the AWS wiring names one queue and one prefix ------------------------------------


def test_the_aws_wiring_names_the_same_queue_bucket_and_prefix() -> None:
    notification = json.loads((DEPLOY / "s3-notification.json").read_text(encoding="utf-8"))
    queue_policy = json.loads((DEPLOY / "sqs-queue-policy.json").read_text(encoding="utf-8"))
    iam = json.loads((DEPLOY / "iam-policy.json").read_text(encoding="utf-8"))

    (configuration,) = notification["QueueConfigurations"]
    queue_arn = configuration["QueueArn"]
    assert configuration["Events"] == ["s3:ObjectCreated:*"]
    rules = configuration["Filter"]["Key"]["FilterRules"]
    assert rules == [{"Name": "prefix", "Value": Settings(home=ROOT).incoming_prefix}]

    (allow,) = queue_policy["Statement"]
    assert allow["Principal"] == {"Service": "s3.amazonaws.com"}
    assert allow["Action"] == "sqs:SendMessage" and allow["Resource"] == queue_arn
    assert allow["Condition"]["ArnLike"]["aws:SourceArn"] == f"arn:aws:s3:::{BUCKET}"

    sqs_statements = [s for s in iam["Statement"] if s["Action"][0].startswith("sqs:")]
    assert [s["Resource"] for s in sqs_statements] == [queue_arn]
    granted = {a for s in sqs_statements for a in s["Action"]}
    # receive (poll), delete (acknowledge), attributes (backlog)
    assert granted == {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"}

    # The code location, where sensors run, polls that queue.
    from ruamel.yaml import YAML

    values = YAML(typ="safe").load((DEPLOY / "helm" / "values.yaml").read_text(encoding="utf-8"))
    deployment = values["dagster-user-deployments"]["deployments"][0]
    settings = Settings.from_env({e["name"]: str(e["value"]) for e in deployment["env"]})
    _, region, account, name = queue_arn.rsplit(":", 3)
    assert settings.notification_kind == "sqs"
    assert settings.sqs_queue_url == f"https://sqs.{region}.amazonaws.com/{account}/{name}"
    assert settings.s3_region == region, "S3 notifies a queue in the bucket's region only"
