"""The embedded SeaweedFS: starts on loopback, keeps data across restarts, stops by PID."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import socket
import stat
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from pipelines.settings import Settings
from pipelines.storage.base import KeptCopy
from pipelines.storage.embedded import (
    ADMIN_GRPC_OFFSET,
    EmbeddedS3,
    EmbeddedS3Error,
    PortPlan,
    busy_ports,
    find_free_port_block,
    running_server,
    s3_accepts,
    s3_answers,
    start_on_free_ports,
)
from pipelines.storage.s3 import S3Store, store_session

LIGER_CSV = Path(__file__).resolve().parent / "data" / "liger" / "all_benchmark_data.csv"


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


def test_a_server_that_loses_its_port_to_another_is_not_taken_for_ready(
    embedded_s3: EmbeddedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ports free when checked can be taken before weed binds them (another test's server, a
    second `kindex up`). The server that answers then is not ours: its answer to anyone is a
    403, so readiness is our credentials accepted, and a start that lost its port fails."""
    late = EmbeddedS3(tmp_path / "late", port=embedded_s3.port, ready_timeout=20)
    assert s3_answers(late.endpoint_url)  # someone answers at the port: not enough
    assert s3_accepts(embedded_s3.endpoint_url, embedded_s3.credentials)
    assert not s3_accepts(late.endpoint_url, late.credentials)
    monkeypatch.setattr("pipelines.storage.embedded.busy_ports", lambda ports: [])  # the race
    with pytest.raises(EmbeddedS3Error):
        late.start()
    assert not late.is_running() and running_server(late.home) is None
    assert embedded_s3.is_running()


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


def test_objects_are_stored_encrypted_and_read_back_whole_and_in_ranges(
    embedded_s3: EmbeddedS3, s3_store: S3Store
) -> None:
    """Volume files hold ciphertext: a marker in bytes SeaweedFS stores as they are (random, so
    not gzipped) is nowhere in them. A CSV of several chunks (gzipped, then encrypted) reads back
    whole, in ranges across chunk boundaries, and copied."""
    marker = b"kindex-plaintext-marker-%s" % uuid.uuid4().hex.encode()
    s3_store.put("incoming/noise.bin", os.urandom(1 << 20) + marker + os.urandom(1 << 20))
    assert not any(marker in path.read_bytes() for path in embedded_s3.data_dir.rglob("*.dat"))

    data = b"".join(b"liger,%d,%d\n" % (i, i * 7919) for i in range(2_000_000))  # ~30 MB
    s3_store.put("incoming/big.csv", data, content_type="text/csv")
    info = s3_store.head("incoming/big.csv")
    assert info is not None and info.etag == hashlib.md5(data).hexdigest()
    assert s3_store.get_bytes("incoming/big.csv") == data
    for start in [0, (4 << 20) - 3, (8 << 20) - 1, (16 << 20) + 5, len(data) - 10]:
        end = min(start + (9 << 20), len(data) - 1)
        body = s3_store.client.get_object(
            Bucket=s3_store.bucket, Key="incoming/big.csv", Range=f"bytes={start}-{end}"
        )["Body"].read()
        assert body == data[start : end + 1]
    copied = s3_store.keep_copy(
        "incoming/big.csv", "snapshots/big.csv", etag=info.etag, size=info.size
    )
    assert copied is KeptCopy.COPIED
    assert s3_store.get_bytes("snapshots/big.csv") == data


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


# -- no anonymous access ------------------------------------------------------------------------


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on, from its sockets' inodes in /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


# An object's data is stored sealed: AES-GCM's nonce before it and its tag after.
SEALED_OVERHEAD = 12 + 16


def volume_file_id(data_dir: Path, data_size: int) -> str:
    """The SeaweedFS file id ("volume,needle-id+cookie") of a needle holding `data_size` bytes,
    found by walking the volumes' .dat files as an attacker on the host could (the bytes are
    encrypted). After the superblock, each needle is a header (cookie 4 bytes, id 8, body size
    4), its body (starting with the data's size, 4 bytes), a checksum (4) and a timestamp (8),
    padded to a multiple of 8 bytes."""
    for dat in data_dir.rglob("*.dat"):
        raw = dat.read_bytes()
        at = 8 + int.from_bytes(raw[6:8], "big")
        while at + 16 <= len(raw):
            cookie, needle = raw[at : at + 4], raw[at + 4 : at + 12]
            body = max(int.from_bytes(raw[at + 12 : at + 16], "big", signed=True), 0)
            if body and int.from_bytes(raw[at + 16 : at + 20], "big") == data_size:
                volume = dat.stem.rsplit("_", 1)[-1]
                return f"{volume},{int.from_bytes(needle, 'big'):x}{cookie.hex()}"
            length = 16 + body + 4 + 8
            at += length + 8 - length % 8
    raise AssertionError(f"no needle of {data_size} bytes in any volume")


