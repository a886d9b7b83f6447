"""`kindex` command line. Each subcommand lives in its own module under `pipelines/commands/`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed_version

from pipelines.settings import SettingsError, unknown_names

# Each module exposes `register(subparsers)`, which adds its parser and sets `func`.
COMMAND_MODULES = (
    "pipelines.commands.normalize",
    "pipelines.commands.put",
    "pipelines.commands.ingest",
    "pipelines.commands.query",
    "pipelines.commands.bundle",
    "pipelines.commands.up",
    "pipelines.commands.backfill",
    "pipelines.commands.reconcile",
    "pipelines.commands.chart",
    "pipelines.commands.connect",
)


def version() -> str:
    try:
        return installed_version("kindex")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser. Given the command a user typed, only its module is imported: commands
    import what they need (DuckDB, boto3, Arrow), and a dry run should not wait for the others."""
    names: tuple[str, ...] = COMMAND_MODULES
    if f"pipelines.commands.{command}" in COMMAND_MODULES:
        names = (f"pipelines.commands.{command}",)
    parser = argparse.ArgumentParser(
        prog="kindex",
        description="Drop GPU kernel benchmark results into S3; query a DuckDB/Parquet index.",
    )
    parser.add_argument("--version", action="version", version=f"kindex {version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in names:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
            continue  # a command group not built yet
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    args = build_parser(command).parse_args(argv)

    for warning in unknown_names():
        print(f"kindex: warning: {warning}", file=sys.stderr)
    try:
        return int(args.func(args) or 0)
    except SettingsError as error:  # a bad KINDEX_* value: one line naming it, no traceback
        print(f"kindex: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `kindex normalize big.csv | head` closes stdout early; that is not an error.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
