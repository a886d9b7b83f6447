"""`kindex normalize FILE`: a dry run of the Liger normalizer, before a file is dropped.

Writes one JSON object per data row, in input order (the contract in README.md), or with
`--summary` the counts per status and reason. Streams: memory stays flat as the file grows.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pipelines.liger.columnar import Batch, normalized_batches, write_json_lines
from pipelines.liger.normalize import NotLigerCsv


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
    # Batches make and drop millions of small objects: collect young garbage less often.
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    try:
        with args.file.open("rb") as stream:
            batches = normalized_batches(stream)
            if args.summary:
                _print_summary(batches)
            else:
                _print_lines(batches)
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


def _print_lines(batches: Iterable[Batch]) -> None:
    out = sys.stdout.buffer
    for batch in batches:
        write_json_lines(batch, out)
    out.flush()


def _print_summary(batches: Iterable[Batch]) -> None:
    counts: Counter[tuple[str, str]] = Counter()
    metrics: Counter[str] = Counter()
    for batch in batches:
        runs = batch.runs
        if runs is not None:
            kept = [i for i, p in enumerate(runs.positions) if p not in batch.others]
            memory = [runs.series[runs.series_ids[i]].memory for i in kept]
            counts[("ok", "")] += len(kept)
            metrics["memory"] += sum(memory)
            metrics["latency"] += len(kept) - sum(memory)
        for outcome in batch.others.values():
            counts[(outcome.status, outcome.reason or "")] += 1
            if outcome.facts is not None and outcome.status == "ok":
                metrics[outcome.facts.metric] += 1
    ok = sum(n for (status, _), n in counts.items() if status == "ok")
    quarantined = sum(counts.values()) - ok
    print(f"rows: {sum(counts.values())}")
    print(f"ok: {ok} (latency runs: {metrics['latency']}, memory runs: {metrics['memory']})")
    print(f"quarantined: {quarantined}")
    for (status, reason), n in sorted(counts.items(), key=lambda item: -item[1]):
        if status == "quarantined":
            print(f"  {reason}: {n}")
