"""Publishing the index atomically, with cost that follows the new work.

A published version is a small JSON manifest, `index/v/<version>/manifest.json`, naming for each
table the Parquet files that make it. `index/CURRENT` names the current version; replacing that
one object is the commit, so a reader sees the old index or the new one, never a mix. Files are
never rewritten or deleted, so every file a manifest names stays readable.

What a publish writes, given the record sets (see record_objects.py) not yet in the index:
- a run segment and a manifest segment: the runs and manifests those record sets bring that the
  index does not hold yet (each distinct record once). When one record set brings only new runs
  (manifests), its own runs (manifests) objects are the segment and nothing is rewritten; where a
  record was first seen is its snapshot's first read, which the `runs` and `manifests` views
  join in;
- `run_state`: superseded_by and retracted_in_source of every run that has either. Only the
  series (kernel, provider, mode, metric, GPU, case) the new runs belong to, and the runs of the
  keys that were read again, are recomputed; the rest is carried over;
- `snapshots`: one row per object version read (small).
Lineage and quarantine are the record objects themselves, named by the manifest.
"""

from __future__ import annotations

import fcntl
import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from pipelines.index.faults import INDEX_FILES_WRITTEN, pause_point
from pipelines.index.layout import IndexLayout, snapshot_hex
from pipelines.index.local import empty_manifest, fetch, install_local, load_current, put_file
from pipelines.index.reads import NEWEST_ORDER_SQL, ObjectRead
from pipelines.index.record_objects import SUMMARY_FILE
from pipelines.index.tables import (
    FILE_TABLES,
    MANIFEST_FORMAT,
    MANIFEST_SEGMENT_SCHEMA,
    RUN_SEGMENT_SCHEMA,
    SNAPSHOT_SCHEMA,
    parquet_select,
)
from pipelines.storage.base import ObjectStore


@dataclass(frozen=True, slots=True)
class RecordSet:
    prefix: str  # records/<parser_version>/<snapshot hex>/
    summary: dict[str, Any]

    @property
    def snapshot_digest(self) -> str:
        return str(self.summary["snapshot_digest"])

    def file_keys(self, name: str) -> list[str]:
        """The objects of one of its tables: one, or the parts a relay's workers wrote."""
        names = self.summary.get("files", {}).get(name, [f"{name}.parquet"])
        return [self.prefix + object_name for object_name in names]


@dataclass(slots=True)
class IndexVersion:
    """The index as published after a `publish_index` call."""

    version: str | None
    parent: str | None
    published: bool  # False when there was nothing new: the current version stands
    counts: dict[str, int] = field(default_factory=dict)
    new_runs: int = 0
    new_reads: int = 0
    manifest_key: str | None = None


def new_version_id() -> str:
    """Sortable by time; unique across concurrent writers."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ") + "-" + secrets.token_hex(3)


@contextmanager
def writer_lock(layout: IndexLayout) -> Iterator[None]:
    """One index writer per kindex home (Dagster adds a pool of 1 across processes)."""
    layout.home.mkdir(parents=True, exist_ok=True)
    with open(layout.writer_lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def list_record_sets(
    store: ObjectStore, layout: IndexLayout
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Complete record sets (prefix -> summary key) and read objects (prefix -> keys)."""
    summaries: dict[str, str] = {}
    reads: dict[str, list[str]] = {}
    for info in store.list(layout.records_prefix):
        key = info.key
        if key.endswith("/" + SUMMARY_FILE):
            summaries[key.removesuffix(SUMMARY_FILE)] = key
        elif "/reads/" in key and key.endswith(".json"):
            reads.setdefault(key.rsplit("reads/", 1)[0], []).append(key)
    return summaries, reads


def unpublished_record_sets(store: ObjectStore, settings: Any) -> list[str]:
    """Prefixes of complete record sets (summary and read written) the current index lacks, and
    of read objects it has not folded in: what the next publish would add."""
    layout = IndexLayout.of(settings)
    current = load_current(store, layout)
    summaries, read_keys = list_record_sets(store, layout)
    included_sets, included_reads = set(current["record_sets"]), set(current["reads"])
    return sorted(
        prefix
        for prefix, keys in read_keys.items()
        if prefix in summaries
        and (prefix not in included_sets or any(k not in included_reads for k in keys))
    )


