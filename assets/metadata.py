"""What a person reads on a materialization in the Dagster UI: markdown previews and a chart.

Plain functions over run rows (the columns of a record set's runs.parquet); Dagster-free so
they are cheap to test, but they only serve the UI, hence they live in assets/.
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PREVIEW_ROWS = 10


def _cell(value: object) -> str:
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")[:120]


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    if not rows:
        return "_none_"
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def top_reasons(reasons: Iterable[str | None], n: int = 5) -> list[tuple[str, int]]:
    return Counter(r or "unknown" for r in reasons).most_common(n)


def reasons_markdown(reasons: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"`{reason}` × {count}" for reason, count in reasons) or "none"


def png_markdown(png: bytes, alt: str) -> str:
    """Inline the image: the Dagster UI renders markdown metadata, data URIs included."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode('ascii')})"