def anonymous(method: str, url: str, data: bytes | None = None) -> tuple[int | None, bytes]:
    """One HTTP request without credentials; (None, b"") when no HTTP server answers."""
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=3) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except (urllib.error.URLError, OSError, http.client.HTTPException):
        return None, b""


# gRPC methods that answer anyone when the ports are open: the master's configuration, the
# filer's listing of "/" (every bucket), the volume server's status.
GRPC_PROBES = {
    3: ("/master_pb.Seaweed/GetMasterConfiguration", b""),
    7: ("/filer_pb.SeaweedFiler/ListEntries", b"\x0a\x01/"),  # directory: "/"
    5: ("/volume_server_pb.VolumeServer/VolumeServerStatus", b""),
}


def grpc_answers(port: int, method: str, request: bytes, ca: bytes | None = None) -> bool:
    """Whether a gRPC call without a client certificate gets an answer (plaintext, or TLS that
    trusts the server's authority)."""
    import grpc

    target = f"127.0.0.1:{port}"
    if ca is None:
        channel = grpc.insecure_channel(target)
    else:
        credentials = grpc.ssl_channel_credentials(root_certificates=ca)
        channel = grpc.secure_channel(target, credentials)
    with channel:
        try:
            list(channel.unary_stream(method)(request, timeout=5))
        except grpc.RpcError as error:
            return error.code() not in {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN}
    return True


def test_grpc_ports_refuse_callers_without_the_certificate(embedded_s3: EmbeddedS3) -> None:
    ca = (embedded_s3.s3_dir / "tls" / "ca.crt").read_bytes()
    for offset, (method, request) in GRPC_PROBES.items():
        port = embedded_s3.port + offset
        assert not grpc_answers(port, method, request), (port, method)
        assert not grpc_answers(port, method, request, ca=ca), (port, method)
    for port in (embedded_s3.port + 1, embedded_s3.port + 8 + ADMIN_GRPC_OFFSET):  # s3, admin
        assert not grpc_answers(port, "/any.Service/Method", b"")
    key = embedded_s3.s3_dir / "tls" / "node.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert not (embedded_s3.s3_dir / "tls" / "ca.key").exists()  # the authority signs no more


def test_only_the_s3_api_answers_and_only_with_credentials(embedded_s3: EmbeddedS3) -> None:
    bucket = f"locked-{uuid.uuid4().hex[:12]}"
    store = S3Store(
        bucket, endpoint_url=embedded_s3.endpoint_url, credentials=embedded_s3.credentials
    )
    store.ensure_bucket()
    secret = b"kindex-secret-" + uuid.uuid4().hex.encode() * 3  # 110 bytes: an odd size
    store.put_bytes("incoming/secret.csv", secret)
    written = store.head("incoming/secret.csv")
    assert written is not None
    # Server-side copy, as snapshots are taken: the gateway's own filer access still works.
    copied = store.keep_copy(
        "incoming/secret.csv", "snapshots/copy", etag=written.etag, size=written.size
    )
    assert copied is KeptCopy.COPIED
    before = {o.key: o.etag for o in store.list("")}
    fid = volume_file_id(embedded_s3.data_dir, len(secret) + SEALED_OVERHEAD)
    assert embedded_s3.pid is not None
    ports = listening_ports(embedded_s3.pid)
    assert set(PortPlan(embedded_s3.port).ports()) >= ports >= {embedded_s3.port}

    evil = b"evil-" + uuid.uuid4().hex.encode()  # what no anonymous write may leave in a volume
    answered: dict[int, list[tuple[str, int | None]]] = {}
    for port in sorted(ports):
        base = f"http://127.0.0.1:{port}"
        reads = [
            f"{base}/",
            f"{base}/{bucket}/incoming/secret.csv",  # S3 path style
            f"{base}/buckets/{bucket}/incoming/secret.csv",  # filer
            f"{base}/buckets/{bucket}/incoming/secret.csv?metadata=true",
            f"{base}/{fid}",  # volume server, the exact needle
            f"{base}/dir/lookup?volumeId={fid.split(',')[0]}",
        ]
        writes = [
            ("PUT", f"{base}/{bucket}/incoming/evil.csv", evil),
            ("PUT", f"{base}/buckets/{bucket}/incoming/evil.csv", evil),
            ("POST", f"{base}/{fid}", evil),
            ("POST", f"{base}/submit", evil),
            ("GET", f"{base}/dir/assign", None),
            ("GET", f"{base}/col/delete?collection={bucket}", None),
            ("DELETE", f"{base}/{fid}", None),
            ("DELETE", f"{base}/buckets/{bucket}/incoming/secret.csv", None),
            ("DELETE", f"{base}/{bucket}/snapshots/copy", None),
        ]
        for url in reads:
            status, body = anonymous("GET", url)
            assert secret not in body, url
            assert status is None or status >= 400 or url == f"{base}/", (url, status, body)
        for method, url, data in writes:
            status, body = anonymous(method, url, data)
            answered.setdefault(port, []).append((url, status))
            assert status is None or status >= 400, (method, url, status, body)

    assert {o.key: o.etag for o in store.list("")} == before
    assert store.get_bytes("incoming/secret.csv") == secret
    assert store.get_bytes("snapshots/copy") == secret
    # (The volumes' sizes may grow meanwhile: the filer persists its metadata log in them.)
    assert not [p for p in embedded_s3.data_dir.rglob("*.dat") if evil in p.read_bytes()]
    assert stat.S_IMODE(embedded_s3.security_path.stat().st_mode) == 0o600
    security = embedded_s3.security_path.read_text()
    # JWT keys, then the certificate's key for each gRPC component, the client, each HTTPS
    # component and the HTTPS client.
    assert security.count('key = "') == 4 + 9 + 2 + 1 and 'key = ""' not in security
    for line in security.splitlines():
        if line.startswith("key = ") and "/" not in line:  # a JWT key, not a key file's path
            assert line.split('"')[1] not in embedded_s3.log_tail(10_000)


