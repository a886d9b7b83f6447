"""A committed file's history in one command (`kindex ingest --git`, `kindex put --git`): four
real committed versions of Liger's CSV (row subsets, tests/data/liger/history) in a git
repository built here with their commit times; superseded_by, retracted_in_source and the
per-case spread rule of `version_changes` checked run by run against an oracle computed from the
CSV rows."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import threading
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from index_support import index_settings, query

from pipelines.cli import main
from pipelines.git_history import GitHistoryError, file_history
from pipelines.index.publish import publish_index
from pipelines.ingest import process_snapshot
from pipelines.intake.incoming import SourceCommit
from pipelines.intake.snapshots import content_digest, list_reads, put_by_snapshot, take_snapshot

__all__ = ["index_settings"]  # the fixture, imported for pytest

HISTORY = Path(__file__).parent / "data" / "liger" / "history"
FILE = "benchmark/data/all_benchmark_data.csv"
KEY = "incoming/all_benchmark_data.csv"
# What a row measures (its series): a later timestamp of the same series re-measures it.
SERIES_COLUMNS = (
    "kernel_name",
    "kernel_provider",
    "kernel_operation_mode",
    "metric_name",
    "gpu_name",
    "x_name",
    "x_value",
    "extra_benchmark_config_str",
)


def commits() -> list[tuple[str, datetime]]:
    lines = (HISTORY / "commits.tsv").read_text().splitlines()[1:]
    return [(c, datetime.fromisoformat(t)) for c, t in (line.split("\t") for line in lines)]


def version_bytes(commit: str) -> bytes:
    return (HISTORY / commit / "all_benchmark_data.csv").read_bytes()


def git(repo: Path, *args: str, when: datetime | None = None) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}
    if when is not None:
        env |= {"GIT_AUTHOR_DATE": when.isoformat(), "GIT_COMMITTER_DATE": when.isoformat()}
    identity = ["-c", "user.name=kindex test", "-c", "user.email=test@kindex.invalid"]
    done = subprocess.run(
        ["git", "-C", str(repo), *identity, *args], env=env, capture_output=True, check=True
    )
    return done.stdout.decode()


@pytest.fixture
def liger_repo(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A repository whose file has the four versions, committed at their real times. Returns
    it and {our commit: the Liger commit whose version it holds}."""
    repo = tmp_path / "Liger-Kernel"
    (repo / "benchmark" / "data").mkdir(parents=True)
    git(repo, "init", "-q")
    ours = {}
    for liger_commit, when in commits():
        (repo / FILE).write_bytes(version_bytes(liger_commit))
        git(repo, "add", FILE)
        git(repo, "commit", "-q", "-m", f"benchmark data of {liger_commit[:7]}", when=when)
        ours[git(repo, "rev-parse", "HEAD").strip()] = liger_commit
    (repo / "README.md").write_text("a later commit that leaves the file alone\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "-q", "-m", "readme")
    return repo, ours


# -- the oracle --------------------------------------------------------------------------------


def csv_rows(data: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data.decode())))


def row_id(row: dict[str, str]) -> tuple[str, ...]:
    return tuple(row.values())


def series(row: dict[str, str]) -> tuple[str, ...]:
    return tuple(row[c] for c in SERIES_COLUMNS)


def expected_states() -> dict[tuple[str, ...], tuple[tuple[str, ...] | None, bool]]:
    """Every distinct row of every version -> (the row that supersedes it, retracted): a row is
    superseded by the earliest later measurement of its series; a row not superseded and absent
    from the newest version (by commit time) is retracted."""
    versions = [csv_rows(version_bytes(c)) for c, _ in sorted(commits(), key=lambda c: c[1])]
    rows = {row_id(r): r for version in versions for r in version}
    newest = {row_id(r) for r in versions[-1]}
    by_series: dict[tuple[str, ...], list[dict[str, str]]] = {}
    for r in rows.values():
        by_series.setdefault(series(r), []).append(r)
    states = {}
    for rid, r in rows.items():
        later = [o for o in by_series[series(r)] if o["timestamp"] > r["timestamp"]]
        first = min(later, key=lambda o: o["timestamp"]) if later else None
        successor = row_id(first) if first else None
        states[rid] = (successor, successor is None and rid not in newest)
    return states


