"""`kindex backfill`: its GraphQL documents are valid against this Dagster's schema."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from graphql import parse, validate
from index_support import (
    NEW_GPU,
    add_new_gpu,
    csv_bytes,
    curation,
    drop_and_process,
    index_settings,
    liger_rows,
)
from process_support import free_port

from pipelines.commands import backfill
from pipelines.index.publish import publish_index

__all__ = ["curation", "index_settings"]  # the fixtures, imported for pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "document",
    [
        backfill.JOB_LOCATION_QUERY,
        backfill.LAUNCH_MUTATION,
        backfill.LAUNCH_BACKFILL_MUTATION,
        backfill.BACKFILL_STATUS_QUERY,
        backfill.STATUS_QUERY,
    ],
)
def test_graphql_documents_validate_against_dagster_schema(document: str) -> None:
    from dagster_graphql.schema import create_schema

    errors = validate(create_schema().graphql_schema, parse(document))
    assert errors == []


def test_cli_registers_backfill_and_up() -> None:
    from pipelines.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["backfill", "incoming/*.csv", "--quarantined", "--wait"])
    assert (args.glob, args.quarantined, args.wait) == ("incoming/*.csv", True, True)
    assert parser.parse_args(["up", "--port", "3456"]).port == 3456


# -- finding the instance -----------------------------------------------------------------------


def test_url_accepts_the_base_or_the_graphql_endpoint() -> None:
    for url in ("http://127.0.0.1:3111", "http://127.0.0.1:3111/", "http://127.0.0.1:3111/graphql"):
        assert backfill.graphql_url(url) == "http://127.0.0.1:3111/graphql"


def test_without_up_json_or_url_it_says_how_to_find_the_instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipelines.cli import main

    monkeypatch.setenv("KINDEX_HOME", str(tmp_path))
    assert main(["backfill", "incoming/*"]) == 2
    err = capsys.readouterr().err
    assert "no running `kindex up`" in err and "--url" in err and "Traceback" not in err
    # a file left by a `kindex up` that is gone
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "up.json").write_text(json.dumps({"url": "http://127.0.0.1:1", "pid": dead.pid}))
    assert main(["backfill", "incoming/*"]) == 2
    assert f"(pid {dead.pid}, http://127.0.0.1:1)" in capsys.readouterr().err


@pytest.fixture
def webserver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real Dagster webserver over kindex's definitions, on its own instance (no daemon: a
    backfill is launched and recorded, not run)."""
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
    port = free_port()
    log = (tmp_path / "webserver.log").open("wb")
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("dagster-webserver")), "-m", "definitions"]
        + ["-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT,
        env=dict(os.environ),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert process.poll() is None, (tmp_path / "webserver.log").read_text()
            assert time.monotonic() < deadline, "the webserver did not start"
            try:
                backfill.job_selector(backfill.graphql_url(url))
                break
            except (OSError, backfill.GraphQLError):
                time.sleep(1)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@pytest.mark.slow
def test_backfill_chooses_files_through_the_ledger_and_launches_the_job(
    s3_store: Any, webserver: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """10,000 files in the ledger, three of them with quarantined rows: the glob and
    --quarantined choose through the ledger, and the launched run carries the choice."""
    from dagster import DagsterInstance

    from pipelines.cli import main
    from pipelines.intake.ledger import FileEntry, FileState, Ledger
    from pipelines.settings import Settings
    from pipelines.storage.base import ObjectInfo

    at = datetime(2026, 12, 1, 12, tzinfo=UTC)
    entries = [
        replace(
            FileEntry.pending(
                s3_store.bucket, ObjectInfo(f"incoming/file-{i:05d}.csv", f"{i:032x}", 10, at)
            ),
            state=FileState.INDEXED,
            runs=1,
            quarantined=3 if i in (17, 5_000, 9_999) else 0,
        )
        for i in range(10_000)
    ]
    Ledger.of(s3_store, Settings.from_env()).append(entries)
    home = Path(os.environ["KINDEX_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    # what `kindex up` writes; the pid is a live process
    (home / "up.json").write_text(json.dumps({"url": webserver, "pid": os.getpid()}))

    assert main(["backfill", "incoming/*", "--quarantined"]) == 0
    out, err = capsys.readouterr()
    assert "3 files" in err, err
    assert main(["backfill", "incoming/file-0*"]) == 0
    out, err = capsys.readouterr()
    assert "10000 files" in err, err
    assert main(["backfill", "incoming/nothing*"]) == 1
    with DagsterInstance.get() as instance:
        run = instance.get_run_by_id(out.strip())
        assert run is not None and run.job_name == "reprocess_files"
        assert run.run_config == backfill.reprocess_config(["incoming/file-0*"], False)


# -- choosing the files that hold uncurated runs -------------------------------------------------


def test_uncurated_chooses_the_files_whose_runs_are_uncurated(
    s3_store: Any,
    index_settings: Any,
    curation: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two files ingested, one of them measured on a GPU the curation lacks (under a key that
    is no glob of itself): --uncurated launches the job with that key alone; once the curation
    grew and the file was processed again, no file is left to choose."""
    from pipelines.cli import main
    from pipelines.intake.ledger import Ledger

    header, rows = liger_rows([1836, 1843])
    moved = [list(r) for r in rows]
    for r in moved:
        r[header.index("gpu_name")] = NEW_GPU
    known, new = tmp_path / "known.csv", tmp_path / "new gpu [1].csv"
    known.write_bytes(csv_bytes(header, rows))
    new.write_bytes(csv_bytes(header, moved))
    assert main(["ingest", str(known), str(new)]) == 0
    launched: list[list[str]] = []

    def launch(url: str, patterns: list[str], quarantined: bool) -> str:
        launched.append(patterns)
        return "run-id"

    monkeypatch.setattr(backfill, "launch_reprocess", launch)
    url = ["--url", "http://127.0.0.1:1"]
    assert main(["backfill", "--uncurated", *url]) == 0
    assert "1 files" in capsys.readouterr().err
    assert launched == [[glob.escape("incoming/new gpu [1].csv")]]
    # The job chooses through the ledger by these globs: the one key.
    chosen = Ledger.of(s3_store, index_settings).select(patterns=launched[0])
    assert [e.key for e in chosen] == ["incoming/new gpu [1].csv"]
    assert main(["backfill", "incoming/known*", "--uncurated", *url]) == 1

    add_new_gpu(curation)
    drop_and_process(s3_store, index_settings, "incoming/new gpu [1].csv", new.read_bytes())
    publish_index(s3_store, index_settings)
    assert main(["backfill", "--uncurated", *url]) == 1
    assert "no file matches" in capsys.readouterr().err
    assert len(launched) == 1
