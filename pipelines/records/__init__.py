"""What a source step produces: records (content-addressed manifests) and per-row outcomes.

This is the contract between the source parsers (Liger CSVs, worker bundles) and everything
downstream (record objects in the bucket, the index, `kindex normalize`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

Status = Literal["ok", "quarantined"]


class Record:
    """One manifest and its content address. Treat the manifest as immutable: records are shared
    by every row that references them, and their JSON is serialized once.

    A record is made from a manifest dict, or from the manifest's JSON text (keys sorted) when a
    template wrote it (Liger runs): then the dict is parsed only if somebody asks for it.
    """

    __slots__ = ("kind", "digest", "_manifest", "_text", "_json")

    def __init__(
        self,
        kind: str,
        digest: str,
        manifest: dict[str, Any] | None = None,
        *,
        manifest_json: str | None = None,
    ) -> None:
        if manifest is None and manifest_json is None:
            raise ValueError("a record needs its manifest or the manifest's JSON")
        self.kind = kind
        self.digest = digest
        self._manifest = manifest
        self._text = manifest_json
        self._json: bytes | None = None

    @property
    def manifest(self) -> dict[str, Any]:
        if self._manifest is None:
            assert self._text is not None
            self._manifest = orjson.loads(self._text)
        return self._manifest

    @property
    def manifest_json(self) -> str:
        """The manifest as JSON text with sorted keys (what the record tables store)."""
        if self._text is None:
            self._text = orjson.dumps(self.manifest, option=orjson.OPT_SORT_KEYS).decode()
        return self._text

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "digest": self.digest, "manifest": self.manifest}

    @property
    def json_bytes(self) -> bytes:
        """`as_json()` serialized once, for writers that emit the same record many times."""
        if self._json is None:
            if self._text is not None and self._manifest is None:
                head = orjson.dumps({"kind": self.kind, "digest": self.digest})[:-1]
                self._json = b'%s,"manifest":%s}' % (head, self._text.encode())
            else:
                self._json = orjson.dumps(self.as_json())
        return self._json

    @property
    def json_fragment(self) -> orjson.Fragment:
        return orjson.Fragment(self.json_bytes)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return (self.kind, self.digest, self.manifest) == (other.kind, other.digest, other.manifest)

    def __hash__(self) -> int:
        return hash((self.kind, self.digest))

    def __repr__(self) -> str:
        return f"Record({self.kind!r}, {self.digest!r})"


@dataclass(slots=True)
class RunFacts:
    """Readable columns of a run that people filter on in the index.

    Everything here is derivable from the records; it is carried so the index need not re-parse
    manifests. Quantities are integers: ``ns`` for latency, ``bytes`` for memory.
    """

    metric: str  # latency or memory for Liger; a harness may report others (instruction_count)
    unit: str  # ns for latency, bytes for memory
    kernel: str
    provider: str
    mode: str
    gpu: str
    architecture: str
    dtype: str | None
    case_key: str
    median: int | None  # None where the run's primary statistic is not a median
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
        document = {
            "source_line": self.source_line,
            "status": self.status,
            "reason": self.reason,
            "records": [r.as_json() for r in self.records],
        }
        return document | self._why()

    def _why(self) -> dict[str, Any]:
        """A quarantined row's detail, and its JSON pointer where it has one: what a user needs
        to find and fix it."""
        if self.status != "quarantined":
            return {}
        return {"detail": self.detail} | ({"pointer": self.pointer} if self.pointer else {})

    def json_line(self) -> bytes:
        """`as_json()` as one line of JSON, reusing each shared record's serialized form
        (pipelines/sources/liger/columnar.py writes the same bytes for its runs)."""
        document = {
            "source_line": self.source_line,
            "status": self.status,
            "reason": self.reason,
            "records": [r.json_fragment for r in self.records],
        } | self._why()
        return orjson.dumps(document, option=orjson.OPT_APPEND_NEWLINE)
