"""The index as Apache Iceberg tables in a warehouse in the bucket, behind a catalog.

Each stored table of the index (tables.STORED_TABLES) is an Iceberg table in the namespace named
after the bucket (`kindex` by default: one catalog may hold the indexes of several buckets), its
files under `s3://<bucket>/<index prefix><namespace>/`. One more table, `index_versions`, is
the commit point: a publish commits its data tables one by one, then appends one row to
`index_versions` naming the snapshot of each. Readers pin those snapshots, so they see one whole
version, never half of one. A publisher that died between its commits left snapshots that no
version names; the next publisher rolls those tables back to the last version before it starts.
Publishers take turns (`publish_lock`), so a rollback never undoes live work.

The catalog (`KINDEX_CATALOG_URI`):
- unset: a SQL catalog in SQLite, `$KINDEX_HOME/catalog.db` (no process of its own);
- a SQLAlchemy URL (`postgresql+psycopg2://...`, `sqlite:////shared/catalog.db`): a SQL
  catalog several hosts share (PostgreSQL: the database Dagster's storage already uses);
- an `http(s)://` URL: an Iceberg REST catalog (Polaris, Lakekeeper, S3 Tables, Glue), with its
  further properties (credential, token, SigV4) from pyiceberg's own
  `PYICEBERG_CATALOG__KINDEX__*` variables.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import secrets
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import ParamSpec, TypeVar
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import RemoveSnapshotsUpdate
from pyiceberg.transforms import IdentityTransform
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from pipelines.index.layout import IndexLayout
from pipelines.index.tables import RUN_SORT_COLUMNS, STORED_TABLES, served_schemas
from pipelines.records.record_objects import FIELD_ID_KEY, UTC_US
from pipelines.settings import Settings
from pipelines.storage.base import ObjectStore
from pipelines.storage.credentials import S3Credentials, configured_credentials
from pipelines.storage.errors import StorageAccessDenied
from pipelines.storage.s3 import boto_session

CATALOG_NAME = "kindex"
VERSIONS_TABLE = "index_versions"
# The file ledger (pipelines/intake/ledger.py): in the same catalog, read by publishes too.
LEDGER_TABLE = "file_ledger"
# Where a version's snapshot ids live in its commit's summary (read without a scan).
SUMMARY_PREFIX = "kindex."
# Snapshots past the retention are expired once every this many versions.
EXPIRE_EVERY_VERSIONS = 8
# What the tables hold, by the kindex that created them. 2: lineage_files holds only the lineage
# rows that run_segments does not (tables.lineage_rows). 3: run_segments holds each run's current
# state and source key (no run_state_changes). 4: every data file carries the table's field IDs
# (an engine that trusts them, such as Daft, reads no name mapping). 5: series_points holds every
# run's point of the regression verdicts (each re-measurement, not each version's newest). An
# index of another layout is rebuilt from the record sets by the next publish, and read by
# nobody before.
LAYOUT_PROPERTY = SUMMARY_PREFIX + "layout"
LAYOUT = "5"
# Set on a table that kindex did not rebuild (the file ledger) once its data files written
# before carried no field IDs have been rewritten with them (IndexCatalog.identify).
FIELD_IDS_PROPERTY = SUMMARY_PREFIX + "field-ids"
# A merge append (pyiceberg's) merges the table's manifests into one: a scan then reads one
# manifest list and one manifest whatever the number of commits since the table began, where a
# fast append leaves a manifest per commit for every later scan to read. Every append merges
# (the ledger's and the index's tables'), in its own commit: what a publish or a scan reads does
# not depend on where in a merge cycle it lands, for the price of rewriting one manifest. A
# rewrite (compaction, a replace) adds manifests of its own: the next append merges them, and
# compaction merges a table left with more than MERGE_ABOVE_MANIFESTS. A manifest that reaches
# MANIFEST_TARGET_BYTES is left as it is: an append rewrites at most that much whatever the
# table's history, and a reader of what was committed since a point skips the manifests written
# before it.
MANIFEST_TARGET_BYTES = 256 << 10
MANIFEST_MERGE_PROPERTIES = {
    TableProperties.MANIFEST_MERGE_ENABLED: "true",
    TableProperties.MANIFEST_MIN_MERGE_COUNT: "2",
    TableProperties.MANIFEST_TARGET_SIZE_BYTES: str(MANIFEST_TARGET_BYTES),
}
MERGE_ABOVE_MANIFESTS = 4
TABLE_PROPERTIES = MANIFEST_MERGE_PROPERTIES | {
    LAYOUT_PROPERTY: LAYOUT,
    FIELD_IDS_PROPERTY: "1",
    "write.parquet.compression-codec": "zstd",
    # A manifest is a long JSON text: bounds of its first bytes would prune nothing.
    "write.metadata.metrics.column.manifest": "none",
    # Every commit rewrites the metadata JSON: its log of earlier metadata files stays short
    # (the files themselves are kept).
    "write.metadata.previous-versions-max": "4",
}
# A table with more data files than this has its newest ones merged (see plan_compaction).
COMPACT_ABOVE_FILES = 8
# Merging stops at a file more than this many times the size of what is merged so far: files
# then grow geometrically, so their number stays logarithmic in the rows.
COMPACT_SIZE_RATIO = 2
# A data file this large is never merged again: a publish that adds a million runs costs the
# same whatever the history (no merge rewrites the millions before it), and a table's files
# grow in number only by one per this many bytes.
COMPACT_DONE_BYTES = 64 << 20
UPLOAD_CHUNK_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class Compaction:
    """When a table's (or a partition's) data files are merged: past `above_files` files, the
    newest ones while each older is at most `size_ratio` times what is merged so far."""

    above_files: int = COMPACT_ABOVE_FILES
    size_ratio: int = COMPACT_SIZE_RATIO


VERSIONS_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("version", pa.string()),
        ("parent", pa.string()),
        ("published_at", UTC_US),
        ("snapshot_ids", pa.string()),  # JSON: table -> Iceberg snapshot id
        ("counts", pa.string()),  # JSON: table -> rows
    ]
)


class IndexOutdated(RuntimeError):
    """The index was written by a kindex of another layout; the next publish rebuilds it."""


class VersionNotFound(LookupError):
    """No published version answers an `--as-of`."""


@dataclass(frozen=True, slots=True)
class S3Access:
    """How a client outside boto3 (pyarrow, DuckDB) reaches the bucket."""

    endpoint_url: str  # e.g. http://127.0.0.1:8333
    key_id: str
    secret: str = field(repr=False)
    region: str = "us-east-1"
    session_token: str | None = field(default=None, repr=False)
    path_style: bool = True


def s3_access(
    settings: Settings,
    endpoint_url: str | None = None,
    credentials: S3Credentials | None = None,
) -> S3Access:
    """How to reach the bucket: `credentials` when given (the store at hand's), else the
    embedded server's generated identity, else boto3's credential chain. `endpoint_url`: where
    the store at hand reaches it (an embedded server may have moved to another port)."""
    endpoint_url = endpoint_url or settings.endpoint_url
    credentials = credentials or configured_credentials(settings)
    if credentials is not None:
        return S3Access(
            endpoint_url,
            credentials.access_key,
            credentials.secret_key,
            settings.s3_region,
            path_style=settings.s3_path_style,
        )

    found = boto_session().get_credentials()
    if found is None:
        raise StorageAccessDenied(
            "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
        )
    frozen = found.get_frozen_credentials()
    return S3Access(
        endpoint_url,
        frozen.access_key,
        frozen.secret_key,
        settings.s3_region,
        frozen.token,
        settings.s3_path_style,
    )


def catalog_uri(settings: Settings) -> str:
    return settings.catalog_uri or f"sqlite:///{settings.home / 'catalog.db'}"


def warehouse(settings: Settings) -> str:
    return f"s3://{settings.bucket}/{settings.index_prefix}".rstrip("/")


def file_io_properties(access: S3Access) -> dict[str, str]:
    properties = {
        "s3.endpoint": access.endpoint_url,
        "s3.access-key-id": access.key_id,
        "s3.secret-access-key": access.secret,
        "s3.region": access.region,
        "s3.force-virtual-addressing": "false" if access.path_style else "true",
    }
    if access.session_token:
        properties["s3.session-token"] = access.session_token
    return properties


def catalog_properties(settings: Settings, access: S3Access | None = None) -> dict[str, str]:
    """What pyiceberg's `load_catalog` takes to open the index's catalog (kindex's, and any
    engine's that reads through pyiceberg), its files reached with `access`."""
    uri = catalog_uri(settings)
    kind = "rest" if urlsplit(uri).scheme in ("http", "https") else "sql"
    properties = {"type": kind, "uri": uri, "warehouse": warehouse(settings)}
    return properties | file_io_properties(access or s3_access(settings))


# How often a catalog step that lost a race to another process starts again (a commit from the
# table's new head, or the creation of a table or of a new SQL catalog's own tables), with a
# random exponential wait between tries. Every Iceberg commit of kindex retries this way.
COMMIT_ATTEMPTS = 8
P = ParamSpec("P")
R = TypeVar("R")


def catalog_retry(step: Callable[P, R]) -> Callable[P, R]:
    """A catalog step retried on any error (creating what another process may create at once)."""
    return retry(
        stop=stop_after_attempt(COMMIT_ATTEMPTS),
        wait=wait_random_exponential(0.05, 2),
        reraise=True,
    )(step)


def commit_retry(step: Callable[P, R]) -> Callable[P, R]:
    """An Iceberg commit retried when another writer's commit won (CommitFailedException)."""
    return retry(
        retry=retry_if_exception_type(CommitFailedException),
        stop=stop_after_attempt(COMMIT_ATTEMPTS),
        wait=wait_random_exponential(0.05, 2),
        reraise=True,
    )(step)


def open_catalog(settings: Settings, access: S3Access | None = None) -> Catalog:
    properties = catalog_properties(settings, access)
    uri = properties["uri"]
    if properties["type"] == "sql" and uri.startswith("sqlite:"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return _load_catalog(properties)


@catalog_retry
def _load_catalog(properties: dict[str, str]) -> Catalog:
    # Two processes creating a new SQL catalog's tables at once: one of them may lose the race.
    return load_catalog(CATALOG_NAME, **properties)


@contextmanager
def publish_lock(settings: Settings) -> Iterator[None]:
    """One publisher at a time for everyone who shares the catalog: an advisory lock in a
    PostgreSQL catalog's database, or a file lock beside a SQLite catalog (or in the home, for a
    REST catalog: one host)."""
    uri = catalog_uri(settings)
    if uri.startswith("postgresql"):
        import sqlalchemy  # noqa: PLC0415  a PostgreSQL catalog's only need of it

        engine = sqlalchemy.create_engine(uri, poolclass=sqlalchemy.pool.NullPool)
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(hashtext('kindex'))"))
            try:
                yield
            finally:
                connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(hashtext('kindex'))"))
        engine.dispose()
        return
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///") + ".lock")
    else:
        path = settings.home / "index.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True, slots=True)
class Version:
    """One published version of the index: the snapshot of each table it is made of."""

    seq: int
    version: str | None
    parent: str | None
    published_at: datetime | None
    snapshot_ids: Mapping[str, int | None]
    counts: Mapping[str, int]
    # The file ledger's snapshot whose rows this version covers: the next publish reads the
    # rows committed after it (pipelines/index/committed.py). None: published before ledger
    # points, or empty.
    ledger_point: int | None = None

    @classmethod
    def empty(cls) -> Version:
        return cls(0, None, None, None, {name: None for name in STORED_TABLES}, {})

    @classmethod
    def from_summary(cls, summary: Mapping[str, str]) -> Version:
        published = summary.get(SUMMARY_PREFIX + "published-at")
        return cls(
            seq=int(summary[SUMMARY_PREFIX + "seq"]),
            version=summary[SUMMARY_PREFIX + "version"],
            parent=summary.get(SUMMARY_PREFIX + "parent") or None,
            published_at=datetime.fromisoformat(published) if published else None,
            snapshot_ids=json.loads(summary[SUMMARY_PREFIX + "snapshot-ids"]),
            counts=json.loads(summary[SUMMARY_PREFIX + "counts"]),
            ledger_point=int(point) if (point := summary.get(SUMMARY_PREFIX + "ledger")) else None,
        )

    def summary(self) -> dict[str, str]:
        return {
            SUMMARY_PREFIX + "seq": str(self.seq),
            SUMMARY_PREFIX + "version": self.version or "",
            SUMMARY_PREFIX + "parent": self.parent or "",
            SUMMARY_PREFIX + "published-at": self.published_at.isoformat()
            if self.published_at
            else "",
            SUMMARY_PREFIX + "snapshot-ids": json.dumps(dict(self.snapshot_ids), sort_keys=True),
            SUMMARY_PREFIX + "counts": json.dumps(dict(self.counts), sort_keys=True),
            SUMMARY_PREFIX + "ledger": "" if self.ledger_point is None else str(self.ledger_point),
        }


class IndexCatalog:
    """The index's tables in one catalog, created on first use."""

    def __init__(self, settings: Settings, access: S3Access | None = None) -> None:
        self.settings = settings
        self.catalog = open_catalog(settings, access)
        self._tables: dict[str, Table] = {}
        # A snapshot's files never change: a publish plans a table it did not commit to once.
        self._planned: dict[tuple[str, int], list[str]] = {}

    @classmethod
    def beside(cls, store: ObjectStore, settings: Settings) -> IndexCatalog:
        """The catalog, its files reached at the store's endpoint."""
        endpoint_url = getattr(store, "endpoint_url", None)
        return cls(settings, s3_access(settings, endpoint_url, getattr(store, "credentials", None)))

    @property
    def namespace(self) -> str:
        return self.settings.bucket

    def table(self, name: str, *, refresh: bool = False) -> Table:
        """A table of the index (NoSuchTableError before the first publish created it)."""
        if name not in self._tables or refresh:
            self._tables[name] = self.catalog.load_table((self.namespace, name))
        return self._tables[name]

    def has_table(self, name: str) -> bool:
        try:
            self.table(name)
        except NoSuchTableError:
            return False
        return True

    def create_tables(self) -> None:
        """Every table of the index, created where missing (by a publisher). An index of
        another layout is dropped first, to be rebuilt from the record sets: its tables leave
        the catalog, and their files stay in the bucket."""
        if self.outdated():
            for name in (*STORED_TABLES, VERSIONS_TABLE):
                if self.has_table(name):
                    self.catalog.drop_table((self.namespace, name))
            self._tables.clear()
        for name in (*STORED_TABLES, VERSIONS_TABLE):
            if not self.has_table(name):
                self._tables[name] = self._create(name)

    def outdated(self) -> bool:
        """Whether the index was written in another layout than this kindex's (LAYOUT)."""
        if not self.has_table(VERSIONS_TABLE):
            return False
        return self.table(VERSIONS_TABLE).properties.get(LAYOUT_PROPERTY) != LAYOUT

    def _readable(self) -> None:
        if self.outdated():
            raise IndexOutdated(
                "the index was written by another version of kindex; the next publish (kindex "
                "ingest, or the index asset) rebuilds it from the record sets"
            )

    @catalog_retry
    def _create(self, name: str) -> Table:
        self.catalog.create_namespace_if_not_exists(self.namespace)
        schema = VERSIONS_SCHEMA if name == VERSIONS_TABLE else STORED_TABLES[name]
        table = self.catalog.create_table_if_not_exists(
            (self.namespace, name), schema=schema, properties=TABLE_PROPERTIES
        )
        if name == "run_segments" and table.spec().is_unpartitioned():
            # Live rows and settled rows in files of their own (publish.py), an identity
            # partition on `live`: a reader of the latest runs plans only the live files.
            with table.update_spec() as spec:
                spec.add_identity("live")
            # The order publish.py writes the live runs in.
            with table.update_sort_order() as order:
                for column in RUN_SORT_COLUMNS:
                    order.asc(column, IdentityTransform())
            table = self.catalog.load_table((self.namespace, name))
        return table

    # -- reading ---------------------------------------------------------------------------

    def current(self) -> Version:
        """The newest published version (an empty one before the first publish)."""
        if not self.has_table(VERSIONS_TABLE):
            return Version.empty()
        self._readable()
        snapshot = self.table(VERSIONS_TABLE).current_snapshot()
        if snapshot is None:
            return Version.empty()
        summary = snapshot.summary
        return Version.from_summary(dict(summary.additional_properties) if summary else {})

    def versions(self) -> list[Version]:
        """Every published version, oldest first."""
        if not self.has_table(VERSIONS_TABLE):
            return []
        self._readable()
        rows = self.table(VERSIONS_TABLE).scan().to_arrow().to_pylist()
        return sorted(
            (
                Version(
                    seq=row["seq"],
                    version=row["version"],
                    parent=row["parent"],
                    published_at=row["published_at"],
                    snapshot_ids=json.loads(row["snapshot_ids"]),
                    counts=json.loads(row["counts"]),
                )
                for row in rows
            ),
            key=lambda v: v.seq,
        )

    def as_of(self, when: str) -> Version:
        """The version an `--as-of` names: a version id, an Iceberg snapshot id of one of its
        tables, or a time (ISO 8601; the newest version published then)."""
        versions = self.versions()
        text = when.strip()
        for version in reversed(versions):
            if text == version.version or (
                text.lstrip("-").isdigit() and int(text) in version.snapshot_ids.values()
            ):
                return version
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise VersionNotFound(
                f"--as-of {when!r}: no version or snapshot has that id, and it is not a time"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        published = [v for v in versions if v.published_at and v.published_at <= moment]
        if not published:
            raise VersionNotFound(f"--as-of {when!r}: no version was published by then")
        return published[-1]

    def data_files(
        self, version: Version, served: Mapping[str, int] | None = None
    ) -> dict[str, list[str]]:
        """Each stored table's data files (s3:// locations) in this version, and each served
        table's at the snapshot `served` names (served_snapshot_ids)."""
        pins = {**version.snapshot_ids, **(served or {})}
        pinned = {
            name: (self.table(name), snapshot_id)
            for name, snapshot_id in pins.items()
            if snapshot_id is not None
        }

        def planned(name: str) -> list[str]:
            table, snapshot_id = pinned[name]
            if (name, snapshot_id) not in self._planned:
                self._planned[name, snapshot_id] = self.snapshot_data_files(table, snapshot_id)
            return self._planned[name, snapshot_id]

        files: dict[str, list[str]] = {name: [] for name in STORED_TABLES}
        # Each table's manifests are read on a thread of its own: their S3 round trips overlap.
        with ThreadPoolExecutor(max_workers=max(len(pinned), 1)) as pool:
            files |= dict(zip(pinned, pool.map(planned, pinned), strict=True))
        return files

    def snapshot_data_files(self, table: Table, snapshot_id: int) -> list[str]:
        """The data files a snapshot holds, sorted: its manifests' live entries (a scan's plan
        would evaluate a filter and its residual on each entry too, for none).

        A manifest never changes, and a large one outlives many commits (an append merges the
        small ones only, and one near MANIFEST_TARGET_BYTES not at all): its list is kept in the
        local cache and read from the bucket once per home. The lists of manifests the snapshot
        no longer holds are dropped."""
        snapshot = table.snapshot_by_id(snapshot_id)
        if snapshot is None:
            raise VersionNotFound(f"{table.name()}: no snapshot {snapshot_id}")
        folder = IndexLayout.of(self.settings).cache_dir / ".manifest-files" / table.name()[-1]
        files: list[str] = []
        kept: set[str] = set()
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_length < MANIFEST_TARGET_BYTES // 2:
                files += live_data_files(table, manifest)
                continue
            listed = folder / f"{hashlib.sha256(manifest.manifest_path.encode()).hexdigest()}.txt"
            kept.add(listed.name)
            if listed.exists():
                files += listed.read_text().splitlines()
                continue
            found = live_data_files(table, manifest)
            # A cache: a home it cannot be written in (read-only, full) lists from the bucket.
            with contextlib.suppress(OSError):
                folder.mkdir(parents=True, exist_ok=True)
                written = listed.with_name(f".{listed.name}.{secrets.token_hex(4)}")
                written.write_text("\n".join(found))
                written.replace(listed)
            files += found
        with contextlib.suppress(OSError):
            for stale in folder.glob("*.txt") if folder.is_dir() else ():
                if stale.name not in kept:
                    stale.unlink(missing_ok=True)
        return sorted(files)

    def served_snapshot_ids(self, as_of: Version | None = None) -> dict[str, int]:
        """The snapshot of each served table (tables.SERVED_TABLES) that exists and has one: its
        newest, or the one it had when `as_of` was published."""
        pins = {}
        for name in served_schemas():
            if not self.has_table(name):
                continue
            table = self.table(name, refresh=True)
            if as_of is None:
                snapshot = table.current_snapshot()
            elif as_of.published_at is None:
                snapshot = None
            else:
                at_ms = int(as_of.published_at.timestamp() * 1000)
                snapshot = table.snapshot_as_of_timestamp(at_ms)
            if snapshot is not None:
                pins[name] = snapshot.snapshot_id
        return pins

    def metadata_locations(self) -> dict[str, str]:
        """Each existing table's current metadata file (the served tables' too)."""
        return {
            name: self.table(name).metadata_location
            for name in (*STORED_TABLES, VERSIONS_TABLE, *served_schemas())
            if self.has_table(name)
        }

    # -- writing (under publish_lock) -------------------------------------------------------

    def roll_back_to(self, version: Version) -> None:
        """Undo commits no version names (a publisher that died between its commits)."""
        for name in STORED_TABLES:
            table = self.table(name)
            head = table.current_snapshot()
            pinned = version.snapshot_ids.get(name)
            if (head.snapshot_id if head else None) == pinned:
                continue
            if pinned is None:  # created, or first written, by the one that died
                table.delete()
            else:
                table.manage_snapshots().set_current_snapshot(snapshot_id=pinned).commit()
            self.table(name)

    def upload(self, name: str, path: Path) -> str:
        """Copy a local Parquet file into the data folder of the table `name`; its location."""
        table = self.table(name)
        location = f"{table.location()}/data/{secrets.token_hex(16)}.parquet"
        with path.open("rb") as source, table.io.new_output(location).create() as target:
            shutil.copyfileobj(source, target, UPLOAD_CHUNK_BYTES)
        return location

    def add_files(
        self, name: str, locations: list[str], properties: Mapping[str, str] | None = None
    ) -> None:
        """Add Parquet files already in the bucket to the table `name`, in one commit. Their
        columns are the table's, each carrying its field ID (data_file_of refuses any other),
        timestamps in microseconds."""
        table = self.table(name)
        with table.transaction() as transaction:
            missing = {
                k: v for k, v in MANIFEST_MERGE_PROPERTIES.items() if table.properties.get(k) != v
            }
            if missing:  # a table made before them: its appends merge from now on
                transaction.set_properties(missing)
            update = transaction.update_snapshot(snapshot_properties=dict(properties or {}))
            with update.merge_append() as append:
                for location in locations:
                    append.append_data_file(
                        data_file_of(table.io, transaction.table_metadata, location)
                    )

    def replace_files(self, name: str, deleted: list[str], added: list[str]) -> None:
        """In one commit, drop the data files at `deleted` from the table `name` and add the
        Parquet files at `added` (already in the bucket)."""
        if not deleted:
            self.add_files(name, added)
            return
        table = self.table(name)
        gone = set(deleted)
        old = [data_file for _, data_file in live_files(table) if data_file.file_path in gone]
        if len(old) != len(gone):
            raise RuntimeError(f"{name}: {len(gone) - len(old)} file(s) to replace are not live")
        with table.transaction() as transaction:
            update = transaction.update_snapshot()
            with update.overwrite() as rewrite:
                for data_file in old:
                    rewrite.delete_data_file(data_file)
                for location in added:
                    rewrite.append_data_file(
                        data_file_of(table.io, transaction.table_metadata, location)
                    )

    def compact(
        self, name: str, partitions: Collection[str] | None = None, policy: Compaction | None = None
    ) -> bool:
        """Merge the table's small data files (`compact_files`), then its manifests once they
        are more than MERGE_ABOVE_MANIFESTS (`merge_manifests`); return whether it merged
        data files."""
        compacted = self.compact_files(name, partitions, policy)
        self.merge_manifests(name)
        return compacted

    def merge_manifests(self, name: str) -> bool:
        """One manifest for a table that holds more than MERGE_ABOVE_MANIFESTS: a merge append
        that adds no file (every row kept, the head's version summary too), in one commit with
        the merge properties of a table made before them. Returns whether it did."""
        table = self.table(name)
        snapshot = table.current_snapshot()
        if snapshot is None or len(snapshot.manifests(table.io)) <= MERGE_ABOVE_MANIFESTS:
            return False
        kept = version_summary(snapshot)
        with table.transaction() as transaction:
            missing = {
                k: v for k, v in MANIFEST_MERGE_PROPERTIES.items() if table.properties.get(k) != v
            }
            if missing:
                transaction.set_properties(missing)
            update = transaction.update_snapshot(snapshot_properties=kept)
            with update.merge_append():
                pass
        return True

    def compact_files(
        self, name: str, partitions: Collection[str] | None = None, policy: Compaction | None = None
    ) -> bool:
        """Merge the newest small files of a table into one (every row kept, in one
        commit); return whether it did. Of run_segments, only settled files are merged (a
        publish rewrites the live ones). A partitioned table's files are merged within each
        partition (an Iceberg data file holds one). `partitions`: only those values of its first
        partition field (the ones an append touched), each once it holds more than the policy's
        `above_files`, and only the manifests that may hold them are read."""
        policy = policy or Compaction()
        table = self.table(name)
        snapshot = table.current_snapshot()
        summary = snapshot.summary if snapshot else None
        if summary is None or int(summary.get("total-data-files") or 0) <= policy.above_files:
            return False
        spec = table.spec()
        chosen = None if partitions is None or spec.is_unpartitioned() else set(partitions)
        live = live_files(table, chosen)
        if name == "run_segments":
            live = [(seq, f) for seq, f in live if not holds_live_runs(table, f)]
        live = [
            (seq, f)
            for seq, f in live
            if f.file_size_in_bytes < COMPACT_DONE_BYTES and f.spec_id == spec.spec_id
        ]
        groups: dict[tuple[object, ...], list[tuple[int, DataFile]]] = {}
        for seq, data_file in live:
            record = data_file.partition
            values = tuple(record[i] for i in range(len(record)))
            groups.setdefault(values, []).append((seq, data_file))
        merges = []
        for partition, files in groups.items():
            if chosen is not None and (
                partition[0] not in chosen or len(files) <= policy.above_files
            ):
                continue
            since = plan_compaction(
                [(seq, data_file.file_size_in_bytes) for seq, data_file in files], policy.size_ratio
            )
            if since is not None:
                merges.append([data_file for seq, data_file in files if seq >= since])
        if not merges:
            return False
        with tempfile.TemporaryDirectory(prefix="kindex-compact-") as folder:
            locations = []
            for n, merged in enumerate(merges):
                path = Path(folder) / f"merged-{n}.parquet"
                merge_files(table, [f.file_path for f in merged], path)
                locations.append(self.upload(name, path))
        kept = version_summary(snapshot)
        with table.transaction() as transaction:
            added = [data_file_of(table.io, transaction.table_metadata, x) for x in locations]
            update = transaction.update_snapshot(snapshot_properties=kept)
            with update.overwrite() as rewrite:
                for merged, data_file in zip(merges, added, strict=True):
                    for old in merged:
                        rewrite.delete_data_file(old)
                    rewrite.append_data_file(data_file)
        return True

    def expire(self) -> None:
        """Forget the snapshots no retained version names (the newest
        `index_retention_versions`); their files stay in the bucket. Time travel reaches back
        that far, and each table's metadata, which every commit rewrites, stays small."""
        kept = self.versions()[-self.settings.index_retention_versions :]
        for name in (*STORED_TABLES, VERSIONS_TABLE):
            self.expire_table(name, kept)

    def expire_table(
        self,
        name: str,
        kept: list[Version] | None = None,
        *,
        keep_newest: int = 0,
    ) -> None:
        """expire() for one table: a stored table keeps the snapshots the retained versions
        name; a served table (the file ledger) the one each retained version was published
        over (what `--as-of` reads), the commits since the newest version's ledger point
        (what the next publish reads), its newest `keep_newest`, and its head."""
        if kept is None:
            kept = self.versions()[-self.settings.index_retention_versions :]
        oldest_kept = kept[0].published_at if kept else None
        table = self.table(name, refresh=name in served_schemas())
        head = table.current_snapshot()
        pinned = {v.snapshot_ids.get(name) for v in kept} | {head.snapshot_id if head else None}
        if name in served_schemas():
            for v in kept:
                if v.published_at is not None:
                    at = table.snapshot_as_of_timestamp(int(v.published_at.timestamp() * 1000))
                    pinned.add(at.snapshot_id if at is not None else None)
            # Between those, only what the next publish reads and the newest few (a sensor's
            # cursor, a check's point) are read: the metadata every commit rewrites (and each
            # commit copies) holds those, not the table's history.
            point = self.current().ledger_point  # (the versions table's rows lack it)
            since = snapshots_since(table, head, point) if head is not None else None
            pinned |= {point} | {s.snapshot_id for s in since or ()}
            newest = sorted(table.snapshots(), key=lambda s: s.timestamp_ms)
            pinned |= {s.snapshot_id for s in newest[len(newest) - keep_newest :]}
            old = [s.snapshot_id for s in table.snapshots() if s.snapshot_id not in pinned]
        else:
            old = [
                s.snapshot_id
                for s in table.snapshots()
                if s.snapshot_id not in pinned
                and (oldest_kept is None or s.timestamp_ms < oldest_kept.timestamp() * 1000)
            ]
        # What `expire_snapshots().by_ids(old)` commits, in one update: it copies the table's
        # metadata twice for each id it checks.
        protected = {ref.snapshot_id for ref in table.metadata.refs.values()}
        old = [snapshot_id for snapshot_id in old if snapshot_id not in protected]
        if old:
            update = RemoveSnapshotsUpdate.model_validate({"snapshot-ids": old})
            self.catalog.commit_table(table, (), (update,))

    def identify(self, name: str) -> bool:
        """Once per table kindex does not rebuild (the file ledger): rewrite, in one commit,
        its live data files whose columns carry no field IDs (written by an older kindex) into
        one file that does (one a partition), and forget the snapshots before, which named
        them. Returns whether it rewrote any."""
        table = self.table(name, refresh=True)
        if table.properties.get(FIELD_IDS_PROPERTY) == "1":
            return False
        schema = table.schema()
        old = [f for _, f in live_files(table) if footer_lacks_field_ids(table.io, f, schema)]
        # A partitioned table (the ledger) gets one file per partition: a file holds one.
        by_partition: dict[str, list[str]] = {}
        for f in old:
            by_partition.setdefault(repr(f.partition), []).append(f.file_path)
        with tempfile.TemporaryDirectory(prefix="kindex-identify-") as folder:
            locations = []
            for n, paths in enumerate(by_partition.values()):
                path = Path(folder) / f"identified-{n}.parquet"
                merge_files(table, paths, path)
                locations.append(self.upload(name, path))
            with table.transaction() as transaction:
                if locations:
                    with transaction.update_snapshot().overwrite() as rewrite:
                        for data_file_before in old:
                            rewrite.delete_data_file(data_file_before)
                        for location in locations:
                            rewrite.append_data_file(
                                data_file_of(table.io, transaction.table_metadata, location)
                            )
                transaction.set_properties({FIELD_IDS_PROPERTY: "1"})
        table = self.table(name, refresh=True)
        head = table.current_snapshot()
        kept = head.snapshot_id if head else None
        before = [s.snapshot_id for s in table.snapshots() if s.snapshot_id != kept]
        if old and before:
            expiring = table.maintenance.expire_snapshots()
            for snapshot_id in before:
                expiring = expiring.by_id(snapshot_id)
            expiring.commit()
            self.table(name, refresh=True)
        return bool(old)

    def snapshot_id(self, name: str) -> int | None:
        snapshot = self.table(name).current_snapshot()
        return snapshot.snapshot_id if snapshot else None

    def commit_version(self, version: Version) -> None:
        """The commit point: from here readers see `version`."""
        row = pa.Table.from_pylist(
            [
                {
                    "seq": version.seq,
                    "version": version.version,
                    "parent": version.parent,
                    "published_at": version.published_at,
                    "snapshot_ids": json.dumps(dict(version.snapshot_ids), sort_keys=True),
                    "counts": json.dumps(dict(version.counts), sort_keys=True),
                }
            ],
            schema=VERSIONS_SCHEMA,
        )
        with tempfile.TemporaryDirectory(prefix="kindex-version-") as folder:
            path = Path(folder) / "version.parquet"
            schema = with_field_ids(VERSIONS_SCHEMA, self.table(VERSIONS_TABLE).schema())
            pq.write_table(row.cast(schema), path)
            location = self.upload(VERSIONS_TABLE, path)
        self.add_files(VERSIONS_TABLE, [location], version.summary())


def version_summary(snapshot: Snapshot | None) -> dict[str, str]:
    """What a snapshot's summary says of kindex's version: a commit that rewrites the head
    (compaction, a manifest merge) carries it, so the version a commit point's head names stays
    named (see current())."""
    summary = snapshot.summary if snapshot is not None else None
    if summary is None:
        return {}
    return {k: v for k, v in summary.additional_properties.items() if k.startswith(SUMMARY_PREFIX)}


def holds_live_runs(table: Table, data_file: DataFile) -> bool:
    """Whether a run_segments file holds live rows (its `live` column's upper bound)."""
    field_id = table.schema().find_field("live").field_id
    bound = (data_file.upper_bounds or {}).get(field_id)
    return bound is not None and bound != b"\x00"


def snapshots_since(table: Table, head: Snapshot, since: int | None) -> list[Snapshot] | None:
    """The snapshots after `since` up to `head` (newest first), or None when `since` is not one
    of head's ancestors (no point, or expired)."""
    if since is None:
        return None
    by_id = {snapshot.snapshot_id: snapshot for snapshot in table.snapshots()}
    found = []
    snapshot: Snapshot | None = head
    while snapshot is not None and snapshot.snapshot_id != since:
        found.append(snapshot)
        parent = snapshot.parent_snapshot_id
        snapshot = by_id.get(parent) if parent is not None else None
    return None if snapshot is None else found


def plan_compaction(
    files: list[tuple[int, int]], size_ratio: int = COMPACT_SIZE_RATIO
) -> int | None:
    """Given (data sequence number, size) of each data file, the sequence number from which the
    newest files are merged: the newest file, and each older one while it is at most
    `size_ratio` times the size merged so far. None when that is a single file."""
    ordered = sorted(files, reverse=True)
    merged, count, since = 0, 0, None
    for seq, size in ordered:
        if count and size > size_ratio * merged:
            break
        merged, count, since = merged + size, count + 1, seq
    return since if count > 1 else None


def live_files(
    table: Table, partitions: Collection[str] | None = None
) -> list[tuple[int, DataFile]]:
    """The data files of the table's current snapshot with their data sequence numbers (the
    commit that added their rows), oldest first; `partitions`: only the manifests whose first
    partition field's bounds may hold one of those values are read."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    manifests = snapshot.manifests(table.io)
    if partitions is not None:
        manifests = [m for m in manifests if _may_hold(m, partitions)]
    entries = [
        (entry.sequence_number or 0, entry.data_file)
        for manifest in manifests
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    ]
    return sorted(entries, key=lambda entry: entry[0])


def live_data_files(table: Table, manifest: ManifestFile) -> list[str]:
    """The data files a manifest holds live (added or existing)."""
    return [
        entry.data_file.file_path
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        if entry.data_file.content == DataFileContent.DATA
    ]


def _may_hold(manifest: ManifestFile, values: Collection[str]) -> bool:
    """Whether a manifest's partition summary (of a string first field) may hold a value."""
    if not manifest.partitions:
        return True
    summary = manifest.partitions[0]
    if summary.lower_bound is None or summary.upper_bound is None:
        return True
    low, high = summary.lower_bound.decode(), summary.upper_bound.decode()
    return any(low <= value <= high for value in values)


def merge_files(table: Table, locations: list[str], path: Path) -> None:
    """The rows of the table's data files, in order, as one Parquet file at `path`: each file's
    columns by name, in the table's order, types and field IDs (a column a file lacks is
    NULL)."""
    arrow = pa.schema([pa.field(f.name, f.type) for f in table.schema().as_arrow()])
    schema = with_field_ids(arrow, table.schema())
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for location in locations:
            with table.io.new_input(location).open() as stream:
                for batch in pq.ParquetFile(stream).iter_batches():
                    writer.write_batch(conformed(batch, schema))


def conformed(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    columns = []
    for column in schema:
        if column.name not in batch.schema.names:
            columns.append(pa.nulls(batch.num_rows, column.type))
            continue
        values = batch.column(column.name)
        columns.append(values if values.type == column.type else values.cast(column.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class MissingFieldIds(ValueError):
    """A Parquet file whose columns do not carry its table's field IDs: no table takes it."""


def field_ids(schema: Schema) -> dict[str, int]:
    """Each column's Iceberg field ID, by name (the index's tables are flat)."""
    return {column.name: column.field_id for column in schema.fields}


def with_field_ids(arrow_schema: pa.Schema, schema: Schema) -> pa.Schema:
    """The pyarrow schema, each column carrying the table's field ID (pyarrow writes it into
    the Parquet file)."""
    ids = field_ids(schema)
    return pa.schema(
        [column.with_metadata({FIELD_ID_KEY: str(ids[column.name])}) for column in arrow_schema]
    )


def duckdb_field_ids(schema: Schema) -> str:
    """The FIELD_IDS option of DuckDB's `COPY ... (FORMAT parquet)` for the table's columns."""
    ids = ", ".join(f'"{name}": {field_id}' for name, field_id in field_ids(schema).items())
    return "{" + ids + "}"


def unidentified_columns(parquet_schema: pa.Schema, schema: Schema) -> list[str]:
    """The columns of a Parquet file (its pyarrow schema) that are not the table's with the
    table's field ID, and the table's columns the file lacks."""
    ids = field_ids(schema)
    wrong = []
    for column in parquet_schema:
        found = (column.metadata or {}).get(FIELD_ID_KEY)
        if found is None or ids.get(column.name) != int(found):
            wrong.append(column.name)
    return wrong + [name for name in ids if name not in parquet_schema.names]


def data_file_of(io: FileIO, metadata: TableMetadata, location: str) -> DataFile:
    """The manifest entry of the Parquet file at `location` for the table of `metadata` (its
    statistics from the footer, as pyiceberg's own writer computes them); a MissingFieldIds
    error when its columns do not carry the table's field IDs, so that every engine reads it
    by ID and none needs a name mapping."""
    input_file = io.new_input(location)
    with input_file.open() as stream:
        parquet = pq.read_metadata(stream)
    schema = metadata.schema()
    wrong = unidentified_columns(parquet.schema.to_arrow_schema(), schema)
    if wrong:
        raise MissingFieldIds(
            f"{location}: not a data file of this table: {', '.join(wrong)} "
            "without the table's field ID"
        )
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=parquet,
        stats_columns=compute_statistics_plan(schema, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=statistics.partition(metadata.spec(), schema),
        file_size_in_bytes=len(input_file),
        sort_order_id=None,
        spec_id=metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )


def footer_lacks_field_ids(io: FileIO, data_file: DataFile, schema: Schema) -> bool:
    """Whether a data file's columns (its Parquet footer) lack the table's field IDs."""
    with io.new_input(data_file.file_path).open() as stream:
        parquet_schema = pq.read_schema(stream)
    return bool(unidentified_columns(parquet_schema, schema))


def files_without_field_ids(table: Table) -> list[str]:
    """Every data file that any snapshot of the table holds (the live entries of each of its
    manifests; a deleted entry records a file leaving) and whose columns lack the table's field
    IDs (each file's footer read once)."""
    schemas = {schema.schema_id: schema for schema in table.schemas().values()}
    checked: dict[str, bool] = {}
    for snapshot in table.snapshots():
        schema = schemas.get(snapshot.schema_id or 0, table.schema())
        for manifest in snapshot.manifests(table.io):
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                path = entry.data_file.file_path
                if path not in checked:
                    checked[path] = footer_lacks_field_ids(table.io, entry.data_file, schema)
    return sorted(path for path, lacking in checked.items() if lacking)
