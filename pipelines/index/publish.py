"""Publishing the index: one Iceberg commit per table, then the version that names them.

Given the record sets (see record_objects.py) not yet in the index, a publish adds to the
Iceberg tables (catalog.py):
- `run_segments`: every run once, as the `runs` view shows it: with where it was first seen
  (its snapshot's first read) and its current superseded_by and retracted_in_source. Only the
  live rows (latest runs, and each Liger version's newest run of a series) can change when runs
  are added, so a publish rewrites the live files and appends the new runs' settled rows; it
  reads the settled files only of a series that gets a run no newer than its newest (a late
  series), or of a snapshot whose first read moved, and rewrites just those (RunChanges);
- `manifest_segments`: the manifests those record sets bring that the index does not hold yet;
- `lineage_files`: the record sets' lineage rows that `run_segments` does not hold (a run's
  row there is its first lineage row: tables.lineage_rows);
- `quarantine_files`: the record sets' quarantine rows;
- `snapshots`: one row per object version read.
Every table but run_segments is only appended to, so a version costs a commit per table it adds
rows to. The manifests of a record set that are all new join their table as the record set's
own Parquet files; other rows are written once, by DuckDB. Then the small files of each table are
merged, and one row of `index_versions` names the snapshot of every table: that append is the
commit. A superseded run stays a row; a run no snapshot's current record set holds any more (its
file processed again into other runs) leaves run_segments (find_stale). Old versions stay
readable for the retention (`--as-of`: a replaced run file stays in the bucket).
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.schema import Schema

from pipelines.index.bucket_format import ObjectRead, RecordSet, SetsFileContent
from pipelines.index.catalog import (
    EXPIRE_EVERY_VERSIONS,
    VERSIONS_TABLE,
    IndexCatalog,
    Version,
    commit_retry,
    duckdb_field_ids,
    publish_lock,
    unidentified_columns,
)
from pipelines.index.committed import committed_since, ledger_head
from pipelines.index.faults import INDEX_FILES_WRITTEN, pause_point
from pipelines.index.layout import IndexLayout
from pipelines.index.listing import list_record_sets
from pipelines.index.local import (
    PublishedIndex,
    cache_file,
    fetch_all,
    install_local,
    object_key,
    published,
)
from pipelines.index.reads import NEWEST_ORDER_SQL
from pipelines.index.tables import (
    CURRENT_RECORD_SET,
    DUCKDB_TYPES,
    MANIFEST_SEGMENT_SCHEMA,
    RUN_SEGMENT_SCHEMA,
    RUN_SORT_COLUMNS,
    RUN_STATE_FIELDS,
    SEQ_COLUMN,
    SNAPSHOT_SCHEMA,
    STORED_TABLES,
    baseline_providers_statement,
    empty_select,
    parquet_select,
    sql_string,
)
from pipelines.records.record_objects import (
    RECORD_FILES,
    RUN_SCHEMA,
    RecordSetSummary,
    is_shared,
)
from pipelines.regressions import POINT_TIME_SQL, VERSION_COLUMNS, point_axis_sql
from pipelines.settings import Settings
from pipelines.storage.base import ObjectStore
from pipelines.storage.errors import StorageUnreachable

# DuckDB's memory for a publish: what does not fit spills to disk, so a publish's memory stays
# flat however large the files it adds.
PUBLISH_MEMORY_LIMIT = "2GB"
# Live run files at which a publish rewrites them as one (RunChanges.write).
MAX_LIVE_FILES = 4
# Rows per row group of a run file: a writer buffers a row group per thread (a run is ~1.4 KB
# with its manifest), and a filter skips row groups by their bounds.
RUN_ROW_GROUP_ROWS = 32_768
# How the rows of the small tables are ordered in their files. Runs and lineage keep the order
# of their record sets (a file's lines): sorting a million runs with their manifests would cost
# more than writing them.
ROW_ORDER = {
    "manifest_segments": "kind, digest",
    "quarantine_files": "snapshot_digest, source_line",
    "snapshots": "taken_at, read_id",
    "series_points": "kernel, gpu, provider, mode, point_at",
}


@dataclass(frozen=True, slots=True)
class RecordObjects:
    """The objects of some record sets, by table, each once (local copies), and the rows each
    set claims of the objects it shares with its batch: those are all that is read of them."""

    paths: dict[str, list[str]]
    claims: list[tuple[str, str, str]]  # (shared object's local path, snapshot, parser version)

    @classmethod
    def fetch(
        cls,
        store: ObjectStore,
        layout: IndexLayout,
        sets: Sequence[RecordSet],
        names: Sequence[str] = RECORD_FILES,
    ) -> RecordObjects:
        keys = {
            name: list(dict.fromkeys(k for rs in sets for k in rs.file_keys(name)))
            for name in names
        }
        unique = list(dict.fromkeys(k for table in keys.values() for k in table))
        local = dict(zip(unique, map(str, fetch_all(store, layout, unique)), strict=True))
        claims = {
            (local[key], rs.snapshot_digest, rs.parser_version)
            for rs in sets
            for name in names
            for object_name, key in zip(rs.object_names(name), rs.file_keys(name), strict=True)
            if is_shared(object_name)
        }
        return cls({name: [local[k] for k in ks] for name, ks in keys.items()}, sorted(claims))

    @property
    def claimed(self) -> set[str]:
        """The local paths of the shared objects."""
        return {path for path, _, _ in self.claims}

    def shared(self, name: str) -> bool:
        return not self.claimed.isdisjoint(self.paths[name])

    def select(self, name: str, schema: pa.Schema) -> str:
        """The schema's columns of the sets' rows of one table."""
        claimed = self.claimed
        own = [path for path in self.paths[name] if path not in claimed]
        common = [path for path in self.paths[name] if path in claimed]
        if not common:
            return parquet_select(own, schema)
        columns = ", ".join(f"r.{column}" for column in schema.names)
        files = ", ".join(map(sql_string, common))
        rows = ", ".join(
            f"({sql_string(path)}, {sql_string(digest)}, {sql_string(version)})"
            for path, digest, version in self.claims
            if path in common
        )
        select = (
            f"SELECT {columns} FROM read_parquet([{files}], filename = true) r "
            f"SEMI JOIN (VALUES {rows}) c(filename, snapshot_digest, parser_version) "
            "USING (filename, snapshot_digest, parser_version)"
        )
        return f"{parquet_select(own, schema)} UNION ALL {select}" if own else select


@dataclass(slots=True)
class IndexVersion:
    """The index as published after a `publish_index` call."""

    version: str | None
    parent: str | None
    published: bool  # False when there was nothing new: the current version stands
    counts: dict[str, int] = field(default_factory=dict)
    new_runs: int = 0
    new_reads: int = 0


def new_version_id() -> str:
    """Sortable by time; unique across concurrent writers."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ") + "-" + secrets.token_hex(3)


def included(
    store: ObjectStore,
    layout: IndexLayout,
    index: PublishedIndex,
    digests: Collection[str] | None = None,
) -> tuple[set[str], set[tuple[str, str]]]:
    """The record set prefixes a version holds, and its reads as (prefix, read id): a read is
    registered with each record set (parser version) that processed it (from its snapshots).
    `digests`: of these snapshots only."""
    paths = list(map(str, fetch_all(store, layout, index.files["snapshots"])))
    con = duckdb.connect()
    try:
        sql = (
            "SELECT DISTINCT parser_version, snapshot_digest, read_id FROM "
            f"({parquet_select(paths, SNAPSHOT_SCHEMA)})"
        )
        if digests is not None:
            sql += " WHERE list_contains(?, snapshot_digest)"
        rows = con.execute(sql, [] if digests is None else [sorted(digests)]).fetchall()
    finally:
        con.close()
    reads = {
        (layout.record_set_prefix(parser_version, snapshot_digest), read_id)
        for parser_version, snapshot_digest, read_id in rows
    }
    return {prefix for prefix, _ in reads}, reads


