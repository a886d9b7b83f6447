"""`kindex normalize FILE`: a dry run of a file's source, before the file is dropped.

Writes one JSON object per data row, in input order (the contract in README.md), or with
`--summary` the counts per status and reason. Streams: memory stays flat as the file grows.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any, BinaryIO

from tqdm import tqdm

from pipelines.forked import collect_garbage_rarely
from pipelines.sources.liger.normalize import NotLigerCsv, write_outcomes


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "normalize",
        help="print the records (or quarantine reason) of every row or record of a file, as JSON "
        "lines",
        description="Dry run: normalize a file (a Liger CSV, a worker bundle, or a harness's "
        "result JSON) without uploading it.",
    )
    parser.add_argument("file", type=Path, help="a Liger CSV, a bundle or a harness's result file")
    parser.add_argument(
        "--summary", action="store_true", help="print counts per status and reason instead"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    collect_garbage_rarely()
    try:
        out = None if args.summary else sys.stdout.buffer
        progress = not args.no_progress and sys.stderr.isatty()
        try:
            counts = _normalize(args.file, out, progress)
        except NotLigerCsv:
            counts = _normalize_by_source(args.file, out)
    except Unrecognized as error:
        print(f"kindex normalize: {args.file}: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        raise  # `kindex normalize FILE | head`: handled quietly by the CLI
    except OSError as error:
        reason = error.strerror or error
        print(f"kindex normalize: cannot read {args.file}: {reason}", file=sys.stderr)
        return 2
    if args.summary:
        _print_summary(counts)
    return 0


def _normalize(path: Path, out: BinaryIO | None, progress: bool = False) -> Counter[str]:
    """Write the lines to `out` (unless None); the counts by status and reason. With
    `progress`, a bar of the bytes read on stderr."""
    if not progress:
        return write_outcomes(path, out)
    # No tqdm monitor thread: in a process of one thread, a large file's workers fork from it
    # with its curation loaded (pipelines.forked.worker_context), not from a forkserver.
    tqdm.monitor_interval = 0
    with tqdm(total=path.stat().st_size, unit="B", unit_scale=True, unit_divisor=1024) as bar:
        return write_outcomes(path, out, bar.update)


class Unrecognized(ValueError):
    """No source recognizes the file: dropped, it would be one `unrecognized_format` row."""


def _normalize_by_source(path: Path, out: BinaryIO | None) -> Counter[str]:
    """Any other file, read as the source that recognizes its bytes (a harness's JSON, a worker
    bundle), or as one `unrecognized_format` line. Its runs are timed, where its format records
    no time, by the file's modification time (an upload would take the object's)."""
    from datetime import UTC, datetime

    from pipelines.sources import SourceContext, normalize_object

    modified = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    context = SourceContext(received_at=modified.isoformat().replace("+00:00", "Z"))
    result = normalize_object(path.name, path.read_bytes(), context=context)
    if result.source == "unrecognized":
        (outcome,) = result.outcomes
        raise Unrecognized(outcome.detail or "no source recognizes it")
    counts: Counter[str] = Counter()
    for outcome in result.outcomes:
        if out is not None:
            out.write(outcome.json_line())
        if outcome.status == "ok":
            counts[f"ok:{outcome.facts.metric if outcome.facts else 'manifests'}"] += 1
        else:
            counts[f"quarantined:{outcome.reason}"] += 1
    if out is not None:
        out.flush()
    return counts


def _print_summary(counts: Counter[str]) -> None:
    ok = {k.split(":", 1)[1]: n for k, n in counts.items() if k.startswith("ok:")}
    quarantined = {k.split(":", 1)[1]: n for k, n in counts.items() if k.startswith("quarantined:")}
    print(f"rows: {sum(counts.values())}")
    print(
        f"ok: {sum(ok.values())} (latency runs: {ok.get('latency', 0)},"
        f" memory runs: {ok.get('memory', 0)})"
    )
    print(f"quarantined: {sum(quarantined.values())}")
    # Most first; a tie by name, so that how the file was cut into batches cannot order it.
    for reason, n in sorted(quarantined.items(), key=lambda item: (-item[1], item[0])):
        print(f"  {reason}: {n}")
