"""`kindex normalize` as a user runs it: a real subprocess, the JSON-lines contract on stdout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from liger_support import HEADER, LIGER_CSV, RECORD_ORDER, csv_lines

KINDS = {
    "run": "BenchmarkRun",
    "operation": "OperationSpec",
    "project": "SoftwareProject",
    "implementation": "ImplementationRevision",
    "workload": "WorkloadCase",
    "protocol": "BenchmarkProtocol",
    "environment": "ExecutionEnvironment",
}


def kindex(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pipelines.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_json_lines_contract(tmp_path: Path) -> None:
    rows = csv_lines([2212, 1843])
    sample = tmp_path / "sample.csv"
    sample.write_text("\n".join([HEADER, rows[0], "garbage,row", rows[1]]) + "\n")
    result = kindex("normalize", str(sample))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["source_line"] for line in lines] == [2, 3, 4]
    assert [line["status"] for line in lines] == ["ok", "quarantined", "ok"]
    assert [line["reason"] for line in lines] == [None, "wrong_column_count", None]
    assert lines[1]["records"] == []
    for line in (lines[0], lines[2]):
        assert set(line) == {"source_line", "status", "reason", "records"}
        assert [r["kind"] for r in line["records"]] == [KINDS[k] for k in RECORD_ORDER]
        run = line["records"][0]["manifest"]["spec"]
        digests = {r["kind"]: r["digest"] for r in line["records"]}
        assert run["workloadDigest"] == digests["WorkloadCase"]
        assert run["environmentDigest"] == digests["ExecutionEnvironment"]
    assert lines[0]["records"][0]["manifest"]["spec"]["observedAt"] == "2026-05-27T17:14:30.000Z"


def test_summary_of_the_shared_csv() -> None:
    result = kindex("normalize", "--summary", str(LIGER_CSV))
    assert result.returncode == 0, result.stderr
    assert "rows: 2448" in result.stdout
    assert "latency runs: 1649, memory runs: 799" in result.stdout
    assert "quarantined: 0" in result.stdout


def test_not_a_liger_csv_is_a_clear_error_without_traceback(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 40)
    result = kindex("normalize", str(garbage))
    assert result.returncode == 2
    assert "no source recognizes it" in result.stderr and "Liger" in result.stderr
    assert "Traceback" not in result.stderr
    missing = kindex("normalize", str(tmp_path / "absent.csv"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