@dataclass(slots=True)
class Additions:
    """What a publish adds to the version it extends: the record sets it lacks, the reads it
    lacks, the summaries of both (by prefix), and the ledger point the new version covers."""

    sets: list[RecordSet]
    reads: list[ObjectRead]
    summaries: dict[str, RecordSetSummary]
    point: int | None
    from_listing: bool = False  # the version extended named no ledger point: caught up once

    @property
    def empty(self) -> bool:
        return not self.sets and not self.reads


def additions(
    store: ObjectStore,
    layout: IndexLayout,
    catalog: IndexCatalog,
    version: Version,
    current: PublishedIndex,
) -> Additions:
    """The record sets and reads of the ledger rows committed since `version`'s ledger point:
    their batches' sets files, less what the index holds. A version without a point (published
    before versions named one, empty, or rebuilt) is caught up from a listing of the bucket."""
    if version.ledger_point is None:
        return _listed_additions(store, layout, current, ledger_head(catalog))
    committed = committed_since(catalog, version.ledger_point)
    summaries: dict[str, RecordSetSummary] = {}
    reads: dict[tuple[str, str], ObjectRead] = {}
    paths = fetch_all(store, layout, committed.sets_files)
    for key, path in zip(committed.sets_files, paths, strict=True):  # a prefix: the newest's
        content = SetsFileContent.loads(path.read_bytes(), key)
        summaries.update(content.summaries)
        for registered in content.reads:
            reads.setdefault((registered.prefix, registered.read.read_id), registered.read)
    digests = {read.snapshot_digest for read in reads.values()}
    included_sets, included_reads = included(store, layout, current, digests)
    new_reads = {
        place: read
        for place, read in sorted(reads.items())
        if place not in included_reads and place[0] in summaries
    }
    with_read = {prefix for prefix, _ in new_reads}
    sets = [
        RecordSet(prefix, summaries[prefix])
        for prefix in sorted(summaries)
        if prefix not in included_sets and prefix in with_read
    ]
    return Additions(sets, list(new_reads.values()), summaries, committed.point)


def _listed_additions(
    store: ObjectStore, layout: IndexLayout, current: PublishedIndex, point: int | None
) -> Additions:
    """Additions from a listing of every record set (the ledger head `point` read before it:
    rows committed after are read by the next publish)."""
    included_sets, included_reads = included(store, layout, current)
    listing = list_record_sets(store, layout)
    pending, new_reads = listing.unpublished(included_sets, included_reads)
    # Every summary the new reads need too (a new read of a set already in the index).
    prefixes = sorted({*pending, *(prefix for prefix, _ in new_reads)})
    summaries = {rs.prefix: rs.summary for rs in listing.record_sets(store, layout, prefixes)}
    sets = [RecordSet(prefix, summaries[prefix]) for prefix in pending]
    reads = listing.object_reads(store, layout, new_reads)
    return Additions(sets, reads, summaries, point, from_listing=True)


def unpublished_record_sets(store: ObjectStore, settings: Settings) -> list[str]:
    """Prefixes of complete record sets the current index lacks, and of those with reads it has
    not folded in: what the next publish would add."""
    layout = IndexLayout.of(settings)
    catalog = IndexCatalog.beside(store, settings)
    # An index of another layout is rebuilt by the next publish: everything is to be added.
    current = Version.empty() if catalog.outdated() else catalog.current()
    found = additions(store, layout, catalog, current, published(catalog, current, store.bucket))
    return sorted(
        {
            *(rs.prefix for rs in found.sets),
            *(layout.record_set_prefix(r.parser_version, r.snapshot_digest) for r in found.reads),
        }
    )


def publish_index(store: ObjectStore, settings: Settings) -> IndexVersion:
    """Fold every complete record set not yet indexed into a new version and publish it."""
    with publish_lock(settings):
        try:
            return _publish(store, settings)
        except OSError as error:  # the Iceberg writer's S3 client (pyarrow) gave up
            endpoint = getattr(store, "endpoint_url", None) or "of the bucket"
            raise StorageUnreachable(
                f"cannot reach the S3 endpoint {endpoint} (publish the index): {error}"
            ) from error


# Publishers take turns, so a conflict is a catalog shared with a writer outside the lock (a
# REST catalog on two hosts): start again from the version that won.
@commit_retry
def _publish(store: ObjectStore, settings: Settings) -> IndexVersion:
    layout = IndexLayout.of(settings)
    catalog = IndexCatalog.beside(store, settings)
    catalog.create_tables()
    version = catalog.current()
    catalog.roll_back_to(version)
    current = published(catalog, version, store.bucket, serve=False)
    found = additions(store, layout, catalog, version, current)
    if found.empty:
        if found.from_listing and version.seq > 0 and found.point is not None:
            # Caught up from a listing: the point is recorded once, so the next publish reads
            # the ledger instead.
            version = replace(
                version,
                seq=version.seq + 1,
                version=new_version_id(),
                parent=version.version,
                published_at=datetime.now(UTC),
                ledger_point=found.point,
            )
            catalog.commit_version(version)
        install_local(store, layout, published(catalog, version, store.bucket))
        return IndexVersion(
            version.version, version.parent, published=False, counts=dict(version.counts)
        )
    new_version, new_runs = build_version(
        store, layout, catalog, current, found.sets, found.reads, found.summaries, found.point
    )
    install_local(store, layout, published(catalog, new_version, store.bucket))
    # Upkeep once the new version is readable here (a file is queryable at its install):
    # neither step changes what a version reads.
    tidy_versions(catalog, new_version)
    return IndexVersion(
        new_version.version,
        new_version.parent,
        published=True,
        counts=dict(new_version.counts),
        new_runs=new_runs,
        new_reads=len(found.reads),
    )


def reads_table(
    reads: Sequence[ObjectRead], summaries: dict[str, RecordSetSummary], layout: IndexLayout
) -> pa.Table:
    rows = []
    for read in reads:
        summary = summaries[layout.record_set_prefix(read.parser_version, read.snapshot_digest)]
        rows.append(
            {
                "read_id": read.read_id,
                "snapshot_digest": read.snapshot_digest,
                "bucket": read.bucket,
                "source_key": read.source_key,
                "etag": read.etag,
                "version_id": read.version_id,
                "size": read.size,
                "last_modified": read.last_modified,
                "taken_at": read.taken_at,
                "parser_version": read.parser_version,
                "processed_at": read.processed_at,
                "source": summary.get("source", read.source),
                "rows": summary.get("rows", 0),
                "runs": summary.get("runs", 0),
                "quarantined": summary.get("quarantined", 0),
                "commit": read.commit,
                "committed_at": read.committed_at,
            }
        )
    return pa.Table.from_pylist(rows, schema=SNAPSHOT_SCHEMA)


