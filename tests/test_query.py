"""`kindex query`: an index from the start, DuckDB's own errors, output formats and exports, and
a connection that can write nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
from index_support import csv_bytes, index_settings, ingest_bytes, liger_rows

from pipelines.cli import main
from pipelines.index.layout import IndexLayout
from pipelines.index.local import load_current, open_locked
from pipelines.index.tables import TABLES, VIEWS

__all__ = ["index_settings"]  # a fixture


@pytest.fixture
def empty_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("KINDEX_HOME", str(home))
    return home


def query(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["query", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_an_empty_index_has_every_table_and_view_and_answers_zero(
    empty_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in TABLES + VIEWS:
        code, out, err = query(capsys, f"select count(*) as n from {name}", "--format", "csv")
        assert (code, out, err) == (0, "n\n0\n", ""), name


def test_a_table_name_typo_gets_duckdbs_suggestion_not_a_python_object(
    empty_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for typo in ("run", "con", "settings", "sys"):
        code, _, err = query(capsys, f"select count(*) from {typo}")
        assert code == 1
        assert "Python Object" not in err and "replacement scan" not in err
    code, _, err = query(capsys, "select count(*) from run")
    assert 'Did you mean "runs"' in err


def test_json_columns_come_out_as_json(
    empty_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sql = """select '{"a": [1, 2]}'::JSON as doc, 'text' as name"""
    code, out, _ = query(capsys, sql, "--format", "json")
    assert code == 0
    assert json.loads(out) == [{"doc": {"a": [1, 2]}, "name": "text"}]


def test_the_table_format_bounds_column_width(
    empty_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = query(capsys, "select repeat('x', 5000) as wide, 'short' as s")
    assert code == 0
    assert max(len(line) for line in out.splitlines()) < 60
    assert "x" * 39 + "…" in out
    code, out, _ = query(capsys, "select repeat('x', 100) as wide", "--max-width", "0")
    assert "x" * 100 in out


@pytest.mark.parametrize(
    "sql",
    [
        "COPY (SELECT 1 AS a) TO '{outside}'",
        "EXPORT DATABASE '{folder}'",
        "ATTACH '{outside}.duckdb' AS other (READ_WRITE)",
        "INSTALL httpfs",
        "LOAD httpfs",
        "EXPLAIN ANALYZE COPY (SELECT 1) TO '{outside}'",
        "SELECT * FROM read_csv('{outside}')",
        "SET enable_external_access = true",
        "PREPARE p AS COPY (SELECT 1) TO '{outside}'",
    ],
)
def test_statements_that_write_attach_or_load_are_refused(
    empty_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], sql: str
) -> None:
    outside = tmp_path / "written.csv"
    folder = tmp_path / "exported"
    code, out, err = query(capsys, sql.format(outside=outside, folder=folder))
    assert code == 1 and out == ""
    assert err.startswith("kindex query: ") and len(err.splitlines()) <= 2
    assert not outside.exists() and not folder.exists()
    assert not Path(f"{outside}.duckdb").exists()


@pytest.fixture
def small_index(s3_store: Any, index_settings: Any) -> Any:
    header, rows = liger_rows(range(2, 30))
    ingest_bytes(s3_store, index_settings, [("incoming/small.csv", csv_bytes(header, rows))])
    return index_settings


def published_files(settings: Any, store: Any) -> dict[str, list[Path]]:
    """Each stored table's data files in the local cache."""
    layout = IndexLayout.of(settings)
    current = load_current(store, settings)
    return {name: [layout.cached_path(key) for key in keys] for name, keys in current.files.items()}


