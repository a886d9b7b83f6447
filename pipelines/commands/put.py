"""`kindex put FILE... [--key KEY]`: upload files into the bucket's incoming prefix.

Dagster's sensor notices them there. With no endpoint configured, the embedded S3 server is used:
the one `kindex up` runs, or one started for this command and stopped after it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipelines.incoming import upload_incoming
from pipelines.storage.base import ObjectInfo


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "put",
        help="upload files to incoming/ in the bucket (where Dagster picks them up)",
        description="Upload each FILE to <incoming prefix><file name> (KINDEX_INCOMING_PREFIX, "
        "default incoming/), or to --key. Prints the key, size and ETag of each upload.",
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE")
    parser.add_argument("--key", help="the object key to upload to (only with one FILE)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.settings import Settings
    from pipelines.storage.s3 import StorageError, store_session

    if args.key is not None and (len(args.files) != 1 or not args.key.strip()):
        print("kindex put: --key needs exactly one FILE and a non-empty key", file=sys.stderr)
        return 2
    missing = [str(path) for path in args.files if not path.is_file()]
    if missing:
        print(f"kindex put: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    settings = Settings.from_env()
    try:
        with store_session(settings) as store:
            for path in args.files:
                info = upload_incoming(store, settings, path, args.key)
                print(describe(store.bucket, info), flush=True)
    except StorageError as error:
        print(f"kindex put: {error}", file=sys.stderr)
        return 1
    return 0


def describe(bucket: str, info: ObjectInfo) -> str:
    return f"s3://{bucket}/{info.key}\t{info.size} bytes\tETag {info.etag}"
