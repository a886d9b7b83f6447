"""The process-parallel record builder gives exactly the serial builder's tables, duplicates and
bad rows included, and an ingest through it gives the same index."""

from __future__ import annotations

from typing import Any

import pytest
from index_support import (
    LIGER_CSV,
    csv_bytes,
    fingerprints,
    index_settings,
    ingest_bytes,
    liger_rows,
)

from pipelines import ingest as ingest_module
from pipelines.index import parallel_records
from pipelines.index.record_objects import RecordSetBuilder
from pipelines.liger.normalize import PARSER_VERSION, normalize_bytes

__all__ = ["index_settings"]
DIGEST = "sha256:" + "ab" * 32


def serial_tables(data: bytes) -> tuple[int, dict[str, Any]]:
    builder = RecordSetBuilder(DIGEST, PARSER_VERSION)
    for outcome in normalize_bytes(data):
        builder.add(outcome)
    return builder.rows, builder.tables()


def messy_csv() -> bytes:
    """The shared CSV's first 900 rows, then: rows repeated verbatim (duplicate externalIds,
    near their first copy and far from it), a row with a bad number, a short row."""
    header, rows = liger_rows(range(2, 902))
    bad = list(rows[5])
    bad[header.index("y_value_50")] = "fast"
    extra = [rows[1], rows[850], bad, rows[2][:3], rows[0]]
    return csv_bytes(header, rows[:400] + extra + rows[400:])


@pytest.mark.parametrize("data", [LIGER_CSV.read_bytes(), messy_csv()], ids=["shared", "messy"])
def test_parallel_tables_equal_the_serial_ones(
    data: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parallel_records, "BATCH_ROWS", 150)  # many batches, duplicates across
    rows, tables = parallel_records.build_tables_parallel(data, DIGEST, PARSER_VERSION, workers=2)
    serial_rows, serial = serial_tables(data)
    assert rows == serial_rows
    assert set(tables) == set(serial)
    for name, table in serial.items():
        assert tables[name].equals(table), name
    if data != LIGER_CSV.read_bytes():
        reasons = tables["quarantine"].column("reason").to_pylist()
        assert reasons.count("duplicate_external_id") == 3


def test_an_ingest_through_the_parallel_path_gives_the_same_index(
    s3_store: Any, index_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = messy_csv()
    ingest_bytes(s3_store, index_settings, [("incoming/messy.csv", data)])
    serial = fingerprints(index_settings)
    parallel_settings = index_settings.replace(
        home=index_settings.home.parent / "parallel-home",
        records_prefix="parallel-records/",
        index_prefix="parallel-index/",
    )
    monkeypatch.setattr(ingest_module, "worth_parallel", lambda size: True)
    monkeypatch.setattr(parallel_records, "BATCH_ROWS", 200)
    ingest_bytes(s3_store, parallel_settings, [("incoming/messy.csv", data)])
    assert fingerprints(parallel_settings) == serial
