"""kindex configuration, read from `KINDEX_*` environment variables.

Credentials never live here: boto3's usual chain provides them for a configured endpoint, and the
embedded server's generated identity lives in `$KINDEX_HOME/s3/credentials.json`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

ENV_PREFIX = "KINDEX_"
EMBEDDED_HOST = "127.0.0.1"
HOME_DIR_NAME = ".kindex"
# `KINDEX_S3_ENDPOINT=aws`: plain AWS S3, at the region's endpoint.
AWS_ENDPOINT_NAME = "aws"

# Every KINDEX_* variable kindex reads; the settings below, and those other modules read.
SETTING_NAMES = (
    "HOME",
    "S3_ENDPOINT",
    "BUCKET",
    "S3_REGION",
    "S3_PATH_STYLE",
    "S3_PORT",
    "INCOMING_PREFIX",
    "SNAPSHOT_PREFIX",
    "RECORDS_PREFIX",
    "INDEX_PREFIX",
    "CATALOG_URI",
    "INDEX_RETENTION_VERSIONS",
    "NOTIFICATIONS",
    "SQS_QUEUE_URL",
)
OTHER_NAMES = ("CURATION_DIR", "FAULT_PAUSE", "FAULT_DIR", "REGRESSIONS", "S3_INVENTORY")
# KINDEX_NOTIFICATIONS: where new objects are heard of. "filer": the embedded SeaweedFS's
# metadata log; "sqs": S3 event notifications in KINDEX_SQS_QUEUE_URL; "none": listing only.
NOTIFICATION_KINDS = ("filer", "sqs", "none")

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
    # The index's Iceberg catalog: None for SQLite in the home, else a SQLAlchemy or REST URL.
    catalog_uri: str | None = None
    # How many of the newest versions stay readable (`kindex query --as-of`); older snapshots
    # expire (their files stay in the bucket).
    index_retention_versions: int = 32
    # None: chosen from the rest (see `notification_kind`).
    notifications: str | None = None
    sqs_queue_url: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(ENV_PREFIX + name, "").strip()
            return value or None

        def aws(name: str) -> str | None:
            return env.get(name, "").strip() or None

        configured_home = get("HOME")
        home = Path(configured_home).expanduser().resolve() if configured_home else find_home()
        # boto3's own variables count where kindex's are unset, as boto3 itself reads them.
        region = get("S3_REGION") or aws("AWS_REGION") or aws("AWS_DEFAULT_REGION") or cls.s3_region
        endpoint = get("S3_ENDPOINT")
        endpoint_name = "S3_ENDPOINT"
        for boto3_name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            if endpoint is None:
                endpoint, endpoint_name = aws(boto3_name), boto3_name
        on_aws = endpoint is not None and endpoint.lower() == AWS_ENDPOINT_NAME
        if on_aws:
            endpoint = f"https://s3.{region}.amazonaws.com"
        elif endpoint is not None:
            endpoint = _parse_endpoint(endpoint_name, endpoint)
        return cls(
            home=home,
            s3_endpoint=endpoint,
            bucket=get("BUCKET") or cls.bucket,
            s3_region=region,
            # AWS wants virtual-hosted addressing; the servers kindex runs or is pointed at
            # (SeaweedFS, MinIO) want path-style.
            s3_path_style=_parse_bool("S3_PATH_STYLE", get("S3_PATH_STYLE"), not on_aws),
            s3_port=_parse_port("S3_PORT", get("S3_PORT"), cls.s3_port),
            incoming_prefix=_prefix(get("INCOMING_PREFIX") or cls.incoming_prefix),
            snapshot_prefix=_prefix(get("SNAPSHOT_PREFIX") or cls.snapshot_prefix),
            records_prefix=_prefix(get("RECORDS_PREFIX") or cls.records_prefix),
            index_prefix=_prefix(get("INDEX_PREFIX") or cls.index_prefix),
            catalog_uri=get("CATALOG_URI"),
            index_retention_versions=_parse_count(
                "INDEX_RETENTION_VERSIONS",
                get("INDEX_RETENTION_VERSIONS"),
                cls.index_retention_versions,
            ),
            notifications=_parse_notifications(
                get("NOTIFICATIONS"), get("SQS_QUEUE_URL"), embedded=endpoint is None
            ),
            sqs_queue_url=get("SQS_QUEUE_URL"),
        )

    def replace(self, **changes: object) -> Settings:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @property
    def embedded(self) -> bool:
        """True when kindex runs (or attaches to) its own SeaweedFS rather than an endpoint."""
        return self.s3_endpoint is None

    @property
    def notification_kind(self) -> str:
        """The feed that reports new objects: the one configured, else "sqs" when a queue is
        set, "filer" for the embedded server, "none" (listing only) for other endpoints."""
        if self.notifications is not None:
            return self.notifications
        if self.sqs_queue_url is not None:
            return "sqs"
        return "filer" if self.embedded else "none"

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


def find_home(start: Path | None = None) -> Path:
    """The home the way git finds a repository: the nearest `.kindex` folder in `start` (the
    current directory) or a parent; else `./.kindex`, created when first written."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / HOME_DIR_NAME
        if candidate.is_dir():
            return candidate
    return here / HOME_DIR_NAME


