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


FORMATS = Path(__file__).parent / "data" / "formats"


def kindex_in(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    import os

    command = [sys.executable, "-m", "pipelines.cli", *args]
    env = {**os.environ, "KINDEX_HOME": str(home)}
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, check=False, env=env
    )


def test_several_files_resolve_flashinfer_definitions_among_them(tmp_path: Path) -> None:
    traces = FORMATS / "flashinfer-trace" / "gemm_n128_k2048.traces.jsonl"
    definition = FORMATS / "flashinfer-trace" / "gemm_n128_k2048.definition.json"
    alone = kindex_in(tmp_path / "no-home", "normalize", str(traces))
    assert alone.returncode == 0, alone.stderr
    waiting = [json.loads(line) for line in alone.stdout.splitlines()]
    assert {line["reason"] for line in waiting} == {"awaiting_definition"}
    # each quarantined line carries its detail
    assert all(line["detail"] == "waits for definition gemm_n128_k2048" for line in waiting)
    both = kindex_in(tmp_path / "no-home", "normalize", str(traces), str(definition))
    assert both.returncode == 0, both.stderr
    lines = [json.loads(line) for line in both.stdout.splitlines()]
    assert [line["file"] for line in lines] == [str(traces)] * 25 + [str(definition)]
    statuses = [line["status"] for line in lines]
    assert statuses == ["ok"] * 26
    assert all(line["records"][0]["kind"] == "BenchmarkRun" for line in lines[:25])
    summary = kindex_in(
        tmp_path / "no-home", "normalize", "--summary", str(definition), str(traces)
    )
    assert "rows: 26" in summary.stdout and "quarantined: 0" in summary.stdout


def test_a_quarantined_harness_record_names_its_detail_and_pointer(tmp_path: Path) -> None:
    kernelbench = (
        FORMATS
        / "kernelbench"
        / "L40S_babel_level5_baseline_time_torch_compile_inductor_max-autotune.json"
    )  # noqa: E501
    result = kindex_in(tmp_path / "no-home", "normalize", str(kernelbench))
    assert result.returncode == 0, result.stderr
    first = json.loads(result.stdout.splitlines()[0])
    assert first["reason"] == "measurement_failed"
    assert first["pointer"] == "/level5/1_deepseekv3_MLA_1gpu.py"
    assert "failed" in first["detail"]


def test_an_unreadable_file_among_several_is_named_and_the_rest_still_read(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.json"
    garbage.write_text('{"level1": {"1_a.py": {"elapsed": 1}}}')
    tk = FORMATS / "kernelbench" / "tk_baseline_time.json"
    result = kindex_in(tmp_path / "no-home", "normalize", str(garbage), str(tk))
    assert result.returncode == 2
    assert "KernelBench timing JSON: no problem with a mean or num_trials" in result.stderr
    assert len(result.stdout.splitlines()) == 6
