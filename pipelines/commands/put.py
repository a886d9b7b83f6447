"""`kindex put FILE... [--key KEY]`: upload files into the bucket's incoming prefix.
`kindex put --git REPO PATH [--key KEY]`: upload every committed version of PATH, oldest first.

Dagster's sensor notices them there. With no endpoint configured, the embedded S3 server is used:
the one `kindex up` runs, or one started for this command and stopped after it. A key outside
the incoming prefix is refused (there live the snapshots and the index pointer).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import botocore.exceptions
from boto3.exceptions import S3UploadFailedError

from pipelines.git_history import GitHistoryError, file_history, history_key, put_history
from pipelines.intake.incoming import IncomingKeyError, check_incoming_key, upload_incoming
from pipelines.settings import Settings
from pipelines.storage.base import ObjectInfo
from pipelines.storage.embedded import running_server
from pipelines.storage.s3 import StorageError, store_session

if TYPE_CHECKING:
    from pipelines.git_history import CommittedVersion
    from pipelines.storage.s3 import S3Store

DEFAULT_WAIT_SECONDS = 300.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "put",
        help="upload files to incoming/ in the bucket (where Dagster picks them up)",
        description="Upload each FILE to <incoming prefix><file name> (KINDEX_INCOMING_PREFIX, "
        "default incoming/), or to --key. Prints the key, size and ETag of each upload. With "
        "--git REPO, FILE is a path in that repository and every committed version of it is "
        "uploaded to one key, oldest first, each with its commit and commit time as object "
        "metadata; each version is uploaded once the one before was read (by `kindex up`).",
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE")
    parser.add_argument(
        "--key", help="the object key under the incoming prefix to upload to (only with one FILE)"
    )
    parser.add_argument(
        "--git", type=Path, metavar="REPO", help="upload FILE's committed versions from REPO"
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=DEFAULT_WAIT_SECONDS,
        metavar="SECONDS",
        help="with --git: how long to wait for each version to be read (0: do not wait)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if args.key is not None and len(args.files) != 1:
        print("kindex put: --key needs exactly one FILE", file=sys.stderr)
        return 2
    if args.git is not None and len(args.files) != 1:
        print("kindex put: --git needs one FILE, a path in the repository", file=sys.stderr)
        return 2
    if args.key is not None:
        try:
            check_incoming_key(settings, args.key)
        except IncomingKeyError as error:
            print(f"kindex put: {error}", file=sys.stderr)
            return 2
    if args.git is not None:
        return put_git(args, settings)
    missing = [str(path) for path in args.files if not path.is_file()]
    if missing:
        print(f"kindex put: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    return upload(settings, lambda store: put_files(store, settings, args.files, args.key))


def put_files(store: S3Store, settings: Settings, paths: list[Path], key: str | None) -> None:
    for path in paths:
        info = upload_incoming(store, settings, path, key)
        print(describe(store.bucket, info), flush=True)


def put_git(args: argparse.Namespace, settings: Settings) -> int:
    try:
        history = file_history(args.git, args.files[0])
        history_key(settings, history, args.key)
    except (GitHistoryError, IncomingKeyError) as error:
        print(f"kindex put: {error}", file=sys.stderr)
        return 2

    # this command would start the server: none watches
    if args.wait > 0 and settings.embedded and running_server(settings.home) is None:
        print(
            "kindex put: --git uploads each version once the one before was read, and no "
            "`kindex up` runs for this home: start one, or use `kindex ingest --git`",
            file=sys.stderr,
        )
        return 2

    def put(store: S3Store) -> None:
        def uploaded(version: CommittedVersion, info: ObjectInfo) -> None:
            commit = version.commit
            print(
                f"{describe(store.bucket, info)}\tcommit {commit.commit[:12]} "
                f"{commit.committed_at.isoformat()}",
                flush=True,
            )

        wait = args.wait if args.wait > 0 else None
        put_history(store, settings, history, args.key, wait_seconds=wait, uploaded=uploaded)

    return upload(settings, put)


def upload(settings: Settings, work: Callable[[S3Store], None]) -> int:
    """Run `work(store)` against the configured store; storage failures and keys S3 refuses
    are one line each, never a traceback."""

    try:
        with store_session(settings) as store:
            work(store)
    except (StorageError, GitHistoryError) as error:
        print(f"kindex put: {error}", file=sys.stderr)
        return 1
    except botocore.exceptions.ClientError as error:
        details = error.response.get("Error", {})
        code, message = details.get("Code", "error"), details.get("Message", "")
        print(f"kindex put: S3 refused the upload: {code} {message}".strip(), file=sys.stderr)
        return 1
    except S3UploadFailedError as error:
        print(f"kindex put: S3 refused the upload: {str(error).splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


def describe(bucket: str, info: ObjectInfo) -> str:
    return f"s3://{bucket}/{info.key}\t{info.size} bytes\tETag {info.etag}"
