"""kindex configuration, read from `KINDEX_*` environment variables.

Credentials never live here: boto3's usual chain provides them for a configured endpoint, and the
embedded server's generated identity lives in `$KINDEX_HOME/s3/credentials.json`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_PREFIX = "KINDEX_"
EMBEDDED_HOST = "127.0.0.1"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class SettingsError(ValueError):
    """An environment variable holds a value kindex cannot use."""


@dataclass(frozen=True)
class Settings:
    home: Path
    s3_endpoint: str | None = None  # None: kindex runs its own SeaweedFS
    bucket: str = "kindex"
    s3_region: str = "us-east-1"
    s3_path_style: bool = True
    s3_port: int = 8333  # port of the embedded server's S3 gateway
    incoming_prefix: str = "incoming/"
    snapshot_prefix: str = "snapshots/"
    records_prefix: str = "records/"
    index_prefix: str = "index/"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(ENV_PREFIX + name, "").strip()
            return value or None

        home = Path(get("HOME") or "./.kindex").expanduser().resolve()
        return cls(
            home=home,
            s3_endpoint=get("S3_ENDPOINT"),
            bucket=get("BUCKET") or cls.bucket,
            s3_region=get("S3_REGION") or cls.s3_region,
            s3_path_style=_parse_bool("S3_PATH_STYLE", get("S3_PATH_STYLE"), cls.s3_path_style),
            s3_port=_parse_port("S3_PORT", get("S3_PORT"), cls.s3_port),
            incoming_prefix=_prefix(get("INCOMING_PREFIX") or cls.incoming_prefix),
            snapshot_prefix=_prefix(get("SNAPSHOT_PREFIX") or cls.snapshot_prefix),
            records_prefix=_prefix(get("RECORDS_PREFIX") or cls.records_prefix),
            index_prefix=_prefix(get("INDEX_PREFIX") or cls.index_prefix),
        )

    def replace(self, **changes: object) -> Settings:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @property
    def embedded(self) -> bool:
        """True when kindex runs (or attaches to) its own SeaweedFS rather than an endpoint."""
        return self.s3_endpoint is None

    @property
    def endpoint_url(self) -> str:
        """The S3 endpoint clients talk to: the configured one, or the embedded server's."""
        return self.s3_endpoint or f"http://{EMBEDDED_HOST}:{self.s3_port}"

    @property
    def s3_dir(self) -> Path:
        """The embedded server's data, config and generated credentials."""
        return self.home / "s3"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def credentials_path(self) -> Path:
        return self.s3_dir / "credentials.json"


def _prefix(value: str) -> str:
    """Prefixes name folders: always one trailing slash, never a leading one."""
    value = value.strip("/")
    return value + "/" if value else ""


def _parse_bool(name: str, value: str | None, default: bool) -> bool:
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise SettingsError(f"{ENV_PREFIX}{name}={value!r}: expected true or false")


def _parse_port(name: str, value: str | None, default: int) -> int:
    if value is None:
        return default
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise SettingsError(f"{ENV_PREFIX}{name}={value!r}: expected a TCP port (1-65535)")
    return int(value)
