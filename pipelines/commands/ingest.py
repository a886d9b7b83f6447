"""`kindex ingest FILE...`: upload, snapshot, write records and publish the index in-process.
`kindex ingest --git REPO PATH [--key KEY]`: the same for every committed version of PATH."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.git_history import GitHistoryError, file_history, history_key, ingest_history
from pipelines.ingest import IngestSummary, SnapshotRecords, ingest_paths
from pipelines.intake.incoming import IncomingKeyError
from pipelines.settings import Settings
from pipelines.storage.errors import StorageError
from pipelines.storage.s3 import store_session

if TYPE_CHECKING:
    from pipelines.git_history import CommittedVersion


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "ingest",
        help="upload files to incoming/, then build records and the index in-process",
        description="Upload each FILE to incoming/<name>, snapshot it, normalize it into record "
        "objects and publish the index; prints a summary.",
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--git",
        type=Path,
        metavar="REPO",
        help="FILE is a path in REPO: upload every committed version of it, oldest first, to "
        "one key (with its commit and commit time) and process each in turn",
    )
    parser.add_argument(
        "--key", help="with --git: the key under the incoming prefix (default: the file name)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.git is not None or args.key is not None:
        return ingest_git(args, Settings.from_env())
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        print(f"kindex ingest: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2

    settings = Settings.from_env()
    try:
        summary = ingest_paths(args.files, settings, progress=not args.no_progress)
    except StorageError as error:  # unreachable endpoint, refused credentials: no traceback
        print(f"kindex ingest: {error}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    for entry in summary.failed:
        print(f"kindex ingest: {entry.key} failed: {entry.reason}", file=sys.stderr)
    # A file of manifests alone (a FlashInfer definition, a bundle of operations) is not empty.
    empty = [f for f in summary.files if f.runs == 0 and not f.manifests_by_kind]
    for f in empty:
        print(f"kindex ingest: {no_run_message(f)}", file=sys.stderr)
    return 1 if empty or summary.failed else 0


def no_run_message(f: SnapshotRecords) -> str:
    """What a file given on the command line that yielded no run was, and where its bytes are."""
    reasons = counts(f.quarantined_by_reason)
    return (
        f"{f.source_key} yielded no run ({f.rows} rows; quarantined: {reasons}); its bytes are "
        f"kept in snapshot {f.snapshot_digest}"
    )


def ingest_git(args: argparse.Namespace, settings: Settings) -> int:
    """`--git REPO PATH`: the file's history, version by version, in-process."""

    if args.git is None:
        print("kindex ingest: --key goes with --git (FILE goes to its name)", file=sys.stderr)
        return 2
    if len(args.files) != 1:
        print("kindex ingest: --git REPO takes one FILE, a path in REPO", file=sys.stderr)
        return 2
    try:
        history = file_history(args.git, args.files[0])
        history_key(settings, history, args.key)
    except (GitHistoryError, IncomingKeyError) as error:
        print(f"kindex ingest: {error}", file=sys.stderr)
        return 2
    try:
        with store_session(settings) as store:
            summary = ingest_history(
                store, settings, history, args.key, progress=not args.no_progress
            )
    except (StorageError, GitHistoryError) as error:
        print(f"kindex ingest: {error}", file=sys.stderr)
        return 1
    print(format_summary(summary, history.versions))
    return 0


def counts(values: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(values.items())) or "none"


def format_summary(
    summary: IngestSummary, versions: Sequence[CommittedVersion] | None = None
) -> str:
    """The summary; with `versions` (--git, one per file), each line names its commit."""
    lines = []
    for n, f in enumerate(summary.files):
        state = "already processed" if f.reused else "processed"
        commit = ""
        if versions is not None:
            version = versions[n].commit
            commit = f"commit {version.commit[:10]} {version.committed_at.date()}: "
        lines.append(
            f"{f.source_key}: {commit}{f.rows} rows, {f.runs} runs, {f.quarantined} quarantined "
            f"({state}; snapshot {f.snapshot_digest[:19]}, parser {f.parser_version})"
        )
    index = summary.index
    totals = index.counts
    lines += [
        f"rows: {summary.rows}",
        f"runs by metric: {counts(summary.runs_by_metric)}",
        f"quarantined by reason: {counts(summary.quarantined_by_reason)}",
        f"index {index.version or '(empty)'}"
        + (f": {index.new_runs} new runs" if index.published else ": unchanged"),
        "index totals: "
        + counts(
            {
                k: totals.get(k, 0)
                for k in ("runs", "snapshots", "quarantine", "superseded", "retracted", "manifests")
            }
        ),
    ]
    return "\n".join(lines)
