"""The local side of the index: a cache of published files and `$KINDEX_HOME/index.duckdb`.

Published files never change, so the cache is keyed by object key and never invalidated. Each
published version gets its own small DuckDB database of views (`index-db/<version>.duckdb`);
`index.duckdb` is a symlink replaced atomically to point at the newest one. A reader that opened
the old database keeps reading the old version; none ever sees a half-built one, and a writer
never waits on a reader's file lock.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Any

import duckdb
import orjson

from pipelines.index.layout import IndexLayout
from pipelines.index.tables import FILE_TABLES, MANIFEST_FORMAT, create_views
from pipelines.storage.base import NoSuchKey, ObjectStore

KEEP_LOCAL_DATABASES = 4
PARQUET_CONTENT_TYPE = "application/vnd.apache.parquet"
EMPTY_VERSION = "empty"


class IndexNotFound(FileNotFoundError):
    """No index has been built in this kindex home yet."""


def empty_manifest() -> dict[str, Any]:
    return {
        "format": MANIFEST_FORMAT,
        "version": None,
        "parent": None,
        "record_sets": [],
        "reads": [],
        "files": {name: [] for name in FILE_TABLES},
        "counts": {},
    }


def load_current(store: ObjectStore, layout: IndexLayout) -> dict[str, Any]:
    """The manifest `index/CURRENT` points to, or an empty one before the first publish."""
    try:
        pointer = orjson.loads(store.get_bytes(layout.pointer_key))
    except NoSuchKey:
        return empty_manifest()
    manifest: dict[str, Any] = orjson.loads(store.get_bytes(pointer["manifest"]))
    return manifest


def write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def fetch(store: ObjectStore, layout: IndexLayout, key: str) -> Path:
    """The local copy of an immutable published object, downloaded once."""
    path = layout.cached_path(key)
    if not path.exists():
        write_atomically(path, store.get_bytes(key))
    return path


def put_file(store: ObjectStore, key: str, path: Path) -> None:
    store.put(key, path.read_bytes(), content_type=PARQUET_CONTENT_TYPE)


def install_local(store: ObjectStore, layout: IndexLayout, manifest: dict[str, Any]) -> Path:
    """Make `index.duckdb` show this version (a no-op when it already does)."""
    version = manifest.get("version") or EMPTY_VERSION
    database = layout.local_db_dir / f"{version}.duckdb"
    if layout.local_db.is_symlink() and layout.local_db.resolve() == database.resolve():
        return database
    files = {
        name: [str(fetch(store, layout, key)) for key in keys]
        for name, keys in manifest["files"].items()
    }
    if not database.exists():
        build_database(database, files)
    point_link(layout.local_db, database)
    prune_databases(layout, keep=database)
    return database


def build_database(database: Path, files: dict[str, list[str]]) -> None:
    database.parent.mkdir(parents=True, exist_ok=True)
    temporary = database.with_name(f".{database.name}.{secrets.token_hex(4)}.tmp")
    con = duckdb.connect(str(temporary))
    try:
        create_views(con, files)
    finally:
        con.close()
    os.replace(temporary, database)


def point_link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    temporary = link.with_name(f".{link.name}.{secrets.token_hex(4)}.link")
    os.symlink(os.path.relpath(target, link.parent), temporary)
    os.replace(temporary, link)


def prune_databases(layout: IndexLayout, keep: Path) -> None:
    """Drop old per-version databases (an open reader keeps its file until it closes it)."""
    databases = sorted(layout.local_db_dir.glob("*.duckdb"), key=lambda p: p.stat().st_mtime)
    for old in databases[:-KEEP_LOCAL_DATABASES]:
        if old != keep:
            with contextlib.suppress(FileNotFoundError):
                old.unlink()


def sync_local(store: ObjectStore, settings: Any) -> Path:
    """Point the local database at the bucket's current version (downloading what is new)."""
    layout = IndexLayout.of(settings)
    return install_local(store, layout, load_current(store, layout))


def open_index(settings: Any, *, read_only: bool = True) -> duckdb.DuckDBPyConnection:
    """A connection to the local index database (read-only by default)."""
    path = IndexLayout.of(settings).local_db
    if not path.exists():
        raise IndexNotFound(f"no index at {path}: run `kindex ingest FILE...` first")
    return duckdb.connect(str(path), read_only=read_only)
