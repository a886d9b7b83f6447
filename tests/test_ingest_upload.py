"""`kindex ingest`'s uploads: a batch split among worker processes lands as one sent from this
process would (every file snapshotted, read, indexed, in order), and a store sent to a worker
is made again there with a client of its own."""

from __future__ import annotations

import hashlib
import pickle
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from index_support import csv_bytes, index_settings, liger_rows, query

from pipelines import ingest
from pipelines.batch import uploads
from pipelines.storage.s3 import S3Store

__all__ = ["index_settings"]
ROWS = 3


def small_csvs(folder: Path, count: int) -> list[Path]:
    """`count` Liger CSVs of ROWS rows each, every file other rows of the shared CSV."""
    folder.mkdir()
    paths = []
    for i in range(count):
        path = folder / f"small-{i:03d}.csv"
        path.write_bytes(csv_bytes(*liger_rows(range(2 + ROWS * i, 2 + ROWS * (i + 1)))))
        paths.append(path)
    return paths


def test_a_store_sent_to_another_process_is_made_again_with_a_client_of_its_own(
    s3_store: S3Store,
) -> None:
    copy = pickle.loads(pickle.dumps(s3_store))
    assert copy.client is not s3_store.client
    assert (copy.bucket, copy.endpoint_url, copy.credentials, copy.reconnect_seconds) == (
        s3_store.bucket,
        s3_store.endpoint_url,
        s3_store.credentials,
        s3_store.reconnect_seconds,
    )
    s3_store.put("sent/a", b"written by one, read by the other")
    assert copy.get_bytes("sent/a") == b"written by one, read by the other"


@pytest.mark.slow  # worker processes: in the full run
def test_a_batch_uploaded_from_worker_processes_lands_whole_and_in_order(
    s3_store: S3Store, index_settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = small_csvs(tmp_path / "files", uploads.PROCESS_UPLOAD_FILES + 5)
    pools: list[int] = []
    ended: list[bool] = []

    class CountedPool(ProcessPoolExecutor):
        def __init__(self, workers: int, **options: Any) -> None:
            pools.append(workers)
            super().__init__(workers, **options)

        def shutdown(self, wait: bool = True, **options: Any) -> None:
            ended.append(wait)
            super().shutdown(wait, **options)

    monkeypatch.setattr(uploads, "ProcessPoolExecutor", CountedPool)
    monkeypatch.setattr(uploads, "usable_cpus", lambda: 2)  # workers even on one CPU
    summary = ingest.ingest_paths(paths, index_settings, progress=False, store=s3_store)
    assert pools == [2]
    assert ended == [True]  # and ended with the ingest
    assert [f.source_key for f in summary.files] == [f"incoming/{p.name}" for p in paths]
    assert [f.snapshot_digest for f in summary.files] == [
        "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest() for p in paths
    ]
    assert all(f.runs == ROWS and f.quarantined == 0 for f in summary.files)
    assert query(index_settings, "SELECT count(*), count(DISTINCT source_key) FROM runs") == [
        (ROWS * len(paths), len(paths))
    ]
    assert query(index_settings, "SELECT state, count(*) FROM files GROUP BY state") == [
        ("indexed", len(paths))
    ]
    for path in paths:  # each incoming version holds the file's bytes
        assert s3_store.get_bytes(f"incoming/{path.name}") == path.read_bytes()


def test_a_small_batch_goes_up_from_this_process(
    s3_store: S3Store, index_settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = small_csvs(tmp_path / "files", 3)
    monkeypatch.setattr(uploads, "ProcessPoolExecutor", None)  # would fail if asked for
    monkeypatch.setattr(uploads, "usable_cpus", lambda: 2)
    summary = ingest.ingest_paths(paths, index_settings, progress=False, store=s3_store)
    assert [f.runs for f in summary.files] == [ROWS] * 3
