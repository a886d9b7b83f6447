"""Reading the index straight from the bucket with a plain DuckDB: `iceberg_scan` of each table's
metadata, pinned to the snapshots of one version.

The extensions (httpfs, avro, iceberg) are loaded by path from their pinned PyPI packages: an
extension loads only into its exact DuckDB version, and nothing is downloaded. The same
statements make `kindex connect`'s output and `connect_remote`'s connection.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from urllib.parse import urlsplit

import duckdb
import pyarrow as pa

from pipelines.index.catalog import (
    VERSIONS_SCHEMA,
    VERSIONS_TABLE,
    IndexCatalog,
    S3Access,
    Version,
    s3_access,
)
from pipelines.index.tables import reader_tables, sql_string, view_statements
from pipelines.settings import Settings

EXTENSIONS = ("httpfs", "avro", "iceberg")
# Nothing is ever downloaded or loaded by name.
OFFLINE_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}


def extension_path(name: str) -> Path:
    package = Path(import_module(f"duckdb_extension_{name}").__file__ or "").parent
    return package / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"


def httpfs_path() -> Path:
    return extension_path("httpfs")


def secret_statement(access: S3Access) -> str:
    url = urlsplit(access.endpoint_url)
    token = f", SESSION_TOKEN {sql_string(access.session_token)}" if access.session_token else ""
    return f"""CREATE OR REPLACE SECRET kindex_s3 (
    TYPE s3, KEY_ID {sql_string(access.key_id)}, SECRET {sql_string(access.secret)}{token},
    REGION {sql_string(access.region)}, ENDPOINT {sql_string(url.netloc)},
    URL_STYLE {"'path'" if access.path_style else "'vhost'"},
    USE_SSL {"true" if url.scheme == "https" else "false"})"""


def iceberg_select(location: str, snapshot_id: int | None, schema: pa.Schema) -> str | None:
    if snapshot_id is None:
        return None  # never written: view_statements gives the empty table
    columns = ", ".join(schema.names)
    return (
        f"SELECT {columns} FROM iceberg_scan({sql_string(location)}, "
        f"snapshot_from_id = {int(snapshot_id)})"
    )


def connect_statements(
    settings: Settings, access: S3Access | None = None, version: Version | None = None
) -> list[str]:
    """Statements a DuckDB session with the three extensions runs to see one version of the
    index (the current one by default): every table and view `kindex query` has."""
    access = access or s3_access(settings)
    catalog = IndexCatalog(settings, access)
    served = catalog.served_snapshot_ids(version)  # as of the version asked for, else newest
    version = version or catalog.current()
    pins = {**version.snapshot_ids, **served}
    locations = catalog.metadata_locations()
    sources = {
        name: iceberg_select(locations[name], pins.get(name), schema)
        for name, schema in reader_tables().items()
        if name in locations
    }
    statements = [f"LOAD {sql_string(str(extension_path(name)))}" for name in EXTENSIONS]
    statements.append(secret_statement(access))
    statements += view_statements({k: v for k, v in sources.items() if v})
    if version.seq:
        columns = ", ".join(VERSIONS_SCHEMA.names)
        statements.append(
            f"CREATE OR REPLACE VIEW {VERSIONS_TABLE} AS SELECT {columns} FROM "
            f"iceberg_scan({sql_string(locations[VERSIONS_TABLE])}) WHERE seq <= {version.seq}"
        )
    return statements


def connect_remote(
    settings: Settings, access: S3Access | None = None, version: Version | None = None
) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB whose index views read one version from the bucket."""
    con = duckdb.connect(config=OFFLINE_CONFIG)
    for statement in connect_statements(settings, access, version):
        con.execute(statement)
    return con