def build_version(
    store: ObjectStore,
    layout: IndexLayout,
    catalog: IndexCatalog,
    current: PublishedIndex,
    pending: list[RecordSet],
    reads: list[ObjectRead],
    summaries: dict[str, RecordSetSummary],
    ledger_point: int | None = None,
) -> tuple[Version, int]:
    """Compute the new rows from the current version plus the pending record sets, commit them
    table by table, and then the version naming those commits. Returns it and its new runs."""
    local = {
        name: list(map(str, fetch_all(store, layout, keys))) for name, keys in current.files.items()
    }
    objects = RecordObjects.fetch(store, layout, pending)
    layout.cache_dir.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(
        config={
            "memory_limit": PUBLISH_MEMORY_LIMIT,
            "preserve_insertion_order": False,
            # Where what does not fit spills (temporary tables too), beside the cache.
            "temp_directory": str(layout.cache_dir / ".publish-spill"),
        }
    )
    live_paths, settled_paths = split_run_files(local.get("run_segments", []))
    for name, schema in STORED_TABLES.items():
        if name != "run_segments":
            con.execute(f"CREATE VIEW old_{name} AS {parquet_select(local.get(name, []), schema)}")
    con.execute(f"CREATE VIEW old_live AS {parquet_select(live_paths, RUN_SEGMENT_SCHEMA)}")
    con.register("new_reads_arrow", reads_table(reads, summaries, layout))
    con.execute(
        "CREATE TEMP TABLE reads AS SELECT * FROM old_snapshots "
        "UNION ALL BY NAME SELECT * FROM new_reads_arrow"
    )
    # Where each snapshot was first seen: its earliest read.
    con.execute(
        "CREATE TEMP TABLE first_reads AS SELECT snapshot_digest, "
        "arg_min(source_key, {'at': taken_at, 'id': read_id}) AS source_key, "
        "min({'at': taken_at, 'id': read_id}) AS first_seen FROM reads GROUP BY snapshot_digest"
    )
    find_reprocessed(con)
    several = len(pending) > 1
    # A snapshot whose current record set is one the index holds already (processed again by
    # a parser it had before) brings that set's runs back: they are looked at as pending runs.
    returning = returning_record_sets(con, layout, pending, summaries)
    run_objects = (
        RecordObjects.fetch(store, layout, [*pending, *returning], ["runs"])
        if returning
        else objects
    )
    several_runs = several or bool(returning)
    for name in ("lineage", "quarantine"):
        select = objects.select(name, STORED_TABLES[f"{name}_files"])
        con.execute(f"CREATE TEMP VIEW new_{name} AS {select}")
    runs = RunChanges.find(con, run_objects.select("runs", RUN_SCHEMA), settled_paths, several_runs)
    # A returning record set's points are stored already: only the pending sets' runs add points.
    add_new_points(con, objects.select("runs", RUN_SCHEMA))
    new_manifests, whole_manifests = add_new_records(
        con, "manifests", "digest", objects, MANIFEST_SEGMENT_SCHEMA, several
    )
    # One record set whose lineage is its runs' rows, all new: no lineage row of its own.
    add_new_lineage(
        con,
        not several_runs and runs.all_new and objects.paths["lineage"] == objects.paths["runs"],
    )
    recompute_run_state(con, {rs.snapshot_digest for rs in pending})
    # Every data file written carries its table's field IDs (catalog.data_file_of checks).
    field_ids = {name: duckdb_field_ids(catalog.table(name).schema()) for name in STORED_TABLES}
    run_files = runs.write(con, layout, live_paths, field_ids["run_segments"])

    seq = current.version.seq + 1
    outputs = {
        "manifest_segments": "new_manifests",
        "lineage_files": "new_lineage_files",
        "quarantine_files": "new_quarantine",
        "snapshots": "new_reads_arrow",
        "series_points": "new_points",
    }
    # A record set whose manifests are all new holds them as the table does: its Parquet files
    # join the table as they are. Any other new rows become one Parquet file that DuckDB writes
    # into the local cache and that is uploaded. The runs' files replace those they rewrite in
    # one commit. The commits are independent, so their S3 round trips overlap on threads.
    with ThreadPoolExecutor(max_workers=len(outputs) + 1) as pool:
        commits = [
            pool.submit(
                replace_run_files, catalog, layout, run_files, runs.deleted_keys(layout, local)
            )
        ]
        for name, rows in outputs.items():
            if (
                name == "manifest_segments"
                and whole_manifests
                and new_manifests > 0
                and not objects.shared("manifests")
                and table_files(objects.paths["manifests"], name, catalog.table(name).schema())
            ):
                keys = [key for rs in pending for key in rs.file_keys("manifests")]
                locations = [f"s3://{layout.bucket}/{key}" for key in keys]
                commits.append(pool.submit(add_and_compact, catalog, name, locations))
            elif (
                path := write_data_file(con, layout, name, rows, seq, field_ids[name])
            ) is not None:
                commits.append(pool.submit(commit_data_file, catalog, layout, name, path))
        for commit in commits:
            commit.result()
    counts = index_counts(con, current.version, runs.new - runs.dropped, new_manifests, pending)
    con.close()
    pause_point(INDEX_FILES_WRITTEN)
    version = Version(
        seq=seq,
        version=new_version_id(),
        parent=current.version.version,
        published_at=datetime.now(UTC),
        snapshot_ids={name: catalog.snapshot_id(name) for name in STORED_TABLES},
        counts=counts,
        ledger_point=ledger_point,
    )
    catalog.commit_version(version)
    return version, runs.new


def tidy_versions(catalog: IndexCatalog, version: Version) -> None:
    """After a version's commit: the versions table's small files merged, and every
    EXPIRE_EVERY_VERSIONS versions, the snapshots no retained version names expired."""
    catalog.compact(VERSIONS_TABLE)
    if version.seq % EXPIRE_EVERY_VERSIONS == 0:
        catalog.expire()


def find_reprocessed(con: duckdb.DuckDBPyConnection) -> None:
    """current_sets: each snapshot's current record set (tables.CURRENT_RECORD_SET) once the new
    reads are in; reprocessed: the snapshots of the new reads whose current set they change (a
    backfill after the curation grew, a parser fix), or that come with several record sets (an
    index rebuilt from the bucket), with their current one."""
    con.execute(
        f"""CREATE TEMP TABLE current_sets AS
            SELECT snapshot_digest, {CURRENT_RECORD_SET} AS parser_version
            FROM reads GROUP BY snapshot_digest"""
    )
    con.execute(
        f"""CREATE TEMP TABLE reprocessed AS
            WITH new AS (
                SELECT snapshot_digest, count(DISTINCT parser_version) AS sets FROM reads
                WHERE snapshot_digest IN (SELECT snapshot_digest FROM new_reads_arrow)
                GROUP BY snapshot_digest
            ), old AS (
                SELECT snapshot_digest, {CURRENT_RECORD_SET} AS parser_version
                FROM old_snapshots
                WHERE snapshot_digest IN (SELECT snapshot_digest FROM new_reads_arrow)
                GROUP BY snapshot_digest
            )
            SELECT c.snapshot_digest, c.parser_version FROM new n
            JOIN current_sets c USING (snapshot_digest)
            LEFT JOIN old o USING (snapshot_digest)
            WHERE CASE WHEN o.snapshot_digest IS NULL THEN n.sets > 1
                       ELSE c.parser_version <> o.parser_version END"""
    )


def returning_record_sets(
    con: duckdb.DuckDBPyConnection,
    layout: IndexLayout,
    pending: Sequence[RecordSet],
    summaries: dict[str, RecordSetSummary],
) -> list[RecordSet]:
    """The record sets the index holds that are again their snapshot's current one (after
    find_reprocessed): a run of theirs that left the index comes back."""
    pending_prefixes = {rs.prefix for rs in pending}
    prefixes = [
        layout.record_set_prefix(parser_version, digest)
        for digest, parser_version in con.execute(
            "SELECT snapshot_digest, parser_version FROM reprocessed ORDER BY 1"
        ).fetchall()
    ]
    return [
        RecordSet(prefix, summaries[prefix])
        for prefix in prefixes
        if prefix not in pending_prefixes and prefix in summaries
    ]


