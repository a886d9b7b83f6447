"""A FlashInfer trace's definition, resolved in one place: among the files of its own batch
(in whichever order they come), else in the index; a trace whose definition lands in a later
batch is marked due again in the ledger by that batch, and read again by the next, like any
other file: no second pass of the steps, one publish per batch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from index_support import query

import pipelines.ingest as ingest
from pipelines.index.publish import publish_index
from pipelines.ingest import process_batch
from pipelines.intake.ledger import FileEntry, FileState, Ledger
from pipelines.settings import Settings
from pipelines.sources import manifests_offered, offered_first
from pipelines.sources.flashinfer import operation_name

FLASHINFER = Path(__file__).parent / "data" / "formats" / "flashinfer-trace"
TRACES = FLASHINFER / "gemm_n128_k2048.traces.jsonl"
DEFINITION = FLASHINFER / "gemm_n128_k2048.definition.json"
TRACE_RUNS = 25  # the lines of TRACES, each a run once its definition is found


def dropped(store: Any, *paths: Path) -> list[FileEntry]:
    return [
        FileEntry.pending(store.bucket, store.put_bytes(f"incoming/{p.name}", p.read_bytes()))
        for p in paths
    ]


def counted_publishes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []

    def counted(store: Any, settings: Any) -> Any:
        calls.append(1)
        return publish_index(store, settings)

    monkeypatch.setattr(ingest, "publish_index", counted)
    return calls


def test_a_definition_offers_its_operation_to_the_files_beside_it() -> None:
    offered = manifests_offered(
        [(TRACES.name, TRACES.read_bytes()), (DEFINITION.name, DEFINITION.read_bytes())]
    )
    name = operation_name("gemm_n128_k2048")
    assert list(offered) == [("OperationSpec", name)]  # traces offer nothing
    named = offered_first(offered, lambda kind, name: None)
    assert named("OperationSpec", name) is offered["OperationSpec", name]
    assert named("OperationSpec", "flashinfer-other") is None


def test_traces_before_their_definition_in_one_batch_are_resolved_at_normalize(
    s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings.from_env()
    publishes = counted_publishes(monkeypatch)
    result = process_batch(s3_store, settings, dropped(s3_store, TRACES, DEFINITION), "b1")
    traces = result.files[0].records
    assert traces is not None and traces.runs == TRACE_RUNS and traces.quarantined == 0
    assert result.requeued == 0 and publishes == [1]
    assert query(settings, "SELECT count(*) FROM runs") == [(TRACE_RUNS,)]


def test_a_definition_that_lands_later_marks_its_traces_due_for_the_next_batch(
    s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings.from_env()
    publishes = counted_publishes(monkeypatch)
    first = process_batch(s3_store, settings, dropped(s3_store, TRACES), "b1")
    waiting = first.files[0]
    assert waiting.records is not None and waiting.records.awaiting
    assert waiting.entry.state is FileState.INDEXED  # waiting is not bad input

    second = process_batch(s3_store, settings, dropped(s3_store, DEFINITION), "b2")

    assert publishes == [1, 1]  # one publish a batch: the traces are not read again by it
    [due] = second.due
    assert (due.key, due.state) == (waiting.entry.key, FileState.PENDING)
    now = datetime.now(UTC) + timedelta(seconds=1)
    ledger = Ledger.of(s3_store, settings)
    assert [e.key for e in ledger.due(now, stale_before=now - timedelta(hours=1))] == [due.key]
    assert query(settings, "SELECT count(*) FROM runs") == [(0,)]

    third = process_batch(s3_store, settings, [due], "b3")

    [again] = third.files
    assert again.records is not None and again.records.runs == TRACE_RUNS
    assert again.entry.state is FileState.INDEXED and third.requeued == 0
    assert query(settings, "SELECT count(*) FROM runs") == [(TRACE_RUNS,)]
    assert query(settings, "SELECT count(*) FROM quarantine") == [(0,)]
    assert ledger.due(now, stale_before=now - timedelta(hours=1)) == []


def test_a_definition_finds_the_traces_of_a_batch_not_published_yet(s3_store: Any) -> None:
    settings = Settings.from_env()
    process_batch(s3_store, settings, dropped(s3_store, TRACES), "b1", publish=False)
    second = process_batch(s3_store, settings, dropped(s3_store, DEFINITION), "b2", publish=False)
    assert [e.key for e in second.due] == [f"incoming/{TRACES.name}"]


def test_traces_whose_definition_lands_while_their_batch_runs_are_due_again(
    s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The definition's batch runs beside the traces' and is durable before the traces are
    (it cannot see them): the traces' batch sees it once its own record sets are written."""
    settings = Settings.from_env()
    real_write = ingest.write
    beside: list[Any] = []

    def write_after_the_definition(*args: Any) -> Any:
        monkeypatch.setattr(ingest, "write", real_write)  # the definition's batch writes as is
        if not beside:  # the traces' batch, normalized without the definition
            beside.append(process_batch(s3_store, settings, dropped(s3_store, DEFINITION), "b2"))
        return real_write(*args)

    monkeypatch.setattr(ingest, "write", write_after_the_definition)
    result = process_batch(s3_store, settings, dropped(s3_store, TRACES), "b1")
    assert beside[0].due == []  # nothing waited yet when the definition landed
    records = result.files[0].records
    assert records is not None and records.awaiting
    assert [e.key for e in result.due] == [f"incoming/{TRACES.name}"]
