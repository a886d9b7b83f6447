"""The one place a dropped object's source is chosen, by content.

Every source (a Liger CSV, a worker bundle, each harness's result format) is a folder beside
this file behind the interface in `source.py`: it recognizes its bytes, names its parser
version, and gives an object's outcomes (one per row or entry, for a dry run) and its record
tables. `source_of` picks the first source that recognizes the bytes; an object none
recognizes is read as `Unrecognized`, one quarantined outcome.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.records import RowOutcome
from pipelines.sources.flashinfer import FlashInferTrace
from pipelines.sources.gbench import GoogleBenchmarkJson
from pipelines.sources.kernelbench import KernelBenchTiming
from pipelines.sources.nvbench import NvbenchJson
from pipelines.sources.pytorch_v3 import PyTorchBenchmarkV3
from pipelines.sources.source import (
    HarnessSource,
    RecordsOfOutcomes,
    Source,
    SourceContext,
    SourceObject,
    record_set_of_outcomes,
)
from pipelines.sources.tritonbench import TritonBenchJson

if TYPE_CHECKING:
    from pipelines.index.record_objects import RecordSetContent

__all__ = [
    "HarnessSource",
    "RecordsOfOutcomes",
    "Source",
    "SourceContext",
    "SourceObject",
    "record_set_of_outcomes",
    "SOURCES",
    "source_of",
    "normalize_object",
]


class WorkerBundle(RecordsOfOutcomes):
    name = "worker-bundle"
    reads_index = True  # a bundle may name manifests another file carried

    def recognize(self, key: str, data: bytes) -> str | None:
        from pipelines.sources.bundles.sniff import looks_like_bundle

        return None if looks_like_bundle(key, data) else "not a worker bundle"

    def parser_version(self) -> str:
        from pipelines.sources.bundles.normalize import PARSER_VERSION

        return PARSER_VERSION

    def outcomes(self, data: bytes, context: SourceContext) -> Iterator[RowOutcome]:
        from pipelines.sources.bundles.normalize import normalize_bundle_bytes

        return normalize_bundle_bytes(data, context.known_digest)


class LigerCsvSource:
    name = "liger-csv"
    reads_index = False

    def recognize(self, key: str, data: bytes) -> str | None:
        from pipelines.sources.liger.read import NotLigerCsv, open_liger_csv

        try:
            open_liger_csv(io.BytesIO(data))
        except NotLigerCsv as error:
            return str(error)
        return None

    def parser_version(self) -> str:
        from pipelines.sources.liger.normalize import parser_version

        return parser_version()

    def version_of(self, data: bytes, context: SourceContext) -> str:
        return self.parser_version()

    def outcomes(self, data: bytes, context: SourceContext) -> Iterator[RowOutcome]:
        from pipelines.sources.liger.normalize import normalize_bytes

        return normalize_bytes(data)

    def record_set(
        self, data: bytes, snapshot_digest: str, context: SourceContext, parts_dir: Path
    ) -> RecordSetContent:
        from pipelines.sources.liger.normalize import record_set

        return record_set(data, snapshot_digest, self.parser_version())

    def record_sets(
        self, objects: Sequence[SourceObject], context: SourceContext, parts_dir: Path
    ) -> list[RecordSetContent]:
        from pipelines.sources.liger.normalize import record_sets

        files = [(o.data, o.snapshot_digest) for o in objects]
        return record_sets(files, self.parser_version())


class Unrecognized(RecordsOfOutcomes):
    """What an object no source recognizes is read as: one quarantined outcome."""

    name = "unrecognized"

    def __init__(self, why: str) -> None:
        self.why = why

    def recognize(self, key: str, data: bytes) -> str | None:
        return None

    def parser_version(self) -> str:
        return LigerCsvSource().parser_version()

    def outcomes(self, data: bytes, context: SourceContext) -> Iterator[RowOutcome]:
        return iter([unrecognized(data, self.why)])


# In the order they are tried: a bundle is recognized by its first bytes, a CSV by its header.
@dataclass(slots=True)
class SourceResult:
    source: str  # the Source's name, or "unrecognized"
    parser_version: str
    outcomes: Iterator[RowOutcome]
    reader: Source


# In the order they are tried. Each harness recognizes its own JSON by what it holds, so their
# order among themselves does not matter; a bundle must claim to be one; a CSV is recognized by
# its header.
SOURCES: tuple[Source, ...] = (
    FlashInferTrace(),
    GoogleBenchmarkJson(),
    KernelBenchTiming(),
    NvbenchJson(),
    PyTorchBenchmarkV3(),
    TritonBenchJson(),
    WorkerBundle(),
    LigerCsvSource(),
)


def current_parser_versions() -> frozenset[str]:
    """The parser versions a record set made now would carry, one per source."""
    return frozenset(source.parser_version() for source in SOURCES)


def source_of(key: str, data: bytes) -> Source:
    """The first source that recognizes the bytes of one object version; an object none
    recognizes is read as Unrecognized, which says why."""
    whys = []
    for source in SOURCES:
        why = source.recognize(key, data)
        if why is None:
            return source
        whys.append(why)
    return Unrecognized(whys[-1])


def normalize_object(
    key: str, data: bytes, *, context: SourceContext | None = None
) -> SourceResult:
    """The outcomes of one object version's bytes, by its source. Never raises on bad content:
    a file that no source recognizes yields a single quarantined outcome that says why."""
    return read_as(source_of(key, data), data, context)


def read_as(source: Source, data: bytes, context: SourceContext | None = None) -> SourceResult:
    outcomes = source.outcomes(data, context or SourceContext())
    return SourceResult(source.name, source.parser_version(), outcomes, source)


RAW_PREVIEW_BYTES = 4096


def unrecognized(data: bytes, why: str) -> RowOutcome:
    """The single outcome of an object no source recognizes. Its bytes stay in the snapshot; the
    outcome keeps a readable preview of the start, with undecodable bytes escaped."""
    preview = data[:RAW_PREVIEW_BYTES].decode("utf-8", errors="backslashreplace")
    names = ", ".join(source.name for source in SOURCES)
    return RowOutcome(
        1,
        "quarantined",
        preview,
        "unrecognized_format",
        f"no source recognizes it ({names}); as a Liger CSV: {why}",
    )
