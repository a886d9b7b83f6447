"""History across versions of one object key: superseded_by and retracted_in_source, row by row."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from index_support import (
    as_legacy_layout,
    csv_bytes,
    fingerprints,
    index_settings,
    ingest_bytes,
    liger_rows,
    query,
)

from pipelines.cli import main
from pipelines.index.bucket_format import ObjectRead
from pipelines.index.layout import IndexLayout
from pipelines.index.publish import publish_index
from pipelines.intake.snapshots import (
    latest_read_per_key,
)

__all__ = ["index_settings"]  # the fixture, imported for pytest

KEY = "incoming/history.csv"
# Six jsd memory cases (distinct vocab sizes) of the shared CSV, file lines 448-453.
HEADER, CASES = liger_rows(range(448, 454))
T1, T2, T3 = "2024-10-02 16:21:31", "2024-11-05 09:00:00", "2024-12-24 18:30:00"


def row(case: str, timestamp: str) -> list[str]:
    """Case A..F measured at a timestamp; a re-measurement gets a different value."""
    fields = list(CASES["ABCDEF".index(case)])
    fields[HEADER.index("timestamp")] = timestamp
    bump = {T1: 0.0, T2: 1.0, T3: 2.0}[timestamp]
    for column in ("y_value_50", "y_value_20", "y_value_80"):
        fields[HEADER.index(column)] = repr(float(fields[HEADER.index(column)]) + bump)
    return fields


# v2 re-measures A, drops B, adds E; v3 re-measures D, drops C, adds F.
V1 = [("A", T1), ("B", T1), ("C", T1), ("D", T1)]
V2 = [("A", T2), ("C", T1), ("D", T1), ("E", T2)]
V3 = [("A", T2), ("D", T3), ("E", T2), ("F", T3)]
VERSIONS = {"v1": V1, "v2": V2, "v3": V3}


def version_bytes(name: str) -> bytes:
    return csv_bytes(HEADER, [row(c, t) for c, t in VERSIONS[name]])


def run_table(settings: Any) -> dict[tuple[str, str], tuple[str | None, bool]]:
    """(case letter, timestamp) -> (superseded_by as (case, timestamp) label, retracted)."""
    vocab = {c[HEADER.index("x_value")]: letter for letter, c in zip("ABCDEF", CASES, strict=True)}
    rows = query(
        settings,
        "SELECT run_digest, external_id, strftime(observed_at, '%Y-%m-%d %H:%M:%S'), "
        "superseded_by, retracted_in_source FROM runs",
    )
    label = {}
    for digest, external_id, observed, _, _ in rows:
        case_key = external_id.split("/")[4]
        letter = next(v for x, v in vocab.items() if f"vocab{x}-" in case_key)
        label[digest] = (letter, observed)
    return {
        label[d]: (None if s is None else "".join(label[s][0]) + "@" + label[s][1], r)
        for d, _, _, s, r in rows
    }


def at(case: str, timestamp: str) -> tuple[str, str]:
    return (case, timestamp)


SUPERSEDED = {at("A", T1): "A@" + T2, at("D", T1): "D@" + T3}


def test_versions_in_order_mark_superseded_and_retracted(
    s3_store: Any, index_settings: Any
) -> None:
    for name in ("v1", "v2", "v3"):
        ingest_bytes(s3_store, index_settings, [(KEY, version_bytes(name))])
    assert run_table(index_settings) == {
        at("A", T1): (SUPERSEDED[at("A", T1)], False),
        at("B", T1): (None, True),  # dropped in v2, never re-measured
        at("C", T1): (None, True),  # dropped in v3
        at("D", T1): (SUPERSEDED[at("D", T1)], False),  # superseded, so not retracted
        at("A", T2): (None, False),
        at("E", T2): (None, False),
        at("D", T3): (None, False),
        at("F", T3): (None, False),
    }
    assert query(index_settings, "SELECT count(*) FROM snapshots") == [(3,)]
    assert query(index_settings, "SELECT count(DISTINCT run_digest) FROM lineage") == [(8,)]


def test_supersession_is_independent_of_order(s3_store: Any, index_settings: Any) -> None:
    # v3 first, v1 last: v1 is now the newest version of the key in the bucket.
    for name in ("v3", "v2", "v1"):
        ingest_bytes(s3_store, index_settings, [(KEY, version_bytes(name))])
    table = run_table(index_settings)
    assert {k: s for k, (s, _) in table.items() if s} == SUPERSEDED
    # Retraction is judged against v1: what v1 lacks and nothing superseded is retracted.
    assert {k for k, (_, r) in table.items() if r} == {
        at("A", T2),
        at("E", T2),
        at("D", T3),
        at("F", T3),
    }


def test_a_run_still_held_by_another_key_is_not_retracted(
    s3_store: Any, index_settings: Any
) -> None:
    ingest_bytes(
        s3_store,
        index_settings,
        [(KEY, version_bytes("v1")), ("incoming/copy.csv", version_bytes("v1"))],
    )
    for name in ("v2", "v3"):
        ingest_bytes(s3_store, index_settings, [(KEY, version_bytes(name))])
    table = run_table(index_settings)
    assert table[at("B", T1)] == (None, False)  # the copy's newest version still holds B and C
    assert table[at("C", T1)] == (None, False)
    # Same bytes under two keys: one snapshot, two reads.
    assert query(
        index_settings, "SELECT count(*), count(DISTINCT snapshot_digest) FROM snapshots"
    ) == [(4, 3)]


def test_a_run_first_seen_elsewhere_is_held_by_another_snapshot(
    s3_store: Any, index_settings: Any
) -> None:
    """B is first seen in v1 of the key; another file (other bytes: another snapshot) holds B
    too. v2 of the key drops B: B is still held by the other file's newest version, and is not
    retracted until that version drops it as well."""
    other = "incoming/other.csv"
    ingest_bytes(s3_store, index_settings, [(KEY, version_bytes("v1"))])
    ingest_bytes(s3_store, index_settings, [(other, csv_bytes(HEADER, [row("B", T1)]))])
    ingest_bytes(s3_store, index_settings, [(KEY, version_bytes("v2"))])
    table = run_table(index_settings)
    assert table[at("B", T1)] == (None, False)
    assert table[at("A", T1)] == ("A@" + T2, False)
    ingest_bytes(s3_store, index_settings, [(other, csv_bytes(HEADER, [row("F", T3)]))])
    assert run_table(index_settings)[at("B", T1)] == (None, True)


def test_reingest_of_a_version_changes_nothing(s3_store: Any, index_settings: Any) -> None:
    for name in ("v1", "v2"):
        ingest_bytes(s3_store, index_settings, [(KEY, version_bytes(name))])
    before = run_table(index_settings)
    summary = ingest_bytes(s3_store, index_settings, [(KEY, version_bytes("v2"))])
    assert summary.files[0].reused
    assert run_table(index_settings) == before


def spread(case: str, version: str, p20: float, p50: float, p80: float) -> list[str]:
    fields = row(case, {"0.7.0": T1, "0.8.0": T2}[version])
    for column, value in (("y_value_20", p20), ("y_value_50", p50), ("y_value_80", p80)):
        fields[HEADER.index(column)] = repr(value)
    fields[HEADER.index("liger_version")] = version
    return fields


def test_a_regression_needs_the_spreads_to_separate(s3_store: Any, index_settings: Any) -> None:
    old = [spread("A", "0.7.0", 10.0, 11.0, 12.0), spread("B", "0.7.0", 10.0, 11.0, 12.0)]
    new = [spread("A", "0.8.0", 12.5, 13.0, 14.0), spread("B", "0.8.0", 11.5, 13.0, 14.0)]
    ingest_bytes(s3_store, index_settings, [(KEY, csv_bytes(HEADER, old + new))])
    rows = query(
        index_settings,
        "SELECT regexp_extract(case_key, 'vocab[0-9]+'), old_version, new_version, regressed "
        "FROM version_changes ORDER BY 1",
    )
    vocab = {
        letter: "vocab" + c[HEADER.index("x_value")]
        for letter, c in zip("AB", CASES[:2], strict=True)
    }
    assert rows == [(vocab["A"], "0.7.0", "0.8.0", True), (vocab["B"], "0.7.0", "0.8.0", False)]
    # One pair of versions is no history: the kernel-level verdict does not guess.
    assert query(index_settings, "SELECT verdict, cases FROM version_verdicts") == [
        ("not enough evidence", 2)
    ]
    assert query(index_settings, "SELECT * FROM regressions") == []


# -- a key back to bytes it held before (A, B, A) ------------------------------------------------

# B is A less two rows (C and D).
A_ROWS, B_ROWS = [("A", T1), ("B", T1), ("C", T1), ("D", T1)], [("A", T1), ("B", T1)]


def retracted(settings: Any) -> set[tuple[str, str]]:
    return {k for k, (_, r) in run_table(settings).items() if r}


def rows_bytes(rows: list[tuple[str, str]]) -> bytes:
    return csv_bytes(HEADER, [row(c, t) for c, t in rows])


def test_a_key_back_to_bytes_it_held_before_retracts_nothing(
    s3_store: Any, index_settings: Any
) -> None:
    ingest_bytes(s3_store, index_settings, [(KEY, rows_bytes(A_ROWS))])
    ingest_bytes(s3_store, index_settings, [(KEY, rows_bytes(B_ROWS))])
    assert retracted(index_settings) == {at("C", T1), at("D", T1)}  # B lacks them

    ingest_bytes(s3_store, index_settings, [(KEY, rows_bytes(A_ROWS))])

    assert retracted(index_settings) == set()  # the key holds A again
    # Three uploads, three reads: the second A is a read of its own, of the first A's snapshot.
    assert query(
        index_settings, "SELECT count(*), count(DISTINCT snapshot_digest) FROM snapshots"
    ) == [(3, 2)]


def test_kindex_ingest_of_a_file_back_to_an_earlier_content(
    s3_store: Any, index_settings: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "history.csv"
    for rows in (A_ROWS, B_ROWS):
        path.write_bytes(rows_bytes(rows))
        assert main(["ingest", str(path), "--no-progress"]) == 0
    assert "retracted 2" in capsys.readouterr().out
    path.write_bytes(rows_bytes(A_ROWS))
    assert main(["ingest", str(path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "already processed" in out and "retracted 0" in out
    assert retracted(index_settings) == set()


@pytest.mark.slow  # an older home's upgrade: in the full run
def test_the_first_publish_after_the_upgrade_mends_a_home_left_wrong(
    s3_store: Any, index_settings: Any
) -> None:
    """The wrong state the old in-process path left: the second A's read had the first A's id,
    so it overwrote the first A's read object (now saying the newer upload) and was never
    folded in. The index moved to Iceberg tables: the first publish into the new catalog
    rebuilds from every record set and read object, and the key's newest read is A again."""
    ingest_bytes(s3_store, index_settings, [(KEY, rows_bytes(A_ROWS))])
    ingest_bytes(s3_store, index_settings, [(KEY, rows_bytes(B_ROWS))])
    as_legacy_layout(s3_store)  # the old format's home: an object per summary and per read
    b_read = latest_read_per_key(s3_store, index_settings)[KEY]
    read_object = next(
        o.key for o in s3_store.list("records/") if "/reads/" in o.key and b_read.hex not in o.key
    )
    first_a = ObjectRead.from_json(s3_store.get_bytes(read_object))
    second_a = replace(first_a, last_modified=b_read.last_modified + timedelta(seconds=5))
    s3_store.put_bytes(read_object, second_a.to_json())  # what the old code did, in place
    # The old format's home: no catalog, and no read objects in its cache.
    (Path(index_settings.home) / "catalog.db").unlink()
    IndexLayout.of(index_settings).cached_path(read_object).unlink(missing_ok=True)
    assert retracted(index_settings) == {at("C", T1), at("D", T1)}

    publish_index(s3_store, index_settings)

    assert retracted(index_settings) == set()