def expected_regressions() -> Counter[tuple[str, ...]]:
    """(kernel, provider, mode, old version, new version) of each series whose newer Liger
    version's p20 is above the older one's p80 (the latest row per series and version)."""
    latest: dict[tuple[tuple[str, ...], str], dict[str, str]] = {}
    for commit, _ in commits():
        for r in csv_rows(version_bytes(commit)):
            key = (series(r), r["liger_version"])
            if key not in latest or r["timestamp"] > latest[key]["timestamp"]:
                latest[key] = r
    found: Counter[tuple[str, ...]] = Counter()
    for (s, old_version), old in latest.items():
        for (t, new_version), new in latest.items():
            newer = [int(x) for x in new_version.split(".")] > [
                int(x) for x in old_version.split(".")
            ]
            if s == t and newer and float(new["y_value_20"]) > float(old["y_value_80"]):
                found[(s[0], s[1], s[2], old_version, new_version)] += 1
    return +found


def index_states(
    settings: Any, ours: dict[str, str]
) -> dict[tuple[str, ...], tuple[tuple[str, ...] | None, bool]]:
    """The index's runs, each named by its CSV row (through its lineage: any version's line).
    `ours`: the repository's commits -> the Liger commit whose version each holds."""
    rows_of_snapshot = {
        digest: csv_rows(version_bytes(ours[commit]))
        for digest, commit in query(settings, "SELECT snapshot_digest, commit FROM snapshots")
    }
    row_of_run: dict[str, tuple[str, ...]] = {}
    for run, digest, line in query(
        settings, "SELECT run_digest, snapshot_digest, source_line FROM lineage"
    ):
        rid = row_id(rows_of_snapshot[digest][line - 2])
        assert row_of_run.setdefault(run, rid) == rid  # one run, one row content
    return {
        row_of_run[run]: (row_of_run[by] if by else None, retracted)
        for run, by, retracted in query(
            settings, "SELECT run_digest, superseded_by, retracted_in_source FROM runs"
        )
    }


def run_state(settings: Any) -> list[tuple[Any, ...]]:
    return query(
        settings,
        "SELECT run_digest, superseded_by, retracted_in_source FROM runs ORDER BY run_digest",
    )


# -- the tests ---------------------------------------------------------------------------------