def unknown_names(environ: Mapping[str, str] | None = None) -> Iterator[str]:
    """A warning for each KINDEX_* variable kindex does not read, naming the closest real one."""
    env = os.environ if environ is None else environ
    known = [ENV_PREFIX + name for name in SETTING_NAMES + OTHER_NAMES]
    for name in sorted(env):
        if name.startswith(ENV_PREFIX) and name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            yield f"{name} is not a kindex setting, and is ignored{hint}"


def _parse_endpoint(name: str, value: str) -> str:
    """An S3 endpoint is a URL with an http(s) scheme and a host: `127.0.0.1:9000` is not."""
    try:
        url = urlsplit(value)
        url.port  # noqa: B018 - raises ValueError on a port out of range or not a number
    except ValueError as error:
        raise SettingsError(f"{_variable(name)}={value!r}: {error}") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise SettingsError(
            f"{_variable(name)}={value!r}: expected a URL such as http://{value}"
            if url.scheme not in ("http", "https") and "://" not in value
            else f"{_variable(name)}={value!r}: expected an http:// or https:// URL with a host"
        )
    return value.rstrip("/")


def _variable(name: str) -> str:
    return name if name.startswith("AWS_") else ENV_PREFIX + name


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


def _parse_notifications(value: str | None, queue_url: str | None, *, embedded: bool) -> str | None:
    if value is None:
        return None
    kind = value.lower()
    if kind not in NOTIFICATION_KINDS:
        raise SettingsError(
            f"{ENV_PREFIX}NOTIFICATIONS={value!r}: expected one of {', '.join(NOTIFICATION_KINDS)}"
        )
    if kind == "sqs" and queue_url is None:
        raise SettingsError(f"{ENV_PREFIX}NOTIFICATIONS=sqs needs {ENV_PREFIX}SQS_QUEUE_URL")
    # The filer's metadata log is reached over the embedded server's own gRPC port.
    if kind == "filer" and not embedded:
        raise SettingsError(
            f"{ENV_PREFIX}NOTIFICATIONS=filer needs the embedded server (no KINDEX_S3_ENDPOINT)"
        )
    return kind


def _parse_port(name: str, value: str | None, default: int) -> int:
    if value is None:
        return default
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise SettingsError(f"{ENV_PREFIX}{name}={value!r}: expected a TCP port (1-65535)")
    return int(value)


def _parse_count(name: str, value: str | None, default: int) -> int:
    if value is None:
        return default
    if not value.isdigit() or int(value) < 1:
        raise SettingsError(f"{ENV_PREFIX}{name}={value!r}: expected a whole number (1 or more)")
    return int(value)