def split_run_files(paths: Sequence[str]) -> tuple[list[str], list[str]]:
    """The run_segments files (local copies) holding live rows, and those holding settled ones
    (each file holds one kind: its `live` column's bounds say which)."""
    live: list[str] = []
    settled: list[str] = []
    for path in paths:
        metadata = pq.read_metadata(path)
        if metadata.num_rows == 0:
            continue
        column = metadata.schema.to_arrow_schema().get_field_index("live")
        stats = metadata.row_group(0).column(column).statistics
        (live if stats is not None and stats.has_min_max and stats.max else settled).append(path)
    return live, settled


@dataclass(slots=True)
class RunChanges:
    """The runs a publish adds and the stored rows it rewrites.

    Only live rows (latest runs and the heads of each Liger version: tables.RUN_SEGMENT_SCHEMA)
    can change, except in a series that gets a run observed no later than its newest: a late
    series, whose settled rows are read too. A publish so reads the live rows, the new runs,
    and the late series' settled files; every other settled file stays as it is, unread."""

    new: int = 0
    dropped: int = 0  # stored runs no current record set holds any more (find_stale)
    all_new: bool = False  # no pending run is stored already
    rewrite_live: bool = False
    settled_rewritten: list[str] = field(default_factory=list)

    @classmethod
    def find(
        cls,
        con: duckdb.DuckDBPyConnection,
        pending_runs: str,
        settled_paths: Sequence[str],
        several: bool,
    ) -> RunChanges:
        """new_runs (the pending runs the index lacks, once each, with their source key),
        known_state (the stored runs whose state may change, with their state) and
        rewritten_settled (the rows of the settled files to rewrite)."""
        changes = cls()
        columns = ", ".join(f"c.{name}" for name in RUN_SCHEMA.names) + ", f.source_key"
        first_only = (
            """QUALIFY row_number() OVER (
                    PARTITION BY c.run_digest ORDER BY f.first_seen, c.source_line) = 1"""
            if several
            else ""
        )
        con.execute(
            f"""CREATE TEMP {"TABLE" if several else "VIEW"} candidate_runs AS
                SELECT {columns} FROM ({pending_runs}) c
                JOIN first_reads f USING (snapshot_digest) {first_only}"""
        )
        changes.dropped = find_stale(con, settled_paths)
        # A late series: a pending run observed no later than the series' newest run (which
        # is live: nothing observed later supersedes it); or one that loses a stale run.
        con.execute(
            """CREATE TEMP TABLE candidate_series AS
               SELECT series_key, min(observed_at) AS first_at FROM candidate_runs
               GROUP BY series_key"""
        )
        con.execute(
            """CREATE TEMP TABLE late_series AS
               SELECT c.series_key FROM candidate_series c
               JOIN (SELECT series_key, max(observed_at) AS last_at FROM old_live
                     GROUP BY series_key) l USING (series_key)
               WHERE c.first_at <= l.last_at
               UNION SELECT series_key FROM dropped_runs"""
        )
        # Snapshots whose first read moved (a read older than the one their runs were stored
        # with): their runs are stored again with the new source key.
        con.execute(
            """CREATE TEMP TABLE moved_snapshots AS
               SELECT o.snapshot_digest FROM (
                   SELECT snapshot_digest,
                          arg_min(source_key, {'at': taken_at, 'id': read_id}) AS source_key
                   FROM old_snapshots GROUP BY snapshot_digest) o
               JOIN first_reads f USING (snapshot_digest)
               WHERE o.source_key IS DISTINCT FROM f.source_key"""
        )
        late = scalar(con, "SELECT count(*) FROM late_series")
        moved = scalar(con, "SELECT count(*) FROM moved_snapshots")
        if (late or moved) and settled_paths:
            found = con.execute(
                f"""SELECT DISTINCT filename FROM read_parquet(
                        [{", ".join(sql_string(p) for p in settled_paths)}], filename = true)
                    WHERE series_key IN (SELECT series_key FROM late_series)
                       OR snapshot_digest IN (SELECT snapshot_digest FROM moved_snapshots)"""
            ).fetchall()
            changes.settled_rewritten = sorted(str(row[0]) for row in found)
        # A stale run's settled file is found by its series (late), and named here too.
        dropped_files = con.execute(
            "SELECT DISTINCT filename FROM dropped_runs WHERE filename IS NOT NULL"
        ).fetchall()
        changes.settled_rewritten = sorted(
            {*changes.settled_rewritten, *(str(row[0]) for row in dropped_files)}
        )
        con.execute(
            "CREATE TEMP VIEW rewritten_settled AS "
            + parquet_select(changes.settled_rewritten, RUN_SEGMENT_SCHEMA)
        )
        state = ", ".join(
            [
                "run_digest",
                "series_key",
                "observed_at",
                "liger_version",
                "snapshot_digest",
                "parser_version",
                "superseded_by",
                "retracted_in_source",
                "head_of_version",
            ]
        )
        con.execute(
            f"""CREATE TEMP TABLE known_state AS
                SELECT * FROM (
                    SELECT {state}, true AS in_live FROM old_live
                    UNION ALL SELECT {state}, false FROM rewritten_settled
                    WHERE series_key IN (SELECT series_key FROM late_series))
                WHERE run_digest NOT IN (SELECT run_digest FROM stale_runs)"""
        )
        con.execute(
            """CREATE TEMP TABLE known_runs AS
               SELECT k.run_digest FROM known_state k
               SEMI JOIN candidate_runs c ON c.run_digest = k.run_digest"""
        )
        if not scalar(con, "SELECT count(*) FROM known_runs") and not scalar(
            con, "SELECT count(*) FROM stale_runs"
        ):
            changes.all_new = True
            con.execute("CREATE TEMP VIEW new_runs AS SELECT * FROM candidate_runs")
        else:
            con.execute(
                """CREATE TEMP TABLE new_runs AS SELECT * FROM candidate_runs
                   WHERE run_digest NOT IN (SELECT run_digest FROM known_runs)
                     AND run_digest NOT IN (SELECT run_digest FROM stale_runs)"""
            )
        changes.new = scalar(con, "SELECT count(*) FROM new_runs")
        con.execute(
            """CREATE TEMP VIEW old_run_state AS
               SELECT run_digest, superseded_by, retracted_in_source FROM known_state
               WHERE superseded_by IS NOT NULL OR retracted_in_source"""
        )
        return changes

    def write(
        self,
        con: duckdb.DuckDBPyConnection,
        layout: IndexLayout,
        live_paths: Sequence[str],
        field_ids: str,
    ) -> list[Path]:
        """The new data files of run_segments (after recompute_run_state): the live rows, when
        any changed or any new run is live, and the settled rows that are new or rewritten
        (`field_ids`: the table's, as duckdb_field_ids gives them)."""
        con.execute(
            """CREATE TEMP TABLE final_state AS
               WITH everyone AS (
                   SELECT run_digest, superseded_by, retracted_in_source, head_of_version, in_live
                   FROM known_state
                   UNION ALL SELECT run_digest, NULL, false, false, NULL FROM new_runs
               )
               SELECT e.run_digest, e.in_live,
                      e.superseded_by AS old_superseded_by,
                      e.retracted_in_source AS old_retracted,
                      e.head_of_version AS old_head,
                      CASE WHEN c.run_digest IS NULL THEN e.superseded_by
                           ELSE c.superseded_by END AS superseded_by,
                      CASE WHEN c.run_digest IS NULL THEN e.retracted_in_source
                           ELSE c.retracted_in_source END AS retracted_in_source,
                      coalesce(h.head_of_version, e.head_of_version) AS head_of_version
               FROM everyone e
               LEFT JOIN run_state_changes c USING (run_digest)
               LEFT JOIN heads h USING (run_digest)"""
        )
        # What the state was computed from is no longer needed: its memory goes to the writes.
        for table in ("successors", "candidates", "changed_state", "held_elsewhere", "had_state"):
            con.execute(f"DROP TABLE IF EXISTS {table}")
        self.rewrite_live = bool(
            scalar(
                con,
                """SELECT count(*) FROM final_state f WHERE in_live AND (
                       superseded_by IS DISTINCT FROM old_superseded_by
                       OR retracted_in_source IS DISTINCT FROM old_retracted
                       OR head_of_version IS DISTINCT FROM old_head)""",
            )
        ) or bool(
            scalar(
                con,
                "SELECT count(*) FROM old_live "
                "WHERE snapshot_digest IN (SELECT snapshot_digest FROM moved_snapshots) "
                "OR run_digest IN (SELECT run_digest FROM stale_runs)",
            )
        )
        # Live files a publish only appended to (new series, nothing else changed) are merged
        # once there are a few: the live set stays in few files, and is never compacted.
        self.rewrite_live = self.rewrite_live or len(live_paths) >= MAX_LIVE_FILES
        stored = [
            f.name
            for f in RUN_SEGMENT_SCHEMA
            if f.name not in ("source_key", *(s.name for s in RUN_STATE_FIELDS), "head_of_version")
            and f.name != "live"
        ]
        sources = [f"SELECT {', '.join(stored)} FROM new_runs"]
        if self.rewrite_live and live_paths:
            sources.append(f"SELECT {', '.join(stored)} FROM old_live")
        if self.settled_rewritten:
            sources.append(f"SELECT {', '.join(stored)} FROM rewritten_settled")
        # A stale run leaves the files it was stored in (find_stale).
        pool = (
            f"SELECT * FROM ({' UNION ALL '.join(sources)}) "
            "WHERE run_digest NOT IN (SELECT run_digest FROM stale_runs)"
        )
        con.execute(
            f"""CREATE TEMP VIEW written_runs AS
                SELECT p.*, f.source_key,
                       CASE WHEN s.run_digest IS NULL THEN o.superseded_by
                            ELSE s.superseded_by END AS superseded_by,
                       CASE WHEN s.run_digest IS NULL THEN o.retracted_in_source
                            ELSE s.retracted_in_source END AS retracted_in_source,
                       CASE WHEN s.run_digest IS NULL THEN o.head_of_version
                            ELSE s.head_of_version END AS head_of_version
                FROM ({pool}) p
                LEFT JOIN first_reads f USING (snapshot_digest)
                LEFT JOIN final_state s USING (run_digest)
                LEFT JOIN (SELECT run_digest, superseded_by, retracted_in_source,
                                  head_of_version FROM rewritten_settled) o USING (run_digest)"""
        )
        paths = []
        for live in (True, False):
            rows = (
                "(SELECT *, superseded_by IS NULL OR head_of_version AS live FROM written_runs "
                f"WHERE (superseded_by IS NULL OR head_of_version) = {str(live).lower()})"
            )
            if (path := write_runs_file(con, layout, rows, field_ids, ordered=live)) is not None:
                paths.append(path)
        return paths

    def deleted_keys(self, layout: IndexLayout, local: dict[str, list[str]]) -> list[str]:
        """The locations of the stored run files the new ones replace."""
        keys = current_run_keys(layout, local)
        live, _ = split_run_files(list(keys))
        deleted = (live if self.rewrite_live else []) + self.settled_rewritten
        return [f"s3://{layout.bucket}/{keys[path]}" for path in deleted]


