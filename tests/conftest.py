"""Shared fixtures: a real SeaweedFS S3 server per test session and a fresh bucket per test.

Fixtures here are shared by every test module; add new ones below, keep existing ones stable.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipelines.ingest import IngestSummary, ingest_paths
from pipelines.settings import Settings
from pipelines.storage.embedded import EmbeddedS3, start_on_free_ports
from pipelines.storage.s3 import S3Store, make_client

LIGER_CSV = Path(__file__).parent / "data" / "liger" / "all_benchmark_data.csv"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full",
        action="store_true",
        help="also run the tests marked slow: servers, kindex up, the deployment, bursts, faults",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The default run leaves out the tests marked slow; `--full` (or any `-m`) keeps them."""
    if config.getoption("--full") or config.getoption("-m"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


@pytest.fixture(scope="session")
def embedded_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedS3]:
    """One real SeaweedFS for the whole session (per xdist worker), on 127.0.0.1."""
    server = start_on_free_ports(tmp_path_factory.mktemp("embedded-s3"))
    try:
        yield server
    finally:
        # Its data goes with the session, so it needs no graceful stop, which can wait on its
        # volume server for the whole grace period (SIGKILL, then stop() reaps it and cleans up).
        if server.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.pid, signal.SIGKILL)
        server.stop()


@pytest.fixture(scope="session")
def s3_client(embedded_s3: EmbeddedS3) -> Any:
    """One boto3 client for the session's server (creating one costs ~100 ms)."""
    return session_client(embedded_s3)


def session_client(server: EmbeddedS3) -> Any:
    return make_client(
        endpoint_url=server.endpoint_url,
        region="us-east-1",
        path_style=True,
        credentials=server.credentials,
    )


# Buckets that outlive a test: the shared homes' (built once, restored for each test) and the
# next fresh bucket, made ahead. drop_buckets leaves them.
KEPT_BUCKETS: set[str] = set()


class FreshBuckets:
    """Fresh, uniquely named buckets, made while the tests before run. SeaweedFS gives a bucket
    volumes of its own at its first write, and that write waits for them for about a fifth of a
    second: made ahead (written to once, emptied again), a test's bucket is ready."""

    AHEAD = 2

    def __init__(self, server: EmbeddedS3) -> None:
        # A client of its own: tests watch the session client's requests (its event hooks).
        self.client = session_client(server)
        self.maker = ThreadPoolExecutor(self.AHEAD, thread_name_prefix="fresh-bucket")
        self.ahead = deque(self.maker.submit(self.make) for _ in range(self.AHEAD))

    def make(self) -> str:
        bucket = f"test-{uuid.uuid4().hex[:16]}"
        KEPT_BUCKETS.add(bucket)
        self.client.create_bucket(Bucket=bucket)
        self.client.put_object(Bucket=bucket, Key="first-write", Body=b"volume")
        self.client.delete_object(Bucket=bucket, Key="first-write")
        return bucket

    def take(self) -> str:
        """An empty bucket of its own for a test, which drop_buckets drops once it is done."""
        try:
            bucket = self.ahead.popleft().result()
        except Exception:  # the test's own ensure_bucket then says what is wrong
            bucket = f"test-{uuid.uuid4().hex[:16]}"
        KEPT_BUCKETS.discard(bucket)
        self.ahead.append(self.maker.submit(self.make))
        return bucket

    def close(self) -> None:
        self.maker.shutdown(wait=True)


@pytest.fixture(scope="session")
def fresh_buckets(embedded_s3: EmbeddedS3) -> Iterator[FreshBuckets]:
    buckets = FreshBuckets(embedded_s3)
    try:
        yield buckets
    finally:
        buckets.close()


@pytest.fixture
def s3_store(
    embedded_s3: EmbeddedS3,
    s3_client: Any,
    fresh_buckets: FreshBuckets,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[S3Store]:
    """An S3Store on a fresh, uniquely named bucket of the session's server.

    The environment points at the same bucket (KINDEX_S3_ENDPOINT, KINDEX_BUCKET, AWS keys,
    KINDEX_HOME under tmp_path), so `Settings.from_env()` and `kindex` commands run in-process
    reach what the test sees."""
    bucket = fresh_buckets.take()
    store = bucket_store(embedded_s3, s3_client, bucket)
    store.ensure_bucket()
    use_bucket(monkeypatch, embedded_s3, bucket, tmp_path / "home")
    yield store
    drop_buckets(s3_client)


def bucket_store(embedded_s3: EmbeddedS3, s3_client: Any, bucket: str) -> S3Store:
    """An S3Store on a bucket of the session's server, with the session's client."""
    return S3Store(
        bucket,
        endpoint_url=embedded_s3.endpoint_url,
        credentials=embedded_s3.credentials,
        client=s3_client,
    )


def use_bucket(
    monkeypatch: pytest.MonkeyPatch, embedded_s3: EmbeddedS3, bucket: str, home: Path
) -> None:
    """Point the environment at a bucket of the session's server and a home, so that
    `Settings.from_env()` and `kindex` commands run in-process reach them."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KINDEX_HOME", str(home))
    monkeypatch.setenv("KINDEX_S3_ENDPOINT", embedded_s3.endpoint_url)
    monkeypatch.setenv("KINDEX_BUCKET", bucket)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", embedded_s3.credentials.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", embedded_s3.credentials.secret_key)


@dataclass(frozen=True, slots=True)
class StoredObject:
    key: str
    etag: str
    data: bytes
    content_type: str
    metadata: dict[str, str]


@dataclass(frozen=True, slots=True)
class HomeCopy:
    """A home and its bucket as they stood once built (its objects' bytes and the home's
    files), which a test that adds to them gets back as they were: built once, read by many.
    Restored under the same bucket name and home path, since the index's catalog names both."""

    bucket: str
    home: Path
    saved_home: Path
    objects: tuple[StoredObject, ...]

    @classmethod
    def saved(cls, client: Any, bucket: str, home: Path, folder: Path) -> HomeCopy:
        objects = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for listed in page.get("Contents", []):
                got = client.get_object(Bucket=bucket, Key=listed["Key"])
                objects.append(
                    StoredObject(
                        listed["Key"],
                        listed["ETag"],
                        got["Body"].read(),
                        got["ContentType"],
                        got["Metadata"],
                    )
                )
        saved_home = folder / "saved-home"
        shutil.copytree(home, saved_home, symlinks=True)
        return cls(bucket, home, saved_home, tuple(objects))

    def restore(self, client: Any) -> None:
        """The bucket and home as saved: objects added since deleted, the saved ones a test
        changed or removed put back (a test's teardown may have dropped the bucket)."""
        if not any(b["Name"] == self.bucket for b in client.list_buckets().get("Buckets", [])):
            client.create_bucket(Bucket=self.bucket)
        saved = {o.key: o for o in self.objects}
        kept = set()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            added = []
            for listed in page.get("Contents", []):
                same = saved.get(listed["Key"])
                if same is not None and listed["ETag"] == same.etag:
                    kept.add(same.key)
                else:
                    added.append({"Key": listed["Key"]})
            if added:
                client.delete_objects(Bucket=self.bucket, Delete={"Objects": added})
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda o: client.put_object(
                        Bucket=self.bucket,
                        Key=o.key,
                        Body=o.data,
                        ContentType=o.content_type,
                        Metadata=o.metadata,
                    ),
                    [o for o in self.objects if o.key not in kept],
                )
            )
        shutil.rmtree(self.home, ignore_errors=True)
        shutil.copytree(self.saved_home, self.home, symlinks=True)


