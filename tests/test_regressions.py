"""Regressions judged per kernel on real Liger history (tests/data/liger/gh-pages: eleven of
Liger's CI runs on one H100 host, one to three of each version, up to run 0a62700-v0.6.4, and
run 0a62700, the same commit a week later; each run a point of its version): an A/A pair names
nothing, an injected slowdown names exactly its kernels, host drift names nothing and shows in
`drift`."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import HomeCopy, building_home, drop_bucket, restored_home
from index_support import index_settings, ingest_bytes, query

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from regressions import (  # noqa: E402
    AA_NEW,
    AA_OLD,
    DRIFT_FACTOR,
    INJECTED_FACTOR,
    INJECTED_PROVIDER,
    NAMED_SQL,
    LigerRun,
    next_version,
    read_run,
    run_items,
)

from pipelines.cli import main  # noqa: E402
from pipelines.regressions import (  # noqa: E402
    SETTINGS_VARIABLE,
    RegressionSettingsError,
    load_settings,
    settings_statement,
)
from pipelines.settings import Settings  # noqa: E402
from pipelines.storage.embedded import EmbeddedS3  # noqa: E402
from pipelines.storage.s3 import S3Store  # noqa: E402

__all__ = ["index_settings"]  # the fixture, imported for pytest

SAMPLE = Path(__file__).parent / "data" / "liger" / "gh-pages"
# Kernels whose liger-vs-baseline time moved under 1.5 % between the two same-code runs.
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
QUIET = ("jsd", "tvd", "embedding", "kl_div", "fused_linear_jsd")


def sample() -> tuple[list[LigerRun], LigerRun]:
    runs = sorted((read_run(p) for p in SAMPLE.glob("*.csv.gz")), key=LigerRun.first_time)
    history = [r for r in runs if r.name != AA_NEW]
    assert history[-1].name == AA_OLD
    new = next(r for r in runs if r.name == AA_NEW)
    return history, new.relabelled(next_version(history[-1].version()))


@pytest.fixture(scope="module")
def built_history(
    embedded_s3: EmbeddedS3, s3_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HomeCopy]:
    """The shared history's eleven runs ingested once for the module (each scenario adds its
    own run to a copy of it): ingesting them is most of a scenario's work."""
    folder = tmp_path_factory.mktemp("liger-history")
    with building_home(embedded_s3, s3_client, folder) as (store, settings):
        history, _ = sample()
        ingest_bytes(store, settings, run_items(history))
        saved = HomeCopy.saved(s3_client, store.bucket, folder / "home", folder)
    yield saved
    drop_bucket(s3_client, saved.bucket)


