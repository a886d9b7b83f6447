"""`kindex ingest FILE...`: upload, snapshot, write records and publish the index in-process."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipelines.ingest import IngestSummary, SnapshotRecords, ingest_paths


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ingest",
        help="upload files to incoming/, then build records and the index in-process",
        description="Upload each FILE to incoming/<name>, snapshot it, normalize it into record "
        "objects and publish the index; prints a summary.",
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.settings import Settings

    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        print(f"kindex ingest: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    from pipelines.storage.errors import StorageError

    settings = Settings.from_env()
    try:
        summary = ingest_paths(args.files, settings, progress=not args.no_progress)
    except StorageError as error:  # unreachable endpoint, refused credentials: no traceback
        print(f"kindex ingest: {error}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    empty = [f for f in summary.files if f.runs == 0]
    for f in empty:
        print(f"kindex ingest: {no_run_message(f)}", file=sys.stderr)
    return 1 if empty else 0


def no_run_message(f: SnapshotRecords) -> str:
    """What a file given on the command line that yielded no run was, and where its bytes are."""
    reasons = counts(f.quarantined_by_reason)
    return (
        f"{f.source_key} yielded no run ({f.rows} rows; quarantined: {reasons}); its bytes are "
        f"kept in snapshot {f.snapshot_digest}"
    )


def counts(values: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(values.items())) or "none"


def format_summary(summary: IngestSummary) -> str:
    lines = []
    for f in summary.files:
        state = "already processed" if f.reused else "processed"
        lines.append(
            f"{f.source_key}: {f.rows} rows, {f.runs} runs, {f.quarantined} quarantined "
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
