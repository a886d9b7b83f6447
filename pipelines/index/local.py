"""The local side of the index: a cache of a version's data files and `$KINDEX_HOME/index.duckdb`.

Iceberg data files never change, so the cache is keyed by object key and never invalidated. Each
published version gets its own small DuckDB database of views (`index-db/<version>.duckdb`);
`index.duckdb` is a symlink replaced atomically to point at the newest one. A reader that opened
the old database keeps reading the old version; none ever sees a half-built one, and a writer
never waits on a reader's file lock. A database lists the keys its views read, so a home moved
to another directory rebuilds its views over the new paths, with nothing to download.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import secrets
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from pipelines.index.catalog import IndexCatalog, Version
from pipelines.index.layout import IndexLayout
from pipelines.index.tables import STORED_TABLES, create_views, parquet_sources, views_fingerprint
from pipelines.settings import Settings
from pipelines.storage.base import ObjectStore

KEEP_LOCAL_DATABASES = 4
FETCH_THREADS = 8
PARQUET_CONTENT_TYPE = "application/vnd.apache.parquet"
EMPTY_VERSION = "empty"
INTERNAL_SCHEMA = "kindex_internal"
# Where a version's database lists the files its views read: the only files a reader may open.
FILES_TABLE = f"{INTERNAL_SCHEMA}.files"
# The home and bucket whose cache the views' paths were built under.
BUILT_TABLE = f"{INTERNAL_SCHEMA}.built"
# Python objects are never tables: a typo in a table name gets DuckDB's "Did you mean ...?",
# not a variable of the caller's frame.
CONNECTION_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "python_enable_replacements": False,
    "python_scan_all_frames": False,
}


class IndexNotFound(FileNotFoundError):
    """No index has been built in this kindex home yet."""


@dataclass(frozen=True, slots=True)
class PublishedIndex:
    """One version of the index and the object keys of its tables' data files (and of the
    served tables' at the snapshots `served` pins)."""

    version: Version
    files: Mapping[str, Sequence[str]] = field(
        default_factory=lambda: {name: [] for name in STORED_TABLES}
    )
    served: Mapping[str, int] = field(default_factory=dict)

    @property
    def id(self) -> str | None:
        return self.version.version

    @property
    def database_name(self) -> str:
        """The local database's name: the version's, and the served snapshots' it shows."""
        name = self.id or EMPTY_VERSION
        if self.served:
            pins = ",".join(f"{table}={pin}" for table, pin in sorted(self.served.items()))
            name += "-" + hashlib.sha256(pins.encode()).hexdigest()[:12]
        return name


def object_key(location: str, bucket: str) -> str:
    prefix = f"s3://{bucket}/"
    if not location.startswith(prefix):
        raise ValueError(f"{location}: outside the bucket {bucket}")
    return location.removeprefix(prefix)


def published(
    catalog: IndexCatalog,
    version: Version,
    bucket: str,
    *,
    as_of: bool = False,
    serve: bool = True,
) -> PublishedIndex:
    """A version and its files, with the served tables at their newest snapshots (`as_of`: at
    those they had when the version was published). `serve=False`: the stored tables only, for
    a publish that extends the version (the served tables' files are planned for an install)."""
    served = catalog.served_snapshot_ids(version if as_of else None) if serve else {}
    files = catalog.data_files(version, served)
    return PublishedIndex(
        version,
        {name: [object_key(loc, bucket) for loc in locs] for name, locs in files.items()},
        served,
    )


def load_current(store: ObjectStore, settings: Settings) -> PublishedIndex:
    """The newest published version (an empty index before the first publish)."""
    catalog = IndexCatalog.beside(store, settings)
    return published(catalog, catalog.current(), store.bucket)


def cache_file(source: Path, cached: Path) -> None:
    """Move a file into the cache (`cached`: its path there, layout.cached_path). It holds an
    object that never changes, so it is read-only."""
    cached.parent.mkdir(parents=True, exist_ok=True)
    source.chmod(0o444)
    os.replace(source, cached)


def cache_bytes(cached: Path, data: bytes) -> None:
    """Write an object's bytes into the cache, replacing whatever is there at once."""
    cached.parent.mkdir(parents=True, exist_ok=True)
    temporary = cached.with_name(f".{cached.name}.{secrets.token_hex(4)}.tmp")
    temporary.write_bytes(data)
    cache_file(temporary, cached)


