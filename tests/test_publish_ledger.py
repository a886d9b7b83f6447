"""A publish takes what the ledger committed since the version it extends, never a listing of
`records/`; a key's reads come from the published index and the sets files committed since."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from index_support import (
    as_legacy_layout,
    csv_bytes,
    drop_and_process,
    index_settings,
    liger_rows,
    query,
    s3_requests,
)

from pipelines.index.bucket_format import SetsFileContent
from pipelines.index.catalog import LEDGER_TABLE, IndexCatalog
from pipelines.index.committed import committed_since
from pipelines.index.layout import IndexLayout
from pipelines.index.listing import LEGACY_SETS_FILE
from pipelines.index.publish import publish_index, unpublished_record_sets
from pipelines.ingest import process_batch
from pipelines.intake.ledger import FileEntry, Ledger
from pipelines.intake.snapshots import list_reads

__all__ = ["index_settings"]  # the fixture, imported for pytest

HEADER, ROWS = liger_rows(range(2, 14))


def small_csv(n: int) -> bytes:
    """A file of its own: one row of the shared CSV, its timestamp moved by n seconds."""
    fields = list(ROWS[n % len(ROWS)])
    fields[HEADER.index("timestamp")] = f"2024-10-01 00:{n // 60:02d}:{n % 60:02d}"
    return csv_bytes(HEADER, [fields])


def runs(settings: Any) -> int:
    return int(query(settings, "SELECT count(*) FROM runs")[0][0])


def lists(sent: list[tuple[str, str]], prefix: str) -> list[str]:
    return [key for action, key in sent if action == "list" and key.startswith(prefix)]


def test_a_publish_reads_the_ledger_rows_since_its_version_not_a_listing(
    s3_store: Any, index_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(3):
        drop_and_process(s3_store, index_settings, f"incoming/early-{n}.csv", small_csv(n))
    publish_index(s3_store, index_settings)  # the first: its version names the ledger's head
    assert runs(index_settings) == 3
    version = IndexCatalog.beside(s3_store, index_settings).current()
    assert version.ledger_point is not None
    drop_and_process(s3_store, index_settings, "incoming/new.csv", small_csv(10))

    sent = s3_requests(monkeypatch)
    published = publish_index(s3_store, index_settings)

    assert published.published and published.new_runs == 1
    assert runs(index_settings) == 4
    assert lists(sent, "records/") == []  # not one listing of the record sets
    # The rows committed since name just the new batch's sets file.
    catalog = IndexCatalog.beside(s3_store, index_settings)
    [new_sets_file] = committed_since(catalog, version.ledger_point).sets_files
    assert new_sets_file.startswith("records/batches/")
    assert committed_since(catalog, catalog.current().ledger_point).sets_files == []
    assert unpublished_record_sets(s3_store, index_settings) == []


def test_a_sets_file_whose_ledger_row_never_landed_is_processed_again(
    s3_store: Any, index_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch is killed between its sets file and its ledger commit: the publish does not
    see its record set (no row names it), the file is still pending, and its next batch
    registers it again; it lands once."""
    drop_and_process(s3_store, index_settings, "incoming/before.csv", small_csv(0))
    publish_index(s3_store, index_settings)
    info = s3_store.put_bytes("incoming/killed.csv", small_csv(1))
    pending = FileEntry.pending(s3_store.bucket, info)

    real_append = Ledger.append
    monkeypatch.setattr(Ledger, "append", lambda self, entries: None)  # killed before it
    process_batch(s3_store, index_settings, [pending], "killed", publish=False)
    monkeypatch.setattr(Ledger, "append", real_append)
    assert not publish_index(s3_store, index_settings).published
    assert runs(index_settings) == 1
    assert list_reads(s3_store, index_settings, "incoming/killed.csv") == []  # read again

    process_batch(s3_store, index_settings, [pending], "again")

    assert runs(index_settings) == 2
    assert query(index_settings, "SELECT count(*) FROM snapshots WHERE source_key LIKE '%killed%'")
    [(state, sets_file)] = query(
        index_settings, "SELECT state, sets_file FROM files WHERE key = 'incoming/killed.csv'"
    )
    assert state == "indexed" and sets_file.endswith("/sets.json")


