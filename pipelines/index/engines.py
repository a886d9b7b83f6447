"""Reading the index with the engines teams scale out to: the Python `kindex connect --engine`
prints for Polars, Daft and ClickHouse (chdb), each reading one whole version of the index.

Polars and Daft read through the index's catalog (pyiceberg's `load_catalog` with the same
properties kindex uses: the SQL catalog, SQLite or a PostgreSQL several hosts share, or a REST
catalog), each table pinned to the snapshot the version's `index_versions` row names. ClickHouse
takes no such catalog: it reads each table's metadata file from the bucket (`IcebergS3`), and
`iceberg_timestamp_ms` at the version's publish time picks, in every table, the snapshot that
was current then, which is the one the version names (a publish commits its tables before the
version). The views (`runs`, `latest_runs`, `speedups`...) live in DuckDB only: these read the
stored tables.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pipelines.index.catalog import VERSIONS_TABLE, IndexCatalog, catalog_properties
from pipelines.index.tables import reader_tables

if TYPE_CHECKING:  # the CLI reads ENGINES at start: the catalog (pyiceberg) loads when used
    from pipelines.index.catalog import S3Access, Version
    from pipelines.settings import Settings

ENGINES = ("polars", "daft", "clickhouse")
# The table each snippet's example query reads (the stored runs).
RUNS_TABLE = "run_segments"


def engine_snippet(
    engine: str, settings: Settings, access: S3Access, version: Version | None = None
) -> str:
    """A Python program that reads one version of the index (the current one by default) with
    `engine`: it defines `tables` (name -> the engine's frame or table) and prints the latest
    runs per kernel. It holds the S3 secret."""

    catalog = IndexCatalog(settings, access)
    served = catalog.served_snapshot_ids(version)
    version = version or catalog.current()
    pins = {**version.snapshot_ids, **served}
    snapshots = {
        name: int(snapshot_id)
        for name, snapshot_id in pins.items()
        if snapshot_id is not None and name in reader_tables()
    }
    header = (
        f"# kindex connect --engine {engine}: index version {version.version or '(none yet)'} "
        f"(seq {version.seq}).\n# It holds the S3 secret: keep it private.\n"
    )
    if engine == "clickhouse":
        return header + clickhouse_snippet(catalog, access, version, snapshots)
    body = {"polars": POLARS, "daft": DAFT}[engine]
    return header + body.format(
        catalog=_literal(catalog_properties(settings, access)),
        namespace=catalog.namespace,
        snapshots=_literal(snapshots),
        storage=_literal(polars_storage_options(access)),
        io_config=daft_io_config(access),
        runs=RUNS_TABLE,
        versions=VERSIONS_TABLE,
    )


def _literal(value: object) -> str:
    """A Python literal of a dict of strings and ints (JSON is one)."""
    return json.dumps(value, indent=4, sort_keys=True)


def polars_storage_options(access: S3Access) -> dict[str, str]:
    """Polars' object_store options for the bucket."""
    options = {
        "aws_endpoint_url": access.endpoint_url,
        "aws_access_key_id": access.key_id,
        "aws_secret_access_key": access.secret,
        "aws_region": access.region,
        "aws_allow_http": str(urlsplit(access.endpoint_url).scheme == "http").lower(),
        "aws_virtual_hosted_style_request": str(not access.path_style).lower(),
    }
    if access.session_token:
        options["aws_session_token"] = access.session_token
    return options


def daft_io_config(access: S3Access) -> str:
    """The Python expression of Daft's IOConfig for the bucket."""
    arguments = {
        "endpoint_url": access.endpoint_url,
        "key_id": access.key_id,
        "access_key": access.secret,
        "region_name": access.region,
    }
    if access.session_token:
        arguments["session_token"] = access.session_token
    listed = "".join(f"        {key}={json.dumps(value)},\n" for key, value in arguments.items())
    return (
        f"IOConfig(\n    s3=S3Config(\n{listed}"
        f"        force_virtual_addressing={not access.path_style},\n    )\n)"
    )


def table_url(access: S3Access, location: str) -> str:
    """The HTTP(S) URL of an s3:// table location, as ClickHouse's IcebergS3 wants it."""
    parts = urlsplit(location)
    endpoint = urlsplit(access.endpoint_url)
    if access.path_style:
        return f"{endpoint.scheme}://{endpoint.netloc}/{parts.netloc}{parts.path}/"
    return f"{endpoint.scheme}://{parts.netloc}.{endpoint.netloc}{parts.path}/"


def clickhouse_snippet(
    catalog: IndexCatalog, access: S3Access, version: Version, snapshots: dict[str, int]
) -> str:
    metadata = catalog.metadata_locations()
    published_ms = int(version.published_at.timestamp() * 1000) if version.published_at else 0
    statements = []
    readable = []
    for name in snapshots:
        table = catalog.table(name)
        if not any(s.timestamp_ms <= published_ms for s in table.snapshots()):
            continue  # a served table first written after the version: none of it then
        readable.append(name)
        location = table.location().rstrip("/")
        relative = metadata[name].removeprefix(location + "/")
        credentials = [access.key_id, access.secret]
        if access.session_token:
            credentials.append(access.session_token)
        arguments = ", ".join(_sql(v) for v in (table_url(access, location), *credentials))
        statements.append(
            f"CREATE TABLE {name} ENGINE = IcebergS3({arguments}) "
            f"SETTINGS iceberg_metadata_file_path = {_sql(relative)}"
        )
    return CLICKHOUSE.format(
        statements=_literal(statements),
        tables=_literal(sorted(readable)),
        published_ms=published_ms,
        runs=RUNS_TABLE,
    )


def _sql(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


POLARS = """import polars as pl
from pyiceberg.catalog import load_catalog

catalog = load_catalog("kindex", **{catalog})
# Polars' own S3 client reads the data files.
STORAGE = {storage}
# One whole version: each table at the snapshot its {versions} row names (the file ledger at
# the snapshot it had then, or its newest); a table never written yet is absent.
SNAPSHOTS = {snapshots}
tables = {{
    name: pl.scan_iceberg(
        catalog.load_table(("{namespace}", name)), snapshot_id=snapshot_id, storage_options=STORAGE
    )
    for name, snapshot_id in SNAPSHOTS.items()
}}

# The latest runs per kernel: a filter on `live` reads only the live partition's files.
if "{runs}" in tables:
    latest = tables["{runs}"].filter(pl.col("live") & pl.col("superseded_by").is_null())
    print(latest.group_by("kernel").len().sort("len", descending=True).head(10).collect())
"""

DAFT = """import daft
from daft.io import IOConfig, S3Config
from pyiceberg.catalog import load_catalog

catalog = load_catalog("kindex", **{catalog})
# Daft's own S3 client reads the data files.
IO = {io_config}
# One whole version: each table at the snapshot its {versions} row names (the file ledger at
# the snapshot it had then, or its newest); a table never written yet is absent.
SNAPSHOTS = {snapshots}
tables = {{
    name: daft.read_iceberg(
        catalog.load_table(("{namespace}", name)), snapshot_id=snapshot_id, io_config=IO
    )
    for name, snapshot_id in SNAPSHOTS.items()
}}

# The latest runs per kernel: a filter on `live` plans only the live partition's files. On a
# Ray cluster, call daft.set_runner_ray(address=...) before this.
if "{runs}" in tables:
    latest = tables["{runs}"].where(daft.col("live") & daft.col("superseded_by").is_null())
    runs = latest.groupby("kernel").agg(daft.col("run_digest").count().alias("runs"))
    runs.sort("runs", desc=True).show(10)
"""

CLICKHOUSE = """from chdb import session

con = session.Session()
# Each table from its metadata file in the bucket (ClickHouse takes no SQL catalog).
for statement in {statements}:
    con.query(statement)
# One whole version: in every table, the snapshot current when the version was published.
tables = {tables}
if tables:
    con.query("SET iceberg_timestamp_ms = {published_ms}")

# The latest runs per kernel (ClickHouse prunes by the `live` partition too).
if "{runs}" in tables:
    print(
        con.query(
            "SELECT kernel, count() AS runs FROM {runs} "
            "WHERE live AND superseded_by IS NULL "
            "GROUP BY kernel ORDER BY runs DESC LIMIT 10",
            "PrettyCompact",
        )
    )
"""
