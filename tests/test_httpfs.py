"""DuckDB reads the published Parquet straight from the bucket (embedded SeaweedFS) through the
httpfs extension loaded by path from the pinned `duckdb-extension-httpfs` package: no download,
no local copy."""

from __future__ import annotations

import shutil
from typing import Any

from index_support import csv_bytes, index_settings, ingest_bytes, liger_rows

from pipelines.index.layout import IndexLayout
from pipelines.index.local import load_current, open_index
from pipelines.index.remote import S3Access, connect_remote, httpfs_path
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
    remote = connect_remote(s3_store, index_settings, access)
    try:
        assert table_fingerprints(remote) == expected
        loaded = remote.execute(
            "SELECT install_path FROM duckdb_extensions() "
            "WHERE extension_name = 'httpfs' AND loaded"
        ).fetchall()
        # The run segments the current version's manifest names, read by their s3:// URLs:
        # here the record set of the one file, which the index uses as it is.
        segments = load_current(s3_store, layout)["files"]["run_segments"]
        urls = ", ".join(f"'s3://{s3_store.bucket}/{key}'" for key in segments)
        files = remote.execute(
            f"SELECT filename, count(*) FROM read_parquet([{urls}], filename = true) "
            "GROUP BY filename"
        ).fetchall()
    finally:
        remote.close()
    assert loaded and httpfs_path().exists()
    assert len(files) == 1 and files[0][0].startswith("s3://") and files[0][1] == 400
    assert segments[0].startswith(layout.records_prefix) and segments[0].endswith("/runs.parquet")
    assert not layout.cache_dir.exists()