def test_a_keys_reads_come_from_the_published_index_and_the_new_sets_files(
    s3_store: Any, index_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    published_read = drop_and_process(s3_store, index_settings, "incoming/old.csv", small_csv(0))
    publish_index(s3_store, index_settings)
    drop_and_process(s3_store, index_settings, "incoming/new.csv", small_csv(1))  # unpublished
    # The first batch's sets file gone from the bucket: a read of it can only be the index's.
    catalog = IndexCatalog.beside(s3_store, index_settings)
    [first_sets_file] = [
        key
        for key in committed_since(catalog, None).sets_files
        if SetsFileContent.loads(s3_store.get_bytes(key)).reads[0].read.snapshot_digest
        == published_read.snapshot_digest
    ]
    s3_store.delete(first_sets_file)
    IndexLayout.of(index_settings).cached_path(first_sets_file).unlink()

    sent = s3_requests(monkeypatch)
    [old] = list_reads(s3_store, index_settings, "incoming/old.csv")
    [new] = list_reads(s3_store, index_settings, "incoming/new.csv")

    assert old.digest == published_read.snapshot_digest
    assert new.key == "incoming/new.csv"
    assert lists(sent, "records/") == []  # no listing of the batches
    assert {r.key for r in list_reads(s3_store, index_settings)} >= {old.key, new.key}


def test_an_index_published_before_ledger_points_is_caught_up_once_from_a_listing(
    s3_store: Any, index_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_and_process(s3_store, index_settings, "incoming/a.csv", small_csv(0))
    publish_index(s3_store, index_settings)
    catalog = IndexCatalog.beside(s3_store, index_settings)
    version = catalog.current()
    # What a kindex before ledger points published: a version that names none.
    catalog.commit_version(
        replace(
            version,
            seq=version.seq + 1,
            version=f"{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}-old",
            parent=version.version,
            ledger_point=None,
        )
    )
    drop_and_process(s3_store, index_settings, "incoming/b.csv", small_csv(1))

    sent = s3_requests(monkeypatch)
    assert publish_index(s3_store, index_settings).published
    assert runs(index_settings) == 2
    assert lists(sent, "records/")  # the catch-up, once
    sent.clear()
    assert not publish_index(s3_store, index_settings).published
    assert lists(sent, "records/") == []


def test_a_home_written_before_batch_files_is_migrated_once_into_a_sets_file(
    s3_store: Any, index_settings: Any
) -> None:
    for n in range(2):
        drop_and_process(s3_store, index_settings, f"incoming/old-{n}.csv", small_csv(n))
    as_legacy_layout(s3_store)  # a summary object per record set, a read object per read
    (Path(index_settings.home) / "catalog.db").unlink()  # and an index of its own time
    legacy = [o.key for o in s3_store.list("records/") if o.key.endswith(".json")]
    assert legacy and not any(key.endswith("/sets.json") for key in legacy)

    assert publish_index(s3_store, index_settings).new_runs == 2

    left = [o.key for o in s3_store.list("records/") if o.key.endswith(".json")]
    assert left == [IndexLayout.of(index_settings).batches_prefix + LEGACY_SETS_FILE]
    content = SetsFileContent.loads(s3_store.get_bytes(left[0]))
    assert len(content.summaries) == 2 and len(content.reads) == 2
    assert {r.key for r in list_reads(s3_store, index_settings)} == {
        "incoming/old-0.csv",
        "incoming/old-1.csv",
    }


def test_a_ledger_point_no_longer_in_the_ledgers_history_reads_every_row(
    s3_store: Any, index_settings: Any
) -> None:
    """A point whose snapshot was expired: every row's sets file, once, rather than none."""
    for n in range(2):
        drop_and_process(s3_store, index_settings, f"incoming/x-{n}.csv", small_csv(n))
    catalog = IndexCatalog.beside(s3_store, index_settings)
    head = committed_since(catalog, None)
    assert head.whole and len(head.sets_files) == 2
    assert committed_since(catalog, head.point) == replace(head, sets_files=[], whole=False)
    gone = committed_since(catalog, -1)  # no such snapshot
    assert gone.whole and gone.sets_files == head.sets_files


def test_the_ledgers_commits_between_versions_are_expired_and_a_publish_still_reads_whats_new(
    s3_store: Any, index_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger's metadata (rewritten and copied by every commit) holds what a retained version,
    the next publish and the newest few commits read, not every commit since the oldest version."""
    from pipelines.intake import ledger as ledger_module

    monkeypatch.setattr(ledger_module, "KEEP_NEWEST_SNAPSHOTS", 1)
    for n in range(2):
        drop_and_process(s3_store, index_settings, f"incoming/first-{n}.csv", small_csv(n))
    publish_index(s3_store, index_settings)
    catalog = IndexCatalog.beside(s3_store, index_settings)
    first = catalog.current()
    for n in range(2, 5):  # commits between the versions
        drop_and_process(s3_store, index_settings, f"incoming/mid-{n}.csv", small_csv(n))
    publish_index(s3_store, index_settings)
    catalog = IndexCatalog.beside(s3_store, index_settings)  # not the tables read before
    second = catalog.current()
    drop_and_process(s3_store, index_settings, "incoming/new.csv", small_csv(9))
    table = catalog.table(LEDGER_TABLE, refresh=True)
    assert first.published_at is not None and second.ledger_point is not None
    as_of_first = table.snapshot_as_of_timestamp(int(first.published_at.timestamp() * 1000))
    assert as_of_first is not None
    point_at = table.snapshot_by_id(second.ledger_point)
    assert point_at is not None
    between = {
        s.snapshot_id
        for s in table.snapshots()
        if as_of_first.timestamp_ms < s.timestamp_ms < point_at.timestamp_ms
    }
    assert len(between) >= 3  # the three batches' commits at least

    assert Ledger.of(s3_store, index_settings).expire()

    after = {s.snapshot_id for s in catalog.table(LEDGER_TABLE, refresh=True).snapshots()}
    assert not between & after  # the commits between the versions are gone
    assert {as_of_first.snapshot_id, second.ledger_point} <= after  # --as-of, the next publish
    since = committed_since(catalog, second.ledger_point)
    assert not since.whole and len(since.sets_files) == 1
    sent = s3_requests(monkeypatch)
    published = publish_index(s3_store, index_settings)
    assert published.new_runs == 1 and lists(sent, "records/") == []
    assert runs(index_settings) == 6
