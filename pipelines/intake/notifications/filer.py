"""The embedded SeaweedFS's change feed: its filer's metadata log, read with `weed filer.meta.tail`.

Each poll runs `weed filer.meta.tail -timeAgo=… -untilTimeAgo=1ms` once: it replays the log from
a time to just before now, prints one JSON event per change and exits (with `-untilTimeAgo=0s`
it would follow the log forever). Its cost follows the events in the window, not the objects in
the bucket. The filer's gRPC port demands the client certificate kindex generates for the
server (`pipelines/storage/tls.py`); weed reads it from `security.toml` in its working
directory, so the command runs in `$KINDEX_HOME/s3/notifications/`, which holds one naming the
certificate and its authority (not the server's JWT signing keys).

The cursor is a filer timestamp (`tsNs`, in the host's clock: the server runs on this host) and
the identities of the events reported in the last `overlap` before it. Each poll re-reads that
overlap, for an event logged with an earlier time than one already read, and skips what it
reported already; so a page repeats an event only when a cursor older than the last one is
polled again (at least once, as every feed).

The filer keeps its newest events in memory and writes them to its log now and then: a server
killed (SIGKILL, a crash) loses what it had not written, and a replay after its restart never
shows those changes. So the cursor also names the server process it read
(`$KINDEX_HOME/s3/server.json`, rewritten at each start); a poll that finds another one there
reports a gap since the cursor's time (`ChangePage.gap_since`), for the caller to list.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from pipelines.intake.notifications.changes import (
    ChangePage,
    NotificationError,
    ObjectChange,
    under_prefix,
)
from pipelines.settings import EMBEDDED_HOST, Settings
from pipelines.storage.credentials import write_private_file
from pipelines.storage.embedded import (
    EmbeddedS3,
    seaweedfs_client_security_config,
    weed_binary,
)
from pipelines.storage.errors import EmbeddedS3Error
from pipelines.storage.tls import certificate_paths

log = logging.getLogger(__name__)

# Where the S3 gateway keeps buckets in the filer's tree (SeaweedFS's default buckets folder).
BUCKETS_FOLDER = "/buckets"
# The S3 ETag the gateway stores with each object (base64 of the text HEAD returns).
ETAG_ATTRIBUTE = "Seaweed-X-Amz-ETag"
# `weed mini`'s filer ports, from the S3 port (embedded.PortPlan.flags).
FILER_PORT_OFFSET = 6
FILER_GRPC_PORT_OFFSET = 7
DEFAULT_OVERLAP = timedelta(seconds=5)
DEFAULT_TIMEOUT_SECONDS = 15.0
# -timeAgo is relative to weed's own start, a few ms after ours: start a little earlier still
# (events before the window are dropped here).
LAUNCH_SLACK_NS = 1_000_000_000
UNTIL_TIME_AGO_NS = 1_000_000  # -untilTimeAgo=1ms: the smallest bound that still exits
# The most log one poll reads past its cursor: a feed left behind for days catches up an hour a
# poll, instead of parsing days of events again for every page of `limit`.
MAX_WINDOW = timedelta(hours=1)
CURSOR_VERSION = 1
IDENTITY_BYTES = 8
ERROR_CHARS = 300

_SPACE = re.compile(r"\s*")


class _Model(BaseModel):
    # weed prints protobuf's JSON: camelCase names, 64-bit integers as strings.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class _Attributes(_Model):
    file_size: int = 0
    mtime: int = 0  # seconds: S3's LastModified
    md5: str = ""  # base64; empty for a multipart upload


class _Entry(_Model):
    name: str
    is_directory: bool = False
    attributes: _Attributes = _Attributes()
    extended: dict[str, str] = {}  # bytes values, base64


class _Notification(_Model):
    old_entry: _Entry | None = None
    new_entry: _Entry | None = None
    new_parent_path: str = ""  # "" for a removal


class FilerEvent(_Model):
    directory: str  # the old entry's folder
    event_notification: _Notification
    ts_ns: int


class _CursorModel(_Model):
    v: Literal[1]
    ts_ns: int
    seen: list[tuple[int, str]] = []
    server: str | None = None  # absent from cursors written before it


@dataclass(frozen=True, slots=True)
class FilerCursor:
    """Everything the filer logged up to `ts_ns` was read, less late events within the
    overlap, which are read again; `seen` holds the reported events' (tsNs, identity) there.
    `server`: the server process that logged them (`server_identity`); None where unknown (a
    cursor from `since`, or written before), which no restart is judged against."""

    ts_ns: int
    seen: tuple[tuple[int, str], ...] = ()
    server: str | None = None

    def to_text(self) -> str:
        payload: dict[str, object] = {
            "v": CURSOR_VERSION,
            "tsNs": self.ts_ns,
            "seen": [list(s) for s in self.seen],
        }
        if self.server is not None:
            payload["server"] = self.server
        return json.dumps(payload, separators=(",", ":"))

    @classmethod
    def from_text(cls, text: str) -> FilerCursor | None:
        """The cursor `text` holds; None for another feed's cursor or one unreadable."""
        try:
            model = _CursorModel.model_validate_json(text)
        except ValidationError:
            return None
        return cls(model.ts_ns, tuple(model.seen), model.server)


