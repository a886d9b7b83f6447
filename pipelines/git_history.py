"""A committed file's history into the bucket: every committed version of one file, oldest
first, uploaded as versions of one key, each carrying its commit and commit time as object
metadata (pipelines/intake/incoming.py). `kindex ingest --git` processes each version in-process
right
after uploading it; `kindex put --git` leaves that to the sensor and waits for each version to
be read before it uploads the next (a key holds one version at a time).

Liger rewrites rows in place when it re-measures them, so its git history is the only record of
earlier measurements. Git runs as a subprocess (`git log --follow`, `git show`): no library.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath

from tqdm import tqdm

from pipelines.index.publish import publish_index
from pipelines.ingest import IngestSummary, SnapshotRecords, process_snapshot
from pipelines.intake.incoming import SourceCommit, check_incoming_key, put_incoming
from pipelines.intake.snapshots import content_digest, list_reads, put_by_snapshot
from pipelines.settings import Settings
from pipelines.storage.base import ObjectInfo, ObjectStore

GIT_TIMEOUT_SECONDS = 120
READ_POLL_SECONDS = 0.5


class GitHistoryError(RuntimeError):
    """The repository or the file's history cannot be read (one line, for a person)."""


@dataclass(frozen=True, slots=True)
class CommittedVersion:
    """One committed version of the file: its commit, and the file's path in that commit
    (`--follow` follows renames)."""

    commit: SourceCommit
    path: str


@dataclass(frozen=True, slots=True)
class FileHistory:
    repo: Path  # the repository's top level (or a bare repository)
    path: str  # the file's path in the newest commit, relative to the top level
    versions: list[CommittedVersion]  # oldest first

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name

    def read(self, version: CommittedVersion) -> bytes:
        return _git(self.repo, "show", f"{version.commit.commit}:{version.path}")

    def contents(self) -> Iterator[tuple[CommittedVersion, bytes]]:
        for version in self.versions:
            yield version, self.read(version)


def file_history(repo: Path | str, path: Path | str) -> FileHistory:
    """Every committed version of `path` in `repo`, oldest first. A relative `path` is read from
    `repo` (e.g. `benchmark/data/all_benchmark_data.csv` from the top level); the file need not
    exist in the working tree any more."""
    repo = Path(repo)
    if not repo.exists():
        raise GitHistoryError(f"no such repository: {repo}")
    top = _top_level(repo)
    relative = _relative_path(top, repo, Path(path))
    log = _git(
        top,
        "log",
        "--follow",
        "--diff-filter=d",  # a commit that deletes the file has no version of it
        "--format=%x00%H%x09%cI",
        "--name-only",
        "--",
        relative,
    ).decode()
    versions = []
    for entry in log.split("\0")[1:]:
        header, _, names = entry.partition("\n")
        commit, _, committed = header.partition("\t")
        name = names.strip().splitlines()[-1] if names.strip() else relative
        versions.append(CommittedVersion(SourceCommit(commit, _commit_time(committed)), name))
    if not versions:
        raise GitHistoryError(f"{relative} was never committed in {top}")
    versions.reverse()  # git log lists the newest first
    return FileHistory(top, relative, versions)


def history_key(settings: Settings, history: FileHistory, key: str | None) -> str:
    """The one key every version goes to: `key`, or `<incoming prefix><file name>`."""
    return check_incoming_key(settings, key or f"{settings.incoming_prefix}{history.name}")


def ingest_history(
    store: ObjectStore,
    settings: Settings,
    history: FileHistory,
    key: str | None = None,
    progress: bool = True,
) -> IngestSummary:
    """Upload each version to the key, snapshot it and write its records, one after another
    (each version is read before the next replaces it), then publish the index once."""
    target = history_key(settings, history, key)
    files: list[SnapshotRecords] = []
    tqdm.monitor_interval = 0  # its thread would make worker processes start from a forkserver
    shown = progress and sys.stderr.isatty()
    with tqdm(total=len(history.versions), unit="version", disable=not shown) as bar:
        for version, data in history.contents():
            bar.set_description(version.commit.commit[:10])
            snapshot = put_by_snapshot(
                store,
                settings,
                Path(history.name),
                data,
                content_digest(data),
                key=target,
                commit=version.commit,
            ).snapshot
            files.append(process_snapshot(store, settings, snapshot))
            bar.update()
    return IngestSummary(files, publish_index(store, settings))


def put_history(
    store: ObjectStore,
    settings: Settings,
    history: FileHistory,
    key: str | None = None,
    *,
    wait_seconds: float | None,
    uploaded: Callable[[CommittedVersion, ObjectInfo], None] = lambda version, info: None,
) -> list[ObjectInfo]:
    """Upload each version to the key, oldest first. With `wait_seconds`, wait after each until
    it was read (the sensor of `kindex up` or of a Dagster deployment reads it): a key holds one
    version at a time, so a version replaced before it was read would never be indexed."""
    target = history_key(settings, history, key)
    infos = []
    for version, data in history.contents():
        info = put_incoming(
            store, settings, Path(history.name), data, key=target, commit=version.commit
        )
        uploaded(version, info)
        infos.append(info)
        if wait_seconds is not None and version is not history.versions[-1]:
            wait_until_read(store, settings, info, content_digest(data), wait_seconds)
    return infos


class NotReadInTime(GitHistoryError):
    """A version was not read before the wait ran out."""


def wait_until_read(
    store: ObjectStore, settings: Settings, info: ObjectInfo, digest: str, seconds: float
) -> None:
    """Until a read of these bytes from the key is this upload (or newer)."""
    deadline = time.monotonic() + seconds
    while True:
        reads = list_reads(store, settings, info.key)
        if any(r.digest == digest and r.last_modified >= info.last_modified for r in reads):
            return
        if time.monotonic() >= deadline:
            raise NotReadInTime(
                f"s3://{store.bucket}/{info.key} was not read within {seconds:g} s: is `kindex "
                "up` (or a Dagster deployment) watching the bucket? `kindex ingest --git` "
                "processes the versions in-process"
            )
        time.sleep(READ_POLL_SECONDS)


def _top_level(repo: Path) -> Path:
    try:
        return Path(_git(repo, "rev-parse", "--show-toplevel").decode().strip())
    except GitHistoryError:
        _git(repo, "rev-parse", "--git-dir")  # a bare repository, or not one at all
        return repo


def _relative_path(top: Path, repo: Path, path: Path) -> str:
    if not path.is_absolute():
        path = repo.resolve() / path
    try:
        return path.resolve().relative_to(top.resolve()).as_posix()
    except ValueError:
        raise GitHistoryError(f"{path} is not inside the repository {top}") from None


def _commit_time(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        raise GitHistoryError(f"git gave an unreadable commit time {text!r}") from None


def _git(repo: Path, *args: str) -> bytes:
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            timeout=GIT_TIMEOUT_SECONDS,
            check=False,
        )
    except FileNotFoundError:
        raise GitHistoryError("git is not installed (it reads the file's history)") from None
    except subprocess.TimeoutExpired:
        took = f"git {args[0]} in {repo} took over {GIT_TIMEOUT_SECONDS} s"
        raise GitHistoryError(took) from None
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        raise GitHistoryError(f"git {args[0]} in {repo}: {message[-1] if message else 'failed'}")
    return done.stdout
