"""The ledger sensor's tick reads what was appended since its last one: it keeps in its cursor
the ledger commit it read and the open versions it knew, reads only the data files appended
since, and reads the ledger's open windows again when it has no cursor or that commit is no
longer in the ledger's history. Against a real bucket and catalog."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context
from pyiceberg.table.snapshots import Operation

import assets.sensors
import pipelines.intake.ledger
from assets.resources import KindexResource
from assets.sensors import LedgerCursor, batch_of, ledger_sensor
from pipelines.intake.ledger import (
    LEDGER_COMPACTION,
    LEDGER_TABLE,
    MAX_OPEN_KEPT,
    FileEntry,
    FileState,
    Ledger,
    OpenAt,
)
from pipelines.settings import Settings
from pipelines.storage.base import ObjectInfo

START = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with DagsterInstance.ephemeral() as ephemeral:
        yield ephemeral


@pytest.fixture
def ledger(s3_store: Any) -> Ledger:
    return Ledger.of(s3_store, Settings.from_env())


@pytest.fixture
def whole_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the reads of the ledger's open windows (`open_versions`), the tick's fallback."""
    calls: list[int] = []
    real = Ledger.open_versions

    def counted(self: Ledger, *, refresh: bool = True) -> list[FileEntry]:
        calls.append(1)
        return real(self, refresh=refresh)

    monkeypatch.setattr(Ledger, "open_versions", counted)
    return calls


class Ticks:
    """The ledger sensor ticked as the daemon does: its cursor carried, the clock moved."""

    def __init__(self, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch) -> None:
        self.instance = instance
        self.monkeypatch = monkeypatch
        self.cursor: str | None = None

    def at(self, moment: datetime) -> list[str]:
        """A tick at `moment`: the keys it requests again."""
        self.monkeypatch.setattr(assets.sensors, "clock", moment.timestamp)
        context = build_sensor_context(
            instance=self.instance, cursor=self.cursor, resources={"kindex": KindexResource()}
        )
        result = ledger_sensor(context)
        if isinstance(result, SkipReason):
            return []
        assert isinstance(result, SensorResult)
        self.cursor = result.cursor
        ledger = Ledger.of(KindexResource().store, Settings.from_env())
        return sorted(
            e.key for r in result.run_requests or [] for e in ledger.of_batch(batch_of(r))
        )

    @property
    def kept(self) -> OpenAt | None:
        return LedgerCursor.from_json(self.cursor).open


@pytest.fixture
def ticks(instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch) -> Ticks:
    return Ticks(instance, monkeypatch)


def version(key: str, at: datetime = START) -> ObjectInfo:
    return ObjectInfo(key, '"' + "e" * 32 + '"', 10, at)


def indexed(bucket: str, key: str) -> FileEntry:
    entry = FileEntry.pending(bucket, version(key), batch="done")
    return replace(entry, state=FileState.INDEXED, attempts=1, runs=1)


def test_a_failing_file_stays_due_across_incremental_ticks(
    s3_store: Any, ledger: Ledger, ticks: Ticks, whole_reads: list[int]
) -> None:
    failing = FileEntry.pending(s3_store.bucket, version("incoming/failing.csv"), batch="b1")
    ledger.append([failing])
    # Rows are stamped by the clock of the process that appends them (a tick's pending rows
    # too): only the sensor's clock moves here.
    ledger.append([failing.failed("S3 went away", datetime.now(UTC))])

    assert ticks.at(datetime.now(UTC)) == []  # backing off; read from the open windows (no cursor)
    assert whole_reads == [1]
    assert ticks.kept is not None and [e.key for e in ticks.kept.entries] == [failing.key]

    ledger.append([indexed(s3_store.bucket, f"incoming/other-{n}.csv") for n in range(3)])
    assert ticks.at(datetime.now(UTC)) == []  # still backing off
    # Days later, after many failures: each tick knows it from its cursor, none reads the
    # ledger's windows again.
    now = datetime.now(UTC)
    for attempt in range(3):
        now += timedelta(days=1)
        assert ticks.at(now) == [failing.key], attempt
        [pending] = [e for e in ledger.current() if e.key == failing.key]
        assert pending.state is FileState.PENDING
        again = replace(pending, attempts=attempt + 1).failed("still away", datetime.now(UTC))
        ledger.append([again])
    assert whole_reads == [1]
    assert ticks.kept is not None and [e.state for e in ticks.kept.entries] == [FileState.FAILED]

    ledger.append([replace(indexed(s3_store.bucket, failing.key), attempts=4)])
    assert ticks.at(now + timedelta(days=1)) == []  # done: no longer open
    assert ticks.kept is not None and ticks.kept.entries == ()
    assert whole_reads == [1]


