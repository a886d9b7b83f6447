"""Shared helpers for the Liger tests: the copied test data and the seed records."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
LIGER_CSV = DATA / "liger" / "all_benchmark_data.csv"
VECTORS = DATA / "vectors" / "all_benchmark_data.vectors.jsonl"
SEEDS = DATA / "seeds"
SCHEMAS = DATA / "kernelindex" / "schemas"
HEADER = LIGER_CSV.read_text(encoding="utf-8").splitlines()[0]

# The kinds of a row's records, in the order `kindex normalize` writes them.
RECORD_ORDER = (
    "run",
    "operation",
    "project",
    "implementation",
    "workload",
    "protocol",
    "environment",
)


@cache
def vectors() -> list[dict[str, Any]]:
    return [json.loads(line) for line in VECTORS.read_text(encoding="utf-8").splitlines()]


def seed(name: str) -> dict[str, Any]:
    """A seed file: a title line, then one JSON object with run, protocol and environment."""
    text = (SEEDS / name).read_text(encoding="utf-8")
    return json.loads(text[text.index("{") :])


def csv_lines(numbers: list[int]) -> list[str]:
    lines = LIGER_CSV.read_text(encoding="utf-8").splitlines()
    return [lines[n - 1] for n in numbers]
