"""The `kindex` command line as a person types it: its version, its home, its settings errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.settings import Settings, SettingsError, find_home, unknown_names

KINDEX = str(Path(sys.executable).with_name("kindex"))


def kindex(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KINDEX_", "AWS_"))}
    return subprocess.run(
        [KINDEX, *args], cwd=cwd, env={**base, **env}, capture_output=True, text=True, timeout=120
    )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("kindex ") and out.strip() != "kindex"


def test_home_is_found_like_git_finds_a_repository(tmp_path: Path) -> None:
    project = tmp_path / "project"
    deep = project / "a" / "b"
    deep.mkdir(parents=True)
    assert find_home(deep) == deep / ".kindex"  # none yet: ./.kindex
    (project / ".kindex").mkdir()
    assert find_home(deep) == project / ".kindex"
    assert find_home(project) == project / ".kindex"
    assert Settings.from_env({"KINDEX_HOME": str(tmp_path / "h")}).home == tmp_path / "h"


def test_a_query_from_a_subfolder_sees_the_same_index(tmp_path: Path) -> None:
    project = tmp_path / "project"
    sub = project / "notes" / "deeper"
    sub.mkdir(parents=True)
    count = ("query", "select count(*) as n from runs", "--format", "csv")
    first = kindex(*count, cwd=project, env={})
    assert (first.returncode, first.stdout) == (0, "n\n0\n"), first.stderr
    assert (project / ".kindex" / "index.duckdb").exists()
    again = kindex(*count, cwd=sub, env={})
    assert (again.returncode, again.stdout) == (0, "n\n0\n"), again.stderr
    assert not (sub / ".kindex").exists()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("KINDEX_S3_ENDPOINT", "127.0.0.1:9000"),
        ("KINDEX_S3_ENDPOINT", "http://127.0.0.1:99999"),
        ("KINDEX_S3_ENDPOINT", "ftp://example.com"),
        ("KINDEX_S3_PORT", "abc"),
        ("KINDEX_S3_PATH_STYLE", "maybe"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_variable(
    tmp_path: Path,
    name: str,
    value: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value, "KINDEX_HOME": str(tmp_path)})
    # `kindex query` in this process (the installed command: the test below)
    for variable in [v for v in os.environ if v.startswith(("KINDEX_", "AWS_"))]:
        monkeypatch.delenv(variable)
    monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    assert main(["query", "select 1"]) == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith(f"kindex: {name}=") and len(stderr.splitlines()) == 1
    assert "Traceback" not in stderr


def test_the_kindex_command_says_a_bad_setting_in_one_line(tmp_path: Path) -> None:
    result = kindex("query", "select 1", cwd=tmp_path, env={"KINDEX_S3_PORT": "abc"})
    assert result.returncode == 2
    assert result.stderr.startswith("kindex: KINDEX_S3_PORT=")
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr


def test_an_unknown_kindex_variable_gets_a_warning_naming_the_closest(tmp_path: Path) -> None:
    warnings = list(unknown_names({"KINDEX_S3_BUCKET": "x", "KINDEX_HOME": "h", "PATH": "/"}))
    assert warnings == [
        "KINDEX_S3_BUCKET is not a kindex setting, and is ignored; did you mean KINDEX_BUCKET?"
    ]
    result = kindex("query", "select 1", cwd=tmp_path, env={"KINDEX_S3_BUCKET": "x"})
    assert result.returncode == 0
    assert "KINDEX_S3_BUCKET" in result.stderr and "KINDEX_BUCKET?" in result.stderr


def test_boto3s_region_and_endpoint_variables_count_and_aws_can_be_named(tmp_path: Path) -> None:
    home = {"KINDEX_HOME": str(tmp_path)}
    settings = Settings.from_env({**home, "AWS_REGION": "eu-central-1"})
    assert settings.s3_region == "eu-central-1" and settings.embedded
    settings = Settings.from_env({**home, "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000"})
    assert settings.endpoint_url == "http://127.0.0.1:9000" and not settings.embedded
    settings = Settings.from_env(
        {**home, "KINDEX_S3_ENDPOINT": "aws", "KINDEX_S3_REGION": "eu-west-1"}
    )
    assert settings.endpoint_url == "https://s3.eu-west-1.amazonaws.com"
    assert not settings.s3_path_style and not settings.embedded
    settings = Settings.from_env(
        {**home, "KINDEX_S3_ENDPOINT": "https://minio:9000", "AWS_ENDPOINT_URL_S3": "http://x"}
    )
    assert settings.endpoint_url == "https://minio:9000" and settings.s3_path_style


FAKE_PYTHON = """#!/usr/bin/env bash
# A stand-in interpreter: makes a venv of itself, and talks like pip and setuptools do.
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; exit 0; fi
if [ "$1 $2" = "-m pip" ]; then
  echo "BuildBackendWarning: project.license as a TOML table is deprecated" >&2
  echo "Successfully installed kindex"; exit 0
fi
echo "ran: $*"
"""


def test_dev_setup_keeps_pips_noise_in_a_log(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    for name in ("dev", "pyproject.toml"):
        (tmp_path / name).write_bytes((root / name).read_bytes())
    (tmp_path / "dev").chmod(0o755)
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    result = subprocess.run(
        ["./dev", "test", "-q"],
        cwd=tmp_path,
        env={**os.environ, "PYTHON": str(fake)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ran: -m pytest -n auto --dist worksteal -q\n"
    assert "Warning" not in result.stderr and len(result.stderr.splitlines()) == 1
    assert "BuildBackendWarning" in (tmp_path / ".venv" / "install.log").read_text()
    full = subprocess.run(
        ["./dev", "test", "--full", "-q"],
        cwd=tmp_path,
        env={**os.environ, "PYTHON": str(fake)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert full.returncode == 0, full.stderr
    assert full.stdout == (
        "ran: -m pytest -n auto --dist worksteal -q\nran: -m pytest -m slow -q\n"
    )


def test_the_license_is_an_spdx_string_as_setuptools_wants() -> None:
    import tomllib

    root = Path(__file__).resolve().parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in project["build-system"]["requires"]


def test_the_default_run_leaves_out_the_slow_tests_and_full_runs_them() -> None:
    """`./dev test` runs the default set; `--full` (what CI runs) adds the tests marked slow."""
    root = Path(__file__).resolve().parent.parent

    def collected(*args: str) -> list[str]:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:xdist", *args],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode in (0, 5), result.stdout + result.stderr
        return [line for line in result.stdout.splitlines() if "::" in line]

    target = "tests/test_burst_e2e.py"  # every test of it is marked slow
    assert collected(target) == []
    assert collected("--full", target) and collected("-m", "slow", target)
