"""`kindex backfill`: its GraphQL documents are valid against this Dagster's schema."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from graphql import parse, validate
from process_support import free_port

from pipelines.commands import backfill

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "document",
    [
        backfill.PARTITIONS_QUERY,
        backfill.MATERIALIZATIONS_QUERY,
        backfill.LAUNCH_MUTATION,
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
    monkeypatch.setenv("KINDEX_HOME", str(tmp_path / "home"))
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
                backfill.partition_keys(backfill.graphql_url(url))
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
def test_backfill_of_10000_files_found_through_up_json(
    webserver: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dagster import AssetMaterialization, DagsterInstance

    from pipelines.cli import main

    keys = [f"incoming/file-{i:05d}.csv@{i:08x}" for i in range(10_000)]
    quarantined = keys[17], keys[5_000], keys[9_999]
    with DagsterInstance.get() as instance:
        instance.add_dynamic_partitions("incoming_files", keys)
        for key in keys[:20] + keys[4_990:5_010] + [keys[-1]]:
            instance.report_runless_asset_event(
                AssetMaterialization(
                    "records",
                    partition=key,
                    metadata={"quarantined_rows": 3 if key in quarantined else 0},
                )
            )
    home = tmp_path / "home"
    home.mkdir()
    # what `kindex up` writes; the pid is a live process
    (home / "up.json").write_text(json.dumps({"url": webserver, "pid": os.getpid()}))

    assert main(["backfill", "incoming/*", "--quarantined"]) == 0
    out, err = capsys.readouterr()
    assert "3 files" in err, err
    assert main(["backfill", "incoming/*"]) == 0
    out, err = capsys.readouterr()
    assert "10000 files" in err, err
    status = backfill.backfill_status(backfill.graphql_url(webserver), out.strip())
    assert status == "REQUESTED"