def publish_index(store: ObjectStore, settings: Any) -> IndexVersion:
    """Fold every complete record set not yet indexed into a new version and publish it."""
    layout = IndexLayout.of(settings)
    with writer_lock(layout):
        current = load_current(store, layout)
        if current.get("format") != MANIFEST_FORMAT:  # an older layout: rebuilt from the sets
            current = empty_manifest()
        summaries, read_keys = list_record_sets(store, layout)
        included_sets = set(current["record_sets"])
        included_reads = set(current["reads"])
        # A record set counts once it has a read too: a process killed between the summary and
        # the read object leaves a set whose runs have no source key yet (its rerun adds it).
        pending_sets = [
            RecordSet(prefix, orjson.loads(store.get_bytes(key)))
            for prefix, key in sorted(summaries.items())
            if prefix not in included_sets and prefix in read_keys
        ]
        pending_read_keys = sorted(
            key
            for prefix, keys in read_keys.items()
            if prefix in summaries
            for key in keys
            if key not in included_reads
        )
        if not pending_sets and not pending_read_keys:
            install_local(store, layout, current)
            return version_result(current, published=False)
        reads = [ObjectRead.from_json(store.get_bytes(k)) for k in pending_read_keys]
        summaries_by_prefix = {rs.prefix: rs.summary for rs in pending_sets}
        for prefix in {
            k.rsplit("reads/", 1)[0] for k in pending_read_keys
        } - summaries_by_prefix.keys():
            summaries_by_prefix[prefix] = orjson.loads(store.get_bytes(summaries[prefix]))
        version = new_version_id()
        manifest = build_version(
            store, layout, current, pending_sets, reads, summaries_by_prefix, version
        )
        manifest["reads"] = sorted(included_reads | set(pending_read_keys))
        manifest_key = layout.manifest_key(version)
        store.put(manifest_key, orjson.dumps(manifest), content_type="application/json")
        pause_point(INDEX_FILES_WRITTEN)
        pointer = {"version": version, "manifest": manifest_key}
        store.put(layout.pointer_key, orjson.dumps(pointer), content_type="application/json")
        install_local(store, layout, manifest)
        return version_result(manifest, published=True)


def version_result(manifest: dict[str, Any], *, published: bool) -> IndexVersion:
    counts = dict(manifest.get("counts", {}))
    return IndexVersion(
        version=manifest.get("version"),
        parent=manifest.get("parent"),
        published=published,
        counts=counts,
        new_runs=int(manifest.get("new", {}).get("runs", 0)) if published else 0,
        new_reads=int(manifest.get("new", {}).get("reads", 0)) if published else 0,
        manifest_key=manifest.get("manifest_key"),
    )


def reads_table(
    reads: Sequence[ObjectRead], summaries: dict[str, dict[str, Any]], layout: IndexLayout
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
    current: dict[str, Any],
    pending: list[RecordSet],
    reads: list[ObjectRead],
    summaries: dict[str, dict[str, Any]],
    version: str,
) -> dict[str, Any]:
    """Compute the new version's files from the current one plus the pending record sets,
    upload them, and return its manifest (not yet pointed to)."""
    old = current["files"]
    local = {name: [str(fetch(store, layout, k)) for k in keys] for name, keys in old.items()}
    new_files = {
        name: [str(fetch(store, layout, key)) for rs in pending for key in rs.file_keys(name)]
        for name in ("runs", "manifests")
    }
    con = duckdb.connect()
    for name, schema in FILE_TABLES.items():
        con.execute(f"CREATE VIEW old_{name} AS {parquet_select(local.get(name, []), schema)}")
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
    several = len(pending) > 1
    new_runs, runs_whole = add_new_records(
        con, "runs", "run_digest", new_files["runs"], RUN_SEGMENT_SCHEMA, several
    )
    new_manifests, manifests_whole = add_new_records(
        con, "manifests", "digest", new_files["manifests"], MANIFEST_SEGMENT_SCHEMA, several
    )
    lineage_by_snapshot = lineage_files_by_snapshot(old.get("lineage_files", []), pending, layout)
    # The lineage of a set whose runs are all new holds only those runs, which are candidates
    # already: it need not be read again.
    new_only = set(pending[0].file_keys("lineage")) if runs_whole and new_runs else set()
    new_snapshots = {rs.snapshot_digest for rs in pending}
    recompute_run_state(con, lineage_by_snapshot, store, layout, new_only, new_snapshots)

    prefix = layout.version_prefix(version)
    files: dict[str, list[str]] = {
        "run_segments": list(old.get("run_segments", [])),
        "manifest_segments": list(old.get("manifest_segments", [])),
        "lineage_files": list(old.get("lineage_files", []))
        + [key for rs in pending for key in rs.file_keys("lineage")],
        "quarantine_files": list(old.get("quarantine_files", []))
        + [key for rs in pending for key in rs.file_keys("quarantine")],
    }
    # One record set whose runs (manifests) are all new: its files are the segment.
    if runs_whole and new_runs:
        files["run_segments"] += pending[0].file_keys("runs")
    if manifests_whole and new_manifests:
        files["manifest_segments"] += pending[0].file_keys("manifests")
    outputs = {
        "run_segments": ("new_runs", 0 if runs_whole else new_runs, "series_key, observed_at"),
        "manifest_segments": (
            "new_manifests",
            0 if manifests_whole else new_manifests,
            "kind, digest",
        ),
        "run_state": ("run_state", None, "run_digest"),
        "snapshots": ("reads", None, "taken_at, read_id"),
    }
    for name, (table, rows, order) in outputs.items():
        if rows == 0:
            continue
        key = f"{prefix}{name}.parquet"
        path = layout.cached_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        con.execute(
            f"COPY (SELECT * FROM {table} ORDER BY {order}) TO '{path}' "
            "(FORMAT parquet, COMPRESSION zstd)"
        )
        put_file(store, key, path)
        if name in ("run_state", "snapshots"):
            files[name] = [key]
        else:
            files[name].append(key)
    counts = index_counts(con, current, new_runs, new_manifests, pending)
    con.close()
    return {
        "format": MANIFEST_FORMAT,
        "version": version,
        "parent": current.get("version"),
        "published_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "manifest_key": layout.manifest_key(version),
        "record_sets": sorted(set(current["record_sets"]) | {rs.prefix for rs in pending}),
        "files": files,
        "counts": counts,
        "new": {"runs": new_runs, "manifests": new_manifests, "reads": len(reads)},
    }


