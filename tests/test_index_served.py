"""A table another part of kindex writes into the index's catalog (the file ledger) is served by
every reader: the local database, a connection straight to the bucket, and what `kindex connect`
prints; `--as-of` shows it as it was when that version was published."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pyarrow as pa
import pytest
from index_support import csv_bytes, index_settings, ingest_bytes, liger_rows, query
from pyiceberg.manifest import ManifestFile

from pipelines.cli import main
from pipelines.index import catalog as catalog_module
from pipelines.index import tables
from pipelines.index.catalog import IndexCatalog
from pipelines.index.layout import IndexLayout
from pipelines.index.local import load_current, sync_local
from pipelines.index.remote import connect_remote

__all__ = ["index_settings"]

LEDGER_SCHEMA = pa.schema([("key", pa.string()), ("state", pa.string()), ("attempts", pa.int32())])

BARE_COUNT = """
import sys
import duckdb
text = "\\n".join(line for line in sys.stdin.read().splitlines() if not line.startswith("--"))
con = duckdb.connect(config={"autoinstall_known_extensions": False,
                             "autoload_known_extensions": False})
for statement in (s for s in text.split(";\\n") if s.strip()):
    con.execute(statement)
row = con.execute("SELECT string_agg(key || ':' || state, ',' ORDER BY key) FROM ledger")
print(row.fetchone()[0])
"""


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(tables.SERVED_TABLES, "ledger", f"{__name__}:LEDGER_SCHEMA")


def ledger_rows(settings: Any, store: Any, rows: list[tuple[str, str, int]]) -> None:
    """Append rows to the served table as its writer would, through the index's catalog."""
    catalog = IndexCatalog.beside(store, settings)
    identifier = (catalog.namespace, "ledger")
    catalog.catalog.create_namespace_if_not_exists(catalog.namespace)
    table = catalog.catalog.create_table_if_not_exists(identifier, schema=LEDGER_SCHEMA)
    data = pa.Table.from_pylist(
        [{"key": k, "state": s, "attempts": a} for k, s, a in rows], schema=LEDGER_SCHEMA
    )
    table.append(data)


def test_a_served_table_is_empty_before_it_exists(
    served: None, s3_store: Any, index_settings: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["query", "SELECT count(*) AS n FROM ledger", "--format", "csv"]) == 0
    assert capsys.readouterr().out == "n\n0\n"
    header, rows = liger_rows(range(2, 12))
    ingest_bytes(s3_store, index_settings, [("incoming/a.csv", csv_bytes(header, rows))])
    assert query(index_settings, "SELECT count(*) FROM ledger") == [(0,)]
    assert query(index_settings, "DESCRIBE ledger")[2][:2] == ("attempts", "INTEGER")


def test_every_reader_serves_the_table_and_as_of_pins_its_past(
    served: None, s3_store: Any, index_settings: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    header, rows = liger_rows(range(2, 22))
    ledger_rows(index_settings, s3_store, [("incoming/a.csv", "pending", 1)])
    ingest_bytes(s3_store, index_settings, [("incoming/a.csv", csv_bytes(header, rows[:10]))])
    first = load_current(s3_store, index_settings).version
    ledger_rows(index_settings, s3_store, [("incoming/b.csv", "pending", 1)])
    ingest_bytes(s3_store, index_settings, [("incoming/b.csv", csv_bytes(header, rows[10:]))])
    both = "incoming/a.csv:pending,incoming/b.csv:pending"
    sql = "SELECT string_agg(key || ':' || state, ',' ORDER BY key) FROM ledger"
    # The local database was built by the publish, with the ledger as it was then.
    assert query(index_settings, sql) == [(both,)]
    # The writer moves on after the publish: a sync shows its newest snapshot.
    ledger_rows(index_settings, s3_store, [("incoming/c.csv", "failed", 3)])
    assert query(index_settings, sql) == [(both,)]
    sync_local(s3_store, index_settings)
    newest = both + ",incoming/c.csv:failed"
    assert query(index_settings, sql) == [(newest,)]

    remote = connect_remote(index_settings)
    try:
        assert remote.execute(sql).fetchone() == (newest,)
    finally:
        remote.close()
    remote = connect_remote(index_settings, version=first)
    try:
        assert remote.execute(sql).fetchone() == ("incoming/a.csv:pending",)
    finally:
        remote.close()

    assert main(["query", sql, "--format", "csv", "--as-of", str(first.version)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "incoming/a.csv:pending"

    assert main(["connect"]) == 0
    bare = subprocess.run(
        [sys.executable, "-I", "-c", BARE_COUNT],
        input=capsys.readouterr().out,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert bare.returncode == 0, bare.stderr
    assert bare.stdout.strip() == newest
    # The index's fingerprints and counts know nothing of it.
    assert "ledger" not in json.dumps(load_current(s3_store, index_settings).version.counts)


def test_a_large_manifest_is_listed_once_per_home(
    served: None, s3_store: Any, index_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A served table's files are its manifests' live entries, the files a scan plans; a
    manifest large enough to outlive later commits is read from the bucket once (its list kept
    in the local cache), and a list is dropped once the snapshot listed no longer holds its
    manifest."""
    monkeypatch.setattr(catalog_module, "MANIFEST_TARGET_BYTES", 2)  # every manifest is large
    for n in range(3):  # three fast appends: three manifests
        ledger_rows(index_settings, s3_store, [(f"k{n}", "indexed", 1)])
    catalog = IndexCatalog.beside(s3_store, index_settings)
    table = catalog.table("ledger")
    head = table.current_snapshot()
    assert head is not None and len(head.manifests(table.io)) == 3
    planned = sorted(task.file.file_path for task in table.scan().plan_files())
    assert catalog.snapshot_data_files(table, head.snapshot_id) == planned
    folder = IndexLayout.of(index_settings).cache_dir / ".manifest-files" / "ledger"
    assert len(list(folder.glob("*.txt"))) == 3

    fetched: list[str] = []
    real = ManifestFile.fetch_manifest_entry

    def spied(manifest: ManifestFile, *args: Any, **kwargs: Any) -> Any:
        fetched.append(manifest.manifest_path)
        return real(manifest, *args, **kwargs)

    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry", spied)
    again = IndexCatalog.beside(s3_store, index_settings)  # another process's catalog
    assert again.snapshot_data_files(again.table("ledger"), head.snapshot_id) == planned
    assert fetched == []

    # An overwrite replaces every manifest: the next listing reads the new ones and drops the
    # lists of the old.
    table.overwrite(
        pa.Table.from_pylist([{"key": "k9", "state": "failed", "attempts": 2}], LEDGER_SCHEMA)
    )
    table = again.table("ledger", refresh=True)
    head = table.current_snapshot()
    assert head is not None
    planned = sorted(task.file.file_path for task in table.scan().plan_files())
    assert again.snapshot_data_files(table, head.snapshot_id) == planned
    assert len(planned) == 1 and fetched
    names = {p.name for p in folder.glob("*.txt")}
    assert len(names) == len(head.manifests(table.io))
