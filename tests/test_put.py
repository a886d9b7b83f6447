"""`kindex put` against a configured endpoint and against the embedded server it starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.storage.embedded import EmbeddedS3, find_free_port_block, running_server
from pipelines.storage.s3 import EMBEDDED_RECONNECT_SECONDS, S3Store


def test_put_uploads_to_incoming(
    s3_store: S3Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "a.csv", tmp_path / "b.yaml"
    first.write_bytes(b"kernel,value\njsd,1\n")
    second.write_bytes(b"runs: []\n")
    assert main(["put", str(first), str(second)]) == 0

    lines = capsys.readouterr().out.splitlines()
    for path, line in zip((first, second), lines, strict=True):
        info = s3_store.head(f"incoming/{path.name}")
        assert info is not None
        url = f"s3://{s3_store.bucket}/incoming/{path.name}"
        assert line == f"{url}\t{info.size} bytes\tETag {info.etag}"
        assert s3_store.get_bytes(info.key) == path.read_bytes()


def test_put_to_a_chosen_key(s3_store: S3Store, tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    path.write_bytes(b"x")
    assert main(["put", str(path), "--key", "incoming/team/2026-05.csv"]) == 0
    assert s3_store.get_bytes("incoming/team/2026-05.csv") == b"x"
    assert s3_store.head("incoming/results.csv") is None


def test_put_usage_errors(
    s3_store: S3Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes(b"x")
    assert main(["put", str(path), str(path), "--key", "k"]) == 2
    assert main(["put", str(tmp_path / "missing.csv")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert list(s3_store.list("")) == []


def test_put_reports_an_unreachable_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = f"http://127.0.0.1:{find_free_port_block()}"
    monkeypatch.setenv("KINDEX_S3_ENDPOINT", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "KXNOBODY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-never-shown")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    path = tmp_path / "a.csv"
    path.write_bytes(b"x")
    assert main(["put", str(path)]) == 1
    err = capsys.readouterr().err
    assert endpoint in err and "secret-never-shown" not in err


def test_put_starts_and_stops_the_embedded_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home, port = tmp_path / "home", find_free_port_block()
    monkeypatch.delenv("KINDEX_S3_ENDPOINT", raising=False)
    monkeypatch.setenv("KINDEX_HOME", str(home))
    monkeypatch.setenv("KINDEX_S3_PORT", str(port))
    path = tmp_path / "a.csv"
    path.write_bytes(b"kept in the home")
    assert main(["put", str(path)]) == 0
    assert "s3://kindex/incoming/a.csv" in capsys.readouterr().out
    assert running_server(home) is None  # stopped on exit

    with EmbeddedS3(home, port=port) as server:
        # As the product's store of an embedded server waits (`S3Store.from_settings`): a
        # restarted gateway answers 5xx until its volumes have registered again.
        store = S3Store(
            "kindex",
            endpoint_url=server.endpoint_url,
            credentials=server.credentials,
            reconnect_seconds=EMBEDDED_RECONNECT_SECONDS,
        )
        assert store.get_bytes("incoming/a.csv") == b"kept in the home"


@pytest.mark.parametrize(
    "key",
    [
        "index/CURRENT",  # the index pointer: every later query would fail
        "snapshots/sha256/" + "0" * 64,
        "incoming/",
        "incoming/../index/CURRENT",
        "incoming//a.csv",
        "incoming/" + "x" * 1100,  # over S3's 1,024 bytes
        "",
    ],
)
def test_put_key_outside_incoming_or_not_a_plain_object_is_refused(
    s3_store: S3Store, tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes(b"x")
    assert main(["put", str(path), "--key", key]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kindex put: ") and len(err.strip().splitlines()) == 1
    assert list(s3_store.list("")) == []


def test_put_onto_the_index_tables_leaves_the_index_readable(
    s3_store: S3Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--key` onto an Iceberg metadata file of the index is refused and changes nothing."""
    from pipelines.index.catalog import VERSIONS_TABLE, IndexCatalog
    from pipelines.settings import Settings

    path = tmp_path / "a.csv"
    lines = (Path(__file__).parent / "data/liger/all_benchmark_data.csv").read_text().splitlines()
    path.write_text("\n".join(lines[:20]) + "\n")
    assert main(["ingest", str(path), "--no-progress"]) == 0
    location = IndexCatalog.beside(s3_store, Settings.from_env()).metadata_locations()
    metadata_key = location[VERSIONS_TABLE].removeprefix(f"s3://{s3_store.bucket}/")
    metadata = s3_store.get_bytes(metadata_key)
    assert main(["put", str(path), "--key", metadata_key]) == 2
    assert s3_store.get_bytes(metadata_key) == metadata
    capsys.readouterr()
    assert main(["query", "SELECT count(*) AS runs FROM runs", "--format", "csv", "--sync"]) == 0
    assert capsys.readouterr().out.split() == ["runs", "19"]


def test_a_key_s3_refuses_is_one_line_not_a_traceback(
    s3_store: S3Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes(b"x")
    assert main(["put", str(path), "--key", "incoming/a\x00b.csv"]) == 1  # SeaweedFS refuses NUL
    err = capsys.readouterr().err
    assert err.startswith("kindex put: the S3 endpoint") and "refused the key" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_put_git_with_no_kindex_up_says_what_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KINDEX_S3_ENDPOINT", raising=False)
    monkeypatch.setenv("KINDEX_HOME", str(tmp_path / "home"))
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.csv").write_text("x\n")
    for args in (["init", "-q"], ["add", "a.csv"], ["commit", "-qm", "a"]):
        subprocess.run(
            ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t.invalid", *args],
            check=True,
        )
    assert main(["put", "--git", str(repo), "a.csv"]) == 2
    err = capsys.readouterr().err
    assert "kindex ingest --git" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "home" / "s3").exists()  # no server was started for nothing