def add_new_records(
    con: duckdb.DuckDBPyConnection,
    name: str,
    digest_column: str,
    files: Sequence[str],
    schema: pa.Schema,
    several: bool,
) -> tuple[int, bool]:
    """new_<name>: the records of the pending sets the index lacks, once each (with the key
    where they were first seen, when the schema has a column for it). Known digests are found
    by probing the (large) old segments with the (small) candidate set, so the cost follows the
    new rows. `files`: the pending sets' files; `several`: whether they are of more than one set.
    Returns how many are new, and whether they are all of the one pending set: then its files
    can be segments as they are."""
    keyed = "source_key" in schema.names
    stored = schema.remove(schema.get_field_index("source_key")) if keyed else schema
    columns = ", ".join(f"c.{f.name}" for f in stored) + (", f.source_key" if keyed else "")
    source = parquet_select(files, stored)
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
    all_new = not (known and known[0])
    if all_new:  # the common case: no second copy of the candidates
        con.execute(f"CREATE TEMP VIEW new_{name} AS SELECT * FROM candidate_{name}")
    else:
        con.execute(
            f"""CREATE TEMP TABLE new_{name} AS SELECT * FROM candidate_{name}
                WHERE {digest_column} NOT IN (SELECT {digest_column} FROM known_{name})"""
        )
    row = con.execute(f"SELECT count(*) FROM new_{name}").fetchone()
    return (int(row[0]) if row else 0), all_new and not several


def lineage_files_by_snapshot(
    old_files: Sequence[str], pending: Sequence[RecordSet], layout: IndexLayout
) -> dict[str, list[str]]:
    """snapshot hex -> lineage object keys (one per parser version that processed it)."""
    result: dict[str, list[str]] = {}
    for key in list(old_files) + [k for rs in pending for k in rs.file_keys("lineage")]:
        hex_digest = key.rsplit("/", 2)[-2]
        result.setdefault(hex_digest, []).append(key)
    return result


