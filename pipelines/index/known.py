"""Which manifest digests the index already holds, for bundles that name manifests they do not
carry (a worker uploading runs of an operation published earlier).

"Holds" means: in the current published version, or in a complete record set written but not yet
published (an earlier file of the same `kindex ingest`, or of the same sensor tick). The lookup is
lazy: a Liger CSV never asks, and a bundle that carries everything it names asks nothing of the
index, so neither pays for listing the record sets.
"""

from __future__ import annotations

from collections.abc import Iterable

import duckdb

from pipelines.index.layout import IndexLayout
from pipelines.index.local import fetch, load_current
from pipelines.index.publish import included, list_record_sets
from pipelines.index.record_objects import MANIFEST_SCHEMA
from pipelines.index.tables import MANIFEST_SEGMENT_SCHEMA, parquet_select
from pipelines.settings import Settings
from pipelines.storage.base import ObjectStore


class KnownManifests:
    """`known(digest) -> bool` over the index's manifests; loaded on the first question."""

    def __init__(self, store: ObjectStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.layout = IndexLayout.of(settings)
        self._digests: frozenset[str] | None = None

    def __call__(self, digest: str) -> bool:
        if self._digests is None:
            self._digests = frozenset(self._load())
        return digest in self._digests

    def _load(self) -> Iterable[str]:
        current = load_current(self.store, self.settings)
        segments = current.files.get("manifest_segments", [])
        published = [str(fetch(self.store, self.layout, key)) for key in segments]
        summaries, _ = list_record_sets(self.store, self.layout)
        included_sets, _ = included(self.store, self.layout, current)
        pending = [
            str(fetch(self.store, self.layout, f"{prefix}manifests.parquet"))
            for prefix in sorted(summaries)
            if prefix not in included_sets
        ]
        con = duckdb.connect()
        try:
            rows = con.execute(
                f"SELECT digest FROM ({parquet_select(published, MANIFEST_SEGMENT_SCHEMA)}) "
                f"UNION SELECT digest FROM ({parquet_select(pending, MANIFEST_SCHEMA)})"
            ).fetchall()
        finally:
            con.close()
        return (row[0] for row in rows)


def known_manifests(store: ObjectStore, settings: Settings) -> KnownManifests:
    return KnownManifests(store, settings)
