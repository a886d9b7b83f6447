"""What a source step produces: records (content-addressed manifests) and per-row outcomes.

This is the contract between the source parsers (Liger CSVs, worker bundles) and everything
downstream (record objects in the bucket, the index, `kindex normalize`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import orjson

Status = Literal["ok", "quarantined"]


@dataclass(frozen=True)
class Record:
    """One manifest and its content address. Treat the manifest as immutable: records are shared
    by every row that references them, and their JSON is serialized once."""

    kind: str
    digest: str
    manifest: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "digest": self.digest, "manifest": self.manifest}

    @cached_property
    def json_fragment(self) -> orjson.Fragment:
        """`as_json()` serialized once, for writers that emit the same record many times."""
        return orjson.Fragment(orjson.dumps(self.as_json()))


@dataclass(slots=True)
class RunFacts:
    """Readable columns of a run that people filter on in the index.

    Everything here is derivable from the records; it is carried so the index need not re-parse
    manifests. Quantities are integers: ``ns`` for latency, ``bytes`` for memory.
    """

    metric: Literal["latency", "memory"]
    unit: Literal["ns", "bytes"]
    kernel: str
    provider: str
    mode: str
    gpu: str
    architecture: str
    dtype: str | None
    case_key: str
    median: int
    p20: int | None
    p80: int | None
    observed_at: str
    external_id: str
    liger_version: str | None
    origin: Literal["reported", "measured"]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RowOutcome:
    """The outcome of one data row (or one manifest of a bundle): records, or a quarantine reason.

    ``source_line`` is 1-based with the header on line 1. ``raw`` is the row's text as read.
    ``records`` lists the BenchmarkRun first, then every manifest it references.
    """

    source_line: int
    status: Status
    raw: str
    reason: str | None = None
    detail: str | None = None
    records: list[Record] = field(default_factory=list)
    facts: RunFacts | None = None
    pointer: str | None = None

    @property
    def run(self) -> Record | None:
        return self.records[0] if self.records else None

    def as_json(self) -> dict[str, Any]:
        """The `kindex normalize` line contract."""
        return {
            "source_line": self.source_line,
            "status": self.status,
            "reason": self.reason,
            "records": [r.as_json() for r in self.records],
        }

    def json_line(self) -> bytes:
        """`as_json()` as one line of JSON, reusing each shared record's serialized form."""
        document = {
            "source_line": self.source_line,
            "status": self.status,
            "reason": self.reason,
            "records": [r.json_fragment for r in self.records],
        }
        return orjson.dumps(document, option=orjson.OPT_APPEND_NEWLINE)
