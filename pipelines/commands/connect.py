"""`kindex connect`: the statements a plain DuckDB runs to read the index from the bucket (or,
with `--engine`, a Python program reading it with Polars, Daft or ClickHouse: engines.py).

They load the httpfs, avro and iceberg extensions by path from their pinned PyPI packages
(nothing is downloaded), create an S3 secret, and create every table and view `kindex query`
has, each stored table an `iceberg_scan` pinned to the snapshot of one version. Any DuckDB
1.5.5 session with those three packages installed can run them.
"""

from __future__ import annotations

import argparse
import sys

from pipelines.index.catalog import IndexCatalog, IndexOutdated, VersionNotFound, s3_access
from pipelines.index.engines import ENGINES, engine_snippet
from pipelines.index.remote import connect_statements
from pipelines.settings import Settings
from pipelines.storage.errors import StorageError
from pipelines.storage.s3 import store_session


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "connect",
        help="print SQL that lets a plain DuckDB read the index's Iceberg tables from the bucket",
        description="Print the statements a DuckDB 1.5.5 session (with duckdb-extension-httpfs, "
        "-avro and -iceberg installed) runs to see the same tables and views as `kindex query`, "
        "read from the bucket. The output holds the S3 secret: keep it private.",
    )
    parser.add_argument(
        "--as-of", metavar="WHEN", help="an earlier version (as `kindex query --as-of`)"
    )
    parser.add_argument(
        "--engine",
        choices=("duckdb", *ENGINES),
        default="duckdb",
        help="print DuckDB's statements (the default), or a Python program reading the same "
        "version with Polars or Daft (through the catalog) or ClickHouse's chdb (from the "
        "bucket); docs/engines.md",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    try:
        with store_session(settings) as store:
            access = s3_access(settings, store.endpoint_url, store.credentials)
            version = IndexCatalog(settings, access).as_of(args.as_of) if args.as_of else None
            if args.engine != "duckdb":
                snippet = engine_snippet(args.engine, settings, access, version)
            else:
                statements = connect_statements(settings, access, version)
    except (StorageError, VersionNotFound, IndexOutdated) as error:
        print(f"kindex connect: {error}", file=sys.stderr)
        return 1
    if settings.embedded:
        print(
            "kindex connect: the embedded S3 server must be running for these to work "
            "(`kindex up`)",
            file=sys.stderr,
        )
    if args.engine != "duckdb":
        print(snippet, end="")
        return 0
    print("-- kindex connect: holds an S3 secret; keep it private.")
    for statement in statements:
        print(statement.strip() + ";")
    return 0