def test_the_master_and_volume_status_pages_are_closed_to_anonymous_callers(
    embedded_s3: EmbeddedS3,
) -> None:
    """The master's status page (cluster topology, volume ids, uptime) and the volume server's
    (its disks) answered anyone on the host; now both speak HTTPS to a caller with the client
    certificate only: plain HTTP gets an error with nothing in it, HTTPS without the
    certificate no answer, and with it they answer (what the gateway does)."""
    import ssl

    plan = PortPlan(embedded_s3.port)
    master, volume = plan.ports()[2], plan.ports()[4]
    tls = embedded_s3.s3_dir / "tls"
    for port, path in ((master, "/cluster/status"), (master, "/"), (volume, "/status")):
        status, body = anonymous("GET", f"http://127.0.0.1:{port}{path}")
        assert status == 400 and b"Leader" not in body and b"Disk" not in body, (port, body)
        anyone = ssl.create_default_context(cafile=str(tls / "ca.crt"))
        with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
            urllib.request.urlopen(
                f"https://127.0.0.1:{port}{path}", context=anyone, timeout=5
            ).read()
    holder = ssl.create_default_context(cafile=str(tls / "ca.crt"))
    holder.load_cert_chain(str(tls / "node.crt"), str(tls / "node.key"))
    page = urllib.request.urlopen(
        f"https://127.0.0.1:{master}/cluster/status", context=holder, timeout=5
    ).read()
    assert b"Leader" in page


# -- one server per home, shared -----------------------------------------------------------------

SMALL_LIGER_ROWS = 20


def kindex_env(home: Path, s3_port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KINDEX_", "AWS_"))}
    return env | {"KINDEX_HOME": str(home), "KINDEX_S3_PORT": str(s3_port)} | extra


def small_liger_csv(path: Path, first_line: int) -> Path:
    """A valid Liger CSV: the header and SMALL_LIGER_ROWS rows of the shared file."""
    lines = LIGER_CSV.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text(lines[0] + "".join(lines[first_line : first_line + SMALL_LIGER_ROWS]))
    return path


def concurrent_ingests(env: dict[str, str], files: list[Path]) -> list[tuple[int, str]]:
    """`kindex ingest` of each file, all started at once; their exit codes and stderr."""
    kindex = str(Path(sys.executable).parent / "kindex")
    processes = [
        subprocess.Popen(
            [kindex, "ingest", "--no-progress", str(path)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for path in files
    ]
    return [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in processes]


@pytest.mark.slow
def test_two_ingests_at_once_share_one_server_in_a_fresh_home(tmp_path: Path) -> None:
    for round_ in range(10):
        home = tmp_path / f"home-{round_}"
        env = kindex_env(home, find_free_port_block())
        files = [small_liger_csv(tmp_path / f"r{round_}-{n}.csv", 2 + 100 * n) for n in (0, 1)]
        results = concurrent_ingests(env, files)
        assert [code for code, _ in results] == [0, 0], (round_, results)
        assert running_server(home) is None  # the last one out stopped it
    with EmbeddedS3(home, port=find_free_port_block()) as server:
        store = S3Store("kindex", endpoint_url=server.endpoint_url, credentials=server.credentials)
        assert {o.key for o in store.list("incoming/")} == {f"incoming/{p.name}" for p in files}


def test_the_server_collects_its_heap_at_half_again_what_it_kept_unless_told() -> None:
    from pipelines.storage.embedded import SERVER_GOGC, server_environment

    env = server_environment({"PATH": "/bin", "WEED_MASTER_PORT": "1"})
    assert env == {"PATH": "/bin", "GOGC": SERVER_GOGC}  # no WEED_* overrides security.toml
    assert server_environment({"GOGC": "200", "GOMEMLIMIT": "1GiB"}) == {
        "GOGC": "200",
        "GOMEMLIMIT": "1GiB",
    }