@pytest.mark.slow  # a long scenario: in the full run
def test_late_runs_across_liger_versions_equal_one_publish_of_all(
    s3_store: Any, index_settings: Any
) -> None:
    """Files newest first, each under its own key: every later file is late (its runs are older
    than the series' newest), so the stored rows it changes (a settled run's successor, a head of
    a Liger version) are rewritten; every table and view equals one publish of all the files."""

    def measured(cases: str, timestamp: str, version: str) -> list[str]:
        rows = []
        for case in cases:
            fields = row(case, timestamp)
            fields[HEADER.index("liger_version")] = version
            rows.append(fields)
        return rows

    files = [
        ("incoming/late-1.csv", csv_bytes(HEADER, measured("AD", T3, "0.4.0"))),
        ("incoming/late-2.csv", csv_bytes(HEADER, measured("AD", T2, "0.3.0"))),
        ("incoming/late-3.csv", csv_bytes(HEADER, measured("ADB", T1, "0.4.0"))),
        ("incoming/late-4.csv", csv_bytes(HEADER, measured("A", T2, "0.3.0"))),
    ]
    # Between A@T1 (settled by now) and its successor A@T2: A@T1's stored row is rewritten.
    between = measured("A", T1, "0.3.0")[0]
    between[HEADER.index("timestamp")] = "2024-10-20 00:00:00"
    between[HEADER.index("y_value_50")] += "1"
    files.append(("incoming/late-5.csv", csv_bytes(HEADER, [between])))
    for key, data in files:
        ingest_bytes(s3_store, index_settings, [(key, data)])
    one_by_one = fingerprints(index_settings)
    assert query(index_settings, "SELECT count(*) FROM version_changes") == [(2,)]
    assert run_table(index_settings)[at("A", T1)] == ("A@2024-10-20 00:00:00", False)

    other_store = s3_store.with_bucket(s3_store.bucket + "-b")
    other_store.ensure_bucket()
    other = index_settings.replace(
        home=Path(index_settings.home).parent / "all-at-once", bucket=other_store.bucket
    )
    ingest_bytes(other_store, other, files)
    assert fingerprints(other) == one_by_one
