"""`kindex normalize FILE`: a dry run of the Liger normalizer, before a file is dropped.

Writes one JSON object per data row, in input order (the contract in README.md), or with
`--summary` the counts per status and reason.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pipelines.liger.normalize import NotLigerCsv, normalize_stream
from pipelines.liger.parallel import RowResult, normalize_parallel, worth_parallel
from pipelines.records import RowOutcome


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
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes (default: all cores for files over 8 MiB, else 1)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        with args.file.open("rb") as stream:
            parallel = args.workers > 1 if args.workers is not None else worth_parallel(stream)
            if parallel:
                results = normalize_parallel(
                    stream, with_lines=not args.summary, workers=args.workers
                )
            else:
                results = (_Row.of(o, with_line=not args.summary) for o in normalize_stream(stream))
            if args.summary:
                _print_summary(results)
            else:
                _print_lines(results)
    except NotLigerCsv as error:
        print(
            f"kindex normalize: {args.file} is not a Liger benchmark CSV: {error}", file=sys.stderr
        )
        return 2
    except BrokenPipeError:
        raise  # `kindex normalize FILE | head`: handled quietly by the CLI
    except OSError as error:
        print(
            f"kindex normalize: cannot read {args.file}: {error.strerror or error}", file=sys.stderr
        )
        return 2
    return 0


class _Row:
    """The serial path's outcome in the shape of the parallel path's RowResult."""

    @staticmethod
    def of(outcome: RowOutcome, *, with_line: bool) -> RowResult:
        facts = outcome.facts
        return RowResult(
            outcome.source_line,
            outcome.status,
            outcome.reason,
            facts.metric if facts else None,
            facts.external_id if facts else None,
            outcome.json_line() if with_line else None,
        )


def _print_lines(results: Iterable[RowResult]) -> None:
    out = sys.stdout.buffer
    for result in results:
        assert result.json_line is not None
        out.write(result.json_line)
    out.flush()


def _print_summary(results: Iterable[RowResult]) -> None:
    counts: Counter[tuple[str, str]] = Counter()
    metrics: Counter[str] = Counter()
    for result in results:
        counts[(result.status, result.reason or "")] += 1
        if result.metric is not None:
            metrics[result.metric] += 1
    total = sum(counts.values())
    print(f"rows: {total}")
    print(
        f"ok: {sum(n for (status, _), n in counts.items() if status == 'ok')}"
        f" (latency runs: {metrics['latency']}, memory runs: {metrics['memory']})"
    )
    print(f"quarantined: {sum(n for (status, _), n in counts.items() if status == 'quarantined')}")
    for (status, reason), n in sorted(counts.items(), key=lambda item: -item[1]):
        if status == "quarantined":
            print(f"  {reason}: {n}")
