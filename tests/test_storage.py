"""S3Store and Settings against the real embedded SeaweedFS."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

from pipelines.settings import Settings, SettingsError
from pipelines.storage import s3 as s3_module
from pipelines.storage.base import NoSuchKey
from pipelines.storage.credentials import S3Credentials
from pipelines.storage.embedded import EmbeddedS3, find_free_port_block
from pipelines.storage.s3 import (
    KeyRefused,
    S3Store,
    StorageAccessDenied,
    StorageUnreachable,
    make_client,
    store_session,
)

# -- Settings ----------------------------------------------------------------------------------


def test_settings_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = Settings.from_env({})
    assert settings.home == tmp_path.resolve() / ".kindex"
    assert settings.s3_endpoint is None and settings.embedded
    assert settings.endpoint_url == "http://127.0.0.1:8333"
    assert (settings.bucket, settings.s3_region, settings.s3_path_style) == (
        "kindex",
        "us-east-1",
        True,
    )
    assert settings.incoming_prefix == "incoming/"
    assert settings.snapshot_prefix == "snapshots/"
    assert settings.records_prefix == "records/"
    assert settings.index_prefix == "index/"
    assert settings.credentials_path == settings.home / "s3" / "credentials.json"


def test_settings_from_environment(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {
            "KINDEX_HOME": str(tmp_path / "h"),
            "KINDEX_S3_ENDPOINT": "https://s3.example.com",
            "KINDEX_BUCKET": "results",
            "KINDEX_S3_REGION": "eu-west-1",
            "KINDEX_S3_PATH_STYLE": "false",
            "KINDEX_S3_PORT": "9000",
            "KINDEX_INCOMING_PREFIX": "/drop",
            "KINDEX_SNAPSHOT_PREFIX": "kx/snap/",
            "KINDEX_RECORDS_PREFIX": "kx/rec",
            "KINDEX_INDEX_PREFIX": "kx/idx//",
        }
    )
    assert settings.home == tmp_path / "h"
    assert not settings.embedded
    assert settings.endpoint_url == "https://s3.example.com"
    assert (settings.bucket, settings.s3_region, settings.s3_path_style, settings.s3_port) == (
        "results",
        "eu-west-1",
        False,
        9000,
    )
    assert (
        settings.incoming_prefix,
        settings.snapshot_prefix,
        settings.records_prefix,
        settings.index_prefix,
    ) == ("drop/", "kx/snap/", "kx/rec/", "kx/idx/")


@pytest.mark.parametrize(
    ("name", "value"), [("KINDEX_S3_PATH_STYLE", "maybe"), ("KINDEX_S3_PORT", "70000")]
)
def test_settings_reject_bad_values(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})


# -- S3Store -----------------------------------------------------------------------------------


def test_put_get_head_roundtrip(s3_store: S3Store) -> None:
    data = bytes(range(256)) * 10
    written = s3_store.put_bytes(
        "a/b.bin", data, content_type="application/octet-stream", metadata={"origin": "test"}
    )
    assert written.key == "a/b.bin" and written.size == len(data)
    assert not written.etag.startswith('"') and written.last_modified.tzinfo == UTC

    read, info = s3_store.get_object("a/b.bin")
    assert read == data
    assert info == written
    assert s3_store.get_bytes("a/b.bin") == data
    assert s3_store.head("a/b.bin") == written
    response = s3_store.client.head_object(Bucket=s3_store.bucket, Key="a/b.bin")
    assert response["Metadata"] == {"origin": "test"}


def test_put_writes_with_one_request(s3_store: S3Store) -> None:
    """`put` is a PUT alone; `put_bytes` reads back what it wrote (a HEAD) to describe it."""
    calls: list[str] = []
    events = s3_store.client.meta.events

    def record(model: Any, **kwargs: Any) -> None:
        calls.append(model.name)

    events.register("before-call.s3", record)
    try:
        s3_store.put("one/request", b"payload", content_type="text/plain")
        assert calls == ["PutObject"]
        s3_store.put_bytes("two/requests", b"payload")
        assert calls == ["PutObject", "PutObject", "HeadObject"]
    finally:
        events.unregister("before-call.s3", record)
    assert s3_store.get_bytes("one/request") == b"payload"
    response = s3_store.client.head_object(Bucket=s3_store.bucket, Key="one/request")
    assert response["ContentType"] == "text/plain"


def test_missing_keys(s3_store: S3Store) -> None:
    assert s3_store.head("nothing/here") is None
    with pytest.raises(NoSuchKey):
        s3_store.get_bytes("nothing/here")


def test_overwrite_and_delete(s3_store: S3Store) -> None:
    first = s3_store.put_bytes("k", b"one")
    second = s3_store.put_bytes("k", b"two")
    assert first.etag != second.etag
    assert s3_store.get_bytes("k") == b"two"
    s3_store.delete("k")
    assert s3_store.head("k") is None
    s3_store.delete("k")  # deleting what is gone is not an error in S3


def test_list_pages_through_everything(s3_store: S3Store) -> None:
    keys = [f"many/{i:05d}" for i in range(253)]
    with ThreadPoolExecutor(8) as pool:  # plain PUTs, no HEAD: setup only
        list(
            pool.map(
                lambda key: s3_store.client.put_object(
                    Bucket=s3_store.bucket, Key=key, Body=key.encode()
                ),
                keys,
            )
        )
    s3_store.put_bytes("other/x", b"x")
    paged = S3Store(
        s3_store.bucket,
        endpoint_url=s3_store.endpoint_url,
        client=s3_store.client,
        page_size=100,
    )
    listed = list(paged.list("many/"))
    assert [info.key for info in listed] == keys  # 3 pages, in key order, nothing else
    assert all(info.size == len(info.key) for info in listed)
    assert [info.key for info in s3_store.list("other/")] == ["other/x"]
    assert list(s3_store.list("none/")) == []


def test_upload_file_single_put(s3_store: S3Store, tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    path.write_bytes(os.urandom(300_000))
    info = s3_store.upload_file(path, "incoming/results.csv", content_type="text/csv")
    assert info.size == path.stat().st_size
    assert s3_store.get_bytes("incoming/results.csv") == path.read_bytes()


def test_upload_file_multipart(
    s3_store: S3Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_module, "MULTIPART_THRESHOLD", 5 * 1024 * 1024)
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(9 * 1024 * 1024))
    info = s3_store.upload_file(path, "incoming/big.bin")
    assert info.etag.endswith("-2")  # two parts of 8 MiB and 1 MiB
    assert info.size == path.stat().st_size
    assert s3_store.get_bytes("incoming/big.bin") == path.read_bytes()


def test_unreachable_endpoint_says_which() -> None:
    port = find_free_port_block()  # nothing listens there
    store = S3Store(
        "kindex",
        endpoint_url=f"http://127.0.0.1:{port}",
        credentials=S3Credentials("KXNOBODY", "secret-never-shown"),
        max_attempts=2,
    )
    with pytest.raises(StorageUnreachable, match=f"127.0.0.1:{port}") as caught:
        store.head("anything")
    assert "secret-never-shown" not in str(caught.value)
    with pytest.raises(StorageUnreachable):
        list(store.list(""))


def test_refused_credentials_say_so(s3_store: S3Store, embedded_s3: EmbeddedS3) -> None:
    intruder = S3Store(
        s3_store.bucket,
        endpoint_url=embedded_s3.endpoint_url,
        credentials=S3Credentials("KXWRONGKEY0000000000", "wrong-secret-never-shown"),
        max_attempts=1,
    )
    with pytest.raises(StorageAccessDenied, match="refused the credentials") as caught:
        intruder.put_bytes("x", b"x")
    message = str(caught.value)
    assert embedded_s3.endpoint_url in message and "KXWR…" in message
    assert "wrong-secret-never-shown" not in message
    with pytest.raises(StorageAccessDenied):
        intruder.head("x")


def test_store_session_with_endpoint_creates_the_bucket(s3_store: S3Store) -> None:
    # s3_store points KINDEX_S3_ENDPOINT and the AWS_* chain at the session's server.
    settings = Settings.from_env().replace(bucket=s3_store.bucket + "-new")
    with store_session(settings) as store:
        store.put_bytes("k", b"v")
        assert store.bucket == settings.bucket
    assert s3_store.with_bucket(settings.bucket).get_bytes("k") == b"v"


def test_a_body_that_breaks_off_is_fetched_again(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # botocore's retries end once headers arrive; a connection dropped mid-body is a fault
    # the real server will not produce on demand, so the first body read is made to fail.
    s3_store.put_bytes("k", b"whole body")
    real_get = s3_store.client.get_object
    calls: list[int] = []

    def get_object(**kwargs: object) -> dict[str, object]:
        response = real_get(**kwargs)
        calls.append(1)
        if len(calls) == 1:
            body = response["Body"]

            def broken_read(*args: object) -> bytes:
                body.close()
                raise s3_module.boto_errors.ResponseStreamingError(error="connection reset")

            monkeypatch.setattr(body, "read", broken_read)
        return response

    monkeypatch.setattr(s3_store.client, "get_object", get_object)
    assert s3_store.get_bytes("k") == b"whole body"
    assert len(calls) == 2


def test_a_server_error_past_botocores_retries_waits_for_the_embedded_server(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted SeaweedFS answers 5xx until its volumes register again, which under load can
    outlast botocore's own retries: a store of the embedded server sends the request again
    within its reconnect window. A 5xx the real server will not give on demand is made here."""
    s3_store.put_bytes("k", b"kept")
    real_get = s3_store.client.get_object
    calls: list[int] = []

    def get_object(**kwargs: object) -> dict[str, object]:
        calls.append(1)
        if len(calls) <= 2:
            raise s3_module.boto_errors.ClientError(
                {
                    "Error": {"Code": "InternalError", "Message": "try again"},
                    "ResponseMetadata": {"HTTPStatusCode": 500},
                },
                "GetObject",
            )
        return real_get(**kwargs)

    monkeypatch.setattr(s3_store.client, "get_object", get_object)
    waiting = S3Store(s3_store.bucket, client=s3_store.client, reconnect_seconds=30.0)
    assert waiting.get_bytes("k") == b"kept"
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(s3_module.boto_errors.ClientError, match="InternalError"):
        S3Store(s3_store.bucket, client=s3_store.client, reconnect_seconds=0).get_bytes("k")


