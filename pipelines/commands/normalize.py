"""`kindex normalize FILE`: a dry run of the Liger normalizer, before a file is dropped.

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
from pipelines.sources.liger.columnar import count_outcomes, normalized_batches, write_json_lines
from pipelines.sources.liger.read import NotLigerCsv


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "normalize",
        help="print the records (or quarantine reason) of every row of a Liger CSV, as JSON lines",
        description="Dry run: normalize a Liger benchmark CSV without uploading it.",
    )
    parser.add_argument("file", type=Path, help="a Liger benchmark CSV")
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
        counts = _normalize(args.file, out, progress)
    except NotLigerCsv as error:
        print(
            f"kindex normalize: {args.file} is not a Liger benchmark CSV: {error}", file=sys.stderr
        )
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
    counts: Counter[str] = Counter()
    with (
        path.open("rb") as stream,
        tqdm(
            total=path.stat().st_size,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            disable=not progress,
        ) as bar,
    ):
        for batch in normalized_batches(stream):
            if out is not None:
                write_json_lines(batch, out)
            count_outcomes(batch, counts)
            bar.update(stream.tell() - bar.n)
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
    for reason, n in sorted(quarantined.items(), key=lambda item: -item[1]):
        print(f"  {reason}: {n}")
