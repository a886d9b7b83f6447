"""`kindex bundle validate FILE...`: check a worker result bundle before dropping it.

Prints one line per manifest problem (`FILE:LINE: POINTER: REASON: DETAIL`) and a count of runs
that would be indexed; exits 1 when anything would be quarantined. A file the pipeline would not
read as a bundle (a Liger CSV, a README) is named for what it is. Digests a bundle names without
carrying are looked up in the local index, when this home has one.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pipelines.records.rules import Reason
from pipelines.settings import Settings
from pipelines.sources.bundles.normalize import never_known, normalize_bundle_bytes
from pipelines.sources.bundles.sniff import looks_like_bundle
from pipelines.sources.liger.read import NotLigerCsv, open_liger_csv

# Whole-text verdicts that say the text is no bundle at all, rather than a bundle with faults.
UNREADABLE_AS_BUNDLE = frozenset(
    {Reason.YAML_SYNTAX, Reason.JSON_SYNTAX, Reason.EMPTY, Reason.NOT_A_BUNDLE}
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def what_it_is(path: Path, data: bytes) -> str | None:
    """None for what the pipeline reads as a bundle; else what the file is instead."""
    if looks_like_bundle(path.name, data):
        return None

    try:
        open_liger_csv(io.BytesIO(data))
    except NotLigerCsv as error:
        return f"not a bundle (no JSON document or `apiVersion:` line) nor a Liger CSV: {error}"
    return "a Liger CSV, not a bundle: drop it as it is (`kindex normalize FILE` checks it)"


@contextmanager
def known_digests() -> Iterator[tuple[Callable[[str], bool], str]]:
    """Whether the local index holds a manifest of a digest, and what was looked in."""

    settings = Settings.from_env()
    if not settings.home.is_dir():
        yield never_known, "the bundle only (no kindex home here)"
        return
    from pipelines.index.local import open_locked  # noqa: PLC0415  a check with no home loads no index

    con = open_locked(settings)

    def known(digest: str) -> bool:
        sql = "SELECT 1 FROM manifests WHERE digest = ? LIMIT 1"
        return con.execute(sql, [digest]).fetchone() is not None

    try:
        yield known, f"the bundle and the local index at {settings.home}"
    finally:
        con.close()


def run_validate(args: argparse.Namespace) -> int:
    failed = False
    with known_digests() as (known, looked_in):
        for path in args.files:
            try:
                data = path.read_bytes()
            except OSError as error:
                print(f"{path}: cannot read: {error.strerror or error}", file=sys.stderr)
                failed = True
                continue
            other = what_it_is(path, data)
            if other is not None:
                print(f"{path}: {other}")
                failed = True
                continue
            runs = manifests = 0
            outcomes = list(normalize_bundle_bytes(data, known))
            if len(outcomes) == 1 and outcomes[0].reason in UNREADABLE_AS_BUNDLE:
                outcome = outcomes[0]
                print(
                    f"{path}:{outcome.source_line}: not a bundle: {outcome.reason}: "
                    f"{outcome.detail}"
                )
                failed = True
                continue
            for outcome in outcomes:
                if outcome.status == "ok":
                    runs += outcome.facts is not None
                    manifests += outcome.facts is None
                    continue
                failed = True
                pointer = outcome.pointer or "/"
                # The detail names each problem's pointer; the first is the line's own.
                detail = (outcome.detail or "").removeprefix(f"{pointer}: ")
                if known is never_known:
                    detail = detail.replace(" in the bundle or the index", " in the bundle")
                print(f"{path}:{outcome.source_line}: {pointer}: {outcome.reason}: {detail}")
            print(
                f"{path}: {runs} run(s) and {manifests} other manifest(s) ok "
                f"(digests looked up in {looked_in})",
                file=sys.stderr,
            )
    return 1 if failed else 0
