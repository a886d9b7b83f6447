"""The one place a dropped object's source is chosen, by content.

Every source (a Liger CSV, a worker bundle, each harness's result format) is a folder beside
this file behind the interface in `source.py`: it recognizes its bytes, names its parser
version, and gives an object's outcomes (one per row or entry, for a dry run) and its record
tables. `source_of` picks the first source that recognizes the bytes; an object none
recognizes is read as `Unrecognized`, one quarantined outcome that names the format it comes
closest to and what it lacks (each source that can says how close a file's start comes,
`closeness`, and what it lacks, `lacks`).

A gzip file is unpacked here, once, before any source sees it (within json_input's bound: a
gzip bomb is one `too_large` row): every source, the Liger CSV too, reads plain bytes.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pipelines.records import RowOutcome
from pipelines.records.rules import Reason
from pipelines.sources.bundles.normalize import PARSER_VERSION, normalize_bundle_bytes
from pipelines.sources.bundles.sniff import looks_like_bundle
from pipelines.sources.flashinfer import FlashInferTrace
from pipelines.sources.gbench import GoogleBenchmarkJson
from pipelines.sources.json_input import JsonInputError, head_text, looks_gzipped, unpacked
from pipelines.sources.kernelbench import KernelBenchTiming
from pipelines.sources.liger.normalize import (
    normalize_bytes,
    parser_version,
    record_set,
    record_sets,
)
from pipelines.sources.liger.read import NotLigerCsv, open_liger_csv
from pipelines.sources.nvbench import NvbenchJson
from pipelines.sources.pytorch_v3 import PyTorchBenchmarkV3
from pipelines.sources.source import (
    HarnessSource,
    ManifestNamed,
    RecordsOfOutcomes,
    Source,
    SourceContext,
    SourceObject,
    record_set_of_outcomes,
)
from pipelines.sources.tritonbench import TritonBenchJson

if TYPE_CHECKING:
    from pipelines.records.record_objects import RecordSetContent

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
    "manifests_offered",
    "offered_first",
]


class WorkerBundle(RecordsOfOutcomes):
    name = "worker-bundle"
    reads_index = True  # a bundle may name manifests another file carried

    def recognize(self, key: str, data: bytes) -> str | None:
        return None if looks_like_bundle(key, data) else "not a worker bundle"

    def parser_version(self) -> str:
        return PARSER_VERSION

    def read(self, data: bytes, context: SourceContext) -> Iterator[RowOutcome]:
        return normalize_bundle_bytes(data, context.known_digest)


class LigerCsvSource:
    name = "liger-csv"
    reads_index = False
    title = "Liger benchmark CSV"

    def lacks(self, head: str) -> str | None:
        return self.recognize("", head.encode())

    def closeness(self, head: str) -> int:
        """A text that is not JSON is nearest a CSV (the one text format read)."""
        return 0 if head[:1] in ("{", "[") else 1

    def recognize(self, key: str, data: bytes) -> str | None:
        try:
            open_liger_csv(io.BytesIO(data))
        except NotLigerCsv as error:
            return str(error)
        return None

    def parser_version(self) -> str:
        return parser_version()

    def version_of(self, data: bytes, context: SourceContext) -> str:
        return self.parser_version()

    def outcomes(self, data: bytes, context: SourceContext) -> Iterator[RowOutcome]:
        return normalize_bytes(data)

    def record_set(
        self, data: bytes, snapshot_digest: str, context: SourceContext, parts_dir: Path
    ) -> RecordSetContent:
        return record_set(data, snapshot_digest, self.parser_version())

    def record_sets(
        self, objects: Sequence[SourceObject], context: SourceContext, parts_dir: Path
    ) -> list[RecordSetContent]:
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

    def read(self, data: bytes, context: SourceContext) -> Iterator[RowOutcome]:
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


@runtime_checkable
class Diagnosable(Protocol):
    """A source that can say how near a file's start comes to its format, and what it lacks."""

    title: str  # the format's name as its users know it

    def lacks(self, head: str) -> str | None: ...

    def closeness(self, head: str) -> int:
        """How many of the format's distinctive marks the start of a file shows (0: none)."""
        ...


@runtime_checkable
class Offering(Protocol):
    """A source whose files state manifests that files of another may name (a FlashInfer
    definition, named by its traces and solutions): the cross-file references, resolved here."""

    def may_offer(self, head: bytes) -> bool:
        """Whether a file that starts so may offer any (its start alone decides no)."""
        ...

    def offers(self, data: bytes) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """(kind, metadata name, manifest) of each manifest these plain bytes offer others."""
        ...


# The names of the sources whose files may offer others manifests.
_OFFERING = frozenset(source.name for source in SOURCES if isinstance(source, Offering))


Offered = Mapping[tuple[str, str], dict[str, Any]]


def offering(source: Source) -> bool:
    """Whether files this source read may offer manifests to others (a batch asks only them)."""
    return source.name in _OFFERING