def find_stale(con: duckdb.DuckDBPyConnection, settled_paths: Sequence[str]) -> int:
    """stale_runs (run_digest): the runs of a reprocessed snapshot (find_reprocessed) that no
    snapshot's current record set holds any more: its file was processed again into other runs
    (an uncurated run turned curated, a parser fix that changed digests). A stale run leaves
    run_segments, and so runs, latest_runs and every view; its record set, its lineage rows
    and the versions before stay in the bucket (`--as-of`), and it comes back when its record
    set is current again (returning_record_sets). dropped_runs: the stored rows of the stale
    runs, with their series (recomputed without them: a late series) and their settled file
    (rewritten). Returns how many are dropped. Nothing is scanned unless a snapshot was
    processed again; then the settled files, for the rows of its runs only."""
    if not scalar(con, "SELECT count(*) FROM reprocessed"):  # the common case: nothing read
        con.execute("CREATE TEMP TABLE stale_runs (run_digest VARCHAR)")
        con.execute(
            """CREATE TEMP TABLE dropped_runs (run_digest VARCHAR, series_key BIGINT,
               superseded_by VARCHAR, retracted_in_source BOOLEAN, filename VARCHAR)"""
        )
        return 0
    in_reprocessed = "snapshot_digest IN (SELECT snapshot_digest FROM reprocessed)"
    con.execute(
        f"""CREATE TEMP TABLE touched_runs AS
            SELECT run_digest FROM old_live WHERE {in_reprocessed}
            UNION SELECT run_digest FROM old_lineage_files WHERE {in_reprocessed}
            UNION SELECT run_digest FROM new_lineage WHERE {in_reprocessed}
            UNION SELECT run_digest FROM candidate_runs WHERE {in_reprocessed}"""
    )
    stored = (
        "run_digest, series_key, snapshot_digest, parser_version, superseded_by, "
        "retracted_in_source"
    )
    settled = (
        f"""SELECT {stored}, filename FROM read_parquet(
                [{", ".join(sql_string(p) for p in settled_paths)}], filename = true)
            WHERE {in_reprocessed}
               OR run_digest IN (SELECT run_digest FROM touched_runs)"""
        if settled_paths and scalar(con, "SELECT count(*) FROM touched_runs")
        else f"SELECT {stored}, NULL::VARCHAR AS filename FROM old_live WHERE false"
    )
    con.execute(
        f"""CREATE TEMP TABLE stored_touched AS
            SELECT {stored}, NULL::VARCHAR AS filename FROM old_live
            WHERE run_digest IN (SELECT run_digest FROM touched_runs)
            UNION ALL {settled}"""
    )
    lineage = "run_digest, snapshot_digest, parser_version"
    con.execute(
        f"""CREATE TEMP TABLE stale_runs AS
            WITH touched AS (
                SELECT run_digest FROM touched_runs
                UNION SELECT run_digest FROM stored_touched
            ), held AS (
                SELECT {lineage} FROM stored_touched
                UNION ALL SELECT {lineage} FROM old_lineage_files
                UNION ALL SELECT {lineage} FROM new_lineage
                UNION ALL SELECT {lineage} FROM candidate_runs
            )
            SELECT run_digest FROM touched
            EXCEPT SELECT h.run_digest FROM held h
            SEMI JOIN touched t ON t.run_digest = h.run_digest
            SEMI JOIN current_sets c
              ON c.snapshot_digest = h.snapshot_digest
             AND c.parser_version = h.parser_version"""
    )
    con.execute(
        """CREATE TEMP TABLE dropped_runs AS
           SELECT run_digest, series_key, superseded_by, retracted_in_source, filename
           FROM stored_touched WHERE run_digest IN (SELECT run_digest FROM stale_runs)"""
    )
    return scalar(con, "SELECT count(*) FROM dropped_runs")


def current_run_keys(layout: IndexLayout, local: dict[str, list[str]]) -> dict[str, str]:
    """Each run_segments file's local path -> its object key."""
    cache = str(layout.cache_dir) + "/"
    return {path: path.removeprefix(cache) for path in local.get("run_segments", [])}


