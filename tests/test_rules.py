"""The rulebook (pipelines/records/rules.py): each rule's scalar and column-wise forms agree, and
the sources call it rather than restating it."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines.records.rules import (
    MAX_SAFE_INTEGER,
    Reason,
    half_up,
    half_up_columns,
    joined_slugs,
    key_of,
    name_of,
    safe_columns,
    slug,
)

ROOT = Path(__file__).resolve().parents[1]

VALUES = [
    0.0,
    0.5,
    1.5,
    2.5,
    -0.5,
    -1.5,
    0.49999999999999994,  # floor(v + 0.5) rounds this up; JavaScript's Math.round does not
    2.0**52 + 1,  # past 2**52 every double is whole: adding 0.5 would round it to the next even
    123456.4999,
    1e15 + 0.5,
]


@pytest.mark.parametrize("value", VALUES)
def test_rounding_is_javascripts_and_both_forms_agree(value: float) -> None:
    expected = {0.49999999999999994: 0, 2.0**52 + 1: 2**52 + 1, -0.5: 0, -1.5: -1, 2.5: 3}
    rounded = half_up(value)
    if value in expected:
        assert rounded == expected[value]
    assert half_up_columns(np.array([value]))[0] == rounded


def test_safe_columns_hold_what_json_holds_exactly() -> None:
    stored = np.array([[1.0, np.nan], [float(MAX_SAFE_INTEGER), 0.0], [2.0**53, 1.0]])
    assert safe_columns(stored).tolist() == [True, True, False]


def test_names_slugs_and_keys() -> None:
    assert slug(" Fused  Linear/Cross-Entropy ") == "fused-linear-cross-entropy"
    assert name_of("NVIDIA", "H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert name_of("", "---") == "unspecified"
    assert name_of("x" * 199 + "-y", limit=200) == "x" * 199  # never ends in a separator
    assert name_of("???", empty="unnamed") == "unnamed"
    assert key_of("D") == "d" and key_of("2x") == "x_2x" and key_of("") == "unspecified"
    parts = [["Liger", "", "A"], ["-x-", "b", "c"]]
    columns = [pa.array([slug(row[i]) for row in parts]) for i in range(3)]
    assert joined_slugs(columns).to_pylist() == [slug("-".join(row)) for row in parts]


def test_reason_codes_are_one_table() -> None:
    assert len({r.value for r in Reason}) == len(Reason)
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", r.value) for r in Reason)


def test_no_source_restates_a_rule() -> None:
    """The rulebook's constants and regexes are written once: not again under pipelines/."""
    restated = re.compile(
        r"=\s*2\*\*53|\"ms\": 1e6|floor\(value \+ 0\.5\)|\[:(?:200|100)\]|class Reason\("
    )
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "pipelines").rglob("*.py"))
        if path.name != "rules.py" or path.parent.name != "records"
        for n, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if restated.search(line)
    ]
    assert not found, found