def may_offer(head: bytes) -> bool:
    """Whether a file whose start is `head` may offer manifests to others (a gzip file: maybe),
    so that a reader of many files reads the whole of those only."""
    return looks_gzipped(head) or any(
        isinstance(source, Offering) and source.may_offer(head) for source in SOURCES
    )


def _offers(data: bytes) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for source in SOURCES:
        if isinstance(source, Offering) and source.may_offer(data):
            yield from source.offers(data)


def manifests_offered(files: Iterable[tuple[str, bytes]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The manifests the files (key, bytes) of one batch or dry run offer each other, by kind
    and name, the first of a name kept. A file that cannot be unpacked or read offers nothing:
    its own read says why."""
    given: dict[tuple[str, str], dict[str, Any]] = {}
    for _, data in files:
        try:
            plain = unpacked(data)
            for kind, name, manifest in _offers(plain):
                given.setdefault((kind, name), manifest)
        except JsonInputError:
            continue
    return given


def offered_first(offered: Offered, then: ManifestNamed) -> ManifestNamed:
    """A manifest lookup that finds what the files beside one offer, then asks `then` (the
    index): where a FlashInfer trace finds its definition, whichever file or batch brought it."""
    if not offered:
        return then

    def named(kind: str, name: str) -> dict[str, Any] | None:
        return offered.get((kind, name)) or then(kind, name)

    return named


def source_of(key: str, data: bytes) -> Source:
    """The first source that recognizes the bytes of one object version (a gzip file: what it
    holds, unpacked once); an object none recognizes is read as Unrecognized, which names the
    closest format and what the bytes lack to be it."""
    try:
        plain = unpacked(data)
    except JsonInputError as error:
        return Refused(error.reason, error.detail)
    source = _choose(key, plain)
    return source if plain is data else Unpacked(source, data, plain)


def _choose(key: str, plain: bytes) -> Source:
    for source in SOURCES:
        if source.recognize(key, plain) is None:
            return source
    return Unrecognized(closest_format(plain))


def closest_format(data: bytes) -> str:
    """Why no source reads the bytes, as the format they come nearest: "<format>: <what the
    file lacks>"; a JSON document that shows no format's marks says so."""
    head = head_text(data)
    if not head:
        return "the file is empty"
    near = [
        (source.closeness(head), -i, source)
        for i, source in enumerate(SOURCES)
        if isinstance(source, Diagnosable)
    ]
    score, _, best = max(near, key=lambda item: item[:2])
    if score > 0:
        return f"{best.title}: {best.lacks(head) or 'its content cannot be read'}"
    # only JSON can show no format's marks: any other text is nearest the CSV
    json_formats = [s for s in SOURCES if isinstance(s, Diagnosable)]
    titles = ", ".join(s.title for s in json_formats if not isinstance(s, LigerCsvSource))
    return f"JSON that shows none of the marks of the formats read ({titles})"


class Unpacked:
    """A source reading what a gzip file holds: the bytes are unpacked once (those of the file
    it was chosen for are kept), so the source itself only ever sees plain bytes."""

    def __init__(self, source: Source, packed: bytes, plain: bytes) -> None:
        self.source = source
        self.name = source.name
        self.reads_index = source.reads_index
        self._packed = packed
        self._plain = plain

    def _of(self, data: bytes) -> bytes:
        if data is self._packed:
            return self._plain
        return unpacked(data) if looks_gzipped(data) else data

    def recognize(self, key: str, data: bytes) -> str | None:
        return self.source.recognize(key, self._of(data))

    def parser_version(self) -> str:
        return self.source.parser_version()

    def version_of(self, data: bytes, context: SourceContext) -> str:
        return self.source.version_of(self._of(data), context)

    def outcomes(self, data: bytes, context: SourceContext) -> Iterator[RowOutcome]:
        return self.source.outcomes(self._of(data), context)

    def record_set(
        self, data: bytes, snapshot_digest: str, context: SourceContext, parts_dir: Path
    ) -> RecordSetContent:
        return self.source.record_set(self._of(data), snapshot_digest, context, parts_dir)

    def record_sets(
        self, objects: Sequence[SourceObject], context: SourceContext, parts_dir: Path
    ) -> list[RecordSetContent]:
        plain = [replace(o, data=self._of(o.data)) for o in objects]
        return self.source.record_sets(plain, context, parts_dir)


class Refused(RecordsOfOutcomes):
    """What a gzip file that cannot be unpacked (cut short, corrupt, or past the bound) is read
    as: one quarantined outcome with json_input's reason."""

    name = "unrecognized"

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail

    def recognize(self, key: str, data: bytes) -> str | None:
        return None

    def parser_version(self) -> str:
        return LigerCsvSource().parser_version()

    def read(self, data: bytes, context: SourceContext) -> Iterator[RowOutcome]:
        head = data[:RAW_PREVIEW_BYTES].decode("utf-8", errors="backslashreplace")
        return iter([RowOutcome(1, "quarantined", head, self.reason, self.detail)])


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
        1, "quarantined", preview, Reason.UNRECOGNIZED_FORMAT, f"no source recognizes it; {why}"
    )