def scalar(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    row = con.execute(sql).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def write_runs_file(
    con: duckdb.DuckDBPyConnection,
    layout: IndexLayout,
    rows: str,
    field_ids: str,
    *,
    ordered: bool,
) -> Path | None:
    """The rows as a new run_segments file, its columns carrying the table's `field_ids`
    (`ordered`: in the table's sort order), or None if none. Settled rows keep their record
    sets' order: sorting a million runs with their manifests would cost more than writing
    them."""
    if not scalar(con, f"SELECT count(*) FROM {rows}"):
        return None
    columns = ", ".join(
        f'CAST("{c.name}" AS {DUCKDB_TYPES[c.type]}) AS "{c.name}"' for c in RUN_SEGMENT_SCHEMA
    )
    order = f" ORDER BY {', '.join(RUN_SORT_COLUMNS)}" if ordered else ""
    layout.cache_dir.mkdir(parents=True, exist_ok=True)
    path = layout.cache_dir / f".new-run_segments-{secrets.token_hex(8)}.parquet"
    con.execute(
        f"COPY (SELECT {columns} FROM {rows}{order}) "
        f"TO {sql_string(str(path))} "
        f"(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE {RUN_ROW_GROUP_ROWS}, "
        f"FIELD_IDS {field_ids})"
    )
    return path


def replace_run_files(
    catalog: IndexCatalog, layout: IndexLayout, paths: list[Path], deleted: list[str]
) -> None:
    """Upload the new run files, and in one commit add them and drop those they replace; then
    compact the settled files."""
    locations = []
    for path in paths:
        location = catalog.upload("run_segments", path)
        cache_file(path, layout.cached_path(object_key(location, layout.bucket)))
        locations.append(location)
    if locations or deleted:
        catalog.replace_files("run_segments", deleted, locations)
    catalog.compact("run_segments")


def write_data_file(
    con: duckdb.DuckDBPyConnection,
    layout: IndexLayout,
    name: str,
    rows: str,
    seq: int,
    field_ids: str,
) -> Path | None:
    """The rows of the DuckDB relation `rows` as a new data file of the stored table `name`
    (its columns in the table's order, types and `field_ids`, each row with `seq`), or None
    when there are none. Written to a temporary file beside the local cache."""
    count = con.execute(f"SELECT count(*) FROM {rows}").fetchone()
    if not (count and count[0]):
        return None
    columns = ", ".join(
        f"{seq}::BIGINT AS {SEQ_COLUMN}"
        if column.name == SEQ_COLUMN
        else f'CAST("{column.name}" AS {DUCKDB_TYPES[column.type]}) AS "{column.name}"'
        for column in STORED_TABLES[name]
    )
    order = f" ORDER BY {ROW_ORDER[name]}" if name in ROW_ORDER else ""
    layout.cache_dir.mkdir(parents=True, exist_ok=True)
    path = layout.cache_dir / f".new-{name}-{secrets.token_hex(8)}.parquet"
    con.execute(
        f"COPY (SELECT {columns} FROM {rows}{order}) TO {sql_string(str(path))} "
        f"(FORMAT parquet, COMPRESSION zstd, FIELD_IDS {field_ids})"
    )
    return path


def table_files(paths: Sequence[str], name: str, schema: Schema) -> bool:
    """Whether these Parquet files (local copies) have the columns of the stored table `name`,
    in its types, each with the field ID of the table's `schema`: Iceberg would read a
    millisecond timestamp as microseconds, and no table takes a file without field IDs (record
    sets written by an older kindex)."""
    expected = STORED_TABLES[name]
    for path in paths:
        found = pq.read_schema(path)
        if unidentified_columns(found, schema) or not found.remove_metadata().equals(
            expected, check_metadata=False
        ):
            return False
    return True


def add_and_compact(catalog: IndexCatalog, name: str, locations: list[str]) -> None:
    catalog.add_files(name, locations)
    catalog.compact(name)


def commit_data_file(catalog: IndexCatalog, layout: IndexLayout, name: str, path: Path) -> None:
    """Add a data file written by write_data_file to its table, keep it in the local cache
    under its object key (the version's database reads it there), and compact the table."""
    location = catalog.upload(name, path)
    cache_file(path, layout.cached_path(object_key(location, layout.bucket)))
    add_and_compact(catalog, name, [location])


def add_new_records(
    con: duckdb.DuckDBPyConnection,
    name: str,
    digest_column: str,
    objects: RecordObjects,
    schema: pa.Schema,
    several: bool,
) -> tuple[int, bool]:
    """new_<name>: the records of the pending sets the index lacks, once each (with the key
    where they were first seen, when the schema has a column for it). Known digests are found
    by probing the (large) old segments with the (small) candidate set, so the cost follows the
    new rows. `objects`: the pending sets'; `several`: whether they are of more than one set.
    Returns how many are new, and whether they are every record of the one pending set."""
    keyed = "source_key" in schema.names
    stored = schema.remove(schema.get_field_index("source_key")) if keyed else schema
    columns = ", ".join(f"c.{f.name}" for f in stored) + (", f.source_key" if keyed else "")
    source = objects.select(name, stored)
    # A record set holds each digest once: with one set, nothing need be picked, and a view
    # reads only the columns each later step asks for (the last one writes them out).
    first_only = (
        f"""QUALIFY row_number() OVER (
                PARTITION BY c.{digest_column} ORDER BY f.first_seen, c.source_line) = 1"""
        if several
        else ""
    )
    con.execute(
        f"""CREATE TEMP {"TABLE" if several else "VIEW"} candidate_{name} AS
            SELECT {columns} FROM ({source}) c
            JOIN first_reads f USING (snapshot_digest) {first_only}"""
    )
    con.execute(
        f"""CREATE TEMP TABLE known_{name} AS
            SELECT o.{digest_column} FROM old_{name[:-1]}_segments o
            SEMI JOIN candidate_{name} c ON o.{digest_column} = c.{digest_column}"""
    )
    known = con.execute(f"SELECT count(*) FROM known_{name}").fetchone()
    if not (known and known[0]):  # the common case: no second copy of the candidates
        con.execute(f"CREATE TEMP VIEW new_{name} AS SELECT * FROM candidate_{name}")
    else:
        con.execute(
            f"""CREATE TEMP TABLE new_{name} AS SELECT * FROM candidate_{name}
                WHERE {digest_column} NOT IN (SELECT {digest_column} FROM known_{name})"""
        )
    row = con.execute(f"SELECT count(*) FROM new_{name}").fetchone()
    return (int(row[0]) if row else 0), not several and not (known and known[0])


def add_new_points(con: duckdb.DuckDBPyConnection, pending_runs: str) -> None:
    """new_points: the series_points rows (tables.SERIES_POINT_SCHEMA) of the runs the pending
    record sets measured: their new runs, and the stored runs a set holds of its own snapshot
    (first seen there: a file processed again, whose points the newer record set replaces).
    A run seen again in another file (an unchanged row of a later commit) is no new
    measurement, and no point. A point's time (regressions.POINT_TIME_SQL: the median, else
    the mean) is relative to its cohort's baseline in the same file: the lowest baseline rank
    (baseline_providers) among the file's runs of the cohort, whether new or not (its first
    run, as a point is the case's first run in a file).
    After RunChanges.find (new_runs, known_state)."""
    con.execute(baseline_providers_statement())
    axis = point_axis_sql("r", "f")
    cohort = (
        "snapshot_digest, parser_version, operation_digest, workload_digest, protocol_digest, "
        "environment_digest, metric, kernel"
    )
    columns = (
        "run_digest, snapshot_digest, parser_version, operation_digest, workload_digest, "
        "protocol_digest, environment_digest, metric, kernel, provider, mode, gpu, case_key, "
        f"{POINT_TIME_SQL.format(run='r')} AS median, observed_at, "
        f"{', '.join(VERSION_COLUMNS)}"
    )
    con.execute(
        f"""CREATE TEMP TABLE new_points AS
            WITH ranked AS (
                SELECT p.*, b.rank AS baseline_rank, count(*) OVER (PARTITION BY {cohort}) AS runs
                FROM (SELECT {columns} FROM ({pending_runs}) r
                      WHERE {POINT_TIME_SQL.format(run="r")} > 0) p
                LEFT JOIN baseline_providers b USING (provider)
            ), baselines AS (
                SELECT * FROM ranked WHERE baseline_rank IS NOT NULL
                QUALIFY row_number() OVER (
                    PARTITION BY {cohort} ORDER BY baseline_rank, observed_at, run_digest
                ) = 1
            ), measured AS (
                SELECT * FROM ranked SEMI JOIN (
                    SELECT run_digest, snapshot_digest FROM new_runs
                    UNION ALL SELECT run_digest, snapshot_digest FROM known_state
                ) m USING (run_digest, snapshot_digest)
            ), first_read AS (
                SELECT snapshot_digest,
                       arg_min(committed_at, {{'at': taken_at, 'id': read_id}}) AS committed_at,
                       min(taken_at) AS taken_at
                FROM reads GROUP BY snapshot_digest
            )
            SELECT * EXCLUDE (point_at),
                -- A kernel-level point's time: its file's earliest run of the version.
                min(point_at) OVER (PARTITION BY kernel, provider, mode, metric, gpu,
                                    snapshot_digest, parser_version, version) AS point_at
            FROM (
            SELECT r.kernel, r.provider, r.mode, r.metric, r.gpu, r.case_key,
                   {axis["version"]} AS version, {axis["version_axis"]} AS version_axis,
                   {axis["version_key"]} AS version_key, {axis["point_at"]} AS point_at,
                   r.observed_at,
                   -- A baseline is judged against itself only where nothing else ran beside it.
                   coalesce(b.run_digest = r.run_digest AND r.runs > 1, false) AS is_baseline,
                   CASE WHEN b.run_digest <> r.run_digest THEN b.provider END
                       AS baseline_provider,
                   r.median,
                   CASE WHEN b.run_digest <> r.run_digest THEN b.median END AS baseline_median,
                   ln(r.median) - CASE WHEN b.run_digest <> r.run_digest THEN ln(b.median)
                                       ELSE 0 END AS log_time,
                   ln(r.median) AS log_absolute,
                   r.run_digest,
                   CASE WHEN b.run_digest <> r.run_digest THEN b.run_digest END
                       AS baseline_run_digest,
                   r.snapshot_digest, r.parser_version
            FROM measured r
            LEFT JOIN baselines b USING ({cohort})
            LEFT JOIN first_read f USING (snapshot_digest)
            -- A file that measures a case twice (rope's two sweeps share a shape) gives it
            -- one point: its first run.
            QUALIFY row_number() OVER (
                PARTITION BY r.kernel, r.provider, r.mode, r.metric, r.gpu, r.case_key,
                    r.snapshot_digest, r.parser_version, version, is_baseline, baseline_provider
                ORDER BY r.observed_at, r.run_digest
            ) = 1
            )"""
    )


def add_new_lineage(con: duckdb.DuckDBPyConnection, lineage_is_new_runs: bool) -> None:
    """new_lineage_files: the pending lineage rows (new_lineage) that are not the row of a new
    run (new_runs). `lineage_is_new_runs`: the one pending set's lineage is its runs, all new:
    there are none, and nothing need be joined."""
    if lineage_is_new_runs:
        select = empty_select(STORED_TABLES["lineage_files"])
    else:
        columns = ", ".join(STORED_TABLES["lineage_files"].names)
        select = (
            f"SELECT l.* FROM new_lineage l ANTI JOIN (SELECT {columns} FROM new_runs) r "
            f"USING ({columns})"
        )
    con.execute(f"CREATE TEMP VIEW new_lineage_files AS {select}")


def recompute_run_state(con: duckdb.DuckDBPyConnection, new_snapshots: set[str]) -> None:
    """run_state_changes: the state each run the new work can change gets, where it differs
    from its stored one; heads: whether each run of a touched series is its Liger version's
    newest. `new_snapshots`: the snapshots of the record sets being added (their lineage:
    new_lineage). The runs looked at are known_state's (the live rows, and the settled ones of
    late series: RunChanges.find) and the new ones: no other stored run can change.

    Supersession: within a series, a run is superseded by the earliest run (lowest digest on a
    tie) observed strictly later. Retraction: a run not superseded and held by no key's newest
    read's current record set (newest as pipelines/index/reads.py orders reads: by commit time
    where a version carries one, else by LastModified; then read time). A key that returns to
    bytes it held before is read again, so its newest read is what it holds now."""
    con.execute(
        """CREATE TEMP TABLE old_series_runs AS
           SELECT run_digest, series_key, observed_at, liger_version, snapshot_digest,
                  parser_version
           FROM known_state
           WHERE series_key IN (SELECT series_key FROM new_runs
                                UNION SELECT series_key FROM dropped_runs)"""
    )
    con.execute(
        """CREATE TEMP VIEW series_runs AS SELECT * FROM old_series_runs
           UNION ALL SELECT run_digest, series_key, observed_at, liger_version, snapshot_digest,
                            parser_version
           FROM new_runs"""
    )
    # Each Liger version's newest run of a series (version_changes reads only those).
    con.execute(
        """CREATE TEMP TABLE heads AS
           SELECT run_digest, liger_version IS NOT NULL AND row_number() OVER (
                      PARTITION BY series_key, liger_version
                      ORDER BY observed_at DESC, run_digest) = 1 AS head_of_version
           FROM series_runs"""
    )
    # Only a series observed at two times or more has a superseded run (min and max skip
    # NULLs, as count(DISTINCT) does, and cost no hash set per series).
    con.execute(
        """CREATE TEMP TABLE successors AS
           WITH several AS (
               SELECT * FROM series_runs WHERE series_key IN (
                   SELECT series_key FROM series_runs GROUP BY series_key
                   HAVING min(observed_at) < max(observed_at))
           ), times AS (
               SELECT series_key, observed_at,
                      lead(observed_at) OVER (
                          PARTITION BY series_key ORDER BY observed_at) AS next_at
               FROM (SELECT DISTINCT series_key, observed_at FROM several
                     WHERE observed_at IS NOT NULL)
           ), firsts AS (
               SELECT series_key, observed_at, min(run_digest) AS digest
               FROM several GROUP BY series_key, observed_at
           )
           SELECT s.run_digest, f.digest AS superseded_by
           FROM several s
           JOIN times t ON t.series_key = s.series_key AND t.observed_at = s.observed_at
           JOIN firsts f ON f.series_key = s.series_key AND f.observed_at = t.next_at"""
    )
    con.execute(
        "CREATE TEMP TABLE newest AS SELECT source_key, "
        f"arg_max(snapshot_digest, {NEWEST_ORDER_SQL}) AS snapshot_digest "
        "FROM reads GROUP BY source_key"
    )
    # What the newest reads hold: their snapshots' current record sets (a snapshot processed
    # again no longer holds what only its older record set did).
    con.execute(
        """CREATE TEMP TABLE newest_sets AS SELECT DISTINCT snapshot_digest, parser_version
           FROM newest JOIN current_sets USING (snapshot_digest)"""
    )
    con.execute(
        "CREATE TEMP TABLE touched AS SELECT DISTINCT snapshot_digest FROM reads "
        "WHERE source_key IN (SELECT source_key FROM new_reads_arrow)"
    )
    touched = [r[0] for r in con.execute("SELECT snapshot_digest FROM touched").fetchall()]
    # The lineage of the runs looked at: a stored run's own row, the other rows of it that
    # lineage_files holds, and the new ones. A settled run outside a late series is superseded
    # and stays so whatever holds it: it is left out.
    con.execute(
        """CREATE TEMP TABLE old_other_lineage AS
           SELECT l.run_digest, l.snapshot_digest, l.parser_version FROM old_lineage_files l
           SEMI JOIN (SELECT run_digest FROM known_state
                      UNION ALL SELECT run_digest FROM new_runs) k
             ON k.run_digest = l.run_digest"""
    )
    con.execute(
        """CREATE TEMP VIEW all_lineage AS
           SELECT run_digest, snapshot_digest, parser_version FROM known_state
           UNION ALL SELECT run_digest, snapshot_digest, parser_version FROM old_other_lineage
           UNION ALL SELECT n.run_digest, n.snapshot_digest, n.parser_version FROM new_lineage n
           SEMI JOIN (SELECT run_digest FROM known_state
                      UNION ALL SELECT run_digest FROM new_runs) k
             ON k.run_digest = n.run_digest"""
    )
    con.execute(
        """CREATE TEMP VIEW candidate_rows AS
           SELECT run_digest, true AS in_series, snapshot_digest, parser_version FROM series_runs
           UNION ALL SELECT run_digest, false, snapshot_digest, parser_version FROM all_lineage
           WHERE snapshot_digest IN (SELECT snapshot_digest FROM touched)"""
    )
    # The candidates whose state may change or be set: superseded in their series, held by
    # a snapshot that is no key's newest read, or with a state already. Any other candidate is
    # held, superseded by nothing and without a state, and stays so: it is left out before
    # grouping. Where small tables tell that every candidate is held and none has a state (a
    # first ingest of a million runs), the superseded ones are all there is to look at.
    con.execute(
        """CREATE TEMP TABLE had_state AS
           SELECT DISTINCT c.run_digest FROM candidate_rows c
           SEMI JOIN old_run_state o ON o.run_digest = c.run_digest"""
    )
    if not scalar(con, "SELECT count(*) FROM reprocessed") and _all_held_and_stateless(
        con, [*touched, *new_snapshots]
    ):
        con.execute(
            "CREATE TEMP TABLE candidates AS "
            "SELECT DISTINCT run_digest, true AS in_series, true AS held FROM successors"
        )
    else:
        _create_candidates(con)
    # A run of a snapshot that is some key's newest read is held; only the other candidates
    # are looked up in the newest snapshots' lineage.
    unsure = con.execute("SELECT count(*) FROM candidates WHERE NOT held").fetchone()
    newest_lineage = (
        "SELECT run_digest FROM all_lineage l SEMI JOIN newest_sets n "
        "ON n.snapshot_digest = l.snapshot_digest AND n.parser_version = l.parser_version"
        if unsure and unsure[0]
        else "SELECT NULL::VARCHAR AS run_digest WHERE false"
    )
    con.execute(
        f"""CREATE TEMP TABLE held_elsewhere AS
            SELECT DISTINCT l.run_digest FROM ({newest_lineage}) l
            SEMI JOIN candidates c ON c.run_digest = l.run_digest AND NOT c.held"""
    )
    con.execute(
        """CREATE TEMP TABLE changed_state AS
           SELECT c.run_digest,
                  CASE WHEN c.in_series THEN s.superseded_by
                       ELSE o.superseded_by END AS superseded_by,
                  c.held OR h.run_digest IS NOT NULL AS held
           FROM candidates c
           LEFT JOIN (SELECT DISTINCT run_digest, superseded_by FROM successors) s
             ON s.run_digest = c.run_digest
           LEFT JOIN old_run_state o ON o.run_digest = c.run_digest
           LEFT JOIN held_elsewhere h ON h.run_digest = c.run_digest"""
    )
    # What this version changes: every candidate whose new state differs from its old one (a
    # run whose state is cleared gets a row that says so).
    con.execute(
        """CREATE TEMP TABLE run_state_changes AS
           SELECT c.run_digest, c.superseded_by,
                  c.superseded_by IS NULL AND NOT c.held AS retracted_in_source
           FROM changed_state c LEFT JOIN old_run_state o USING (run_digest)
           WHERE c.superseded_by IS DISTINCT FROM o.superseded_by
              OR (c.superseded_by IS NULL AND NOT c.held)
                 IS DISTINCT FROM coalesce(o.retracted_in_source, false)"""
    )


def _all_held_and_stateless(con: duckdb.DuckDBPyConnection, snapshots: list[str]) -> bool:
    """Whether no candidate has a state and every snapshot that holds one is some key's newest
    read. `snapshots`: those of the new runs and of the lineage read; the old runs' are in
    old_series_runs."""
    # An Arrow column, not a list parameter: DuckDB converts a Python list value by value, and
    # tries to import pandas for each.
    con.register(
        "listed_snapshots", pa.table({"snapshot_digest": pa.array(snapshots, pa.string())})
    )
    row = con.execute(
        """SELECT (SELECT count(*) FROM had_state)
                  + (SELECT count(*) FROM (
                         SELECT snapshot_digest FROM old_series_runs
                         UNION SELECT snapshot_digest FROM listed_snapshots
                     ) WHERE snapshot_digest NOT IN (SELECT snapshot_digest FROM newest))"""
    ).fetchone()
    con.unregister("listed_snapshots")
    return row is not None and row[0] == 0


def _create_candidates(con: duckdb.DuckDBPyConnection) -> None:
    """The candidates worth a look, once each, with whether one is in a series and held."""
    con.execute(
        """CREATE TEMP TABLE candidates AS
           WITH rows AS (
               SELECT c.run_digest, c.in_series, n.snapshot_digest IS NOT NULL AS held
               FROM candidate_rows c LEFT JOIN newest_sets n
                 ON n.snapshot_digest = c.snapshot_digest
                AND n.parser_version = c.parser_version
           ), worth AS (
               SELECT run_digest FROM successors
               UNION SELECT run_digest FROM rows WHERE NOT held
               UNION SELECT run_digest FROM had_state
           )
           SELECT run_digest, bool_or(in_series) AS in_series, bool_or(held) AS held
           FROM rows c SEMI JOIN worth w ON w.run_digest = c.run_digest
           GROUP BY run_digest"""
    )


def index_counts(
    con: duckdb.DuckDBPyConnection,
    current: Version,
    new_runs: int,
    new_manifests: int,
    pending: Sequence[RecordSet],
) -> dict[str, int]:
    old = current.counts

    def scalar(sql: str) -> int:
        row = con.execute(sql).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    return {
        "runs": int(old.get("runs", 0)) + new_runs,
        "manifests": int(old.get("manifests", 0)) + new_manifests,
        "snapshots": scalar("SELECT count(DISTINCT snapshot_digest) FROM reads"),
        "reads": scalar("SELECT count(*) FROM reads"),
        "quarantine": int(old.get("quarantine", 0))
        + sum(int(rs.summary.get("quarantined", 0)) for rs in pending),
        "lineage": int(old.get("lineage", 0))
        + sum(int(rs.summary.get("lineage", 0)) for rs in pending),
        # What this version changed of the runs it looked at, added to the counts before.
        "superseded": int(old.get("superseded", 0))
        + scalar(
            "SELECT count(*) FILTER (WHERE superseded_by IS NOT NULL)"
            " - count(*) FILTER (WHERE old_superseded_by IS NOT NULL) FROM final_state"
        )
        - scalar("SELECT count(*) FROM dropped_runs WHERE superseded_by IS NOT NULL"),
        "retracted": int(old.get("retracted", 0))
        + scalar(
            "SELECT count(*) FILTER (WHERE retracted_in_source)"
            " - count(*) FILTER (WHERE old_retracted) FROM final_state"
        )
        - scalar("SELECT count(*) FROM dropped_runs WHERE retracted_in_source"),
    }