def recompute_run_state(
    con: duckdb.DuckDBPyConnection,
    lineage_by_snapshot: dict[str, list[str]],
    store: ObjectStore,
    layout: IndexLayout,
    new_only: set[str],
    new_snapshots: set[str],
) -> None:
    """run_state for the new version: the old one, with the runs the new work can change redone.
    `new_only`: lineage objects that hold only new runs (left out of the keys read again).
    `new_snapshots`: the snapshots of the record sets being added.

    Supersession: within a series, a run is superseded by the earliest run (lowest digest on a
    tie) observed strictly later. Retraction: a run not superseded and held by no key's newest
    read (newest as pipelines/index/reads.py orders reads: by commit time where a version
    carries one, else by LastModified; then read time). A key that returns to bytes it held
    before is read again, so its newest read is what it holds now."""
    # The old runs of the new runs' series are probed once; the new runs stay where they are
    # (their record set's Parquet, or a temporary table), read again column by column.
    con.execute(
        """CREATE TEMP TABLE old_series_runs AS
           SELECT run_digest, series_key, observed_at, snapshot_digest FROM old_run_segments
           WHERE series_key IN (SELECT DISTINCT series_key FROM new_runs)"""
    )
    con.execute(
        """CREATE TEMP VIEW series_runs AS SELECT * FROM old_series_runs
           UNION ALL SELECT run_digest, series_key, observed_at, snapshot_digest FROM new_runs"""
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
    touched = [
        r[0]
        for r in con.execute(
            "SELECT DISTINCT snapshot_digest FROM reads WHERE source_key IN "
            "(SELECT source_key FROM new_reads_arrow)"
        ).fetchall()
    ]
    newest = [r[0] for r in con.execute("SELECT DISTINCT snapshot_digest FROM newest").fetchall()]

    def lineage_paths(digests: Sequence[str], leave_out: set[str] | None = None) -> list[str]:
        keys = [k for d in digests for k in lineage_by_snapshot.get(snapshot_hex(d), [])]
        return [str(fetch(store, layout, k)) for k in keys if k not in (leave_out or ())]

    lineage = FILE_TABLES["lineage_files"]
    touched_lineage = parquet_select(lineage_paths(touched, new_only), lineage)
    con.execute(
        f"""CREATE TEMP VIEW candidate_rows AS
            SELECT run_digest, true AS in_series, snapshot_digest FROM series_runs
            UNION ALL SELECT run_digest, false, snapshot_digest FROM ({touched_lineage})"""
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
    if _all_held_and_stateless(con, [*touched, *new_snapshots]):
        con.execute(
            "CREATE TEMP TABLE candidates AS "
            "SELECT DISTINCT run_digest, true AS in_series, true AS held FROM successors"
        )
    else:
        _create_candidates(con)
    # A run of a snapshot that is some key's newest read is held; only the other candidates
    # are looked up in the newest snapshots' lineage.
    unsure = con.execute("SELECT count(*) FROM candidates WHERE NOT held").fetchone()
    newest_lineage = parquet_select(lineage_paths(newest) if unsure and unsure[0] else [], lineage)
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
    con.execute(
        """CREATE TEMP TABLE run_state AS
           SELECT * FROM old_run_state
           WHERE run_digest NOT IN (SELECT run_digest FROM had_state)
           UNION ALL
           SELECT run_digest, superseded_by,
                  superseded_by IS NULL AND NOT held AS retracted_in_source
           FROM changed_state WHERE superseded_by IS NOT NULL OR NOT held"""
    )


def _all_held_and_stateless(con: duckdb.DuckDBPyConnection, snapshots: list[str]) -> bool:
    """Whether no candidate has a state and every snapshot that holds one is some key's newest
    read. `snapshots`: those of the new runs and of the lineage read; the old runs' are in
    old_series_runs."""
    row = con.execute(
        """SELECT (SELECT count(*) FROM had_state)
                  + (SELECT count(*) FROM (
                         SELECT snapshot_digest FROM old_series_runs
                         UNION SELECT unnest($snapshots::VARCHAR[])
                     ) WHERE snapshot_digest NOT IN (SELECT snapshot_digest FROM newest))""",
        {"snapshots": snapshots},
    ).fetchone()
    return row is not None and row[0] == 0


def _create_candidates(con: duckdb.DuckDBPyConnection) -> None:
    """The candidates worth a look, once each, with whether one is in a series and held."""
    con.execute(
        """CREATE TEMP TABLE candidates AS
           WITH worth AS (
               SELECT run_digest FROM successors
               UNION SELECT run_digest FROM candidate_rows
                     WHERE snapshot_digest NOT IN (SELECT snapshot_digest FROM newest)
               UNION SELECT run_digest FROM had_state
           )
           SELECT run_digest, bool_or(in_series) AS in_series,
                  bool_or(snapshot_digest IN (SELECT snapshot_digest FROM newest)) AS held
           FROM candidate_rows c SEMI JOIN worth w ON w.run_digest = c.run_digest
           GROUP BY run_digest"""
    )


def index_counts(
    con: duckdb.DuckDBPyConnection,
    current: dict[str, Any],
    new_runs: int,
    new_manifests: int,
    pending: Sequence[RecordSet],
) -> dict[str, int]:
    old = current.get("counts", {})

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
        "superseded": scalar("SELECT count(*) FROM run_state WHERE superseded_by IS NOT NULL"),
        "retracted": scalar("SELECT count(*) FROM run_state WHERE retracted_in_source"),
    }
