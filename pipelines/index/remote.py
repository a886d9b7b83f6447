"""DuckDB reading the published index straight from the bucket, through the pinned httpfs.

The extension is loaded by path from the `duckdb-extension-httpfs` wheel (it loads only into its
exact DuckDB version, and nothing is downloaded). The views are those of the local database, over
s3:// URLs of the version `index/CURRENT` names at connect time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import duckdb
import duckdb_extension_httpfs

from pipelines.index.layout import IndexLayout
from pipelines.index.local import load_current
from pipelines.index.tables import create_views, sql_string
from pipelines.storage.base import ObjectStore


def httpfs_path() -> Path:
    package = Path(duckdb_extension_httpfs.__file__).parent
    return package / "extensions" / f"v{duckdb.__version__}" / "httpfs.duckdb_extension"


@dataclass(frozen=True, slots=True)
class S3Access:
    endpoint_url: str  # e.g. http://127.0.0.1:8333
    key_id: str
    secret: str
    region: str = "us-east-1"


def load_httpfs(con: duckdb.DuckDBPyConnection, access: S3Access) -> None:
    con.execute(f"LOAD {sql_string(str(httpfs_path()))}")
    url = urlsplit(access.endpoint_url)
    con.execute(
        f"""CREATE OR REPLACE SECRET kindex_s3 (
                TYPE s3, KEY_ID {sql_string(access.key_id)}, SECRET {sql_string(access.secret)},
                REGION {sql_string(access.region)}, ENDPOINT {sql_string(url.netloc)},
                URL_STYLE 'path', USE_SSL {"true" if url.scheme == "https" else "false"})"""
    )


def connect_remote(
    store: ObjectStore, settings: Any, access: S3Access
) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB whose index views read the current version's Parquet from S3."""
    layout = IndexLayout.of(settings)
    manifest = load_current(store, layout)
    # Nothing is ever downloaded: httpfs comes from the pinned package, by path.
    con = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    load_httpfs(con, access)
    files = {
        name: [f"s3://{layout.bucket}/{key}" for key in keys]
        for name, keys in manifest["files"].items()
    }
    create_views(con, files)
    return con
