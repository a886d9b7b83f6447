"""DuckDB reads the published index straight from the bucket (embedded SeaweedFS): `iceberg_scan`
of each Iceberg table, through the iceberg, avro and httpfs extensions loaded by path from their
pinned packages: no download, no local copy. pyiceberg reads the same tables through the
catalog."""

from __future__ import annotations

import shutil
from typing import Any

from index_support import csv_bytes, index_settings, ingest_bytes, liger_rows

from pipelines.index.catalog import IndexCatalog, S3Access
from pipelines.index.layout import IndexLayout
from pipelines.index.local import open_index
from pipelines.index.remote import EXTENSIONS, connect_remote, extension_path
from pipelines.index.tables import table_fingerprints
from pipelines.storage.embedded import EmbeddedS3

__all__ = ["index_settings"]


def test_duckdb_reads_the_published_index_from_the_bucket(
    embedded_s3: EmbeddedS3, s3_store: Any, index_settings: Any
) -> None:
    rows = csv_bytes(*liger_rows(range(2, 402)))
    ingest_bytes(s3_store, index_settings, [("incoming/a.csv", rows)])
    local = open_index(index_settings)
    try:
        expected = table_fingerprints(local)
    finally:
        local.close()
    layout = IndexLayout.of(index_settings)
    shutil.rmtree(layout.cache_dir)  # nothing local left to read: only the bucket
    access = S3Access(
        embedded_s3.endpoint_url,
        embedded_s3.credentials.access_key,
        embedded_s3.credentials.secret_key,
    )
    remote = connect_remote(index_settings, access)
    try:
        assert table_fingerprints(remote) == expected
        loaded = remote.execute(
            "SELECT extension_name FROM duckdb_extensions() WHERE loaded ORDER BY 1"
        ).fetchall()
        scanned = remote.execute(
            "SELECT count(*) FROM duckdb_views() WHERE sql LIKE '%iceberg_scan(''s3://%'"
        ).fetchone()
    finally:
        remote.close()
    assert {name for (name,) in loaded} >= set(EXTENSIONS)
    assert all(extension_path(name).exists() for name in EXTENSIONS)
    assert scanned and scanned[0] >= 4
    assert not layout.cache_dir.exists()
    # pyiceberg, through the catalog, reads the runs the views show.
    table = IndexCatalog(index_settings, access).table("run_segments")
    assert table.scan().to_arrow().num_rows == 400
    assert expected["runs"].startswith("400:")
