"""The engines a team scales out to read the index of a real `kindex up` home, each with the
program `kindex connect --engine` prints for it: Polars and Daft through the catalog, Daft on a
local Ray cluster too, ClickHouse (chdb) from the bucket. Each gives the same row counts of every
stored table and the same sum of `median` as `kindex query`.

The engines come with the `engines` extra, which `./dev test --full` installs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from process_support import KindexUp, free_port
from test_up_e2e import LIGER_CSV, LIGER_RUNS, check_harness_files_land, wait_until

from pipelines.index.catalog import (
    VERSIONS_TABLE,
    IndexCatalog,
    files_without_field_ids,
    s3_access,
)
from pipelines.index.tables import STORED_TABLES
from pipelines.intake.ledger import LEDGER_TABLE
from pipelines.settings import Settings
from pipelines.storage.embedded import find_free_port_block

pytestmark = pytest.mark.slow

ENGINE_TIMEOUT = 600  # slow, shared machines: generous, never asserted as a speed
RESULT = "KINDEX-RESULT "

# What each test appends to the printed program: every table's rows, and the runs' sum of
# `median`, as one JSON line (the program defines `tables`).
POLARS_COUNTS = """
import json
out = {name: {"rows": frame.select(pl.len()).collect().item()} for name, frame in tables.items()}
runs = tables["run_segments"]
out["run_segments"]["median"] = runs.select(pl.col("median").sum()).collect().item()
print("KINDEX-RESULT " + json.dumps(out))
"""
DAFT_COUNTS = """
import json
out = {name: {"rows": frame.count_rows()} for name, frame in tables.items()}
out["run_segments"]["median"] = tables["run_segments"].sum("median").to_pydict()["median"][0]
out["runner"] = daft.get_or_create_runner().name
print("KINDEX-RESULT " + json.dumps(out))
"""
CLICKHOUSE_COUNTS = """
import json
def scalar(sql):
    return int(str(con.query(sql, "CSV")).strip())
out = {name: {"rows": scalar(f"SELECT count() FROM {name}")} for name in tables}
out["run_segments"]["median"] = scalar("SELECT sum(median) FROM run_segments")
print("KINDEX-RESULT " + json.dumps(out))
"""
# A local Ray cluster on a shared 2-core machine: one CPU, a bounded object store, no dashboard,
# on 127.0.0.1; shut down when the program ends.
RAY_START = """
import atexit
import ray
ray.init(
    num_cpus=1,
    object_store_memory=128 * 1024 * 1024,
    include_dashboard=False,
    _node_ip_address="127.0.0.1",
    _temp_dir={temp!r},
    configure_logging=False,
    log_to_driver=False,
)
atexit.register(ray.shutdown)
import daft
daft.set_runner_ray()
"""


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KindexUp]:
    """One `kindex up` with the shared Liger CSV and every harness sample indexed."""
    root = tmp_path_factory.mktemp("engines")
    up = KindexUp(root / "home", free_port(), find_free_port_block())
    try:
        up.start()
        put = up.kindex("put", str(LIGER_CSV))
        assert put.returncode == 0, put.stderr
        wait_until(up, "SELECT count(*) AS n FROM runs", LIGER_RUNS, "Liger runs indexed")
        check_harness_files_land(up)
        yield up
    finally:
        up.stop()


def expected(up: KindexUp) -> dict[str, dict[str, int]]:
    """`kindex query`'s answer (the catalog's current version): every stored table's rows, the
    runs' sum of `median`."""
    counts = " UNION ALL ".join(
        f"SELECT '{name}' AS name, count(*) AS n FROM {name}" for name in STORED_TABLES
    )
    result = up.kindex("query", counts, "--format", "json", "--sync")
    assert result.returncode == 0, result.stderr
    out = {row["name"]: {"rows": row["n"]} for row in json.loads(result.stdout)}
    result = up.kindex("query", "SELECT sum(median) AS s FROM run_segments", "--format", "json")
    assert result.returncode == 0, result.stderr
    out["run_segments"]["median"] = json.loads(result.stdout)[0]["s"]
    return out


def run_program(up: KindexUp, engine: str, suffix: str, prefix: str = "") -> dict[str, Any]:
    """`kindex connect --engine ENGINE`, run as printed (with `prefix` before and `suffix`
    after)."""
    printed = up.kindex("connect", "--engine", engine)
    assert printed.returncode == 0, printed.stderr
    return run_python(prefix + printed.stdout + suffix, up.env, up.home.parent)


def run_python(program: str, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """Run a program by this interpreter in a process group of its own, killed whole when it
    ends; the JSON of its result line."""
    env = env | {"RAY_USAGE_STATS_ENABLED": "0", "POLARS_ICEBERG_PLANNER": "pyiceberg"}
    process = subprocess.Popen(
        [sys.executable, "-c", program],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=ENGINE_TIMEOUT)
    finally:
        # Whatever it started (a Ray cluster's processes) goes with it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, err[-4000:]
    lines = [line for line in out.splitlines() if line.startswith(RESULT)]
    assert lines, out[-4000:] + err[-4000:]
    assert "kernel" in out.split(RESULT)[0]  # the program's own example printed its table
    return dict(json.loads(lines[-1].removeprefix(RESULT)))


def stored(result: dict[str, Any]) -> dict[str, Any]:
    """An engine's answer for the stored tables (a table never written is absent: 0 rows)."""
    return {name: result.get(name, {"rows": 0}) for name in STORED_TABLES}


def test_polars_reads_what_kindex_query_reads(indexed: KindexUp) -> None:
    want = expected(indexed)
    assert want["run_segments"]["rows"] > LIGER_RUNS
    got = run_program(indexed, "polars", POLARS_COUNTS)
    print(f"\nkindex query: {want}\npolars: {got}")
    assert stored(got) == want


def test_daft_reads_what_kindex_query_reads_locally_and_on_ray(indexed: KindexUp) -> None:
    want = expected(indexed)
    local = run_program(indexed, "daft", DAFT_COUNTS)
    assert local["runner"] == "native"
    assert stored(local) == want
    temp = tempfile.mkdtemp(prefix="kx-ray-", dir="/tmp")  # short: Ray's socket paths
    try:
        on_ray = run_program(indexed, "daft", DAFT_COUNTS, RAY_START.format(temp=temp))
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    print(f"\ndaft native: {local}\ndaft on ray: {on_ray}")
    assert on_ray["runner"] == "ray"
    assert stored(on_ray) == stored(local)


def test_clickhouse_reads_what_kindex_query_reads(indexed: KindexUp) -> None:
    want = expected(indexed)
    got = run_program(indexed, "clickhouse", CLICKHOUSE_COUNTS)
    print(f"\nclickhouse: {got}")
    assert stored(got) == want


def test_no_table_of_the_home_holds_a_file_without_field_ids(
    indexed: KindexUp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every manifest of every table kindex up wrote, the file ledger's included."""
    for variable in ("KINDEX_HOME", "KINDEX_S3_PORT"):
        monkeypatch.setenv(variable, indexed.env[variable])
    settings = Settings.from_env()
    catalog = IndexCatalog(settings, s3_access(settings))
    checked = 0
    for name in (*STORED_TABLES, VERSIONS_TABLE, LEDGER_TABLE):
        table = catalog.table(name)
        assert files_without_field_ids(table) == [], name
        checked += sum(1 for _ in table.snapshots())
    assert checked > len(STORED_TABLES)
