"""`kindex query "SQL" [--format table|csv|json]`: SQL over the local index, opened read-only."""

from __future__ import annotations

import argparse
import csv
import sys
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import duckdb
import orjson

from pipelines.index.local import IndexNotFound, open_index


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "query",
        help="run SQL over the index (tables: runs, snapshots, lineage, quarantine, ...)",
        description="Run one SQL statement over the local index database, opened read-only. "
        "Tables: runs operations workloads implementations projects protocols environments "
        "snapshots quarantine lineage; views: cohorts latest_runs speedups version_changes "
        "regressions.",
    )
    parser.add_argument("sql", help="the SQL statement")
    parser.add_argument("--format", choices=("table", "csv", "json"), default="table")
    parser.add_argument(
        "--sync",
        action="store_true",
        help="first fetch the bucket's current index version (needs the S3 endpoint)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.settings import Settings

    settings = Settings.from_env()
    if args.sync:
        from pipelines.index.local import sync_local
        from pipelines.storage.errors import StorageError
        from pipelines.storage.s3 import store_session

        try:
            with store_session(settings) as store:
                sync_local(store, settings)
        except StorageError as error:
            print(f"kindex query: {error}", file=sys.stderr)
            return 1
    try:
        con = open_index(settings)
    except IndexNotFound as error:
        print(f"kindex query: {error}", file=sys.stderr)
        return 2
    try:
        relation = con.sql(args.sql)
        if relation is None:  # a statement without a result (SET, PRAGMA...)
            return 0
        columns = relation.columns
        rows = relation.fetchall()
    except duckdb.Error as error:
        print(f"kindex query: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    finally:
        con.close()
    write_result(columns, rows, args.format)
    return 0


def json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    return value


def write_result(columns: list[str], rows: list[tuple[Any, ...]], fmt: str) -> None:
    out = sys.stdout
    if fmt == "json":
        objects = [{c: json_value(v) for c, v in zip(columns, row, strict=True)} for row in rows]
        out.write(orjson.dumps(objects, default=str).decode() + "\n")
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([[json_value(v) for v in row] for row in rows])
    else:
        write_table(columns, rows)


def write_table(columns: list[str], rows: list[tuple[Any, ...]]) -> None:
    text = [[("NULL" if v is None else str(json_value(v))) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in text]) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))
    print(line.rstrip())
    print("  ".join("-" * w for w in widths))
    for row in text:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
