"""The one S3 identity kindex generates for its embedded server.

Stored in `$KINDEX_HOME/s3/credentials.json` (mode 0600) and reused across restarts, so data
written before a restart stays readable. The secret is never printed: `repr` hides it.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.settings import Settings

IDENTITY_NAME = "kindex"
# SeaweedFS actions; Admin alone would do, the rest say what kindex uses.
IDENTITY_ACTIONS = ("Admin", "Read", "Write", "List", "Tagging")


@dataclass(frozen=True, slots=True)
class S3Credentials:
    access_key: str
    secret_key: str = field(repr=False)

    @classmethod
    def generate(cls) -> S3Credentials:
        # AWS-shaped: 20 upper-case alphanumerics and 40 URL-safe characters.
        access = "KX" + secrets.token_hex(9).upper()
        return cls(access_key=access, secret_key=secrets.token_urlsafe(30))

    def masked_access_key(self) -> str:
        """Enough of the access key id to tell identities apart in messages."""
        return self.access_key[:4] + "…"


def load_or_create_credentials(path: Path) -> S3Credentials:
    """The identity stored at `path`, created (mode 0600, atomically) on first use."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        created = S3Credentials.generate()
        data = {"accessKey": created.access_key, "secretKey": created.secret_key}
        _write_private(path, json.dumps(data).encode())
    data = json.loads(path.read_text(encoding="utf-8"))
    return S3Credentials(access_key=data["accessKey"], secret_key=data["secretKey"])


def configured_credentials(settings: Settings) -> S3Credentials | None:
    """The identity kindex gives its S3 clients: the embedded server's generated one, or None
    for a configured endpoint (boto3's credential chain then provides one)."""
    return load_or_create_credentials(settings.credentials_path) if settings.embedded else None


def seaweedfs_identity_config(credentials: S3Credentials) -> bytes:
    """The `-s3.config` JSON that makes SeaweedFS accept exactly this identity."""
    config = {
        "identities": [
            {
                "name": IDENTITY_NAME,
                "credentials": [
                    {"accessKey": credentials.access_key, "secretKey": credentials.secret_key}
                ],
                "actions": list(IDENTITY_ACTIONS),
            }
        ]
    }
    return json.dumps(config, indent=2).encode()


def write_private_file(path: Path, data: bytes) -> None:
    """Replace `path` with `data`, readable by the owner only at every moment."""
    os.replace(_private_temp_file(path, data), path)


def _write_private(path: Path, data: bytes) -> None:
    """Create `path` once; if another process won the race, keep its file."""
    tmp = _private_temp_file(path, data)
    try:
        os.link(tmp, path)  # fails if the file exists: the first writer wins
    except FileExistsError:
        pass
    finally:
        tmp.unlink()


def _private_temp_file(path: Path, data: bytes) -> Path:
    """`data` in a mode-0600 file beside `path`, created with that mode (never wider)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    return tmp