@pytest.fixture
def history_home(
    built_history: HomeCopy,
    embedded_s3: EmbeddedS3,
    s3_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[S3Store, Settings]:
    """A store and settings holding the shared history as it was ingested, this test's to add
    to (the environment points at them, as `s3_store` and `index_settings` do)."""
    return restored_home(built_history, embedded_s3, s3_client, monkeypatch)


def build(home: tuple[S3Store, Settings], new: LigerRun) -> str:
    """The shared history (ingested already), then `new`."""
    store, settings = home
    ingest_bytes(store, settings, run_items([new]))
    return new.version()


def named(settings: Any, version: str) -> list[tuple[Any, ...]]:
    return query(settings, NAMED_SQL.replace("$version", f"'{version}'"))


def test_a_a_pair_names_no_kernel(history_home: tuple[S3Store, Settings]) -> None:
    _, new = sample()
    version = build(history_home, new)
    index_settings = history_home[1]
    assert named(index_settings, version) == []
    verdicts = dict(
        query(
            index_settings,
            f"SELECT verdict, count(*) FROM version_verdicts WHERE new_version = '{version}' "
            "GROUP BY 1",
        )
    )
    # Judged, not waved through: most kernel-level series have the history to be judged.
    assert verdicts.get("no change", 0) > 60
    assert verdicts.get("regression", 0) == 0
    assert verdicts.get("improvement", 0) == 0


def test_a_a_pair_within_one_version_are_two_points(
    history_home: tuple[S3Store, Settings],
) -> None:
    """The same-code pair as Liger's CI published them, both 0.6.4 a week apart: two points
    of one version, ordered by their runs' time, the second judged against the first and named
    nowhere."""
    history, new = sample()
    runs = sorted((read_run(p) for p in SAMPLE.glob("*.csv.gz")), key=LigerRun.first_time)
    same = next(r for r in runs if r.name == AA_NEW)
    assert same.version() == history[-1].version()
    version = build(history_home, same)
    index_settings = history_home[1]
    rows = query(
        index_settings,
        "SELECT old_version, new_version, old_point < new_point, verdict, count(*) "
        "FROM version_verdicts WHERE newest GROUP BY ALL ORDER BY ALL",
    )
    assert {r[:3] for r in rows} == {(version, version, True)}, rows
    verdicts = {r[3]: r[4] for r in rows}
    assert verdicts.get("no change", 0) > 60
    assert "regression" not in verdicts and "improvement" not in verdicts, verdicts


def test_injected_slowdown_names_exactly_its_kernels(
    history_home: tuple[S3Store, Settings], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, new = sample()
    slower = new.scaled(INJECTED_FACTOR, providers=[INJECTED_PROVIDER], kernels=QUIET)
    version = build(history_home, slower)
    index_settings = history_home[1]
    rows = named(index_settings, version)
    assert {r[0] for r in rows} == set(QUIET)
    assert {r[1] for r in rows} == {INJECTED_PROVIDER}
    # Each named change is the injected 1.25x, give or take the runs' own noise.
    assert all(1.15 < r[6] < 1.35 for r in rows), rows
    from pipelines.index.local import open_index
    from pipelines.regressions import top_movers

    con = open_index(index_settings)
    try:
        movers = top_movers(con, limit=3)
    finally:
        con.close()
    assert movers.num_rows == 3
    ratios = movers.column("ratio").to_pylist()
    assert ratios == sorted(ratios, reverse=True)
    assert set(movers.column("kernel").to_pylist()) <= set(QUIET)

    # The chart names the largest regression when no series is given, and draws a named one.
    png = tmp_path / "regressions.png"
    assert main(["chart", "regressions", "-o", str(png)]) == 0
    assert png.read_bytes().startswith(PNG_MAGIC)
    assert capsys.readouterr().err.split(": ", 1)[1].split(" ")[0] in QUIET
    args = ["chart", "regressions", "--kernel", "jsd", "--mode", "forward", "-o", str(png)]
    assert main([*args, "--provider", "liger"]) == 0
    assert "jsd forward · liger" in capsys.readouterr().err
    assert main(["chart", "regressions", "--kernel", "no_such_kernel", "-o", str(png)]) == 1


def test_settings_come_from_configuration(tmp_path: Path) -> None:
    defaults = load_settings({})
    assert defaults.min_history >= 1 and defaults.z_threshold > 0
    tuned = tmp_path / "regressions.yaml"
    tuned.write_text("min_history: 50\nmin_effect: 0.1\n")
    settings = load_settings({SETTINGS_VARIABLE: str(tuned)})
    assert (settings.min_history, settings.min_effect) == (50, 0.1)
    assert settings.z_threshold == defaults.z_threshold
    assert "CAST(50 AS INTEGER) AS min_history" in settings_statement(settings)
    tuned.write_text("min_histroy: 5\n")
    with pytest.raises(RegressionSettingsError, match="min_histroy"):
        load_settings({SETTINGS_VARIABLE: str(tuned)})
    tuned.write_text("z_threshold: -1\n")
    with pytest.raises(RegressionSettingsError, match="z_threshold"):
        load_settings({SETTINGS_VARIABLE: str(tuned)})


def test_host_drift_names_nothing_and_shows_as_drift(
    history_home: tuple[S3Store, Settings],
) -> None:
    _, new = sample()
    version = build(history_home, new.scaled(DRIFT_FACTOR))
    index_settings = history_home[1]
    assert named(index_settings, version) == []
    drifted = query(
        index_settings,
        f"SELECT kernel, mode, ratio, direction FROM drift WHERE new_version = '{version}' "
        "AND metric = 'latency'",
    )
    slower = {r[0] for r in drifted if r[3] == "slower"}
    assert set(QUIET) <= slower
    assert len(slower) > 20
    # The quiet kernels moved by the drift alone; a noisy one may move either way on top of it
    # (the two same-code runs differ by up to 25 % on their own).
    assert all(1.15 < r[2] < 1.25 for r in drifted if r[0] in QUIET), drifted
    assert sum(r[3] == "slower" for r in drifted) > 0.8 * len(drifted)


def test_verdicts_read_points_not_runs(s3_store: Any, index_settings: Any) -> None:
    """Later runs of the same cases supersede the first file's runs and settle them: each run is
    still a point (a re-measurement of its case), and the verdict views read only the stored
    points (series_points) and the snapshots through iceberg_scan, never a run file, so their
    cost follows the points, not the runs and their manifests."""
    from index_support import csv_bytes, liger_rows

    from pipelines.index.remote import connect_remote

    header, rows = liger_rows(range(2, 42))
    at = header.index("timestamp")
    later = [[*row[:at], "2030-01-01 00:00:00", *row[at + 1 :]] for row in rows]
    ingest_bytes(s3_store, index_settings, [("incoming/a.csv", csv_bytes(header, rows))])
    ingest_bytes(s3_store, index_settings, [("incoming/b.csv", csv_bytes(header, later))])
    con = connect_remote(index_settings)

    def tables_read(sql: str) -> set[str]:
        """The tables whose data files the query's iceberg_scans opened."""
        plan = con.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}").fetchall()[0][1]
        return set(re.findall(r"/([a-z_]+)/data/[0-9a-f-]+\.parquet", plan))

    try:
        assert tables_read("SELECT count(*) FROM runs WHERE median > 0") == {"run_segments"}
        for view in ("regressions", "improvements", "drift", "regression_cases"):
            assert tables_read(f"SELECT count(*) FROM {view}") <= {"series_points", "snapshots"}
        points = con.execute(
            "SELECT count(*), count(DISTINCT run_digest), count(DISTINCT point) "
            "FROM regression_points"
        ).fetchone()
        runs = con.execute("SELECT count(*) FROM runs WHERE median > 0").fetchone()
        assert runs is not None and points == (runs[0], runs[0], 2)
        changes = con.execute("SELECT count(*) FROM regression_cases").fetchone()
        assert changes is not None and changes[0] == runs[0] // 2
    finally:
        con.close()


KERNELBENCH = Path(__file__).parent / "data" / "formats" / "kernelbench" / "tk_baseline_time.json"
# Small same-code wobbles of successive KernelBench files (the runs' own noise).
WOBBLE = (1.0, 1.012, 0.993, 1.006, 0.989, 1.004, 0.996, 1.009, 0.991, 1.003)


def kernelbench_file(factor: float, slower: str | None = None) -> bytes:
    """tk_baseline_time.json with every mean times `factor`, and `slower`'s 1.3x besides."""
    import json

    data = json.loads(KERNELBENCH.read_text())
    for problems in data.values():
        for name, entry in problems.items():
            scale = factor * (1.3 if name == slower else 1.0)
            for stat in ("mean", "min", "max"):
                entry[stat] = round(entry[stat] * scale, 6)
    return json.dumps(data).encode()


def test_a_source_without_baseline_is_judged_on_absolute_time_by_arrival(
    s3_store: Any, index_settings: Any
) -> None:
    """KernelBench files carry no version and no baseline beside the timed kernel: their points
    are ordered by arrival and judged on absolute time against each kernel's noise. Ten files of
    one GPU arrive one after another; the last times one problem 1.3x slower: that kernel is
    named, and nothing else."""
    slower = "38_L1Norm_.py"
    # Read one after another (each its own arrival), then published once.
    files = [
        (
            f"incoming/kernelbench/run-{n}.json",
            kernelbench_file(factor, slower if n == len(WOBBLE) - 1 else None),
        )
        for n, factor in enumerate(WOBBLE)
    ]
    ingest_bytes(s3_store, index_settings, files)
    axes = query(index_settings, "SELECT DISTINCT version, version_axis FROM regression_points")
    assert axes == [(None, "arrival")]
    verdicts = query(
        index_settings,
        "SELECT kernel, verdict, ratio, baseline_provider, history FROM version_verdicts "
        "WHERE newest ORDER BY kernel",
    )
    assert len(verdicts) == 6, verdicts
    named = [v for v in verdicts if v[1] in ("regression", "improvement")]
    assert len(named) == 1 and named[0][1] == "regression", verdicts
    assert "l1" in named[0][0].lower() and 1.25 < named[0][2] < 1.35
    assert all(v[3] is None and v[4] == len(WOBBLE) - 2 for v in verdicts)
    assert {v[1] for v in verdicts if v not in named} == {"no change"}
    # Every file before the last is a point of its own, in the order the files arrived.
    history = query(
        index_settings,
        "SELECT count(DISTINCT point_rank), count(DISTINCT snapshot_digest) FROM regression_points",
    )
    assert history == [(len(WOBBLE), len(WOBBLE))]


def test_the_version_axis_is_stated_once_for_every_source() -> None:
    """point_axis_sql: Liger's version first, else a bundle's or harness's implementation
    version, else the framework version, else arrival; versions sort numerically; within a
    version, commit time where the file carries one, else observed time; on the arrival axis,
    commit time, else the file's first read."""
    import duckdb

    from pipelines.regressions import point_axis_sql

    axis = point_axis_sql("r", "f")
    rows = [
        # liger_version, implementation_version, framework_version, observed, committed, read
        ("0.6.10", None, "2.5.1", "2025-01-03", None, "2025-02-01"),
        ("0.6.9", "1.0", None, "2025-01-05", None, "2025-02-02"),
        (None, "v2.1.0+cu124", None, "2025-01-01", "2025-01-20", "2025-02-03"),
        (None, None, "2.5.1", "2025-01-02", None, "2025-02-04"),
        (None, None, None, "2025-01-09", None, "2025-02-05"),
        (None, None, None, "2025-01-09", "2024-12-30", "2025-02-06"),
    ]
    con = duckdb.connect()
    try:
        values = ", ".join(
            "(" + ", ".join([str(n), *("NULL" if v is None else f"'{v}'" for v in row)]) + ")"
            for n, row in enumerate(rows)
        )
        con.execute(
            "CREATE TABLE t AS SELECT id, liger_version, implementation_version, "
            "framework_version, observed::TIMESTAMP AS observed_at, "
            "committed::TIMESTAMP AS committed_at, read::TIMESTAMP AS taken_at "
            f"FROM (VALUES {values}) AS v(id, liger_version, implementation_version, "
            "framework_version, observed, committed, read)"
        )
        result = con.execute(
            f"""SELECT {axis["version"]}, {axis["version_axis"]}, {axis["version_key"]},
                       strftime({axis["point_at"]}, '%Y-%m-%d')
                FROM t r JOIN t f USING (id) ORDER BY id"""
        ).fetchall()
    finally:
        con.close()
    assert [(v, a, t) for v, a, _, t in result] == [
        ("0.6.10", "liger_version", "2025-01-03"),
        ("0.6.9", "liger_version", "2025-01-05"),
        ("v2.1.0+cu124", "implementation_version", "2025-01-20"),
        ("2.5.1", "framework_version", "2025-01-02"),
        (None, "arrival", "2025-02-05"),
        (None, "arrival", "2024-12-30"),
    ]
    keys = [k for _, _, k, _ in result]
    assert keys[1] < keys[0]  # 0.6.9 before 0.6.10
    assert keys[4] is None and keys[2] is not None and keys[2].endswith("+cu124")


def test_a_file_processed_again_keeps_one_point_per_run(
    s3_store: Any, index_settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backfill after the curation changed processes a file again under a new parser version:
    its runs (the same digests) are stored already, and their points move to the new record set,
    once each; the points of the file's older record set leave the views."""
    from importlib import resources

    from index_support import csv_bytes, drop_and_process, liger_rows

    from pipelines.curation import CURATION_DIR_VARIABLE, CURATION_FILES
    from pipelines.index.publish import publish_index

    folder = tmp_path / "curation"
    folder.mkdir()
    for name in CURATION_FILES:
        text = resources.files("pipelines.curation").joinpath(name).read_text(encoding="utf-8")
        (folder / name).write_text(text)
    monkeypatch.setenv(CURATION_DIR_VARIABLE, str(folder))
    header, rows = liger_rows(range(2, 42))
    at = header.index("timestamp")
    later = [[*row[:at], "2030-01-01 00:00:00", *row[at + 1 :]] for row in rows]
    first, second = csv_bytes(header, rows), csv_bytes(header, later)
    ingest_bytes(s3_store, index_settings, [("incoming/a.csv", first)])
    ingest_bytes(s3_store, index_settings, [("incoming/b.csv", second)])
    counts = "SELECT count(*), count(DISTINCT run_digest) FROM regression_points"
    before = query(index_settings, counts)
    cases = query(index_settings, "SELECT count(*) FROM regression_cases")
    (folder / "gpus.yaml").write_text((folder / "gpus.yaml").read_text() + "# grown\n")
    drop_and_process(s3_store, index_settings, "incoming/a.csv", first)
    publish_index(s3_store, index_settings)
    assert query(index_settings, counts) == before
    runs = query(index_settings, "SELECT count(*), count(*) FROM runs WHERE median > 0")
    assert before == runs and runs[0][0] == 2 * len(rows)
    assert query(index_settings, "SELECT count(*) FROM regression_cases") == cases
    stored = query(index_settings, "SELECT count(*) FROM series_points")
    assert stored[0][0] > before[0][0]  # the older record set's points stay in the table
