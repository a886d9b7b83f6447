"""`kindex bundle validate FILE...`: check a worker result bundle before dropping it.

Prints one line per manifest problem (`FILE:LINE: POINTER: REASON: DETAIL`) and a count of runs
that would be indexed; exits 1 when anything would be quarantined.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pipelines.bundles.normalize import normalize_bundle_bytes


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bundle",
        help="work with GPU-worker result bundles",
        description="GPU-worker result bundles (YAML or JSON).",
    )
    commands = parser.add_subparsers(dest="bundle_command", required=True, metavar="COMMAND")
    validate = commands.add_parser(
        "validate",
        help="report what kindex would quarantine in a bundle",
        description="Read bundles strictly, as the pipeline does, without uploading them.",
    )
    validate.add_argument("files", type=Path, nargs="+", metavar="FILE")
    validate.set_defaults(func=run_validate)


def run_validate(args: argparse.Namespace) -> int:
    failed = False
    for path in args.files:
        try:
            data = path.read_bytes()
        except OSError as error:
            print(f"{path}: cannot read: {error.strerror or error}", file=sys.stderr)
            failed = True
            continue
        runs = manifests = 0
        for outcome in normalize_bundle_bytes(data):
            if outcome.status == "ok":
                runs += outcome.facts is not None
                manifests += outcome.facts is None
                continue
            failed = True
            print(
                f"{path}:{outcome.source_line}: {outcome.pointer or '/'}: "
                f"{outcome.reason}: {outcome.detail}"
            )
        print(f"{path}: {runs} run(s) and {manifests} other manifest(s) ok", file=sys.stderr)
    return 1 if failed else 0