@pytest.mark.slow
def test_the_cache_of_published_files_cannot_be_overwritten(
    small_index: Any, s3_store: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    by_table = published_files(small_index, s3_store)
    files = [path for paths in by_table.values() for path in paths]
    published_file = by_table["run_segments"][0]
    before = {p: p.read_bytes() for p in files}
    code, out, _ = query(capsys, "select count(*) as n from quarantine", "--format", "csv")
    assert code == 0
    rows = out.splitlines()[1]
    for sql in (
        f"COPY (SELECT * FROM quarantine LIMIT 0) TO '{published_file}' (FORMAT parquet)",
        f"COPY (SELECT * FROM quarantine LIMIT 0) TO '{published_file}' (USE_TMP_FILE false)",
        f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{published_file}' (USE_TMP_FILE false)",
    ):
        code, _, err = query(capsys, sql)
        assert code == 1 and ("read-only" in err or "explains only" in err), sql
    # Under the statement check, DuckDB itself opens no other file: not even the one beside a
    # published file that a COPY writes first.
    con = open_locked(small_index)
    try:
        with pytest.raises(duckdb.PermissionException):
            con.execute(f"COPY (SELECT 1 AS a) TO '{published_file}' (FORMAT parquet)")
        with pytest.raises(duckdb.PermissionException):
            con.execute(f"COPY (SELECT 1 AS a) TO '{published_file.parent / 'new.parquet'}'")
    finally:
        con.close()
    assert {p: p.read_bytes() for p in files} == before
    code, out, _ = query(capsys, "select count(*) as n from quarantine", "--format", "csv")
    assert out.splitlines()[1] == rows


@pytest.mark.slow
def test_output_exports_with_duckdb_in_each_format(
    small_index: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = query(capsys, "select count(*) as n from runs", "--format", "csv")
    runs = int(out.splitlines()[1])
    assert runs > 0
    sql = "select run_digest, kernel, manifest from runs order by run_digest"
    parquet, csv_file, json_file = (tmp_path / f"runs.{ext}" for ext in ("parquet", "csv", "json"))
    for target in (parquet, csv_file, json_file):
        code, out, err = query(capsys, sql, "--output", str(target))
        assert (code, out, err) == (0, "", ""), err
    table = pq.read_table(parquet)
    assert table.num_rows == runs and table.column_names == ["run_digest", "kernel", "manifest"]
    assert len(csv_file.read_text().splitlines()) == runs + 1
    exported = json.loads(json_file.read_text())
    assert [r["run_digest"] for r in exported] == table.column("run_digest").to_pylist()


def test_output_refuses_other_statements_and_the_home(
    empty_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "out.csv"
    code, _, err = query(capsys, "COPY (SELECT 1) TO '/tmp/x.csv'", "--output", str(target))
    assert code == 1 and "one SELECT" in err
    code, _, err = query(capsys, "select 1; select 2", "--output", str(target))
    assert code == 1 and "one SELECT" in err
    assert not target.exists()
    code, _, err = query(capsys, "select 1", "--output", str(empty_home / "cache" / "x.parquet"))
    assert code == 2 and "inside the kindex home" in err
    code, _, err = query(capsys, "select 1", "--output", str(tmp_path / "x.xlsx"))
    assert code == 2 and "unknown format" in err


@pytest.mark.slow
def test_a_changed_cached_file_is_found_and_sync_fetches_it_again(
    small_index: Any, s3_store: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    segment = published_files(small_index, s3_store)["run_segments"][0]
    published = segment.read_bytes()
    code, out, _ = query(capsys, "select count(*) as n from runs", "--format", "csv")
    assert code == 0
    # Written over from outside kindex (a COPY did this before `kindex query` was locked).
    writer = duckdb.connect()
    writer.execute(f"COPY (SELECT * FROM read_parquet('{segment}') LIMIT 0) TO '{segment}'")
    writer.close()
    assert segment.read_bytes() != published
    code, _, err = query(capsys, "select count(*) from runs")
    assert code == 1 and "differ from what was published" in err and "--sync" in err
    code, again, err = query(capsys, "select count(*) as n from runs", "--format", "csv", "--sync")
    assert (code, again) == (0, out), err
    assert segment.read_bytes() == published


def test_a_home_moved_to_another_directory_still_answers(
    small_index: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """The views are rebuilt over the moved cache from the keys the database lists: nothing is
    downloaded (the bucket is not asked: the endpoint is gone)."""
    code, before, _ = query(capsys, "select count(*) as n from runs", "--format", "csv")
    assert code == 0
    moved = tmp_path / "moved-home"
    shutil.move(str(small_index.home), moved)
    monkeypatch.setenv("KINDEX_HOME", str(moved))
    monkeypatch.setenv("KINDEX_S3_ENDPOINT", "http://127.0.0.1:9")
    code, after, err = query(capsys, "select count(*) as n from runs", "--format", "csv")
    assert (code, after) == (0, before), err
    assert int(before.splitlines()[1]) > 0


def test_views_an_older_kindex_built_are_built_again(
    small_index: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """After an upgrade, a version's database whose views are not this kindex's (say, a
    `first_reads` view without its `source` column) is rebuilt over the cache before it
    answers; the bucket is not asked (its endpoint is gone)."""
    import duckdb

    from pipelines.index.local import BUILT_TABLE

    code, before, _ = query(capsys, "select count(*) as n from runs", "--format", "csv")
    assert code == 0
    database = (small_index.home / "index.duckdb").resolve()
    con = duckdb.connect(str(database))
    try:
        con.execute("CREATE OR REPLACE VIEW first_reads AS SELECT 1 AS only_column")
        con.execute(f"UPDATE {BUILT_TABLE} SET views = 'older'")
    finally:
        con.close()
    monkeypatch.setenv("KINDEX_S3_ENDPOINT", "http://127.0.0.1:9")
    code, after, err = query(
        capsys,
        "select count(*) as n, count(source) from runs join first_reads using (snapshot_digest)",
        "--format",
        "csv",
    )
    assert code == 0, err
    assert after.splitlines()[1].split(",")[0] == before.splitlines()[1]