def test_file_history_lists_the_committed_versions_oldest_first(
    liger_repo: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, ours = liger_repo
    history = file_history(repo, FILE)
    assert [v.commit.commit for v in history.versions] == list(ours)
    assert [v.commit.committed_at for v in history.versions] == [t for _, t in commits()]
    assert history.read(history.versions[0]) == version_bytes(commits()[0][0])
    # A path in the working tree names the same file; a rename is followed.
    assert file_history(repo, repo / FILE).versions == history.versions
    git(repo, "mv", FILE, "benchmark/data/renamed.csv")
    git(repo, "commit", "-q", "-m", "rename")
    renamed = file_history(repo, "benchmark/data/renamed.csv")
    assert [v.path for v in renamed.versions] == [FILE] * 4 + ["benchmark/data/renamed.csv"]
    with pytest.raises(GitHistoryError, match="never committed"):
        file_history(repo, "nothing.csv")
    with pytest.raises(GitHistoryError, match="not a git repository"):
        file_history(tmp_path, "x.csv")


def test_ingest_git_brings_in_the_whole_history_run_by_run(
    s3_store: Any,
    index_settings: Any,
    liger_repo: tuple[Path, dict[str, str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    repo, ours = liger_repo
    assert main(["ingest", "--git", str(repo), FILE, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.count(f"{KEY}: commit ") == 4

    # Each version carries its commit and commit time, as object metadata and in `snapshots`.
    snapshots = query(
        index_settings, "SELECT commit, committed_at, source_key FROM snapshots ORDER BY 2"
    )
    assert [(c, t, k) for c, t, k in snapshots] == [
        (c, t, KEY) for c, t in zip(ours, [t for _, t in commits()], strict=True)
    ]
    head = s3_store.head(KEY)
    assert SourceCommit.from_metadata(head.metadata) == SourceCommit(
        list(ours)[-1], commits()[-1][1]
    )

    expected = expected_states()
    assert index_states(index_settings, ours) == expected
    # The history has both kinds: re-measured rows (jsd, fused_linear_cross_entropy) and rows
    # removed by hand (kto_loss on A100).
    assert sum(1 for by, _ in expected.values() if by) == 60
    assert sum(1 for _, retracted in expected.values() if retracted) == 30

    regressions = Counter(
        tuple(r)
        for r in query(
            index_settings,
            "SELECT kernel, provider, mode, old_version, new_version FROM version_changes "
            "WHERE regressed",
        )
    )
    assert regressions == expected_regressions()
    assert sum(regressions.values()) > 0

    # A late re-upload of the oldest commit is not the newest version: nothing changes.
    before = run_state(index_settings)
    oldest = file_history(repo, FILE).versions[0]
    data = version_bytes(ours[oldest.commit.commit])
    snapshot = put_by_snapshot(
        s3_store, index_settings, Path(FILE), data, content_digest(data), KEY, oldest.commit
    ).snapshot
    process_snapshot(s3_store, index_settings, snapshot)
    publish_index(s3_store, index_settings)
    assert run_state(index_settings) == before


def test_versions_uploaded_in_any_order_are_judged_by_commit_time(
    s3_store: Any, index_settings: Any, liger_repo: tuple[Path, dict[str, str]]
) -> None:
    repo, ours = liger_repo
    history = file_history(repo, FILE)
    for version in reversed(history.versions):  # newest first: upload order is not history
        data = history.read(version)
        snapshot = put_by_snapshot(
            s3_store, index_settings, Path(FILE), data, content_digest(data), KEY, version.commit
        ).snapshot
        process_snapshot(s3_store, index_settings, snapshot)
    publish_index(s3_store, index_settings)
    assert index_states(index_settings, ours) == expected_states()


def test_put_git_uploads_each_version_once_the_one_before_was_read(
    s3_store: Any,
    index_settings: Any,
    liger_repo: tuple[Path, dict[str, str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    repo, ours = liger_repo
    stop = threading.Event()

    def reader() -> None:  # what the sensor's runs do: read whatever the key holds now
        while not stop.is_set():
            if s3_store.head(KEY) is not None:
                take_snapshot(s3_store, index_settings, KEY)
            stop.wait(0.1)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        assert main(["put", "--git", str(repo), FILE, "--wait", "30"]) == 0
    finally:
        stop.set()
        thread.join()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\tcommit ")[1][:12] for line in lines] == [c[:12] for c in ours]
    take_snapshot(s3_store, index_settings, KEY)  # the last one stays: no need to wait for it
    reads = list_reads(s3_store, index_settings, KEY)
    assert sorted(r.commit for r in reads) == sorted(ours)  # every version was read


def test_put_git_says_when_nothing_reads_the_versions(
    s3_store: Any,
    liger_repo: tuple[Path, dict[str, str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    repo, _ = liger_repo
    assert main(["put", "--git", str(repo), FILE, "--wait", "0.5"]) == 1
    err = capsys.readouterr().err.strip()
    assert "was not read within 0.5 s" in err and "kindex ingest --git" in err
    assert len(err.splitlines()) == 1
    assert main(["put", "--git", str(repo), FILE, "--key", "index/CURRENT"]) == 2
    assert main(["put", "--git", str(repo), "missing.csv"]) == 2
    assert main(["ingest", "--git", str(repo), FILE, "--key", "index/CURRENT"]) == 2
    assert main(["ingest", str(repo / FILE), "--key", KEY]) == 2  # --key goes with --git
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 4 and all(e.startswith("kindex ") for e in errors)
    assert list(s3_store.list("index/")) == []
