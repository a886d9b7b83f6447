"""The embedded SeaweedFS: starts on loopback, keeps data across restarts, stops by PID."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from pipelines.settings import Settings
from pipelines.storage.embedded import (
    EmbeddedS3,
    EmbeddedS3Error,
    PortPlan,
    busy_ports,
    find_free_port_block,
    running_server,
    s3_answers,
    start_on_free_ports,
)
from pipelines.storage.s3 import S3Store, store_session


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_session_server_answers_on_loopback_only(embedded_s3: EmbeddedS3) -> None:
    assert embedded_s3.is_running() and s3_answers(embedded_s3.endpoint_url)
    assert embedded_s3.port in busy_ports(PortPlan(embedded_s3.port).ports())
    outside = _non_loopback_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback address to probe")
    with socket.socket() as probe:
        probe.settimeout(1)
        assert probe.connect_ex((outside, embedded_s3.port)) != 0


def test_identity_files_are_private(embedded_s3: EmbeddedS3) -> None:
    for path in (embedded_s3.credentials_path, embedded_s3.config_path):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert embedded_s3.credentials.secret_key not in repr(embedded_s3.credentials)
    assert embedded_s3.credentials.secret_key not in embedded_s3.log_tail(1000)


def test_restart_keeps_data_and_identity(tmp_path: Path) -> None:
    server = start_on_free_ports(tmp_path / "home")
    try:
        store = S3Store("persist", endpoint_url=server.endpoint_url, credentials=server.credentials)
        store.ensure_bucket()
        store.put_bytes("kept.bin", b"survives a restart")
        pid, access_key = server.pid, server.credentials.access_key
        assert running_server(server.home) is not None
    finally:
        server.stop()
    assert pid is not None and not _pid_alive(pid)
    assert not s3_answers(server.endpoint_url)
    assert running_server(server.home) is None and not server.state_path.exists()

    restarted = EmbeddedS3(server.home, port=server.port)
    if busy_ports(PortPlan(server.port).ports()):
        restarted = EmbeddedS3(server.home, port=find_free_port_block())
    with restarted:
        assert restarted.credentials.access_key == access_key
        store = S3Store(
            "persist", endpoint_url=restarted.endpoint_url, credentials=restarted.credentials
        )
        assert store.get_bytes("kept.bin") == b"survives a restart"
    assert (tmp_path / "home" / "logs" / "s3.log").stat().st_size > 0


def test_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    port = find_free_port_block()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port + 2))
        squatter.listen()
        with pytest.raises(EmbeddedS3Error, match=f"ports {port + 2} are in use"):
            EmbeddedS3(tmp_path, port=port).start()


def test_store_session_starts_or_attaches(tmp_path: Path, embedded_s3: EmbeddedS3) -> None:
    # Attaches: a server for this home already runs (as under `kindex up`) and keeps running.
    settings = Settings(home=embedded_s3.home, s3_port=embedded_s3.port, bucket="attached")
    with store_session(settings) as store:
        store.put_bytes("k", b"v")
    assert embedded_s3.is_running()

    # Starts one for an empty home, on the configured port, and stops it on exit.
    fresh = Settings(home=tmp_path / "fresh", s3_port=find_free_port_block(), bucket="kindex")
    with store_session(fresh) as store:
        store.put_bytes("incoming/x", b"x")
        running = running_server(fresh.home)
        assert running is not None and running.port == fresh.s3_port
    assert not _pid_alive(running.pid)
    assert stat.S_IMODE(fresh.credentials_path.stat().st_mode) == 0o600


def test_embedded_settings_refuse_an_endpoint(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, s3_endpoint="http://127.0.0.1:9")
    with pytest.raises(EmbeddedS3Error, match="KINDEX_S3_ENDPOINT"):
        EmbeddedS3.from_settings(settings)


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        try:
            udp.connect(("192.0.2.1", 9))  # no packet is sent; picks the outgoing interface
            address = str(udp.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address
