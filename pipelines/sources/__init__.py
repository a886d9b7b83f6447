"""The source interface, and the one place a dropped object's source is chosen, by content.

Every source (a Liger CSV, a worker bundle) is a folder beside this file and a `Source` here:
it recognizes its bytes, names its parser version, and gives an object's outcomes (one per row
or entry, for a dry run) and its record tables. A source is pure: bytes and a context in,
tables out; storage is the caller's. `source_of` picks the first source that recognizes the
bytes; an object none recognizes is read as `Unrecognized`, one quarantined outcome.
"""

from __future__ import annotations

import io
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pipelines.records import RowOutcome

if TYPE_CHECKING:
    from pipelines.index.record_objects import RecordSetContent

KnownDigest = Callable[[str], bool]


def _never_known(digest: str) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class SourceContext:
    """What a source may look up beyond the bytes it reads. `known_digest(d)`: whether the index
    already holds a manifest with digest `d` (a worker bundle may name such manifests without
    carrying them)."""

    known_digest: KnownDigest = _never_known


@dataclass(frozen=True, slots=True)
class SourceObject:
    """The bytes of one object version, and their content digest (its snapshot's)."""

    snapshot_digest: str
    data: bytes


class Source(Protocol):
    name: str  # as record sets and reads name their source

    def recognize(self, key: str, data: bytes) -> str | None:
        """None when the bytes are this source's, else why they are not."""
        ...

    def parser_version(self) -> str: ...

    def outcomes(self, data: bytes, context: SourceContext) -> Iterator[RowOutcome]:
        """One outcome per row or entry, in order (`kindex normalize`, a dry run)."""
        ...

    def record_set(
        self, data: bytes, snapshot_digest: str, context: SourceContext, parts_dir: Path
    ) -> RecordSetContent:
        """The object's record tables. `parts_dir`: an empty folder where the source may spool
        large tables as Parquet parts (RecordSetContent.parts), kept until they are written."""
        ...

    def record_sets(
        self, objects: Sequence[SourceObject], context: SourceContext, parts_dir: Path
    ) -> list[RecordSetContent]:
        """The record tables of several objects of this source, in their order: a batch of
        small files pays the source's fixed cost once."""
        ...


@dataclass(slots=True)
class SourceResult:
    source: str  # the Source's name, or "unrecognized"
    parser_version: str
    outcomes: Iterator[RowOutcome]
    reader: Source


def record_set_of_outcomes(
    outcomes: Iterator[RowOutcome], snapshot_digest: str, parser_version: str
) -> RecordSetContent:
    """Record tables built outcome by outcome (any source can)."""
    from pipelines.index.record_objects import RecordSetBuilder, RecordSetContent

    builder = RecordSetBuilder(snapshot_digest, parser_version)
    for outcome in outcomes:
        builder.add(outcome)
    return RecordSetContent(builder.rows, builder.tables())


class RecordsOfOutcomes(ABC):
    """A source whose record tables are built outcome by outcome."""

    @abstractmethod
    def parser_version(self) -> str: ...

    @abstractmethod
    def outcomes(self, data: bytes, context: SourceContext) -> Iterator[RowOutcome]: ...

    def record_set(
        self, data: bytes, snapshot_digest: str, context: SourceContext, parts_dir: Path
    ) -> RecordSetContent:
        outcomes = self.outcomes(data, context)
        return record_set_of_outcomes(outcomes, snapshot_digest, self.parser_version())

    def record_sets(
        self, objects: Sequence[SourceObject], context: SourceContext, parts_dir: Path
    ) -> list[RecordSetContent]:
        return [self.record_set(o.data, o.snapshot_digest, context, parts_dir) for o in objects]


class WorkerBundle(RecordsOfOutcomes):
    name = "worker-bundle"

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
SOURCES: tuple[Source, ...] = (WorkerBundle(), LigerCsvSource())


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
    return RowOutcome(
        1,
        "quarantined",
        preview,
        "unrecognized_format",
        f"not a Liger CSV or a worker bundle: {why}",
    )
