"""docs/benchmarks.md is written by the benchmarks: a run replaces its own rows and keeps the
others'."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from report import HEADER, Figure, write_figures  # noqa: E402


def test_a_run_replaces_its_rows_and_keeps_the_others(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    write_figures([Figure("a: one", "1.0x", ">= 1x"), Figure("b: two", "2.0x")], docs)
    write_figures([Figure("a: one", "1.5x | best", ">= 1x")], docs)
    lines = docs.read_text().splitlines()
    rows = [line for line in lines[lines.index(HEADER) + 2 :] if line]
    assert [row.split(" | ")[:3] for row in rows] == [
        ["| a: one", "1.5x \\| best", ">= 1x"],
        ["| b: two", "2.0x", ""],
    ]
    assert all(len(row.split(" | ")) == 5 for row in rows)


def test_the_sections_after_the_table_are_kept(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    write_figures([Figure("a: one", "1.0x")], docs)
    section = "\n## History\n\nProse, and a table of its own:\n\n| x | y |\n|---|---|\n| 1 | 2 |\n"
    docs.write_text(docs.read_text() + section)
    write_figures([Figure("b: two", "2.0x")], docs)
    text = docs.read_text()
    assert text.endswith(section)
    table = text[: text.index("## History")]
    assert "| a: one |" in table and "| b: two |" in table and "| 1 | 2 |" not in table
