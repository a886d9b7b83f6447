"""Which manifests the index already holds: for bundles that name manifests they do not carry (a
worker uploading runs of an operation published earlier), and for files that name a manifest
another file carries (a FlashInfer trace names its definition).

"Holds" means: in the current published version, or in a complete record set written but not yet
published (an earlier file of the same `kindex ingest`, or of the same sensor tick). The lookup is
lazy: a Liger CSV never asks, and a bundle that carries everything it names asks nothing of the
index, so neither pays for listing the record sets.
"""

from __future__ import annotations

import duckdb
import orjson
import pyarrow as pa

from pipelines.index.catalog import IndexCatalog
from pipelines.index.layout import IndexLayout
from pipelines.index.local import fetch, fetch_all, load_current
from pipelines.index.publish import RecordObjects, additions
from pipelines.index.tables import (
    CURRENT_RECORD_SET,
    MANIFEST_SEGMENT_SCHEMA,
    SNAPSHOT_SCHEMA,
    parquet_select,
)
from pipelines.records.manifests import ManifestJson
from pipelines.records.record_objects import MANIFEST_SCHEMA, QUARANTINE_SCHEMA
from pipelines.settings import Settings
from pipelines.storage.base import ObjectStore


class KnownManifests:
    """`known(digest) -> bool` over the index's manifests, and `named(kind, name)`: the manifest
    of that kind and name it holds. The files are listed on the first question."""

    def __init__(self, store: ObjectStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.layout = IndexLayout.of(settings)
        self._digests: frozenset[str] | None = None
        self._manifests: str | None = None  # a SELECT over every manifest file
        self._named: dict[tuple[str, str], ManifestJson | None] = {}
        # Manifests of record sets built since (the files before this one in a batch).
        self._learned: set[str] = set()
        # Their texts by (kind, name), parsed only when asked for: few are.
        self._learned_named: dict[tuple[str, str], str] = {}

    def learn(self, manifests: pa.Table) -> None:
        """Count these manifests (a record set's just built, not written yet) as known."""
        for digest, kind, name, manifest in zip(
            *(manifests.column(c).to_pylist() for c in ("digest", "kind", "name", "manifest")),
            strict=True,
        ):
            self._learned.add(digest)
            self._learned_named.setdefault((kind, name), manifest)

    def __call__(self, digest: str) -> bool:
        if digest in self._learned:
            return True
        if self._digests is None:
            self._digests = frozenset(
                self._texts(f"SELECT DISTINCT digest FROM ({self._select()})")
            )
        return digest in self._digests

    def named(self, kind: str, name: str) -> ManifestJson | None:
        if (kind, name) in self._learned_named:
            learned: ManifestJson = orjson.loads(self._learned_named[kind, name])
            return learned
        if (kind, name) not in self._named:
            texts = self._texts(
                f"SELECT manifest FROM ({self._select()}) WHERE kind = ? AND name = ? "
                "ORDER BY digest LIMIT 1",
                [kind, name],
            )
            self._named[kind, name] = orjson.loads(texts[0]) if texts else None
        return self._named[kind, name]

    def _select(self) -> str:
        if self._manifests is None:
            published, pending = self._sources()
            self._manifests = (
                f"SELECT digest, kind, name, manifest FROM "
                f"({parquet_select(published, MANIFEST_SEGMENT_SCHEMA)}) UNION ALL "
                f"SELECT digest, kind, name, manifest FROM ({pending})"
            )
        return self._manifests

    def _texts(self, sql: str, parameters: list[str] | None = None) -> list[str]:
        """The first column of a query's rows, a text each."""
        con = duckdb.connect()
        try:
            return [str(row[0]) for row in con.execute(sql, parameters or []).fetchall()]
        finally:
            con.close()

    def _sources(self) -> tuple[list[str], str]:
        """The published manifest files, and a SELECT of the unpublished record sets'."""
        current = load_current(self.store, self.settings)
        segments = current.files.get("manifest_segments", [])
        published = [str(fetch(self.store, self.layout, key)) for key in segments]
        catalog = IndexCatalog.beside(self.store, self.settings)
        pending = additions(self.store, self.layout, catalog, current.version, current).sets
        objects = RecordObjects.fetch(self.store, self.layout, pending, ["manifests"])
        return published, objects.select("manifests", MANIFEST_SCHEMA)


def known_manifests(store: ObjectStore, settings: Settings) -> KnownManifests:
    return KnownManifests(store, settings)


AWAITING_PREFIX = "awaiting_"  # a quarantine reason that waits for another file, not a defect


def is_awaiting(reason: str) -> bool:
    return reason.startswith(AWAITING_PREFIX)


def awaiting_files(store: ObjectStore, settings: Settings) -> list[tuple[str, str]]:
    """(snapshot digest, source key) of each file the published index holds rows of that wait
    for another file (a FlashInfer trace for its definition), in its current record set."""
    layout = IndexLayout.of(settings)
    current = load_current(store, settings)
    quarantine = [
        str(p) for p in fetch_all(store, layout, current.files.get("quarantine_files", []))
    ]
    snapshots = [str(p) for p in fetch_all(store, layout, current.files.get("snapshots", []))]
    if not quarantine or not snapshots:
        return []
    con = duckdb.connect()
    try:
        rows = con.execute(
            f"""WITH reads AS ({parquet_select(snapshots, SNAPSHOT_SCHEMA)}),
                    current_sets AS (
                      SELECT snapshot_digest, {CURRENT_RECORD_SET} AS parser_version
                      FROM reads GROUP BY snapshot_digest)
                SELECT DISTINCT q.snapshot_digest, r.source_key
                FROM ({parquet_select(quarantine, QUARANTINE_SCHEMA)}) q
                SEMI JOIN current_sets c USING (snapshot_digest, parser_version)
                JOIN reads r USING (snapshot_digest)
                WHERE starts_with(q.reason, ?)
                ORDER BY 1, 2""",
            [AWAITING_PREFIX],
        ).fetchall()
    finally:
        con.close()
    return [(digest, key) for digest, key in rows]