def fetch(store: ObjectStore, layout: IndexLayout, key: str) -> Path:
    """The local copy of an immutable object, downloaded once."""
    path = layout.cached_path(key)
    if not path.exists():
        cache_bytes(path, store.get_bytes(key))
    return path


def fetch_missing(store: ObjectStore, layout: IndexLayout, keys: Sequence[str]) -> None:
    """Download the objects not cached yet (`fetch`), several at once (each waits on the network
    more than on this process)."""
    missing = [k for k in dict.fromkeys(keys) if not os.path.exists(layout.cached_location(k))]
    if len(missing) > 1:
        with ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="kindex-fetch") as pool:
            list(pool.map(lambda key: fetch(store, layout, key), missing))
    elif missing:
        fetch(store, layout, missing[0])


def fetch_all(store: ObjectStore, layout: IndexLayout, keys: Sequence[str]) -> list[Path]:
    """The local copies of immutable objects, in order (`fetch_missing` first)."""
    fetch_missing(store, layout, keys)
    return [layout.cached_path(key) for key in keys]


def put_file(store: ObjectStore, key: str, path: Path) -> None:
    store.put(key, path.read_bytes(), content_type=PARQUET_CONTENT_TYPE)


def version_database(layout: IndexLayout, name: str | None) -> Path:
    return layout.local_db_dir / f"{name or EMPTY_VERSION}.duckdb"


def install_version(store: ObjectStore, layout: IndexLayout, index: PublishedIndex) -> Path:
    """The database of this version, built (its files downloaded) when it is not yet."""
    database = version_database(layout, index.database_name)
    if not database.exists():
        fetch_missing(store, layout, [key for keys in index.files.values() for key in keys])
        build_database(database, layout, index.files)
    return database


def install_local(store: ObjectStore, layout: IndexLayout, index: PublishedIndex) -> Path:
    """Make `index.duckdb` show this version (a no-op when it already does)."""
    database = version_database(layout, index.database_name)
    if layout.local_db.is_symlink() and layout.local_db.resolve() == database.resolve():
        return database
    install_version(store, layout, index)
    point_link(layout.local_db, database)
    prune_databases(layout, keep=database)
    return database


def build_database(database: Path, layout: IndexLayout, files: Mapping[str, Sequence[str]]) -> None:
    """A database of views over the cached files (`files`: table -> object keys)."""
    database.parent.mkdir(parents=True, exist_ok=True)
    temporary = database.with_name(f".{database.name}.{secrets.token_hex(4)}.tmp")
    paths = {name: [layout.cached_location(k) for k in keys] for name, keys in files.items()}
    con = duckdb.connect(str(temporary), config=CONNECTION_CONFIG)
    try:
        # One transaction: one write of the file, not one per view.
        con.execute("BEGIN TRANSACTION")
        create_views(con, parquet_sources(paths))
        con.execute(f"CREATE SCHEMA {INTERNAL_SCHEMA}")
        # Each file's size as published: a cached file that no longer has it was changed.
        con.execute(f"CREATE TABLE {FILES_TABLE} (tbl VARCHAR, key VARCHAR, size BIGINT)")
        rows = pa.table(
            {
                "tbl": [name for name, keys in files.items() for _ in keys],
                "key": [key for keys in files.values() for key in keys],
                "size": [os.stat(path).st_size for listed in paths.values() for path in listed],
            },
            schema=pa.schema([("tbl", pa.string()), ("key", pa.string()), ("size", pa.int64())]),
        )
        con.register("listed_files", rows)
        con.execute(f"INSERT INTO {FILES_TABLE} SELECT * FROM listed_files")
        con.unregister("listed_files")
        con.execute(
            f"CREATE TABLE {BUILT_TABLE} AS SELECT ? AS home, ? AS bucket, ? AS views",
            [str(layout.home), layout.bucket, views_fingerprint()],
        )
        con.execute("COMMIT")
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


def listed_files(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str, int]]:
    """(table, key, size) of every file the views read."""
    rows = con.execute(f"SELECT tbl, key, size FROM {FILES_TABLE}").fetchall()
    return [(str(t), str(k), int(s)) for t, k, s in rows]


