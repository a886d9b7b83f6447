"""The small files of a batch share their record objects: one object per table for the whole
batch, whose rows each file's summary claims by its snapshot digest and parser version. Their
summaries and reads go into one sets file, written last, so a file costs the bucket its GET and
its snapshot (its first read is in the sets file); the index reads of a shared object only the
rows of the summaries it takes, so a batch whose sets file never came (a crash, an S3 error)
adds nothing until it is redone, and then adds each row once."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from index_support import csv_bytes, liger_rows, query, s3_requests

import pipelines.ingest as ingest
from pipelines.index.layout import SHARED_DIR
from pipelines.index.publish import publish_index
from pipelines.ingest import process_batch
from pipelines.intake.ledger import FileEntry, FileState
from pipelines.records.record_objects import SETS_FILE
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


def test_files_read_before_are_not_read_again_and_the_batches_are_not_listed(
    s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of files the ledger says were read (a backfill) loads each one's read, looked up
    by its key in the published index (and the sets files committed since), not in a listing
    of the batches."""
    settings = Settings.from_env()
    first = process_batch(s3_store, settings, dropped(s3_store, small_files()), "b1")
    again = [f.entry for f in first.files]
    assert all(entry.snapshot_digest for entry in again)
    sent = s3_requests(monkeypatch)

    result = process_batch(s3_store, settings, again, "b2", publish=False)

    assert [f.entry.state for f in result.files] == [f.entry.state for f in first.files]
    assert ("list", "records/batches/") not in sent  # the reads are the index's
    assert not [key for action, key in sent if key.startswith("incoming/")]  # nothing read again


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
        SETS_FILE,
    ]
    objects = objects[:3]
    [sets_key] = [k for action, k in sent if action == "put" and k.endswith(SETS_FILE)]
    assert sets_key.rsplit("/", 2)[0] == objects[0].rsplit("/", 2)[0]  # in the batch's folder
    sets_file = orjson.loads(s3_store.get_bytes(sets_key))
    assert len(sets_file["sets"]) == 3  # three record sets: f0 and its copy are one
    for entry in sets_file["sets"]:
        files = entry["summary"]["files"]
        assert set(files["runs"]) | set(files["manifests"]) <= set(objects)
        assert files["lineage"] == files["runs"]
    assert sorted(r["read"]["source_key"] for r in sets_file["reads"]) == sorted(
        key for key, _ in small_files()
    )
    record_puts = [k for a, k in sent if a == "put" and k.startswith("records/")]
    assert len(record_puts) == 3 + 1  # the batch's three objects, then its sets file
    assert query(settings, "select count(*), count(distinct run_digest) from runs") == [(50, 50)]
    assert query(settings, "select count(*) from quarantine") == [(1,)]
    lineage = "select count(*), count(distinct (snapshot_digest, source_line)) from lineage"
    assert query(settings, lineage) == [(50, 50)]  # the copy adds a read, not a row
    assert query(settings, "select count(*) from snapshots") == [(4,)]


def test_a_batch_whose_sets_file_failed_adds_nothing_and_its_redo_adds_each_row_once(
    s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sets file failed after the batch's objects were written: the index holds none of
    their rows (no summary claims them), the files are failed ledger rows, and redone they
    share new objects, each row once."""
    settings = Settings.from_env()
    entries = dropped(s3_store, small_files())
    put = ingest.SetsFile.put

    def fails(self: ingest.SetsFile, store: Any, layout: Any) -> None:
        raise ConnectionError("injected fault: the sets file PUT failed")

    monkeypatch.setattr(ingest.SetsFile, "put", fails)
    first = process_batch(s3_store, settings, entries, "b1")

    assert {f.entry.state for f in first.files} == {FileState.FAILED}
    assert {f.entry.reason for f in first.files} == {
        "ConnectionError: injected fault: the sets file PUT failed"
    }
    assert len(shared_objects(s3_store)) == 3  # their rows, claimed by no summary
    assert query(settings, "select count(*) from runs") == [(0,)]

    monkeypatch.setattr(ingest.SetsFile, "put", put)
    again = process_batch(s3_store, settings, [f.entry for f in first.files], "b2")

    assert [f.entry.state for f in again.files] == [FileState.INDEXED] * 4
    assert len(shared_objects(s3_store)) == 3 + 4  # the redo's three objects and its sets file
    assert query(settings, "select count(*), count(distinct run_digest) from runs") == [(50, 50)]
    assert query(settings, "select count(*) from lineage") == [(50,)]
    assert query(settings, "select count(*) from quarantine") == [(1,)]
    assert query(settings, "select count(*) from snapshots") == [(4,)]
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
