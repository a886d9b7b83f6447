"""`kindex normalize FILE…`: a dry run of files' sources, before the files are dropped.

Writes one JSON object per data row, in input order (the contract in README.md), or with
`--summary` the counts per status and reason. Streams: memory stays flat as a Liger CSV grows.
A quarantined row's object carries its detail (and JSON pointer). Several files are read in
the order given (each object then names its `file`); the FlashInfer definitions among them
resolve the traces and solutions that name them, as the index would once both were dropped,
and so do the definitions the local index holds when this home has one.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import duckdb
import orjson
from tqdm import tqdm

from pipelines.forked import collect_garbage_rarely
from pipelines.settings import Settings
from pipelines.sources import (
    SourceContext,
    manifests_offered,
    may_offer,
    normalize_object,
    offered_first,
)
from pipelines.sources.liger.normalize import NotLigerCsv, write_outcomes
from pipelines.sources.source import ManifestNamed


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "normalize",
        help="print the records (or quarantine reason) of every row or record of a file, as JSON "
        "lines",
        description="Dry run: normalize a file (a Liger CSV, a worker bundle, or a harness's "
        "result JSON) without uploading it.",
    )
    parser.add_argument(
        "files",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="a Liger CSV, a bundle or a harness's result file; several: FlashInfer traces are "
        "resolved against the definitions among them",
    )
    parser.add_argument(
        "--summary", action="store_true", help="print counts per status and reason instead"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    collect_garbage_rarely()
    out = None if args.summary else sys.stdout.buffer
    progress = not args.no_progress and sys.stderr.isatty()
    several = len(args.files) > 1
    counts: Counter[str] = Counter()
    failed = False
    try:
        with definitions_of(args.files) as lookup:
            for path in args.files:
                try:
                    if several:
                        counts += _normalize_by_source(path, out, lookup, name_file=True)
                        continue
                    try:
                        counts += _normalize(path, out, progress)
                    except NotLigerCsv:
                        counts += _normalize_by_source(path, out, lookup)
                except Unrecognized as error:
                    print(f"kindex normalize: {path}: {error}", file=sys.stderr)
                    failed = True
                except OSError as error:
                    reason = error.strerror or error
                    print(f"kindex normalize: cannot read {path}: {reason}", file=sys.stderr)
                    failed = True
    except BrokenPipeError:
        raise  # `kindex normalize FILE | head`: handled quietly by the CLI
    if args.summary:
        _print_summary(counts)
    return 2 if failed else 0


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


@contextmanager
def definitions_of(paths: Sequence[Path], *, index: bool = True) -> Iterator[ManifestNamed]:
    """What a trace's definition lookup finds: the manifests the files among `paths` offer each
    other (the OperationSpecs of FlashInfer definitions), then (with `index`) those of the local
    index when this home has one."""
    files: list[tuple[str, bytes]] = []
    for path in paths:
        try:
            with path.open("rb") as stream:
                data = stream.read(HEAD_BYTES)
                if may_offer(data):
                    files.append((path.name, data + stream.read(DEFINITION_BYTES)))
        except OSError:
            continue  # said when the file itself is read
    given = manifests_offered(files)
    with _index_lookup() if index else nullcontext(_nothing) as indexed:
        yield offered_first(given, indexed)


HEAD_BYTES = 64 * 1024  # enough to tell a definition (head_text reads as much)
DEFINITION_BYTES = 16 * 2**20  # a definition is a few KiB: no more is read of one


@contextmanager
def _index_lookup() -> Iterator[ManifestNamed]:
    """The manifest of a kind and name the local index holds, when this home has one; the index
    is opened on the first question only (a Liger CSV asks none)."""
    opened: list[duckdb.DuckDBPyConnection | None] = []

    def connection() -> duckdb.DuckDBPyConnection | None:
        if not opened:
            opened.append(_open_index())
        return opened[0]

    def named(kind: str, name: str) -> dict[str, Any] | None:
        con = connection()
        if con is None:
            return None
        sql = "SELECT manifest FROM manifests WHERE kind = ? AND name = ? ORDER BY digest LIMIT 1"
        try:
            row = con.execute(sql, [kind, name]).fetchone()
        except duckdb.Error:
            return None
        return orjson.loads(row[0]) if row else None

    try:
        yield named
    finally:
        if opened and opened[0] is not None:
            opened[0].close()


def _open_index() -> duckdb.DuckDBPyConnection | None:
    settings = Settings.from_env()
    if not settings.home.is_dir():
        return None
    from pipelines.index.local import (  # noqa: PLC0415  a dry run with no home loads no index
        CacheChanged,
        open_locked,
    )

    try:
        return open_locked(settings)
    except (duckdb.Error, OSError, CacheChanged):  # an index that cannot be read: files alone
        return None


def _nothing(kind: str, name: str) -> dict[str, Any] | None:
    return None


def _normalize_by_source(
    path: Path, out: BinaryIO | None, lookup: ManifestNamed, *, name_file: bool = False
) -> Counter[str]:
    """Any file, read as the source that recognizes its bytes (a harness's JSON, a worker
    bundle, a gzipped CSV), or as one `unrecognized_format` line. Its runs are timed, where its
    format records no time, by the file's modification time (an upload would take the
    object's). With `name_file`, each object names the file it comes from."""

    modified = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    received = modified.isoformat().replace("+00:00", "Z")
    context = SourceContext(received_at=received, manifest_named=lookup)
    result = normalize_object(path.name, path.read_bytes(), context=context)
    if result.source == "unrecognized":
        (outcome,) = result.outcomes
        raise Unrecognized(outcome.detail or "no source recognizes it")
    counts: Counter[str] = Counter()
    named = orjson.dumps(str(path))[:-1] if name_file else b""
    for outcome in result.outcomes:
        if out is not None:
            line = outcome.json_line()
            out.write(b'{"file":' + named + b'",' + line[1:] if name_file else line)
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
