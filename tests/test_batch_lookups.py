"""A batch costs what it adds, whatever the bucket's history: a batch that reads bytes kept
before (a retry, the same file dropped again or under another key) finds their record sets in
the published index and the ledger rows committed since, and a FlashInfer definition landing
finds the traces waiting for it there too; neither lists `records/`. Nothing is lost: a key
still follows A -> B -> A, and a waiting trace still lands once its definition does."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from index_support import csv_bytes, index_settings, liger_rows, query, s3_requests

from pipelines.index.publish import publish_index
from pipelines.ingest import process_batch
from pipelines.intake.ledger import FileEntry, FileState

__all__ = ["index_settings"]  # the fixture, imported for pytest

HEADER, ROWS = liger_rows(range(2, 6))
A, B = csv_bytes(HEADER, ROWS), csv_bytes(HEADER, ROWS[:2])  # B is A less two rows
KEY = "incoming/history.csv"

FLASHINFER = Path(__file__).parent / "data" / "formats" / "flashinfer-trace"
TRACES = FLASHINFER / "gemm_n128_k2048.traces.jsonl"
DEFINITION = FLASHINFER / "gemm_n128_k2048.definition.json"
TRACE_RUNS = 25  # the lines of TRACES, each a run once its definition is found


def dropped(store: Any, key: str, data: bytes) -> FileEntry:
    return FileEntry.pending(store.bucket, store.put_bytes(key, data))


def record_set_listings(sent: list[tuple[str, str]]) -> list[str]:
    return [key for action, key in sent if action == "list" and key.startswith("records/")]


def one(settings: Any, sql: str) -> Any:
    [(value,)] = query(settings, sql)
    return value


def test_a_key_back_to_bytes_it_held_before_finds_their_record_set_without_a_listing(
    s3_store: Any, index_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    process_batch(s3_store, index_settings, [dropped(s3_store, KEY, A)], "b1")
    process_batch(s3_store, index_settings, [dropped(s3_store, KEY, B)], "b2")
    assert one(index_settings, "SELECT count(*) FROM runs WHERE retracted_in_source") == 2
    time.sleep(1.1)  # A again, in another second: a version of its own
    back = dropped(s3_store, KEY, A)

    sent = s3_requests(monkeypatch)
    result = process_batch(s3_store, index_settings, [back], "b3")

    assert record_set_listings(sent) == []
    [file] = result.files
    assert file.records is not None and file.records.reused  # the published record set
    assert file.entry.state is FileState.INDEXED
    written = [key for action, key in sent if action == "put" and key.startswith("records/")]
    assert len(written) == 1 and written[0].endswith("/sets.json")  # its read, nothing else
    # The key holds A again: nothing retracted, three reads of two contents.
    assert one(index_settings, "SELECT count(*) FROM runs WHERE retracted_in_source") == 0
    assert query(
        index_settings, "SELECT count(*), count(DISTINCT snapshot_digest) FROM snapshots"
    ) == [(3, 2)]

    # A retry of that very version: found again, its read registered already.
    sent.clear()
    again = process_batch(s3_store, index_settings, [file.entry], "b4")
    assert record_set_listings(sent) == []
    assert again.files[0].records is not None and again.files[0].records.reused
    assert again.index is not None and not again.index.published  # nothing new
    assert one(index_settings, "SELECT count(*) FROM snapshots") == 3


@pytest.mark.parametrize("index", [True, False], ids=["index", "no-index-yet"])
def test_bytes_under_another_key_find_a_record_set_not_published_yet(
    s3_store: Any, index_settings: Any, monkeypatch: pytest.MonkeyPatch, index: bool
) -> None:
    """In a home whose index has a version (the rows committed since it), or none yet (every
    row of the ledger)."""
    first = [dropped(s3_store, "incoming/first.csv", B)]
    process_batch(s3_store, index_settings, first, "b1", publish=index)
    fresh = dropped(s3_store, "incoming/new.csv", A)
    process_batch(s3_store, index_settings, [fresh], "b2", publish=False)
    copy = dropped(s3_store, "incoming/copy.csv", A)

    sent = s3_requests(monkeypatch)
    result = process_batch(s3_store, index_settings, [copy], "b3", publish=False)

    assert record_set_listings(sent) == []
    [file] = result.files
    assert file.records is not None and file.records.reused  # named by b2's ledger rows
    assert publish_index(s3_store, index_settings).new_runs == len(ROWS) - (2 if index else 0)
    if index:  # (a first publish catches up from a listing)
        assert record_set_listings(sent) == []
    assert one(index_settings, "SELECT count(*) FROM runs") == len(ROWS)
    assert one(index_settings, "SELECT count(DISTINCT source_key) FROM snapshots") == 3


def test_a_definition_landing_finds_its_waiting_traces_without_a_listing(
    s3_store: Any, index_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The traces' record set only in the ledger rows committed since the index's version
    (their batch not published yet); the index is asked too (tests/test_batch_steps.py: the
    traces published)."""
    process_batch(s3_store, index_settings, [dropped(s3_store, KEY, B)], "b0")
    traces = dropped(s3_store, f"incoming/{TRACES.name}", TRACES.read_bytes())
    first = process_batch(s3_store, index_settings, [traces], "b1", publish=False)
    assert first.files[0].records is not None and first.files[0].records.awaiting

    sent = s3_requests(monkeypatch)
    definition = dropped(s3_store, f"incoming/{DEFINITION.name}", DEFINITION.read_bytes())
    second = process_batch(s3_store, index_settings, [definition], "b2")

    assert record_set_listings(sent) == []
    [due] = second.due
    assert (due.key, due.state) == (traces.key, FileState.PENDING)

    third = process_batch(s3_store, index_settings, [due], "b3")

    assert record_set_listings(sent) == []
    [landed] = third.files
    assert landed.records is not None and landed.records.runs == TRACE_RUNS
    assert not landed.records.reused  # judged another version now: normalized again
    trace_runs = "SELECT count(*) FROM runs WHERE external_id LIKE '%gemm_n128_k2048%'"
    assert one(index_settings, trace_runs) == TRACE_RUNS
    assert third.due == []