@contextmanager
def building_home(
    embedded_s3: EmbeddedS3, s3_client: Any, folder: Path
) -> Iterator[tuple[S3Store, Settings]]:
    """A new bucket of the session's server and a home in `folder`, the environment pointing
    at them while a module- or session-scoped fixture builds what its tests share."""
    bucket = f"home-{uuid.uuid4().hex[:16]}"
    KEPT_BUCKETS.add(bucket)  # until its fixture drops it (drop_bucket)
    with pytest.MonkeyPatch.context() as monkeypatch:
        use_bucket(monkeypatch, embedded_s3, bucket, folder / "home")
        store = bucket_store(embedded_s3, s3_client, bucket)
        store.ensure_bucket()
        yield store, Settings.from_env()


def restored_home(
    saved: HomeCopy, embedded_s3: EmbeddedS3, s3_client: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[S3Store, Settings]:
    """A saved home as it was built, this test's to read or add to (the environment points at
    it, as `s3_store` and `index_settings` do)."""
    saved.restore(s3_client)
    use_bucket(monkeypatch, embedded_s3, saved.bucket, saved.home)
    return bucket_store(embedded_s3, s3_client, saved.bucket), Settings.from_env()


def drop_bucket(client: Any, name: str) -> None:
    """Delete one bucket of the session's server and its objects (gone already: nothing)."""
    KEPT_BUCKETS.discard(name)
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]  # 1,000 at most
            if keys:
                client.delete_objects(Bucket=name, Delete={"Objects": keys})
        client.delete_bucket(Bucket=name)
    except Exception:  # a test's server may be gone; its bucket goes with the session
        return


def drop_buckets(client: Any) -> None:
    """Delete every bucket of the session's server but the kept ones (KEPT_BUCKETS: a few).
    SeaweedFS gives each bucket volumes of its own and has room for about 70 on this disk: a
    suite that kept each test's bucket would run out (PutObject then answers InternalError)."""
    for bucket in client.list_buckets().get("Buckets", []):
        if bucket["Name"] not in KEPT_BUCKETS:
            drop_bucket(client, bucket["Name"])


@dataclass(frozen=True, slots=True)
class SharedCsvHome:
    """A home whose bucket holds the shared Liger CSV ingested (and its index published)."""

    store: S3Store
    settings: Settings
    summary: IngestSummary


@pytest.fixture(scope="session")
def built_shared_csv(
    embedded_s3: EmbeddedS3, s3_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[HomeCopy, IngestSummary]]:
    """The shared Liger CSV ingested once for the session (per xdist worker): most of the work
    of every test that reads the whole CSV's index."""
    folder = tmp_path_factory.mktemp("shared-csv")
    with building_home(embedded_s3, s3_client, folder) as (store, settings):
        summary = ingest_paths([LIGER_CSV], settings, progress=False, store=store)
        saved = HomeCopy.saved(s3_client, store.bucket, folder / "home", folder)
    yield saved, summary
    drop_bucket(s3_client, saved.bucket)


@pytest.fixture
def shared_csv(
    built_shared_csv: tuple[HomeCopy, IngestSummary],
    embedded_s3: EmbeddedS3,
    s3_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> SharedCsvHome:
    """The shared CSV's home as it was ingested, this test's to read or add to (the environment
    points at it, as `s3_store` and `index_settings` do)."""
    saved, summary = built_shared_csv
    return SharedCsvHome(*restored_home(saved, embedded_s3, s3_client, monkeypatch), summary)


@pytest.fixture(autouse=True)
def no_child_process_left() -> Iterator[None]:
    """Fail the test that leaves a multiprocessing child alive. Such a child makes the
    interpreter wait for it at exit, so the suite would hang after its last test instead of
    failing here."""
    yield
    left = multiprocessing.active_children()
    for child in left:
        child.kill()
        child.join()
    assert not left, f"child processes left running: {left}"
