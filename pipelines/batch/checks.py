"""What a batch's checks read of the record sets it wrote: their runs, from the local cache, and
a schema verdict over a spread sample of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.batch.records import SnapshotRecords
from pipelines.index.layout import IndexLayout
from pipelines.index.publish import RecordObjects
from pipelines.records.manifests import first_schema_error
from pipelines.records.record_objects import SCHEMAS
from pipelines.settings import Settings
from pipelines.storage.base import ObjectStore


def runs_by_snapshot(
    store: ObjectStore,
    settings: Settings,
    records: Sequence[SnapshotRecords],
    columns: Sequence[str],
) -> dict[str, pa.Table]:
    """Columns of these record sets' runs, a table per snapshot digest, in source-line order:
    the rows each set claims of the objects it shares with its batch (`RecordObjects`, as a
    publish reads them), each object read once, from the local cache where writing the record
    set put it (from the bucket only when another process wrote it)."""

    wanted = dict.fromkeys([*columns, "snapshot_digest", "parser_version", "source_line"])
    schema = pa.schema([SCHEMAS["runs"].field(name) for name in wanted])
    sets = [r.record_set for r in records]
    objects = RecordObjects.fetch(store, IndexLayout.of(settings), sets, names=("runs",))
    if not objects.paths["runs"]:
        return {}
    con = duckdb.connect()
    try:
        runs = con.execute(
            f"SELECT * FROM ({objects.select('runs', schema)}) "
            "ORDER BY snapshot_digest, source_line"
        ).to_arrow_table()
    finally:
        con.close()
    by_snapshot: dict[str, pa.Table] = {}
    start = 0
    for counted in pc.value_counts(runs["snapshot_digest"]).to_pylist():  # in order of rows
        by_snapshot[counted["values"]] = runs.slice(start, counted["counts"])
        start += counted["counts"]
    return by_snapshot


# The schema check validates at most this many runs of a file (evenly spread over it): its cost
# stays flat however large the file.
SCHEMA_CHECKED_RUNS = 2000


@dataclass(slots=True)
class SchemaVerdict:
    checked: int
    of: int
    failures: list[str]


def schema_sample(manifests: pa.ChunkedArray) -> list[str]:
    """At most SCHEMA_CHECKED_RUNS of an Arrow column of manifests, evenly spread."""
    stride = max(1, -(-len(manifests) // SCHEMA_CHECKED_RUNS))
    return [str(m) for m in manifests.take(list(range(0, len(manifests), stride))).to_pylist()]


def schema_verdict(manifests: Sequence[str], limit: int = 10) -> SchemaVerdict:
    """Validate manifests (JSON texts) against their kernelindex schemas with a compiled
    validator (jsonschema-rs, the same JSON Schema 2020-12 verdicts as `jsonschema`); the
    failures' messages come from `pipelines.records.manifests.schema_errors`."""

    stride = max(1, -(-len(manifests) // SCHEMA_CHECKED_RUNS))
    chosen = manifests[::stride]
    failures: list[str] = []
    for text in chosen:
        manifest = orjson.loads(text)
        problem = first_schema_error(manifest)
        if problem is None:
            continue
        name = manifest.get("metadata", {}).get("name", "?")
        failures.append(f"{manifest.get('kind')} {name}: {problem[0]}: {problem[1]}")
        if len(failures) >= limit:
            break
    return SchemaVerdict(len(chosen), len(manifests), failures)
