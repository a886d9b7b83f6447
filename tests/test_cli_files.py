"""`kindex ingest` and `kindex bundle validate` on files that are not what they should be."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bundle_support import MISSING_DIGEST, ten_run_bundle, yaml_bytes

from pipelines.cli import main

LIGER_CSV = Path(__file__).parent / "data" / "liger" / "all_benchmark_data.csv"


def test_validate_prints_each_pointer_once_and_claims_no_index_it_did_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # no kindex home here
    monkeypatch.delenv("KINDEX_HOME", raising=False)
    bundle = tmp_path / "bundle.yaml"
    bundle.write_bytes(yaml_bytes(ten_run_bundle()))
    assert main(["bundle", "validate", str(bundle)]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 2
    for line in lines:
        pointer = line.split(": ")[1]
        assert pointer.startswith("/runs/") and line.count(pointer) == 1, line
    assert MISSING_DIGEST in lines[0] and "index" not in out
    assert "8 run(s)" in err and "the bundle only" in err
    assert not (tmp_path / ".kindex").exists()


def test_validate_says_what_a_file_that_is_no_bundle_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KINDEX_HOME", str(tmp_path / "none"))
    notes = tmp_path / "README.md"
    notes.write_text("# Notes\n\n--------  ----\nsome: text: here\n")
    assert main(["bundle", "validate", str(LIGER_CSV), str(notes)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{LIGER_CSV}: a Liger CSV, not a bundle: drop it as it is " + (
        "(`kindex normalize FILE` checks it)"
    )
    assert out[1].startswith(f"{notes}:4: not a bundle: yaml_syntax: ")
    text = tmp_path / "notes.txt"
    text.write_text("just words\n")
    assert main(["bundle", "validate", str(text)]) == 1
    assert "not a bundle" in capsys.readouterr().out


@pytest.mark.slow
def test_ingest_of_a_file_that_yields_no_run_says_so_and_fails(
    s3_store: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "NOTES.txt"
    notes.write_text("nothing any source reads\n")
    assert main(["ingest", "--no-progress", str(notes)]) == 1
    out, err = capsys.readouterr()
    assert "incoming/NOTES.txt yielded no run (1 rows; quarantined: unrecognized_format 1)" in err
    digest = err.split("kept in snapshot ")[1].split()[0]
    assert s3_store.get_bytes(f"snapshots/sha256/{digest.removeprefix('sha256:')}") == (
        notes.read_bytes()
    )
    assert main(["query", "select reason from quarantine", "--format", "csv"]) == 0
    assert capsys.readouterr().out == "reason\nunrecognized_format\n"
