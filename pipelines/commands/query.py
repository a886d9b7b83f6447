"""`kindex query "SQL"`: SQL over the local index, which it can read and never change.

The connection is read-only and locked (see `open_locked`): DuckDB opens no file but those the
index's views read, and statements that write files, attach databases or load extensions are
refused before they run. `--output FILE` exports a SELECT with DuckDB's own COPY (the rows never
pass through Python), with that one file the only one DuckDB may write.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import orjson

from pipelines.index.catalog import IndexCatalog, IndexOutdated, VersionNotFound
from pipelines.index.layout import IndexLayout
from pipelines.index.local import CacheChanged, install_version, open_locked, published, sync_local
from pipelines.settings import Settings
from pipelines.storage.errors import StorageError
from pipelines.storage.s3 import store_session

# Statement types a read-only query may run; the rest are refused with a message saying so.
# SET is let through: the locked configuration answers it with DuckDB's own error.
READ_ONLY_STATEMENTS = frozenset(
    {
        duckdb.StatementType.SELECT,
        duckdb.StatementType.EXPLAIN,
        duckdb.StatementType.PRAGMA,
        duckdb.StatementType.CALL,
        duckdb.StatementType.SET,
        duckdb.StatementType.VARIABLE_SET,
        duckdb.StatementType.TRANSACTION,
    }
)
EXPLAIN_PREFIX = re.compile(r"^\s*explain(\s+analyze)?\s+", re.IGNORECASE)
EXPORT_FORMATS = {
    ".csv": "FORMAT csv, HEADER true",
    ".parquet": "FORMAT parquet",
    ".json": "FORMAT json, ARRAY true",
    ".jsonl": "FORMAT json",
    ".ndjson": "FORMAT json",
}
DEFAULT_MAX_WIDTH = 40
ELLIPSIS = "…"


class RefusedStatement(ValueError):
    """A statement `kindex query` does not run: it would write, attach or load something."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "query",
        help="run SQL over the index (tables: runs, snapshots, lineage, quarantine, ...)",
        description="Run SQL over the local index, read-only. "
        "Tables: runs operations workloads implementations projects protocols environments "
        "snapshots quarantine lineage; views: cohorts latest_runs speedups version_changes "
        "regression_points regression_cases version_verdicts regressions improvements drift.",
    )
    parser.add_argument("sql", help="the SQL statement")
    parser.add_argument("--format", choices=("table", "csv", "json"), default="table")
    parser.add_argument(
        "--max-width",
        type=int,
        default=DEFAULT_MAX_WIDTH,
        metavar="N",
        help=f"table format: cut longer values with {ELLIPSIS} ({DEFAULT_MAX_WIDTH}; 0: no bound)",
    )
    parser.add_argument(
        "--output",
        "-o",
        type=Path,
        metavar="FILE",
        help="write the result of a SELECT to FILE (.csv, .parquet, .json, .jsonl) with DuckDB",
    )
    parser.add_argument(
        "--sync",
        action="store_true",
        help="first fetch the bucket's current index version (needs the S3 endpoint)",
    )
    parser.add_argument(
        "--as-of",
        metavar="WHEN",
        help="query an earlier version: a time (ISO 8601, e.g. 2026-12-01T12:00Z), a version "
        "id, or an Iceberg snapshot id of one of its tables (within the retention)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    database: Path | None = None
    if args.sync or args.as_of:
        try:
            database = fetch_version(settings, args.as_of, sync=args.sync)
        except (StorageError, VersionNotFound, IndexOutdated) as error:
            print(f"kindex query: {error}", file=sys.stderr)
            return 1
    target = args.output.expanduser().resolve() if args.output else None
    if target is not None:
        problem = export_problem(target, settings.home)
        if problem:
            print(f"kindex query: --output {args.output}: {problem}", file=sys.stderr)
            return 2
    try:
        con = open_locked(settings, writable=[target] if target else (), database=database)
    except CacheChanged as error:
        print(f"kindex query: {error}", file=sys.stderr)
        return 1
    try:
        if target is not None:
            export(con, args.sql, target)
            return 0
        check_read_only(con, args.sql)
        relation = con.sql(args.sql)
        if relation is None:  # a statement without a result (SET, PRAGMA...)
            return 0
        columns, types = relation.columns, [str(t) for t in relation.types]
        rows = relation.fetchall()
    except RefusedStatement as error:
        print(f"kindex query: {error}", file=sys.stderr)
        return 1
    except duckdb.Error as error:
        print(f"kindex query: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    finally:
        con.close()
    write_result(columns, rows, args.format, types=types, max_width=args.max_width)
    return 0


def fetch_version(settings: Settings, as_of: str | None, *, sync: bool) -> Path | None:
    """The database of the version `--as-of` names (built from the bucket when this home has
    none), after `--sync` brought the current one; None: the current one."""

    with store_session(settings) as store:
        if sync:
            sync_local(store, settings)
        if not as_of:
            return None
        catalog = IndexCatalog.beside(store, settings)
        version = catalog.as_of(as_of)
        index = published(catalog, version, store.bucket, as_of=True)
        return install_version(store, IndexLayout.of(settings), index)


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Refuse what would change anything: COPY, ATTACH, INSTALL/LOAD, EXPORT, writes, and an
    EXPLAIN (ANALYZE runs its statement) of anything but a SELECT."""
    for statement in con.extract_statements(sql):
        kind = statement.type
        if kind == duckdb.StatementType.EXPLAIN:
            inner = EXPLAIN_PREFIX.sub("", statement.query, count=1)
            explained = con.extract_statements(inner) if inner != statement.query else []
            if [s.type for s in explained] != [duckdb.StatementType.SELECT]:
                raise RefusedStatement("kindex query explains only a SELECT")
        elif kind not in READ_ONLY_STATEMENTS:
            name = kind.name.removesuffix("_STATEMENT")
            hint = "; use --output FILE to export a SELECT" if name in ("COPY", "EXPORT") else ""
            raise RefusedStatement(f"the index is read-only: a {name} statement is refused{hint}")


def export_problem(target: Path, home: Path) -> str | None:
    """Why `--output` may not write `target`, or None: a known format, never inside the home
    (its cache holds the published files the views read)."""
    if target.suffix.lower() not in EXPORT_FORMATS:
        return f"unknown format; use one of {', '.join(EXPORT_FORMATS)}"
    if target.is_relative_to(home.resolve()):
        return f"inside the kindex home {home}; write it elsewhere"
    if not target.parent.is_dir():
        return f"no folder {target.parent}"
    return None


def export(con: duckdb.DuckDBPyConnection, sql: str, target: Path) -> None:
    """COPY one SELECT to `target`, written by DuckDB alone."""
    statements = con.extract_statements(sql)
    if [s.type for s in statements] != [duckdb.StatementType.SELECT]:
        raise RefusedStatement("--output writes the result of one SELECT statement")
    query = statements[0].query.strip().rstrip(";")
    options = EXPORT_FORMATS[target.suffix.lower()]
    # The file is written in place (no temporary file beside it): it is the one path allowed.
    con.execute(f"COPY (\n{query}\n) TO {sql_string(str(target))} ({options}, USE_TMP_FILE false)")


def sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


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


def write_result(
    columns: list[str],
    rows: list[tuple[Any, ...]],
    fmt: str,
    *,
    types: Sequence[str] = (),
    max_width: int = DEFAULT_MAX_WIDTH,
) -> None:
    out = sys.stdout
    json_columns = {i for i, t in enumerate(types) if t == "JSON"}
    if fmt == "json":
        # A JSON column holds JSON text: written as the JSON it is, not as a string.
        objects = [
            {
                c: orjson.Fragment(v) if i in json_columns and v is not None else json_value(v)
                for i, (c, v) in enumerate(zip(columns, row, strict=True))
            }
            for row in rows
        ]
        out.write(orjson.dumps(objects, default=str).decode() + "\n")
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([[json_value(v) for v in row] for row in rows])
    else:
        write_table(columns, rows, max_width)


def cell(value: Any, max_width: int) -> str:
    text = "NULL" if value is None else str(json_value(value))
    text = text.replace("\n", " ")
    if 0 < max_width < len(text):
        return text[: max_width - 1] + ELLIPSIS
    return text


def write_table(
    columns: list[str], rows: list[tuple[Any, ...]], max_width: int = DEFAULT_MAX_WIDTH
) -> None:
    text = [[cell(v, max_width) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in text]) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))
    print(line.rstrip())
    print("  ".join("-" * w for w in widths))
    for row in text:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
