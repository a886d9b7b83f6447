"""Helpers shared by the index/ingest tests: settings for one test, small Liger CSVs, ingest."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipelines.curation import CURATION_DIR_VARIABLE, CURATION_FILES
from pipelines.index.local import open_index
from pipelines.index.publish import publish_index
from pipelines.index.tables import table_fingerprints
from pipelines.ingest import IngestSummary, process_snapshot
from pipelines.storage.s3 import S3Store

DATA = Path(__file__).parent / "data"
LIGER_CSV = DATA / "liger" / "all_benchmark_data.csv"


@pytest.fixture
def index_settings(s3_store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Settings whose home is this test's own directory and whose bucket is the test store's."""
    from pipelines.settings import Settings

    monkeypatch.setenv("KINDEX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KINDEX_BUCKET", s3_store.bucket)
    return Settings.from_env()


@pytest.fixture
def curation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the packaged curation, which this process reads from now on: a test grows it."""
    from importlib import resources

    folder = tmp_path / "curation"
    folder.mkdir()
    packaged = resources.files("pipelines.curation")
    for name in CURATION_FILES:
        (folder / name).write_text(packaged.joinpath(name).read_text(encoding="utf-8"))
    monkeypatch.setenv(CURATION_DIR_VARIABLE, str(folder))
    return folder


NEW_GPU = "NVIDIA GeForce RTX 2080 Ti"  # a real GPU the packaged curation does not know


def add_new_gpu(curation: Path) -> str:
    """Curate NEW_GPU in a copy of the curation; returns gpus.yaml as it was, to undo it."""
    gpus = curation / "gpus.yaml"
    before = gpus.read_text()
    gpus.write_text(
        before + f"  {NEW_GPU}: {{vendor: nvidia, product: {NEW_GPU}, architecture: sm_75,"
        " title: RTX 2080 Ti}\n"
    )
    return before


def liger_rows(lines: range | list[int]) -> tuple[list[str], list[list[str]]]:
    """The header and the rows at the given 1-based file lines of the shared Liger CSV."""
    with LIGER_CSV.open(newline="") as handle:
        records = list(csv.reader(handle))
    return records[0], [records[n - 1] for n in lines]


def csv_bytes(header: list[str], rows: list[list[str]]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue().encode()


def drop_and_process(store: Any, settings: Any, key: str, data: bytes) -> Any:
    """Put bytes at a key, snapshot that object version and write its record objects."""
    from pipelines.intake.snapshots import take_snapshot

    info = store.put_bytes(key, data)
    snapshot = take_snapshot(store, settings, key, etag=info.etag)
    return process_snapshot(store, settings, snapshot)


def ingest_bytes(store: Any, settings: Any, items: list[tuple[str, bytes]]) -> IngestSummary:
    files = [drop_and_process(store, settings, key, data) for key, data in items]
    return IngestSummary(files, publish_index(store, settings))


def query(settings: Any, sql: str) -> list[tuple[Any, ...]]:
    con = open_index(settings)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def fingerprints(settings: Any) -> dict[str, str]:
    """A content hash of every table and view of the local index."""
    con = open_index(settings)
    try:
        return table_fingerprints(con)
    finally:
        con.close()


def s3_requests(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every request kindex's S3 stores send from now on, as (action, key): each still goes to
    the real server."""
    sent: list[tuple[str, str]] = []
    real = S3Store._call

    def recorded(store: S3Store, action: str, key: str, operation: Any) -> Any:
        sent.append((action, key))
        return real(store, action, key, operation)

    monkeypatch.setattr(S3Store, "_call", recorded)
    return sent


def as_legacy_layout(store: Any) -> None:
    """Rewrite a home's batch sets files as what kindex wrote before them: a summary object per
    record set and an object per read, in the set's prefix."""
    for info in list(store.list("records/batches/")):
        if info.key.endswith("/sets.json"):
            content = orjson.loads(store.get_bytes(info.key))
            for entry in content["sets"]:
                store.put_bytes(entry["prefix"] + "summary.json", orjson.dumps(entry["summary"]))
            for entry in content["reads"]:
                read = entry["read"]
                key = f"{entry['prefix']}reads/{read['read_id']}.json"
                store.put_bytes(key, orjson.dumps(read))
            store.delete(info.key)
