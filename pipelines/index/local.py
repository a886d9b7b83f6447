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
from collections.abc import Sequence
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
# Where a version's database lists the files its views read: the only files a reader may open.
FILES_TABLE = "kindex_internal.files"
# Python objects are never tables: a typo in a table name gets DuckDB's "Did you mean ...?",
# not a variable of the caller's frame.
CONNECTION_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "python_enable_replacements": False,
    "python_scan_all_frames": False,
}


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
        path.chmod(0o444)  # a published file never changes
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
    con = duckdb.connect(str(temporary), config=CONNECTION_CONFIG)
    try:
        create_views(con, files)
        con.execute(f"CREATE SCHEMA {FILES_TABLE.split('.')[0]}")
        # Each file's size as published: a cached file that no longer has it was changed.
        con.execute(f"CREATE TABLE {FILES_TABLE} (path VARCHAR, size BIGINT)")
        paths = sorted({path for names in files.values() for path in names})
        if paths:
            rows = [[p, os.stat(p).st_size] for p in paths]
            con.executemany(f"INSERT INTO {FILES_TABLE} VALUES (?, ?)", rows)
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


class CacheChanged(RuntimeError):
    """A cached published file differs from what was published (it was written over)."""


def changed_files(con: duckdb.DuckDBPyConnection) -> list[tuple[str, int]]:
    """The files the views read that are gone or no longer their published size, with that
    size (none known for a database built before the list was kept)."""
    try:
        listed = con.execute(f"SELECT path, size FROM {FILES_TABLE}").fetchall()
    except duckdb.CatalogException:
        return []
    changed = []
    for path, size in listed:
        try:
            actual = os.stat(path).st_size
        except FileNotFoundError:
            actual = -1
        if actual != size:
            changed.append((str(path), int(size)))
    return changed


def sync_local(store: ObjectStore, settings: Any) -> Path:
    """Point the local database at the bucket's current version (downloading what is new), and
    download again every cached file of it that was changed."""
    layout = IndexLayout.of(settings)
    database = install_local(store, layout, load_current(store, layout))
    con = duckdb.connect(str(database), read_only=True, config=CONNECTION_CONFIG)
    try:
        changed = changed_files(con)
    finally:
        con.close()
    for path, _ in changed:
        key = Path(path).relative_to(layout.cache_dir).as_posix()
        write_atomically(Path(path), store.get_bytes(key))
        Path(path).chmod(0o444)
    return database


def ensure_local(settings: Any) -> Path:
    """The local database, created empty (every table and view, no rows) when this home has
    none yet: an index exists from the start and answers 0."""
    layout = IndexLayout.of(settings)
    if not layout.local_db.exists():
        database = layout.local_db_dir / f"{EMPTY_VERSION}.duckdb"
        if not database.exists():
            build_database(database, {name: [] for name in FILE_TABLES})
        # A publish may have pointed the link at a real version meanwhile: never replace it.
        with contextlib.suppress(FileExistsError):
            os.symlink(os.path.relpath(database, layout.local_db.parent), layout.local_db)
    return layout.local_db


def open_index(settings: Any, *, read_only: bool = True) -> duckdb.DuckDBPyConnection:
    """A connection to the local index database (read-only by default)."""
    path = str(ensure_local(settings))
    return duckdb.connect(path, read_only=read_only, config=CONNECTION_CONFIG)


def open_locked(settings: Any, writable: Sequence[Path] = ()) -> duckdb.DuckDBPyConnection:
    """The local index, read-only, with its doors locked: DuckDB opens no file but those the
    views read (and `writable`, the target of an export), loads or installs no extension, and no
    statement can change that (`lock_configuration`)."""
    con = open_index(settings)
    try:
        changed = changed_files(con)
        if changed:
            path, size = changed[0]
            raise CacheChanged(
                f"{len(changed)} cached file(s) of the index differ from what was published "
                f"(e.g. {path}, published with {size} bytes): `kindex query --sync` fetches "
                "them again"
            )
        try:
            allowed = [row[0] for row in con.execute(f"SELECT path FROM {FILES_TABLE}").fetchall()]
        except duckdb.CatalogException:  # a database built before the list was kept
            allowed = []
            directories = [str(IndexLayout.of(settings).cache_dir) + os.sep]
            con.execute("SET allowed_directories = ?", [directories])
        allowed += [str(path) for path in writable]
        if allowed:
            con.execute("SET allowed_paths = ?", [allowed])
        for statement in (
            "SET autoinstall_known_extensions = false",
            "SET autoload_known_extensions = false",
            "SET allow_community_extensions = false",
            "SET enable_external_access = false",
            "SET lock_configuration = true",
        ):
            con.execute(statement)
    except BaseException:
        con.close()
        raise
    return con
