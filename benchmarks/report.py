"""docs/benchmarks.md: one table, a row per benchmark figure, written by the benchmarks.

Each benchmark script takes `--write-docs`; given it, the script replaces its own rows (by their
`benchmark` cell) with the figures it just measured, dated and tagged with the commit measured,
and leaves every other row as it was. Nobody edits the table by hand.
"""

from __future__ import annotations

import argparse
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
HEADER = "| benchmark | figure | target | date | commit |"
RULE = "|---|---|---|---|---|"
SECTION = "\n## "  # a section after the table: kept as it is
PREAMBLE = """# Benchmarks

The latest figure of each benchmark, written by the benchmark itself
(`.venv/bin/python benchmarks/<script>.py --write-docs`), never by hand. Each figure is a ratio
against a baseline measured in the same run, or a median of several runs. They were measured on
shared, noisy 2-core machines: read the ratios, not the times.

"""


@dataclass(frozen=True, slots=True)
class Figure:
    benchmark: str  # the row's key: what was measured, e.g. "normalize: 300k rows vs DuckDB"
    figure: str  # what was measured, e.g. "0.21x (62k vs 295k rows/s)"
    target: str = ""  # the target it answers to, e.g. ">= 0.15x"


def add_write_docs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help=f"write this run's figures into {DOCS.relative_to(ROOT)}",
    )


def commit() -> str:
    """The commit measured: its short hash, marked when the tree had uncommitted changes (but
    for the table itself, which each benchmark of a run writes in turn)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    table = f":(exclude){DOCS.relative_to(ROOT)}"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", table)
    return f"{head}+dirty" if dirty else head


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_figures(figures: list[Figure], path: Path = DOCS) -> None:
    """Replace these figures' rows in the table (add them where new), keeping the others and
    the sections that follow the table (each starting with a `## ` heading)."""
    rows: dict[str, str] = {}
    sections = ""
    if path.exists():
        text, heading, rest = path.read_text(encoding="utf-8").partition(SECTION)
        sections = heading + rest
        for line in text.splitlines():
            if line.startswith("| ") and line not in (HEADER, RULE):
                key = line.split(" | ")[0].removeprefix("| ")
                rows[key] = line
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    measured = commit()
    for figure in figures:
        key = _cell(figure.benchmark)
        rows[key] = (
            f"| {key} | {_cell(figure.figure)} | {_cell(figure.target)} | {date} | {measured} |"
        )
    table = "\n".join([HEADER, RULE, *(rows[key] for key in sorted(rows))])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PREAMBLE + table + "\n" + sections, encoding="utf-8")
    print(f"wrote {len(figures)} figure(s) into {path}")
