"""The small files of a batch share their record objects: one object per table for the whole
batch, whose rows each file's summary claims by its snapshot digest and parser version. A file
costs the bucket its GET, its snapshot and three small writes (its read record, its summary and
its read); the index reads of a shared object only the rows of the summaries it takes, so a file
whose summary never came (a crash, an S3 error) adds nothing until its batch is redone, and then
adds each row once."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from index_support import csv_bytes, liger_rows, query, s3_requests

import pipelines.ingest as ingest
from pipelines.index.publish import publish_index
from pipelines.index.record_objects import SHARED_DIR, SUMMARY_FILE
from pipelines.ingest import FileWork, process_batch
from pipelines.intake.ledger import FileEntry, FileState
from pipelines.settings import Settings

NOT_LIGER = b"name,value\nalpha,1\n"  # a CSV of no known format: quarantined whole


def small_files() -> list[tuple[str, bytes]]:
    header, rows = liger_rows(range(2, 62))
    files = [(f"incoming/f{i}.csv", csv_bytes(header, rows[i * 20 : i * 20 + 20])) for i in (0, 1)]
    files.append(("incoming/f0-again.csv", files[0][1]))  # the same bytes under another key
    files.append(("incoming/bad.csv", csv_bytes(header, rows[40:50]) + b"not,a,row\n"))
    return files


def dropped(store: Any, items: list[tuple[str, bytes]]) -> list[FileEntry]:
    entries = []
    for key, data in items:
        entries.append(FileEntry.pending(store.bucket, store.put_bytes(key, data)))
    return entries


def shared_objects(store: Any) -> list[str]:
    return sorted(info.key for info in store.list(f"records/{SHARED_DIR}/"))


def test_a_batch_of_small_files_shares_one_object_per_table(
    s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings.from_env()
    entries = dropped(s3_store, small_files())
    sent = s3_requests(monkeypatch)

    result = process_batch(s3_store, settings, entries, "b1")

    assert [f.entry.state for f in result.files] == [FileState.INDEXED] * 4
    objects = shared_objects(s3_store)
    assert [key.rsplit("/", 1)[1] for key in objects] == [
        "manifests.parquet",
        "quarantine.parquet",  # the bad file's row
        "runs.parquet",  # a Liger file's lineage is its runs: no lineage object
    ]
    summaries = sorted({k for action, k in sent if action == "put" and k.endswith(SUMMARY_FILE)})
    assert len(summaries) == 3  # three record sets: f0 and its copy are one
    for key in summaries:
        files = orjson.loads(s3_store.get_bytes(key))["files"]
        assert set(files["runs"]) | set(files["manifests"]) <= set(objects)
        assert files["lineage"] == files["runs"]
    record_puts = [k for a, k in sent if a == "put" and k.startswith("records/")]
    # each file's read; each record set's summary; the batch's three objects
    assert len(record_puts) == 4 + 3 + 3
    assert query(settings, "select count(*), count(distinct run_digest) from runs") == [(50, 50)]
    assert query(settings, "select count(*) from quarantine") == [(1,)]
    lineage = "select count(*), count(distinct (snapshot_digest, source_line)) from lineage"
    assert query(settings, lineage) == [(50, 50)]  # the copy adds a read, not a row
    assert query(settings, "select count(*) from snapshots") == [(4,)]


def test_the_index_takes_only_the_rows_a_written_summary_claims(
    s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file whose summary failed after its batch's objects were written: the index holds the
    other files' rows only; redone alone, it shares a new object, and no row comes twice."""
    settings = Settings.from_env()
    items = small_files()
    entries = dropped(s3_store, items)
    write_file = ingest.write_file

    def summary_fails_for_f1(store: Any, settings: Settings, work: FileWork) -> None:
        if work.entry.key == "incoming/f1.csv":
            raise ConnectionError("injected fault: the summary PUT failed")
        write_file(store, settings, work)

    monkeypatch.setattr(ingest, "write_file", summary_fails_for_f1)
    first = process_batch(s3_store, settings, entries, "b1")

    states = {f.entry.key: f.entry.state for f in first.files}
    assert states["incoming/f1.csv"] is FileState.FAILED
    assert len(shared_objects(s3_store)) == 3  # f1's rows are in them, claimed by no summary
    assert query(settings, "select count(*) from runs") == [(30,)]  # f0 (20) and bad (10)
    assert query(settings, "select count(*) from lineage") == [(30,)]

    monkeypatch.setattr(ingest, "write_file", write_file)
    (failed,) = [f.entry for f in first.files if f.entry.key == "incoming/f1.csv"]
    again = process_batch(s3_store, settings, [failed], "b2")

    assert [f.entry.state for f in again.files] == [FileState.INDEXED]
    assert len(shared_objects(s3_store)) == 5  # its own batch: runs and manifests
    assert query(settings, "select count(*), count(distinct run_digest) from runs") == [(50, 50)]
    assert query(settings, "select count(*) from lineage") == [(50,)]
    assert query(settings, "select count(*) from quarantine") == [(1,)]
    publish_index(s3_store, settings)  # nothing new: the same counts
    assert query(settings, "select count(*) from runs") == [(50,)]


def test_batches_are_bounded_in_files_and_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest, "BATCH_FILES", 3)
    monkeypatch.setattr(ingest, "BATCH_BYTES", 100)
    sizes = [10, 10, 10, 10, 60, 50, 500, 1]
    # three files; then bytes (10+60 fit, +50 not); a larger file alone
    assert list(ingest.bounded_batches(sizes)) == [[0, 1, 2], [3, 4], [5], [6], [7]]
    names = ["a", "b", "a", "c"]  # `kindex ingest` puts both a's to one key: never together
    assert list(ingest.bounded_batches([1, 1, 1, 1], names)) == [[0, 1], [2, 3]]


def test_more_files_than_a_batch_holds_are_processed_in_batches(
    s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backfill of many windows or a glob: each bounded batch its own steps and ledger rows,
    every file processed once."""
    monkeypatch.setattr(ingest, "BATCH_FILES", 2)
    settings = Settings.from_env()
    entries = dropped(s3_store, small_files())

    results = list(ingest.process_batches(s3_store, settings, entries, "b"))

    assert [r.batch for r in results] == ["b-0", "b-1"]
    merged = ingest.BatchResult.merged("b", results)
    assert [f.entry.key for f in merged.files] == [e.key for e in entries]
    assert {f.entry.batch for f in merged.files} == {"b-0", "b-1"}
    assert merged.index is results[-1].index is not None
    assert query(settings, "select count(*), count(distinct run_digest) from runs") == [(50, 50)]
    [single] = ingest.process_batches(s3_store, settings, entries[:1], "c")
    assert single.batch == "c"  # a batch the sensors named keeps its name
