"""The `no_failing_files` check's set, carried from look to look: a file quarantined long ago
stays failing, and each look reads only the windows of the versions committed since the last."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from index_support import index_settings

from pipelines.intake.failing import FAILING_FILES, Failing, _save, failing_files
from pipelines.intake.ledger import FileEntry, FileState, Ledger

__all__ = ["index_settings"]  # the fixture, imported for pytest

NOW = datetime.now(UTC).replace(microsecond=0)


def row(key: str, days_ago: float, state: FileState, reason: str | None = None) -> FileEntry:
    return FileEntry(
        bucket="b",
        key=f"incoming/{key}.csv",
        etag=f"etag-{key}",
        last_modified=NOW - timedelta(days=days_ago),
        size=1,
        version_id=None,
        state=state,
        reason=reason,
    )


def whole(ledger: Ledger) -> list[FileEntry]:
    """What the check read before: every window's failing rows."""
    return ledger.current("state IN ('failed', 'quarantined')")


def keys(found: Failing) -> set[str]:
    return {entry.key.removeprefix("incoming/").removesuffix(".csv") for entry in found.files}


class Reads:
    """The ledger reads a look makes: a whole read, or the versions it asks about."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.whole = 0
        self.seen: list[set[str]] = []
        real_current, real_seen = Ledger.current, Ledger.seen

        def current(ledger: Ledger, *args: Any, **kwargs: Any) -> list[FileEntry]:
            if kwargs.get("row_filter") is None and len(args) < 3:
                self.whole += 1
            return real_current(ledger, *args, **kwargs)

        def seen(ledger: Ledger, versions: Any) -> Any:
            versions = list(versions)
            self.seen.append({v.key for v in versions})
            return real_seen(ledger, versions)

        monkeypatch.setattr(Ledger, "current", current)
        monkeypatch.setattr(Ledger, "seen", seen)


def test_a_file_quarantined_long_ago_stays_failing_and_a_look_reads_what_changed(
    s3_store: Any, index_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger.of(s3_store, index_settings)
    ledger.append(
        [
            row("old-bad", 40, FileState.QUARANTINED, "bad_number"),
            row("old-good", 40, FileState.INDEXED),
            row("fixed-later", 2, FileState.FAILED, "OSError: reset"),
        ]
    )
    reads = Reads(monkeypatch)

    first = failing_files(s3_store, index_settings, ledger)  # nothing carried: the whole ledger
    assert keys(first) == {"old-bad", "fixed-later"} and reads.whole == 1
    assert first.files == whole(ledger)

    ledger.append([row("fixed-later", 2, FileState.INDEXED), row("new-bad", 0, FileState.FAILED)])
    ledger.append([row("new-good", 0, FileState.INDEXED)])
    reads.whole, reads.seen = 0, []

    second = failing_files(s3_store, index_settings, ledger)

    assert reads.whole == 0  # no read of every window
    expected = {"incoming/fixed-later.csv", "incoming/new-bad.csv", "incoming/new-good.csv"}
    assert reads.seen == [expected]  # the versions of the rows since
    assert keys(second) == {"old-bad", "new-bad"}  # 40 days old, never read again, still failing
    assert second.files == whole(ledger)
    assert second.point == ledger.head()

    reads.whole, reads.seen = 0, []
    assert failing_files(s3_store, index_settings, ledger) == second  # nothing since
    assert reads.whole == 0 and reads.seen == []


def test_a_point_no_longer_in_the_ledgers_history_reads_the_ledger_again(
    s3_store: Any, index_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger.of(s3_store, index_settings)
    ledger.append([row("bad", 3, FileState.QUARANTINED, "bad_number")])
    # What a look saved before the ledger's snapshots expired: its point is gone, and the set
    # it carries is stale (the file was fixed since).
    _save(s3_store, index_settings.index_prefix + FAILING_FILES, Failing(-1, []))
    ledger.append([row("other", 0, FileState.FAILED, "OSError")])
    reads = Reads(monkeypatch)

    found = failing_files(s3_store, index_settings, ledger)

    assert reads.whole == 1
    assert keys(found) == {"bad", "other"} and found.files == whole(ledger)

    # A set cut short (not Parquet): read again, and saved whole.
    s3_store.put_bytes(index_settings.index_prefix + FAILING_FILES, b"PAR1 cut short")
    reads.whole = 0
    assert failing_files(s3_store, index_settings, ledger) == found
    assert reads.whole == 1
