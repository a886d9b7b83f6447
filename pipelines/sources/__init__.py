"""Which source a dropped object is, recognized by content, and its records: chosen here only.

Every source (a Liger CSV, a worker bundle) is a `Source`: it recognizes its bytes, names its
parser version, and gives an object's outcomes (one per row or entry) and its record tables.
`normalize_object` picks the first source that recognizes the bytes; an object none recognizes
is one quarantined outcome. `record_set_content` builds the picked source's record tables.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pipelines.records import RowOutcome

if TYPE_CHECKING:
    from pipelines.index.record_objects import RecordSetContent

KnownDigest = Callable[[str], bool]
# Called once the work runs: the snapshot's digest, or None when its record set exists already.
DigestUnlessWritten = Callable[[], "str | None"]


class Source(Protocol):
    name: str  # as record sets and reads name their source

    def recognize(self, key: str, data: bytes) -> str | None:
        """None when the bytes are this source's, else why they are not."""
        ...

    def parser_version(self) -> str: ...

    def outcomes(self, data: bytes, known_digest: KnownDigest) -> Iterator[RowOutcome]:
        """One outcome per row or entry, in order."""
        ...

    def record_set(
        self,
        result: SourceResult,
        data: bytes,
        digest_unless_written: DigestUnlessWritten,
        parts_dir: Path,
        parallel: bool,
    ) -> RecordSetContent | None:
        """The object's record tables; None when `digest_unless_written` says they exist.
        `parallel`: the object is large enough to be worth every core, if the source can."""
        ...


@dataclass(slots=True)
class SourceResult:
    source: str  # "liger-csv" | "worker-bundle" | "unrecognized"
    parser_version: str
    outcomes: Iterator[RowOutcome]
    reader: Source


def record_set_of_outcomes(
    result: SourceResult, digest_unless_written: DigestUnlessWritten
) -> RecordSetContent | None:
    """Record tables built outcome by outcome (any source can)."""
    from pipelines.index.record_objects import RecordSetBuilder, RecordSetContent

    snapshot_digest = digest_unless_written()
    if snapshot_digest is None:
        return None
    builder = RecordSetBuilder(snapshot_digest, result.parser_version)
    for outcome in result.outcomes:
        builder.add(outcome)
    return RecordSetContent(builder.rows, builder.tables())


class RecordsOfOutcomes:
    """A source whose record tables are built outcome by outcome."""

    def record_set(
        self,
        result: SourceResult,
        data: bytes,
        digest_unless_written: DigestUnlessWritten,
        parts_dir: Path,
        parallel: bool,
    ) -> RecordSetContent | None:
        return record_set_of_outcomes(result, digest_unless_written)


class WorkerBundle(RecordsOfOutcomes):
    name = "worker-bundle"

    def recognize(self, key: str, data: bytes) -> str | None:
        from pipelines.sources.bundles.sniff import looks_like_bundle

        return None if looks_like_bundle(key, data) else "not a worker bundle"

    def parser_version(self) -> str:
        from pipelines.sources.bundles.normalize import PARSER_VERSION

        return PARSER_VERSION

    def outcomes(self, data: bytes, known_digest: KnownDigest) -> Iterator[RowOutcome]:
        from pipelines.sources.bundles.normalize import normalize_bundle_bytes

        return normalize_bundle_bytes(data, known_digest)


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

    def outcomes(self, data: bytes, known_digest: KnownDigest) -> Iterator[RowOutcome]:
        from pipelines.sources.liger.normalize import normalize_bytes

        return normalize_bytes(data)

    def record_set(
        self,
        result: SourceResult,
        data: bytes,
        digest_unless_written: DigestUnlessWritten,
        parts_dir: Path,
        parallel: bool,
    ) -> RecordSetContent | None:
        """A large file on every core (pipelines/sources/liger/relay.py), a small one in batches
        here;
        neither goes row by row."""
        from pipelines.index.record_objects import RecordSetContent
        from pipelines.sources.liger.relay import record_set_file
        from pipelines.sources.liger.tables import record_tables

        if parallel:
            return record_set_file(
                data, digest_unless_written, result.parser_version, parts_dir=parts_dir
            )
        snapshot_digest = digest_unless_written()
        if snapshot_digest is None:
            return None
        rows, tables = record_tables(io.BytesIO(data), snapshot_digest, result.parser_version)
        # A run twice in one file has one externalId twice, and the second is quarantined: each
        # run's lineage row is its own, which the runs object holds (one object fewer to write).
        lineage_in_runs = tables["lineage"].num_rows == tables["runs"].num_rows
        return RecordSetContent(rows, tables, lineage_in_runs=lineage_in_runs)


class Unrecognized(RecordsOfOutcomes):
    """What an object no source recognizes is read as: one quarantined outcome."""

    name = "unrecognized"

    def __init__(self, why: str) -> None:
        self.why = why

    def recognize(self, key: str, data: bytes) -> str | None:
        return None

    def parser_version(self) -> str:
        return LigerCsvSource().parser_version()

    def outcomes(self, data: bytes, known_digest: KnownDigest) -> Iterator[RowOutcome]:
        return iter([unrecognized(data, self.why)])


# In the order they are tried: a bundle is recognized by its first bytes, a CSV by its header.
SOURCES: tuple[Source, ...] = (WorkerBundle(), LigerCsvSource())


def normalize_object(
    key: str, data: bytes, *, known_digest: KnownDigest | None = None
) -> SourceResult:
    """Normalize the bytes of one object version. Never raises on bad content: a file that no
    source recognizes yields a single quarantined outcome that says why.

    `known_digest(d)` tells whether the index already holds a manifest with digest `d`; a worker
    bundle may name such manifests without carrying them."""
    whys = []
    for source in SOURCES:
        why = source.recognize(key, data)
        if why is None:
            return read_as(source, data, known_digest)
        whys.append(why)
    return read_as(Unrecognized(whys[-1]), data, known_digest)


def read_as(source: Source, data: bytes, known_digest: KnownDigest | None = None) -> SourceResult:
    outcomes = source.outcomes(data, known_digest or _never_known)
    return SourceResult(source.name, source.parser_version(), outcomes, source)


def record_set_content(
    result: SourceResult,
    data: bytes,
    digest_unless_written: DigestUnlessWritten,
    parts_dir: Path,
    *,
    parallel: bool,
) -> RecordSetContent | None:
    """The record set of one normalized object, by its source, unless `digest_unless_written`,
    called once the work runs, gives None: then nothing is built. `parallel`: worth every
    core (pipelines/sources/liger/relay.worth_relay), where the source can use them."""
    return result.reader.record_set(result, data, digest_unless_written, parts_dir, parallel)


def _never_known(digest: str) -> bool:
    return False


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
