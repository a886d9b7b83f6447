"""`kindex normalize FILE`: a dry run of the Liger normalizer, before a file is dropped.

Writes one JSON object per data row, in input order (the contract in README.md), or with
`--summary` the counts per status and reason. Streams: memory stays flat as the file grows.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pipelines.liger.normalize import NotLigerCsv, normalize_stream
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
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        with args.file.open("rb") as stream:
            outcomes = normalize_stream(stream)
            if args.summary:
                _print_summary(outcomes)
            else:
                _print_lines(outcomes)
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
    return 0


def _print_lines(outcomes: Iterable[RowOutcome]) -> None:
    out = sys.stdout.buffer
    for outcome in outcomes:
        out.write(outcome.json_line())
    out.flush()


def _print_summary(outcomes: Iterable[RowOutcome]) -> None:
    counts: Counter[tuple[str, str]] = Counter()
    metrics: Counter[str] = Counter()
    for outcome in outcomes:
        counts[(outcome.status, outcome.reason or "")] += 1
        if outcome.facts is not None:
            metrics[outcome.facts.metric] += 1
    ok = sum(n for (status, _), n in counts.items() if status == "ok")
    quarantined = sum(counts.values()) - ok
    print(f"rows: {sum(counts.values())}")
    print(f"ok: {ok} (latency runs: {metrics['latency']}, memory runs: {metrics['memory']})")
    print(f"quarantined: {quarantined}")
    for (status, reason), n in sorted(counts.items(), key=lambda item: -item[1]):
        if status == "quarantined":
            print(f"  {reason}: {n}")