def test_bodies_sent_on_loopback_are_not_hashed_for_signing(s3_store: S3Store) -> None:
    """boto3 signs each body's sha256 over plain HTTP; to the embedded server, on loopback,
    it sends UNSIGNED-PAYLOAD instead, which the server takes. Elsewhere boto3 decides."""
    sent: list[str] = []

    def capture(request: Any, **_: Any) -> None:
        sent.append(request.headers.get("X-Amz-Content-SHA256", b"").decode())

    events = s3_store.client.meta.events
    events.register("before-send.s3.PutObject", capture)
    try:
        s3_store.put_bytes("loopback/body.bin", b"x" * 100_000)
    finally:
        events.unregister("before-send.s3.PutObject", capture)
    assert sent == ["UNSIGNED-PAYLOAD"]
    assert s3_store.get_bytes("loopback/body.bin") == b"x" * 100_000
    remote = make_client(
        endpoint_url="http://storage.example:9000",
        region="us-east-1",
        path_style=True,
        credentials=None,
    )
    assert "payload_signing_enabled" not in remote.meta.config.s3


@pytest.mark.parametrize(
    ("key", "code"),
    [
        ("incoming/" + "k" * 1100, "KeyTooLongError"),  # over S3's 1,024 bytes
        ("incoming/" + "é" * 520, "KeyTooLongError"),  # 1,049 bytes in UTF-8
        ("incoming/a\x00b.csv", "InvalidRequest"),
        ("incoming/../../escape.csv", "InvalidRequest"),
    ],
)
def test_a_refused_key_is_a_one_line_error(s3_store: S3Store, key: str, code: str) -> None:
    with pytest.raises(KeyRefused) as refused:
        s3_store.put_bytes(key, b"x")
    message = str(refused.value)
    assert "\n" not in message and len(message) < 300
    assert f"refused the key of put s3://{s3_store.bucket}/incoming/" in message
    assert f"({len(key.encode())} bytes): {code}" in message
    assert "\x00" not in message
    if "\x00" in key or ".." in key:  # a HEAD of such a key is refused too (a bare 400)
        with pytest.raises(KeyRefused):
            s3_store.head(key)


@pytest.mark.slow  # a server restart: in the full run
def test_a_store_of_the_embedded_server_rides_out_its_restart(tmp_path: Path) -> None:
    """`kindex up` starts a killed embedded server again within seconds; a request sent
    meanwhile (a listing included) waits for it instead of failing the file it was for."""
    import signal
    import threading

    server = EmbeddedS3(tmp_path / "home", port=find_free_port_block()).start()
    try:
        settings = Settings(home=server.home, s3_port=server.port, bucket="restart")
        store = S3Store.from_settings(settings, page_size=2)
        store.ensure_bucket()
        for n in range(5):
            store.put_bytes(f"incoming/{n}", b"kept")
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        server.stop()  # reaps it; the data stays
        later = threading.Timer(4.0, server.start)
        later.start()
        try:
            assert store.get_bytes("incoming/0") == b"kept"
            assert [o.key for o in store.list("incoming/")] == [f"incoming/{n}" for n in range(5)]
        finally:
            later.join()
    finally:
        server.stop()
    with pytest.raises(StorageUnreachable):  # and once it is gone for good, a clear error
        S3Store.from_settings(settings, reconnect_seconds=1.0).get_bytes("incoming/0")