class FilerFeed:
    """Changes under `prefix` of `bucket`, from the filer at `filer` (`host:port.grpcport`)."""

    name = "filer"

    def __init__(
        self,
        *,
        filer: str,
        bucket: str,
        prefix: str,
        tls_dir: Path,
        config_dir: Path,
        weed: Path | None = None,
        overlap: timedelta = DEFAULT_OVERLAP,
        max_window: timedelta = MAX_WINDOW,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        server_record: Path | None = None,
    ) -> None:
        self.filer = filer
        self.bucket = bucket
        self.prefix = prefix
        self.tls_dir = tls_dir
        self.config_dir = config_dir
        self.weed = weed
        self.overlap_ns = _ns(overlap)
        self.max_window_ns = _ns(max_window)
        self.timeout = timeout
        # The embedded server's record (server.json): its process, to see a restart by. None:
        # restarts are not watched (the reconciliation listing alone covers them).
        self.server_record = server_record

    @classmethod
    def from_settings(cls, settings: Settings) -> FilerFeed:
        """The feed of the home's embedded server, at the port its clients use."""
        port = settings.s3_port
        return cls(
            filer=f"{EMBEDDED_HOST}:{port + FILER_PORT_OFFSET}.{port + FILER_GRPC_PORT_OFFSET}",
            bucket=settings.bucket,
            prefix=settings.incoming_prefix,
            tls_dir=settings.s3_dir / "tls",
            config_dir=settings.s3_dir / "notifications",
            server_record=EmbeddedS3(settings.home, port=port).state_path,
        )

    @property
    def bucket_root(self) -> str:
        return f"{BUCKETS_FOLDER}/{self.bucket}/"

    @property
    def path_prefix(self) -> str:
        return self.bucket_root + self.prefix

    def poll(self, cursor: str | None, limit: int) -> ChangePage:
        if limit < 1:
            raise ValueError(f"limit must be 1 or more, got {limit}")
        state = FilerCursor.from_text(cursor) if cursor else None
        if cursor and state is None:
            log.warning("unreadable filer cursor; reading changes from now on")
        # Before the tail: a restart while it runs is then seen by the next poll.
        server = self.server_identity()
        now = time.time_ns()
        if state is None:
            # From now on: the reconciliation listing covers what came before. The overlap's
            # events count as reported, so the next poll does not bring them up again.
            until = now - UNTIL_TIME_AGO_NS
            events = self.tail(since_ns=now - self.overlap_ns, until_ns=until, now_ns=now)
            seen = tuple((e.ts_ns, _identity(e)) for e in events)
            kept = _recent(seen, until, self.overlap_ns)
            return ChangePage([], FilerCursor(until, kept, server).to_text())
        page = self._read(state, limit, now, server)
        if state.server is not None and server != state.server:
            # The log of the server the cursor read died with it, but what it had written: the
            # changes after the cursor (and its overlap) may be in the bucket and in no event.
            since = datetime.fromtimestamp((state.ts_ns - self.overlap_ns) / 1e9, UTC)
            log.warning(
                "the embedded server restarted (was %s, now %s): changes since %s may have no "
                "event",
                state.server,
                server,
                since.isoformat(),
            )
            page = replace(page, gap_since=since)
        return page

    def server_identity(self) -> str | None:
        """The server process serving the home now: its pid and when its record was written
        (a pid alone could be reused); None without a record (no server, or not watched)."""
        if self.server_record is None:
            return None
        try:
            with self.server_record.open("rb") as record:
                written = os.fstat(record.fileno()).st_mtime_ns
                pid = int(json.loads(record.read())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return f"{pid}@{written}"

    def _read(self, state: FilerCursor, limit: int, now: int, server: str | None) -> ChangePage:
        window_start = state.ts_ns - self.overlap_ns
        until = min(now - UNTIL_TIME_AGO_NS, state.ts_ns + self.max_window_ns)
        events = self.tail(since_ns=window_start, until_ns=until, now_ns=now)
        seen = {identity for _, identity in state.seen}
        changes: list[ObjectChange] = []
        reported: list[tuple[int, str]] = []
        last_ts = state.ts_ns
        complete = True
        for event in events:
            if event.ts_ns <= window_start:
                continue
            identity = _identity(event)
            if identity in seen:
                continue
            found = self.changes_of(event)
            if changes and len(changes) + len(found) > limit:
                complete = False
                break
            changes.extend(found)
            last_ts = max(last_ts, event.ts_ns)
            if found:
                reported.append((event.ts_ns, identity))
        # A complete read covered the log up to its bound (1 ms ago at most), events or not: the
        # next window starts there, so an idle feed re-reads only the overlap.
        ts = max(last_ts, until) if complete else last_ts
        kept = _recent((*state.seen, *reported), ts, self.overlap_ns)
        return ChangePage(changes, FilerCursor(ts, kept, server).to_text())

    def acknowledge(self, page: ChangePage) -> None:
        """Nothing to do: the cursor is the acknowledgement."""

    def since(self, moment: datetime) -> str:
        return FilerCursor(int(moment.timestamp() * 1e9), ()).to_text()

    def tail(self, *, since_ns: int, until_ns: int, now_ns: int) -> list[FilerEvent]:
        """The filer's events under the prefix from `since_ns` to `until_ns` (both in the
        clock that gave `now_ns`; weed takes them as times before its own start)."""
        time_ago = now_ns - since_ns + LAUNCH_SLACK_NS
        until_ago = max(now_ns - until_ns, UNTIL_TIME_AGO_NS)
        command = [
            str(self.weed or _weed()),
            "filer.meta.tail",
            f"-filer={self.filer}",
            f"-pathPrefix={self.path_prefix}",
            f"-timeAgo={time_ago}ns",
            f"-untilTimeAgo={until_ago}ns",
        ]
        self._write_client_config()
        try:
            done = subprocess.run(
                command,
                cwd=self.config_dir,
                # WEED_* variables would override security.toml.
                env={k: v for k, v in os.environ.items() if not k.startswith("WEED_")},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=self.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:  # run() has killed and reaped it
            raise NotificationError(
                f"`weed filer.meta.tail` on {self.filer} did not finish within {self.timeout:.0f} s"
            ) from None
        if done.returncode != 0:
            raise NotificationError(
                f"`weed filer.meta.tail` on {self.filer} exited with {done.returncode}: "
                f"{_shown(done.stderr or done.stdout)}"
            )
        return list(parse_events(done.stdout.decode("utf-8", errors="replace")))

    def _write_client_config(self) -> None:
        certificates = certificate_paths(self.tls_dir)
        if not certificates.key.is_file():
            raise NotificationError(
                f"no client certificate in {self.tls_dir}: the embedded server has not started"
            )
        config = seaweedfs_client_security_config(certificates)
        path = self.config_dir / "security.toml"
        try:
            if path.read_bytes() == config:
                return
        except FileNotFoundError:
            pass
        write_private_file(path, config)

    def changes_of(self, event: FilerEvent) -> list[ObjectChange]:
        """What one filer event means for objects under the prefix: a removal of the old entry
        (deleted, or moved elsewhere) and a new or updated object; folders are not objects."""
        notification = event.event_notification
        old, new = notification.old_entry, notification.new_entry
        old_path = f"{event.directory}/{old.name}" if old is not None else None
        new_folder = notification.new_parent_path or event.directory
        new_path = f"{new_folder}/{new.name}" if new is not None else None
        at = datetime.fromtimestamp(event.ts_ns / 1e9, UTC)
        found: list[ObjectChange] = []
        if old is not None and old_path != new_path:
            found += self._object_change(old_path, old, deleted=True, at=at)
        if new is not None:
            found += self._object_change(new_path, new, deleted=False, at=at)
        return found

    def _object_change(
        self, path: str | None, entry: _Entry, *, deleted: bool, at: datetime
    ) -> list[ObjectChange]:
        """The change to the object at `path`: none for a folder or a path outside the prefix."""
        root = self.bucket_root
        if path is None or entry.is_directory or not path.startswith(root):
            return []
        key = path[len(root) :]
        if not under_prefix(key, self.prefix):
            return []
        return [_change(key, entry, deleted=deleted, at=at)]


def parse_events(text: str) -> Iterator[FilerEvent]:
    """The events `weed filer.meta.tail` printed: indented JSON objects one after another.
    Anything else is weed saying what went wrong (a refused certificate, a filer down)."""
    decoder = json.JSONDecoder()
    at = 0
    while True:
        at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
        if at == len(text):
            return
        if text[at] != "{":
            raise NotificationError(f"`weed filer.meta.tail`: {_shown(text[at:].encode())}")
        try:
            value, at = decoder.raw_decode(text, at)
            yield FilerEvent.model_validate(value)
        except (json.JSONDecodeError, ValidationError) as error:
            raise NotificationError(f"unreadable filer event: {error}") from None


def s3_etag(entry: _Entry) -> str | None:
    """The ETag S3 reports for the entry: the gateway's stored one (hex MD5, or `hex-N` for a
    multipart upload); else the content MD5 in hex (a single PUT's ETag); else None."""
    stored = entry.extended.get(ETAG_ATTRIBUTE)
    if stored:
        try:
            return _b64(stored).decode("ascii").strip('"')
        except (ValueError, UnicodeDecodeError):
            pass
    if entry.attributes.md5:
        try:
            return _b64(entry.attributes.md5).hex()
        except ValueError:
            return None
    return None


def _b64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def _change(key: str, entry: _Entry, *, deleted: bool, at: datetime) -> ObjectChange:
    modified = datetime.fromtimestamp(entry.attributes.mtime, UTC) if entry.attributes.mtime else at
    return ObjectChange(
        key=key,
        etag=s3_etag(entry),
        size=entry.attributes.file_size,
        # A removal happened at the event's time; a new object's time is its LastModified.
        last_modified=at if deleted else modified,
        deleted=deleted,
    )


def _identity(event: FilerEvent) -> str:
    """One event of the log: its time, and what changed."""
    notification = event.event_notification
    names = [
        e.name if e is not None else "" for e in (notification.old_entry, notification.new_entry)
    ]
    text = "\0".join([str(event.ts_ns), event.directory, notification.new_parent_path, *names])
    return hashlib.blake2b(text.encode(), digest_size=IDENTITY_BYTES).hexdigest()


def _recent(
    seen: tuple[tuple[int, str], ...], ts_ns: int, overlap_ns: int
) -> tuple[tuple[int, str], ...]:
    """The identities the next poll's overlap re-reads; older ones cannot come again."""
    return tuple(sorted({s for s in seen if s[0] > ts_ns - overlap_ns}))


def _ns(duration: timedelta) -> int:
    return duration // timedelta(microseconds=1) * 1000


def _shown(output: bytes) -> str:
    lines = output.decode("utf-8", errors="replace").strip().splitlines()
    return (lines[0] if lines else "(no output)")[:ERROR_CHARS]


def _weed() -> Path:
    try:
        return weed_binary()
    except EmbeddedS3Error as error:
        raise NotificationError(str(error)) from None