def test_a_pending_row_appended_between_two_ticks_is_seen(
    s3_store: Any, ledger: Ledger, ticks: Ticks, whole_reads: list[int]
) -> None:
    ledger.append([indexed(s3_store.bucket, "incoming/at-rest.csv")])
    assert ticks.at(START) == []
    assert ticks.kept is not None and ticks.kept.entries == ()
    point = ticks.kept.point

    # A run lost before it started: its pending row, stamped, never followed by another.
    lost = FileEntry.pending(s3_store.bucket, version("incoming/lost.csv"), batch="lost")
    ledger.append([replace(lost, updated_at=START)])
    assert ticks.at(START + timedelta(seconds=30)) == []  # not stale yet
    assert ticks.kept is not None and ticks.kept.point != point
    assert [e.key for e in ticks.kept.entries] == [lost.key]
    assert ticks.at(START + assets.sensors.STALE_PENDING + timedelta(seconds=1)) == [lost.key]
    assert whole_reads == [1]


def test_a_cursor_whose_commit_was_expired_reads_the_open_windows_again(
    s3_store: Any, ledger: Ledger, ticks: Ticks, whole_reads: list[int]
) -> None:
    failing = FileEntry.pending(s3_store.bucket, version("incoming/failing.csv"), batch="b1")
    ledger.append([failing.failed("boom", START)])
    assert ticks.at(START) == []
    assert whole_reads == [1]
    # The commit it read is no longer one of the head's ancestors (its snapshots expired).
    data = json.loads(ticks.cursor or "{}")
    data["open"]["point"] = -1
    data["head"] = None
    ticks.cursor = json.dumps(data)
    lost = FileEntry.pending(s3_store.bucket, version("incoming/lost.csv"), batch="lost")
    ledger.append([replace(lost, updated_at=START)])

    later = START + timedelta(days=1)
    assert ticks.at(later) == sorted([failing.key, lost.key])
    assert len(whole_reads) == 2


def test_the_open_versions_kept_round_trip_and_are_bounded(s3_store: Any) -> None:
    entries = tuple(
        FileEntry.pending(s3_store.bucket, version(f"incoming/{n}.csv"), batch="b").failed(
            "boom", START
        )
        for n in range(3)
    )
    kept = OpenAt(7, entries)
    assert OpenAt.from_json(json.loads(json.dumps(kept.to_json()))) == kept
    assert OpenAt(7, entries * (MAX_OPEN_KEPT // 3 + 1)).to_json() is None  # read again instead
    assert LedgerCursor.from_json('{"head": 3, "waiting": true}') == LedgerCursor(3, True)


def test_rows_a_compaction_merged_since_the_last_tick_are_read_from_their_appends(
    s3_store: Any,
    ledger: Ledger,
    ticks: Ticks,
    whole_reads: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A compaction since the last tick merged the window's older rows with the new ones: the
    tick reads the new rows from the files their appends wrote, not the merged file (what a
    tick holds grows with what came since, not with an hour's files)."""
    ledger.append([indexed(s3_store.bucket, f"incoming/settled-{n}.csv") for n in range(40)])
    assert ticks.at(START) == []
    read: list[int] = []
    real = pipelines.intake.ledger._open_entries

    def counted(rows: Any) -> list[FileEntry]:
        read.append(rows.num_rows)
        return real(rows)

    monkeypatch.setattr(pipelines.intake.ledger, "_open_entries", counted)
    lost = FileEntry.pending(s3_store.bucket, version("incoming/lost.csv"), batch="lost")
    ledger.append([replace(lost, updated_at=START)])
    for n in range(LEDGER_COMPACTION.above_files + 1):  # a file each, in the same window
        ledger.append([indexed(s3_store.bucket, f"incoming/later-{n}.csv")])
    table = ledger.catalog.table(LEDGER_TABLE, refresh=True)
    assert any(
        s.summary is not None and s.summary.operation == Operation.OVERWRITE
        for s in table.snapshots()
    )  # the settled rows and the lost row's file were merged into a compaction's

    assert ticks.at(START + assets.sensors.STALE_PENDING + timedelta(seconds=1)) == [lost.key]
    assert read == [1 + LEDGER_COMPACTION.above_files + 1]  # the appended rows, no settled one
    assert whole_reads == [1]