def built_layout(con: duckdb.DuckDBPyConnection, layout: IndexLayout) -> IndexLayout:
    """The layout of the bucket a version's database was built for: a home several buckets
    share keeps a cache folder for each."""
    try:
        row = con.execute(f"SELECT bucket FROM {BUILT_TABLE}").fetchone()
    except (duckdb.BinderException, duckdb.CatalogException):  # built by an older kindex
        return layout
    return dataclasses.replace(layout, bucket=str(row[0])) if row else layout


def rebuilt_if_stale(database: Path, layout: IndexLayout) -> None:
    """Rebuild a version's views over this home's cache when they were built under another
    directory (a home that was moved or copied) or are not this kindex's views (an upgrade)."""
    con = duckdb.connect(str(database), read_only=True, config=CONNECTION_CONFIG)
    try:
        try:
            row = con.execute(f"SELECT home, views FROM {BUILT_TABLE}").fetchone()
        except duckdb.BinderException:  # built by a kindex that did not record its views
            row = (None, None)
        except duckdb.CatalogException:  # built by a kindex that recorded nothing: left as is
            return
        if row is None or (row[0] == str(layout.home) and row[1] == views_fingerprint()):
            return
        layout = built_layout(con, layout)
        files: dict[str, list[str]] = {name: [] for name in STORED_TABLES}
        for table, key, _ in listed_files(con):
            files.setdefault(table, []).append(key)
    finally:
        con.close()
    build_database(database, layout, files)


class CacheChanged(RuntimeError):
    """A cached published file differs from what was published (it was written over)."""


def changed_files(con: duckdb.DuckDBPyConnection, layout: IndexLayout) -> list[tuple[str, int]]:
    """The cached files the views read that are gone or no longer their published size."""
    changed = []
    for _, key, size in listed_files(con):
        path = layout.cached_path(key)
        try:
            actual = os.stat(path).st_size
        except FileNotFoundError:
            actual = -1
        if actual != size:
            changed.append((str(path), size))
    return changed


def sync_local(store: ObjectStore, settings: Settings) -> Path:
    """Point the local database at the catalog's current version (downloading what is new), and
    download again every cached file of it that was changed."""
    layout = IndexLayout.of(settings)
    database = install_local(store, layout, load_current(store, settings))
    con = duckdb.connect(str(database), read_only=True, config=CONNECTION_CONFIG)
    try:
        changed = changed_files(con, layout)
    finally:
        con.close()
    for path, _ in changed:
        key = Path(path).relative_to(layout.cache_dir).as_posix()
        cache_bytes(Path(path), store.get_bytes(key))
    return database


def ensure_local(settings: Settings) -> Path:
    """The local database, created empty (every table and view, no rows) when this home has
    none yet: an index exists from the start and answers 0."""
    layout = IndexLayout.of(settings)
    if not layout.local_db.exists():
        database = version_database(layout, None)
        if not database.exists():
            build_database(database, layout, {name: [] for name in STORED_TABLES})
        # A publish may have pointed the link at a real version meanwhile: never replace it.
        with contextlib.suppress(FileExistsError):
            os.symlink(os.path.relpath(database, layout.local_db.parent), layout.local_db)
    return layout.local_db


def open_index(
    settings: Settings, *, read_only: bool = True, database: Path | None = None
) -> duckdb.DuckDBPyConnection:
    """A connection to the local index database (read-only by default), or to the database of
    another version (`kindex query --as-of`)."""
    layout = IndexLayout.of(settings)
    path = (database or ensure_local(settings)).resolve()
    rebuilt_if_stale(path, layout)
    return duckdb.connect(str(path), read_only=read_only, config=CONNECTION_CONFIG)


def open_locked(
    settings: Settings, writable: Sequence[Path] = (), *, database: Path | None = None
) -> duckdb.DuckDBPyConnection:
    """The local index, read-only, with its doors locked: DuckDB opens no file but those the
    views read (and `writable`, the target of an export), loads or installs no extension, and no
    statement can change that (`lock_configuration`)."""
    con = open_index(settings, database=database)
    try:
        layout = built_layout(con, IndexLayout.of(settings))
        changed = changed_files(con, layout)
        if changed:
            path, size = changed[0]
            raise CacheChanged(
                f"{len(changed)} cached file(s) of the index differ from what was published "
                f"(e.g. {path}, published with {size} bytes): `kindex query --sync` fetches "
                "them again"
            )
        allowed = [str(layout.cached_path(key)) for _, key, _ in listed_files(con)]
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
